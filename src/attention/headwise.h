// The headwise engine: Ulysses, UPipe(U), FPDT(N) and UPipe+FPDT are one algorithm with two
// knobs, the query heads per stage U (H gives Ulysses) and the sequence chunks N (1 keeps the
// whole shard at once).
//
// Each stage projects only its query heads (rows of Wq) straight into the all-to-all layout,
// sends them head-sharded, runs attention against the KV set that reads them, sends the output
// back and applies the stage's slice of Wo, accumulating into y: no (S/C, H, d) output buffer
// exists. The same q / o / all-to-all buffers serve every stage; a KV set crosses the network
// once and is kept while every query head reading it is processed (upipe_schedule.h). Backward
// mirrors it stage by stage: dq returns per stage, dK/dV accumulate over the set and return once.
//
// N = 1: the set's K/V stay resident on the device (tag kv_resident) and the attention between
// the all-to-alls is a HeadCore: LocalCore on the whole sequence, or a ring core across Ulysses
// groups (USP, UPipe+ring: usp.h). N > 1 (FPDT): the shard is cut into N chunks (the chunked
// layout: rank r holds sub-chunk r of every global chunk, so the all-to-all of local chunk i
// yields global chunk i); each (set, chunk) of K/V is offloaded to the host arena when projected,
// and query chunk i attends to key chunks 0..i fetched back through a double buffer, merging by
// online softmax. Backward walks the query chunks from last to first and keeps dK/dV
// accumulators on the host; a (set, chunk) is complete, and returns, when its set's last stage
// of that query chunk is done. Device buffers scale with S/N and U, not S or H.
// Packed documents: after the all-to-all a rank holds whole documents for its heads, so the
// kernel masks them through one DocMask per forward or backward (tag docs) that every stage and
// chunk shares; RoPE runs at positions inside the documents. FPDT skips the key chunks that share
// no document with the query chunk, and their fetches: query chunk i reads key chunks
// first_key_chunk(i)..i, the chunk holding the start of the document at chunk i's first row.
// docs/strategies.md and docs/strategies-fpdt.md have the schedules, the memory formulas and the
// communication volume.
#pragma once

#include <memory>
#include <vector>

#include "attention/head_core.h"
#include "attention/head_stage.h"
#include "attention/strategy.h"
#include "attention/upipe_schedule.h"

namespace upipe {

class FpAccumulator;

// N used for fpdt / upipe-fpdt when --chunks is 0: the largest N <= 4 with seq-len divisible by
// N C.
constexpr int kFpdtDefaultChunks = 4;

// N for fpdt / upipe-fpdt on `ranks` ranks (cfg.knobs.chunks, or the default for 0). Throws
// ConfigError with what to change when the sequence cannot be cut into N chunks of C sub-chunks.
int fpdt_chunks(const AttentionConfig& cfg, int ranks);

// A Ulysses group split from the CP group (USP, UPipe+ring): where the all-to-all runs, the
// attention between the all-to-alls, and the rows of every rank of the CP group.
struct UlyssesGroup {
  std::unique_ptr<Communicator> comm;  // u ranks
  std::unique_ptr<HeadCore> core;      // attention over the group's u S/C tokens
  SeqLayout layout;
};

class HeadwiseAttention final : public AttentionStrategy {
 public:
  // stage_heads: U (H gives Ulysses / FPDT); chunks: N. The all-to-all spans ctx.comm.
  HeadwiseAttention(const StrategyContext& ctx, int stage_heads, int chunks);
  // N = 1 with the all-to-all inside group.comm and group.core between the all-to-alls.
  HeadwiseAttention(const StrategyContext& ctx, int stage_heads, UlyssesGroup group);
  SeqLayout layout() const override { return layout_; }
  void forward(const Mat& x, const AttentionWeights& w, const Mat& y, float beta) override;
  void backward(const Mat& x, const Mat& dy, const AttentionWeights& w, const Mat& dx,
                const AttentionGrads& g, float dx_beta, float dw_beta) override;
  int64_t attn_formula_bytes() const override;
  int64_t host_formula_bytes() const override;
  ErrorClass error_class() const override;
  std::optional<CommStats> comm_expected() const override;
  const UpipeSchedule& schedule() const { return sch_; }
  int chunks() const { return n_; }

