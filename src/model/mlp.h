// The decoder's SwiGLU MLP block, tiled over tokens: y = beta*y + down(silu(x gate^T) * (x up^T))
// runs T rows at a time, so only (T, F) intermediates exist (tag mlp), never (S/C, F). Like the
// attention block it is self-recomputing: forward keeps nothing, backward recomputes each tile's
// gate/up products. A block accumulates straight into the residual stream (beta = 1); each tile's
// output is one GEMM, so a bf16 y is rounded once per element.
#pragma once

#include <cstdint>

#include "backend/device.h"
#include "backend/write_fence.h"

namespace upipe {

struct MlpConfig {
  int64_t hidden = 0;         // D
  int64_t intermediate = 0;   // F
  int64_t tile_tokens = 0;    // T: rows per tile (a shorter last tile when T does not divide rows)
  DType dtype = DType::kF32;  // x, the weights and the (T, F) products a, b, h
  // y, dy and dx are fp32 (the model's fp32 residual stream) instead of dtype.
  bool fp32_residual = false;
  DType out_dtype() const { return fp32_residual ? DType::kF32 : dtype; }  // of y, dy, dx
};

struct MlpWeights {
  Mat gate;  // (F, D) dtype
  Mat up;    // (F, D) dtype
  Mat down;  // (D, F) dtype
};

struct MlpGrads {
  Mat gate;  // (F, D) fp32
  Mat up;    // (F, D) fp32
  Mat down;  // (D, F) fp32
};

// The gate and up products a = x gate^T and b = x up^T of every row, (rows, F) each in dtype:
// the caller's buffers when it keeps them from forward to backward (the decoder's
// --recompute none), so backward does not recompute them.
struct MlpStash {
  Mat a, b;
  MlpStash rows_of(int64_t r0, int64_t n) const { return {a.rows_of(r0, n), b.rows_of(r0, n)}; }
};

// y (S/C, D) out_dtype = beta*y + MLP(x), x (S/C, D) dtype; beta 0 (y not read) or 1. With
// `keep`, a and b are written there instead of (T, F) tiles of its own. y_fence (write_fence.h):
// called with each tile's rows of y before its GEMM writes them, so a copy still reading y (the
// offloaded stash) need only be done with the tile's rows.
void mlp_forward(Device& dev, const MlpConfig& c, const Mat& x, const MlpWeights& w, const Mat& y,
                 float beta, const MlpStash* keep = nullptr, WriteFence* y_fence = nullptr);

// dx (S/C, D) out_dtype = dx_beta*dx + dMLP/dx(dy), dy (S/C, D) out_dtype; each g = dw_beta*g +
// dMLP/dW (fp32, summed over the tiles); betas 0 or 1. Recomputes the forward tile by tile, or
// reads a and b from `kept` (what mlp_forward kept of the same x).
void mlp_backward(Device& dev, const MlpConfig& c, const Mat& x, const Mat& dy, const MlpWeights& w,
                  const Mat& dx, const MlpGrads& g, float dx_beta, float dw_beta,
                  const MlpStash* kept = nullptr);

// Peak device bytes mlp_forward / mlp_backward allocate on `rows` tokens (everything but x, y,
// dy, dx, the weights and their gradients and kept products): the (T, F) tiles, the (T, D) fp32
// dx accumulator when dx is not fp32, and the ops' workspaces from be's queries. Independent of
// rows once rows >= T. `kept`: with MlpStash buffers (no a, b tiles).
int64_t mlp_forward_peak_bytes(const Backend& be, const MlpConfig& c, int64_t rows,
                               bool kept = false);
int64_t mlp_backward_peak_bytes(const Backend& be, const MlpConfig& c, int64_t rows,
                                bool kept = false);
// The larger of the two: the block's peak over one forward + backward.
int64_t mlp_peak_bytes(const Backend& be, const MlpConfig& c, int64_t rows);

}  // namespace upipe
