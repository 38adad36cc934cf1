// RoPE, RMSNorm and SwiGLU against their naive fp64 references (same tolerance rule as the
// attention tests: within 2x a same-precision naive baseline plus a few-ulp floor), RoPE's
// inverse, and finite-difference checks of the backward formulas.
#include <gtest/gtest.h>

#include <limits>

#include "backend/reference/elementwise_ref.h"
#include "backend/rmsnorm.h"
#include "backend/rope.h"
#include "backend/swiglu.h"
#include "common/test_util.h"

namespace upipe {
namespace {

using test::cview;
using test::read;
using test::view;

using test::expect_close;
using test::kEps32;

using test::cast;

RopeParams rope_theta(double theta) {
  RopeParams r;
  r.theta = theta;
  return r;
}

TEST(Rope, MatchesReferenceAtLargeZigzagPositions) {
  Device dev;
  const int d = 64, heads = 3;
  const int64_t rows = 50;
  // Two runs, as on a zigzag shard, at positions in the millions.
  RowPositions pos{{{20, 3000000}, {30, 7999970}}};
  Tensor x(dev.mem(), Tag::kQkv, DType::kF32, rows, heads * d);
  test::fill_normal(x, 3);
  auto x64 = read(x);
  auto x32 = cast<float>(x64);
  const auto p = pos.expand();
  rope_forward(dev, x, d, pos, rope_theta(500000.0));
  ref::rope<double>(view(x64, rows, heads * d), d, p.data(),
                    ref::rope_inv_freq(rope_theta(500000.0), d), +1);
  ref::rope<float>(view(x32, rows, heads * d), d, p.data(),
                   ref::rope_inv_freq(rope_theta(500000.0), d), +1);
  expect_close(read(x), x64, cast<double>(x32), "rope");
}

TEST(Rope, BackwardInvertsForward) {
  Device dev;
  const int d = 128;
  Tensor x(dev.mem(), Tag::kQkv, DType::kF32, 64, 2 * d);
  test::fill_normal(x, 4);
  const auto before = read(x);
  const RowPositions pos = RowPositions::contiguous(64, 123456);
  rope_forward(dev, x, d, pos, rope_theta(10000.0));
  EXPECT_GT(test::max_abs_diff(read(x), before), 0.1);
  rope_backward(dev, x, d, pos, rope_theta(10000.0));
  EXPECT_LE(test::max_abs_diff(read(x), before), 4 * kEps32 * test::max_abs(before));
}

// A position's rotation must not depend on where a shard starts (strategies rotate shards, the
// oracle the whole sequence): bitwise equality between one call and a split one.
TEST(Rope, ShardIndependentBitwise) {
  Device dev;
  const int d = 64;
  const int64_t rows = 300, split = 77;
  Tensor x(dev.mem(), Tag::kQkv, DType::kF32, rows, 2 * d),
      y(dev.mem(), Tag::kQkv, DType::kF32, rows, 2 * d);
  test::fill_normal(x, 9);
  test::fill_normal(y, 9);
  rope_forward(dev, x, d, RowPositions::contiguous(rows, 5000), rope_theta(500000.0));
  rope_forward(dev, y.mat().rows_of(0, split), d, RowPositions::contiguous(split, 5000),
               rope_theta(500000.0));
  rope_forward(dev, y.mat().rows_of(split, rows - split), d,
               RowPositions::contiguous(rows - split, 5000 + split), rope_theta(500000.0));
  EXPECT_EQ(read(x), read(y));
}

TEST(Rope, Bf16InPlace) {
  Device dev;
  const int d = 32;
  Tensor x(dev.mem(), Tag::kQkv, DType::kBF16, 40, 4 * d);
  test::fill_normal(x, 5);
  auto x64 = read(x);
  const RowPositions pos = RowPositions::contiguous(40, 1000);
  const auto p = pos.expand();
  rope_forward(dev, x, d, pos, rope_theta(10000.0));
  ref::rope<double>(view(x64, 40, 4 * d), d, p.data(), ref::rope_inv_freq(rope_theta(10000.0), d),
                    +1);
  // One bf16 rounding of the result.
  EXPECT_LE(test::max_abs_diff(read(x), x64), test::max_abs(x64) / 256);
}

TEST(RmsNorm, ForwardBackwardMatchReference) {
  Device dev;
  const int64_t t = 37, n = 300;
  Tensor x(dev.mem(), Tag::kAct, DType::kF32, t, n), w(dev.mem(), Tag::kParams, DType::kF32, 1, n),
      y(dev.mem(), Tag::kAct, DType::kF32, t, n), dy(dev.mem(), Tag::kAct, DType::kF32, t, n),
      dx(dev.mem(), Tag::kAct, DType::kF32, t, n), dw(dev.mem(), Tag::kGrads, DType::kF32, 1, n);
  test::fill_normal(x, 1);
  test::fill_normal(w, 2);
  test::fill_normal(dy, 3);
  test::fill_value(dw, 0);
  const int64_t before = dev.mem().current();
  dev.mem().reset_peak();
  rmsnorm_forward(dev, x, w, 1e-5f, y);
  EXPECT_EQ(dev.mem().peak() - before, rmsnorm_workspace_bytes(dev.backend(), n));
  rmsnorm_backward(dev, x, w, 1e-5f, dy, dx, dw);
  const auto xv = read(x), wv = read(w), dyv = read(dy);
  std::vector<double> y64(xv.size()), dx64(xv.size()), dw64(size_t(n), 0.0);
  ref::rmsnorm_forward<double>(cview(xv, t, n), wv.data(), 1e-5, view(y64, t, n));
  ref::rmsnorm_backward<double>(cview(xv, t, n), wv.data(), 1e-5, cview(dyv, t, n),
                                view(dx64, t, n), dw64.data());
  const auto x32 = cast<float>(xv), w32 = cast<float>(wv), dy32 = cast<float>(dyv);
  std::vector<float> y32(xv.size()), dx32(xv.size()), dw32(size_t(n), 0.f);
  ref::rmsnorm_forward<float>(cview(x32, t, n), w32.data(), 1e-5, view(y32, t, n));
  ref::rmsnorm_backward<float>(cview(x32, t, n), w32.data(), 1e-5, cview(dy32, t, n),
                               view(dx32, t, n), dw32.data());
  expect_close(read(y), y64, cast<double>(y32), "y");
  expect_close(read(dx), dx64, cast<double>(dx32), "dx");
  expect_close(read(dw), dw64, cast<double>(dw32), "dw");

  // The reference backward itself against finite differences of L = sum(dy * y).
  auto loss = [&](const std::vector<double>& xx, const std::vector<double>& ww) {
    std::vector<double> yy(xx.size());
    ref::rmsnorm_forward<double>(cview(xx, t, n), ww.data(), 1e-5, view(yy, t, n));
    double L = 0;
    for (size_t i = 0; i < yy.size(); ++i) L += yy[i] * dyv[i];
    return L;
  };
  auto xs = xv;
  const double h = 1e-6;
  for (size_t i = 0; i < xs.size(); i += 97) {
    const double x0 = xs[i];
    xs[i] = x0 + h;
    const double lp = loss(xs, wv);
    xs[i] = x0 - h;
    const double lm = loss(xs, wv);
    xs[i] = x0;
    EXPECT_NEAR(dx64[i], (lp - lm) / (2 * h), 1e-5);
  }
}

TEST(SwiGlu, ForwardBackwardMatchReference) {
  Device dev;
  const int64_t t = 20, f = 513;
  Tensor a(dev.mem(), Tag::kMlp, DType::kF32, t, f), b(dev.mem(), Tag::kMlp, DType::kF32, t, f),
      h(dev.mem(), Tag::kMlp, DType::kF32, t, f), dh(dev.mem(), Tag::kMlp, DType::kF32, t, f),
      da(dev.mem(), Tag::kMlp, DType::kF32, t, f), db(dev.mem(), Tag::kMlp, DType::kF32, t, f);
  test::fill_normal(a, 1, 3.0);
  test::fill_normal(b, 2);
  test::fill_normal(dh, 3);
  swiglu_forward(dev, a, b, h);
  swiglu_backward(dev, a, b, dh, da, db);
  const auto av = read(a), bv = read(b), dhv = read(dh);
  std::vector<double> h64(av.size()), da64(av.size()), db64(av.size());
  ref::swiglu_forward<double>(cview(av, t, f), cview(bv, t, f), view(h64, t, f));
  ref::swiglu_backward<double>(cview(av, t, f), cview(bv, t, f), cview(dhv, t, f), view(da64, t, f),
                               view(db64, t, f));
  const auto a32 = cast<float>(av), b32 = cast<float>(bv), dh32 = cast<float>(dhv);
  std::vector<float> h32(av.size()), da32(av.size()), db32(av.size());
  ref::swiglu_forward<float>(cview(a32, t, f), cview(b32, t, f), view(h32, t, f));
  ref::swiglu_backward<float>(cview(a32, t, f), cview(b32, t, f), cview(dh32, t, f),
                              view(da32, t, f), view(db32, t, f));
  expect_close(read(h), h64, cast<double>(h32), "h");
  expect_close(read(da), da64, cast<double>(da32), "da");
  expect_close(read(db), db64, cast<double>(db32), "db");
  // Finite differences of the reference: d(silu(a) b)/da.
  for (size_t i = 0; i < av.size(); i += 101) {
    const double e = 1e-6, x = av[i];
    auto fwd = [&](double xx) { return xx / (1 + std::exp(-xx)) * bv[i]; };
    EXPECT_NEAR(da64[i], dhv[i] * (fwd(x + e) - fwd(x - e)) / (2 * e), 1e-6);
  }
}

}  // namespace
}  // namespace upipe
