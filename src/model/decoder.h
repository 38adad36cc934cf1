// The Llama-3 / Qwen3 decoder over a CP group: embedding -> L x [RMSNorm -> attention ->
// residual add; RMSNorm -> SwiGLU MLP -> residual add] -> final RMSNorm -> fused LM head +
// cross-entropy, forward and backward in one call, with any attention strategy.
//
// The residual stream is fp32 (or bf16, MemoryPolicy::residual_dtype) and every block
// accumulates into it (beta = 1), so no block keeps an (S/C, D) output of its own. Activation
// recompute: forward keeps what the granularity asks for in the stash (model/stash.h: at least each
// layer's input, tag stash; in the host arena with offload_stash) and backward recomputes each
// layer from it (Recompute::kLayer runs the attention forward twice per layer per step: once in
// forward, once to rebuild the MLP's input in backward, plus the strategy's own recompute inside
// its backward unless it keeps its intermediates). The loss has transformers' `labels = input_ids`
// semantics: the mean over the S-1 next-token predictions of the whole sequence; a row's label is
// the token at the next global position, whichever rank holds it, so every layout (contiguous,
// zigzag, chunked, grid) gets its labels right. A packed sequence (LossSpec::documents) is each
// document run alone: attention stays inside documents, RoPE positions restart at 0 in each,
// a document's last token predicts nothing, and the default mean is over the S minus (number of
// documents) predictions inside documents (attention/documents.h). Which buffer lives when:
// Decoder::run's comment (decoder.cpp) by function, docs/model.md "Memory" by phase, and its closed
// form, the tests' oracle tests/unit/step_memory.h.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <span>
#include <string>

#include "attention/strategy.h"
#include "model/config.h"
#include "model/layer_weights.h"
#include "model/lm_loss.h"
#include "model/memory_policy.h"
#include "model/mlp.h"
#include "model/param_source.h"
#include "model/stash.h"

namespace upipe {

// Allocates every parameter of m in `dtype` (uninitialised) on dev, tagged `tag`.
ParamMap allocate_params(Device& dev, const ModelConfig& m, DType dtype, Tag tag);

struct DecoderOptions {
  int64_t seq_len = 0;  // S, split over the CP group
  MethodKnobs knobs;    // the attention strategy and its knobs (attention/methods.h)
  MemoryPolicy memory;  // dtypes, recompute and stash, tile size (model/memory_policy.h)
};

// What the loss of one sequence is: its scale and an optional group of predictions to report.
struct LossSpec {
  // Multiplies the sum of the token losses (and so every gradient); 0 means 1/(predictions):
  // 1/(S-1), transformers' mean over the sequence, or with documents 1/(S - documents). Training
  // passes 1/(tokens predicted in the global batch), so the summed gradient is the batch mean
  // whatever the DP x CP split.
  double scale = 0;
  // Optional: S flags by global position p, whether the prediction at p (label = token p+1)
  // belongs to the group whose unscaled loss sum StepLoss::group_sum reports (e.g. the copied
  // half of the copy task).
  std::span<const uint8_t> group;
  // The sequence's documents (null: one document, the plain causal sequence).
  std::shared_ptr<const Documents> documents = nullptr;
};

struct StepLoss {
  double loss = 0;       // scale * the sum of the sequence's token losses (the same on every rank)
  double group_sum = 0;  // the unscaled sum of the group's token losses (0 without a group)
};

class Decoder {
 public:
  // cp: the context-parallel group that shares one sequence. Validates the options
  // (ConfigError) and builds the attention strategy.
  Decoder(Device& dev, Communicator& cp, const ModelConfig& m, const DecoderOptions& opt);
  const AttentionStrategy& strategy() const { return *strat_; }

  // One forward + backward of the sequence `tokens` (all S ids, on every rank), with the weights
  // and gradient buffers of `p` (param_source.h: one unit at a time, in order of use). Writes this
  // rank's contribution to every gradient (fp32, overwritten; the CP group's sum is the full
  // gradient) and returns the loss of the whole sequence.
  StepLoss run(std::span<const int32_t> tokens, ParamSource& p, const LossSpec& spec = {});
  // The same with whole replicated parameters (FullParams) and transformers' mean loss.
  double loss_and_grads(std::span<const int32_t> tokens, const ParamMap& w, const ParamMap& g);
  // The loss alone (evaluation): the forward, with nothing stashed and no gradient; the same
  // loss as run's. Uses p's prefetch / acquire / release only.
  StepLoss loss(std::span<const int32_t> tokens, ParamSource& p, const LossSpec& spec = {});
  // Wall time of the last call's forward (to the loss) and backward, seconds.
  double forward_seconds() const { return fwd_s_; }
  double backward_seconds() const { return bwd_s_; }

 private:
  // What the step reads of the options, resolved once by the constructor.
  struct StepConfig {
    int64_t seq_len = 0;           // S
    DType compute = DType::kF32;   // weights, norm outputs
    DType residual = DType::kF32;  // the residual stream and its gradient
    float eps = 0;                 // the RMSNorms'
    MlpConfig mlp;                 // the tiled MLP
    LmLossConfig loss;             // the fused LM head
    StashPolicy stash;             // what forward keeps for backward
  };
  // What the loss hands the head's backward.
  struct HeadLoss {
    StepLoss loss;  // this rank's part
    Tensor dh;      // (R, D) residual dtype: d loss / d (final norm's output)
    HeadParams w;   // the head's weights (lm_head valid only until the loss is computed)
    HeadParams g;   // its gradients (a tied lm_head's: the embedding's, until its backward)
  };

  // The step's parts, in order; R = this rank's rows, `pos` their global positions.
  void embed(const Mat& x, std::span<const int32_t> tokens, const RowPositions& pos,
             ParamSource& p);
  // stash: null keeps nothing (the loss alone).
  void layer_forward(const Mat& x, const Mat& h, Stash* stash, int layer, ParamSource& p);
  HeadLoss head_loss(const Mat& h, const Mat& x, std::span<const int32_t> tokens,
                     const RowPositions& pos, const LossSpec& spec, ParamSource& p);
  void head_backward(const Mat& dx, Tensor& x, HeadLoss& head, ParamSource& p);
  void layer_backward(const Mat& dx, Stash& stash, int layer, ParamSource& p);
  std::unique_ptr<AttentionStash> rebuild_mlp_input(const Mat& xm, const Mat& h, const Mat& x,
                                                    const AttentionWeights& w, Stash& stash,
                                                    int layer);
  void mlp_backward_tiled(const Mat& dx, const Mat& xm, const LayerWeights& w, const LayerGrads& g,
                          const MlpStash* kept);
  void embed_backward(const Mat& dx, const HeadLoss& head, std::span<const int32_t> tokens,
                      const RowPositions& pos, ParamSource& p);

  Device& dev_;
  Communicator& cp_;
  ModelConfig m_;
  StepConfig cfg_;
  std::unique_ptr<AttentionStrategy> strat_;
  double fwd_s_ = 0, bwd_s_ = 0;
};

}  // namespace upipe
