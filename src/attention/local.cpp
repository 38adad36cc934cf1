#include "attention/local.h"

#include <algorithm>

#include "backend/attention.h"
#include "backend/gemm.h"
#include "backend/tensor_ops.h"

namespace upipe {

LocalAttention::LocalAttention(const StrategyContext& ctx) : AttentionStrategy(ctx) {}

SeqLayout LocalAttention::layout() const {
  return SeqLayout{LayoutKind::kContiguous, cfg().seq_len, 1, 1};
}

namespace {

// The recomputable part of the block: q, k, v with RoPE, then o and lse.
struct Fwd {
  Tensor q, k, v;  // (S, H*d), (S, K*d), (S, K*d)
  Tensor o;        // (S, H*d)
  Tensor lse;      // (H, S) fp32
};

Fwd run_forward(Device& dev, const AttentionConfig& c, const Mat& x, const AttentionWeights& w) {
  const int64_t s = x.rows, d = c.head_dim;
  Arena& mem = dev.mem();
  Fwd f;
  f.q = Tensor(mem, Tag::kQkv, c.dtype, s, c.heads * d);
  gemm(dev, x, false, w.wq, true, f.q);
  f.k = Tensor(mem, Tag::kQkv, c.dtype, s, c.kv_heads * d);
  gemm(dev, x, false, w.wk, true, f.k);
  f.v = Tensor(mem, Tag::kQkv, c.dtype, s, c.kv_heads * d);
  gemm(dev, x, false, w.wv, true, f.v);
  const RowPositions pos = RowPositions::contiguous(s, 0);
  rope_forward(dev, f.q, int(d), pos, c.rope);
  rope_forward(dev, f.k, int(d), pos, c.rope);
  f.o = Tensor(mem, Tag::kAttnOut, c.dtype, s, c.heads * d);
  f.lse = Tensor(mem, Tag::kAttnOut, DType::kF32, c.heads, s);
  AttnProblem p{f.q, f.k, f.v, c.heads, c.kv_heads, int(d)};
  attention_forward(dev, p, f.o, f.lse);
  return f;
}

}  // namespace

void LocalAttention::forward(const Mat& x, const AttentionWeights& w, const Mat& y) {
  Fwd f = run_forward(dev(), cfg(), x, w);
  f.q.reset();
  f.k.reset();
  f.v.reset();
  f.lse.reset();
  gemm(dev(), f.o, false, w.wo, true, y);  // y = o Wo^T
}

void LocalAttention::backward(const Mat& x, const Mat& dy, const AttentionWeights& w, const Mat& dx,
                              const AttentionGrads& g) {
  const AttentionConfig& c = cfg();
  const int64_t s = x.rows, d = c.head_dim;
  Arena& mem = dev().mem();
  Fwd f = run_forward(dev(), c, x, w);
  Tensor dout(mem, Tag::kAttnGrad, c.dtype, s, c.heads * d);
  gemm(dev(), dy, false, w.wo, false, dout);  // do = dy Wo
  gemm(dev(), dy, true, f.o, false, g.wo);    // dWo = dy^T o
  Tensor delta(mem, Tag::kAttnGrad, DType::kF32, c.heads, s);
  attention_delta(dev(), f.o, dout, int(d), delta);
  f.o.reset();
  Tensor dq(mem, Tag::kAttnGrad, DType::kF32, s, c.heads * d);
  Tensor dk(mem, Tag::kAttnGrad, DType::kF32, s, c.kv_heads * d);
  Tensor dv(mem, Tag::kAttnGrad, DType::kF32, s, c.kv_heads * d);
  zero(dev(), dq);
  zero(dev(), dk);
  zero(dev(), dv);
  AttnProblem p{f.q, f.k, f.v, c.heads, c.kv_heads, int(d)};
  attention_backward(dev(), p, dout, f.lse, delta, dq, dk, dv);
  dout.reset();
  delta.reset();
  f.lse.reset();
  f.q.reset();
  f.k.reset();
  f.v.reset();
  const RowPositions pos = RowPositions::contiguous(s, 0);
  rope_backward(dev(), dq, int(d), pos, c.rope);
  rope_backward(dev(), dk, int(d), pos, c.rope);
  // dx = dq Wq + dk Wk + dv Wv, accumulated in fp32 and rounded once when dx is bf16.
  Tensor dxacc;
  if (c.dtype != DType::kF32) dxacc = Tensor(mem, Tag::kAttnGrad, DType::kF32, s, c.model_dim());
  const Mat dxout = c.dtype == DType::kF32 ? dx : dxacc.mat();
  gemm(dev(), dq, false, w.wq, false, dxout);
  gemm(dev(), dk, false, w.wk, false, dxout, 1.0f, 1.0f);
  gemm(dev(), dv, false, w.wv, false, dxout, 1.0f, 1.0f);
  if (c.dtype != DType::kF32) copy(dev(), dx, dxacc);
  dxacc.reset();
  gemm(dev(), dq, true, x, false, g.wq);  // dWq = dq^T x
  gemm(dev(), dk, true, x, false, g.wk);
  gemm(dev(), dv, true, x, false, g.wv);
}

int64_t local_attn_peak_bytes(const Backend& be, const AttentionConfig& c) {
  const int64_t s = c.seq_len, d = c.head_dim, dm = c.model_dim();
  const DType t = c.dtype, f32 = DType::kF32;
  const int64_t q = mat_bytes(s, c.heads * d, t), kv = mat_bytes(s, c.kv_heads * d, t);
  const int64_t qkv = q + 2 * kv;
  const int64_t o = q, lse = mat_bytes(c.heads, s, f32), dout = q, delta = lse;
  const int64_t dq = mat_bytes(s, c.heads * d, f32), dkv = mat_bytes(s, c.kv_heads * d, f32);
  auto ws = [&](int64_t m, int64_t n, int64_t k, DType a, DType b, DType cc) {
    return gemm_workspace_bytes(be, m, n, k, a, b, cc);
  };
  // Forward (also the recompute at the start of backward).
  const int64_t proj_q = q + ws(s, c.heads * d, dm, t, t, t);
  const int64_t proj_kv = qkv + ws(s, c.kv_heads * d, dm, t, t, t);
  const int64_t attn_fwd = qkv + o + lse + attention_fwd_workspace_bytes(be, int(d), t);
  const int64_t out_proj = o + ws(s, dm, c.heads * d, t, t, t);
  // Backward.
  const int64_t do_proj = qkv + o + lse + dout + ws(s, c.heads * d, dm, t, t, t);
  const int64_t dwo = qkv + o + lse + dout + ws(dm, c.heads * d, s, t, t, f32);
  const int64_t attn_bwd =
      qkv + lse + dout + delta + dq + 2 * dkv + attention_bwd_workspace_bytes(be, int(d), t);
  const int64_t dxacc = t == f32 ? 0 : mat_bytes(s, dm, f32);
  const int64_t dx_proj = dq + 2 * dkv + dxacc + ws(s, dm, c.heads * d, f32, t, f32);
  const int64_t dw_proj = dq + 2 * dkv + ws(c.heads * d, dm, s, f32, t, f32);
  return std::max({proj_q, proj_kv, attn_fwd, out_proj, do_proj, dwo, attn_bwd, dx_proj, dw_proj});
}

int64_t LocalAttention::attn_formula_bytes() const {
  return local_attn_peak_bytes(dev().backend(), cfg());
}

}  // namespace upipe
