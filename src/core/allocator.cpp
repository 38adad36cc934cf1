#include "core/allocator.h"

#include <fmt/format.h>
#include <sys/mman.h>

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>

#include "core/arena.h"
#include "core/check.h"

namespace upipe {

namespace {

// Bytes every HostCachingAllocator of the process holds from the system (live and cached). The
// kernel overcommits, so a request beyond physical memory would "succeed" and the process would
// be killed when it touches the pages; refusing it instead gives a typed out-of-memory error.
std::atomic<int64_t> g_held{0};

}  // namespace

int64_t physical_memory_bytes() {
  static const int64_t b = int64_t(sysconf(_SC_PHYS_PAGES)) * int64_t(sysconf(_SC_PAGESIZE));
  return b;
}

SystemMemory SystemMemory::pageable() {
  return {[](int64_t bytes) { return std::aligned_alloc(4096, size_t(bytes)); },
          [](void* p) { std::free(p); }};
}

HostCachingAllocator::HostCachingAllocator(int64_t cache_limit, SystemMemory system)
    : cache_limit_(cache_limit), system_(system) {}

HostCachingAllocator::~HostCachingAllocator() {
  trim();
}

int64_t HostCachingAllocator::rounded(int64_t bytes) {
  const int64_t page = 4096;
  return bytes <= 0 ? page : (bytes / page + (bytes % page != 0)) * page;
}

void* HostCachingAllocator::allocate(int64_t bytes) {
  const int64_t n = rounded(bytes);
  auto it = free_.find(n);
  if (it != free_.end()) {
    void* p = it->second;
    free_.erase(it);
    cached_ -= n;
    return p;
  }
  if (g_held + n > physical_memory_bytes()) trim();  // the cache may hold what the system lacks
  check_can_back(n);
  void* p = system_.alloc(n);
  if (!p) {
    trim();
    p = system_.alloc(n);
  }
  if (!p) throw BackingExhausted(fmt::format("the system could not allocate {}", format_bytes(n)));
  g_held += n;
  return p;
}

void HostCachingAllocator::check_can_back(int64_t bytes) const {
  if (bytes > physical_memory_bytes() - g_held)
    throw BackingExhausted(fmt::format("this machine has {} of memory and this process holds {}",
                                       format_bytes(physical_memory_bytes()),
                                       format_bytes(g_held)));
}

void HostCachingAllocator::release(void* p, int64_t bytes) {
  if (!p) return;
  const int64_t n = rounded(bytes);
  if (cached_ + n > cache_limit_) trim_to(cache_limit_ - n);
  free_.emplace(n, p);
  cached_ += n;
}

void HostCachingAllocator::trim() {
  trim_to(0);
}

void HostCachingAllocator::trim_to(int64_t keep) {
  if (cached_ <= keep || free_.empty()) return;
  if (system_.before_free != nullptr) system_.before_free();  // once per batch
  // The largest blocks first: the fewest frees (and later allocations) for the bytes returned.
  while (!free_.empty() && cached_ > keep) {
    auto it = std::prev(free_.end());
    system_.free(it->second);
    g_held -= it->first;
    cached_ -= it->first;
    free_.erase(it);
  }
}

FirstFitRange::FirstFitRange(char* base, int64_t size) : base_(base), size_(size) {
  free_.emplace(0, size);
}

int64_t FirstFitRange::rounded(int64_t bytes) {
  const int64_t a = Allocator::kAlignment;
  return bytes <= 0 ? a : (bytes / a + (bytes % a != 0)) * a;
}

void* FirstFitRange::allocate(int64_t bytes) {
  const int64_t n = rounded(bytes);
  for (auto it = free_.begin(); it != free_.end(); ++it) {
    if (it->second < n) continue;
    const int64_t off = it->first, len = it->second;
    free_.erase(it);
    if (len > n) free_.emplace(off + n, len - n);
    return base_ + off;
  }
  return nullptr;
}

void FirstFitRange::release(void* p, int64_t bytes) {
  const int64_t n = rounded(bytes);
  const int64_t off = static_cast<char*>(p) - base_;
  UPIPE_CHECK(off >= 0 && off + n <= size_, "release of an address outside the range");
  auto next = free_.lower_bound(off);
  UPIPE_CHECK(next == free_.end() || next->first >= off + n, "block released twice");
  int64_t start = off, len = n;
  if (next != free_.begin()) {
    auto prev = std::prev(next);
    UPIPE_CHECK(prev->first + prev->second <= off, "block released twice");
    if (prev->first + prev->second == off) {
      start = prev->first;
      len += prev->second;
      free_.erase(prev);
    }
  }
  if (next != free_.end() && next->first == off + n) {
    len += next->second;
    free_.erase(next);
  }
  free_.emplace(start, len);
}

int64_t FirstFitRange::largest_free() const {
  int64_t best = 0;
  for (const auto& [off, len] : free_) best = std::max(best, len);
  return best;
}

namespace {

// The process-wide meta range: [base, base + size), free blocks by offset -> length.
class MetaRange {
 public:
  // Never destroyed: arenas owned by static objects may release into it at exit.
  static MetaRange& get() {
    static MetaRange* r = new MetaRange;
    return *r;
  }

  int64_t size() {
    std::lock_guard<std::mutex> lock(mu_);
    reserve();
    return size_;
  }

  void* allocate(int64_t bytes) {
    std::lock_guard<std::mutex> lock(mu_);
    reserve();
    void* p = range_->allocate(bytes);
    if (p == nullptr && live_ == 0) unmap();
    if (p == nullptr)
      throw BackingExhausted(fmt::format(
          "the meta device's reserved address range ({}) has no free block of {}; plan fewer "
          "bytes at once in one process",
          format_bytes(size_), format_bytes(bytes)));
    ++live_;
    return p;
  }

  // The last block back unmaps the range: under `ulimit -v` it may hold half the address space,
  // which a training run that planned its step at start-up needs for its own memory.
  void release(void* p, int64_t bytes) {
    std::lock_guard<std::mutex> lock(mu_);
    range_->release(p, bytes);
    if (--live_ == 0) unmap();
  }

 private:
  void unmap() {
    munmap(base_, size_t(size_));
    range_.reset();
    base_ = nullptr;
  }

  // Maps the range where none is (mu_ held).
  void reserve() {
    if (range_) return;
    for (int64_t want = MetaAllocator::kMetaReserve; want >= (int64_t(1) << 30); want /= 2) {
      void* p = mmap(nullptr, size_t(want), PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE,
                     -1, 0);
      if (p == MAP_FAILED) continue;
      size_ = want;
      base_ = p;
      range_ = std::make_unique<FirstFitRange>(static_cast<char*>(p), want);
      return;
    }
    UPIPE_CHECK(false,
                "could not reserve even 1 GiB of address space for the meta device; "
                "check `ulimit -v`");
  }

  std::mutex mu_;
  int64_t size_ = 0;
  int64_t live_ = 0;  // blocks handed out and not released
  void* base_ = nullptr;
  std::unique_ptr<FirstFitRange> range_;
};

}  // namespace

void* MetaAllocator::allocate(int64_t bytes) {
  return MetaRange::get().allocate(bytes);
}

void MetaAllocator::release(void* p, int64_t bytes) {
  if (p) MetaRange::get().release(p, bytes);
}

int64_t MetaAllocator::reserved_bytes() {
  return MetaRange::get().size();
}

}  // namespace upipe
