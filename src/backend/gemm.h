// Dense GEMM front-end: C = alpha * op(A) * op(B) + beta * C with fp32 accumulation. Operands
// may be fp32 or bf16 (any mix), strided views. The workspace (e.g. the CPU backend's bf16
// staging, docs/kernels.md) is taken from the device arena (tag workspace) at exactly
// gemm_workspace_bytes(), which the memory formulas and the planner use too.
#pragma once

#include "backend/device.h"

namespace upipe {

// op(A): (M, K), op(B): (K, N), C: (M, N).
void gemm(Device& dev, const Mat& a, bool trans_a, const Mat& b, bool trans_b, const Mat& c,
          float alpha = 1.0f, float beta = 0.0f);

int64_t gemm_workspace_bytes(const Backend& be, int64_t m, int64_t n, int64_t k, DType a, DType b,
                             DType c);

}  // namespace upipe
