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
  LtMatrix a, b, c;  // c is also D (in place)
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
// cublasLtMatmul requires its workspace 256-byte aligned (cuBLAS >= 12.9 checks it); the device
// arena aligns blocks to 64 bytes only, so the workspace carries this much slack and the layout
// below starts at the first 256-byte boundary of the block (ws_base).
constexpr int64_t kLtAlignSlack = 256;
inline char* ws_base(void* ws) {
  const uintptr_t at = reinterpret_cast<uintptr_t>(ws);
  return reinterpret_cast<char*>((at + 255) / 256 * 256);
}

// cuBLASLt multiplies two operands of one type: fp32 x fp32 -> fp32, bf16 x bf16 -> fp32 or bf16,
// accumulating in fp32. Everything else is staged through fp32 copies in the workspace, after
// the Lt scratch: a bf16 operand beside an fp32 one is widened (exactly), and an fp32 product
// with a bf16 C runs into an fp32 copy of C that is rounded once at the end. The copies are
// bounded (kStageBytes each), so the workspace does not grow with S: the product runs block by
// block, C in blocks of `mb` rows when C is staged, K in panels of `kp` when an operand is widened
// (each panel accumulates into C in fp32, beta = 1 after the first; the CPU's staged path does
// the same). What is staged is a pure function of the dtypes; the sizes of the shape.
constexpr int64_t kStageBytes = int64_t(32) << 20;

struct GemmStaging {
  bool widen_a = false, widen_b = false;  // row-major A / B copied to fp32, panel by panel
  bool stage_c = false;                   // the product runs on an fp32 copy of C, block by block
  int64_t mb = 0, kp = 0;                 // C rows per block, K per panel
  int64_t a_offset = 0, b_offset = 0, c_offset = 0;  // byte offsets in the workspace
  int64_t bytes = 0;                                 // the whole workspace
};

inline int64_t round_up_256(int64_t b) {
  return (b + 255) / 256 * 256;
}

// The largest block of `whole` units of `unit_elems` fp32 values each that fits kStageBytes
// (at least one unit; a multiple of 64 units when more than 64 fit).
inline int64_t stage_units(int64_t whole, int64_t unit_elems, int64_t budget = kStageBytes) {
  const int64_t fit = std::max<int64_t>(1, budget / (4 * std::max<int64_t>(1, unit_elems)));
  const int64_t n = fit >= 64 ? fit / 64 * 64 : fit;
  return std::max<int64_t>(1, std::min(whole, n));
}

// C (m, n) = op(A) (m, k) op(B) (k, n) with the given dtypes; budget: bytes per staged copy
// (tests make it small to force many blocks).
inline GemmStaging gemm_staging(int64_t m, int64_t n, int64_t k, DT a, DT b, DT c,
                                int64_t budget = kStageBytes) {
  GemmStaging s;
  const bool mixed = a != b;
  s.widen_a = mixed && a == DT::kBF16;
  s.widen_b = mixed && b == DT::kBF16;
  const bool fp32_product = mixed || a == DT::kF32;
  s.stage_c = fp32_product && c == DT::kBF16;
  s.mb = s.stage_c ? stage_units(m, n, budget) : m;
  const int64_t kp_a = s.widen_a ? stage_units(k, s.mb, budget) : k;
  const int64_t kp_b = s.widen_b ? stage_units(k, n, budget) : k;
  s.kp = std::max<int64_t>(1, std::min(kp_a, kp_b));
  int64_t off = kLtWorkspaceBytes;
  if (s.widen_a) {
    s.a_offset = off;
    off += round_up_256(s.mb * s.kp * 4);
  }
  if (s.widen_b) {
    s.b_offset = off;
    off += round_up_256(s.kp * n * 4);
  }
  if (s.stage_c) {
    s.c_offset = off;
    off += round_up_256(s.mb * n * 4);
  }
  s.bytes = off + kLtAlignSlack;
  return s;
}

// One block of the staged product: C rows [r0, r0 + rows) += op(A) rows x K panel [p0, p0 + kp)
// times op(B) panel, with `beta` for C (the caller's beta on a block's first panel, 1 after).
struct GemmBlock {
  int64_t r0 = 0, rows = 0, p0 = 0, kp = 0;
  bool first_panel = true, last_panel = true;
};

// Calls fn(GemmBlock) for every block in order: row blocks outer, K panels inner.
template <class Fn>
void for_each_gemm_block(int64_t m, int64_t k, const GemmStaging& s, Fn&& fn) {
  const int64_t mb = std::max<int64_t>(1, s.mb), kp = std::max<int64_t>(1, s.kp);
  for (int64_t r0 = 0; r0 < m; r0 += mb)
    for (int64_t p0 = 0; p0 < std::max<int64_t>(k, 1); p0 += kp)
      fn(GemmBlock{r0, std::min(mb, m - r0), p0, std::min(kp, k - p0), p0 == 0, p0 + kp >= k});
}

// The sub-views of a block: rows of C, and the matching rows/columns of the stored A and B.
inline DView rows_view(const DView& v, int64_t r0, int64_t n) {
  const int64_t es = v.dtype == DT::kF32 ? 4 : 2;
  return {static_cast<char*>(v.data) + r0 * v.ld * es, v.dtype, n, v.cols, v.ld};
}
inline DView cols_view(const DView& v, int64_t c0, int64_t n) {
  const int64_t es = v.dtype == DT::kF32 ? 4 : 2;
  return {static_cast<char*>(v.data) + c0 * es, v.dtype, v.rows, n, v.ld};
}
// op(A)[r0:r0+rows, p0:p0+kp] as a view of the stored A.
inline DView a_block(const DView& a, bool trans_a, const GemmBlock& b) {
  return trans_a ? cols_view(rows_view(a, b.p0, b.kp), b.r0, b.rows)
                 : cols_view(rows_view(a, b.r0, b.rows), b.p0, b.kp);
}
// op(B)[p0:p0+kp, :] as a view of the stored B.
inline DView b_block(const DView& bv, bool trans_b, const GemmBlock& b) {
  return trans_b ? cols_view(bv, b.p0, b.kp) : rows_view(bv, b.p0, b.kp);
}

}  // namespace upipe::cuda
