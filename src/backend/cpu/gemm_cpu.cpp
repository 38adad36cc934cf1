#include "backend/cpu/gemm_cpu.h"

#include <oneapi/dnnl/dnnl.h>

#include <algorithm>
#include <utility>

namespace upipe::cpu {

void sgemm_raw(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha,
               const float* a, int64_t lda, const float* b, int64_t ldb, float beta, float* c,
               int64_t ldc) {
  if (m == 0 || n == 0) return;
  const dnnl_status_t st = dnnl_sgemm(trans_a ? 'T' : 'N', trans_b ? 'T' : 'N', m, n, k, alpha, a,
                                      lda, b, ldb, beta, c, ldc);
  UPIPE_CHECK(st == dnnl_success, "dnnl_sgemm failed with status {} (m={} n={} k={})", int(st), m,
              n, k);
}

int64_t gemm_workspace_bytes(const GemmShape& s) {
  const int64_t m = s.m, n = s.n, k = s.k;
  const DType a = s.a, b = s.b, c = s.c;
  if (a == DType::kF32 && b == DType::kF32 && c == DType::kF32) return 0;
  const int64_t mb = std::min(m, kGemmTile), nb = std::min(n, kGemmTile),
                kb = std::min(k, kGemmTile);
  int64_t elems = 0;
  if (a != DType::kF32) elems += mb * kb;
  if (b != DType::kF32) elems += kb * nb;
  if (c != DType::kF32) elems += mb * nb;
  return elems * 4;
}

namespace {

// Copies the block of op(X) at rows [r0, r0+nr), columns [c0, c0+nc) into a dense fp32 (nr, nc)
// buffer.
void stage(const Mat& x, bool trans, int64_t r0, int64_t nr, int64_t c0, int64_t nc, float* dst) {
  for (int64_t r = 0; r < nr; ++r) {
    if (!trans) {
      to_f32(x.at(r0 + r, c0), x.dtype, dst + r * nc, nc);
      continue;
    }
    for (int64_t col = 0; col < nc; ++col) {
      const void* p = x.at(c0 + col, r0 + r);
      dst[r * nc + col] = x.dtype == DType::kF32 ? *static_cast<const float*>(p)
                                                 : bf16_to_f32(*static_cast<const uint16_t*>(p));
    }
  }
}

// Address of element (r, c) of op(X).
const float* op_at(const Mat& x, bool trans, int64_t r, int64_t c) {
  return static_cast<const float*>(trans ? x.at(c, r) : x.at(r, c));
}

}  // namespace

void gemm(const GemmArgs& g, void* ws) {
  const Mat &a = g.a, &b = g.b, &c = g.c;
  const bool trans_a = g.trans_a, trans_b = g.trans_b;
  const float alpha = g.alpha, beta = g.beta;
  const GemmShape s = g.shape();
  const int64_t m = s.m, n = s.n, k = s.k;
  const bool all_f32 = a.dtype == DType::kF32 && b.dtype == DType::kF32 && c.dtype == DType::kF32;
  if (all_f32) {
    sgemm_raw(trans_a, trans_b, m, n, k, alpha, a.f32(), a.ld, b.f32(), b.ld, beta, c.f32(), c.ld);
    return;
  }
  if (m == 0 || n == 0) return;
  const int64_t mt = std::min(m, kGemmTile), nt = std::min(n, kGemmTile),
                kt = std::min(k, kGemmTile);
  float* cursor = static_cast<float*>(ws);
  float* a32 = a.dtype != DType::kF32 ? std::exchange(cursor, cursor + mt * kt) : nullptr;
  float* b32 = b.dtype != DType::kF32 ? std::exchange(cursor, cursor + kt * nt) : nullptr;
  float* c32 = c.dtype != DType::kF32 ? cursor : nullptr;
  for (int64_t m0 = 0; m0 < m; m0 += mt) {
    const int64_t nr = std::min(mt, m - m0);
    for (int64_t n0 = 0; n0 < n; n0 += nt) {
      const int64_t nc = std::min(nt, n - n0);
      const Mat cblk = c.block(m0, nr, n0, nc);
      float* cp = c32 ? c32 : static_cast<float*>(cblk.data);
      const int64_t ldc = c32 ? nc : c.ld;
      float beta_k = beta;
      if (c32 && beta != 0.0f) {
        stage(cblk, false, 0, nr, 0, nc, c32);
      }
      if (k == 0 && c32) {
        for (int64_t i = 0; i < nr * nc; ++i) c32[i] *= beta;
      }
      for (int64_t k0 = 0; k0 < k; k0 += kt) {
        const int64_t nk = std::min(kt, k - k0);
        const float* ap = a32;
        const float* bp = b32;
        int64_t lda = nk, ldb = nc;
        bool ta = false, tb = false;
        if (a32)
          stage(a, trans_a, m0, nr, k0, nk, a32);
        else
          ap = op_at(a, trans_a, m0, k0), lda = a.ld, ta = trans_a;
        if (b32)
          stage(b, trans_b, k0, nk, n0, nc, b32);
        else
          bp = op_at(b, trans_b, k0, n0), ldb = b.ld, tb = trans_b;
        sgemm_raw(ta, tb, nr, nc, nk, alpha, ap, lda, bp, ldb, beta_k, cp, ldc);
        beta_k = 1.0f;
      }
      if (c32)
        for (int64_t r = 0; r < nr; ++r) from_f32(c32 + r * nc, cblk.at(r, 0), c.dtype, nc);
    }
  }
}

}  // namespace upipe::cpu
