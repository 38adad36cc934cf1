// A per-rank memory arena with a byte budget. Every allocation is tagged; the arena reports
// current and peak bytes, the per-tag bytes at the moment of the peak, and per-tag peaks.
// Watches measure the peak of a subset of tags over a window (e.g. the attention
// intermediates of one forward+backward). Accounting is in requested bytes, exactly; the
// backing allocator's rounding is not counted.
#pragma once

#include <array>
#include <cstdint>
#include <map>
#include <string>

#include "core/allocator.h"
#include "core/tags.h"

namespace upipe {

struct TagBytes {
  std::array<int64_t, kNumTags> v{};
  int64_t operator[](Tag t) const { return v[static_cast<int>(t)]; }
  int64_t& operator[](Tag t) { return v[static_cast<int>(t)]; }
  int64_t sum(TagMask mask = kAllTags) const;
};

class Arena {
 public:
  Arena(std::string name, int64_t budget, Allocator& backing);
  Arena(const Arena&) = delete;
  Arena& operator=(const Arena&) = delete;
  ~Arena();

  // Throws OutOfMemoryError when current + bytes > budget.
  void* allocate(int64_t bytes, Tag tag);
  // Throws the OutOfMemoryError that allocating all of `need` (bytes per tag, live at once) would
  // end in, allocating nothing: sizes that come from files or flags are checked against the
  // budget and the machine before any allocation depends on them.
  void check_fits(const TagBytes& need) const;
  void release(void* p, int64_t bytes, Tag tag);
  // Whether p lies in a live allocation of this arena (what "device memory" is where the device
  // is the CPU: the routed communicator's test classifier, attention/device_comm.h).
  bool owns(const void* p) const;

  const std::string& name() const { return name_; }
  int64_t budget() const { return budget_; }
  void set_budget(int64_t b) { budget_ = b; }
  // What an out-of-memory error tells the user to change (by default a training run's knobs);
  // a command with other knobs (bench kernel) names its own.
  void set_advice(std::string advice) { advice_ = std::move(advice); }
  // The setting that sets the budget, named beside "raise the memory budget" ("--device-memory");
  // "" for a command whose budget no setting changes (the advice alone is said).
  void set_budget_setting(std::string flag) { budget_setting_ = std::move(flag); }
  bool backed() const { return backing_.backed(); }
  Allocator& backing() { return backing_; }

  int64_t current() const { return current_; }
  int64_t peak() const { return peak_; }
  const TagBytes& current_by_tag() const { return cur_; }
  const TagBytes& at_peak_by_tag() const { return at_peak_; }
  const TagBytes& peak_by_tag() const { return tag_peak_; }
  // Restart peak tracking from the current state.
  void reset_peak();

  // Peak of the bytes held in `mask` tags since start_watch(); at most kMaxWatches at once.
  int start_watch(TagMask mask);
  int64_t watch_peak(int id) const;
  void stop_watch(int id);

  // "qkv=1.0 MiB, a2a=..." of the given per-tag bytes (non-zero entries only).
  static std::string describe(const TagBytes& b);

 private:
  struct Watch {
    TagMask mask = 0;
    int64_t cur = 0, peak = 0;
    bool active = false;
  };
  static constexpr int kMaxWatches = 4;
  void on_change(Tag tag, int64_t delta);
  std::string beyond_machine() const;
  // What to change for a request over the budget: the budget's setting where the command has
  // one, and the advice.
  std::string over_budget_advice() const;

  std::string name_;
  int64_t budget_;
  std::string advice_ =
      "a shorter sequence, more ranks, bf16, --offload-stash; `upipe plan` finds one that fits";
  std::string budget_setting_;
  Allocator& backing_;
  int64_t current_ = 0, peak_ = 0;
  TagBytes cur_, at_peak_, tag_peak_;
  std::array<Watch, kMaxWatches> watches_{};
  std::map<uintptr_t, int64_t> live_;  // live allocations: address -> bytes (at least 1)
};

// RAII ownership of one arena allocation.
class Buffer {
 public:
  Buffer() = default;
  Buffer(Arena& arena, int64_t bytes, Tag tag);
  Buffer(Buffer&& o) noexcept { *this = std::move(o); }
  Buffer& operator=(Buffer&& o) noexcept;
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;
  ~Buffer() { reset(); }
  void reset();
  void* data() const { return data_; }
  int64_t bytes() const { return bytes_; }
  Tag tag() const { return tag_; }
  bool live() const { return arena_ != nullptr; }

 private:
  Arena* arena_ = nullptr;
  void* data_ = nullptr;
  int64_t bytes_ = 0;
  Tag tag_ = Tag::kOther;
};

// Human-readable byte count: "1.50 GiB".
std::string format_bytes(int64_t bytes);

}  // namespace upipe
