// The attention kernels' softmax far from zero: logits near +-100 (fp32's exp overflows above
// ~88.7 and is denormal below ~-87) and key blocks whose log-sum-exps lie 200 apart. Every path
// that combines softmax pieces must stay finite and equal fp64:
//   - lse_merge on given partials (lse at +-100, 100.5 / 100, 200 apart, one side empty): against
//     the merge computed in fp64 from the same fp32 inputs, within 8 fp32 ulp of the row's
//     largest |o| (a convex combination: the weights' exps, their sum, the inverse, a product
//     and a sum each round once; the weights' arguments are differences of the inputs, exact or
//     negligible) and 4 ulp of max(|lse|, 1);
//   - the one-call forward, the online accumulation over two key blocks (FPDT) and the merge of
//     the blocks' normalised partials (ring): against the fp64 reference attention within the
//     kernel suite's rule (test_util.h expect_close: 2x a naive fp32 baseline's error plus 4 ulp
//     of the largest value). The logits are exact in fp32 (small integers times the scale 1/4),
//     so only the softmax and the sums round.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "backend/attention.h"
#include "backend/reference/attention_ref.h"
#include "backend/tensor_ops.h"
#include "common/test_util.h"

namespace upipe {
namespace {

using test::kEps32;
constexpr float kNegInf = -std::numeric_limits<float>::infinity();

TEST(AttnRange, LseMergeOfFarApartAndLargePartialsEqualsFp64) {
  Device dev;
  const int hq = 2, d = 16;
  // (lse, lse2) per row; head 1 takes the pair swapped.
  const std::pair<float, float> rows[] = {{100.0f, 100.5f},  {-100.0f, -99.25f}, {100.0f, -100.0f},
                                          {-100.0f, 100.0f}, {95.0f, 89.0f},     {3.0f, 2.5f},
                                          {kNegInf, 100.0f}, {-100.0f, kNegInf}};
  const int64_t n = int64_t(std::size(rows));
  Tensor o(dev.mem(), Tag::kAttnOut, DType::kF32, n, hq * d),
      o2(dev.mem(), Tag::kAttnOut, DType::kF32, n, hq * d),
      lse(dev.mem(), Tag::kAttnOut, DType::kF32, hq, n),
      lse2(dev.mem(), Tag::kAttnOut, DType::kF32, hq, n);
  test::fill_normal(o, 1);
  test::fill_normal(o2, 2, 3.0);
  std::vector<float> l1(size_t(hq * n)), l2(size_t(hq * n));
  for (int64_t i = 0; i < n; ++i) {
    l1[size_t(i)] = l2[size_t(n + i)] = rows[i].first;
    l2[size_t(i)] = l1[size_t(n + i)] = rows[i].second;
  }
  upload(dev, l1.data(), lse);
  upload(dev, l2.data(), lse2);
  const std::vector<double> a = test::read(o), b = test::read(o2);
  lse_merge(dev, o, lse, o2, lse2, d);
  const std::vector<double> got = test::read(o), got_lse = test::read(lse);

  for (int h = 0; h < hq; ++h)
    for (int64_t i = 0; i < n; ++i) {
      const double x = l1[size_t(h * n + i)], y = l2[size_t(h * n + i)];
      const double mx = std::max(x, y), w1 = std::exp(x - mx), w2 = std::exp(y - mx);
      const double want_lse = mx + std::log(w1 + w2);
      SCOPED_TRACE(testing::Message() << "head " << h << " lse " << x << " and " << y);
      ASSERT_TRUE(std::isfinite(got_lse[size_t(h * n + i)]));
      EXPECT_NEAR(got_lse[size_t(h * n + i)], want_lse,
                  4 * kEps32 * std::max(std::abs(want_lse), 1.0));
      double scale = 0;
      for (int e = 0; e < d; ++e) {
        const size_t k = size_t(i * hq * d + h * d + e);
        scale = std::max({scale, std::abs(a[k]), std::abs(b[k])});
      }
      for (int e = 0; e < d; ++e) {
        const size_t k = size_t(i * hq * d + h * d + e);
        const double want = (a[k] * w1 + b[k] * w2) / (w1 + w2);
        ASSERT_TRUE(std::isfinite(got[k])) << "element " << e;
        EXPECT_NEAR(got[k], want, 8 * kEps32 * scale) << "element " << e;
      }
    }
}

// q (S, 3 d), k (S, d): head 0 scores the first `split` keys near -100 and the rest near +100,
// head 1 the other way round (GQA: both read the one KV head), head 2 every key near +100. The
// 14 other columns add integers in [-28, 28] to q k^T, i.e. +-7 to the logits.
void fill_large_logits(Device& dev, const Mat& q, const Mat& k, int64_t split) {
  const int64_t s = q.rows, d = k.cols;
  std::vector<float> qh(size_t(q.rows * q.cols), 0.0f), kh(size_t(k.rows * k.cols), 0.0f);
  for (int64_t i = 0; i < s; ++i) {
    float* qr = qh.data() + i * q.cols;
    float* kr = kh.data() + i * d;
    qr[0] = 4, qr[d] = -4, qr[2 * d + 1] = 4;
    kr[0] = i < split ? -100.0f : 100.0f;
    kr[1] = 100.0f;
    for (int64_t e = 2; e < d; ++e) {
      kr[e] = float(std::floor(uniform_at(21, uint64_t(i * d + e)) * 5) - 2);
      for (int h = 0; h < 3; ++h)
        qr[h * d + e] = float(std::floor(uniform_at(22 + h, uint64_t(i * d + e)) * 3) - 1);
    }
  }
  upload(dev, qh.data(), q);
  upload(dev, kh.data(), k);
}

TEST(AttnRange, ForwardAccumulateAndMergeAtLogitsNear100EqualFp64) {
  Device dev;
  const int hq = 3, hk = 1, d = 16;
  const int64_t s = 200, split = 100;
  Tensor q(dev.mem(), Tag::kQkv, DType::kF32, s, hq * d),
      k(dev.mem(), Tag::kQkv, DType::kF32, s, hk * d),
      v(dev.mem(), Tag::kQkv, DType::kF32, s, hk * d);
  fill_large_logits(dev, q, k, split);
  test::fill_normal(v, 3);
  auto out = [&] {
    return std::pair{Tensor(dev.mem(), Tag::kAttnOut, DType::kF32, s, hq * d),
                     Tensor(dev.mem(), Tag::kAttnOut, DType::kF32, hq, s)};
  };
  const Mat k1 = k.mat().rows_of(0, split), v1 = v.mat().rows_of(0, split);
  const Mat k2 = k.mat().rows_of(split, s - split), v2 = v.mat().rows_of(split, s - split);
  // One call.
  auto [o, lse] = out();
  attention_forward(dev, {q, k, v, hq, hk, d}, o, lse);
  // Online accumulation, the second block first.
  Tensor acc(dev.mem(), Tag::kAttnOut, DType::kF32, s, hq * d),
      m(dev.mem(), Tag::kAttnOut, DType::kF32, hq, s),
      l(dev.mem(), Tag::kAttnOut, DType::kF32, hq, s);
  attention_accumulate_init(dev, acc, m, l);
  attention_forward_accumulate(dev, {q, k2, v2, hq, hk, d, 0, split}, acc, m, l);
  attention_forward_accumulate(dev, {q, k1, v1, hq, hk, d, 0, 0}, acc, m, l);
  auto [oa, la] = out();
  attention_finalize(dev, acc, m, l, d, oa, la);
  // Merge of the blocks' normalised partials (rows before `split` see none of the second).
  auto [ob, lb] = out();
  auto [ob2, lb2] = out();
  attention_forward(dev, {q, k1, v1, hq, hk, d, 0, 0}, ob, lb);
  attention_forward(dev, {q, k2, v2, hq, hk, d, 0, split}, ob2, lb2);
  lse_merge(dev, ob, lb, ob2, lb2, d);

  const int64_t qc = hq * d, kc = hk * d;
  const ref::AttnDims dims{s, s, hq, hk, d};
  const std::vector<double> q64 = test::read(q), k64 = test::read(k), v64 = test::read(v);
  std::vector<double> o64(size_t(s * qc)), lse64(size_t(hq * s));
  ref::attention_forward<double>(dims, test::cview(q64, s, qc), test::cview(k64, s, kc),
                                 test::cview(v64, s, kc), test::view(o64, s, qc),
                                 test::view(lse64, hq, s));
  const auto q32 = test::cast<float>(q64), k32 = test::cast<float>(k64),
             v32 = test::cast<float>(v64);
  std::vector<float> o32(o64.size()), lse32(lse64.size());
  ref::attention_forward<float>(dims, test::cview(q32, s, qc), test::cview(k32, s, kc),
                                test::cview(v32, s, kc), test::view(o32, s, qc),
                                test::view(lse32, hq, s));
  // The logits are what the construction says: lse spans about -100 to +100.
  EXPECT_LT(*std::min_element(lse64.begin(), lse64.end()), -90.0);
  EXPECT_GT(*std::max_element(lse64.begin(), lse64.end()), 90.0);
  const std::vector<double> o_base = test::cast<double>(o32), lse_base = test::cast<double>(lse32);
  for (const auto& [what, ot, lt] :
       {std::tuple{"one call", &o, &lse}, std::tuple{"accumulated", &oa, &la},
        std::tuple{"merged", &ob, &lb}}) {
    const std::vector<double> got = test::read(*ot), got_lse = test::read(*lt);
    for (double x : got) ASSERT_TRUE(std::isfinite(x)) << what;
    for (double x : got_lse) ASSERT_TRUE(std::isfinite(x)) << what;
    test::expect_close(got, o64, o_base, std::string(what) + " o");
    test::expect_close(got_lse, lse64, lse_base, std::string(what) + " lse");
  }
}

}  // namespace
}  // namespace upipe
