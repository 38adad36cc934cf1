// Dense GEMM through oneDNN: C = alpha * op(A) * op(B) + beta * C with fp32 accumulation.
// Operands may be fp32 or bf16 (any mix). oneDNN on AVX2-only CPUs has no bf16 GEMM, so bf16
// operands are staged to fp32 in the arena (tag workspace) one (kGemmTile)^2 block at a time, so
// the staging stays small whatever the shapes; gemm_workspace_bytes() is the exact size, and the
// planner uses it too. C blocks accumulate over K in fp32 and are rounded once.
#pragma once

#include "core/device.h"
#include "core/tensor.h"

namespace upipe {

constexpr int64_t kGemmTile = 256;

// op(A): (M, K), op(B): (K, N), C: (M, N).
void gemm(Device& dev, const Mat& a, bool trans_a, const Mat& b, bool trans_b, const Mat& c,
          float alpha = 1.0f, float beta = 0.0f);

int64_t gemm_workspace_bytes(int64_t m, int64_t n, int64_t k, DType a, DType b, DType c);

// Plain fp32 row-major sgemm on raw pointers (no checks, no workspace): the inner call the
// CPU attention kernel makes per tile.
void sgemm_raw(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha,
               const float* a, int64_t lda, const float* b, int64_t ldb, float beta, float* c,
               int64_t ldc);

}  // namespace upipe
