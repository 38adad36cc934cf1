#include "attention/fpdt.h"

#include <fmt/format.h>

#include <algorithm>

#include "attention/fp_accumulator.h"
#include "backend/attention.h"
#include "backend/gemm.h"
#include "backend/rmsnorm.h"
#include "backend/tensor_ops.h"
#include "core/errors.h"

namespace upipe {

int fpdt_chunks(const AttentionConfig& cfg, int ranks) {
  const int64_t s = cfg.seq_len, c = ranks;
  if (cfg.chunks < 0)
    throw ConfigError(
        fmt::format("--chunks must be positive, or 0 for the default (the largest N <= {} dividing "
                    "seq-len / ranks); got {}",
                    kFpdtDefaultChunks, cfg.chunks));
  // The largest n <= want with s divisible by n C (0 when s is not divisible by C).
  auto largest_dividing = [&](int want) {
    int n = want;
    while (n > 0 && s % (n * c) != 0) --n;
    return n;
  };
  if (cfg.chunks == 0) {
    const int n = largest_dividing(kFpdtDefaultChunks);
    const int64_t nc = kFpdtDefaultChunks * c;
    if (n == 0)
      throw ConfigError(fmt::format(
          "seq-len ({}) must be divisible by the number of ranks ({}), and by N x ranks for N "
          "chunks; try --seq-len {}",
          s, c, (s / nc + 1) * nc));
    return n;
  }
  const int64_t nc = int64_t(cfg.chunks) * c;
  if (s % nc != 0) {
    const int fits = largest_dividing(cfg.chunks);
    throw ConfigError(fmt::format(
        "seq-len ({}) must be divisible by chunks x ranks ({} x {} = {}); try {}--seq-len {}", s,
        cfg.chunks, c, nc, fits > 0 ? fmt::format("--chunks {} or ", fits) : "",
        (s / nc + 1) * nc));
  }
  return cfg.chunks;
}

// One slot of the double buffer: a key chunk of the current KV set, fetched from the host, and
// in backward its dK/dV accumulators. n = S/N tokens, R resident KV heads.
struct ChunkedAttention::Slot {
  Tensor k, v;    // (n, R*d)          kv_resident
  Tensor dk, dv;  // (n, R*d) fp32     attn_grad (backward)
};

// The device buffers one forward or backward allocates once and reuses for every chunk and
// stage. n = S/N rows after the all-to-all, m query heads per rank per stage.
struct ChunkedAttention::Buffers {
  Slot slot[2];
  Buffer a2a;         // C blocks (S/(N C), m*d), fp32-sized in backward    a2a
  Tensor q;           // (n, m*d)                                          qkv
  Tensor acc;         // (n, m*d) fp32: online-softmax sum; dq in backward attn_out / attn_grad
  Tensor rmax, rsum;  // (m, n) fp32: running max and sum; rsum holds delta in backward
  Tensor o;           // (n, m*d)                                          attn_out
  Tensor lse;         // (m, n) fp32                                       attn_out
  Tensor dout;        // (n, m*d)                                          attn_grad (backward)
};
// Besides these, an FpAccumulator of the chunk's rows of y or dx when those are not fp32.

// This rank's head-sharded K/V columns of every chunk, in the host arena. Block (set t, chunk
// j), at index t N + j, is the (S/N, R*d) matrix of set t's resident heads over global chunk j.
struct ChunkedAttention::Host {
  Buffer k, v;    // sets * N blocks, block dtype          offload
  Buffer dk, dv;  // sets * N blocks, fp32 (backward)      offload
};

namespace {

void* host_block(const Buffer& buf, int64_t block_bytes, int chunks, int set, int chunk) {
  return static_cast<char*>(buf.data()) + (int64_t(set) * chunks + chunk) * block_bytes;
}

}  // namespace

ChunkedAttention::ChunkedAttention(const StrategyContext& ctx, std::string name, int head_chunk)
    : AttentionStrategy(ctx),
      name_(std::move(name)),
      sch_(make_upipe_schedule(ctx.cfg, ctx.comm.size(), head_chunk)),
      n_(fpdt_chunks(ctx.cfg, ctx.comm.size())) {
  for (const RowPositions::Run& run : layout().positions(ctx.comm.rank()).runs)
    chunk_pos_.push_back(RowPositions{{run}});
}

SeqLayout ChunkedAttention::layout() const {
  return SeqLayout{LayoutKind::kChunked, cfg().seq_len, comm().size(), n_};
}

ChunkedAttention::Buffers ChunkedAttention::allocate(bool backward) const {
  const AttentionConfig& c = cfg();
  const int64_t n = c.seq_len / n_, d = c.head_dim;
  const int64_t md = int64_t(sch_.m) * d, rd = int64_t(sch_.kv_per_rank) * d;
  const DType t = c.dtype, f32 = DType::kF32;
  Arena& mem = dev().mem();
  Buffers b;
  for (Slot& s : b.slot) {
    s.k = Tensor(mem, Tag::kKvResident, t, n, rd);
    s.v = Tensor(mem, Tag::kKvResident, t, n, rd);
    if (!backward) continue;
    s.dk = Tensor(mem, Tag::kAttnGrad, f32, n, rd);
    s.dv = Tensor(mem, Tag::kAttnGrad, f32, n, rd);
  }
  b.a2a = Buffer(mem, n * md * (backward ? 4 : dtype_size(t)), Tag::kA2a);
  b.q = Tensor(mem, Tag::kQkv, t, n, md);
  const Tag out = backward ? Tag::kAttnGrad : Tag::kAttnOut;
  b.acc = Tensor(mem, out, f32, n, md);
  b.rmax = Tensor(mem, Tag::kAttnOut, f32, sch_.m, n);
  b.rsum = Tensor(mem, out, f32, sch_.m, n);
  b.o = Tensor(mem, Tag::kAttnOut, t, n, md);
  b.lse = Tensor(mem, Tag::kAttnOut, f32, sch_.m, n);
  if (backward) b.dout = Tensor(mem, Tag::kAttnGrad, t, n, md);
  // y and dx collect one partial product per stage and rank (dx also the returning dK/dV); in
  // bf16 the chunk's rows are accumulated in fp32 and rounded once, as local's GEMMs do.
  return b;
}

ChunkedAttention::Host ChunkedAttention::allocate_host(bool backward) const {
  const AttentionConfig& c = cfg();
  const int64_t cols = int64_t(sch_.sets) * sch_.kv_per_rank * c.head_dim;
  Arena& host = dev().host();
  Host h;
  h.k = Buffer(host, mat_bytes(c.seq_len, cols, c.dtype), Tag::kOffload);
  h.v = Buffer(host, mat_bytes(c.seq_len, cols, c.dtype), Tag::kOffload);
  if (backward) {
    h.dk = Buffer(host, mat_bytes(c.seq_len, cols, DType::kF32), Tag::kOffload);
    h.dv = Buffer(host, mat_bytes(c.seq_len, cols, DType::kF32), Tag::kOffload);
  }
  return h;
}

// Projects chunk `chunk` of KV set `set` (xi: this rank's rows of the chunk), sends it
// head-sharded into slot 0 and offloads it.
void ChunkedAttention::offload_kv(const Mat& xi, const AttentionWeights& w, int set, int chunk,
                                  Buffers& b, const Host& h) {
  const Slot& s = b.slot[0];
  project_kv(env(), xi, chunk_pos_[size_t(chunk)], w, set, b.a2a, s.k, s.v);
  dev().copy(host_block(h.k, s.k.bytes(), n_, set, chunk), s.k.data(), s.k.bytes(),
             CopyKind::kDeviceToHost);
  dev().copy(host_block(h.v, s.v.bytes(), n_, set, chunk), s.v.data(), s.v.bytes(),
             CopyKind::kDeviceToHost);
}

void ChunkedAttention::fetch_kv(const Host& h, int set, int chunk, const Slot& s) {
  dev().copy(s.k.data(), host_block(h.k, s.k.bytes(), n_, set, chunk), s.k.bytes(),
             CopyKind::kHostToDevice);
  dev().copy(s.v.data(), host_block(h.v, s.v.bytes(), n_, set, chunk), s.v.bytes(),
             CopyKind::kHostToDevice);
}

void ChunkedAttention::fetch_grads(const Host& h, int set, int chunk, const Slot& s) {
  dev().copy(s.dk.data(), host_block(h.dk, s.dk.bytes(), n_, set, chunk), s.dk.bytes(),
             CopyKind::kHostToDevice);
  dev().copy(s.dv.data(), host_block(h.dv, s.dv.bytes(), n_, set, chunk), s.dv.bytes(),
             CopyKind::kHostToDevice);
}

void ChunkedAttention::store_grads(const Host& h, int set, int chunk, const Slot& s) {
  dev().copy(host_block(h.dk, s.dk.bytes(), n_, set, chunk), s.dk.data(), s.dk.bytes(),
             CopyKind::kDeviceToHost);
  dev().copy(host_block(h.dv, s.dv.bytes(), n_, set, chunk), s.dv.data(), s.dv.bytes(),
             CopyKind::kDeviceToHost);
}

// Query chunk qi of run r against key chunk kj held in kv, at their global positions.
AttnProblem ChunkedAttention::problem(const HeadRun& r, const Buffers& b, const Slot& kv, int qi,
                                      int kj) const {
  const int64_t n = cfg().seq_len / n_;
  AttnProblem p = run_problem(r, b.q, kv.k, kv.v, cfg().head_dim);
  p.q_pos0 = qi * n;
  p.k_pos0 = kj * n;
  return p;
}

// o, lse of the stage's query heads over query chunk i: online softmax over key chunks 0..i.
// Double buffer: chunk j+1 is fetched into the other slot before chunk j is used, which a device
// with asynchronous copies overlaps with the attention of chunk j (on CPU copies are memcpy).
void ChunkedAttention::attend_forward(int stage, int i, Buffers& b, const Host& h) {
  const int set = sch_.set_of(stage), d = cfg().head_dim;
  const std::vector<HeadRun> runs = head_runs(sch_, stage);
  attention_accumulate_init(dev(), b.acc, b.rmax, b.rsum);
  fetch_kv(h, set, 0, b.slot[0]);
  for (int j = 0; j <= i; ++j) {
    if (j < i) fetch_kv(h, set, j + 1, b.slot[(j + 1) % 2]);
    const Slot& kv = b.slot[j % 2];
    for (const HeadRun& r : runs)
      attention_forward_accumulate(
          dev(), problem(r, b, kv, i, j), b.acc.mat().cols_of(int64_t(r.q0) * d, int64_t(r.nh) * d),
          b.rmax.mat().rows_of(r.q0, r.nh), b.rsum.mat().rows_of(r.q0, r.nh));
  }
  attention_finalize(dev(), b.acc, b.rmax, b.rsum, d, b.o, b.lse);
}

// dq (in acc) of the stage's query heads over chunk i, and the dK/dV contributions of chunk i's
// queries to key chunks 0..i: each key chunk is fetched with its offloaded accumulators, double
// buffered as in forward, and the accumulators go back to the host.
void ChunkedAttention::attend_backward(int stage, int i, Buffers& b, const Host& h) {
  const int set = sch_.set_of(stage), d = cfg().head_dim;
  const std::vector<HeadRun> runs = head_runs(sch_, stage);
  // The last query chunk is processed first: its set's first stage is the first to touch each
  // key chunk's accumulators, which start from zero instead of the host.
  const bool first_touch = i == n_ - 1 && sch_.starts_set(stage);
  auto load = [&](int j, const Slot& slot) {
    fetch_kv(h, set, j, slot);
    if (first_touch) {
      zero(dev(), slot.dk);
      zero(dev(), slot.dv);
    } else {
      fetch_grads(h, set, j, slot);
    }
  };
  zero(dev(), b.acc);
  load(0, b.slot[0]);
  for (int j = 0; j <= i; ++j) {
    if (j < i) load(j + 1, b.slot[(j + 1) % 2]);
    const Slot& kv = b.slot[j % 2];
    for (const HeadRun& r : runs) {
      const int64_t qc = int64_t(r.q0) * d, qn = int64_t(r.nh) * d;
      const int64_t kc = int64_t(r.k0) * d, kn = int64_t(r.nk) * d;
      attention_backward(dev(), problem(r, b, kv, i, j), b.dout.mat().cols_of(qc, qn),
                         b.lse.mat().rows_of(r.q0, r.nh), b.rsum.mat().rows_of(r.q0, r.nh),
                         b.acc.mat().cols_of(qc, qn), kv.dk.mat().cols_of(kc, kn),
                         kv.dv.mat().cols_of(kc, kn));
    }
    store_grads(h, set, j, kv);
  }
}

void ChunkedAttention::forward(const Mat& x, const AttentionWeights& w, const Mat& y, float beta) {
  const AttentionConfig& c = cfg();
  const int64_t rows = x.rows / n_, md = int64_t(sch_.m) * c.head_dim;
  const DType t = c.dtype;
  Buffers b = allocate(false);
  const Host h = allocate_host(false);
  for (int i = 0; i < n_; ++i) {
    const Mat xi = x.rows_of(i * rows, rows);
    for (int set = 0; set < sch_.sets; ++set) offload_kv(xi, w, set, i, b, h);
    FpAccumulator yacc(dev(), y.rows_of(i * rows, rows), beta, Tag::kAttnOut);
    for (int s = 0; s < sch_.stages(); ++s) {
      project_q(env(), xi, chunk_pos_[size_t(i)], w, s, b.a2a, b.q);
      attend_forward(s, i, b, h);
      comm().all_to_all(b.o.data(), b.a2a.data(), mat_bytes(rows, md, t));
      accumulate_out(env(), w.wo, s, b.a2a, yacc.target(), s == 0 ? yacc.beta() : 1.0f);
    }
    yacc.finish();
  }
}

void ChunkedAttention::backward(const Mat& x, const Mat& dy, const AttentionWeights& w,
                                const Mat& dx, const AttentionGrads& g, float dx_beta,
                                float dw_beta) {
  const AttentionConfig& c = cfg();
  const int64_t rows = x.rows / n_, d = c.head_dim, md = int64_t(sch_.m) * d;
  const DType t = c.dtype, f32 = DType::kF32;
  Buffers b = allocate(true);
  const Host h = allocate_host(true);
  if (c.qk_norm && dw_beta == 0.0f) {
    zero(dev(), g.wqn);
    zero(dev(), g.wkn);
  }
  // Query chunk i reads key chunks 0..i, so all K/V are offloaded before the last chunk starts.
  for (int i = 0; i < n_; ++i)
    for (int set = 0; set < sch_.sets; ++set)
      offload_kv(x.rows_of(i * rows, rows), w, set, i, b, h);
  for (int i = n_ - 1; i >= 0; --i) {
    const Mat xi = x.rows_of(i * rows, rows), dyi = dy.rows_of(i * rows, rows);
    const RowPositions& pos = chunk_pos_[size_t(i)];
    FpAccumulator dxacc(dev(), dx.rows_of(i * rows, rows), dx_beta, Tag::kAttnGrad);
    const float gbeta = i == n_ - 1 ? dw_beta : 1.0f;  // weight gradients sum over chunks
    for (int s = 0; s < sch_.stages(); ++s) {
      project_q(env(), xi, pos, w, s, b.a2a, b.q);
      attend_forward(s, i, b, h);
      // do = dy Wo[:, stage heads], projected into the all-to-all layout and sent head-sharded.
      project_do(env(), dyi, w.wo, s, b.a2a);
      comm().all_to_all(b.a2a.data(), b.dout.data(), mat_bytes(rows, md, t));
      // dWo[:, stage heads] += dy^T o needs o back in sequence layout.
      comm().all_to_all(b.o.data(), b.a2a.data(), mat_bytes(rows, md, t));
      accumulate_dwo(env(), dyi, s, b.a2a, g.wo, gbeta);
      attention_delta(dev(), b.o, b.dout, int(d), b.rsum);
      attend_backward(s, i, b, h);
      // dq back to sequence layout: dx += dq Wq[stage rows]; dWq[stage rows].
      comm().all_to_all(b.acc.data(), b.a2a.data(), mat_bytes(rows, md, f32));
      return_q_grads(env(), xi, pos, w, s, b.a2a, dxacc.target(), g, s == 0 ? dxacc.beta() : 1.0f,
                     gbeta);
    }
    // Every query chunk >= i is done, so chunk i's dK/dV are complete: return them now.
    for (int set = 0; set < sch_.sets; ++set) {
      fetch_grads(h, set, i, b.slot[0]);
      return_kv_grads(env(), xi, pos, w, set, b.slot[0].dk, b.slot[0].dv, b.a2a, dxacc.target(), g,
                      gbeta);
    }
    dxacc.finish();
  }
}

int64_t fpdt_attn_peak_bytes(const Backend& be, const AttentionConfig& c, const UpipeSchedule& s,
                             int chunks) {
  const int64_t n = c.seq_len / chunks, rows = n / s.ranks, d = c.head_dim, dm = c.model_dim();
  const int64_t md = int64_t(s.m) * d, rd = int64_t(s.kv_per_rank) * d;
  const int64_t pd = s.replicated() ? d : rd;  // rows of Wk/Wv one projection GEMM produces
  const DType t = c.dtype, f32 = DType::kF32;
  auto ws = [&](int64_t m_, int64_t n_, int64_t k_, DType a_, DType b_, DType c_) {
    return gemm_workspace_bytes(be, m_, n_, k_, a_, b_, c_);
  };
  const int64_t attn_f = attention_fwd_workspace_bytes(be, int(d), t),
                attn_b = attention_bwd_workspace_bytes(be, int(d), t);
  // Largest transient: the attention kernel's tiles, a GEMM or QK-norm workspace, the QK-norm's
  // recomputed pre-norm block.
  const int64_t norm = c.qk_norm ? rmsnorm_workspace_bytes(be, d) : 0;
  const int64_t proj = std::max({ws(rows, md, dm, t, t, t), ws(rows, pd, dm, t, t, t), norm});
  const int64_t ws_fwd = std::max({attn_f, proj, ws(rows, dm, md, t, t, f32)});
  const int64_t ws_bwd = std::max(
      {attn_f, attn_b, proj, project_do_bytes(be, c, s, rows), accumulate_dwo_bytes(be, c, s, rows),
       return_q_grads_bytes(be, c, s, rows), return_kv_grads_bytes(be, c, s, rows, f32)});
  const int64_t slots = 4 * mat_bytes(n, rd, t);  // 2 slots x (k, v)
  const int64_t stat = mat_bytes(s.m, n, f32);    // one (m, n) row statistic
  // q, o; the fp32 accumulator (dq in backward); running max, sum (delta), lse.
  const int64_t stage = 2 * mat_bytes(n, md, t) + mat_bytes(n, md, f32) + 3 * stat;
  const int64_t out_acc = FpAccumulator::bytes(rows, dm, c.out_dtype());
  const int64_t fwd = slots + n * md * dtype_size(t) + stage + out_acc + ws_fwd;
  const int64_t bwd = slots + 4 * mat_bytes(n, rd, f32) + n * md * 4 + stage + mat_bytes(n, md, t) +
                      out_acc + ws_bwd;
  return std::max(fwd, bwd);
}

int64_t fpdt_host_peak_bytes(const AttentionConfig& c, const UpipeSchedule& s) {
  const int64_t cols = int64_t(s.sets) * s.kv_per_rank * c.head_dim;
  return 2 * mat_bytes(c.seq_len, cols, c.dtype) + 2 * mat_bytes(c.seq_len, cols, DType::kF32);
}

CommStats fpdt_comm_expected(const AttentionConfig& c, const UpipeSchedule& s, int chunks) {
  CommStats st;
  const int64_t rows = c.seq_len / chunks / s.ranks;
  for (bool backward : {false, true})  // backward recomputes the forward's traffic
    for (int i = 0; i < chunks; ++i) add_headwise_pass_comm(st, c, s, rows, backward);
  return st;
}

int64_t ChunkedAttention::attn_formula_bytes() const {
  return fpdt_attn_peak_bytes(dev().backend(), cfg(), sch_, n_);
}

int64_t ChunkedAttention::host_formula_bytes() const {
  return fpdt_host_peak_bytes(cfg(), sch_);
}

std::optional<CommStats> ChunkedAttention::comm_expected() const {
  return fpdt_comm_expected(cfg(), sch_, n_);
}

}  // namespace upipe
