// GEMM (oneDNN matmul) against the naive reference, every transpose and dtype mix, strided
// operands, alpha and beta, and the exact workspace bytes (staging + scratchpad) it takes from
// the arena.
#include <gtest/gtest.h>

#include <tuple>

#include "backend/gemm.h"
#include "backend/reference/elementwise_ref.h"
#include "common/test_util.h"

namespace upipe {
namespace {

using test::read;

struct GemmCase {
  int64_t m, n, k;
  bool ta, tb;
  DType a, b, c;
  float beta;
  float alpha = 0.5f;
  int64_t pad = 0;  // extra columns in every operand's leading dimension (strided views)
};

// A (rows, cols) view into a (rows, cols + pad) tensor: leading dimension cols + pad.
Mat strided(const Tensor& t, int64_t cols) {
  return t.mat().cols_of(0, cols);
}

class GemmTest : public ::testing::TestWithParam<GemmCase> {};

TEST_P(GemmTest, MatchesReference) {
  const GemmCase g = GetParam();
  Device dev;
  const int64_t acols = g.ta ? g.m : g.k, bcols = g.tb ? g.k : g.n;
  Tensor at(dev.mem(), Tag::kOther, g.a, g.ta ? g.k : g.m, acols + g.pad);
  Tensor bt(dev.mem(), Tag::kOther, g.b, g.tb ? g.n : g.k, bcols + g.pad);
  Tensor ct(dev.mem(), Tag::kOther, g.c, g.m, g.n + g.pad);
  test::fill_normal(at, 1);
  test::fill_normal(bt, 2);
  test::fill_normal(ct, 3);
  const Mat a = strided(at, acols), b = strided(bt, bcols), c = strided(ct, g.n);
  const auto pad_before = read(ct);
  const auto av = read(a), bv = read(b), c0 = read(c);
  std::vector<double> ref(size_t(g.m * g.n));
  ref::gemm(test::cview(av, a.rows, a.cols), g.ta, test::cview(bv, b.rows, b.cols), g.tb,
            test::view(ref, g.m, g.n));
  for (size_t i = 0; i < ref.size(); ++i) ref[i] = g.alpha * ref[i] + g.beta * c0[i];
  const int64_t before = dev.mem().current();
  dev.mem().reset_peak();
  gemm(dev, a, g.ta, b, g.tb, c, g.alpha, g.beta);
  EXPECT_EQ(dev.mem().peak() - before,
            gemm_workspace_bytes(dev.backend(), g.m, g.n, g.k, g.a, g.b, g.c));
  EXPECT_EQ(dev.mem().current(), before);
  // The padding columns of C are not C: the product must leave them alone.
  const auto pad_after = read(ct);
  for (int64_t r = 0; r < g.m; ++r)
    for (int64_t j = g.n; j < g.n + g.pad; ++j)
      ASSERT_EQ(pad_after[size_t(r * (g.n + g.pad) + j)],
                pad_before[size_t(r * (g.n + g.pad) + j)]);
  // The meta device reserves the same bytes without touching data.
  Device meta(DeviceOptions{.kind = BackendKind::kMeta});
  const Mat null_a{nullptr, a.dtype, a.rows, a.cols, a.ld},
      null_b{nullptr, b.dtype, b.rows, b.cols, b.ld},
      null_c{nullptr, c.dtype, c.rows, c.cols, c.ld};
  gemm(meta, null_a, g.ta, null_b, g.tb, null_c, g.alpha, g.beta);
  EXPECT_EQ(meta.mem().peak(), gemm_workspace_bytes(dev.backend(), g.m, g.n, g.k, g.a, g.b, g.c));
  // fp32 accumulation error grows like sqrt(k) eps; storing C in bf16 adds half a bf16 ulp.
  const double out_eps = g.c == DType::kF32 ? 0 : 1.0 / 256;
  const double tol = 1e-5 * std::sqrt(double(g.k)) * 4 + out_eps * test::max_abs(ref);
  EXPECT_LE(test::max_abs_diff(read(c), ref), tol);
}

const DType F = DType::kF32, B = DType::kBF16;
INSTANTIATE_TEST_SUITE_P(All, GemmTest,
                         ::testing::Values(GemmCase{37, 29, 53, false, false, F, F, F, 0},
                                           GemmCase{37, 29, 53, true, false, F, F, F, 1},
                                           GemmCase{37, 29, 53, false, true, F, F, F, 0},
                                           GemmCase{37, 29, 53, true, true, F, F, F, 1},
                                           GemmCase{300, 40, 64, false, true, B, B, B, 0},
                                           GemmCase{300, 40, 64, false, true, B, B, B, 1},
                                           GemmCase{300, 40, 64, true, false, F, B, F, 1},
                                           GemmCase{70, 513, 33, false, false, B, F, B, 0},
                                           GemmCase{1, 1, 1, false, false, F, F, F, 0},
                                           // strided views (leading dimension > columns)
                                           GemmCase{37, 29, 53, false, false, F, F, F, 0, 1, 11},
                                           GemmCase{37, 29, 53, true, true, F, F, F, 1, 2, 11},
                                           GemmCase{200, 64, 96, false, true, F, F, F, 1, 1, 960},
                                           GemmCase{64, 200, 96, true, false, F, F, F, 0, 1, 512},
                                           GemmCase{300, 40, 270, true, true, B, B, B, 1, 2, 7},
                                           GemmCase{300, 40, 270, false, false, F, B, F, 0, 1, 33},
                                           GemmCase{70, 513, 33, true, false, B, F, B, 1, 1, 5},
                                           GemmCase{270, 20, 300, false, true, F, F, B, 1, 1, 9},
                                           // one row, one column, an empty inner dimension
                                           GemmCase{1, 64, 40, false, false, F, F, F, 1, 1, 3},
                                           GemmCase{64, 1, 40, true, true, F, F, F, 0, 1, 3},
                                           GemmCase{1, 64, 40, true, false, F, F, F, 0, 1, 0},
                                           GemmCase{33, 17, 0, false, false, F, F, F, 0, 1, 2},
                                           GemmCase{33, 17, 0, false, false, F, B, B, 2, 1, 2},
                                           // fp32 A and bf16 B with a full tile of depth: the
                                           // bf16x3 product where oneDNN has bf16 products, on
                                           // B in place (two C panels, transposed A or B, bf16
                                           // C, tile edges); strided B falls back to staging
                                           GemmCase{300, 2100, 270, true, false, F, B, F, 1},
                                           GemmCase{520, 70, 300, false, true, F, B, B, 0},
                                           GemmCase{256, 40, 256, false, false, F, B, F, 0},
                                           GemmCase{30, 33, 600, true, true, F, B, F, 1, 2},
                                           GemmCase{520, 70, 300, false, true, F, B, B, 0, 1, 9}));

// More shapes than the per-thread primitive cache holds: evicted primitives are recreated and
// results stay exact (small integers, so every order of summation gives the same fp32 value).
TEST(Gemm, CacheEvictionKeepsResults) {
  Device dev;
  Tensor a(dev.mem(), Tag::kOther, DType::kF32, 300, 4);
  Tensor b(dev.mem(), Tag::kOther, DType::kF32, 4, 3);
  Tensor c(dev.mem(), Tag::kOther, DType::kF32, 300, 3);
  for (int64_t i = 0; i < 300 * 4; ++i) a.f32()[i] = float(i % 7);
  for (int64_t i = 0; i < 4 * 3; ++i) b.f32()[i] = float(i % 5);
  for (int round = 0; round < 2; ++round) {
    for (int64_t m = 1; m <= 300; ++m) {
      gemm(dev, a.mat().rows_of(0, m), false, b, false, c.mat().rows_of(0, m));
      for (int64_t j = 0; j < 3; ++j) {
        float want = 0;
        for (int64_t p = 0; p < 4; ++p) want += a.f32()[(m - 1) * 4 + p] * b.f32()[p * 3 + j];
        ASSERT_EQ(c.f32()[(m - 1) * 3 + j], want) << "m=" << m << " round " << round;
      }
    }
  }
}

}  // namespace
}  // namespace upipe
