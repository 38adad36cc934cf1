#include "core/allocator.h"

#include <cstdlib>
#include <cstring>
#include <new>

namespace upipe {

HostCachingAllocator::HostCachingAllocator(int64_t cache_limit) : cache_limit_(cache_limit) {}

HostCachingAllocator::~HostCachingAllocator() {
  trim();
}

int64_t HostCachingAllocator::rounded(int64_t bytes) {
  const int64_t page = 4096;
  return bytes <= 0 ? page : (bytes + page - 1) / page * page;
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
  void* p = std::aligned_alloc(4096, size_t(n));
  if (!p) throw std::bad_alloc();
  return p;
}

void HostCachingAllocator::release(void* p, int64_t bytes) {
  if (!p) return;
  const int64_t n = rounded(bytes);
  if (cached_ + n > cache_limit_) trim();
  free_.emplace(n, p);
  cached_ += n;
}

void HostCachingAllocator::trim() {
  for (auto& [n, p] : free_) std::free(p);
  free_.clear();
  cached_ = 0;
}

}  // namespace upipe
