#include "attention/headwise.h"

#include <algorithm>

#include "attention/fp_accumulator.h"
#include "backend/gemm.h"
#include "backend/rmsnorm.h"
#include "backend/tensor_ops.h"

namespace upipe {

// The buffers one forward or backward allocates once and reuses in every stage. n = u S/C rows
// after the all-to-all (S for Ulysses and UPipe), m query heads per rank per stage, R resident
// KV heads.
struct HeadwiseAttention::Buffers {
  Tensor kres, vres;    // (n, R*d)          kv_resident
  Tensor dkres, dvres;  // (n, R*d) fp32     attn_grad (backward)
  Buffer a2a;           // C blocks (S/C, m*d), fp32-sized in backward   a2a
  Tensor q, o;          // (n, m*d)          qkv, attn_out
  Tensor lse;           // (m, n) fp32       attn_out
  Tensor dout;          // (n, m*d)          attn_grad (backward)
  Tensor delta;         // (m, n) fp32       attn_grad (backward)
  Tensor dq;            // (n, m*d) fp32     attn_grad (backward)
};

HeadwiseAttention::HeadwiseAttention(const StrategyContext& ctx, std::string name, int head_chunk)
    : HeadwiseAttention(
          ctx, std::move(name), head_chunk,
          {nullptr, std::make_unique<LocalCore>(ctx.dev, ctx.cfg.head_dim, ctx.cfg.dtype),
           SeqLayout{LayoutKind::kContiguous, ctx.cfg.seq_len, ctx.comm.size(), 1}}) {}

HeadwiseAttention::HeadwiseAttention(const StrategyContext& ctx, std::string name, int head_chunk,
                                     HeadwiseGroup group)
    : AttentionStrategy(ctx),
      name_(std::move(name)),
      own_group_(std::move(group.comm)),
      a2a_(own_group_ ? own_group_.get() : &ctx.comm),
      layout_(group.layout),
      sch_(make_upipe_schedule(ctx.cfg, a2a_->size(), head_chunk)),
      core_(std::move(group.core)),
      pos_(layout_.positions(ctx.comm.rank())) {}

SeqLayout HeadwiseAttention::layout() const {
  return layout_;
}

// Data movement keeps local's reduction order up to a few sums, except where partial results
// are combined: a ring core's softmax merge, and K < C, where the replicas' dK/dV partial sums
// are added in another order than local's single accumulation.
AttentionStrategy::ErrorClass HeadwiseAttention::error_class() const {
  if (core_->merges_partials()) return ErrorClass::kMerge;
  return sch_.replicated() ? ErrorClass::kReplicaSums : ErrorClass::kDataMovement;
}

void HeadwiseAttention::attend_forward(int stage, Buffers& b) {
  const int d = cfg().head_dim;
  for (const HeadRun& r : head_runs(sch_, stage)) {
    core_->forward(run_problem(r, b.q, b.kres, b.vres, d),
                   b.o.mat().cols_of(int64_t(r.q0) * d, int64_t(r.nh) * d),
                   b.lse.mat().rows_of(r.q0, r.nh));
  }
}

void HeadwiseAttention::forward(const Mat& x, const AttentionWeights& w, const Mat& y, float beta) {
  const AttentionConfig& c = cfg();
  const int64_t sl = x.rows, n = sl * sch_.ranks, d = c.head_dim, md = int64_t(sch_.m) * d;
  const int64_t rd = int64_t(sch_.kv_per_rank) * d;
  const DType t = c.dtype;
  Arena& mem = dev().mem();
  Buffers b;
  b.kres = Tensor(mem, Tag::kKvResident, t, n, rd);
  b.vres = Tensor(mem, Tag::kKvResident, t, n, rd);
  b.a2a = Buffer(mem, n * md * dtype_size(t), Tag::kA2a);
  b.q = Tensor(mem, Tag::kQkv, t, n, md);
  b.o = Tensor(mem, Tag::kAttnOut, t, n, md);
  b.lse = Tensor(mem, Tag::kAttnOut, DType::kF32, sch_.m, n);
  // y collects one partial product per stage and rank: an fp32 y (a residual stream) takes them
  // directly; a bf16 y is accumulated in fp32 and rounded once, as local's single GEMM does.
  FpAccumulator yacc(dev(), y, beta, Tag::kAttnOut);
  for (int s = 0; s < sch_.stages(); ++s) {
    if (sch_.starts_set(s)) project_kv(env(), x, pos_, w, sch_.set_of(s), b.a2a, b.kres, b.vres);
    project_q(env(), x, pos_, w, s, b.a2a, b.q);
    attend_forward(s, b);
    group().all_to_all(b.o.data(), b.a2a.data(), mat_bytes(sl, md, t));
    accumulate_out(env(), w.wo, s, b.a2a, yacc.target(), s == 0 ? yacc.beta() : 1.0f);
  }
  yacc.finish();
}

void HeadwiseAttention::backward(const Mat& x, const Mat& dy, const AttentionWeights& w,
                                 const Mat& dx, const AttentionGrads& g, float dx_beta,
                                 float dw_beta) {
  const AttentionConfig& c = cfg();
  const int64_t sl = x.rows, n = sl * sch_.ranks, d = c.head_dim, md = int64_t(sch_.m) * d;
  const int64_t rd = int64_t(sch_.kv_per_rank) * d;
  const DType t = c.dtype, f32 = DType::kF32;
  Arena& mem = dev().mem();
  Buffers b;
  b.kres = Tensor(mem, Tag::kKvResident, t, n, rd);
  b.vres = Tensor(mem, Tag::kKvResident, t, n, rd);
  b.dkres = Tensor(mem, Tag::kAttnGrad, f32, n, rd);
  b.dvres = Tensor(mem, Tag::kAttnGrad, f32, n, rd);
  b.a2a = Buffer(mem, n * md * 4, Tag::kA2a);
  b.q = Tensor(mem, Tag::kQkv, t, n, md);
  b.o = Tensor(mem, Tag::kAttnOut, t, n, md);
  b.lse = Tensor(mem, Tag::kAttnOut, f32, sch_.m, n);
  b.dout = Tensor(mem, Tag::kAttnGrad, t, n, md);
  b.delta = Tensor(mem, Tag::kAttnGrad, f32, sch_.m, n);
  b.dq = Tensor(mem, Tag::kAttnGrad, f32, n, md);
  FpAccumulator dxacc(dev(), dx, dx_beta, Tag::kAttnGrad);  // as y in forward
  if (c.qk_norm && dw_beta == 0.0f) {
    zero(dev(), g.wqn);
    zero(dev(), g.wkn);
  }
  for (int s = 0; s < sch_.stages(); ++s) {
    const int set = sch_.set_of(s);
    if (sch_.starts_set(s)) {
      project_kv(env(), x, pos_, w, set, b.a2a, b.kres, b.vres);
      zero(dev(), b.dkres);
      zero(dev(), b.dvres);
    }
    project_q(env(), x, pos_, w, s, b.a2a, b.q);
    attend_forward(s, b);
    // do = dy Wo[:, stage heads], projected into the all-to-all layout and sent head-sharded.
    project_do(env(), dy, w.wo, s, b.a2a);
    group().all_to_all(b.a2a.data(), b.dout.data(), mat_bytes(sl, md, t));
    // dWo[:, stage heads] = dy^T o needs o back in sequence layout.
    group().all_to_all(b.o.data(), b.a2a.data(), mat_bytes(sl, md, t));
    accumulate_dwo(env(), dy, s, b.a2a, g.wo, dw_beta);
    attention_delta(dev(), b.o, b.dout, int(d), b.delta);
    zero(dev(), b.dq);
    for (const HeadRun& r : head_runs(sch_, s)) {
      const int64_t qc = int64_t(r.q0) * d, qn = int64_t(r.nh) * d;
      const int64_t kc = int64_t(r.k0) * d, kn = int64_t(r.nk) * d;
      core_->backward(run_problem(r, b.q, b.kres, b.vres, int(d)), b.dout.mat().cols_of(qc, qn),
                      b.lse.mat().rows_of(r.q0, r.nh), b.delta.mat().rows_of(r.q0, r.nh),
                      b.dq.mat().cols_of(qc, qn), b.dkres.mat().cols_of(kc, kn),
                      b.dvres.mat().cols_of(kc, kn));
    }
    // dq back to sequence layout: dx += dq Wq[stage rows]; dWq[stage rows].
    group().all_to_all(b.dq.data(), b.a2a.data(), mat_bytes(sl, md, f32));
    return_q_grads(env(), x, pos_, w, s, b.a2a, dxacc.target(), g, s == 0 ? dxacc.beta() : 1.0f,
                   dw_beta);
    // The set's dK/dV go back once; dx already holds a dq term, dWk/dWv rows are written once.
    if ((s + 1) % sch_.stages_per_set == 0)
      return_kv_grads(env(), x, pos_, w, set, b.dkres, b.dvres, b.a2a, dxacc.target(), g, dw_beta);
  }
  dxacc.finish();
}

int64_t headwise_attn_peak_bytes(const Backend& be, const AttentionConfig& c,
                                 const UpipeSchedule& s, const HeadCore& core, int ranks) {
  const int64_t sl = c.seq_len / ranks, n = sl * s.ranks, d = c.head_dim, dm = c.model_dim();
  const int64_t md = int64_t(s.m) * d, rd = int64_t(s.kv_per_rank) * d;
  const int64_t pd = s.replicated() ? d : rd;  // rows of Wk/Wv one projection GEMM produces
  const DType t = c.dtype, f32 = DType::kF32;
  auto ws = [&](int64_t m_, int64_t n_, int64_t k_, DType a_, DType b_, DType c_) {
    return gemm_workspace_bytes(be, m_, n_, k_, a_, b_, c_);
  };
  // Largest transient: the attention core (its largest call) or a bf16 GEMM staging buffer.
  int64_t core_f = 0, core_b = 0;
  for (int stage = 0; stage < s.stages(); ++stage)
    for (const HeadRun& r : head_runs(s, stage)) {
      core_f = std::max(core_f, core.forward_bytes(r.nh, r.nk));
      core_b = std::max(core_b, core.backward_bytes(r.nh, r.nk));
    }
  // Projections: the GEMM into a staging block, then QK-norm in place.
  const int64_t norm = c.qk_norm ? rmsnorm_workspace_bytes(be, d) : 0;
  const int64_t proj = std::max({ws(sl, md, dm, t, t, t), ws(sl, pd, dm, t, t, t), norm});
  const int64_t ws_fwd = std::max({core_f, proj, ws(sl, dm, md, t, t, f32)});
  const int64_t ws_bwd = std::max(
      {core_f, core_b, proj, project_do_bytes(be, c, s, sl), accumulate_dwo_bytes(be, c, s, sl),
       return_q_grads_bytes(be, c, s, sl), return_kv_grads_bytes(be, c, s, sl, f32)});
  const int64_t kv = 2 * mat_bytes(n, rd, t), lse = mat_bytes(s.m, n, f32);
  // fp32 accumulator of y / dx unless they are fp32 themselves.
  const int64_t acc = FpAccumulator::bytes(sl, dm, c.out_dtype());
  const int64_t fwd = kv + n * md * dtype_size(t) + 2 * mat_bytes(n, md, t) + lse + acc + ws_fwd;
  const int64_t bwd = kv + 2 * mat_bytes(n, rd, f32) + n * md * 4 + 3 * mat_bytes(n, md, t) +
                      2 * lse + mat_bytes(n, md, f32) + acc + ws_bwd;
  return std::max(fwd, bwd);
}

int64_t HeadwiseAttention::attn_formula_bytes() const {
  return headwise_attn_peak_bytes(dev().backend(), cfg(), sch_, *core_, comm().size());
}

std::optional<CommStats> HeadwiseAttention::comm_expected() const {
  return headwise_comm_expected(cfg(), sch_, *core_, comm().size());
}

CommStats headwise_comm_expected(const AttentionConfig& c, const UpipeSchedule& s,
                                 const HeadCore& core, int ranks) {
  CommStats st;
  for (bool backward : {false, true}) {  // backward recomputes the forward's traffic
    add_headwise_pass_comm(st, c, s, c.seq_len / ranks, backward);
    for (int stage = 0; stage < s.stages(); ++stage)
      for (const HeadRun& r : head_runs(s, stage)) {  // the core's messages, if any
        core.add_forward_comm(st, r.nh, r.nk);
        if (backward) core.add_backward_comm(st, r.nh, r.nk);
      }
  }
  return st;
}

}  // namespace upipe
