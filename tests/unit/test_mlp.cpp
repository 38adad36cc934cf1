// The tiled SwiGLU MLP block against a naive fp64 reference (the tolerance rule of
// test_elementwise: within 2x a same-precision naive baseline, which rounds where the block
// stores, plus a few-ulp floor), with tiles that do not divide the rows, accumulate semantics,
// bf16 storage, and measured arena peak == mlp_*_peak_bytes on the cpu and meta devices.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "backend/reference/elementwise_ref.h"
#include "backend/tensor_ops.h"
#include "common/test_util.h"
#include "model/mlp.h"

namespace upipe {
namespace {

using test::cview;
using test::view;

using test::expect_close;
using test::kEps32;

// Values as stored in dtype t (the baseline rounds where the block stores; the fp64 reference
// does not round at all).
template <class T>
void store(std::vector<T>& v, DType t, bool round) {
  if (!round) return;
  for (T& x : v)
    x = T(t == DType::kF32 ? double(float(x)) : double(bf16_to_f32(f32_to_bf16(float(x)))));
}

struct Data {
  int64_t s = 0, d = 0, f = 0;
  std::vector<double> x, wg, wu, wd, dy, y0, dx0, gg0, gu0, gd0;
};

struct Result {
  std::vector<double> y, dx, gg, gu, gd;
};

// The block in precision T, naively. With `round`, a, b, h are rounded through `dtype` and y, dx
// through `out` where the block stores them: the same-precision baseline. Betas as in the API.
template <class T>
Result reference(const Data& in, DType dtype, DType out, bool round, float beta, float dx_beta,
                 float dw_beta) {
  const int64_t s = in.s, d = in.d, f = in.f;
  auto c = [](const std::vector<double>& v) { return test::cast<T>(v); };
  const auto x = c(in.x), wg = c(in.wg), wu = c(in.wu), wd = c(in.wd), dy = c(in.dy);
  std::vector<T> a(size_t(s * f)), b(a.size()), h(a.size()), y(size_t(s * d));
  ref::gemm<T>(cview(x, s, d), false, cview(wg, f, d), true, view(a, s, f));
  ref::gemm<T>(cview(x, s, d), false, cview(wu, f, d), true, view(b, s, f));
  store(a, dtype, round);
  store(b, dtype, round);
  ref::swiglu_forward<T>(cview(a, s, f), cview(b, s, f), view(h, s, f));
  store(h, dtype, round);
  ref::gemm<T>(cview(h, s, f), false, cview(wd, d, f), true, view(y, s, d));
  for (size_t i = 0; i < y.size(); ++i) y[i] += T(beta * in.y0[i]);
  store(y, out, round);
  std::vector<T> dh(a.size()), da(a.size()), db(a.size()), dx(y.size()), dx2(y.size());
  std::vector<T> gg(size_t(f * d)), gu(gg.size()), gd(gg.size());
  ref::gemm<T>(cview(dy, s, d), false, cview(wd, d, f), false, view(dh, s, f));
  ref::swiglu_backward<T>(cview(a, s, f), cview(b, s, f), cview(dh, s, f), view(da, s, f),
                          view(db, s, f));
  ref::gemm<T>(cview(da, s, f), false, cview(wg, f, d), false, view(dx, s, d));
  ref::gemm<T>(cview(db, s, f), false, cview(wu, f, d), false, view(dx2, s, d));
  for (size_t i = 0; i < dx.size(); ++i) dx[i] += dx2[i] + T(dx_beta * in.dx0[i]);
  store(dx, out, round);
  ref::gemm<T>(cview(da, s, f), true, cview(x, s, d), false, view(gg, f, d));
  ref::gemm<T>(cview(db, s, f), true, cview(x, s, d), false, view(gu, f, d));
  ref::gemm<T>(cview(dy, s, d), true, cview(h, s, f), false, view(gd, d, f));
  for (size_t i = 0; i < gg.size(); ++i) {
    gg[i] += T(dw_beta * in.gg0[i]);
    gu[i] += T(dw_beta * in.gu0[i]);
    gd[i] += T(dw_beta * in.gd0[i]);
  }
  auto d64 = [](const std::vector<T>& v) { return test::cast<double>(v); };
  return {d64(y), d64(dx), d64(gg), d64(gu), d64(gd)};
}

struct Case {
  int64_t s, d, f, tile;
  DType dtype;
  bool fp32_residual;
  float beta, dx_beta, dw_beta;
};

// Runs forward and backward on the cpu device, compares with the references and checks the
// measured peaks against the formulas.
void run_case(const Case& k) {
  Device dev;
  MlpConfig c{k.d, k.f, k.tile, k.dtype, k.fp32_residual};
  const DType t = k.dtype, o = c.out_dtype(), f32 = DType::kF32;
  Tensor x(dev.mem(), Tag::kAct, t, k.s, k.d), y(dev.mem(), Tag::kAct, o, k.s, k.d),
      dy(dev.mem(), Tag::kAct, o, k.s, k.d), dx(dev.mem(), Tag::kAct, o, k.s, k.d);
  Tensor wg(dev.mem(), Tag::kParams, t, k.f, k.d), wu(dev.mem(), Tag::kParams, t, k.f, k.d),
      wd(dev.mem(), Tag::kParams, t, k.d, k.f);
  Tensor gg(dev.mem(), Tag::kGrads, f32, k.f, k.d), gu(dev.mem(), Tag::kGrads, f32, k.f, k.d),
      gd(dev.mem(), Tag::kGrads, f32, k.d, k.f);
  // Weights scaled like an initialised model (std 1/sqrt(fan_in)) so products stay O(1).
  test::fill_normal(x, 1);
  test::fill_normal(wg, 2, 1.0 / std::sqrt(double(k.d)));
  test::fill_normal(wu, 3, 1.0 / std::sqrt(double(k.d)));
  test::fill_normal(wd, 4, 1.0 / std::sqrt(double(k.f)));
  test::fill_normal(dy, 5);
  test::fill_normal(y, 6);  // read only when beta = 1; NaN-free garbage otherwise
  test::fill_normal(dx, 7);
  test::fill_normal(gg, 8);
  test::fill_normal(gu, 9);
  test::fill_normal(gd, 10);
  Data in{k.s,
          k.d,
          k.f,
          test::read(x),
          test::read(wg),
          test::read(wu),
          test::read(wd),
          test::read(dy),
          test::read(y),
          test::read(dx),
          test::read(gg),
          test::read(gu),
          test::read(gd)};

  const MlpWeights w{wg, wu, wd};
  const int64_t base = dev.mem().current();
  dev.mem().reset_peak();
  mlp_forward(dev, c, x, w, y, k.beta);
  EXPECT_EQ(dev.mem().peak() - base, mlp_forward_peak_bytes(dev.backend(), c, k.s));
  EXPECT_EQ(dev.mem().current(), base);
  dev.mem().reset_peak();
  mlp_backward(dev, c, x, dy, w, dx, MlpGrads{gg, gu, gd}, k.dx_beta, k.dw_beta);
  EXPECT_EQ(dev.mem().peak() - base, mlp_backward_peak_bytes(dev.backend(), c, k.s));
  EXPECT_EQ(dev.mem().current(), base);

  const Result r64 = reference<double>(in, t, o, false, k.beta, k.dx_beta, k.dw_beta);
  const Result r32 = reference<float>(in, t, o, true, k.beta, k.dx_beta, k.dw_beta);
  expect_close(test::read(y), r64.y, r32.y, "y");
  expect_close(test::read(dx), r64.dx, r32.dx, "dx");
  expect_close(test::read(gg), r64.gg, r32.gg, "dW_gate");
  expect_close(test::read(gu), r64.gu, r32.gu, "dW_up");
  expect_close(test::read(gd), r64.gd, r32.gd, "dW_down");
}

TEST(Mlp, Fp32MatchesReferenceLastTileShorter) {
  run_case({37, 48, 100, 8, DType::kF32, false, 0, 0, 0});
}

TEST(Mlp, Fp32OneTileLargerThanRows) {
  run_case({13, 32, 70, 64, DType::kF32, false, 0, 0, 0});
}

TEST(Mlp, Fp32Accumulates) {
  run_case({29, 40, 96, 7, DType::kF32, false, 1, 1, 1});
}

TEST(Mlp, MixedBetas) {
  run_case({29, 40, 96, 16, DType::kF32, false, 1, 0, 1});
  run_case({29, 40, 96, 16, DType::kF32, false, 0, 1, 0});
}

// dw_beta 0: each weight gradient is overwritten by the first tile's product (no zero pass
// before it), so stale NaNs do not survive and the result equals the one from zeroed gradients;
// with no rows at all, the gradients are zeroed.
TEST(Mlp, DwBetaZeroOverwritesStaleGradients) {
  Device dev;
  const MlpConfig c{32, 70, 8, DType::kF32};
  const DType f32 = DType::kF32;
  Tensor x(dev.mem(), Tag::kAct, f32, 20, 32), dy(dev.mem(), Tag::kAct, f32, 20, 32),
      dx(dev.mem(), Tag::kAct, f32, 20, 32);
  Tensor wg(dev.mem(), Tag::kParams, f32, 70, 32), wu(dev.mem(), Tag::kParams, f32, 70, 32),
      wd(dev.mem(), Tag::kParams, f32, 32, 70);
  Tensor gg(dev.mem(), Tag::kGrads, f32, 70, 32), gu(dev.mem(), Tag::kGrads, f32, 70, 32),
      gd(dev.mem(), Tag::kGrads, f32, 32, 70);
  test::fill_normal(x, 1);
  test::fill_normal(dy, 2);
  test::fill_normal(wg, 3, 0.2);
  test::fill_normal(wu, 4, 0.2);
  test::fill_normal(wd, 5, 0.1);
  const MlpWeights w{wg, wu, wd};
  const MlpGrads g{gg, gu, gd};
  for (const Tensor* t : {&gg, &gu, &gd}) zero(dev, *t);
  mlp_backward(dev, c, x, dy, w, dx, g, 0.0f, 1.0f);
  const auto eg = test::read(gg), eu = test::read(gu), ed = test::read(gd);
  for (const Tensor* t : {&gg, &gu, &gd}) fill(dev, *t, std::numeric_limits<float>::quiet_NaN());
  mlp_backward(dev, c, x, dy, w, dx, g, 0.0f, 0.0f);
  EXPECT_EQ(test::read(gg), eg);
  EXPECT_EQ(test::read(gu), eu);
  EXPECT_EQ(test::read(gd), ed);

  for (const Tensor* t : {&gg, &gu, &gd}) fill(dev, *t, std::numeric_limits<float>::quiet_NaN());
  const Mat none = x.mat().rows_of(0, 0);
  mlp_backward(dev, c, none, dy.mat().rows_of(0, 0), w, dx.mat().rows_of(0, 0), g, 0.0f, 0.0f);
  for (const Tensor* t : {&gg, &gu, &gd})  // no NaN left
    EXPECT_EQ(test::read(*t), std::vector<double>(size_t(t->mat().rows * t->mat().cols), 0.0));
}

TEST(Mlp, Bf16MatchesReference) {
  run_case({45, 64, 160, 16, DType::kBF16, false, 0, 0, 0});
}

// A bf16 y accumulated with beta = 1 is rounded once per element (one GEMM per tile), and a bf16
// dx once (through the (T, D) fp32 accumulator).
TEST(Mlp, Bf16Accumulates) {
  run_case({45, 64, 160, 16, DType::kBF16, false, 1, 1, 1});
}

TEST(Mlp, Bf16WithFp32Residual) {
  run_case({45, 64, 160, 20, DType::kBF16, true, 1, 1, 0});
}

// The reference's backward against finite differences of L = sum(dy * y) in x and the weights.
TEST(Mlp, ReferenceBackwardMatchesFiniteDifferences) {
  const int64_t s = 5, d = 6, f = 7;
  Data in;
  in.s = s;
  in.d = d;
  in.f = f;
  auto gen = [](int64_t n, uint64_t seed, double sd) {
    std::vector<double> v(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) v[size_t(i)] = sd * normal_at(seed, uint64_t(i));
    return v;
  };
  in.x = gen(s * d, 1, 1);
  in.wg = gen(f * d, 2, 0.5);
  in.wu = gen(f * d, 3, 0.5);
  in.wd = gen(d * f, 4, 0.5);
  in.dy = gen(s * d, 5, 1);
  in.y0 = in.dx0 = std::vector<double>(size_t(s * d), 0.0);
  in.gg0 = in.gu0 = in.gd0 = std::vector<double>(size_t(f * d), 0.0);
  const Result r = reference<double>(in, DType::kF32, DType::kF32, false, 0, 0, 0);
  auto loss = [&](const Data& p) {
    const Result q = reference<double>(p, DType::kF32, DType::kF32, false, 0, 0, 0);
    double l = 0;
    for (size_t i = 0; i < q.y.size(); ++i) l += q.y[i] * p.dy[i];
    return l;
  };
  const double e = 1e-6;
  auto check = [&](std::vector<double> Data::*field, const std::vector<double>& grad) {
    for (size_t i = 0; i < grad.size(); i += 3) {
      Data p = in, m = in;
      (p.*field)[i] += e;
      (m.*field)[i] -= e;
      EXPECT_NEAR(grad[i], (loss(p) - loss(m)) / (2 * e), 1e-6);
    }
  };
  check(&Data::x, r.dx);
  check(&Data::wg, r.gg);
  check(&Data::wu, r.gu);
  check(&Data::wd, r.gd);
}

// One forward + backward on the meta device: measured peak == formula, for every dtype mix.
int64_t meta_peak(const MlpConfig& c, int64_t s, float beta) {
  const int64_t budget = int64_t(1) << 44;
  Device dev({BackendKind::kMeta, budget, budget});
  const DType t = c.dtype, o = c.out_dtype(), f32 = DType::kF32;
  const int64_t d = c.hidden, f = c.intermediate;
  Tensor x(dev.mem(), Tag::kAct, t, s, d), y(dev.mem(), Tag::kAct, o, s, d),
      dy(dev.mem(), Tag::kAct, o, s, d), dx(dev.mem(), Tag::kAct, o, s, d);
  Tensor wg(dev.mem(), Tag::kParams, t, f, d), wu(dev.mem(), Tag::kParams, t, f, d),
      wd(dev.mem(), Tag::kParams, t, d, f);
  Tensor gg(dev.mem(), Tag::kGrads, f32, f, d), gu(dev.mem(), Tag::kGrads, f32, f, d),
      gd(dev.mem(), Tag::kGrads, f32, d, f);
  const int64_t base = dev.mem().current();
  dev.mem().reset_peak();
  mlp_forward(dev, c, x, {wg, wu, wd}, y, beta);
  mlp_backward(dev, c, x, dy, {wg, wu, wd}, dx, {gg, gu, gd}, beta, beta);
  const int64_t peak = dev.mem().peak() - base;
  EXPECT_EQ(peak, mlp_peak_bytes(dev.backend(), c, s));
  return peak;
}

TEST(MlpMeta, PeakEqualsFormula) {
  for (DType t : {DType::kF32, DType::kBF16})
    for (bool res : {false, true})
      for (float beta : {0.0f, 1.0f}) {
        meta_peak({48, 100, 8, t, res}, 37, beta);
        meta_peak({4096, 14336, 1024, t, res}, 10000, beta);
      }
}

// Llama-3-8B's MLP in bf16 with T = 1024: the peak does not grow with the sequence.
TEST(MlpMeta, PeakIndependentOfSequenceLength) {
  const MlpConfig c{4096, 14336, 1024, DType::kBF16, true};
  const int64_t p = meta_peak(c, 1024, 1.0f);
  for (int64_t s : {int64_t(4096), int64_t(1) << 17, (int64_t(1) << 20) + 300})
    EXPECT_EQ(meta_peak(c, s, 1.0f), p) << "S = " << s;
  EXPECT_EQ(mlp_peak_bytes(Device({BackendKind::kMeta}).backend(), c, int64_t(1) << 24), p);
}

}  // namespace
}  // namespace upipe
