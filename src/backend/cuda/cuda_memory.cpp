#include "backend/cuda/cuda_memory.h"

#include <cuda_runtime_api.h>
#include <fmt/format.h>

#include <cstdlib>
#include <string>

#include "backend/cuda/cuda_check.h"
#include "core/arena.h"
#include "core/errors.h"

namespace upipe::cuda {

int64_t device_reservation_bytes(int64_t free_bytes) {
  if (const char* env = std::getenv("UPIPE_CUDA_RESERVE"); env != nullptr && *env != '\0') {
    char* end = nullptr;
    const double v = std::strtod(env, &end);
    const std::string suffix = end;
    const double mult = suffix == "G" ? double(int64_t(1) << 30)
                        : suffix == "M" ? double(int64_t(1) << 20)
                        : suffix.empty() ? 1.0
                                         : -1.0;
    if (!(v > 0) || mult < 0)
      throw ConfigError(fmt::format(
          "UPIPE_CUDA_RESERVE={} is not a byte count (a number with an optional G or M)", env));
    return int64_t(v * mult);
  }
  return free_bytes > kHeadroomBytes ? free_bytes - kHeadroomBytes : 0;
}

DeviceAllocator::~DeviceAllocator() {
  if (base_ != nullptr) cudaFree(base_);
}

void DeviceAllocator::reserve() const {
  if (range_) return;
  size_t free = 0, total = 0;
  UPIPE_CUDA_CHECK(cudaMemGetInfo(&free, &total));
  const int64_t want = device_reservation_bytes(int64_t(free));
  if (want <= 0)
    throw BackingExhausted(fmt::format("the GPU has {} free, less than the {} kept outside the arena",
                                       format_bytes(int64_t(free)), format_bytes(kHeadroomBytes)));
  const cudaError_t st = cudaMalloc(&base_, size_t(want));
  if (st != cudaSuccess) {
    base_ = nullptr;
    throw BackingExhausted(fmt::format("cudaMalloc of the device arena's {} failed: {}",
                                       format_bytes(want), cudaGetErrorString(st)));
  }
  range_ = std::make_unique<FirstFitRange>(static_cast<char*>(base_), want);
}

void* DeviceAllocator::allocate(int64_t bytes) {
  std::lock_guard<std::mutex> lock(mu_);
  reserve();
  void* p = range_->allocate(bytes);
  if (p == nullptr)
    throw BackingExhausted(fmt::format(
        "the device arena's reservation ({}) has no free block of {} (largest free {})",
        format_bytes(range_->size()), format_bytes(bytes), format_bytes(range_->largest_free())));
  return p;
}

void DeviceAllocator::release(void* p, int64_t bytes) {
  if (p == nullptr) return;
  std::lock_guard<std::mutex> lock(mu_);
  range_->release(p, bytes);
}

void DeviceAllocator::check_can_back(int64_t bytes) const {
  std::lock_guard<std::mutex> lock(mu_);
  reserve();
  if (bytes > range_->largest_free())
    throw BackingExhausted(fmt::format("the GPU's reservation ({}) has no free block of {}",
                                       format_bytes(range_->size()), format_bytes(bytes)));
}

int64_t DeviceAllocator::reserved_bytes() const {
  std::lock_guard<std::mutex> lock(mu_);
  return range_ ? range_->size() : 0;
}

std::unique_ptr<Allocator> make_pinned_host_allocator() {
  SystemMemory pinned{[](int64_t bytes) -> void* {
                        void* p = nullptr;
                        return cudaHostAlloc(&p, size_t(bytes), cudaHostAllocDefault) == cudaSuccess
                                   ? p
                                   : nullptr;
                      },
                      [](void* p) { cudaFreeHost(p); }};
  return std::make_unique<HostCachingAllocator>(int64_t(8) << 30, pinned);
}

}  // namespace upipe::cuda
