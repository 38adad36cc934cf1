// Front-ends of the attention ops: shape checks, workspace from the arena, backend dispatch.
#include "backend/attention.h"

#include <cmath>

namespace upipe {

float AttnProblem::softmax_scale() const {
  return scale != 0.0f ? scale : 1.0f / std::sqrt(float(d));
}

namespace {

void check_problem(const Backend& be, const AttnProblem& p) {
  UPIPE_CHECK(p.hq > 0 && p.hk > 0 && p.d > 0 && p.hq % p.hk == 0,
              "attention heads: hq={} hk={} d={} (hq must be a multiple of hk)", p.hq, p.hk, p.d);
  UPIPE_CHECK(p.q.cols == int64_t(p.hq) * p.d, "q has {} columns, expected hq*d = {}", p.q.cols,
              int64_t(p.hq) * p.d);
  UPIPE_CHECK(p.k.cols == int64_t(p.hk) * p.d && p.v.cols == p.k.cols && p.v.rows == p.k.rows,
              "k/v shapes ({}x{}, {}x{}) do not match hk*d = {}", p.k.rows, p.k.cols, p.v.rows,
              p.v.cols, int64_t(p.hk) * p.d);
  UPIPE_CHECK(p.q.dtype == p.k.dtype && p.k.dtype == p.v.dtype, "q, k, v dtypes differ");
  UPIPE_CHECK(p.q_docs.empty() == p.k_docs.empty() && (p.causal || !p.documents()),
              "document-causal attention needs the documents of both q and k");
  UPIPE_CHECK(p.q_docs.row0 >= 0 && p.k_docs.row0 >= 0, "negative document row offsets");
  UPIPE_CHECK(be.attention_supports({p.d, p.q.dtype, p.documents(), p.hq, p.hk}),
              "the {} backend has no attention for d={} {}{}", backend_kind_name(be.kind()), p.d,
              dtype_name(p.q.dtype), p.documents() ? " with documents" : "");
}

// The call's arithmetic into the device's count (work_count.h).
void count_attention(Device& dev, const AttnProblem& p, int flops_per_pair_dim) {
  if (p.documents()) {
    ++dev.work().attention_uncounted;
    return;
  }
  const int64_t pairs = visible_pairs(p.sq(), p.sk(), p.q_pos0, p.k_pos0, p.causal);
  dev.work().attention_flops +=
      double(flops_per_pair_dim) * double(p.d) * double(p.hq) * double(pairs);
}

void check_rowstat(const Mat& x, int hq, int64_t sq, const char* what) {
  UPIPE_CHECK(x.dtype == DType::kF32 && x.rows == hq && x.cols == sq,
              "{} must be fp32 (hq={}, sq={}), got {}x{}", what, hq, sq, x.rows, x.cols);
}

}  // namespace

int64_t attention_fwd_workspace_bytes(const Backend& be, int hq, int hk, int d, DType t,
                                      bool documents) {
  return be.attention_fwd_workspace_bytes({d, t, documents, hq, hk});
}

int64_t attention_bwd_workspace_bytes(const Backend& be, int hq, int hk, int d, DType t,
                                      bool documents) {
  return be.attention_bwd_workspace_bytes({d, t, documents, hq, hk});
}

bool attention_backward_reads_o(const Backend& be, int hq, int hk, int d, DType t) {
  return be.attention_backward_reads_o({d, t, false, hq, hk});
}

void attention_forward(Device& dev, const AttnProblem& p, const Mat& o, const Mat& lse) {
  Backend& be = dev.backend();
  check_problem(be, p);
  UPIPE_CHECK(o.rows == p.sq() && o.cols == p.q.cols, "o shape {}x{}", o.rows, o.cols);
  check_rowstat(lse, p.hq, p.sq(), "lse");
  Buffer ws(dev.mem(), attention_fwd_workspace_bytes(be, p.hq, p.hk, p.d, p.q.dtype, p.documents()),
            Tag::kWorkspace);
  AttnFwdArgs a;
  a.p = p;
  a.o = o;
  a.lse = lse;
  be.attention_forward(a, ws.data());
  count_attention(dev, p, kAttentionForwardFlopsPerPairDim);
}

void attention_accumulate_init(Device& dev, const Mat& acc, const Mat& m, const Mat& l) {
  dev.backend().attention_accumulate_init(acc, m, l);
}

void attention_forward_accumulate(Device& dev, const AttnProblem& p, const Mat& acc, const Mat& m,
                                  const Mat& l) {
  Backend& be = dev.backend();
  check_problem(be, p);
  UPIPE_CHECK(acc.dtype == DType::kF32 && acc.rows == p.sq() && acc.cols == p.q.cols,
              "acc must be fp32 {}x{}", p.sq(), p.q.cols);
  check_rowstat(m, p.hq, p.sq(), "m");
  check_rowstat(l, p.hq, p.sq(), "l");
  Buffer ws(dev.mem(), attention_fwd_workspace_bytes(be, p.hq, p.hk, p.d, p.q.dtype, p.documents()),
            Tag::kWorkspace);
  AttnFwdArgs a;
  a.p = p;
  a.acc = acc;
  a.m = m;
  a.l = l;
  a.accumulate = true;
  be.attention_forward(a, ws.data());
  count_attention(dev, p, kAttentionForwardFlopsPerPairDim);
}

void attention_finalize(Device& dev, const Mat& acc, const Mat& m, const Mat& l, int d,
                        const Mat& o, const Mat& lse) {
  UPIPE_CHECK(acc.rows == o.rows && acc.cols == o.cols && m.cols == acc.rows,
              "attention_finalize shapes");
  dev.backend().attention_finalize(acc, m, l, d, o, lse);
}

void lse_merge(Device& dev, const Mat& o, const Mat& lse, const Mat& o2, const Mat& lse2, int d) {
  UPIPE_CHECK(
      o.rows == o2.rows && o.cols == o2.cols && lse.rows == lse2.rows && lse.cols == lse2.cols,
      "lse_merge operands differ in shape");
  dev.backend().lse_merge(o, lse, o2, lse2, d);
}

void attention_delta(Device& dev, const Mat& o, const Mat& dout, int d, const Mat& delta) {
  UPIPE_CHECK(o.rows == dout.rows && o.cols == dout.cols, "o and do shapes differ");
  check_rowstat(delta, int(o.cols / d), o.rows, "delta");
  dev.backend().attention_delta(o, dout, d, delta);
}

void attention_backward(Device& dev, const AttnProblem& p, const Mat& dout, const Mat& lse,
                        const Mat& delta, const Mat& dq, const Mat& dk, const Mat& dv,
                        const Mat& o) {
  Backend& be = dev.backend();
  check_problem(be, p);
  check_rowstat(lse, p.hq, p.sq(), "lse");
  check_rowstat(delta, p.hq, p.sq(), "delta");
  UPIPE_CHECK(dout.rows == p.sq() && dout.cols == p.q.cols && dout.dtype == p.q.dtype,
              "do must match q");
  UPIPE_CHECK(dq.dtype == DType::kF32 && dk.dtype == DType::kF32 && dv.dtype == DType::kF32,
              "dq, dk, dv accumulate in fp32");
  UPIPE_CHECK(dq.rows == p.sq() && dq.cols == p.q.cols && dk.rows == p.sk() &&
                  dk.cols == p.k.cols && dv.rows == p.sk() && dv.cols == p.k.cols,
              "gradient shapes do not match q, k, v");
  UPIPE_CHECK(o.data == nullptr || (o.rows == p.sq() && o.cols == p.q.cols && o.dtype == p.q.dtype),
              "o must match q");
  Buffer ws(dev.mem(), attention_bwd_workspace_bytes(be, p.hq, p.hk, p.d, p.q.dtype, p.documents()),
            Tag::kWorkspace);
  be.attention_backward({p, dout, lse, delta, dq, dk, dv, o}, ws.data());
  count_attention(dev, p, kAttentionBackwardFlopsPerPairDim);
}

}  // namespace upipe
