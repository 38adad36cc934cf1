// Sequence layouts on real ranks: every global position is held by exactly one rank, a shard
// cut from a global tensor holds the rows its positions name, and gathering the shards gives
// the global tensor back, for contiguous, zigzag and chunked layouts.
#include <set>

#include "attention/layout.h"
#include "kernels/tensor_ops.h"
#include "multirank/mpi_test_main.h"

namespace upipe {
namespace {

using test::world;

// v as a tensor of dtype t holds it (distinct rows are exact in fp32; bf16 checks placement of
// the rounded values).
float stored(float v, DType t) { return t == DType::kF32 ? v : bf16_to_f32(f32_to_bf16(v)); }

std::vector<SeqLayout> layouts(int c) {
  const int64_t s = 48 * 8;  // divisible by 2C and N*C for every C and N used
  return {{LayoutKind::kContiguous, s, c, 1}, {LayoutKind::kZigzag, s, c, 1},
          {LayoutKind::kChunked, s, c, 2},    {LayoutKind::kChunked, s, c, 4}};
}

TEST(Layout, PositionsPartitionTheSequence) {
  for (const SeqLayout& l : layouts(world().size())) {
    std::multiset<int64_t> all;
    for (int r = 0; r < l.ranks; ++r) {
      const auto p = l.positions(r).expand();
      EXPECT_EQ(int64_t(p.size()), l.local_rows()) << l.name();
      all.insert(p.begin(), p.end());
    }
    for (int64_t i = 0; i < l.seq_len; ++i) EXPECT_EQ(all.count(i), 1u) << l.name() << " position " << i;
  }
}

TEST(Layout, ShardAndGatherRoundTrip) {
  Device dev;
  const int rank = world().rank();
  for (const SeqLayout& l : layouts(world().size())) {
    for (DType t : {DType::kF32, DType::kBF16}) {
      Tensor global(dev.mem(), Tag::kOther, DType::kF32, l.seq_len, 3);
      for (int64_t r = 0; r < l.seq_len; ++r)
        for (int c = 0; c < 3; ++c) global.f32()[r * 3 + c] = stored(float(r * 4 + c), t);
      Tensor g_t(dev.mem(), Tag::kOther, t, l.seq_len, 3);
      copy(dev, g_t, global);
      Tensor local(dev.mem(), Tag::kOther, t, l.local_rows(), 3);
      shard_rows(dev, l, rank, g_t, local);
      const auto pos = l.positions(rank).expand();
      Tensor local32(dev.mem(), Tag::kOther, DType::kF32, l.local_rows(), 3);
      copy(dev, local32, local);
      for (int64_t r = 0; r < l.local_rows(); ++r)
        EXPECT_EQ(local32.f32()[r * 3 + 1], stored(float(pos[size_t(r)] * 4 + 1), t)) << l.name();
      Tensor back(dev.mem(), Tag::kOther, t, l.seq_len, 3);
      gather_rows(dev, world(), l, local, back);
      Tensor back32(dev.mem(), Tag::kOther, DType::kF32, l.seq_len, 3);
      copy(dev, back32, back);
      for (int64_t i = 0; i < l.seq_len * 3; ++i) ASSERT_EQ(back32.f32()[i], global.f32()[i]) << l.name();
    }
  }
}

TEST(Layout, ZigzagHoldsChunksRAnd2CMinus1MinusR) {
  const int c = world().size();
  const SeqLayout l{LayoutKind::kZigzag, 16 * c, c, 1};
  const RowPositions p = l.positions(world().rank());
  ASSERT_EQ(p.runs.size(), 2u);
  EXPECT_EQ(p.runs[0].pos, world().rank() * 8);
  EXPECT_EQ(p.runs[1].pos, (2 * c - 1 - world().rank()) * 8);
}

}  // namespace
}  // namespace upipe
