// The communicator a rank's strategies, decoder and trainer talk through on a device. On the CPU
// device memory is host memory, so it is the world itself. On a GPU, by UPIPE_CUDA_COMM:
//   auto (default)  NCCL where every rank has its own GPU (a collective decision: one rank on a
//                   GPU, or a node of GPUs with a rank each), else staged;
//   nccl            NCCL, refused on every rank alike where it cannot run (nccl_world_unusable);
//   staged          the host-staged communicator over the world (comm/staged/: every buffer goes
//                   device -> pinned host -> MPI -> device on the compute stream; copies use
//                   cudaMemcpyDefault, so host scalars pass through it too): correct for any
//                   number of ranks per GPU.
// NCCL runs the collectives ordered after the compute stream and takes device buffers only, so
// users whose communicator also carries host values (the decoder's loss, the trainer) ask for
// staged (nccl_ok = false) whatever the setting. UPIPE_STAGED_COMM=1 puts the CPU on the staged
// path too (memcpy copies), to test it. It lives here because it is the first module that sees
// both comm and backend.
#pragma once

#include <memory>

#include "backend/device.h"
#include "comm/communicator.h"

namespace upipe {

class DeviceCopier;

class DeviceComm {
 public:
  DeviceComm(Device& dev, Communicator& world, bool nccl_ok = true);
  ~DeviceComm();
  DeviceComm(const DeviceComm&) = delete;
  DeviceComm& operator=(const DeviceComm&) = delete;
  Communicator& get() { return *use_; }
  operator Communicator&() { return *use_; }

 private:
  std::unique_ptr<DeviceCopier> copier_;
  std::unique_ptr<Communicator> own_;
  Communicator* use_;
};

}  // namespace upipe
