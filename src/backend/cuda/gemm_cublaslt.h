// GEMM on the GPU through cuBLASLt (internal to backend/cuda): the row-major problem becomes a
// column-major one without moving data (gemm_desc.h), fp32 accumulation (CUBLAS_COMPUTE_32F,
// no TF32, so results stay within the CPU's fp32 rule), bf16 operands natively, other dtype
// mixes staged block by block through bounded fp32 copies in the workspace (gemm_desc.h). The
// workspace is gemm_workspace_bytes(): cuBLASLt's scratch (kLtWorkspaceBytes) plus the staging,
// all from the arena, independent of S beyond kStageBytes per staged operand.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <memory>

#include "backend/cuda/dev_view.h"

namespace upipe::cuda {

int64_t gemm_workspace_bytes(int64_t m, int64_t n, int64_t k, DT a, DT b, DT c);

class LtGemm {
 public:
  LtGemm();
  ~LtGemm();
  LtGemm(const LtGemm&) = delete;
  LtGemm& operator=(const LtGemm&) = delete;
  // C = alpha op(A) op(B) + beta C on row-major views; ws holds gemm_workspace_bytes() bytes.
  void run(const DView& a, bool trans_a, const DView& b, bool trans_b, const DView& c, float alpha,
           float beta, void* ws, cudaStream_t s);

 private:
  void product(const DView& a, bool trans_a, const DView& b, bool trans_b, const DView& c,
               float alpha, float beta, void* ws, cudaStream_t s);
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace upipe::cuda
