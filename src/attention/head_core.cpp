#include "attention/head_core.h"

namespace upipe {

void LocalCore::forward(const AttnProblem& p, const Mat& o, const Mat& lse) {
  attention_forward(dev_, p, o, lse);
}

void LocalCore::backward(const AttnProblem& p, const Mat& dout, const Mat& lse, const Mat& delta,
                         const Mat& dq, const Mat& dk, const Mat& dv) {
  attention_backward(dev_, p, dout, lse, delta, dq, dk, dv);
}

int64_t LocalCore::forward_bytes(int, int) const {
  return attention_fwd_workspace_bytes(dev_.backend(), d_, t_);
}
int64_t LocalCore::backward_bytes(int, int) const {
  return attention_bwd_workspace_bytes(dev_.backend(), d_, t_);
}

}  // namespace upipe
