// The CUDA backend's memory. Device arenas: one cudaMalloc of the whole reservation per process,
// made at the first allocation and shared by every device arena of the process (`upipe check`
// holds two: the strategy's and local's), carved by first fit (core/allocator.h's FirstFitRange),
// so after start-up no allocation calls the driver and each arena's peak is the HBM its tensors
// need (docs/backend.md). Each arena still keeps its own budget and tags.
// Host arena: pinned memory (cudaHostAlloc), cached by size, so offload copies can run
// asynchronously.
#pragma once

#include <cstdint>
#include <memory>

#include "core/allocator.h"

namespace upipe::cuda {

// The bytes the device arena reserves: UPIPE_CUDA_RESERVE (bytes, with a G/M suffix) when set,
// else the device's free memory less kHeadroomBytes for what lives outside the arena (the CUDA
// context, cuBLASLt and cuDNN handles, NCCL's buffers); where `sharing` ranks use the GPU (of
// total_bytes), at most an equal share of it less that headroom each, so that the ranks reserving
// one after another all fit.
int64_t device_reservation_bytes(int64_t free_bytes, int64_t total_bytes = 0, int sharing = 1);
// Where this rank sits on its node, from the launcher's environment (OpenMPI, torchrun, Slurm):
// its local rank (OMPI_COMM_WORLD_LOCAL_RANK, LOCAL_RANK or SLURM_LOCALID; 0 when none is set) and
// the node's ranks (OMPI_COMM_WORLD_LOCAL_SIZE, LOCAL_WORLD_SIZE or SLURM_NTASKS_PER_NODE; 1).
int local_rank();
int local_size();
// The ranks of this node that use the current GPU: local rank % GPUs picks it (CudaBackend), so
// the local ranks congruent to it.
int ranks_on_this_gpu();
constexpr int64_t kHeadroomBytes = int64_t(3) << 30;

class DeviceAllocator final : public Allocator {
 public:
  void* allocate(int64_t bytes) override;
  void release(void* p, int64_t bytes) override;
  bool backed() const override { return true; }
  void check_can_back(int64_t bytes) const override;
  // Bytes of the process's reservation (0 before the first allocation).
  static int64_t reserved_bytes();
};

// A HostCachingAllocator over pinned memory.
std::unique_ptr<Allocator> make_pinned_host_allocator();

}  // namespace upipe::cuda
