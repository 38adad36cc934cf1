#include "attention/device_comm.h"

#include <cstdlib>
#include <string>

#include "comm/routed/routed_comm.h"
#include "comm/staged/staged_comm.h"
#include "core/errors.h"
#if UPIPE_HAVE_CUDA
#include "backend/cuda/cuda_backend.h"
#include "comm/nccl/cuda_copier.h"
#include "comm/nccl/nccl_comm.h"
#endif

namespace upipe {

DeviceComm::DeviceComm(Device& dev, Communicator& world) : use_(&world) {
  if (dev.backend().kind() != BackendKind::kCuda) {
    // UPIPE_STAGED_COMM on the CPU: the GPU's paths with memcpy for the device copies, so every
    // strategy, the decoder and the trainer can be checked through them without a GPU
    // (tests/cli/staged_check.sh): 1, the staged communicator; routed, the routed one, with a
    // group of the world (MPI) standing in for NCCL and the device arena's blocks for device
    // memory, so a call site that routes differently on two ranks hangs here as it would there.
    const char* env = std::getenv("UPIPE_STAGED_COMM");
    const std::string mode = env != nullptr ? env : "";
    if (!mode.empty() && mode != "0" && mode != "1" && mode != "routed")
      throw ConfigError("UPIPE_STAGED_COMM=" + mode + " is unknown; choose 1 or routed");
    if ((mode == "1" || mode == "routed") && dev.backend().computes()) {
      copier_ = std::make_unique<HostCopier>();
      if (mode == "routed") {
        nccl_ = world.split([](int q) { return SplitKey{0, q}; });
        staged_ = std::make_unique<StagedCommunicator>(world, *copier_);
        const Arena& device_memory = dev.mem();
        own_ = std::make_unique<RoutedCommunicator>(
            *nccl_, *staged_, [&device_memory](const void* p) { return device_memory.owns(p); });
      } else {
        own_ = std::make_unique<StagedCommunicator>(world, *copier_);
      }
      use_ = own_.get();
    }
    return;
  }
#if UPIPE_HAVE_CUDA
  auto& be = static_cast<CudaBackend&>(dev.backend());
  auto* stream = static_cast<CUstream_st*>(be.native_stream());
  // UPIPE_CUDA_COMM (device_comm.h). Every rank sees the same setting (mpirun), so the collective
  // decision below is taken by all.
  const char* env = std::getenv("UPIPE_CUDA_COMM");
  const std::string choice = env != nullptr ? env : "auto";
  if (choice != "auto" && choice != "staged" && choice != "nccl")
    throw ConfigError("UPIPE_CUDA_COMM=" + choice + " is unknown; choose auto, nccl or staged");
  // One collective usability check (a forced "nccl" that cannot run throws its reason).
  const std::string why = choice == "staged" ? "" : nccl_world_unusable(world, be.device());
  if (choice == "nccl" && !why.empty()) throw Error(why);
  const bool nccl = choice != "staged" && why.empty();
  copier_ = std::make_unique<CudaCopier>(stream);
  if (nccl) {
    nccl_ = std::make_unique<NcclCommunicator>(world, be.device());
    static_cast<NcclCommunicator&>(*nccl_).set_compute_stream(stream);
    staged_ = std::make_unique<StagedCommunicator>(world, *copier_);
    own_ = std::make_unique<RoutedCommunicator>(*nccl_, *staged_, is_device_pointer);
  } else {
    own_ = std::make_unique<StagedCommunicator>(world, *copier_);
  }
  use_ = own_.get();
#endif
}

DeviceComm::~DeviceComm() = default;

}  // namespace upipe
