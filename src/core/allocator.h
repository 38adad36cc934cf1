// Backing memory behind an arena. The arena does the accounting (tags, budget, peaks); an
// Allocator only hands out bytes. Host memory is cached by size so a training loop that repeats
// the same allocations touches fresh pages once (first touch costs ~0.45 s/GiB here). The meta
// allocator backs nothing: the planner counts bytes without owning them, yet every meta tensor
// gets a real, distinct, aligned address (see MetaAllocator), so view arithmetic on it is defined
// behaviour. A CUDA allocator will sit beside these.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <new>
#include <string>

namespace upipe {

// This machine's memory (every process on it shares it).
int64_t physical_memory_bytes();

class Allocator {
 public:
  virtual ~Allocator() = default;
  // Returns a non-null address aligned to kAlignment (never dereferenced when !backed()).
  // Throws BackingExhausted when the memory (or, for meta, the address range) cannot be had.
  virtual void* allocate(int64_t bytes) = 0;
  virtual void release(void* p, int64_t bytes) = 0;
  virtual bool backed() const = 0;
  // Throws the BackingExhausted that allocating `bytes` more would throw now, allocating nothing.
  virtual void check_can_back(int64_t) const {}
  static constexpr int64_t kAlignment = 64;
};

// Where a caching allocator's blocks come from: page-aligned host memory by default; the CUDA
// backend passes pinned memory (cudaHostAlloc), so its host arena can be the target of
// asynchronous copies. alloc returns nullptr when the system refuses.
struct SystemMemory {
  void* (*alloc)(int64_t bytes) = nullptr;
  void (*free)(void* p) = nullptr;
  // Called once before a batch of frees, if set (pinned memory: the device finishes the copies
  // that may still use a cached block, once, not once per block).
  void (*before_free)() = nullptr;
  static SystemMemory pageable();
};

class HostCachingAllocator final : public Allocator {
 public:
  // Cached (free) bytes above cache_limit are returned to the system, the largest blocks first;
  // all of them when an allocation would exceed the machine's memory.
  explicit HostCachingAllocator(int64_t cache_limit = int64_t(8) << 30,
                                SystemMemory system = SystemMemory::pageable());
  ~HostCachingAllocator() override;
  void* allocate(int64_t bytes) override;
  void release(void* p, int64_t bytes) override;
  bool backed() const override { return true; }
  void check_can_back(int64_t bytes) const override;  // beyond the machine's physical memory
  void trim();                                        // return every cached block to the system
  int64_t cached_bytes() const { return cached_; }

 private:
  static int64_t rounded(int64_t bytes);
  void trim_to(int64_t keep);  // returns the largest cached blocks until at most keep remain
  std::multimap<int64_t, void*> free_;  // rounded size -> block
  int64_t cached_ = 0;
  int64_t cache_limit_;
  SystemMemory system_;
};

// Address-ordered first fit over one reserved range [base, base + size), blocks rounded to
// Allocator::kAlignment and coalesced on release: the meta device's address range and the CUDA
// backend's one cudaMalloc both hand out their blocks with it. Not thread-safe by itself.
class FirstFitRange {
 public:
  FirstFitRange(char* base, int64_t size);
  char* base() const { return base_; }
  int64_t size() const { return size_; }
  // nullptr when no free block holds `bytes`.
  void* allocate(int64_t bytes);
  // Checks that p is a live block of the range (a double release is an error).
  void release(void* p, int64_t bytes);
  // The largest free block (what one more allocation could get).
  int64_t largest_free() const;

 private:
  static int64_t rounded(int64_t bytes);
  char* base_;
  int64_t size_;
  std::map<int64_t, int64_t> free_;  // offset -> length
};

// What an allocator throws when it cannot back a request; the arena turns it into an
// OutOfMemoryError naming the tag.
class BackingExhausted : public std::bad_alloc {
 public:
  explicit BackingExhausted(std::string what) : what_(std::move(what)) {}
  const char* what() const noexcept override { return what_.c_str(); }

 private:
  std::string what_;
};

// Addresses without memory. The first meta allocation in a process reserves one large virtual
// range (PROT_NONE, MAP_NORESERVE: never readable, writable or committed, so it costs no memory)
// shared by every MetaAllocator of the process; each allocation gets a distinct, kAlignment-
// aligned block of it (address-ordered first fit, blocks coalesce on release). The range is
// kMetaReserve bytes (smaller, halving, if the system refuses that much), enough for planning
// several TiB of live bytes at once, e.g. 8 simulated ranks x (80 GiB device + 256 GiB host).
// A request that does not fit throws BackingExhausted. Dereferencing a meta address faults. The
// last block released unmaps the range (the next allocation reserves it again).
class MetaAllocator final : public Allocator {
 public:
  static constexpr int64_t kMetaReserve = int64_t(16) << 40;  // 16 TiB
  void* allocate(int64_t bytes) override;
  void release(void* p, int64_t bytes) override;
  bool backed() const override { return false; }
  // Bytes of the process-wide reserved range (reserving it if needed).
  static int64_t reserved_bytes();
};

}  // namespace upipe
