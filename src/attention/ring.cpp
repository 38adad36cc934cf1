#include "attention/ring.h"

#include <algorithm>

#include "attention/seq_block.h"
#include "backend/attention.h"
#include "backend/gemm.h"
#include "backend/tensor_ops.h"

namespace upipe {

RingAttention::RingAttention(const StrategyContext& ctx) : AttentionStrategy(ctx) {
  documents_changed();
}

void RingAttention::documents_changed() {
  layout_ = with_documents(SeqLayout{LayoutKind::kZigzag, cfg().seq_len, comm().size(), 1}, docs_);
  pos_ = layout_.positions(comm().rank());
  rope_pos_ = rope_positions(pos_);
}

std::vector<RowPositions> member_rows(const SeqLayout& layout) {
  std::vector<RowPositions> v;
  for (int m = 0; m < layout.ranks; ++m) v.push_back(layout.positions(m));
  return v;
}

DocMask RingAttention::build_mask() const {
  return docs_ ? DocMask(dev(), *docs_, member_rows(layout_)) : DocMask();
}

void RingAttention::project(const Mat& x, const AttentionWeights& w, Tensor& q, KvRing& kv) {
  const AttentionConfig& c = cfg();
  const int64_t sl = x.rows;
  q = Tensor(dev().mem(), Tag::kQkv, c.dtype, sl, c.q_dim());
  kv = KvRing(dev(), comm().size(), sl, c.kv_dim(), c.dtype);
  seq_project_qkv(dev(), c, x, w, rope_pos_, q, kv.k(), kv.v());
}

void RingAttention::accumulate(const Mat& q, KvRing& kv, bool come_home, const DocMask* mask,
                               Tensor& acc, Tensor& m, Tensor& l) {
  const AttentionConfig& c = cfg();
  const int64_t sl = q.rows;
  Arena& mem = dev().mem();
  acc = Tensor(mem, Tag::kAttnOut, DType::kF32, sl, q.cols);
  m = Tensor(mem, Tag::kAttnOut, DType::kF32, c.heads, sl);
  l = Tensor(mem, Tag::kAttnOut, DType::kF32, c.heads, sl);
  attention_accumulate_init(dev(), acc, m, l);
  ring_forward(dev(), {comm(), layout_, mask}, q, c.heads, c.kv_heads, c.head_dim, kv, come_home,
               acc, m, l);
}

void RingAttention::forward(const Mat& x, const AttentionWeights& w, const Mat& y, float beta) {
  const AttentionConfig& c = cfg();
  const int64_t sl = x.rows;
  Arena& mem = dev().mem();
  const DocMask mask = build_mask();
  Tensor q, acc, m, l;
  KvRing kv;
  project(x, w, q, kv);
  accumulate(q, kv, false, docs_ ? &mask : nullptr, acc, m, l);
  q.reset();
  kv.reset();
  Tensor o(mem, Tag::kAttnOut, c.dtype, sl, c.q_dim());
  Tensor lse(mem, Tag::kAttnOut, DType::kF32, c.heads, sl);
  attention_finalize(dev(), acc, m, l, c.head_dim, o, lse);
  acc.reset();
  m.reset();
  l.reset();
  lse.reset();
  fence_output(y);
  seq_out_project(dev(), o, w.wo, y, beta);
}

void RingAttention::backward(const Mat& x, const Mat& dy, const AttentionWeights& w, const Mat& dx,
                             const AttentionGrads& g, float dx_beta, float dw_beta) {
  const AttentionConfig& c = cfg();
  const int64_t sl = x.rows, kd = c.kv_dim();
  const int d = c.head_dim;
  const DType t = c.dtype, f32 = DType::kF32;
  Arena& mem = dev().mem();
  const DocMask mask = build_mask();
  Tensor q, acc, m, l;
  KvRing kv;
  project(x, w, q, kv);
  accumulate(q, kv, true, docs_ ? &mask : nullptr, acc, m, l);  // kv is home again afterwards
  Tensor o(mem, Tag::kAttnOut, t, sl, c.q_dim());
  Tensor lse(mem, Tag::kAttnOut, f32, c.heads, sl);
  attention_finalize(dev(), acc, m, l, d, o, lse);
  acc.reset();
  m.reset();
  l.reset();
  Tensor dout(mem, Tag::kAttnGrad, t, sl, c.q_dim());
  seq_dout_dwo(dev(), dy, o, w.wo, dout, g.wo, dw_beta);
  Tensor delta(mem, Tag::kAttnGrad, f32, c.heads, sl);
  attention_delta(dev(), o, dout, d, delta);
  // o lives on through the ring where the backend's backward reads it (cuDNN's), else goes now.
  const bool keep_o = attention_backward_reads_o(dev().backend(), c.heads, c.kv_heads, d, t);
  if (!keep_o) o.reset();
  Tensor dq(mem, Tag::kAttnGrad, f32, sl, c.q_dim());
  zero(dev(), dq);
  const Buffer dkv = ring_backward(dev(), {comm(), layout_, docs_ ? &mask : nullptr}, q, dout, lse,
                                   delta, c.heads, c.kv_heads, d, kv, dq, keep_o ? o.mat() : Mat{});
  o.reset();
  q.reset();
  kv.reset();
  dout.reset();
  delta.reset();
  lse.reset();
  seq_input_grads(dev(), c, x, w, rope_pos_, dq, ring_dk(dkv, sl, kd), ring_dv(dkv, sl, kd), dx, g,
                  dx_beta, dw_beta);
}

int64_t ring_attn_peak_bytes(const Backend& be, const AttentionConfig& c, int ranks,
                             const Documents* docs) {
  const int64_t sl = c.seq_len / ranks, d = c.head_dim;
  const int64_t hd = c.q_dim(), kd = c.kv_dim();
  const DType t = c.dtype, f32 = DType::kF32;
  const int64_t q = mat_bytes(sl, hd, t), o = q, dout = q;
  const int64_t kvr = kv_ring_slots(ranks) * ring_block_bytes(sl, kd, t);
  const int64_t acc = mat_bytes(sl, hd, f32), ml = 2 * mat_bytes(c.heads, sl, f32);
  const int64_t lse = mat_bytes(c.heads, sl, f32), delta = lse, dq = mat_bytes(sl, hd, f32);
  const int64_t dkvr = dkv_ring_buffers(ranks) * ring_block_bytes(sl, kd, f32);
  const int64_t home = ring_block_bytes(sl, kd, f32);
  // Projections (forward, and the recompute opening backward).
  const int64_t proj = q + kvr + seq_project_qkv_bytes(be, c, sl);
  const int64_t ring_fwd =
      q + kvr + acc + ml + attention_fwd_workspace_bytes(be, c.heads, c.kv_heads, int(d), t);
  // Forward: q and the ring are gone before o exists.
  const int64_t fwd_final = acc + ml + o + lse;
  const int64_t out_proj = o + seq_out_project_bytes(be, c, sl);
  // Backward: q and the (home again) K/V block stay for the ring backward.
  const int64_t bwd_final = q + kvr + acc + ml + o + lse;
  const int64_t do_proj = q + kvr + o + lse + dout + seq_dout_dwo_bytes(be, c, sl);
  const int64_t delta_ph = q + kvr + o + lse + dout + delta;
  const bool keep_o = attention_backward_reads_o(be, c.heads, c.kv_heads, int(d), t);
  const int64_t ring_bwd = q + kvr + lse + dout + delta + dq + dkvr + (keep_o ? o : 0) +
                           attention_bwd_workspace_bytes(be, c.heads, c.kv_heads, int(d), t);
  const int64_t grads = dq + home + seq_input_grads_bytes(be, c, sl);
  // The documents' mask lives through every phase of forward and backward.
  int64_t mask = 0;
  if (docs) {
    const SeqLayout placed = with_documents(SeqLayout{LayoutKind::kZigzag, c.seq_len, ranks, 1},
                                            std::make_shared<const Documents>(*docs));
    mask = DocMask::bytes(*docs, member_rows(placed));
  }
  return mask + std::max({proj, ring_fwd, fwd_final, out_proj, bwd_final, do_proj, delta_ph,
                          ring_bwd, grads});
}
int64_t RingAttention::attn_formula_bytes() const {
  return ring_attn_peak_bytes(dev().backend(), cfg(), comm().size(), documents());
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
