// CPU GEMM through oneDNN (internal to backend/cpu). oneDNN on AVX2-only CPUs has no bf16 GEMM,
// so bf16 operands are staged to fp32 in the workspace one (kGemmTile)^2 block at a time; C
// blocks accumulate over K in fp32 and are rounded once.
#pragma once

#include "backend/backend.h"

namespace upipe::cpu {

constexpr int64_t kGemmTile = 256;

int64_t gemm_workspace_bytes(const GemmShape& s);
void gemm(const GemmArgs& g, void* ws);

// Plain fp32 row-major sgemm on raw pointers (no checks, no workspace).
void sgemm_raw(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha,
               const float* a, int64_t lda, const float* b, int64_t ldb, float beta, float* c,
               int64_t ldc);

}  // namespace upipe::cpu
