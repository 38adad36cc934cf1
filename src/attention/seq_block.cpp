#include "attention/seq_block.h"

#include <algorithm>

#include "attention/fp_accumulator.h"
#include "backend/gemm.h"
#include "backend/rmsnorm.h"
#include "backend/rope.h"
#include "backend/tensor_ops.h"

namespace upipe {

void seq_project_qkv(Device& dev, const AttentionConfig& c, const Mat& x, const AttentionWeights& w,
                     const RowPositions& pos, const Mat& q, const Mat& k, const Mat& v) {
  const int d = c.head_dim;
  gemm(dev, x, false, w.wq, true, q);
  gemm(dev, x, false, w.wk, true, k);
  gemm(dev, x, false, w.wv, true, v);
  if (c.qk_norm) {
    rmsnorm_forward(dev, q, w.wqn, c.norm_eps, q, d);
    rmsnorm_forward(dev, k, w.wkn, c.norm_eps, k, d);
  }
  rope_forward(dev, q, d, pos, c.rope);
  rope_forward(dev, k, d, pos, c.rope);
}

int64_t seq_project_qkv_bytes(const Backend& be, const AttentionConfig& c, int64_t rows) {
  const DType t = c.dtype;
  const int64_t dm = c.model_dim();
  int64_t b = std::max(gemm_workspace_bytes(be, rows, c.q_dim(), dm, t, t, t),
                       gemm_workspace_bytes(be, rows, c.kv_dim(), dm, t, t, t));
  if (c.qk_norm) b = std::max(b, rmsnorm_workspace_bytes(be, c.head_dim));
  return b;
}

void seq_out_project(Device& dev, const Mat& o, const Mat& wo, const Mat& y, float beta) {
  gemm(dev, o, false, wo, true, y, 1.0f, beta);
}

int64_t seq_out_project_bytes(const Backend& be, const AttentionConfig& c, int64_t rows) {
  const DType t = c.dtype;
  return gemm_workspace_bytes(be, rows, c.model_dim(), c.q_dim(), t, t, c.out_dtype());
}

void seq_dout_dwo(Device& dev, const Mat& dy, const Mat& o, const Mat& wo, const Mat& dout,
                  const Mat& gwo, float dw_beta) {
  gemm(dev, dy, false, wo, false, dout);              // do = dy Wo
  gemm(dev, dy, true, o, false, gwo, 1.0f, dw_beta);  // dWo = dy^T o
}

int64_t seq_dout_dwo_bytes(const Backend& be, const AttentionConfig& c, int64_t rows) {
  const DType t = c.dtype, ot = c.out_dtype();
  return std::max(gemm_workspace_bytes(be, rows, c.q_dim(), c.model_dim(), ot, t, t),
                  gemm_workspace_bytes(be, c.model_dim(), c.q_dim(), rows, ot, t, DType::kF32));
}

namespace {

// QK-norm backward of one of q, k in place: grad (rows, heads*d) fp32 at the norm's output
// becomes the gradient at its input; the pre-norm values are recomputed as x W^T.
void qk_norm_backward(Device& dev, const AttentionConfig& c, const Mat& x, const Mat& wproj,
                      const Mat& wnorm, const Mat& grad, const Mat& gnorm) {
  Tensor pre(dev.mem(), Tag::kQkv, c.dtype, grad.rows, grad.cols);
  gemm(dev, x, false, wproj, true, pre);
  rmsnorm_backward(dev, pre, wnorm, c.norm_eps, grad, grad, gnorm, c.head_dim);
}

}  // namespace

void seq_input_grads(Device& dev, const AttentionConfig& c, const Mat& x, const AttentionWeights& w,
                     const RowPositions& pos, const Mat& dq, const Mat& dk, const Mat& dv,
                     const Mat& dx, const AttentionGrads& g, float dx_beta, float dw_beta) {
  const int d = c.head_dim;
  rope_backward(dev, dq, d, pos, c.rope);
  rope_backward(dev, dk, d, pos, c.rope);
  if (c.qk_norm) {
    if (dw_beta == 0.0f) {
      zero(dev, g.wqn);
      zero(dev, g.wkn);
    }
    qk_norm_backward(dev, c, x, w.wq, w.wqn, dq, g.wqn);
    qk_norm_backward(dev, c, x, w.wk, w.wkn, dk, g.wkn);
  }
  // dx = dq Wq + dk Wk + dv Wv, accumulated in fp32 and rounded once when dx is bf16.
  FpAccumulator dxacc(dev, dx, dx_beta, Tag::kAttnGrad);
  gemm(dev, dq, false, w.wq, false, dxacc.target(), 1.0f, dxacc.beta());
  gemm(dev, dk, false, w.wk, false, dxacc.target(), 1.0f, 1.0f);
  gemm(dev, dv, false, w.wv, false, dxacc.target(), 1.0f, 1.0f);
  dxacc.finish();
  gemm(dev, dq, true, x, false, g.wq, 1.0f, dw_beta);  // dWq = dq^T x
  gemm(dev, dk, true, x, false, g.wk, 1.0f, dw_beta);
  gemm(dev, dv, true, x, false, g.wv, 1.0f, dw_beta);
}

int64_t seq_input_grads_bytes(const Backend& be, const AttentionConfig& c, int64_t rows) {
  const DType t = c.dtype, f32 = DType::kF32;
  const int64_t dm = c.model_dim(), qd = c.q_dim(), kd = c.kv_dim();
  auto ws = [&](int64_t m, int64_t n, int64_t k, DType a, DType b, DType cc) {
    return gemm_workspace_bytes(be, m, n, k, a, b, cc);
  };
  int64_t norm = 0;
  if (c.qk_norm)
    for (int64_t cols : {qd, kd})
      norm = std::max(
          norm, mat_bytes(rows, cols, t) +
                    std::max(ws(rows, cols, dm, t, t, t), rmsnorm_workspace_bytes(be, c.head_dim)));
  const int64_t dxacc = FpAccumulator::bytes(rows, dm, c.out_dtype());
  const int64_t dx_proj =
      dxacc + std::max(ws(rows, dm, qd, f32, t, f32), ws(rows, dm, kd, f32, t, f32));
  const int64_t dw_proj = std::max(ws(qd, dm, rows, f32, t, f32), ws(kd, dm, rows, f32, t, f32));
  return std::max({norm, dx_proj, dw_proj});
}

}  // namespace upipe
