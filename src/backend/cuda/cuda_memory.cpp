#include "backend/cuda/cuda_memory.h"

#include <cuda_runtime_api.h>
#include <fmt/format.h>

#include <algorithm>
#include <cstdlib>
#include <initializer_list>
#include <mutex>
#include <string>

#include "backend/cuda/cuda_check.h"
#include "core/arena.h"
#include "core/errors.h"

namespace upipe::cuda {

int64_t device_reservation_bytes(int64_t free_bytes, int64_t total_bytes, int sharing) {
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
  int64_t want = free_bytes - kHeadroomBytes;
  if (sharing > 1) want = std::min(want, total_bytes / sharing - kHeadroomBytes);
  return std::max<int64_t>(want, 0);
}

namespace {

// The first of the variables that is set, as a number; `otherwise` when none is.
int first_set(std::initializer_list<const char*> vars, int otherwise) {
  for (const char* v : vars)
    if (const char* e = std::getenv(v); e != nullptr && *e != '\0') return std::atoi(e);
  return otherwise;
}

}  // namespace

int local_rank() {
  return first_set({"OMPI_COMM_WORLD_LOCAL_RANK", "LOCAL_RANK", "SLURM_LOCALID"}, 0);
}

int local_size() {
  return std::max(
      1, first_set({"OMPI_COMM_WORLD_LOCAL_SIZE", "LOCAL_WORLD_SIZE", "SLURM_NTASKS_PER_NODE"}, 1));
}

int ranks_on_this_gpu() {
  int n = 0, device = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess || n <= 0 || cudaGetDevice(&device) != cudaSuccess) {
    (void)cudaGetLastError();
    return 1;
  }
  return std::max(1, (local_size() - device + n - 1) / n);
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
    const int sharing = ranks_on_this_gpu();
    const int64_t want = device_reservation_bytes(int64_t(free), int64_t(total), sharing);
    if (want <= 0)
      throw BackingExhausted(fmt::format(
          "the GPU has {} free of {}, shared by {} rank(s) of this node, less than the {} each "
          "keeps outside its arena (UPIPE_CUDA_RESERVE sets the reservation)",
          format_bytes(int64_t(free)), format_bytes(int64_t(total)), sharing,
          format_bytes(kHeadroomBytes)));
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
  SystemMemory pinned;
  pinned.alloc = [](int64_t bytes) -> void* {
    void* p = nullptr;
    if (cudaHostAlloc(&p, size_t(bytes), cudaHostAllocDefault) == cudaSuccess) return p;
    (void)cudaGetLastError();  // the caller may trim and retry: no stale status for a launch
    return nullptr;
  };
  // A trimmed block may still be a queued copy's source or target (its release waited on the
  // device side only): the device finishes first, once per trim.
  pinned.before_free = [] { (void)cudaDeviceSynchronize(); };
  pinned.free = [](void* p) { (void)cudaFreeHost(p); };
  // Pinning is slow (the pages are locked one by one) and a step repeats the same host blocks (the
  // stash's layers, fpdt's K/V chunks), so the cache keeps up to half the machine's memory rather
  // than the pageable cache's 8 GiB: a step larger than that would re-pin the excess every step.
  return std::make_unique<HostCachingAllocator>(
      std::max(int64_t(8) << 30, physical_memory_bytes() / 2), pinned);
}

}  // namespace upipe::cuda
