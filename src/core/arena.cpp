#include "core/arena.h"

#include <fmt/format.h>

#include <algorithm>

#include "core/check.h"
#include "core/checked.h"
#include "core/errors.h"

namespace upipe {
const char* tag_name(Tag t) {
  static const char* kNames[] = {"params", "grads",   "optim",     "gathered",    "act",
                                 "qkv",    "a2a",     "attn_out",  "kv_resident", "attn_grad",
                                 "ring",   "offload", "workspace", "mlp",         "logits",
                                 "stash",  "docs",    "other"};
  static_assert(sizeof(kNames) / sizeof(kNames[0]) == kNumTags);
  return kNames[static_cast<int>(t)];
}

int64_t TagBytes::sum(TagMask mask) const {
  int64_t s = 0;
  for (int i = 0; i < kNumTags; ++i)
    if (mask & (TagMask(1) << i)) s += v[i];
  return s;
}

std::string format_bytes(int64_t b) {
  const double x = double(b);
  if (b >= (int64_t(1) << 30)) return fmt::format("{:.2f} GiB", x / double(1 << 30));
  if (b >= (int64_t(1) << 20)) return fmt::format("{:.2f} MiB", x / double(1 << 20));
  if (b >= (int64_t(1) << 10)) return fmt::format("{:.1f} KiB", x / 1024.0);
  return fmt::format("{} B", b);
}

Arena::Arena(std::string name, int64_t budget, Allocator& backing)
    : name_(std::move(name)), budget_(budget), backing_(backing) {}

Arena::~Arena() {
  UPIPE_CHECK(current_ == 0, "arena '{}' destroyed with {} live bytes ({})", name_, current_,
              describe(cur_));
}

std::string Arena::describe(const TagBytes& b) {
  std::string s;
  for (int i = 0; i < kNumTags; ++i) {
    if (b.v[i] == 0) continue;
    if (!s.empty()) s += ", ";
    s += fmt::format("{}={}", tag_name(static_cast<Tag>(i)), format_bytes(b.v[i]));
  }
  return s.empty() ? "nothing" : s;
}

std::string Arena::over_budget_advice() const {
  const std::string smaller =
      fmt::format("choose a configuration with a smaller peak ({})", advice_);
  return budget_setting_.empty()
             ? smaller
             : fmt::format("raise the memory budget ({}) or {}", budget_setting_, smaller);
}

// Within the budget but beyond what backs it (the machine's memory, the GPU's): a lower budget
// would only be refused sooner.
std::string Arena::beyond_machine() const {
  return fmt::format(
      "this machine cannot hold it: choose a configuration with a smaller peak ({}) or a machine "
      "with more memory",
      advice_);
}

void* Arena::allocate(int64_t bytes, Tag tag) {
  UPIPE_CHECK(bytes >= 0, "negative allocation of {} bytes", bytes);
  if (bytes > budget_ - current_) {
    std::string msg = fmt::format(
        "out of memory in {} arena: tag '{}' requested {} ({} B) with {} of {} in use ({}); {}",
        name_, tag_name(tag), format_bytes(bytes), bytes, format_bytes(current_),
        format_bytes(budget_), describe(cur_), over_budget_advice());
    throw OutOfMemoryError(msg, name_, tag_name(tag), bytes, describe(cur_));
  }
  void* p = nullptr;
  try {
    p = backing_.allocate(bytes);
  } catch (const std::bad_alloc& e) {
    std::string msg = fmt::format(
        "out of memory in {} arena: tag '{}' requested {} ({} B) within the budget, but {} "
        "({} of {} in use: {}); {}",
        name_, tag_name(tag), format_bytes(bytes), bytes, e.what(), format_bytes(current_),
        format_bytes(budget_), describe(cur_), beyond_machine());
    OutOfMemoryError oom(msg, name_, tag_name(tag), bytes, describe(cur_));
    oom.backing = true;
    throw oom;
  }
  live_[reinterpret_cast<uintptr_t>(p)] = std::max<int64_t>(bytes, 1);
  on_change(tag, bytes);
  return p;
}

void Arena::check_fits(const TagBytes& need) const {
  int64_t bytes = 0;
  for (int64_t b : need.v) bytes = checked_add(bytes, b, "planned bytes");
  const std::string what = fmt::format(
      "out of memory in {} arena: this configuration needs at least {} ({} B: {}) before its first "
      "step",
      name_, format_bytes(bytes), bytes, describe(need));
  if (bytes > budget_ - current_)
    throw OutOfMemoryError(
        fmt::format("{}, over the budget of {} ({} in use); {}", what, format_bytes(budget_),
                    format_bytes(current_), over_budget_advice()),
        name_, "planned", bytes, describe(cur_));
  try {
    backing_.check_can_back(bytes);
  } catch (const std::bad_alloc& e) {
    throw OutOfMemoryError(
        fmt::format("{}, within the budget, but {}; {}", what, e.what(), beyond_machine()), name_,
        "planned", bytes, describe(cur_));
  }
}

void Arena::release(void* p, int64_t bytes, Tag tag) {
  live_.erase(reinterpret_cast<uintptr_t>(p));
  backing_.release(p, bytes);
  on_change(tag, -bytes);
}

bool Arena::owns(const void* p) const {
  const uintptr_t a = reinterpret_cast<uintptr_t>(p);
  auto it = live_.upper_bound(a);
  if (it == live_.begin()) return false;
  --it;
  return a - it->first < uint64_t(it->second);
}

void Arena::on_change(Tag tag, int64_t delta) {
  cur_[tag] += delta;
  current_ += delta;
  UPIPE_DCHECK(cur_[tag] >= 0 && current_ >= 0);
  if (cur_[tag] > tag_peak_[tag]) tag_peak_[tag] = cur_[tag];
  if (current_ > peak_) {
    peak_ = current_;
    at_peak_ = cur_;
  }
  const TagMask bit = tag_bit(tag);
  for (Watch& w : watches_) {
    if (!w.active || !(w.mask & bit)) continue;
    w.cur += delta;
    if (w.cur > w.peak) w.peak = w.cur;
  }
}

void Arena::reset_peak() {
  peak_ = current_;
  at_peak_ = cur_;
  tag_peak_ = cur_;
}

int Arena::start_watch(TagMask mask) {
  for (int i = 0; i < kMaxWatches; ++i) {
    if (watches_[i].active) continue;
    const int64_t c = cur_.sum(mask);
    watches_[i] = Watch{mask, c, c, true};
    return i;
  }
  UPIPE_CHECK(false, "more than {} arena watches at once", kMaxWatches);
  return -1;
}

int64_t Arena::watch_peak(int id) const {
  return watches_.at(size_t(id)).peak;
}

void Arena::stop_watch(int id) {
  watches_.at(size_t(id)).active = false;
}

Buffer::Buffer(Arena& arena, int64_t bytes, Tag tag)
    : arena_(&arena), data_(arena.allocate(bytes, tag)), bytes_(bytes), tag_(tag) {}

Buffer& Buffer::operator=(Buffer&& o) noexcept {
  if (this != &o) {
    reset();
    arena_ = o.arena_;
    data_ = o.data_;
    bytes_ = o.bytes_;
    tag_ = o.tag_;
    o.arena_ = nullptr;
    o.data_ = nullptr;
    o.bytes_ = 0;
  }
  return *this;
}

void Buffer::reset() {
  if (arena_) arena_->release(data_, bytes_, tag_);
  arena_ = nullptr;
  data_ = nullptr;
  bytes_ = 0;
}

}  // namespace upipe
