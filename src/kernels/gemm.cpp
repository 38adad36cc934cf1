#include "kernels/gemm.h"

#include <oneapi/dnnl/dnnl.h>

#include <algorithm>

namespace upipe {

void sgemm_raw(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha,
               const float* a, int64_t lda, const float* b, int64_t ldb, float beta, float* c,
               int64_t ldc) {
  if (m == 0 || n == 0) return;
  const dnnl_status_t st = dnnl_sgemm(trans_a ? 'T' : 'N', trans_b ? 'T' : 'N', m, n, k, alpha, a,
                                      lda, b, ldb, beta, c, ldc);
  UPIPE_CHECK(st == dnnl_success, "dnnl_sgemm failed with status {} (m={} n={} k={})", int(st), m,
              n, k);
}

int64_t gemm_workspace_bytes(int64_t m, int64_t n, int64_t k, DType a, DType b, DType c) {
  const int64_t mb = std::min(m, kGemmChunkRows);
  int64_t elems = 0;
  if (a != DType::kF32) elems += mb * k;
  if (b != DType::kF32) elems += k * n;
  if (c != DType::kF32) elems += mb * n;
  return elems * 4;
}

namespace {

// Copies op(X) rows [r0, r0+nr) of a (rows, cols) view into a dense fp32 (nr, cols) buffer.
void stage_rows(const Mat& x, bool trans, int64_t r0, int64_t nr, int64_t cols, float* dst) {
  for (int64_t r = 0; r < nr; ++r) {
    for (int64_t col = 0; col < cols; ++col) {
      const int64_t i = trans ? col : r0 + r, j = trans ? r0 + r : col;
      const void* p = x.at(i, j);
      dst[r * cols + col] = x.dtype == DType::kF32 ? *static_cast<const float*>(p)
                                                   : bf16_to_f32(*static_cast<const uint16_t*>(p));
    }
  }
}

}  // namespace

void gemm(Device& dev, const Mat& a, bool trans_a, const Mat& b, bool trans_b, const Mat& c,
          float alpha, float beta) {
  const int64_t m = trans_a ? a.cols : a.rows, k = trans_a ? a.rows : a.cols;
  const int64_t kb = trans_b ? b.cols : b.rows, n = trans_b ? b.rows : b.cols;
  UPIPE_CHECK(k == kb && c.rows == m && c.cols == n,
              "gemm shape mismatch: op(A) {}x{}, op(B) {}x{}, C {}x{}", m, k, kb, n, c.rows,
              c.cols);
  const bool all_f32 =
      a.dtype == DType::kF32 && b.dtype == DType::kF32 && c.dtype == DType::kF32;
  if (all_f32) {
    if (dev.is_meta()) return;
    sgemm_raw(trans_a, trans_b, m, n, k, alpha, a.f32(), a.ld, b.f32(), b.ld, beta, c.f32(), c.ld);
    return;
  }
  Buffer ws(dev.mem(), gemm_workspace_bytes(m, n, k, a.dtype, b.dtype, c.dtype), Tag::kWorkspace);
  if (dev.is_meta() || m == 0 || n == 0) return;
  const int64_t mb = std::min(m, kGemmChunkRows);
  float* cursor = static_cast<float*>(ws.data());
  float* a32 = nullptr;
  float* b32 = nullptr;
  float* c32 = nullptr;
  if (a.dtype != DType::kF32) { a32 = cursor; cursor += mb * k; }
  if (b.dtype != DType::kF32) { b32 = cursor; cursor += k * n; }
  if (c.dtype != DType::kF32) c32 = cursor;
  // op(B) staged once as a dense (K, N) matrix.
  const float* bp = b.dtype == DType::kF32 ? b.f32() : b32;
  int64_t ldb = b.ld;
  bool tb = trans_b;
  if (b32) {
    stage_rows(b, trans_b, 0, k, n, b32);
    ldb = n;
    tb = false;
  }
  for (int64_t r0 = 0; r0 < m; r0 += mb) {
    const int64_t nr = std::min(mb, m - r0);
    const float* ap;
    int64_t lda;
    bool ta = trans_a;
    if (a32) {
      stage_rows(a, trans_a, r0, nr, k, a32);
      ap = a32;
      lda = k;
      ta = false;
    } else {
      ap = trans_a ? static_cast<const float*>(a.at(0, r0)) : static_cast<const float*>(a.at(r0, 0));
      lda = a.ld;
    }
    if (c32) {
      const Mat cc = c.rows_of(r0, nr);
      if (beta != 0.0f) stage_rows(cc, false, 0, nr, n, c32);
      sgemm_raw(ta, tb, nr, n, k, alpha, ap, lda, bp, ldb, beta, c32, n);
      for (int64_t r = 0; r < nr; ++r) from_f32(c32 + r * n, cc.at(r, 0), c.dtype, n);
    } else {
      sgemm_raw(ta, tb, nr, n, k, alpha, ap, lda, bp, ldb, beta, static_cast<float*>(c.at(r0, 0)),
                c.ld);
    }
  }
}

}  // namespace upipe
