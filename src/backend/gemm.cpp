#include "backend/gemm.h"

namespace upipe {

GemmShape GemmArgs::shape() const {
  return {trans_a ? a.cols : a.rows,
          trans_b ? b.rows : b.cols,
          trans_a ? a.rows : a.cols,
          a.dtype,
          b.dtype,
          c.dtype};
}

int64_t gemm_workspace_bytes(const Backend& be, int64_t m, int64_t n, int64_t k, DType a, DType b,
                             DType c) {
  return be.gemm_workspace_bytes({m, n, k, a, b, c});
}

void gemm(Device& dev, const Mat& a, bool trans_a, const Mat& b, bool trans_b, const Mat& c,
          float alpha, float beta) {
  const GemmArgs g{a, trans_a, b, trans_b, c, alpha, beta};
  const GemmShape s = g.shape();
  const int64_t kb = trans_b ? b.cols : b.rows;
  UPIPE_CHECK(s.k == kb && c.rows == s.m && c.cols == s.n,
              "gemm shape mismatch: op(A) {}x{}, op(B) {}x{}, C {}x{}", s.m, s.k, kb, s.n, c.rows,
              c.cols);
  Backend& be = dev.backend();
  UPIPE_CHECK(be.gemm_supports(s), "the {} backend has no GEMM for {} x {} -> {}",
              backend_kind_name(be.kind()), dtype_name(s.a), dtype_name(s.b), dtype_name(s.c));
  Buffer ws(dev.mem(), be.gemm_workspace_bytes(s), Tag::kWorkspace);
  be.gemm(g, ws.data());
  dev.work().gemm_flops += 2.0 * double(s.m) * double(s.n) * double(s.k);
}

}  // namespace upipe
