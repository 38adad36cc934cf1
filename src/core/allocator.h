// Backing memory behind an arena. The arena does the accounting (tags, budget, peaks); an
// Allocator only hands out bytes. Host memory is cached by size so a training loop that repeats
// the same allocations touches fresh pages once (first touch costs ~0.45 s/GiB here). The meta
// allocator backs nothing: the planner counts bytes without owning them. A CUDA allocator will
// sit beside these.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <vector>

namespace upipe {

class Allocator {
 public:
  virtual ~Allocator() = default;
  // Returns memory aligned to kAlignment, or nullptr when not backed (meta).
  virtual void* allocate(int64_t bytes) = 0;
  virtual void release(void* p, int64_t bytes) = 0;
  virtual bool backed() const = 0;
  static constexpr int64_t kAlignment = 64;
};

class HostCachingAllocator final : public Allocator {
 public:
  // Cached (free) bytes above cache_limit are returned to the system.
  explicit HostCachingAllocator(int64_t cache_limit = int64_t(8) << 30);
  ~HostCachingAllocator() override;
  void* allocate(int64_t bytes) override;
  void release(void* p, int64_t bytes) override;
  bool backed() const override { return true; }
  void trim();  // return every cached block to the system
  int64_t cached_bytes() const { return cached_; }

 private:
  static int64_t rounded(int64_t bytes);
  std::multimap<int64_t, void*> free_;  // rounded size -> block
  int64_t cached_ = 0;
  int64_t cache_limit_;
};

class MetaAllocator final : public Allocator {
 public:
  void* allocate(int64_t) override { return nullptr; }
  void release(void*, int64_t) override {}
  bool backed() const override { return false; }
};

}  // namespace upipe
