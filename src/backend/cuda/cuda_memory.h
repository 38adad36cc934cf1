// The CUDA backend's memory. Device arena: one cudaMalloc of the whole reservation, made at the
// first allocation, carved by first fit (core/allocator.h's FirstFitRange), so after start-up
// no allocation calls the driver and the arena's peak is the HBM the step needs (docs/backend.md).
// Host arena: pinned memory (cudaHostAlloc), cached by size, so offload copies can run
// asynchronously.
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>

#include "core/allocator.h"

namespace upipe::cuda {

// The bytes the device arena reserves: UPIPE_CUDA_RESERVE (bytes, with a G/M suffix) when set,
// else the device's free memory less kHeadroomBytes for what lives outside the arena (the CUDA
// context, cuBLASLt and cuDNN handles, NCCL's buffers).
int64_t device_reservation_bytes(int64_t free_bytes);
constexpr int64_t kHeadroomBytes = int64_t(3) << 30;

class DeviceAllocator final : public Allocator {
 public:
  DeviceAllocator() = default;
  ~DeviceAllocator() override;
  void* allocate(int64_t bytes) override;
  void release(void* p, int64_t bytes) override;
  bool backed() const override { return true; }
  void check_can_back(int64_t bytes) const override;
  int64_t reserved_bytes() const;

 private:
  void reserve() const;  // the one cudaMalloc, on first use
  mutable std::mutex mu_;
  mutable void* base_ = nullptr;
  mutable std::unique_ptr<FirstFitRange> range_;
};

// A HostCachingAllocator over pinned memory.
std::unique_ptr<Allocator> make_pinned_host_allocator();

}  // namespace upipe::cuda
