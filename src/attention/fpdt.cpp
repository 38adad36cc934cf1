#include "attention/fpdt.h"

#include <fmt/format.h>

#include <algorithm>

#include "core/errors.h"
#include "kernels/attention.h"
#include "kernels/attention_tiles.h"
#include "kernels/gemm.h"
#include "kernels/tensor_ops.h"

namespace upipe {

int fpdt_chunks(const AttentionConfig& cfg, int ranks) {
  const int64_t s = cfg.seq_len, c = ranks;
  if (cfg.chunks < 0)
    throw ConfigError(
        fmt::format("--chunks must be positive, or 0 for the default (the largest N <= {} dividing "
                    "seq-len / ranks); got {}",
                    kFpdtDefaultChunks, cfg.chunks));
  // The largest n <= want with s divisible by n C (0 when s is not divisible by C): the
  // largest divisor of m = S/C up to want, counting down from a small want, else from the
  // divisor pairs (i, m/i) with i <= sqrt(m), so a huge --chunks is refused at once.
  auto largest_dividing = [&](int want) {
    if (s % c != 0) return 0;
    const int64_t m = s / c;
    if (int64_t(want) * want <= m) {
      int n = want;
      while (n > 1 && m % n != 0) --n;
      return n;
    }
    int64_t best = 1;
    for (int64_t i = 1; i * i <= m; ++i) {
      if (m % i != 0) continue;
      if (i <= want) best = std::max(best, i);
      if (m / i <= want) best = std::max(best, m / i);
    }
    return int(best);
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
  if (cfg.chunks > s / c) {
    const int fits = largest_dividing(int(std::min<int64_t>(cfg.chunks, s / c)));
    throw ConfigError(fmt::format(
        "--chunks ({}) must be at most seq-len / ranks ({} / {}); try {}", cfg.chunks, s, c,
        fits > 0 ? fmt::format("--chunks {}", fits) : "a --seq-len divisible by the ranks"));
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
  Tensor out_acc;     // (S/(N C), D) fp32, bf16 only: the chunk's y or dx attn_out / attn_grad
};

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
  const int64_t n = c.seq_len / n_, rows = n / sch_.ranks, d = c.head_dim;
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
  if (t != f32) b.out_acc = Tensor(mem, out, f32, rows, c.model_dim());
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
    dev().fill_zero(h.dk.data(), h.dk.bytes());
    dev().fill_zero(h.dv.data(), h.dv.bytes());
  }
  return h;
}

// Projects chunk `chunk` of KV set `set` (xi: this rank's rows of the chunk), sends it
// head-sharded into slot 0 and offloads it.
void ChunkedAttention::offload_kv(const Mat& xi, const AttentionWeights& w, int set, int chunk,
                                  Buffers& b, const Host& h) {
  const Slot& s = b.slot[0];
  project_kv(env(), xi, chunk_pos_[size_t(chunk)], w.wk, w.wv, set, b.a2a, s.k, s.v);
  dev().copy(host_block(h.k, s.k.bytes(), n_, set, chunk), s.k.data(), s.k.bytes());
  dev().copy(host_block(h.v, s.v.bytes(), n_, set, chunk), s.v.data(), s.v.bytes());
}

void ChunkedAttention::fetch_kv(const Host& h, int set, int chunk, const Slot& s) {
  dev().copy(s.k.data(), host_block(h.k, s.k.bytes(), n_, set, chunk), s.k.bytes());
  dev().copy(s.v.data(), host_block(h.v, s.v.bytes(), n_, set, chunk), s.v.bytes());
}

void ChunkedAttention::fetch_grads(const Host& h, int set, int chunk, const Slot& s) {
  dev().copy(s.dk.data(), host_block(h.dk, s.dk.bytes(), n_, set, chunk), s.dk.bytes());
  dev().copy(s.dv.data(), host_block(h.dv, s.dv.bytes(), n_, set, chunk), s.dv.bytes());
}

void ChunkedAttention::store_grads(const Host& h, int set, int chunk, const Slot& s) {
  dev().copy(host_block(h.dk, s.dk.bytes(), n_, set, chunk), s.dk.data(), s.dk.bytes());
  dev().copy(host_block(h.dv, s.dv.bytes(), n_, set, chunk), s.dv.data(), s.dv.bytes());
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
  zero(dev(), b.acc);
  fetch_kv(h, set, 0, b.slot[0]);
  fetch_grads(h, set, 0, b.slot[0]);
  for (int j = 0; j <= i; ++j) {
    if (j < i) {
      fetch_kv(h, set, j + 1, b.slot[(j + 1) % 2]);
      fetch_grads(h, set, j + 1, b.slot[(j + 1) % 2]);
    }
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

void ChunkedAttention::forward(const Mat& x, const AttentionWeights& w, const Mat& y) {
  const AttentionConfig& c = cfg();
  const int64_t rows = x.rows / n_, d = c.head_dim, md = int64_t(sch_.m) * d;
  const DType t = c.dtype;
  Buffers b = allocate(false);
  const Host h = allocate_host(false);
  for (int i = 0; i < n_; ++i) {
    const Mat xi = x.rows_of(i * rows, rows);
    for (int set = 0; set < sch_.sets; ++set) offload_kv(xi, w, set, i, b, h);
    const Mat yi = t == DType::kF32 ? y.rows_of(i * rows, rows) : b.out_acc.mat();
    for (int s = 0; s < sch_.stages(); ++s) {
      project_q(env(), xi, chunk_pos_[size_t(i)], w.wq, s, b.a2a, b.q);
      attend_forward(s, i, b, h);
      comm().all_to_all(b.o.data(), b.a2a.data(), mat_bytes(rows, md, t));
      for (int j = 0; j < sch_.ranks; ++j) {
        const Mat wo = w.wo.cols_of(int64_t(sch_.q_head(s, j)) * d, md);
        gemm(dev(), a2a_block(b.a2a, t, rows, md, j), false, wo, true, yi, 1.0f,
             s == 0 && j == 0 ? 0.0f : 1.0f);
      }
    }
    if (t != DType::kF32) copy(dev(), y.rows_of(i * rows, rows), b.out_acc);
  }
}

void ChunkedAttention::backward(const Mat& x, const Mat& dy, const AttentionWeights& w,
                                const Mat& dx, const AttentionGrads& g) {
  const AttentionConfig& c = cfg();
  const int64_t rows = x.rows / n_, d = c.head_dim, md = int64_t(sch_.m) * d;
  const DType t = c.dtype, f32 = DType::kF32;
  Buffers b = allocate(true);
  const Host h = allocate_host(true);
  // Query chunk i reads key chunks 0..i, so all K/V are offloaded before the last chunk starts.
  for (int i = 0; i < n_; ++i)
    for (int set = 0; set < sch_.sets; ++set)
      offload_kv(x.rows_of(i * rows, rows), w, set, i, b, h);
  for (int i = n_ - 1; i >= 0; --i) {
    const Mat xi = x.rows_of(i * rows, rows), dyi = dy.rows_of(i * rows, rows);
    const RowPositions& pos = chunk_pos_[size_t(i)];
    const Mat dxi = t == f32 ? dx.rows_of(i * rows, rows) : b.out_acc.mat();
    const float gbeta = i == n_ - 1 ? 0.0f : 1.0f;  // weight gradients sum over chunks
    for (int s = 0; s < sch_.stages(); ++s) {
      project_q(env(), xi, pos, w.wq, s, b.a2a, b.q);
      attend_forward(s, i, b, h);
      // do = dy Wo[:, stage heads], projected into the all-to-all layout and sent head-sharded.
      project_do(env(), dyi, w.wo, s, b.a2a);
      comm().all_to_all(b.a2a.data(), b.dout.data(), mat_bytes(rows, md, t));
      // dWo[:, stage heads] += dy^T o needs o back in sequence layout.
      comm().all_to_all(b.o.data(), b.a2a.data(), mat_bytes(rows, md, t));
      accumulate_dwo(env(), dyi, s, b.a2a, g.wo, gbeta);
      attention_delta(dev(), b.o, b.dout, int(d), b.rsum);
      attend_backward(s, i, b, h);
      // dq back to sequence layout; RoPE backward; dx += dq Wq[stage rows]; dWq[stage rows].
      comm().all_to_all(b.acc.data(), b.a2a.data(), mat_bytes(rows, md, f32));
      for (int j = 0; j < sch_.ranks; ++j) {
        const Mat blk = a2a_block(b.a2a, f32, rows, md, j);
        rope_backward(dev(), blk, int(d), pos, c.rope_theta);
        const int64_t row0 = int64_t(sch_.q_head(s, j)) * d;
        gemm(dev(), blk, false, w.wq.rows_of(row0, md), false, dxi, 1.0f,
             s == 0 && j == 0 ? 0.0f : 1.0f);
        gemm(dev(), blk, true, xi, false, g.wq.rows_of(row0, md), 1.0f, gbeta);
      }
    }
    // Every query chunk >= i is done, so chunk i's dK/dV are complete: return them now.
    for (int set = 0; set < sch_.sets; ++set) {
      fetch_grads(h, set, i, b.slot[0]);
      return_kv_grads(env(), xi, pos, w.wk, w.wv, set, b.slot[0].dk, b.slot[0].dv, b.a2a, dxi, g.wk,
                      g.wv, gbeta);
    }
    if (t != f32) copy(dev(), dx.rows_of(i * rows, rows), b.out_acc);
  }
}

int64_t fpdt_attn_peak_bytes(const AttentionConfig& c, const UpipeSchedule& s, int chunks) {
  const int64_t n = c.seq_len / chunks, rows = n / s.ranks, d = c.head_dim, dm = c.model_dim();
  const int64_t md = int64_t(s.m) * d, rd = int64_t(s.kv_per_rank) * d;
  const int64_t pd = s.replicated() ? d : rd;  // rows of Wk/Wv one projection GEMM produces
  const DType t = c.dtype, f32 = DType::kF32;
  auto ws = gemm_workspace_bytes;
  const int64_t attn_f = attn_fwd_workspace_bytes(d, t), attn_b = attn_bwd_workspace_bytes(d, t);
  // Largest transient: the attention kernel's tiles or a bf16 GEMM staging buffer.
  const int64_t ws_fwd = std::max(
      {attn_f, ws(rows, md, dm, t, t, t), ws(rows, pd, dm, t, t, t), ws(rows, dm, md, t, t, f32)});
  const int64_t ws_bwd =
      std::max({attn_f, attn_b, ws(rows, md, dm, t, t, t), ws(rows, pd, dm, t, t, t),
                project_do_bytes(c, s, rows), accumulate_dwo_bytes(c, s, rows),
                ws(rows, dm, md, f32, t, f32), ws(md, dm, rows, f32, t, f32),
                ws(rows, dm, pd, f32, t, f32), ws(pd, dm, rows, f32, t, f32)});
  const int64_t slots = 4 * mat_bytes(n, rd, t);  // 2 slots x (k, v)
  const int64_t stat = mat_bytes(s.m, n, f32);    // one (m, n) row statistic
  // q, o; the fp32 accumulator (dq in backward); running max, sum (delta), lse.
  const int64_t stage = 2 * mat_bytes(n, md, t) + mat_bytes(n, md, f32) + 3 * stat;
  const int64_t out_acc = t == f32 ? 0 : mat_bytes(rows, dm, f32);
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
  return fpdt_attn_peak_bytes(cfg(), sch_, n_);
}

int64_t ChunkedAttention::host_formula_bytes() const {
  return fpdt_host_peak_bytes(cfg(), sch_);
}

std::optional<CommStats> ChunkedAttention::comm_expected() const {
  return fpdt_comm_expected(cfg(), sch_, n_);
}

}  // namespace upipe
