#include "kernels/attention.h"

#include <cmath>

#include "kernels/attention_tiles.h"
#include "kernels/cpu/attention_cpu.h"

namespace upipe {

float AttnProblem::softmax_scale() const {
  return scale != 0.0f ? scale : 1.0f / std::sqrt(float(d));
}

namespace {

void check_problem(const AttnProblem& p) {
  UPIPE_CHECK(p.hq > 0 && p.hk > 0 && p.d > 0 && p.hq % p.hk == 0,
              "attention heads: hq={} hk={} d={} (hq must be a multiple of hk)", p.hq, p.hk, p.d);
  UPIPE_CHECK(p.q.cols == int64_t(p.hq) * p.d, "q has {} columns, expected hq*d = {}", p.q.cols,
              int64_t(p.hq) * p.d);
  UPIPE_CHECK(p.k.cols == int64_t(p.hk) * p.d && p.v.cols == p.k.cols && p.v.rows == p.k.rows,
              "k/v shapes ({}x{}, {}x{}) do not match hk*d = {}", p.k.rows, p.k.cols, p.v.rows,
              p.v.cols, int64_t(p.hk) * p.d);
  UPIPE_CHECK(p.q.dtype == p.k.dtype && p.k.dtype == p.v.dtype, "q, k, v dtypes differ");
}

void check_rowstat(const Mat& x, int hq, int64_t sq, const char* what) {
  UPIPE_CHECK(x.dtype == DType::kF32 && x.rows == hq && x.cols == sq,
              "{} must be fp32 (hq={}, sq={}), got {}x{}", what, hq, sq, x.rows, x.cols);
}

}  // namespace

void attention_forward(Device& dev, const AttnProblem& p, const Mat& o, const Mat& lse) {
  check_problem(p);
  UPIPE_CHECK(o.rows == p.sq() && o.cols == p.q.cols, "o shape {}x{}", o.rows, o.cols);
  check_rowstat(lse, p.hq, p.sq(), "lse");
  Buffer ws(dev.mem(), attn_fwd_workspace_bytes(p.d, p.q.dtype), Tag::kWorkspace);
  if (dev.is_meta()) return;
  cpu::attention_forward(p, &o, &lse, nullptr, nullptr, nullptr, static_cast<float*>(ws.data()));
}

void attention_accumulate_init(Device& dev, const Mat& acc, const Mat& m, const Mat& l) {
  if (dev.is_meta()) return;
  for (int64_t r = 0; r < acc.rows; ++r)
    std::fill_n(static_cast<float*>(acc.at(r, 0)), acc.cols, 0.0f);
  for (int64_t r = 0; r < m.rows; ++r) {
    std::fill_n(static_cast<float*>(m.at(r, 0)), m.cols, -INFINITY);
    std::fill_n(static_cast<float*>(l.at(r, 0)), l.cols, 0.0f);
  }
}

void attention_forward_accumulate(Device& dev, const AttnProblem& p, const Mat& acc, const Mat& m,
                                  const Mat& l) {
  check_problem(p);
  UPIPE_CHECK(acc.dtype == DType::kF32 && acc.rows == p.sq() && acc.cols == p.q.cols,
              "acc must be fp32 {}x{}", p.sq(), p.q.cols);
  check_rowstat(m, p.hq, p.sq(), "m");
  check_rowstat(l, p.hq, p.sq(), "l");
  Buffer ws(dev.mem(), attn_fwd_workspace_bytes(p.d, p.q.dtype), Tag::kWorkspace);
  if (dev.is_meta()) return;
  cpu::attention_forward(p, nullptr, nullptr, &acc, &m, &l, static_cast<float*>(ws.data()));
}

void attention_finalize(Device& dev, const Mat& acc, const Mat& m, const Mat& l, int d,
                        const Mat& o, const Mat& lse) {
  if (dev.is_meta()) return;
  cpu::attention_finalize(acc, m, l, d, o, lse);
}

void lse_merge(Device& dev, const Mat& o, const Mat& lse, const Mat& o2, const Mat& lse2, int d) {
  UPIPE_CHECK(
      o.rows == o2.rows && o.cols == o2.cols && lse.rows == lse2.rows && lse.cols == lse2.cols,
      "lse_merge operands differ in shape");
  if (dev.is_meta()) return;
  cpu::lse_merge(o, lse, o2, lse2, d);
}

void attention_delta(Device& dev, const Mat& o, const Mat& dout, int d, const Mat& delta) {
  UPIPE_CHECK(o.rows == dout.rows && o.cols == dout.cols, "o and do shapes differ");
  check_rowstat(delta, int(o.cols / d), o.rows, "delta");
  if (dev.is_meta()) return;
  cpu::attention_delta(o, dout, d, delta);
}

void attention_backward(Device& dev, const AttnProblem& p, const Mat& dout, const Mat& lse,
                        const Mat& delta, const Mat& dq, const Mat& dk, const Mat& dv) {
  check_problem(p);
  check_rowstat(lse, p.hq, p.sq(), "lse");
  check_rowstat(delta, p.hq, p.sq(), "delta");
  UPIPE_CHECK(dout.rows == p.sq() && dout.cols == p.q.cols && dout.dtype == p.q.dtype,
              "do must match q");
  UPIPE_CHECK(dq.dtype == DType::kF32 && dk.dtype == DType::kF32 && dv.dtype == DType::kF32,
              "dq, dk, dv accumulate in fp32");
  UPIPE_CHECK(dq.rows == p.sq() && dq.cols == p.q.cols && dk.rows == p.sk() &&
                  dk.cols == p.k.cols && dv.rows == p.sk() && dv.cols == p.k.cols,
              "gradient shapes do not match q, k, v");
  Buffer ws(dev.mem(), attn_bwd_workspace_bytes(p.d, p.q.dtype), Tag::kWorkspace);
  if (dev.is_meta()) return;
  cpu::attention_backward(p, dout, lse, delta, dq, dk, dv, static_cast<float*>(ws.data()));
}

}  // namespace upipe
