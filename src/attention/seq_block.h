// The parts of the attention block that `local` and `ring` share: both keep the sequence sharded
// (all heads of this rank's rows), so projecting q, k, v, the o-projection and the backward
// projections are the same code. Only the attention between them differs (one kernel call, or
// a ring pass). Every function also states its peak workspace, for the memory formulas.
#pragma once

#include "attention/config.h"
#include "attention/strategy.h"
#include "backend/device.h"

namespace upipe {

// q (rows, H*d), k, v (rows, K*d) <- x (rows, D) at global positions pos: projections, QK-norm,
// RoPE.
void seq_project_qkv(Device& dev, const AttentionConfig& c, const Mat& x, const AttentionWeights& w,
                     const RowPositions& pos, const Mat& q, const Mat& k, const Mat& v);
// Peak bytes seq_project_qkv allocates (workspaces only; q, k, v are the caller's).
int64_t seq_project_qkv_bytes(const Backend& be, const AttentionConfig& c, int64_t rows);

// y = beta y + o Wo^T: one GEMM, so a bf16 y is rounded once.
void seq_out_project(Device& dev, const Mat& o, const Mat& wo, const Mat& y, float beta);
int64_t seq_out_project_bytes(const Backend& be, const AttentionConfig& c, int64_t rows);

// dout (rows, H*d) = dy Wo; g.wo = dw_beta g.wo + dy^T o.
void seq_dout_dwo(Device& dev, const Mat& dy, const Mat& o, const Mat& wo, const Mat& dout,
                  const Mat& gwo, float dw_beta);
int64_t seq_dout_dwo_bytes(const Backend& be, const AttentionConfig& c, int64_t rows);

// From fp32 dq (rows, H*d), dk, dv (rows, K*d) at the projection's output (after attention):
// RoPE backward and QK-norm backward in place (recomputing the pre-norm q and k), then
// dx = dx_beta dx + dq Wq + dk Wk + dv Wv (summed in fp32, rounded once when dx is bf16) and the
// projection weights' gradients (g = dw_beta g + ...; QK-norm ones too).
void seq_input_grads(Device& dev, const AttentionConfig& c, const Mat& x, const AttentionWeights& w,
                     const RowPositions& pos, const Mat& dq, const Mat& dk, const Mat& dv,
                     const Mat& dx, const AttentionGrads& g, float dx_beta, float dw_beta);
// Peak bytes seq_input_grads allocates.
int64_t seq_input_grads_bytes(const Backend& be, const AttentionConfig& c, int64_t rows);

}  // namespace upipe
