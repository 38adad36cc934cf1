// Accumulate semantics of every strategy (attention/strategy.h): forward with beta = 1 adds the
// block to y (the residual stream), backward with dx_beta = dw_beta = 1 adds to dx and to every
// weight gradient (micro-batches). On each rank, the block runs once with beta = 0 into
// NaN-filled outputs (beta = 0 must not read them), giving r; then y, dx and the gradients are
// prefilled with known values p (normal, scaled to r's magnitude) and the block runs again with
// beta = 1 (run_block(..., accumulate = true)). Each tensor must equal p + r within
//   fp32 (y, dx with an fp32 residual; the gradients always): 8 eps_fp32 (max|p| + max|r|),
//       a few roundings of the magnitudes involved (the block's own partial sums may now be
//       added onto p instead of onto each other);
//   bf16 y, dx: eps_bf16 (max|p| + max|r|): one rounding of p + block (half a bf16 ulp) next to
//       the rounding already in r (another half);
//   the QK-norm weight gradients dWqn, dWkn: 2 sqrt(S H) eps_fp32 (max|p| + max|r|). Each is a
//       (1, d) sum of up to S H row terms that the backward adds straight onto the prefilled
//       value, one row at a time, so the rounding of every partial sum changes with p; the
//       bound is the random-walk growth of a sum of that length (the fixed 8 ulp above would
//       not hold; a lost or doubled prefill is off by max|p|, far above either bound).
// Configurations: the table's block-option cases (strategy_cases.h: D != H d, QK-norm, llama3
// RoPE; fp32, and bf16 with an fp32 residual), and each bf16 one again with a bf16 residual.
#include <cmath>
#include <limits>

#include "attention/harness.h"
#include "attention/methods.h"
#include "backend/tensor_ops.h"
#include "common/test_util.h"
#include "core/rng.h"
#include "multirank/mpi_test_main.h"
#include "multirank/strategy_cases.h"

namespace upipe {
namespace {

using test::StrategyCase;
using test::world;

std::vector<StrategyCase> accumulate_cases(int c) {
  std::vector<StrategyCase> out;
  for (StrategyCase sc : test::strategy_cases(c)) {
    if (!sc.cfg.qk_norm) continue;  // the block-option group
    out.push_back(sc);
    if (sc.cfg.fp32_residual) {
      sc.cfg.fp32_residual = false;
      sc.name.replace(sc.name.find("_f32res"), std::string("_f32res").size(), "_bf16res");
      out.push_back(sc);
    }
  }
  return out;
}

template <class T>
int64_t nonfinite(const std::vector<T>& v) {
  int64_t n = 0;
  for (const T& x : v) n += !std::isfinite(double(x));
  return n;
}

class Accumulate : public ::testing::TestWithParam<StrategyCase> {};

TEST_P(Accumulate, BetaOneAddsTheBlockToPrefilledOutputs) {
  const StrategyCase& sc = GetParam();
  Communicator& comm = world();
  Device dev;
  auto s = make_strategy({dev, comm, sc.cfg});
  BlockTensors t = make_block_tensors(dev, sc.cfg, s->layout().positions(comm.rank()), 1);
  struct Out {
    const char* name;
    Mat m;
    bool long_sum = false;  // a reduction over all rows and heads (QK-norm weights)
  };
  std::vector<Out> outs = {{"y", t.y},    {"dx", t.dx},  {"dwq", t.gq},
                           {"dwk", t.gk}, {"dwv", t.gv}, {"dwo", t.go}};
  if (sc.cfg.qk_norm) {
    outs.push_back({"dwqn", t.gqn, true});
    outs.push_back({"dwkn", t.gkn, true});
  }
  for (const Out& o : outs) fill(dev, o.m, std::numeric_limits<float>::quiet_NaN());
  run_block(*s, dev, t);

  std::vector<std::vector<double>> first, pre;
  uint64_t seed = 1000;
  for (const Out& o : outs) {
    first.push_back(test::cast<double>(download(dev, o.m)));
    EXPECT_EQ(nonfinite(first.back()), 0) << o.name << " after beta = 0 into NaN";
    const double scale = test::max_abs(first.back());
    std::vector<float> p(size_t(o.m.numel()));
    for (size_t i = 0; i < p.size(); ++i) p[i] = float(scale * normal_at(seed, i));
    ++seed;
    upload(dev, p.data(), o.m);
    pre.push_back(test::rounded(test::cast<double>(p), o.m.dtype));
  }
  run_block(*s, dev, t, /*accumulate=*/true);

  for (size_t i = 0; i < outs.size(); ++i) {
    const Out& o = outs[i];
    ASSERT_GT(test::max_abs(first[i]), 0.0) << o.name << ": the block gave zeros";
    std::vector<double> want(first[i].size());
    for (size_t j = 0; j < want.size(); ++j) want[j] = pre[i][j] + first[i][j];
    const double eps32 = std::numeric_limits<float>::epsilon();
    const double eps = o.long_sum ? 2 * std::sqrt(double(sc.cfg.seq_len * sc.cfg.heads)) * eps32
                       : o.m.dtype == DType::kF32 ? 8 * eps32
                                                  : 1.0 / 128;  // bf16 epsilon
    const double tol = eps * (test::max_abs(pre[i]) + test::max_abs(first[i]));
    const std::vector<float> got = download(dev, o.m);
    EXPECT_EQ(nonfinite(got), 0) << o.name;
    const double err = test::max_abs_diff(got, want);
    EXPECT_LE(err, tol) << o.name << " (" << dtype_name(o.m.dtype) << ") on rank " << comm.rank()
                        << " of " << comm.size();
  }
}

INSTANTIATE_TEST_SUITE_P(Table, Accumulate, ::testing::ValuesIn(accumulate_cases(world().size())),
                         [](const auto& i) { return i.param.name; });

}  // namespace
}  // namespace upipe
