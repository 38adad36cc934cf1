#include "attention/ring.h"

#include <algorithm>

#include "backend/attention.h"
#include "backend/gemm.h"
#include "backend/tensor_ops.h"

namespace upipe {

RingAttention::RingAttention(const StrategyContext& ctx, std::string name)
    : AttentionStrategy(ctx), name_(std::move(name)), pos_(layout().positions(ctx.comm.rank())) {}

SeqLayout RingAttention::layout() const {
  return SeqLayout{LayoutKind::kZigzag, cfg().seq_len, comm().size(), 1};
}

void RingAttention::project(const Mat& x, const AttentionWeights& w, Tensor& q, KvRing& kv) {
  const AttentionConfig& c = cfg();
  const int64_t sl = x.rows, d = c.head_dim;
  q = Tensor(dev().mem(), Tag::kQkv, c.dtype, sl, c.heads * d);
  gemm(dev(), x, false, w.wq, true, q);
  rope_forward(dev(), q, int(d), pos_, c.rope);
  kv = KvRing(dev(), comm().size(), sl, c.kv_heads * d, c.dtype);
  gemm(dev(), x, false, w.wk, true, kv.k());
  rope_forward(dev(), kv.k(), int(d), pos_, c.rope);
  gemm(dev(), x, false, w.wv, true, kv.v());
}

void RingAttention::accumulate(const Mat& q, KvRing& kv, bool come_home, Tensor& acc, Tensor& m,
                               Tensor& l) {
  const AttentionConfig& c = cfg();
  const int64_t sl = q.rows;
  Arena& mem = dev().mem();
  acc = Tensor(mem, Tag::kAttnOut, DType::kF32, sl, q.cols);
  m = Tensor(mem, Tag::kAttnOut, DType::kF32, c.heads, sl);
  l = Tensor(mem, Tag::kAttnOut, DType::kF32, c.heads, sl);
  attention_accumulate_init(dev(), acc, m, l);
  ring_forward(dev(), {comm(), layout()}, q, c.heads, c.kv_heads, c.head_dim, kv, come_home, acc, m,
               l);
}

void RingAttention::forward(const Mat& x, const AttentionWeights& w, const Mat& y) {
  const AttentionConfig& c = cfg();
  const int64_t sl = x.rows, hd = c.model_dim();
  Arena& mem = dev().mem();
  Tensor q, acc, m, l;
  KvRing kv;
  project(x, w, q, kv);
  accumulate(q, kv, false, acc, m, l);
  q.reset();
  kv.reset();
  Tensor o(mem, Tag::kAttnOut, c.dtype, sl, hd);
  Tensor lse(mem, Tag::kAttnOut, DType::kF32, c.heads, sl);
  attention_finalize(dev(), acc, m, l, c.head_dim, o, lse);
  acc.reset();
  m.reset();
  l.reset();
  lse.reset();
  gemm(dev(), o, false, w.wo, true, y);  // y = o Wo^T
}

void RingAttention::backward(const Mat& x, const Mat& dy, const AttentionWeights& w, const Mat& dx,
                             const AttentionGrads& g) {
  const AttentionConfig& c = cfg();
  const int64_t sl = x.rows, hd = c.model_dim(), kd = int64_t(c.kv_heads) * c.head_dim;
  const int d = c.head_dim;
  const DType t = c.dtype, f32 = DType::kF32;
  Arena& mem = dev().mem();
  Tensor q, acc, m, l;
  KvRing kv;
  project(x, w, q, kv);
  accumulate(q, kv, true, acc, m, l);  // kv is home again afterwards
  Tensor o(mem, Tag::kAttnOut, t, sl, hd);
  Tensor lse(mem, Tag::kAttnOut, f32, c.heads, sl);
  attention_finalize(dev(), acc, m, l, d, o, lse);
  acc.reset();
  m.reset();
  l.reset();
  Tensor dout(mem, Tag::kAttnGrad, t, sl, hd);
  gemm(dev(), dy, false, w.wo, false, dout);  // do = dy Wo
  gemm(dev(), dy, true, o, false, g.wo);      // dWo = dy^T o
  Tensor delta(mem, Tag::kAttnGrad, f32, c.heads, sl);
  attention_delta(dev(), o, dout, d, delta);
  o.reset();
  Tensor dq(mem, Tag::kAttnGrad, f32, sl, hd);
  zero(dev(), dq);
  const Buffer dkv =
      ring_backward(dev(), {comm(), layout()}, q, dout, lse, delta, c.heads, c.kv_heads, d, kv, dq);
  q.reset();
  kv.reset();
  dout.reset();
  delta.reset();
  lse.reset();
  const Mat dk = ring_dk(dkv, sl, kd), dv = ring_dv(dkv, sl, kd);
  rope_backward(dev(), dq, d, pos_, c.rope);
  rope_backward(dev(), dk, d, pos_, c.rope);
  // dx = dq Wq + dk Wk + dv Wv, accumulated in fp32 and rounded once when dx is bf16.
  Tensor dxacc;
  if (t != f32) dxacc = Tensor(mem, Tag::kAttnGrad, f32, sl, hd);
  const Mat dxout = t == f32 ? dx : dxacc.mat();
  gemm(dev(), dq, false, w.wq, false, dxout);
  gemm(dev(), dk, false, w.wk, false, dxout, 1.0f, 1.0f);
  gemm(dev(), dv, false, w.wv, false, dxout, 1.0f, 1.0f);
  if (t != f32) copy(dev(), dx, dxacc);
  dxacc.reset();
  gemm(dev(), dq, true, x, false, g.wq);  // dWq = dq^T x
  gemm(dev(), dk, true, x, false, g.wk);
  gemm(dev(), dv, true, x, false, g.wv);
}

int64_t ring_attn_peak_bytes(const Backend& be, const AttentionConfig& c, int ranks) {
  const int64_t sl = c.seq_len / ranks, d = c.head_dim, dm = c.model_dim();
  const int64_t hd = c.heads * d, kd = c.kv_heads * d;
  const DType t = c.dtype, f32 = DType::kF32;
  auto ws = [&](int64_t m_, int64_t n_, int64_t k_, DType a_, DType b_, DType c_) {
    return gemm_workspace_bytes(be, m_, n_, k_, a_, b_, c_);
  };
  const int64_t q = mat_bytes(sl, hd, t), o = q, dout = q;
  const int64_t kvr = kv_ring_slots(ranks) * ring_block_bytes(sl, kd, t);
  const int64_t acc = mat_bytes(sl, hd, f32), ml = 2 * mat_bytes(c.heads, sl, f32);
  const int64_t lse = mat_bytes(c.heads, sl, f32), delta = lse, dq = mat_bytes(sl, hd, f32);
  const int64_t dkvr = dkv_ring_buffers(ranks) * ring_block_bytes(sl, kd, f32);
  const int64_t home = ring_block_bytes(sl, kd, f32);
  const int64_t dxacc = t == f32 ? 0 : mat_bytes(sl, dm, f32);
  // Projections (forward, and the recompute opening backward).
  const int64_t proj_q = q + ws(sl, hd, dm, t, t, t);
  const int64_t proj_kv = q + kvr + ws(sl, kd, dm, t, t, t);
  const int64_t ring_fwd = q + kvr + acc + ml + attention_fwd_workspace_bytes(be, int(d), t);
  // Forward: q and the ring are gone before o exists.
  const int64_t fwd_final = acc + ml + o + lse;
  const int64_t out_proj = o + ws(sl, dm, hd, t, t, t);
  // Backward: q and the (home again) K/V block stay for the ring backward.
  const int64_t bwd_final = q + kvr + acc + ml + o + lse;
  const int64_t do_proj = q + kvr + o + lse + dout + ws(sl, hd, dm, t, t, t);
  const int64_t dwo = q + kvr + o + lse + dout + ws(dm, hd, sl, t, t, f32);
  const int64_t delta_ph = q + kvr + o + lse + dout + delta;
  const int64_t ring_bwd =
      q + kvr + lse + dout + delta + dq + dkvr + attention_bwd_workspace_bytes(be, int(d), t);
  const int64_t dx_proj =
      dq + home + dxacc + std::max(ws(sl, dm, hd, f32, t, f32), ws(sl, dm, kd, f32, t, f32));
  const int64_t dw_proj =
      dq + home + std::max(ws(hd, dm, sl, f32, t, f32), ws(kd, dm, sl, f32, t, f32));
  return std::max({proj_q, proj_kv, ring_fwd, fwd_final, out_proj, bwd_final, do_proj, dwo,
                   delta_ph, ring_bwd, dx_proj, dw_proj});
}

int64_t RingAttention::attn_formula_bytes() const {
  return ring_attn_peak_bytes(dev().backend(), cfg(), comm().size());
}

CommStats ring_comm_expected(const AttentionConfig& c, int ranks) {
  const int64_t sl = c.seq_len / ranks, kd = int64_t(c.kv_heads) * c.head_dim;
  CommStats st;
  add_ring_forward_comm(st, ranks, sl, kd, c.dtype, false);  // forward
  add_ring_forward_comm(st, ranks, sl, kd, c.dtype, true);   // backward's recompute
  add_ring_backward_comm(st, ranks, sl, kd, c.dtype);
  return st;
}

std::optional<CommStats> RingAttention::comm_expected() const {
  return ring_comm_expected(cfg(), comm().size());
}

}  // namespace upipe
