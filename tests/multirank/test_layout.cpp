// Sharding and gathering on real ranks: a shard cut from a global tensor holds the rows its
// positions name, and gathering the shards gives the global tensor back, for every layout
// (which positions each rank holds is tested in tests/unit/test_layout.cpp).
#include "attention/layout.h"
#include "backend/tensor_ops.h"
#include "multirank/mpi_test_main.h"

namespace upipe {
namespace {

using test::world;

// v as a tensor of dtype t holds it (distinct rows are exact in fp32; bf16 checks placement of
// the rounded values).
float stored(float v, DType t) {
  return t == DType::kF32 ? v : bf16_to_f32(f32_to_bf16(v));
}

std::vector<SeqLayout> layouts(int c) {
  const int64_t s = 48 * 8;  // divisible by 2C and N*C for every C and N used
  std::vector<SeqLayout> v{{LayoutKind::kContiguous, s, c, 1},
                           {LayoutKind::kZigzag, s, c, 1},
                           {LayoutKind::kChunked, s, c, 2},
                           {LayoutKind::kChunked, s, c, 4}};
  for (int u = 1; u <= c; ++u)
    if (c % u == 0) v.push_back({LayoutKind::kZigzagGrid, s, c, 1, u});
  return v;
}

TEST(LayoutMpi, ShardAndGatherRoundTrip) {
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
      for (int64_t i = 0; i < l.seq_len * 3; ++i)
        ASSERT_EQ(back32.f32()[i], global.f32()[i]) << l.name();
    }
  }
}

}  // namespace
}  // namespace upipe
