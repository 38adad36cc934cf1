// CPU GEMM through oneDNN (internal to backend/cpu): its matmul primitive in user-scratchpad mode
// (scratchpad from the workspace) where oneDNN runs brgemm, sgemm elsewhere (docs/kernels.md).
// bf16 A and B run as one bf16 brgemm product (fp32 accumulation, C fp32 or bf16 rounded once)
// where oneDNN has one (AVX512-BF16 CPUs); fp32 A with bf16 B (gradients times bf16 weights)
// there as three bf16 products of A split into hi + mid + lo (bf16x3: an fp32 GEMM's accuracy on
// the bf16 units) when K >= kGemmTile; otherwise, and for other mixes, bf16 operands are staged
// to fp32 in the workspace one (kGemmTile)^2 block at a time, C blocks accumulating over K in
// fp32, rounded once. The workspace is gemm_workspace_bytes(): the largest of the paths' needs,
// from scratchpad bounds that are oneDNN's answer for this CPU and thread count (computed and
// cached per shape).
#pragma once

#include "backend/backend.h"

namespace upipe::cpu {

constexpr int64_t kGemmTile = 256;

int64_t gemm_workspace_bytes(const GemmShape& s);
void gemm(const GemmArgs& g, void* ws);
// Whether oneDNN runs bf16 products natively here (its bf16 brgemm matmul; else they are staged).
bool native_bf16_gemm();

}  // namespace upipe::cpu
