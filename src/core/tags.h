// Allocation tags: every arena byte carries one, so peaks can be broken down by purpose.
// docs/memory.md explains each tag.
#pragma once

#include <cstdint>

namespace upipe {

enum class Tag : uint8_t {
  kParams,      // model parameters: the fp32 master shard (ZeRO-3), or whole replicated weights
  kGrads,       // weight gradients: the fp32 shard, and a unit's full gradient before its
                // reduce-scatter
  kOptim,       // optimizer state (AdamW moments)
  kGathered,    // ZeRO-3: a unit's all-gathered compute-dtype weights (and the send copy)
  kAct,         // block inputs/outputs: x, y, dx, dy
  kQkv,         // projected q, k, v (and their recomputation in backward)
  kA2a,         // all-to-all staging buffers
  kAttnOut,     // attention output o and its log-sum-exp
  kKvResident,  // upipe: the KV set kept resident across the stages that read it
  kAttnGrad,    // do, dq, dk, dv, delta (= rowsum(do * o))
  kRing,        // ring: rotating K/V blocks and their dK/dV accumulators
  kOffload,     // host arena: fpdt's offloaded K/V chunks and their gradients
  kWorkspace,   // kernel workspaces (attention tiles, bf16->fp32 GEMM staging)
  kMlp,         // MLP intermediates
  kLogits,      // logits tiles of the fused linear + cross-entropy
  kStash,       // the residuals forward keeps for backward: each layer's input (per block, also
                // the MLP's input), on the device or in the host arena (offload)
  kDocs,        // packed sequences: the attention's mask metadata (document spans of its views)
  kOther,
  kCount
};
constexpr int kNumTags = static_cast<int>(Tag::kCount);

const char* tag_name(Tag t);

// A set of tags, one bit each.
using TagMask = uint32_t;
constexpr TagMask tag_bit(Tag t) {
  return TagMask(1) << static_cast<int>(t);
}
constexpr TagMask kAllTags = (TagMask(1) << kNumTags) - 1;
// What docs/design.md counts as attention intermediates: everything but the block's inputs/outputs,
// parameters, gradients and optimizer state.
constexpr TagMask kAttnIntermediateTags =
    kAllTags & ~(tag_bit(Tag::kParams) | tag_bit(Tag::kGrads) | tag_bit(Tag::kOptim) |
                 tag_bit(Tag::kGathered) | tag_bit(Tag::kAct));

}  // namespace upipe
