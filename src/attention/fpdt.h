// Sequence-chunked Ulysses with host offload: FPDT(N) (fully pipelined distributed transformer),
// and upipe-fpdt, UPipe's head stages inside each sequence chunk (FPDT is its U = H case).
//
// The shard is cut into N chunks (the chunked layout: rank r holds sub-chunk r of every global
// chunk, so the all-to-all of local chunk i yields global chunk i, contiguous positions). Chunk
// by chunk, the chunk's K/V of every KV set are projected, sent head-sharded and offloaded to
// the host arena; then each stage projects its query heads of the chunk, runs online softmax
// over the key chunks <= it, fetched back from the host through a double buffer, sends the
// output back and applies its slice of Wo. Device buffers are per chunk and per stage, so they
// scale with S/N and U, not S or H. Backward walks the query chunks from last to first,
// recomputes each (stage, chunk) output, and accumulates dK/dV into offloaded fp32
// accumulators; when chunk i is reached every query that reads its keys has been processed, so
// its dK/dV are complete and return at once. docs/strategies-fpdt.md has the schedule, the
// memory formulas (device and host) and the communication volume.
#pragma once

#include <vector>

#include "attention/head_stage.h"
#include "attention/strategy.h"
#include "attention/upipe_schedule.h"
#include "backend/attention.h"

namespace upipe {

// N used when --chunks is 0: the largest N <= 4 with seq-len divisible by N C.
constexpr int kFpdtDefaultChunks = 4;

// N for cfg on `ranks` ranks (cfg.chunks, or the default for 0). Throws ConfigError with what to
// change when the sequence cannot be cut into N chunks of C sub-chunks.
int fpdt_chunks(const AttentionConfig& cfg, int ranks);

class ChunkedAttention final : public AttentionStrategy {
 public:
  // head_chunk: U (H gives FPDT, 0 gives C). The all-to-all runs over ctx.comm.
  ChunkedAttention(const StrategyContext& ctx, std::string name, int head_chunk);
  std::string name() const override { return name_; }
  SeqLayout layout() const override;
  void forward(const Mat& x, const AttentionWeights& w, const Mat& y, float beta) override;
  void backward(const Mat& x, const Mat& dy, const AttentionWeights& w, const Mat& dx,
                const AttentionGrads& g, float dx_beta, float dw_beta) override;
  int64_t attn_formula_bytes() const override;
  ErrorClass error_class() const override { return ErrorClass::kMerge; }
  std::optional<CommStats> comm_expected() const override;
  // Peak bytes this strategy holds in the host arena (the offloaded K/V and dK/dV).
  int64_t host_formula_bytes() const;
  const UpipeSchedule& schedule() const { return sch_; }
  int chunks() const { return n_; }

 private:
  struct Slot;
  struct Buffers;
  struct Host;
  StageEnv env() const { return {dev(), comm(), cfg(), sch_}; }
  Buffers allocate(bool backward) const;
  Host allocate_host(bool backward) const;
  void offload_kv(const Mat& xi, const AttentionWeights& w, int set, int chunk, Buffers& b,
                  const Host& h);
  void fetch_kv(const Host& h, int set, int chunk, const Slot& s);
  void fetch_grads(const Host& h, int set, int chunk, const Slot& s);
  void store_grads(const Host& h, int set, int chunk, const Slot& s);
  AttnProblem problem(const HeadRun& r, const Buffers& b, const Slot& kv, int qi, int kj) const;
  void attend_forward(int stage, int chunk, Buffers& b, const Host& h);
  void attend_backward(int stage, int chunk, Buffers& b, const Host& h);

  std::string name_;
  UpipeSchedule sch_;
  int n_;                                // N
  std::vector<RowPositions> chunk_pos_;  // global positions of this rank's sub-chunk i
};

// Per-rank peak of the attention intermediates in the device arena (docs/strategies-fpdt.md).
int64_t fpdt_attn_peak_bytes(const Backend& be, const AttentionConfig& cfg, const UpipeSchedule& s,
                             int chunks);
// Per-rank peak of the host (offload) arena: K/V of every chunk, plus fp32 dK/dV in backward.
int64_t fpdt_host_peak_bytes(const AttentionConfig& cfg, const UpipeSchedule& s);
// The collective calls and bytes this rank sends in one forward + backward.
CommStats fpdt_comm_expected(const AttentionConfig& cfg, const UpipeSchedule& s, int chunks);

}  // namespace upipe
