// The attention-block strategy interface (docs/design.md, "The attention block"). A strategy owns
// the projections as well as the attention, because UPipe slices them per stage.
//
// Blocks are self-recomputing: forward(x) -> y keeps nothing; backward(x, dy) -> dx, dW
// recomputes what it needs. A strategy that can_stash() also offers forward_stash, which keeps its
// intermediates (AttentionStash) for backward_stashed, so that backward recomputes nothing: the
// decoder keeps them from the forward with --recompute none, and from each layer's
// recompute per layer. Only a strategy whose own backward holds all of them at once anyway
// (local) says it can; UPipe's stages exist to never hold every head's. Every buffer comes from
// the device arena of the context.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include "attention/config.h"
#include "attention/documents.h"
#include "attention/layout.h"
#include "backend/device.h"
#include "backend/write_fence.h"
#include "comm/communicator.h"
#include "core/tensor.h"

namespace upipe {

// Compute copies of the block's weights, in the block's dtype. D may differ from H*d.
struct AttentionWeights {
  Mat wq;   // (H*d, D)
  Mat wk;   // (K*d, D)
  Mat wv;   // (K*d, D)
  Mat wo;   // (D, H*d)
  Mat wqn;  // (1, d) QK-norm weight of q (cfg.qk_norm only)
  Mat wkn;  // (1, d) QK-norm weight of k (cfg.qk_norm only)
};

// fp32 weight gradients, same shapes as the weights. A strategy writes (or adds, see backward)
// this rank's contribution (its tokens); summing over the CP group gives the full gradient (the
// model's ZeRO reduce-scatter does that).
struct AttentionGrads {
  Mat wq, wk, wv, wo, wqn, wkn;
};

// What forward_stash kept for backward_stashed: the strategy's own intermediates, in the device
// arena. Opaque to the caller; destroying it frees them.
class AttentionStash {
 public:
  virtual ~AttentionStash() = default;
};

// Closed-form bytes of the keeping variant (can_stash()): what one forward_stash keeps, the peak of
// its intermediates in forward_stash (what it keeps included) and in backward_stashed (what was
// kept included, freed as it is used).
struct StashedAttentionBytes {
  int64_t kept = 0;
  int64_t forward = 0;
  int64_t backward = 0;
};

struct StrategyContext {
  Device& dev;
  Communicator& comm;  // the CP group
  AttentionConfig cfg;
};

class AttentionStrategy {
 public:
  explicit AttentionStrategy(const StrategyContext& ctx) : ctx_(ctx) {}
  virtual ~AttentionStrategy() = default;

  // The method that runs (attention/methods.h).
  const std::string& name() const { return ctx_.cfg.knobs.method; }
  // Rank r's rows (layout().positions(r)), with the documents of set_documents.
  virtual SeqLayout layout() const = 0;
  // The documents of the sequence the following calls see (documents.h): lengths summing to S;
  // null or one document is the plain causal sequence. The zigzag layouts (ring, usp,
  // upipe-ring) place the documents, so layout() changes with them; the formulas and the
  // communication counts below are those of the current documents.
  void set_documents(std::shared_ptr<const Documents> docs);
  const Documents* documents() const { return docs_.get(); }
  // x (S/C, D) in cfg.dtype, y (S/C, D) in cfg.out_dtype(): this rank's shard, rows in layout()
  // order. y = beta y + block(x), beta 0 or 1: with beta = 1 the block accumulates into a
  // residual stream and, when y is fp32, needs no (S/C, D) buffer of its own.
  virtual void forward(const Mat& x, const AttentionWeights& w, const Mat& y, float beta) = 0;
  // dy, dx: (S/C, D) in cfg.out_dtype(). dx = dx_beta dx + d block / dx; every gradient of g =
  // dw_beta g + this rank's contribution (dw_beta = 1 accumulates micro-batches); both 0 or 1.
  virtual void backward(const Mat& x, const Mat& dy, const AttentionWeights& w, const Mat& dx,
                        const AttentionGrads& g, float dx_beta, float dw_beta) = 0;
  // Closed-form per-rank peak of the attention intermediates over forward + backward
  // (docs/memory.md), in bytes.
  virtual int64_t attn_formula_bytes() const = 0;

  // The keeping variant. forward_stash = forward plus what backward would recompute, returned
  // for backward_stashed (same arguments and results as backward, nothing recomputed; it frees the
  // kept intermediates as it goes and leaves `kept` empty). Strategies that cannot keep
  // (can_stash() false) keep nothing: forward_stash returns null and backward_stashed recomputes.
  virtual bool can_stash() const { return false; }
  virtual std::unique_ptr<AttentionStash> forward_stash(const Mat& x, const AttentionWeights& w,
                                                        const Mat& y, float beta) {
    forward(x, w, y, beta);
    return nullptr;
  }
  virtual void backward_stashed(std::unique_ptr<AttentionStash> kept, const Mat& x, const Mat& dy,
                                const AttentionWeights& w, const Mat& dx, const AttentionGrads& g,
                                float dx_beta, float dw_beta) {
    kept.reset();
    backward(x, dy, w, dx, g, dx_beta, dw_beta);
  }
  virtual StashedAttentionBytes stash_formula_bytes() const { return {}; }
  // Closed-form per-rank peak of what the strategy keeps in the host arena (offloaded K/V and
  // their gradients), in bytes; 0 for strategies that offload nothing.
  virtual int64_t host_formula_bytes() const { return 0; }

  // How results relate to `local` (the tolerance rule of `check`, check.h): data-movement
  // strategies reproduce local's arithmetic up to the order of a few sums; merge-based ones
  // combine softmax partials and are bounded relative to the kernel's own error against fp64;
  // kReplicaSums is data movement except for the tensors that depend on the summed dK/dV
  // partials of KV heads replicated over ranks (K < C).
  enum class ErrorClass { kDataMovement, kReplicaSums, kMerge };
  virtual ErrorClass error_class() const { return ErrorClass::kDataMovement; }
  // The collective calls and bytes this rank sends in one forward + backward, when the
  // strategy documents them (tests compare them with the communicator's counters).
  virtual std::optional<CommStats> comm_expected() const { return std::nullopt; }

  const AttentionConfig& cfg() const { return ctx_.cfg; }

  // The fence of forward's y (write_fence.h), null when no copy reads y: forward and
  // forward_stash call it with the rows of y they are about to write, before the first write to
  // them, so a copy saving y (the offloaded stash) runs beside the projections and the attention.
  void set_output_fence(WriteFence* fence) { output_fence_ = fence; }

 protected:
  Device& dev() const { return ctx_.dev; }
  Communicator& comm() const { return ctx_.comm; }
  // After set_documents: strategies that cache positions refresh them.
  virtual void documents_changed() {}
  // The RoPE positions of global rows: their positions inside their documents.
  RowPositions rope_positions(const RowPositions& rows) const;
  // Before forward's first write to these rows of y.
  void fence_output(const Mat& rows) const { fence_write(output_fence_, rows); }
  StrategyContext ctx_;
  std::shared_ptr<const Documents> docs_;  // null: one document

 private:
  WriteFence* output_fence_ = nullptr;
};

}  // namespace upipe
