// GEMM (oneDNN) against the naive reference, every transpose and dtype mix, with beta, and
// the exact workspace bytes it takes from the arena.
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
};

class GemmTest : public ::testing::TestWithParam<GemmCase> {};

TEST_P(GemmTest, MatchesReference) {
  const GemmCase g = GetParam();
  Device dev;
  Tensor a(dev.mem(), Tag::kOther, g.a, g.ta ? g.k : g.m, g.ta ? g.m : g.k);
  Tensor b(dev.mem(), Tag::kOther, g.b, g.tb ? g.n : g.k, g.tb ? g.k : g.n);
  Tensor c(dev.mem(), Tag::kOther, g.c, g.m, g.n);
  test::fill_normal(a, 1);
  test::fill_normal(b, 2);
  test::fill_normal(c, 3);
  const auto av = read(a), bv = read(b), c0 = read(c);
  std::vector<double> ref(size_t(g.m * g.n));
  ref::gemm(test::cview(av, a.rows(), a.cols()), g.ta, test::cview(bv, b.rows(), b.cols()), g.tb,
            test::view(ref, g.m, g.n));
  for (size_t i = 0; i < ref.size(); ++i) ref[i] = 0.5 * ref[i] + g.beta * c0[i];
  const int64_t before = dev.mem().current();
  dev.mem().reset_peak();
  gemm(dev, a, g.ta, b, g.tb, c, 0.5f, g.beta);
  EXPECT_EQ(dev.mem().peak() - before,
            gemm_workspace_bytes(dev.backend(), g.m, g.n, g.k, g.a, g.b, g.c));
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
                                           GemmCase{1, 1, 1, false, false, F, F, F, 0}));

}  // namespace
}  // namespace upipe
