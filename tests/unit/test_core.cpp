// Arena accounting (tags, peaks, watches, typed OOM), Buffer ownership, meta addresses, checked
// size arithmetic, one-line errors, dtype conversion, RNG.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <cstdlib>
#include <fstream>
#include <memory>
#include <vector>

#include "backend/device.h"
#include "core/arena.h"
#include "core/checked.h"
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

// owns(): inside a live block, not past its end, not after its release (what "device memory" is
// for the routed communicator on the CPU).
TEST(Arena, OwnsExactlyItsLiveBlocks) {
  HostCachingAllocator backing;
  Arena a("device", 1 << 20, backing);
  Buffer x(a, 1000, Tag::kQkv);
  Buffer y(a, 0, Tag::kOther);
  const char* p = static_cast<const char*>(x.data());
  EXPECT_TRUE(a.owns(p));
  EXPECT_TRUE(a.owns(p + 999));
  EXPECT_FALSE(a.owns(p + 1000));
  EXPECT_FALSE(a.owns(p - 1));
  EXPECT_TRUE(a.owns(y.data()));  // a zero-byte block still has its address
  int on_stack = 0;
  EXPECT_FALSE(a.owns(&on_stack));
  x.reset();
  EXPECT_FALSE(a.owns(p));
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

// Over its limit the cache returns only the excess, largest blocks first, with one before_free per
// batch (pinned memory: one device drain, not one per block).
int g_frees = 0, g_drains = 0;
TEST(Allocator, TrimsOnlyTheExcessLargestFirst) {
  SystemMemory counted = SystemMemory::pageable();
  counted.free = [](void* p) {
    ++g_frees;
    std::free(p);
  };
  counted.before_free = [] { ++g_drains; };
  g_frees = g_drains = 0;
  const int64_t page = 4096;
  HostCachingAllocator alloc(10 * page, counted);
  void* a = alloc.allocate(4 * page);
  void* b = alloc.allocate(3 * page);
  void* c = alloc.allocate(2 * page);
  void* d = alloc.allocate(6 * page);
  alloc.release(a, 4 * page);
  alloc.release(b, 3 * page);
  alloc.release(c, 2 * page);
  EXPECT_EQ(alloc.cached_bytes(), 9 * page);
  EXPECT_EQ(g_frees, 0);
  // 9 + 6 pages > 10: the 4-page block goes, and then the 3-page one (5 + 6 would still be 11).
  alloc.release(d, 6 * page);
  EXPECT_EQ(g_frees, 2);
  EXPECT_EQ(g_drains, 1);
  EXPECT_EQ(alloc.cached_bytes(), 8 * page);
  EXPECT_EQ(alloc.allocate(2 * page), c);  // the small one stayed
  EXPECT_EQ(alloc.allocate(6 * page), d);
  alloc.release(c, 2 * page);
  alloc.release(d, 6 * page);
  alloc.trim();
  EXPECT_EQ(g_frees, 4);
  EXPECT_EQ(g_drains, 2);
  alloc.trim();  // nothing cached: no drain
  EXPECT_EQ(g_drains, 2);
}

TEST(Allocator, RefusesMoreThanTheMachineHas) {
  HostCachingAllocator backing;
  Arena a("device", int64_t(1) << 60, backing);
  try {
    Buffer x(a, int64_t(1) << 52, Tag::kMlp);  // 4 PiB: within the budget, beyond any machine
    FAIL() << "expected OutOfMemoryError";
  } catch (const OutOfMemoryError& e) {
    EXPECT_EQ(e.tag, "mlp");
    EXPECT_NE(std::string(e.what()).find("this machine has"), std::string::npos) << e.what();
  }
  EXPECT_EQ(a.current(), 0);
}

TEST(Device, MetaCountsWithoutBacking) {
  Device dev({BackendKind::kMeta, int64_t(1) << 50, 0});
  Tensor t(dev.mem(), Tag::kQkv, DType::kBF16, int64_t(1) << 20, 4096);
  EXPECT_NE(t.data(), nullptr);  // a real, never-dereferenced address
  EXPECT_EQ(dev.mem().current(), (int64_t(1) << 20) * 4096 * 2);
}

TEST(MetaAllocator, DistinctAlignedAddressesReusedAfterRelease) {
  MetaAllocator m;
  void* a = m.allocate(0);
  void* b = m.allocate(100);
  void* c = m.allocate(int64_t(1) << 40);
  for (void* p : {a, b, c}) {
    EXPECT_NE(p, nullptr);
    EXPECT_EQ(reinterpret_cast<uintptr_t>(p) % Allocator::kAlignment, 0u);
  }
  EXPECT_NE(a, b);
  EXPECT_GE(static_cast<char*>(c) - static_cast<char*>(b), 100);
  m.release(b, 100);
  void* d = m.allocate(64);  // first fit: the released block
  EXPECT_EQ(d, b);
  m.release(d, 64);
  m.release(a, 0);
  m.release(c, int64_t(1) << 40);
}

// Whether an address range starting at p is mapped in this process (/proc/self/maps).
bool mapped_at(const void* p) {
  std::ifstream maps("/proc/self/maps");
  const std::string start = fmt::format("{:x}-", reinterpret_cast<uintptr_t>(p));
  for (std::string line; std::getline(maps, line);)
    if (line.rfind(start, 0) == 0) return true;
  return false;
}

// The range is given back with its last block (under `ulimit -v` it may hold half the address
// space a training run that planned its step needs), and reserved again by the next allocation.
TEST(MetaAllocator, LastBlockReleasedUnmapsTheRange) {
  MetaAllocator m;
  void* a = m.allocate(0);  // first fit: the range's start
  void* b = m.allocate(int64_t(1) << 30);
  EXPECT_TRUE(mapped_at(a));
  m.release(a, 0);
  EXPECT_TRUE(mapped_at(a));  // b still lives in it
  m.release(b, int64_t(1) << 30);
  EXPECT_FALSE(mapped_at(a));
  EXPECT_GE(MetaAllocator::reserved_bytes(), int64_t(1) << 30);  // reserved again to say its size
  void* c = m.allocate(64);
  EXPECT_NE(c, nullptr);
  m.release(c, 64);
}

TEST(MetaAllocator, HoldsEightPlannedRanksOfDeviceAndHostMemory) {
  ASSERT_GE(MetaAllocator::reserved_bytes(), int64_t(8) * (int64_t(80 + 256) << 30));
  std::vector<std::unique_ptr<Device>> ranks;
  std::vector<Tensor> held;
  for (int r = 0; r < 8; ++r) {
    ranks.push_back(std::make_unique<Device>(
        DeviceOptions{BackendKind::kMeta, int64_t(80) << 30, int64_t(256) << 30}));
    held.emplace_back(ranks.back()->mem(), Tag::kAct, DType::kF32, int64_t(80) << 20, 256);
    held.emplace_back(ranks.back()->host(), Tag::kOffload, DType::kF32, int64_t(256) << 20, 256);
  }
  held.clear();
}

TEST(MetaAllocator, ExhaustedRangeIsAnOutOfMemoryErrorNamingTheTag) {
  MetaAllocator m;
  EXPECT_THROW(m.allocate(MetaAllocator::reserved_bytes() + 1), BackingExhausted);
  Device dev({BackendKind::kMeta, int64_t(1) << 62, 0});
  try {
    Tensor t(dev.mem(), Tag::kA2a, DType::kF32, int64_t(1) << 50, 64);
    FAIL() << "expected OutOfMemoryError";
  } catch (const OutOfMemoryError& e) {
    EXPECT_EQ(e.tag, "a2a");
    EXPECT_NE(std::string(e.what()).find("reserved address range"), std::string::npos) << e.what();
  }
  EXPECT_EQ(dev.mem().current(), 0);
}

TEST(Checked, SizesThatOverflowThrowInsteadOfWrapping) {
  EXPECT_EQ(mat_bytes(3, 5, DType::kBF16), 30);
  EXPECT_THROW(mat_bytes(int64_t(1) << 62, 2, DType::kF32), SizeError);
  EXPECT_THROW(mat_bytes(int64_t(1) << 31, int64_t(1) << 31, DType::kF32), SizeError);
  EXPECT_THROW(mat_bytes(-1, 4, DType::kF32), SizeError);
  EXPECT_THROW(checked_add(INT64_MAX, 1), SizeError);
  int64_t out = 0;
  EXPECT_TRUE(mul_fits(out, {1 << 20, 1 << 20, 1 << 20}));
  EXPECT_EQ(out, int64_t(1) << 60);
  EXPECT_FALSE(mul_fits(out, {1 << 20, 1 << 20, 1 << 20, 1 << 20}));
  Device dev({BackendKind::kMeta, int64_t(1) << 62, 0});
  EXPECT_THROW(Tensor(dev.mem(), Tag::kQkv, DType::kF32, int64_t(1) << 61, 4), SizeError);
  EXPECT_EQ(dev.mem().current(), 0);
}

TEST(Errors, AConfigErrorIsOneLineWhateverItQuotes) {
  const ConfigError e(std::string("f.npy: shape (3,\n\t") + '\x01' + "\x7f)\r\\n");
  EXPECT_STREQ(e.what(), "f.npy: shape (3,\\n\\t\\x01\\x7f)\\r\\n");
  // UTF-8 (a path in another script) passes as it is.
  EXPECT_STREQ(ConfigError("/data/\u00e9t\u00e9.bin: missing").what(),
               "/data/\u00e9t\u00e9.bin: missing");
  EXPECT_EQ(excerpt("abcdef", 6), "abcdef");
  EXPECT_EQ(excerpt("abcdefgh", 3), "abc... (5 more bytes)");
  // Bytes that are no UTF-8 (a damaged .npy header's) are escaped, so stderr stays text: a stray
  // continuation byte, a lead without its continuation, an overlong form, a surrogate, a lead
  // cut off at the end, and C1 controls (U+009B is a terminal's CSI).
  EXPECT_STREQ(ConfigError("shape (20\xf2" "0,)").what(), "shape (20\\xf20,)");
  EXPECT_STREQ(ConfigError("dtype '\x92i4'").what(), "dtype '\\x92i4'");
  EXPECT_STREQ(ConfigError("a\xc0\xaf" "b").what(), "a\\xc0\\xafb");
  EXPECT_STREQ(ConfigError("a\xed\xa0\x80" "b").what(), "a\\xed\\xa0\\x80b");
  EXPECT_STREQ(ConfigError("end\xe2\x82").what(), "end\\xe2\\x82");
  EXPECT_STREQ(ConfigError("csi\xc2\x9b[2J").what(), "csi\\xc2\\x9b[2J");
  // A line separator and a right-to-left override: text a harness or a terminal acts on.
  EXPECT_STREQ(ConfigError("a\u2028b\u202e").what(), "a\\xe2\\x80\\xa8b\\xe2\\x80\\xae");
  EXPECT_STREQ(ConfigError("\u20ac \U0001F600 ok").what(), "\u20ac \U0001F600 ok");
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
