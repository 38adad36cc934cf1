#include "attention/head_core.h"

namespace upipe {

namespace {

// p with the whole sequence's documents on its q and k rows (both cover the sequence in order).
AttnProblem with_mask(AttnProblem p, const DocMask* mask) {
  if (mask) p.q_docs = p.k_docs = mask->list(0);
  return p;
}

}  // namespace

void LocalCore::forward(const AttnProblem& p, const DocMask* mask, const Mat& o, const Mat& lse) {
  attention_forward(dev_, with_mask(p, mask), o, lse);
}

void LocalCore::backward(const AttnProblem& p, const DocMask* mask, const Mat& dout, const Mat& lse,
                         const Mat& delta, const Mat& dq, const Mat& dk, const Mat& dv,
                         const Mat& o) {
  attention_backward(dev_, with_mask(p, mask), dout, lse, delta, dq, dk, dv, o);
}

std::vector<RowPositions> LocalCore::mask_views(const Documents& d) const {
  return {RowPositions::contiguous(d.seq_len(), 0)};
}

int64_t LocalCore::forward_bytes(int hq, int hk) const {
  return attention_fwd_workspace_bytes(dev_.backend(), hq, hk, d_, t_);
}
int64_t LocalCore::backward_bytes(int hq, int hk) const {
  return attention_bwd_workspace_bytes(dev_.backend(), hq, hk, d_, t_);
}

}  // namespace upipe
