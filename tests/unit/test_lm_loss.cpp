// The fused LM head + cross-entropy against a naive fp64 reference that builds the full logits
// (the tolerance rule of test_elementwise: within 2x a same-precision naive baseline plus a
// few-ulp floor): rows without a label, a vocabulary that is a multiple of nothing, tiles that do
// not divide the rows, bf16 h and W, accumulate semantics, large logits, and measured arena peaks
// (device and host) == the formulas on the cpu and meta devices.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "backend/reference/elementwise_ref.h"
#include "backend/tensor_ops.h"
#include "common/test_util.h"
#include "model/lm_loss.h"

namespace upipe {
namespace {

using test::cview;
using test::view;

using test::expect_close;
using test::kEps32;

struct Result {
  double loss = 0;
  std::vector<double> dh, dw;
};

// Naive, in precision T, with the whole (rows, V) logits: loss = scale * sum -log softmax[label],
// G = scale * (softmax - onehot) on labelled rows, dh = G W (rounded through grad_dtype when
// `round`), dW = dw_beta * dw0 + G^T h.
template <class T>
Result reference(const std::vector<double>& h64, const std::vector<double>& w64,
                 const std::vector<int32_t>& labels, double scale, int64_t d, int64_t v,
                 DType grad_dtype, bool round, const std::vector<double>& dw0, float dw_beta) {
  const int64_t rows = int64_t(labels.size());
  const auto h = test::cast<T>(h64), w = test::cast<T>(w64);
  std::vector<T> logits(size_t(rows * v)), dh(size_t(rows * d)), dw(size_t(v * d));
  ref::gemm<T>(cview(h, rows, d), false, cview(w, v, d), true, view(logits, rows, v));
  T loss = 0;
  for (int64_t r = 0; r < rows; ++r) {
    T* row = logits.data() + r * v;
    if (labels[size_t(r)] < 0) {
      std::fill_n(row, v, T(0));
      continue;
    }
    const T m = *std::max_element(row, row + v);
    T sum = 0;
    for (int64_t j = 0; j < v; ++j) sum += std::exp(row[j] - m);
    loss += m + std::log(sum) - row[labels[size_t(r)]];
    for (int64_t j = 0; j < v; ++j) row[j] = T(scale) * std::exp(row[j] - m) / sum;
    row[labels[size_t(r)]] -= T(scale);
  }
  ref::gemm<T>(cview(logits, rows, v), false, cview(w, v, d), false, view(dh, rows, d));
  ref::gemm<T>(cview(logits, rows, v), true, cview(h, rows, d), false, view(dw, v, d));
  Result out{double(loss) * scale, test::cast<double>(dh), test::cast<double>(dw)};
  if (round) out.dh = test::rounded(out.dh, grad_dtype);
  for (size_t i = 0; i < out.dw.size(); ++i) out.dw[i] += dw_beta * dw0[i];
  return out;
}

// Labels in [0, V) with every `skip`-th row and the last row unlabelled (-1).
std::vector<int32_t> make_labels(int64_t rows, int64_t v, int64_t skip) {
  std::vector<int32_t> l(static_cast<size_t>(rows));
  for (int64_t r = 0; r < rows; ++r)
    l[size_t(r)] = (r % skip == skip - 1 || r == rows - 1) ? -1 : int32_t((r * 7919 + 13) % v);
  return l;
}

struct Case {
  int64_t rows, d, v, tile;
  DType dtype, grad_dtype;
  float dw_beta;
  double h_scale = 1.0;  // scales h: large logits test the log-sum-exp's stability
  int64_t skip = 5;      // every skip-th row has no label
};

void run_case(const Case& k) {
  Device dev;
  const LmLossConfig c{k.d, k.v, k.tile, k.dtype, k.grad_dtype};
  Tensor h(dev.mem(), Tag::kAct, k.dtype, k.rows, k.d),
      w(dev.mem(), Tag::kParams, k.dtype, k.v, k.d),
      dh(dev.mem(), Tag::kAct, k.grad_dtype, k.rows, k.d),
      dw(dev.mem(), Tag::kGrads, DType::kF32, k.v, k.d);
  test::fill_normal(h, 1, k.h_scale);
  test::fill_normal(w, 2, 1.0 / std::sqrt(double(k.d)));
  test::fill_normal(dh, 3);  // overwritten
  test::fill_normal(dw, 4);
  const auto h64 = test::read(h), w64 = test::read(w), dw0 = test::read(dw);
  const auto labels = make_labels(k.rows, k.v, k.skip);
  const double scale = 1.0 / double(std::max<int64_t>(k.rows - 1, 1));

  const int64_t base = dev.mem().current(), host_base = dev.host().current();
  dev.mem().reset_peak();
  dev.host().reset_peak();
  const double loss = lm_loss(dev, c, h, w, labels, float(scale), dh, dw, k.dw_beta);
  EXPECT_EQ(dev.mem().peak() - base, lm_loss_peak_bytes(dev.backend(), c, k.rows));
  EXPECT_EQ(dev.host().peak() - host_base, 0) << "the loss stays on the device";
  EXPECT_EQ(dev.mem().current(), base);
  EXPECT_EQ(dev.host().current(), host_base);

  const float s32 = float(scale);
  const Result r64 =
      reference<double>(h64, w64, labels, s32, k.d, k.v, k.grad_dtype, false, dw0, k.dw_beta);
  const Result r32 =
      reference<float>(h64, w64, labels, s32, k.d, k.v, k.grad_dtype, true, dw0, k.dw_beta);
  expect_close({loss}, {r64.loss}, {r32.loss}, "loss");
  expect_close(test::read(dh), r64.dh, r32.dh, "dh");
  expect_close(test::read(dw), r64.dw, r32.dw, "dW");
  EXPECT_TRUE(std::isfinite(loss));
}

TEST(LmLoss, Fp32MatchesReferenceLastTileShorter) {
  run_case({37, 24, 1001, 8, DType::kF32, DType::kF32, 0.0f});
}

TEST(LmLoss, OneTileLargerThanRows) {
  run_case({11, 16, 257, 64, DType::kF32, DType::kF32, 0.0f});
}

TEST(LmLoss, AccumulatesIntoDw) {
  run_case({30, 24, 515, 7, DType::kF32, DType::kF32, 1.0f});
}

TEST(LmLoss, Bf16HeadFp32Grad) {
  run_case({41, 64, 777, 16, DType::kBF16, DType::kF32, 0.0f});
}

TEST(LmLoss, Bf16HeadBf16Grad) {
  run_case({41, 64, 777, 16, DType::kBF16, DType::kBF16, 1.0f});
}

// Logits in the hundreds: exp without the max subtracted would overflow fp32.
TEST(LmLoss, LargeLogitsStable) {
  run_case({20, 32, 300, 6, DType::kF32, DType::kF32, 0.0f, 30.0});
}

// A small fp32 head (9 rows, D = 16, V = 50, T = 4) with random h, w, dh and dW.
struct SmallHead {
  Device dev;
  LmLossConfig c{16, 50, 4, DType::kF32, DType::kF32};
  Tensor h{dev.mem(), Tag::kAct, DType::kF32, 9, 16};
  Tensor w{dev.mem(), Tag::kParams, DType::kF32, 50, 16};
  Tensor dh{dev.mem(), Tag::kAct, DType::kF32, 9, 16};
  Tensor dw{dev.mem(), Tag::kGrads, DType::kF32, 50, 16};
  SmallHead() {
    test::fill_normal(h, 1);
    test::fill_normal(w, 2);
    test::fill_normal(dh, 3);
    test::fill_normal(dw, 4);
  }
};

// No row has a label: zero loss and dh, dW untouched by anything but dw_beta.
TEST(LmLoss, NoLabels) {
  SmallHead t;
  auto& [dev, c, h, w, dh, dw] = t;
  const auto dw0 = test::read(dw);
  const std::vector<int32_t> labels(9, -1);
  EXPECT_EQ(lm_loss(dev, c, h, w, labels, 0.5f, dh, dw, 1.0f), 0.0);
  EXPECT_TRUE(test::all_zero(test::read(dh)));
  EXPECT_EQ(test::read(dw), dw0);
  lm_loss(dev, c, h, w, labels, 0.5f, dh, dw, 0.0f);
  EXPECT_TRUE(test::all_zero(test::read(dw)));
}

// dw_beta 0: the first tile's product overwrites dW (no zero pass before it), so stale NaNs do
// not survive, and the result equals the one from a zeroed dW; with no rows at all, dW is zeroed.
TEST(LmLoss, DwBetaZeroOverwritesStaleGradient) {
  SmallHead t;
  auto& [dev, c, h, w, dh, dw] = t;
  const auto labels = make_labels(9, 50, 4);
  zero(dev, dw);
  lm_loss(dev, c, h, w, labels, 0.5f, dh, dw, 1.0f);
  const auto expected = test::read(dw);
  fill(dev, dw, std::numeric_limits<float>::quiet_NaN());
  lm_loss(dev, c, h, w, labels, 0.5f, dh, dw, 0.0f);
  EXPECT_EQ(test::read(dw), expected);

  fill(dev, dw, std::numeric_limits<float>::quiet_NaN());
  const Mat none = h.mat().rows_of(0, 0), dnone = dh.mat().rows_of(0, 0);
  EXPECT_EQ(lm_loss(dev, c, none, w, {}, 0.5f, dnone, dw, 0.0f), 0.0);
  EXPECT_EQ(test::read(dw), std::vector<double>(expected.size(), 0.0));  // no NaN left
}

// Labels outside [0, V) and not -1 are refused.
TEST(LmLossDeathTest, BadLabel) {
  Device dev;
  const LmLossConfig c{8, 10, 4, DType::kF32, DType::kF32};
  Tensor h(dev.mem(), Tag::kAct, DType::kF32, 3, 8), w(dev.mem(), Tag::kParams, DType::kF32, 10, 8),
      dh(dev.mem(), Tag::kAct, DType::kF32, 3, 8), dw(dev.mem(), Tag::kGrads, DType::kF32, 10, 8);
  const std::vector<int32_t> labels{1, 10, -1};
  EXPECT_DEATH(lm_loss(dev, c, h, w, labels, 1.0f, dh, dw, 0.0f), "label 10 of row 1");
}

// On the meta device: measured device and host peaks == the formulas, and the device peak does
// not grow with the rows (Llama-3-8B's head, V = 128256, T = 1024).
int64_t meta_peak(const LmLossConfig& c, int64_t rows) {
  const int64_t budget = int64_t(1) << 44;
  Device dev({BackendKind::kMeta, budget, budget});
  Tensor h(dev.mem(), Tag::kAct, c.dtype, rows, c.hidden),
      w(dev.mem(), Tag::kParams, c.dtype, c.vocab, c.hidden),
      dh(dev.mem(), Tag::kAct, c.grad_dtype, rows, c.hidden),
      dw(dev.mem(), Tag::kGrads, DType::kF32, c.vocab, c.hidden);
  const std::vector<int32_t> labels = make_labels(rows, c.vocab, 7);
  const int64_t base = dev.mem().current(), host_base = dev.host().current();
  dev.mem().reset_peak();
  dev.host().reset_peak();
  EXPECT_EQ(lm_loss(dev, c, h, w, labels, 1.0f, dh, dw, 1.0f), 0.0);
  EXPECT_EQ(dev.host().peak() - host_base, 0);
  const int64_t peak = dev.mem().peak() - base;
  EXPECT_EQ(peak, lm_loss_peak_bytes(dev.backend(), c, rows));
  return peak;
}

TEST(LmLossMeta, PeakEqualsFormula) {
  for (DType t : {DType::kF32, DType::kBF16})
    for (DType g : {DType::kF32, DType::kBF16}) {
      meta_peak({24, 1001, 8, t, g}, 37);
      meta_peak({4096, 128256, 1024, t, g}, 3000);
    }
}

TEST(LmLossMeta, PeakIndependentOfRows) {
  const LmLossConfig c{4096, 128256, 1024, DType::kBF16, DType::kF32};
  const int64_t p = meta_peak(c, 1024);
  for (int64_t rows : {int64_t(4096), int64_t(1) << 17, (int64_t(1) << 17) + 333})
    EXPECT_EQ(meta_peak(c, rows), p) << "rows = " << rows;
}

}  // namespace
}  // namespace upipe
