#include "model/mlp.h"

#include <algorithm>
#include <array>

#include "attention/fp_accumulator.h"
#include "backend/gemm.h"
#include "backend/swiglu.h"
#include "backend/tensor_ops.h"

namespace upipe {
namespace {

bool shape_is(const Mat& m, int64_t rows, int64_t cols) {
  return m.rows == rows && m.cols == cols;
}

void check_config(const MlpConfig& c) {
  UPIPE_CHECK(c.hidden > 0 && c.intermediate > 0,
              "mlp hidden ({}) and intermediate ({}) must be > 0", c.hidden, c.intermediate);
  UPIPE_CHECK(c.tile_tokens > 0, "mlp tile_tokens must be > 0, got {}", c.tile_tokens);
}

void check_weights(const MlpConfig& c, const MlpWeights& w) {
  const int64_t d = c.hidden, f = c.intermediate;
  UPIPE_CHECK(shape_is(w.gate, f, d) && shape_is(w.up, f, d) && shape_is(w.down, d, f),
              "mlp weights gate ({}, {}), up ({}, {}), down ({}, {}); expected ({f}, {d}), ({f}, "
              "{d}), ({d}, {f})",
              w.gate.rows, w.gate.cols, w.up.rows, w.up.cols, w.down.rows, w.down.cols,
              fmt::arg("f", f), fmt::arg("d", d));
  UPIPE_CHECK(w.gate.dtype == c.dtype && w.up.dtype == c.dtype && w.down.dtype == c.dtype,
              "mlp weights must have the block's dtype {}", dtype_name(c.dtype));
}

void check_rows(const MlpConfig& c, const Mat& x, const Mat& out, const char* what) {
  UPIPE_CHECK(x.cols == c.hidden && x.dtype == c.dtype,
              "mlp x is ({}, {}) {}, expected (rows, {}) {}", x.rows, x.cols, dtype_name(x.dtype),
              c.hidden, dtype_name(c.dtype));
  UPIPE_CHECK(shape_is(out, x.rows, c.hidden) && out.dtype == c.out_dtype(),
              "mlp {} is ({}, {}) {}, expected ({}, {}) {}", what, out.rows, out.cols,
              dtype_name(out.dtype), x.rows, c.hidden, dtype_name(c.out_dtype()));
}

void check_beta(float beta, const char* what) {
  UPIPE_CHECK(beta == 0.0f || beta == 1.0f, "mlp {} must be 0 or 1, got {}", what, beta);
}

// Row counts of the tiles a call on `rows` tokens runs: the full tile and the last one (they
// are equal when T divides rows); the formulas take the larger phase over both.
std::array<int64_t, 2> tile_rows(const MlpConfig& c, int64_t rows) {
  const int64_t t = std::min(c.tile_tokens, rows);
  const int64_t last = rows % c.tile_tokens == 0 ? t : rows % c.tile_tokens;
  return {t, last};
}

// a (t, F) = x gate^T, b (t, F) = x up^T, in dtype.
void gate_up(Device& dev, const Mat& x, const MlpWeights& w, const Mat& a, const Mat& b) {
  gemm(dev, x, false, w.gate, true, a);
  gemm(dev, x, false, w.up, true, b);
}

void check_kept(const MlpConfig& c, const Mat& x, const MlpStash* k) {
  if (!k) return;
  UPIPE_CHECK(shape_is(k->a, x.rows, c.intermediate) && shape_is(k->b, x.rows, c.intermediate) &&
                  k->a.dtype == c.dtype && k->b.dtype == c.dtype,
              "mlp kept products must be ({}, {}) {}", x.rows, c.intermediate, dtype_name(c.dtype));
}

// Fresh (t, F) tiles for the gate and up products, owned by `a` and `b` (tag mlp).
MlpStash fresh_products(Device& dev, const MlpConfig& c, int64_t t, Tensor& a, Tensor& b) {
  a = Tensor(dev.mem(), Tag::kMlp, c.dtype, t, c.intermediate);
  b = Tensor(dev.mem(), Tag::kMlp, c.dtype, t, c.intermediate);
  return {a.mat(), b.mat()};
}

}  // namespace

void mlp_forward(Device& dev, const MlpConfig& c, const Mat& x, const MlpWeights& w, const Mat& y,
                 float beta, const MlpStash* keep, WriteFence* y_fence) {
  check_config(c);
  check_weights(c, w);
  check_rows(c, x, y, "y");
  check_beta(beta, "beta");
  check_kept(c, x, keep);
  const int64_t f = c.intermediate;
  for (int64_t r0 = 0; r0 < x.rows; r0 += c.tile_tokens) {
    const int64_t t = std::min(c.tile_tokens, x.rows - r0);
    Tensor h(dev.mem(), Tag::kMlp, c.dtype, t, f);  // (T, F)
    {
      Tensor own_a, own_b;  // the products' tiles, unless kept
      const MlpStash ab = keep ? keep->rows_of(r0, t) : fresh_products(dev, c, t, own_a, own_b);
      gate_up(dev, x.rows_of(r0, t), w, ab.a, ab.b);
      swiglu_forward(dev, ab.a, ab.b, h);
    }
    fence_write(y_fence, y.rows_of(r0, t));
    gemm(dev, h, false, w.down, true, y.rows_of(r0, t), 1.0f, beta);  // y = beta y + h down^T
  }
}

void mlp_backward(Device& dev, const MlpConfig& c, const Mat& x, const Mat& dy, const MlpWeights& w,
                  const Mat& dx, const MlpGrads& g, float dx_beta, float dw_beta,
                  const MlpStash* kept) {
  check_config(c);
  check_weights(c, w);
  check_kept(c, x, kept);
  check_rows(c, x, dy, "dy");
  check_rows(c, x, dx, "dx");
  check_beta(dx_beta, "dx_beta");
  check_beta(dw_beta, "dw_beta");
  const int64_t d = c.hidden, f = c.intermediate;
  UPIPE_CHECK(shape_is(g.gate, f, d) && shape_is(g.up, f, d) && shape_is(g.down, d, f) &&
                  g.gate.dtype == DType::kF32 && g.up.dtype == DType::kF32 &&
                  g.down.dtype == DType::kF32,
              "mlp weight gradients must be fp32 and shaped like the weights");
  // The first tile's products overwrite the gradients when dw_beta is 0 (no separate pass over
  // them); with no rows there is no tile, so they are zeroed here.
  if (dw_beta == 0.0f && x.rows == 0)
    for (const Mat* m : {&g.gate, &g.up, &g.down}) zero(dev, *m);
  const DType f32 = DType::kF32;
  for (int64_t r0 = 0; r0 < x.rows; r0 += c.tile_tokens) {
    const int64_t t = std::min(c.tile_tokens, x.rows - r0);
    const float gw_beta = r0 == 0 ? dw_beta : 1.0f;  // weight gradients: overwrite, then add
    const Mat xt = x.rows_of(r0, t), dyt = dy.rows_of(r0, t);                         // (T, D)
    Tensor da(dev.mem(), Tag::kMlp, f32, t, f), db(dev.mem(), Tag::kMlp, f32, t, f);  // (T, F)
    {
      Tensor own_a, own_b;  // the recomputed products, unless kept
      const MlpStash k = kept ? kept->rows_of(r0, t) : fresh_products(dev, c, t, own_a, own_b);
      if (!kept) gate_up(dev, xt, w, k.a, k.b);
      const Mat &a = k.a, &b = k.b;
      {
        Tensor h(dev.mem(), Tag::kMlp, c.dtype, t, f);
        swiglu_forward(dev, a, b, h);
        gemm(dev, dyt, true, h, false, g.down, 1.0f, gw_beta);  // dW_down += dy^T h
      }
      Tensor dh(dev.mem(), Tag::kMlp, f32, t, f);
      gemm(dev, dyt, false, w.down, false, dh);  // dh = dy down
      swiglu_backward(dev, a, b, dh, da, db);
    }
    // dx = dx_beta dx + da gate + db up, in fp32 and rounded once when dx is bf16.
    FpAccumulator acc(dev, dx.rows_of(r0, t), dx_beta, Tag::kMlp);
    gemm(dev, da, false, w.gate, false, acc.target(), 1.0f, acc.beta());
    gemm(dev, db, false, w.up, false, acc.target(), 1.0f, 1.0f);
    acc.finish();
    gemm(dev, da, true, xt, false, g.gate, 1.0f, gw_beta);  // dW_gate += da^T x
    gemm(dev, db, true, xt, false, g.up, 1.0f, gw_beta);    // dW_up += db^T x
  }
}

int64_t mlp_forward_peak_bytes(const Backend& be, const MlpConfig& c, int64_t rows, bool kept) {
  check_config(c);
  if (rows == 0) return 0;
  const int64_t d = c.hidden, f = c.intermediate;
  const DType t = c.dtype;
  int64_t peak = 0;
  for (int64_t n : tile_rows(c, rows)) {
    const int64_t tile = mat_bytes(n, f, t), ab = kept ? 0 : 2 * tile;
    peak = std::max({peak, tile + ab + gemm_workspace_bytes(be, n, f, d, t, t, t),
                     tile + ab + swiglu_workspace_bytes(be, f),
                     tile + gemm_workspace_bytes(be, n, d, f, t, t, c.out_dtype())});
  }
  return peak;
}

int64_t mlp_backward_peak_bytes(const Backend& be, const MlpConfig& c, int64_t rows, bool kept) {
  check_config(c);
  if (rows == 0) return 0;
  const int64_t d = c.hidden, f = c.intermediate;
  const DType t = c.dtype, o = c.out_dtype(), f32 = DType::kF32;
  auto ws = [&](int64_t m, int64_t n, int64_t k, DType a, DType b, DType cc) {
    return gemm_workspace_bytes(be, m, n, k, a, b, cc);
  };
  int64_t peak = 0;
  for (int64_t n : tile_rows(c, rows)) {
    const int64_t tile = mat_bytes(n, f, t), grad = mat_bytes(n, f, f32);
    const int64_t dadb = 2 * grad, ab = kept ? 0 : 2 * tile;
    const int64_t acc = FpAccumulator::bytes(n, d, o);
    peak = std::max({peak, kept ? 0 : dadb + ab + ws(n, f, d, t, t, t),  // a, b
                     dadb + ab + tile + swiglu_workspace_bytes(be, f),   // h
                     dadb + ab + tile + ws(d, f, n, o, t, f32),          // dW_down
                     dadb + ab + grad + ws(n, f, d, o, t, f32),          // dh
                     dadb + ab + grad + swiglu_workspace_bytes(be, f),   // da, db
                     dadb + acc + ws(n, d, f, f32, t, f32),              // dx
                     dadb + ws(f, d, n, f32, t, f32)});                  // dW_gate, dW_up
  }
  return peak;
}

int64_t mlp_peak_bytes(const Backend& be, const MlpConfig& c, int64_t rows) {
  return std::max(mlp_forward_peak_bytes(be, c, rows), mlp_backward_peak_bytes(be, c, rows));
}

}  // namespace upipe
