// The order of asynchronous copies (Backend::copy_async) on two lanes, one per direction of the
// host link: lane 0 carries device -> host (fpdt's K/V offload, the stash's saves), lane 1
// everything else (fetches back to the device, device and host copies). A GPU runs the lanes on
// two streams, so an offload and a fetch use both directions of a full-duplex PCIe or NVLink
// link at once instead of queueing behind each other.
//
// The order users see stays one queue's: each lane runs its copies in issue order, and a copy
// also starts after every earlier copy of the other lane, not yet waited on, that shares a byte
// with it where one of the two writes (it writes what that one reads or writes, or reads what
// that one writes). So every copy sees the bytes it would have seen on one queue; only copies
// with disjoint memory run at once. wait(t) still covers every copy issued up to t.
//
// Pure host code (no CUDA): the CUDA backend keeps its events as the payload, the CPU's deferred
// copies (UPIPE_CPU_COPIES=deferred) their arguments, and copy_run_order() gives the CPU the order
// a GPU may legally take that differs most from issue order, so a missing dependency shows on the
// CPU as wrong data.
#pragma once

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <vector>

#include "backend/backend.h"

namespace upipe {

constexpr int kCopyLanes = 2;

inline int copy_lane(CopyKind kind) {
  return kind == CopyKind::kDeviceToHost ? 0 : 1;
}

// The bytes a copy writes [dst, dst_end) and reads [src, src_end), and its lane.
struct CopyExtent {
  uintptr_t dst = 0, dst_end = 0, src = 0, src_end = 0;
  int lane = 0;

  static CopyExtent of(void* d, const void* s, int64_t bytes, CopyKind kind) {
    const auto pd = reinterpret_cast<uintptr_t>(d), ps = reinterpret_cast<uintptr_t>(s);
    return {pd, pd + uintptr_t(bytes), ps, ps + uintptr_t(bytes), copy_lane(kind)};
  }
};

namespace copy_lanes_detail {
inline bool overlap(uintptr_t a, uintptr_t a_end, uintptr_t b, uintptr_t b_end) {
  return a < b_end && b < a_end;
}
}  // namespace copy_lanes_detail

// Whether `later` must start after `earlier` (issued before it): one writes a byte the other
// reads or writes.
inline bool copy_must_follow(const CopyExtent& later, const CopyExtent& earlier) {
  using copy_lanes_detail::overlap;
  return overlap(later.dst, later.dst_end, earlier.dst, earlier.dst_end) ||
         overlap(later.dst, later.dst_end, earlier.src, earlier.src_end) ||
         overlap(later.src, later.src_end, earlier.dst, earlier.dst_end);
}

template <class Payload>
class CopyLanes {
 public:
  struct Copy {
    int64_t id = 0;
    CopyExtent at;
    std::vector<int64_t> after;  // the other lane's copies it starts after (ids, ascending)
    Payload payload{};
  };

  // Records copy `id` (ids ascend); returns it, with the pending copies of the other lane it
  // must start after in `after`.
  const Copy& issue(int64_t id, const CopyExtent& at, Payload payload) {
    Copy c{id, at, {}, std::move(payload)};
    for (const Copy& p : pending_)
      if (p.at.lane != at.lane && copy_must_follow(at, p.at)) c.after.push_back(p.id);
    pending_.push_back(std::move(c));
    return pending_.back();
  }

  // The pending copy `id`, or nullptr once retired.
  const Copy* find(int64_t id) const {
    for (const Copy& p : pending_)
      if (p.id == id) return &p;
    return nullptr;
  }

  // Removes the copies issued up to t, in issue order. newest[lane]: the id of the last one of
  // each lane (0: none); waiting on those two waits on every copy removed.
  struct Retired {
    std::vector<Copy> copies;
    std::array<int64_t, kCopyLanes> newest{};
  };
  Retired retire(int64_t t) {
    Retired r;
    while (!pending_.empty() && pending_.front().id <= t) {
      r.newest[size_t(pending_.front().at.lane)] = pending_.front().id;
      r.copies.push_back(std::move(pending_.front()));
      pending_.pop_front();
    }
    return r;
  }

  bool empty() const { return pending_.empty(); }
  size_t size() const { return pending_.size(); }
  void clear() { pending_.clear(); }

 private:
  std::deque<Copy> pending_;  // issued, not yet retired, in issue order
};

// An order in which two lanes may run `copies` (in issue order, each one's `after` among them or
// done before): each lane in its issue order, each copy after its dependencies, and of the two
// lanes' next copies the one issued later first whenever it may go. Returns indices into copies.
template <class Copy>
std::vector<size_t> copy_run_order(const std::vector<Copy>& copies) {
  std::vector<size_t> order;
  std::vector<bool> done(copies.size(), false);
  std::array<size_t, kCopyLanes> next{};  // per lane: the index from which to look for its head
  auto head = [&](int lane) -> size_t {
    size_t& i = next[size_t(lane)];
    while (i < copies.size() && (done[i] || copies[i].at.lane != lane)) ++i;
    return i;
  };
  auto ready = [&](size_t i) {
    for (int64_t dep : copies[i].after)
      for (size_t j = 0; j < copies.size(); ++j)
        if (copies[j].id == dep && !done[j]) return false;
    return true;
  };
  while (order.size() < copies.size()) {
    const size_t h0 = head(0), h1 = head(1);
    // Later-issued first; its dependencies point back in issue order, so one of the two can run.
    const size_t first = h0 == copies.size() ? h1 : h1 == copies.size() ? h0 : std::max(h0, h1);
    const size_t second = first == h0 ? h1 : h0;
    const size_t pick = ready(first) || second == copies.size() ? first : second;
    done[pick] = true;
    order.push_back(pick);
  }
  return order;
}

}  // namespace upipe
