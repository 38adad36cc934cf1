// Dense GEMM through oneDNN's matmul primitive: C = alpha * op(A) * op(B) + beta * C with fp32
// accumulation. Operands may be fp32 or bf16 (any mix). oneDNN 2.6 has no bf16 matmul without
// AVX-512 BF16, so bf16 operands are staged to fp32 in the arena (tag workspace) one
// (kGemmTile)^2 block at a time, so the staging stays small whatever the shapes. The primitive
// runs in user-scratchpad mode: its scratchpad is part of the same workspace buffer.
// gemm_workspace_bytes() is the exact size, and the planner uses it too. C blocks accumulate
// over K in fp32 and are rounded once.
#pragma once

#include "core/device.h"
#include "core/tensor.h"

namespace upipe {

constexpr int64_t kGemmTile = 256;

// op(A): (M, K), op(B): (K, N), C: (M, N).
void gemm(Device& dev, const Mat& a, bool trans_a, const Mat& b, bool trans_b, const Mat& c,
          float alpha = 1.0f, float beta = 0.0f);

// Workspace bytes gemm() takes from the arena for an (M, N, K) product: bf16 staging plus the
// matmul scratchpad. It depends on the shape and dtypes only (not on strides, transposes, alpha or
// beta), but the scratchpad part is oneDNN's answer for this CPU and thread count, so it is
// computed by creating (and caching) primitive descriptors, not by a formula.
int64_t gemm_workspace_bytes(int64_t m, int64_t n, int64_t k, DType a, DType b, DType c);

}  // namespace upipe
