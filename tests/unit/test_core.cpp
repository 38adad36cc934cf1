// Arena accounting (tags, peaks, watches, typed OOM), Buffer ownership, dtype conversion, RNG.
#include <gtest/gtest.h>

#include "backend/device.h"
#include "core/arena.h"
#include "core/errors.h"
#include "core/rng.h"
#include "core/tensor.h"

namespace upipe {
namespace {

TEST(Dtype, Bf16RoundsToNearestEven) {
  EXPECT_EQ(f32_to_bf16(1.0f), 0x3f80);
  EXPECT_EQ(bf16_to_f32(0x3f80), 1.0f);
  // 1 + 2^-8 is exactly halfway between two bf16 values: rounds to the even one (1.0).
  EXPECT_EQ(f32_to_bf16(1.0f + 1.0f / 256), 0x3f80);
  // 1 + 3*2^-8 is halfway between 1+2^-7 (odd) and 1+2^-6 (even): rounds up.
  EXPECT_EQ(f32_to_bf16(1.0f + 3.0f / 256), 0x3f82);
  EXPECT_TRUE(std::isnan(bf16_to_f32(f32_to_bf16(NAN))));
  EXPECT_EQ(bf16_to_f32(f32_to_bf16(-INFINITY)), -INFINITY);
  EXPECT_THROW(parse_dtype("fp16"), ConfigError);
}

TEST(Arena, TracksCurrentPeakAndBreakdown) {
  HostCachingAllocator backing;
  Arena a("device", 1 << 20, backing);
  {
    Buffer x(a, 1000, Tag::kQkv);
    Buffer y(a, 3000, Tag::kA2a);
    EXPECT_EQ(a.current(), 4000);
    x.reset();
    Buffer z(a, 500, Tag::kQkv);
    EXPECT_EQ(a.current(), 3500);
    EXPECT_EQ(a.peak(), 4000);
    EXPECT_EQ(a.at_peak_by_tag()[Tag::kQkv], 1000);
    EXPECT_EQ(a.at_peak_by_tag()[Tag::kA2a], 3000);
    EXPECT_EQ(a.peak_by_tag()[Tag::kQkv], 1000);
  }
  EXPECT_EQ(a.current(), 0);
  EXPECT_EQ(a.peak(), 4000);
  a.reset_peak();
  EXPECT_EQ(a.peak(), 0);
}

TEST(Arena, WatchSeesOnlyItsTags) {
  HostCachingAllocator backing;
  Arena a("device", 1 << 20, backing);
  Buffer act(a, 5000, Tag::kAct);
  const int w = a.start_watch(kAttnIntermediateTags);
  {
    Buffer q(a, 100, Tag::kQkv);
    Buffer g(a, 7000, Tag::kGrads);
    Buffer ws(a, 50, Tag::kWorkspace);
  }
  Buffer q2(a, 120, Tag::kQkv);
  EXPECT_EQ(a.watch_peak(w), 150);
  a.stop_watch(w);
}

TEST(Arena, OutOfMemoryNamesTagRequestAndBreakdown) {
  HostCachingAllocator backing;
  Arena a("device", 10000, backing);
  Buffer x(a, 6000, Tag::kQkv);
  try {
    Buffer y(a, 5000, Tag::kA2a);
    FAIL() << "expected OutOfMemoryError";
  } catch (const OutOfMemoryError& e) {
    EXPECT_EQ(e.tag, "a2a");
    EXPECT_EQ(e.request, 5000);
    EXPECT_NE(std::string(e.what()).find("qkv="), std::string::npos) << e.what();
    EXPECT_NE(e.breakdown.find("qkv"), std::string::npos);
  }
  EXPECT_EQ(a.current(), 6000);  // the failed request left no trace
}

TEST(Arena, BufferMoveTransfersOwnership) {
  HostCachingAllocator backing;
  Arena a("device", 1 << 20, backing);
  Buffer x(a, 64, Tag::kOther);
  void* p = x.data();
  Buffer y = std::move(x);
  EXPECT_FALSE(x.live());
  EXPECT_EQ(y.data(), p);
  EXPECT_EQ(a.current(), 64);
}

TEST(Allocator, CachesBlocksBySize) {
  HostCachingAllocator alloc;
  void* p = alloc.allocate(10000);
  alloc.release(p, 10000);
  EXPECT_EQ(alloc.cached_bytes(), 12288);
  EXPECT_EQ(alloc.allocate(9000), p);  // same rounded size -> same block
  alloc.release(p, 9000);
  alloc.trim();
  EXPECT_EQ(alloc.cached_bytes(), 0);
}

TEST(Device, MetaCountsWithoutBacking) {
  Device dev({BackendKind::kMeta, int64_t(1) << 50, 0});
  Tensor t(dev.mem(), Tag::kQkv, DType::kBF16, int64_t(1) << 20, 4096);
  EXPECT_EQ(t.data(), nullptr);
  EXPECT_EQ(dev.mem().current(), (int64_t(1) << 20) * 4096 * 2);
}

TEST(Rng, CounterBasedIsShardIndependentAndNormal) {
  double s = 0, s2 = 0;
  const int n = 200000;
  for (int i = 0; i < n; ++i) {
    const double x = normal_at(7, uint64_t(i));
    s += x;
    s2 += x * x;
  }
  EXPECT_NEAR(s / n, 0.0, 0.01);
  EXPECT_NEAR(s2 / n, 1.0, 0.01);
  EXPECT_EQ(normal_at(7, 12345), normal_at(7, 12345));
  EXPECT_NE(normal_at(7, 12345), normal_at(8, 12345));
}

}  // namespace
}  // namespace upipe
