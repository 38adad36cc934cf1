// How a row-major GEMM of the Backend contract (C(m, n) = alpha op(A) op(B) + beta C, strided
// views) becomes cuBLASLt's column-major problem, and what the CUDA GEMM takes from its
// workspace. Pure host code: tests/unit/test_cuda_gemm_desc.cpp executes the descriptor with a
// naive column-major GEMM and compares it with the row-major oracle, on every build.
//
// A row-major (r, c) matrix with row stride ld is, read column-major, its transpose: a (c, r)
// matrix with leading dimension ld. So C^T = op(B)^T op(A)^T is a column-major product whose
// first operand is B's storage (transposed iff trans_b) and whose second is A's (iff trans_a):
// M = n, N = m, K = k, and no data moves.
#pragma once

#include <algorithm>
#include <cstdint>

#include "backend/cuda/dev_view.h"

namespace upipe::cuda {

// One operand as cuBLASLt's matrix layout sees it: column-major rows x cols, leading dim ld.
struct LtMatrix {
  const void* ptr = nullptr;
  DT dtype = DT::kF32;
  int64_t rows = 0, cols = 0, ld = 0;
};

struct LtProblem {
  int64_t m = 0, n = 0, k = 0;  // column-major: D (m, n) = alpha op(A) (m, k) op(B) (k, n) + beta C
  bool trans_a = false, trans_b = false;
  LtMatrix a, b, c;             // c is also D (in place)
  float alpha = 1.0f, beta = 0.0f;
};

inline LtMatrix lt_matrix(const DView& v) {
  return {v.data, v.dtype, v.cols, v.rows, v.ld};
}

// The column-major problem of row-major C(m, n) = alpha op(A) op(B) + beta C.
inline LtProblem lt_problem(const DView& a, bool trans_a, const DView& b, bool trans_b,
                            const DView& c, float alpha, float beta) {
  LtProblem p;
  p.m = c.cols;
  p.n = c.rows;
  p.k = trans_a ? a.rows : a.cols;
  p.trans_a = trans_b;
  p.trans_b = trans_a;
  p.a = lt_matrix(b);
  p.b = lt_matrix(a);
  p.c = lt_matrix(c);
  p.alpha = alpha;
  p.beta = beta;
  return p;
}

// cuBLASLt's own scratch per call: NVIDIA's recommendation for Hopper (32 MiB), handed to every
// cublasLtMatmul from the arena so no GEMM allocates behind the accounting.
constexpr int64_t kLtWorkspaceBytes = int64_t(32) << 20;

// cuBLASLt multiplies two operands of one type: fp32 x fp32 -> fp32, bf16 x bf16 -> fp32 or bf16,
// accumulating in fp32. Everything else is staged through fp32 copies in the workspace, after
// the Lt scratch: a bf16 operand beside an fp32 one is widened (exactly), and an fp32 product
// with a bf16 C runs into an fp32 copy of C that is rounded once at the end. What is staged is a
// pure function of the dtypes; the bytes of the shape.
struct GemmStaging {
  bool widen_a = false, widen_b = false;  // row-major A / B copied to fp32
  bool stage_c = false;                   // the product runs on an fp32 copy of C
  int64_t a_offset = 0, b_offset = 0, c_offset = 0;  // byte offsets in the workspace
  int64_t bytes = 0;                                  // the whole workspace
};

inline int64_t round_up_256(int64_t b) {
  return (b + 255) / 256 * 256;
}

// a_elems, b_elems: element counts of op(A) (m*k) and op(B) (k*n); the staging copies are
// contiguous.
inline GemmStaging gemm_staging(int64_t m, int64_t n, int64_t k, DT a, DT b, DT c) {
  GemmStaging s;
  const bool mixed = a != b;
  s.widen_a = mixed && a == DT::kBF16;
  s.widen_b = mixed && b == DT::kBF16;
  const bool fp32_product = mixed || a == DT::kF32;
  s.stage_c = fp32_product && c == DT::kBF16;
  int64_t off = kLtWorkspaceBytes;
  if (s.widen_a) {
    s.a_offset = off;
    off += round_up_256(m * k * 4);
  }
  if (s.widen_b) {
    s.b_offset = off;
    off += round_up_256(k * n * 4);
  }
  if (s.stage_c) {
    s.c_offset = off;
    off += round_up_256(m * n * 4);
  }
  s.bytes = off;
  return s;
}

}  // namespace upipe::cuda
