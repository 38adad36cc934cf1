// CPU GEMM through oneDNN (internal to backend/cpu): its matmul primitive in user-scratchpad mode
// (scratchpad from the workspace) where oneDNN runs brgemm, sgemm elsewhere (docs/kernels.md).
// oneDNN 2.6 has no bf16 matmul without AVX-512 BF16, so bf16 operands are staged to fp32 in the
// workspace one (kGemmTile)^2 block at a time; C blocks accumulate over K in fp32 and are rounded
// once. The workspace is exactly gemm_workspace_bytes(): the bf16 staging plus a scratchpad bound
// that is oneDNN's answer for this CPU and thread count (computed and cached per shape).
#pragma once

#include "backend/backend.h"

namespace upipe::cpu {

constexpr int64_t kGemmTile = 256;

int64_t gemm_workspace_bytes(const GemmShape& s);
void gemm(const GemmArgs& g, void* ws);

}  // namespace upipe::cpu
