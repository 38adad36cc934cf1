#include "backend/cuda/cuda_memory.h"

#include <cuda_runtime_api.h>
#include <fmt/format.h>

#include <cstdlib>
#include <mutex>
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
    const double mult = suffix == "G"    ? double(int64_t(1) << 30)
                        : suffix == "M"  ? double(int64_t(1) << 20)
                        : suffix.empty() ? 1.0
                                         : -1.0;
    if (!(v > 0) || mult < 0)
      throw ConfigError(fmt::format(
          "UPIPE_CUDA_RESERVE={} is not a byte count (a number with an optional G or M)", env));
    return int64_t(v * mult);
  }
  return free_bytes > kHeadroomBytes ? free_bytes - kHeadroomBytes : 0;
}

namespace {

// The process's reservation: never freed (arenas owned by static objects may release into it at
// exit; the driver reclaims it with the process).
struct Reservation {
  std::mutex mu;
  std::unique_ptr<FirstFitRange> range;

  static Reservation& get() {
    static Reservation* r = new Reservation;
    return *r;
  }
  // The one cudaMalloc, on first use; call with mu held.
  FirstFitRange& range_locked() {
    if (range) return *range;
    size_t free = 0, total = 0;
    UPIPE_CUDA_CHECK(cudaMemGetInfo(&free, &total));
    const int64_t want = device_reservation_bytes(int64_t(free));
    if (want <= 0)
      throw BackingExhausted(
          fmt::format("the GPU has {} free, less than the {} kept outside the arena",
                      format_bytes(int64_t(free)), format_bytes(kHeadroomBytes)));
    void* base = nullptr;
    const cudaError_t st = cudaMalloc(&base, size_t(want));
    // A failed allocation's status is not sticky but stays pending: clear it, or the next
    // kernel's launch check would report it against that kernel.
    if (st != cudaSuccess) (void)cudaGetLastError();
    if (st != cudaSuccess)
      throw BackingExhausted(fmt::format("cudaMalloc of the device arena's {} failed: {}",
                                         format_bytes(want), cudaGetErrorString(st)));
    range = std::make_unique<FirstFitRange>(static_cast<char*>(base), want);
    return *range;
  }
};

}  // namespace

void* DeviceAllocator::allocate(int64_t bytes) {
  Reservation& r = Reservation::get();
  std::lock_guard<std::mutex> lock(r.mu);
  FirstFitRange& range = r.range_locked();
  void* p = range.allocate(bytes);
  if (p == nullptr)
    throw BackingExhausted(fmt::format(
        "the device arena's reservation ({}) has no free block of {} (largest free {})",
        format_bytes(range.size()), format_bytes(bytes), format_bytes(range.largest_free())));
  return p;
}

void DeviceAllocator::release(void* p, int64_t bytes) {
  if (p == nullptr) return;
  Reservation& r = Reservation::get();
  std::lock_guard<std::mutex> lock(r.mu);
  r.range_locked().release(p, bytes);
}

void DeviceAllocator::check_can_back(int64_t bytes) const {
  Reservation& r = Reservation::get();
  std::lock_guard<std::mutex> lock(r.mu);
  FirstFitRange& range = r.range_locked();
  if (bytes > range.largest_free())
    throw BackingExhausted(fmt::format("the GPU's reservation ({}) has no free block of {}",
                                       format_bytes(range.size()), format_bytes(bytes)));
}

int64_t DeviceAllocator::reserved_bytes() {
  Reservation& r = Reservation::get();
  std::lock_guard<std::mutex> lock(r.mu);
  return r.range ? r.range->size() : 0;
}

std::unique_ptr<Allocator> make_pinned_host_allocator() {
  SystemMemory pinned{
      [](int64_t bytes) -> void* {
        void* p = nullptr;
        if (cudaHostAlloc(&p, size_t(bytes), cudaHostAllocDefault) == cudaSuccess) return p;
        (void)cudaGetLastError();  // the caller may trim and retry: no stale status for a launch
        return nullptr;
      },
      // A trimmed block may still be a queued copy's source or target (its release waited on
      // the device side only): the device finishes first (trimming is rare).
      [](void* p) {
        (void)cudaDeviceSynchronize();
        cudaFreeHost(p);
      }};
  return std::make_unique<HostCachingAllocator>(int64_t(8) << 30, pinned);
}

}  // namespace upipe::cuda
