// The two copy lanes of Backend::copy_async (backend/copy_lanes.h): which copies of the other lane
// a copy must follow, what a wait retires, the reordered run order the CPU's deferred copies use,
// and, through the CPU's deferred copies, that a dependency across the lanes keeps one queue's
// results where the lanes run reordered.
#include <gtest/gtest.h>

#include <utility>
#include <vector>

#include "backend/copy_lanes.h"
#include "backend/device.h"
#include "unit/scoped_env.h"

namespace upipe {
namespace {

CopyExtent extent(uintptr_t dst, uintptr_t src, uintptr_t bytes, int lane) {
  return {dst, dst + bytes, src, src + bytes, lane};
}

TEST(CopyLanes, LaneOfEachKind) {
  EXPECT_EQ(copy_lane(CopyKind::kDeviceToHost), 0);
  EXPECT_EQ(copy_lane(CopyKind::kHostToDevice), 1);
  EXPECT_EQ(copy_lane(CopyKind::kDeviceToDevice), 1);
  EXPECT_EQ(copy_lane(CopyKind::kHostToHost), 1);
  char a[8], b[8];
  const CopyExtent e = CopyExtent::of(a, b, 8, CopyKind::kDeviceToHost);
  EXPECT_EQ(e.dst, reinterpret_cast<uintptr_t>(a));
  EXPECT_EQ(e.dst_end, reinterpret_cast<uintptr_t>(a) + 8);
  EXPECT_EQ(e.src, reinterpret_cast<uintptr_t>(b));
  EXPECT_EQ(e.src_end - e.src, 8u);
  EXPECT_EQ(e.lane, 0);
}

TEST(CopyLanes, FollowsOnlyWhereOneWritesWhatTheOtherTouches) {
  const CopyExtent offload = extent(1000, 100, 50, 0);  // writes [1000,1050), reads [100,150)
  // Reads what the earlier one writes (a fetch of the offloaded block): follows.
  EXPECT_TRUE(copy_must_follow(extent(200, 1040, 50, 1), offload));
  // Writes what the earlier one reads (the offloaded slot refilled): follows.
  EXPECT_TRUE(copy_must_follow(extent(120, 5000, 10, 1), offload));
  // Writes what the earlier one writes: follows.
  EXPECT_TRUE(copy_must_follow(extent(1049, 5000, 1, 1), offload));
  // Reads what the earlier one reads: no order needed.
  EXPECT_FALSE(copy_must_follow(extent(7000, 100, 50, 1), offload));
  // Adjacent, not overlapping, on either side.
  EXPECT_FALSE(copy_must_follow(extent(1050, 150, 10, 1), offload));
  EXPECT_FALSE(copy_must_follow(extent(990, 90, 10, 1), offload));
  EXPECT_FALSE(copy_must_follow(extent(3000, 4000, 10, 1), offload));
}

TEST(CopyLanes, IssueListsTheOtherLanesPendingConflictsAndRetireNamesEachLanesNewest) {
  CopyLanes<int> lanes;
  EXPECT_TRUE(lanes.issue(1, extent(1000, 100, 50, 0), 10).after.empty());
  // Same lane, same bytes: its stream orders it, no cross-lane dependency.
  EXPECT_TRUE(lanes.issue(2, extent(1000, 100, 50, 0), 20).after.empty());
  // The other lane, reading what both wrote.
  EXPECT_EQ(lanes.issue(3, extent(200, 1000, 50, 1), 30).after, (std::vector<int64_t>{1, 2}));
  // The other lane again, disjoint from everything.
  EXPECT_TRUE(lanes.issue(4, extent(9000, 8000, 50, 1), 40).after.empty());
  // Lane 0 writing what copy 3 writes.
  EXPECT_EQ(lanes.issue(5, extent(210, 7000, 5, 0), 50).after, (std::vector<int64_t>{3}));
  ASSERT_NE(lanes.find(3), nullptr);
  EXPECT_EQ(lanes.find(3)->payload, 30);
  EXPECT_EQ(lanes.size(), 5u);

  const auto r = lanes.retire(3);
  ASSERT_EQ(r.copies.size(), 3u);
  EXPECT_EQ(r.copies[0].id, 1);
  EXPECT_EQ(r.copies[2].payload, 30);
  EXPECT_EQ(r.newest[0], 2);
  EXPECT_EQ(r.newest[1], 3);
  EXPECT_EQ(lanes.find(1), nullptr);
  EXPECT_EQ(lanes.size(), 2u);
  EXPECT_TRUE(lanes.retire(3).copies.empty()) << "again: nothing";
  // Retired copies are done for whatever comes later: a new conflict names only pending ones.
  EXPECT_EQ(lanes.issue(6, extent(100, 1000, 50, 1), 60).after, (std::vector<int64_t>{}))
      << "copy 1 and 2 are retired; copy 5 shares no byte";
  const auto rest = lanes.retire(100);
  EXPECT_EQ(rest.copies.size(), 3u);
  EXPECT_EQ(rest.newest[0], 5);
  EXPECT_EQ(rest.newest[1], 6);
  EXPECT_TRUE(lanes.empty());
}

std::vector<int64_t> run_ids(const std::vector<CopyLanes<int>::Copy>& copies) {
  std::vector<int64_t> ids;
  for (size_t i : copy_run_order(copies)) ids.push_back(copies[i].id);
  return ids;
}

CopyLanes<int>::Copy cp(int64_t id, int lane, std::vector<int64_t> after = {}) {
  CopyLanes<int>::Copy c;
  c.id = id;
  c.at = extent(0, 0, 0, lane);
  c.after = std::move(after);
  return c;
}

TEST(CopyLanes, RunOrderPutsTheLaterLaneFirstWhereNoDependencyForbidsIt) {
  // No dependencies: each lane in issue order, the later-issued head first.
  EXPECT_EQ(run_ids({cp(1, 0), cp(2, 1), cp(3, 0), cp(4, 1)}), (std::vector<int64_t>{2, 4, 1, 3}));
  // 2 must follow 1: 1 first, then 3 (later than 2, free), then 2 and 4.
  EXPECT_EQ(run_ids({cp(1, 0), cp(2, 1, {1}), cp(3, 0), cp(4, 1)}),
            (std::vector<int64_t>{1, 3, 2, 4}));
  // Lane 0's 3 must follow lane 1's 2: 2 goes before 3 though 3 is later.
  EXPECT_EQ(run_ids({cp(1, 0), cp(2, 1), cp(3, 0, {2}), cp(4, 1)}),
            (std::vector<int64_t>{2, 4, 1, 3}));
  EXPECT_EQ(run_ids({cp(1, 1), cp(2, 0, {1}), cp(3, 1)}), (std::vector<int64_t>{1, 3, 2}));
  // A dependency already retired (not in the batch) is done.
  EXPECT_EQ(run_ids({cp(5, 0), cp(6, 1, {2})}), (std::vector<int64_t>{6, 5}));
  // One lane only: issue order.
  EXPECT_EQ(run_ids({cp(1, 1), cp(2, 1), cp(3, 1)}), (std::vector<int64_t>{1, 2, 3}));
  EXPECT_TRUE(run_ids({}).empty());
}

// Through the CPU's deferred copies, which run each wait's copies in the order above: what one
// queue would give, both where a fetch reads an offload's result (the lanes' dependency) and
// where an offload overwrites the bytes a fetch still reads, and where a copy overwrites what an
// offload still reads (copy_run_order would run each pair's later copy first without the
// dependency).
TEST(CopyLanes, DeferredCpuCopiesAcrossTheLanesGiveOneQueuesResults) {
  const ScopedEnv env("UPIPE_CPU_COPIES", "deferred");
  Device dev({BackendKind::kCpu});
  constexpr int n = 64;
  Tensor a(dev.mem(), Tag::kOther, DType::kF32, 1, n), b(dev.mem(), Tag::kOther, DType::kF32, 1, n),
      c(dev.mem(), Tag::kOther, DType::kF32, 1, n), h(dev.host(), Tag::kOther, DType::kF32, 1, n);
  float *pa = static_cast<float*>(a.data()), *pb = static_cast<float*>(b.data()),
        *pc = static_cast<float*>(c.data()), *ph = static_cast<float*>(h.data());
  for (int i = 0; i < n; ++i) {
    pa[i] = float(i);
    pb[i] = -1.0f;
    pc[i] = 100.0f + float(i);
    ph[i] = -3.0f;
  }
  const int64_t bytes = n * 4;
  // Offload a to h (lane 0), fetch h back into b (lane 1): the fetch follows the offload.
  dev.copy_async(h.data(), a.data(), bytes, CopyKind::kDeviceToHost);
  const CopyTicket fetch = dev.copy_async(b.data(), h.data(), bytes, CopyKind::kHostToDevice);
  dev.wait(fetch);
  for (int i = 0; i < n; ++i) ASSERT_EQ(pb[i], float(i)) << "the fetch read the offload's result";
  // Fetch h into b (lane 1), then offload c over h (lane 0): the fetch still reads the old h.
  dev.copy_async(b.data(), h.data(), bytes, CopyKind::kHostToDevice);
  const CopyTicket over = dev.copy_async(h.data(), c.data(), bytes, CopyKind::kDeviceToHost);
  dev.wait(over);
  for (int i = 0; i < n; ++i) {
    ASSERT_EQ(pb[i], float(i)) << "the fetch read bytes the later offload had overwritten";
    ASSERT_EQ(ph[i], 100.0f + float(i));
  }
  // Offload a to h (lane 0), then overwrite a from b (lane 1): the offload saves the old a.
  for (int i = 0; i < n; ++i) pb[i] = 7.0f;
  dev.copy_async(h.data(), a.data(), bytes, CopyKind::kDeviceToHost);
  const CopyTicket t = dev.copy_async(a.data(), b.data(), bytes, CopyKind::kDeviceToDevice);
  dev.wait(t);
  for (int i = 0; i < n; ++i)
    ASSERT_EQ(ph[i], float(i)) << "the offload read a after it was rewritten";
  EXPECT_EQ(pa[3], 7.0f);
  dev.backend().sync(Stream{});
}

}  // namespace
}  // namespace upipe