 private:
  struct Slot;
  struct Buffers;
  struct Host;
  // One query chunk of a backward: x and dy rows, its index, the weight gradients' beta.
  struct BackwardChunk {
    Mat x, dy;
    int i;
    float gbeta;
  };
  Communicator& a2a_comm() const { return *a2a_; }
  StageEnv env() const { return {dev(), a2a_comm(), cfg(), sch_}; }
  Buffers allocate(bool backward) const;
  Host allocate_host(bool backward) const;
  // Projects K/V chunk `chunk` of KV set `set` into slot 0 (N = 1), or into slot chunk % 2 and
  // offloads it (N > 1).
  void project_set(const Mat& x, const AttentionWeights& w, int set, int chunk, Buffers& b,
                   const Host& h);
  // Asynchronous copies between a slot and the host blocks (N > 1); each sets the slot's pending
  // copy, which ready() waits on before an op touches the slot.
  void store_kv(const Host& h, int set, int chunk, Slot& s);
  void fetch_kv(const Host& h, int set, int chunk, Slot& s);
  void fetch_grads(const Host& h, int set, int chunk, Slot& s);
  void store_grads(const Host& h, int set, int chunk, Slot& s);
  void ready(Slot& s);
  AttnProblem problem(const HeadRun& r, const Buffers& b, const Slot& kv, int qi, int kj) const;
  void documents_changed() override;
  // The first key chunk query chunk i reads (0 with one document) and the last query chunk that
  // reads key chunk j (N - 1 with one document).
  int first_key_chunk(int i) const;
  int last_query_chunk(int j) const;
  // o, lse of the stage's heads over query chunk i (N = 1: the whole shard).
  void attend_forward(int stage, int i, Buffers& b, const Host& h);
  // dq (into b.acc) of the stage's heads over query chunk i, and dK/dV contributions.
  void attend_backward(int stage, int i, Buffers& b, const Host& h);
  // Every stage of query chunk i (rows xi of x) into y's accumulator, one after the other or
  // with stage overlap.
  void forward_stages(const Mat& x, const Mat& xi, int i, const AttentionWeights& w, Buffers& b,
                      const Host& h, const FpAccumulator& yacc);
  void forward_stages_overlapped(const Mat& x, const Mat& xi, int i, const AttentionWeights& w,
                                 Buffers& b, const Host& h, const FpAccumulator& yacc);
  void backward_stages(const Mat& x, const BackwardChunk& c, const AttentionWeights& w,
                       const AttentionGrads& g, Buffers& b, const Host& h,
                       const FpAccumulator& dxacc);
  void backward_stages_overlapped(const Mat& x, const BackwardChunk& c, const AttentionWeights& w,
                                  const AttentionGrads& g, Buffers& b, const Host& h,
                                  const FpAccumulator& dxacc);
  // KV-set overlap: projects KV set `set` of rows xi (chunk `chunk`; N = 1: the whole shard) into
  // b.kv_stage and starts its two all-to-alls into b.next; take_next_set waits for them, then
  // swaps b.next into slot 0 (N = 1) or offloads it to the set's host block (N > 1).
  std::vector<std::unique_ptr<Work>> start_next_set(const Mat& xi, int chunk,
                                                    const AttentionWeights& w, int set, Buffers& b);
  void take_next_set(std::vector<std::unique_ptr<Work>>& works, int set, int chunk, Buffers& b,
                     const Host& h);
  void start_set_backward(const Mat& x, const AttentionWeights& w, int set, int i, Buffers& b,
                          const Host& h);
  void finish_set_backward(const BackwardChunk& c, const AttentionWeights& w,
                           const AttentionGrads& g, int set, Buffers& b, const Host& h,
                           const FpAccumulator& dxacc);

  std::unique_ptr<Communicator> own_a2a_;  // the Ulysses group, when not the CP group itself
  Communicator* a2a_;                      // where the all-to-all runs
  SeqLayout base_layout_;                  // without documents
  SeqLayout layout_;                       // with the current documents
  UpipeSchedule sch_;
  int n_;  // N
  // Stage overlap: asked for (MethodKnobs::overlap) and more than one stage to overlap.
  bool overlapped_;
  // And the next KV set projected during the current set's last stage (kv_set_overlap).
  bool kv_overlapped_;
  std::unique_ptr<HeadCore> core_;
  std::vector<RowPositions> chunk_pos_;  // global positions of this rank's rows of each chunk
  std::vector<RowPositions> rope_pos_;   // their RoPE positions (inside their documents)
};

// Whether stage overlap also projects the next KV set during the current set's last stage (its
// K/V all-to-alls in flight during that stage's attention): more than one set (so K >= C: a
// replicated K < C head is one set); with N > 1 in the forward passes only (the backward projects
// a set's chunks all at once, at its first stage).
bool kv_set_overlap(const AttentionConfig& cfg, const UpipeSchedule& s);

// Per-rank peak of the attention intermediates in the device arena on a CP group of `ranks`
// ranks, the all-to-all over s.ranks of them, with N sequence chunks, and documents `docs` (null:
// one document; their mask adds DocMask::bytes of the core's views).
// With cfg.knobs.overlap and more than one stage, stage overlap's second q, o / do and staging
// (and with kv_set_overlap the next set's k, v and their staging).
int64_t headwise_attn_peak_bytes(const Backend& be, const AttentionConfig& cfg,
                                 const UpipeSchedule& s, const HeadCore& core, int ranks,
                                 int chunks, const Documents* docs = nullptr);
// Per-rank peak of the host (offload) arena: with N > 1 the K/V of every chunk, plus fp32
// dK/dV in backward; 0 with N = 1.
int64_t headwise_host_peak_bytes(const AttentionConfig& cfg, const UpipeSchedule& s, int chunks);
// The collective calls and bytes this rank sends in one forward + backward (the core's messages
// included).
CommStats headwise_comm_expected(const AttentionConfig& cfg, const UpipeSchedule& s,
                                 const HeadCore& core, int ranks, int chunks);

}  // namespace upipe
