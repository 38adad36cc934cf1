#include "attention/headwise.h"

#include <fmt/format.h>

#include <algorithm>

#include "attention/fp_accumulator.h"
#include "backend/gemm.h"
#include "backend/rmsnorm.h"
#include "backend/tensor_ops.h"
#include "core/errors.h"

namespace upipe {

int fpdt_chunks(const AttentionConfig& cfg, int ranks) {
  const int64_t s = cfg.seq_len, c = ranks;
  if (cfg.knobs.chunks < 0)
    throw ConfigError(
        fmt::format("{} must be positive, or 0 for the default (the largest N <= {} dividing "
                    "seq-len / ranks); got {}",
                    setting_ref("parallel.chunks"), kFpdtDefaultChunks, cfg.knobs.chunks));
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
  if (cfg.knobs.chunks == 0) {
    const int n = largest_dividing(kFpdtDefaultChunks);
    const int64_t nc = kFpdtDefaultChunks * c;
    if (n == 0)
      throw ConfigError(fmt::format(
          "{} ({}) must be divisible by the number of ranks ({}), and by N x ranks for N "
          "chunks; try {}",
          setting_ref("train.seq_len"), s, c, seq_len_choices(s, nc)));
    return n;
  }
  if (cfg.knobs.chunks > s / c) {
    const int fits = largest_dividing(int(std::min<int64_t>(cfg.knobs.chunks, s / c)));
    throw ConfigError(fmt::format(
        "{} ({}) must be at most seq-len / ranks ({} / {}); try {}", setting_ref("parallel.chunks"),
        cfg.knobs.chunks, s, c,
        fits > 0 ? setting_value("parallel.chunks", fits)
                 : fmt::format("a {} divisible by the ranks", setting_ref("train.seq_len"))));
  }
  const int64_t nc = int64_t(cfg.knobs.chunks) * c;
  if (s % nc != 0) {
    const int fits = largest_dividing(cfg.knobs.chunks);
    throw ConfigError(fmt::format(
        "{} ({}) must be divisible by chunks x ranks ({} x {} = {}); try {}{}",
        setting_ref("train.seq_len"), s, cfg.knobs.chunks, c, nc,
        fits > 0 ? setting_value("parallel.chunks", fits) + " or " : "", seq_len_choices(s, nc)));
  }
  return cfg.knobs.chunks;
}

// K/V of one key chunk of the current set, and in backward their dK/dV accumulators. n = C x
// (rows per rank of a chunk) tokens, R resident KV heads. N = 1 has one slot, the resident set;
// N > 1 two, the double buffer of chunks fetched from the host.
struct HeadwiseAttention::Slot {
  Tensor k, v;    // (n, R*d)          kv_resident
  Tensor dk, dv;  // (n, R*d) fp32     attn_grad (backward)
  // N > 1: the newest asynchronous copy into or out of the slot (offload, fetch); an op waits on
  // it (ready) before it touches the slot. A wait covers every copy issued up to its ticket, so
  // that covers every earlier copy of the slot.
  CopyTicket pending;
};

// The device buffers one forward or backward allocates once and reuses for every chunk and
// stage; m query heads per rank per stage. With stage overlap (overlapped_) q, o and do come in
// two, stage s using copy s % 2 (cur), and the next stage's all-to-alls have staging of their
// own.
struct HeadwiseAttention::Buffers {
  Slot slot[2];
  Buffer a2a;  // C blocks (rows, m*d), fp32-sized in backward            a2a
  // Overlap: forward, the o all-to-all's receive staging (stage s-1's is in flight during stage
  // s's attention); backward, the next stage's q and do send staging.      a2a
  Buffer a2a_o, stage_q, stage_do;
  Tensor qs[2], os[2];  // (n, m*d)                                        qkv, attn_out
  Tensor lse;           // (m, n) fp32                                     attn_out
  // fp32 (n, m*d): the online-softmax sum (N > 1); dq in backward.        attn_out / attn_grad
  Tensor acc;
  Tensor rmax, rsum;  // (m, n) fp32: running max and sum (N > 1); rsum holds delta in backward
  Tensor douts[2];    // (n, m*d)                                          attn_grad (backward)
  Tensor delta;       // (m, n) fp32 (N = 1, backward)                     attn_grad
  DocMask mask;       // packed documents: the core's views' spans           docs
  // KV-set overlap (kv_overlapped_): the next set's k, v, received during the current set's last
  // stage and swapped into slot 0 at the set's start, and the K and V send staging.
  Slot next;           // kv_resident
  Buffer kv_stage[2];  // a2a
  int cur = 0;         // which copy of q, o, do the current stage uses
  int o_copies = 1;    // 2 in an overlapped forward (backward sends o and waits in one stage)
  const Tensor& q() const { return qs[cur]; }
  const Tensor& o() const { return os[cur % o_copies]; }
  const Tensor& dout() const { return douts[cur]; }
  const Mat& delta_of(int n) const { return n > 1 ? rsum.mat() : delta.mat(); }
};
// Besides these, an FpAccumulator of the chunk's rows of y or dx when those are not fp32.

// This rank's head-sharded K/V columns of every chunk, in the host arena (N > 1). Block (set t,
// chunk j), at index t N + j, is the (n, R*d) matrix of set t's resident heads over chunk j.
struct HeadwiseAttention::Host {
  Buffer k, v;    // sets * N blocks, block dtype          offload
  Buffer dk, dv;  // sets * N blocks, fp32 (backward)      offload
};

namespace {

void* host_block(const Buffer& buf, int64_t block_bytes, int chunks, int set, int chunk) {
  return static_cast<char*>(buf.data()) + (int64_t(set) * chunks + chunk) * block_bytes;
}

SeqLayout own_layout(const StrategyContext& ctx, int chunks) {
  const AttentionConfig& c = ctx.cfg;
  return chunks > 1 ? SeqLayout{LayoutKind::kChunked, c.seq_len, ctx.comm.size(), chunks}
                    : SeqLayout{LayoutKind::kContiguous, c.seq_len, ctx.comm.size(), 1};
}

}  // namespace

HeadwiseAttention::HeadwiseAttention(const StrategyContext& ctx, int stage_heads, int chunks)
    : AttentionStrategy(ctx),
      a2a_(&ctx.comm),
      base_layout_(own_layout(ctx, chunks)),
      sch_(make_upipe_schedule(ctx.cfg, ctx.comm.size(), stage_heads)),
      n_(chunks),
      overlapped_(ctx.cfg.knobs.overlap && sch_.stages() > 1),
      kv_overlapped_(kv_set_overlap(ctx.cfg, sch_)),
      core_(std::make_unique<LocalCore>(ctx.dev, ctx.cfg.head_dim, ctx.cfg.dtype)) {
  documents_changed();
}

HeadwiseAttention::HeadwiseAttention(const StrategyContext& ctx, int stage_heads,
                                     UlyssesGroup group)
    : AttentionStrategy(ctx),
      own_a2a_(std::move(group.comm)),
      a2a_(own_a2a_.get()),
      base_layout_(group.layout),
      sch_(make_upipe_schedule(ctx.cfg, a2a_->size(), stage_heads)),
      n_(1),
      overlapped_(ctx.cfg.knobs.overlap && sch_.stages() > 1),
      kv_overlapped_(kv_set_overlap(ctx.cfg, sch_)),
      core_(std::move(group.core)) {
  documents_changed();
}

// The layout (the grid's depends on the documents), this rank's rows per chunk (N > 1: one run
// of the chunked layout each) and their RoPE positions.
void HeadwiseAttention::documents_changed() {
  layout_ = with_documents(base_layout_, docs_);
  core_->set_documents(docs_);
  const RowPositions pos = layout_.positions(comm().rank());
  chunk_pos_.clear();
  if (n_ == 1)
    chunk_pos_.push_back(pos);
  else
    for (const RowPositions::Run& run : pos.runs) chunk_pos_.push_back(RowPositions{{run}});
  rope_pos_.clear();
  for (const RowPositions& p : chunk_pos_) rope_pos_.push_back(rope_positions(p));
}

int HeadwiseAttention::first_key_chunk(int i) const {
  if (!docs_) return 0;
  const int64_t chunk = cfg().seq_len / n_;
  return int(docs_->start(docs_->doc_of(i * chunk)) / chunk);
}

int HeadwiseAttention::last_query_chunk(int j) const {
  for (int i = n_ - 1; i > j; --i)
    if (first_key_chunk(i) <= j) return i;
  return j;
}

// Data movement keeps local's reduction order up to a few sums, except where partial results
// are combined: online softmax over key chunks or a ring core's merge, and K < C, where the
// replicas' dK/dV partial sums are added in another order than local's single accumulation.
AttentionStrategy::ErrorClass HeadwiseAttention::error_class() const {
  if (n_ > 1 || core_->merges_partials()) return ErrorClass::kMerge;
  return sch_.replicated() ? ErrorClass::kReplicaSums : ErrorClass::kDataMovement;
}

HeadwiseAttention::Buffers HeadwiseAttention::allocate(bool backward) const {
  const AttentionConfig& c = cfg();
  const int64_t n = c.seq_len / comm().size() / n_ * sch_.ranks, d = c.head_dim;
  const int64_t md = int64_t(sch_.m) * d, rd = int64_t(sch_.kv_per_rank) * d;
  const DType t = c.dtype, f32 = DType::kF32;
  Arena& mem = dev().mem();
  Buffers b;
  for (int i = 0; i < (n_ > 1 ? 2 : 1); ++i) {
    Slot& s = b.slot[i];
    s.k = Tensor(mem, Tag::kKvResident, t, n, rd);
    s.v = Tensor(mem, Tag::kKvResident, t, n, rd);
    if (!backward) continue;
    s.dk = Tensor(mem, Tag::kAttnGrad, f32, n, rd);
    s.dv = Tensor(mem, Tag::kAttnGrad, f32, n, rd);
  }
  b.a2a = Buffer(mem, n * md * (backward ? 4 : dtype_size(t)), Tag::kA2a);
  const int copies = overlapped_ ? 2 : 1;
  for (int i = 0; i < copies; ++i) b.qs[i] = Tensor(mem, Tag::kQkv, t, n, md);
  b.o_copies = overlapped_ && !backward ? 2 : 1;
  for (int i = 0; i < b.o_copies; ++i) b.os[i] = Tensor(mem, Tag::kAttnOut, t, n, md);
  if (overlapped_ && !backward) b.a2a_o = Buffer(mem, mat_bytes(n, md, t), Tag::kA2a);
  if (overlapped_ && backward) {
    b.stage_q = Buffer(mem, mat_bytes(n, md, t), Tag::kA2a);
    b.stage_do = Buffer(mem, mat_bytes(n, md, t), Tag::kA2a);
  }
  b.lse = Tensor(mem, Tag::kAttnOut, f32, sch_.m, n);
  const Tag out = backward ? Tag::kAttnGrad : Tag::kAttnOut;
  if (backward || n_ > 1) b.acc = Tensor(mem, out, f32, n, md);
  if (n_ > 1) {
    b.rmax = Tensor(mem, Tag::kAttnOut, f32, sch_.m, n);
    b.rsum = Tensor(mem, out, f32, sch_.m, n);
  }
  if (backward)
    for (int i = 0; i < copies; ++i) b.douts[i] = Tensor(mem, Tag::kAttnGrad, t, n, md);
  if (backward && n_ == 1) b.delta = Tensor(mem, Tag::kAttnGrad, f32, sch_.m, n);
  if (docs_) b.mask = DocMask(dev(), *docs_, core_->mask_views(*docs_));
  if (kv_overlapped_ && (n_ == 1 || !backward)) {  // N > 1: the forward's projections only
    b.next.k = Tensor(mem, Tag::kKvResident, t, n, rd);
    b.next.v = Tensor(mem, Tag::kKvResident, t, n, rd);
    for (Buffer& s : b.kv_stage)
      s = Buffer(mem, kv_stage_bytes(c, sch_, n / sch_.ranks), Tag::kA2a);
  }
  return b;
}

HeadwiseAttention::Host HeadwiseAttention::allocate_host(bool backward) const {
  Host h;
  if (n_ == 1) return h;
  const AttentionConfig& c = cfg();
  const int64_t cols = int64_t(sch_.sets) * sch_.kv_per_rank * c.head_dim;
  Arena& host = dev().host();
  h.k = Buffer(host, mat_bytes(c.seq_len, cols, c.dtype), Tag::kOffload);
  h.v = Buffer(host, mat_bytes(c.seq_len, cols, c.dtype), Tag::kOffload);
  if (backward) {
    h.dk = Buffer(host, mat_bytes(c.seq_len, cols, DType::kF32), Tag::kOffload);
    h.dv = Buffer(host, mat_bytes(c.seq_len, cols, DType::kF32), Tag::kOffload);
  }
  return h;
}

void HeadwiseAttention::ready(Slot& s) {
  dev().wait(s.pending);
  s.pending = CopyTicket{};
}

void HeadwiseAttention::project_set(const Mat& x, const AttentionWeights& w, int set, int chunk,
                                    Buffers& b, const Host& h) {
  const int64_t rows = x.rows / n_;
  // N > 1: chunks alternate between the slots, so one projects while the last one's offload runs.
  Slot& s = b.slot[n_ > 1 ? chunk % 2 : 0];
  ready(s);
  project_kv(env(), x.rows_of(chunk * rows, rows), rope_pos_[size_t(chunk)], w, set, b.a2a, s.k,
             s.v);
  if (n_ > 1) store_kv(h, set, chunk, s);
}

std::vector<std::unique_ptr<Work>> HeadwiseAttention::start_next_set(const Mat& xi, int chunk,
                                                                     const AttentionWeights& w,
                                                                     int set, Buffers& b) {
  std::vector<std::unique_ptr<Work>> works;
  const int64_t bytes = mat_bytes(xi.rows, int64_t(sch_.kv_per_rank) * cfg().head_dim, cfg().dtype);
  ready(b.next);  // N > 1: its last offload is done before it is received into again
  for (int pass = 0; pass < 2; ++pass) {
    project_kv_blocks(env(), xi, rope_pos_[size_t(chunk)], w, set, pass, b.kv_stage[pass]);
    works.push_back(a2a_comm().iall_to_all(b.kv_stage[pass].data(),
                                           (pass == 0 ? b.next.k : b.next.v).data(), bytes));
  }
  return works;
}

void HeadwiseAttention::take_next_set(std::vector<std::unique_ptr<Work>>& works, int set, int chunk,
                                      Buffers& b, const Host& h) {
  for (auto& wk : works) wk->wait();
  works.clear();
  if (n_ == 1) {  // the resident set
    std::swap(b.slot[0].k, b.next.k);
    std::swap(b.slot[0].v, b.next.v);
    return;
  }
  store_kv(h, set, chunk, b.next);  // N > 1: offloaded as project_set's; fetched back to attend
}

void HeadwiseAttention::store_kv(const Host& h, int set, int chunk, Slot& s) {
  dev().copy_async(host_block(h.k, s.k.bytes(), n_, set, chunk), s.k.data(), s.k.bytes(),
                   CopyKind::kDeviceToHost);
  s.pending = dev().copy_async(host_block(h.v, s.v.bytes(), n_, set, chunk), s.v.data(),
                               s.v.bytes(), CopyKind::kDeviceToHost);
}

void HeadwiseAttention::fetch_kv(const Host& h, int set, int chunk, Slot& s) {
  dev().copy_async(s.k.data(), host_block(h.k, s.k.bytes(), n_, set, chunk), s.k.bytes(),
                   CopyKind::kHostToDevice);
  s.pending = dev().copy_async(s.v.data(), host_block(h.v, s.v.bytes(), n_, set, chunk),
                               s.v.bytes(), CopyKind::kHostToDevice);
}

void HeadwiseAttention::fetch_grads(const Host& h, int set, int chunk, Slot& s) {
  dev().copy_async(s.dk.data(), host_block(h.dk, s.dk.bytes(), n_, set, chunk), s.dk.bytes(),
                   CopyKind::kHostToDevice);
  s.pending = dev().copy_async(s.dv.data(), host_block(h.dv, s.dv.bytes(), n_, set, chunk),
                               s.dv.bytes(), CopyKind::kHostToDevice);
}

void HeadwiseAttention::store_grads(const Host& h, int set, int chunk, Slot& s) {
  dev().copy_async(host_block(h.dk, s.dk.bytes(), n_, set, chunk), s.dk.data(), s.dk.bytes(),
                   CopyKind::kDeviceToHost);
  s.pending = dev().copy_async(host_block(h.dv, s.dv.bytes(), n_, set, chunk), s.dv.data(),
                               s.dv.bytes(), CopyKind::kDeviceToHost);
}

// Query chunk qi of run r against key chunk kj held in kv, at their global positions (N = 1:
// row 0 is position 0, or the core knows its own placement), with N > 1 their rows of the whole
// sequence's document mask (N = 1: the core applies the mask).
AttnProblem HeadwiseAttention::problem(const HeadRun& r, const Buffers& b, const Slot& kv, int qi,
                                       int kj) const {
  const int64_t n = b.q().rows();
  AttnProblem p = run_problem(r, b.q(), kv.k, kv.v, cfg().head_dim);
  p.q_pos0 = qi * n;
  p.k_pos0 = kj * n;
  if (docs_ && n_ > 1) {
    p.q_docs = b.mask.list(0).shifted(qi * n);
    p.k_docs = b.mask.list(0).shifted(kj * n);
  }
  return p;
}

// N > 1: online softmax over key chunks first_key_chunk(i)..i, double-buffered: chunk j+1 is
// fetched into the other slot (an asynchronous copy) before chunk j is used, so a device with a
// copy engine overlaps it with the attention of chunk j (on the CPU copies are memcpy).
void HeadwiseAttention::attend_forward(int stage, int i, Buffers& b, const Host& h) {
  const int set = sch_.set_of(stage), d = cfg().head_dim;
  const std::vector<HeadRun> runs = head_runs(sch_, stage);
  if (n_ == 1) {
    for (const HeadRun& r : runs)
      core_->forward(problem(r, b, b.slot[0], 0, 0), docs_ ? &b.mask : nullptr,
                     b.o().mat().cols_of(int64_t(r.q0) * d, int64_t(r.nh) * d),
                     b.lse.mat().rows_of(r.q0, r.nh));
    return;
  }
  attention_accumulate_init(dev(), b.acc, b.rmax, b.rsum);
  const int j0 = first_key_chunk(i);
  fetch_kv(h, set, j0, b.slot[j0 % 2]);
  for (int j = j0; j <= i; ++j) {
    if (j < i) fetch_kv(h, set, j + 1, b.slot[(j + 1) % 2]);
    Slot& kv = b.slot[j % 2];
    ready(kv);
    for (const HeadRun& r : runs)
      attention_forward_accumulate(
          dev(), problem(r, b, kv, i, j), b.acc.mat().cols_of(int64_t(r.q0) * d, int64_t(r.nh) * d),
          b.rmax.mat().rows_of(r.q0, r.nh), b.rsum.mat().rows_of(r.q0, r.nh));
  }
  attention_finalize(dev(), b.acc, b.rmax, b.rsum, d, b.o(), b.lse);
}

// N > 1: each key chunk is fetched with its offloaded accumulators, double buffered as in
// forward, and the accumulators go back to the host. Query chunks are processed from the last:
// the first to read key chunk j is last_query_chunk(j) (the last chunk with one document), and
// its set's first stage starts j's accumulators from zero instead of the host.
void HeadwiseAttention::attend_backward(int stage, int i, Buffers& b, const Host& h) {
  const int set = sch_.set_of(stage), d = cfg().head_dim;
  const std::vector<HeadRun> runs = head_runs(sch_, stage);
  auto run_kernel = [&](const HeadRun& r, const Slot& kv, int j) {
    const int64_t qc = int64_t(r.q0) * d, qn = int64_t(r.nh) * d;
    const int64_t kc = int64_t(r.k0) * d, kn = int64_t(r.nk) * d;
    const AttnProblem p = problem(r, b, kv, i, j);
    const Mat dout = b.dout().mat().cols_of(qc, qn), lse = b.lse.mat().rows_of(r.q0, r.nh);
    const Mat delta = b.delta_of(n_).rows_of(r.q0, r.nh), dq = b.acc.mat().cols_of(qc, qn);
    const Mat dk = kv.dk.mat().cols_of(kc, kn), dv = kv.dv.mat().cols_of(kc, kn);
    const Mat o = b.o().mat().cols_of(qc, qn);
    if (n_ == 1)
      core_->backward(p, docs_ ? &b.mask : nullptr, dout, lse, delta, dq, dk, dv, o);
    else
      attention_backward(dev(), p, dout, lse, delta, dq, dk, dv, o);
  };
  zero(dev(), b.acc);
  if (n_ == 1) {
    for (const HeadRun& r : runs) run_kernel(r, b.slot[0], 0);
    return;
  }
  auto load = [&](int j, Slot& slot) {
    if (i == last_query_chunk(j) && sch_.starts_set(stage)) {
      ready(slot);  // the slot's last store is done before its dK/dV restart from zero
      zero(dev(), slot.dk);
      zero(dev(), slot.dv);
    } else {
      fetch_grads(h, set, j, slot);
    }
    fetch_kv(h, set, j, slot);
  };
  const int j0 = first_key_chunk(i);
  load(j0, b.slot[j0 % 2]);
  for (int j = j0; j <= i; ++j) {
    if (j < i) load(j + 1, b.slot[(j + 1) % 2]);
    Slot& kv = b.slot[j % 2];
    ready(kv);
    for (const HeadRun& r : runs) run_kernel(r, kv, j);
    store_grads(h, set, j, kv);
  }
}

void HeadwiseAttention::forward(const Mat& x, const AttentionWeights& w, const Mat& y, float beta) {
  const int64_t rows = x.rows / n_;
  Buffers b = allocate(false);
  const Host h = allocate_host(false);
  for (int i = 0; i < n_; ++i) {
    const Mat xi = x.rows_of(i * rows, rows);
    // y collects one partial product per stage and rank: an fp32 y (a residual stream) takes
    // them directly; a bf16 y is accumulated in fp32 and rounded once, as local's GEMM does.
    FpAccumulator yacc(dev(), y.rows_of(i * rows, rows), beta, Tag::kAttnOut);
    if (overlapped_)
      forward_stages_overlapped(x, xi, i, w, b, h, yacc);
    else
      forward_stages(x, xi, i, w, b, h, yacc);
    yacc.finish();
  }
  dev().wait_copies();  // before the slots and host blocks are freed
}

void HeadwiseAttention::forward_stages(const Mat& x, const Mat& xi, int i,
                                       const AttentionWeights& w, Buffers& b, const Host& h,
                                       const FpAccumulator& yacc) {
  const int64_t bytes = stage_bytes(env(), xi.rows, cfg().dtype);
  for (int s = 0; s < sch_.stages(); ++s) {
    // Key chunks < i of the set were projected (and offloaded) in earlier query chunks.
    if (sch_.starts_set(s)) project_set(x, w, sch_.set_of(s), i, b, h);
    project_q(env(), xi, rope_pos_[size_t(i)], w, s, b.a2a, b.q());
    attend_forward(s, i, b, h);
    a2a_comm().all_to_all(b.o().data(), b.a2a.data(), bytes);
    if (s == 0) fence_output(yacc.out());  // the first write to y's rows (or its accumulator)
    accumulate_out(env(), w.wo, s, b.a2a, yacc.target(), s == 0 ? yacc.beta() : 1.0f);
  }
}

// The same calls as forward_stages, in the same order on each buffer, with the all-to-alls
// around stage s's attention in flight during it: stage s+1's q (projected into a2a, received
// into the other q) and stage s-1's o (sent from the other o, received into a2a_o, applied to y
// after). A KV set is still projected at its first stage, blocking: slot 0 is in use until then.
void HeadwiseAttention::forward_stages_overlapped(const Mat& x, const Mat& xi, int i,
                                                  const AttentionWeights& w, Buffers& b,
                                                  const Host& h, const FpAccumulator& yacc) {
  const RowPositions& pos = rope_pos_[size_t(i)];
  const int64_t bytes = stage_bytes(env(), xi.rows, cfg().dtype);
  std::unique_ptr<Work> q_next, o_prev;
  std::vector<std::unique_ptr<Work>> kv_next;  // KV-set overlap: the next set's k, v in flight
  auto finish_out = [&](int s) {
    o_prev->wait();
    o_prev.reset();
    if (s == 0) fence_output(yacc.out());  // the first write to y's rows (or its accumulator)
    accumulate_out(env(), w.wo, s, b.a2a_o, yacc.target(), s == 0 ? yacc.beta() : 1.0f);
  };
  for (int s = 0; s < sch_.stages(); ++s) {
    b.cur = s % 2;
    if (q_next) q_next->wait();
    q_next.reset();
    if (!kv_next.empty())
      take_next_set(kv_next, sch_.set_of(s), i, b, h);
    else if (sch_.starts_set(s))
      project_set(x, w, sch_.set_of(s), i, b, h);
    if (s == 0) project_q(env(), xi, pos, w, s, b.a2a, b.q());
    if (s + 1 < sch_.stages()) {
      project_q_blocks(env(), xi, pos, w, s + 1, b.a2a);
      q_next = a2a_comm().iall_to_all(b.a2a.data(), b.qs[(s + 1) % 2].data(), bytes);
      if (kv_overlapped_ && sch_.starts_set(s + 1))
        kv_next = start_next_set(xi, i, w, sch_.set_of(s + 1), b);
    }
    attend_forward(s, i, b, h);
    if (o_prev) finish_out(s - 1);
    o_prev = a2a_comm().iall_to_all(b.o().data(), b.a2a_o.data(), bytes);
  }
  finish_out(sch_.stages() - 1);
}

void HeadwiseAttention::backward(const Mat& x, const Mat& dy, const AttentionWeights& w,
                                 const Mat& dx, const AttentionGrads& g, float dx_beta,
                                 float dw_beta) {
  const int64_t rows = x.rows / n_;
  Buffers b = allocate(true);
  const Host h = allocate_host(true);
  if (cfg().qk_norm && dw_beta == 0.0f) {
    zero(dev(), g.wqn);
    zero(dev(), g.wkn);
  }
  for (int i = n_ - 1; i >= 0; --i) {
    const BackwardChunk c{x.rows_of(i * rows, rows), dy.rows_of(i * rows, rows), i,
                          i == n_ - 1 ? dw_beta : 1.0f};  // weight gradients sum over chunks
    FpAccumulator dxacc(dev(), dx.rows_of(i * rows, rows), dx_beta, Tag::kAttnGrad);  // as y
    if (overlapped_)
      backward_stages_overlapped(x, c, w, g, b, h, dxacc);
    else
      backward_stages(x, c, w, g, b, h, dxacc);
    dxacc.finish();
  }
  dev().wait_copies();  // before the slots and host blocks are freed
}

// A KV set's first stage in backward: N = 1 projects it and zeroes its dK/dV; N > 1 offloads
// every key chunk of it at the first query chunk processed (the last), which reads them all.
void HeadwiseAttention::start_set_backward(const Mat& x, const AttentionWeights& w, int set, int i,
                                           Buffers& b, const Host& h) {
  if (n_ == 1) {
    project_set(x, w, set, 0, b, h);
    zero(dev(), b.slot[0].dk);
    zero(dev(), b.slot[0].dv);
  } else if (i == n_ - 1) {
    for (int j = 0; j < n_; ++j) project_set(x, w, set, j, b, h);
  }
}

// The set's last stage of the last query chunk that reads key chunk i is done: its dK/dV are
// complete and go back once; dWk/dWv rows are written once per chunk.
void HeadwiseAttention::finish_set_backward(const BackwardChunk& c, const AttentionWeights& w,
                                            const AttentionGrads& g, int set, Buffers& b,
                                            const Host& h, const FpAccumulator& dxacc) {
  if (n_ > 1) {
    fetch_grads(h, set, c.i, b.slot[0]);
    ready(b.slot[0]);
  }
  return_kv_grads(env(), c.x, rope_pos_[size_t(c.i)], w, set, b.slot[0].dk, b.slot[0].dv, b.a2a,
                  dxacc.target(), g, c.gbeta);
}

void HeadwiseAttention::backward_stages(const Mat& x, const BackwardChunk& c,
                                        const AttentionWeights& w, const AttentionGrads& g,
                                        Buffers& b, const Host& h, const FpAccumulator& dxacc) {
  const int64_t d = cfg().head_dim;
  const RowPositions& pos = rope_pos_[size_t(c.i)];
  const int64_t bytes = stage_bytes(env(), c.x.rows, cfg().dtype);
  const int64_t dq_bytes = stage_bytes(env(), c.x.rows, DType::kF32);
  for (int s = 0; s < sch_.stages(); ++s) {
    const int set = sch_.set_of(s);
    if (sch_.starts_set(s)) start_set_backward(x, w, set, c.i, b, h);
    project_q(env(), c.x, pos, w, s, b.a2a, b.q());
    attend_forward(s, c.i, b, h);
    // do = dy Wo[:, stage heads], projected into the all-to-all layout and sent head-sharded.
    project_do(env(), c.dy, w.wo, s, b.a2a);
    a2a_comm().all_to_all(b.a2a.data(), b.dout().data(), bytes);
    // dWo[:, stage heads] = dy^T o needs o back in sequence layout.
    a2a_comm().all_to_all(b.o().data(), b.a2a.data(), bytes);
    accumulate_dwo(env(), c.dy, s, b.a2a, g.wo, c.gbeta);
    attention_delta(dev(), b.o(), b.dout(), int(d), b.delta_of(n_));
    attend_backward(s, c.i, b, h);
    // dq back to sequence layout: dx += dq Wq[stage rows]; dWq[stage rows].
    a2a_comm().all_to_all(b.acc.data(), b.a2a.data(), dq_bytes);
    return_q_grads(env(), c.x, pos, w, s, b.a2a, dxacc.target(), g, s == 0 ? dxacc.beta() : 1.0f,
                   c.gbeta);
    if ((s + 1) % sch_.stages_per_set == 0) finish_set_backward(c, w, g, set, b, h, dxacc);
  }
}

// backward_stages with stage s+1's q and do (projected into stage_q / stage_do, received into
// the other q / do) in flight during stage s's two attention passes, o's all-to-all (for dWo)
// during the backward pass, and stage s's dq return during stage s+1's forward pass. Every
// output gets the same operations in the same order: y, dx, dWq (stage rows) and dWk/dWv
// accumulate stage by stage as before; only dWo's product moves after the backward pass, which
// does not read it. A set's last stage returns its dq, then its dK/dV, before the next set.
void HeadwiseAttention::backward_stages_overlapped(const Mat& x, const BackwardChunk& c,
                                                   const AttentionWeights& w,
                                                   const AttentionGrads& g, Buffers& b,
                                                   const Host& h, const FpAccumulator& dxacc) {
  const int64_t d = cfg().head_dim;
  const RowPositions& pos = rope_pos_[size_t(c.i)];
  const int64_t bytes = stage_bytes(env(), c.x.rows, cfg().dtype);
  const int64_t dq_bytes = stage_bytes(env(), c.x.rows, DType::kF32);
  std::unique_ptr<Work> q_next, do_next, dq_prev;
  std::vector<std::unique_ptr<Work>> kv_next;  // KV-set overlap: the next set's k, v in flight
  int dq_stage = -1;
  auto finish_dq = [&] {
    if (!dq_prev) return;
    dq_prev->wait();
    dq_prev.reset();
    return_q_grads(env(), c.x, pos, w, dq_stage, b.a2a, dxacc.target(), g,
                   dq_stage == 0 ? dxacc.beta() : 1.0f, c.gbeta);
  };
  for (int s = 0; s < sch_.stages(); ++s) {
    const int set = sch_.set_of(s);
    b.cur = s % 2;
    if (q_next) {
      q_next->wait();
      do_next->wait();
      q_next.reset();
      do_next.reset();
    }
    if (!kv_next.empty()) {  // N = 1: the set's k, v arrived; its dK/dV start from zero
      take_next_set(kv_next, set, c.i, b, h);
      zero(dev(), b.slot[0].dk);
      zero(dev(), b.slot[0].dv);
    } else if (sch_.starts_set(s)) {
      start_set_backward(x, w, set, c.i, b, h);
    }
    if (s == 0) {
      project_q(env(), c.x, pos, w, s, b.a2a, b.q());
      project_do(env(), c.dy, w.wo, s, b.a2a);
      a2a_comm().all_to_all(b.a2a.data(), b.dout().data(), bytes);
    }
    if (s + 1 < sch_.stages()) {
      const int nx = (s + 1) % 2;
      project_q_blocks(env(), c.x, pos, w, s + 1, b.stage_q);
      q_next = a2a_comm().iall_to_all(b.stage_q.data(), b.qs[nx].data(), bytes);
      project_do(env(), c.dy, w.wo, s + 1, b.stage_do);
      do_next = a2a_comm().iall_to_all(b.stage_do.data(), b.douts[nx].data(), bytes);
      if (kv_overlapped_ && n_ == 1 && sch_.starts_set(s + 1))
        kv_next = start_next_set(c.x, c.i, w, sch_.set_of(s + 1), b);
    }
    // Stage s-1's dq, in flight during the forward pass; with N > 1 that pass accumulates in
    // b.acc, the dq's send buffer, so it returns first (after the projections above).
    if (n_ > 1) finish_dq();
    attend_forward(s, c.i, b, h);
    finish_dq();  // a2a is free again
    std::unique_ptr<Work> o_back = a2a_comm().iall_to_all(b.o().data(), b.a2a.data(), bytes);
    attention_delta(dev(), b.o(), b.dout(), int(d), b.delta_of(n_));
    attend_backward(s, c.i, b, h);
    o_back->wait();
    accumulate_dwo(env(), c.dy, s, b.a2a, g.wo, c.gbeta);
    dq_prev = a2a_comm().iall_to_all(b.acc.data(), b.a2a.data(), dq_bytes);
    dq_stage = s;
    if ((s + 1) % sch_.stages_per_set == 0) {
      finish_dq();
      finish_set_backward(c, w, g, set, b, h, dxacc);
    }
  }
}

int64_t headwise_attn_peak_bytes(const Backend& be, const AttentionConfig& c,
                                 const UpipeSchedule& s, const HeadCore& core, int ranks,
                                 int chunks, const Documents* docs) {
  const int64_t rows = c.seq_len / ranks / chunks, n = rows * s.ranks, d = c.head_dim;
  const int64_t dm = c.model_dim(), md = int64_t(s.m) * d, rd = int64_t(s.kv_per_rank) * d;
  const int64_t pd = s.replicated() ? d : rd;  // rows of Wk/Wv one projection GEMM produces
  const DType t = c.dtype, f32 = DType::kF32;
  auto ws = [&](int64_t m_, int64_t n_, int64_t k_, DType a_, DType b_, DType c_) {
    return gemm_workspace_bytes(be, m_, n_, k_, a_, b_, c_);
  };
  // Largest transient: the attention core (its largest call), a GEMM or QK-norm workspace, or
  // the QK-norm's recomputed pre-norm block of a gradient return.
  int64_t core_f = 0, core_b = 0;
  for (int stage = 0; stage < s.stages(); ++stage)
    for (const HeadRun& r : head_runs(s, stage)) {
      core_f = std::max(core_f, core.forward_bytes(r.nh, r.nk));
      core_b = std::max(core_b, core.backward_bytes(r.nh, r.nk));
    }
  const int64_t norm = c.qk_norm ? rmsnorm_workspace_bytes(be, d) : 0;
  const int64_t proj = std::max({ws(rows, md, dm, t, t, t), ws(rows, pd, dm, t, t, t), norm});
  const int64_t ws_fwd = std::max({core_f, proj, ws(rows, dm, md, t, t, f32)});
  const int64_t ws_bwd = std::max(
      {core_f, core_b, proj, project_do_bytes(be, c, s, rows), accumulate_dwo_bytes(be, c, s, rows),
       return_q_grads_bytes(be, c, s, rows), return_kv_grads_bytes(be, c, s, rows, f32)});
  const int64_t slots = chunks > 1 ? 2 : 1;
  const int64_t kv = slots * 2 * mat_bytes(n, rd, t), dkv = slots * 2 * mat_bytes(n, rd, f32);
  const int64_t stat = mat_bytes(s.m, n, f32);  // one (m, n) row statistic: lse, delta, ...
  const int64_t qo = 2 * mat_bytes(n, md, t), acc = mat_bytes(n, md, f32);
  // Online softmax (N > 1): the running sum, max and sum; rsum doubles as delta in backward.
  const int64_t online = chunks > 1 ? acc + 2 * stat : 0;
  const int64_t out_acc = FpAccumulator::bytes(rows, dm, c.out_dtype());  // y / dx rows
  const int64_t mask = docs ? DocMask::bytes(*docs, core.mask_views(*docs)) : 0;
  // Stage overlap: forward a second q and o and the o all-to-all's staging; backward a second q
  // and do and the next stage's q and do staging. Each is one (n, m*d) block.
  const int64_t block = mat_bytes(n, md, t);
  const bool overlap = c.knobs.overlap && s.stages() > 1;
  // KV-set overlap: the next set's k, v and their K and V send staging.
  // (N > 1: the forward's projections only; the backward projects a set's chunks all at once).
  const int64_t kv_next =
      kv_set_overlap(c, s) ? 2 * mat_bytes(n, rd, t) + 2 * kv_stage_bytes(c, s, rows) : 0;
  const int64_t fwd_overlap = overlap ? 3 * block + kv_next : 0;
  const int64_t bwd_overlap = overlap ? 4 * block + (chunks == 1 ? kv_next : 0) : 0;
  const int64_t fwd =
      kv + n * md * dtype_size(t) + qo + stat + online + out_acc + ws_fwd + mask + fwd_overlap;
  // Backward: lse and delta (N = 1) or lse, max and sum-as-delta (N > 1); do; dq.
  const int64_t bwd_stats = (chunks > 1 ? 3 : 2) * stat;
  const int64_t bwd =
      kv + dkv + n * md * 4 + qo + bwd_stats + block + acc + out_acc + ws_bwd + mask + bwd_overlap;
  return std::max(fwd, bwd);
}

bool kv_set_overlap(const AttentionConfig& c, const UpipeSchedule& s) {
  return c.knobs.overlap && s.stages() > 1 && s.sets > 1;
}

int64_t headwise_host_peak_bytes(const AttentionConfig& c, const UpipeSchedule& s, int chunks) {
  if (chunks == 1) return 0;
  const int64_t cols = int64_t(s.sets) * s.kv_per_rank * c.head_dim;
  return 2 * mat_bytes(c.seq_len, cols, c.dtype) + 2 * mat_bytes(c.seq_len, cols, DType::kF32);
}

int64_t HeadwiseAttention::attn_formula_bytes() const {
  return headwise_attn_peak_bytes(dev().backend(), cfg(), sch_, *core_, comm().size(), n_,
                                  documents());
}

int64_t HeadwiseAttention::host_formula_bytes() const {
  return headwise_host_peak_bytes(cfg(), sch_, n_);
}

std::optional<CommStats> HeadwiseAttention::comm_expected() const {
  return headwise_comm_expected(cfg(), sch_, *core_, comm().size(), n_);
}

CommStats headwise_comm_expected(const AttentionConfig& c, const UpipeSchedule& s,
                                 const HeadCore& core, int ranks, int chunks) {
  CommStats st;
  for (bool backward : {false, true})  // backward recomputes the forward's traffic
    for (int i = 0; i < chunks; ++i) {
      add_headwise_pass_comm(st, c, s, c.seq_len / ranks / chunks, backward);
      for (int stage = 0; stage < s.stages(); ++stage)
        for (const HeadRun& r : head_runs(s, stage)) {  // the core's messages, if any
          core.add_forward_comm(st, r.nh, r.nk);
          if (backward) core.add_backward_comm(st, r.nh, r.nk);
        }
    }
  return st;
}

}  // namespace upipe
