// The memory policy of a decoder step: the dtypes, what backward recomputes and what forward
// stashes for it, where the stash lives, and the tile size of the tiled MLP and LM head. One
// struct from the command line to the decoder; its ranges are checked here (validate).
#pragma once

#include <cstdint>
#include <string>

#include "core/dtype.h"

namespace upipe {

// What forward stashes for backward to recompute from: per layer, each layer's input residual
// (backward runs the attention forward again to rebuild the MLP's input); per block, the MLP's
// input residual too (twice the stash bytes, the attention forward runs once less per layer);
// none: per block, and the MLP's gate and up products of every row are stashed too (two (S/C, F)
// per layer, tag mlp), so the MLP recomputes nothing (only the attention block's internals are
// recomputed, and not even those where the strategy can stash them: local).
enum class Recompute { kLayer, kBlock, kNone };
// "layer" | "block" | "none"; ConfigError naming memory.recompute otherwise.
Recompute parse_recompute(const std::string& s);
const char* recompute_name(Recompute r);

inline constexpr int64_t kMaxTileTokens = int64_t(1) << 30;

struct MemoryPolicy {
  DType dtype = DType::kF32;           // compute dtype: activations and compute weights
  DType residual_dtype = DType::kF32;  // the residual stream and its gradient: fp32 or dtype
  Recompute recompute = Recompute::kLayer;
  // The stash's storage dtype: fp32 (exact: backward recomputes each layer from the very residual
  // forward saw) or bf16 (half the bytes on the device and the host; backward recomputes from the
  // residual rounded to bf16, docs/model.md states the measured error).
  DType stash_dtype = DType::kF32;
  // The stash in the host arena instead of the device's; backward fetches each layer's entries
  // back into device slots once the layer above has finished its attention backward.
  bool offload_stash = false;
  int64_t tile_tokens = 1024;  // T: rows per tile of the MLP and the fused LM head
  bool operator==(const MemoryPolicy&) const = default;

  // ConfigError naming the setting: tile_tokens in [1, kMaxTileTokens], a residual dtype of
  // fp32 or the compute dtype.
  void validate() const;
};

}  // namespace upipe
