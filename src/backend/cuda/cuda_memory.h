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
// context, cuBLASLt and cuDNN handles, NCCL's buffers).
int64_t device_reservation_bytes(int64_t free_bytes);
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
