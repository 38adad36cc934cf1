#include "attention/local.h"

#include <algorithm>

#include "attention/seq_block.h"
#include "backend/attention.h"
#include "backend/tensor_ops.h"
#include "core/check.h"

namespace upipe {

LocalAttention::LocalAttention(const StrategyContext& ctx) : AttentionStrategy(ctx) {}

SeqLayout LocalAttention::layout() const {
  return with_documents(SeqLayout{LayoutKind::kContiguous, cfg().seq_len, 1, 1}, docs_);
}

namespace {

// The recomputable part of the block: q, k, v with QK-norm and RoPE, then o and lse.
struct Fwd {
  Tensor q, k, v;  // (S, H*d), (S, K*d), (S, K*d)
  Tensor o;        // (S, H*d)
  Tensor lse;      // (H, S) fp32
};

// The whole sequence's rows, and its documents' mask (nothing for one document).
struct LocalRows {
  RowPositions rows, rope;
  DocMask mask;
  AttnProblem problem(const Fwd& f, const AttentionConfig& c, const Documents* docs) const {
    AttnProblem p{f.q, f.k, f.v, c.heads, c.kv_heads, c.head_dim};
    if (docs) p.q_docs = p.k_docs = mask.list(0);
    return p;
  }
};

LocalRows local_rows(Device& dev, int64_t s, const Documents* docs) {
  LocalRows r;
  r.rows = r.rope = RowPositions::contiguous(s, 0);
  if (!docs) return r;
  r.rope = docs->positions_in_documents(r.rows);
  r.mask = DocMask(dev, *docs, std::span(&r.rows, 1));
  return r;
}

Fwd run_forward(Device& dev, const AttentionConfig& c, const Mat& x, const AttentionWeights& w,
                const LocalRows& rows, const Documents* docs) {
  const int64_t s = x.rows;
  Arena& mem = dev.mem();
  Fwd f;
  f.q = Tensor(mem, Tag::kQkv, c.dtype, s, c.q_dim());
  f.k = Tensor(mem, Tag::kQkv, c.dtype, s, c.kv_dim());
  f.v = Tensor(mem, Tag::kQkv, c.dtype, s, c.kv_dim());
  seq_project_qkv(dev, c, x, w, rows.rope, f.q, f.k, f.v);
  f.o = Tensor(mem, Tag::kAttnOut, c.dtype, s, c.q_dim());
  f.lse = Tensor(mem, Tag::kAttnOut, DType::kF32, c.heads, s);
  attention_forward(dev, rows.problem(f, c, docs), f.o, f.lse);
  return f;
}

}  // namespace

void LocalAttention::forward(const Mat& x, const AttentionWeights& w, const Mat& y, float beta) {
  const LocalRows rows = local_rows(dev(), x.rows, documents());
  Fwd f = run_forward(dev(), cfg(), x, w, rows, documents());
  f.q.reset();
  f.k.reset();
  f.v.reset();
  f.lse.reset();
  fence_output(y);
  seq_out_project(dev(), f.o, w.wo, y, beta);
}

namespace {

// The backward from the forward's q, k, v, o, lse (recomputed or kept), which it frees as it goes.
void backward_from(Device& dev, const AttentionConfig& c, Fwd& f, const LocalRows& rows,
                   const Documents* docs, const Mat& x, const Mat& dy, const AttentionWeights& w,
                   const Mat& dx, const AttentionGrads& g, float dx_beta, float dw_beta) {
  const int64_t s = x.rows;
  Arena& mem = dev.mem();
  Tensor dout(mem, Tag::kAttnGrad, c.dtype, s, c.q_dim());
  seq_dout_dwo(dev, dy, f.o, w.wo, dout, g.wo, dw_beta);
  Tensor delta(mem, Tag::kAttnGrad, DType::kF32, c.heads, s);
  attention_delta(dev, f.o, dout, c.head_dim, delta);
  // o lives on through the kernel where the backend's backward reads it (cuDNN's), else goes now.
  const bool keep_o =
      attention_backward_reads_o(dev.backend(), c.heads, c.kv_heads, c.head_dim, c.dtype);
  if (!keep_o) f.o.reset();
  Tensor dq(mem, Tag::kAttnGrad, DType::kF32, s, c.q_dim());
  Tensor dk(mem, Tag::kAttnGrad, DType::kF32, s, c.kv_dim());
  Tensor dv(mem, Tag::kAttnGrad, DType::kF32, s, c.kv_dim());
  zero(dev, dq);
  zero(dev, dk);
  zero(dev, dv);
  attention_backward(dev, rows.problem(f, c, docs), dout, f.lse, delta, dq, dk, dv,
                     keep_o ? f.o.mat() : Mat{});
  f.o.reset();
  dout.reset();
  delta.reset();
  f.lse.reset();
  f.q.reset();
  f.k.reset();
  f.v.reset();
  seq_input_grads(dev, c, x, w, rows.rope, dq, dk, dv, dx, g, dx_beta, dw_beta);
}

struct LocalKept final : AttentionStash {
  Fwd f;
};

}  // namespace

void LocalAttention::backward(const Mat& x, const Mat& dy, const AttentionWeights& w, const Mat& dx,
                              const AttentionGrads& g, float dx_beta, float dw_beta) {
  const LocalRows rows = local_rows(dev(), x.rows, documents());
  Fwd f = run_forward(dev(), cfg(), x, w, rows, documents());
  backward_from(dev(), cfg(), f, rows, documents(), x, dy, w, dx, g, dx_beta, dw_beta);
}

std::unique_ptr<AttentionStash> LocalAttention::forward_stash(const Mat& x,
                                                              const AttentionWeights& w,
                                                              const Mat& y, float beta) {
  auto kept = std::make_unique<LocalKept>();
  const LocalRows rows = local_rows(dev(), x.rows, documents());
  kept->f = run_forward(dev(), cfg(), x, w, rows, documents());
  fence_output(y);
  seq_out_project(dev(), kept->f.o, w.wo, y, beta);
  return kept;
}

void LocalAttention::backward_stashed(std::unique_ptr<AttentionStash> kept, const Mat& x,
                                      const Mat& dy, const AttentionWeights& w, const Mat& dx,
                                      const AttentionGrads& g, float dx_beta, float dw_beta) {
  auto* mine = dynamic_cast<LocalKept*>(kept.get());
  UPIPE_CHECK(mine != nullptr, "local: backward_stashed needs what local's forward_stash stashed");
  const LocalRows rows = local_rows(dev(), x.rows, documents());
  backward_from(dev(), cfg(), mine->f, rows, documents(), x, dy, w, dx, g, dx_beta, dw_beta);
}

namespace {

// The terms of local's peak (docs/memory.md): the forward's three moments and the backward's
// three, each with the intermediates alive then.
struct LocalMoments {
  int64_t kept;                      // q, k, v, o, lse
  int64_t proj, attn_fwd, out_proj;  // forward (also the recompute at the start of backward)
  int64_t do_proj, attn_bwd, grads;  // backward
};

LocalMoments local_moments(const Backend& be, const AttentionConfig& c) {
  const int64_t s = c.seq_len, d = c.head_dim;
  const DType t = c.dtype, f32 = DType::kF32;
  const int64_t q = mat_bytes(s, c.q_dim(), t), kv = mat_bytes(s, c.kv_dim(), t);
  const int64_t qkv = q + 2 * kv;
  const int64_t o = q, lse = mat_bytes(c.heads, s, f32), dout = q, delta = lse;
  const int64_t dq = mat_bytes(s, c.q_dim(), f32), dkv = mat_bytes(s, c.kv_dim(), f32);
  LocalMoments m;
  m.kept = qkv + o + lse;
  m.proj = qkv + seq_project_qkv_bytes(be, c, s);
  m.attn_fwd = qkv + o + lse + attention_fwd_workspace_bytes(be, c.heads, c.kv_heads, int(d), t);
  m.out_proj = o + seq_out_project_bytes(be, c, s);  // q, k, v, lse freed (not kept)
  m.do_proj = qkv + o + lse + dout + seq_dout_dwo_bytes(be, c, s);
  const bool keep_o = attention_backward_reads_o(be, c.heads, c.kv_heads, int(d), t);
  m.attn_bwd = qkv + lse + dout + delta + dq + 2 * dkv + (keep_o ? o : 0) +
               attention_bwd_workspace_bytes(be, c.heads, c.kv_heads, int(d), t);
  m.grads = dq + 2 * dkv + seq_input_grads_bytes(be, c, s);
  return m;
}

}  // namespace

int64_t local_attn_peak_bytes(const Backend& be, const AttentionConfig& c) {
  const LocalMoments m = local_moments(be, c);
  return std::max({m.proj, m.attn_fwd, m.out_proj, m.do_proj, m.attn_bwd, m.grads});
}

StashedAttentionBytes local_kept_bytes(const Backend& be, const AttentionConfig& c) {
  const LocalMoments m = local_moments(be, c);
  const int64_t out_proj = m.kept + seq_out_project_bytes(be, c, c.seq_len);
  return {m.kept, std::max({m.proj, m.attn_fwd, out_proj}),
          std::max({m.do_proj, m.attn_bwd, m.grads})};
}

namespace {

// The mask metadata every call holds throughout (0 for one document).
int64_t local_mask_bytes(const AttentionConfig& c, const Documents* docs) {
  if (!docs) return 0;
  const RowPositions all = RowPositions::contiguous(c.seq_len, 0);
  return DocMask::bytes(*docs, std::span(&all, 1));
}

}  // namespace

int64_t LocalAttention::attn_formula_bytes() const {
  return local_attn_peak_bytes(dev().backend(), cfg()) + local_mask_bytes(cfg(), documents());
}

StashedAttentionBytes LocalAttention::stash_formula_bytes() const {
  StashedAttentionBytes b = local_kept_bytes(dev().backend(), cfg());
  const int64_t mask = local_mask_bytes(cfg(), documents());
  b.forward += mask;
  b.backward += mask;
  return b;
}

}  // namespace upipe
