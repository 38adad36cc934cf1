// CPU flash-attention kernels (internal to backend/cpu): tiles of attention_tiles.h, Highway
// micro-kernels of attn_micro-inl.h on packed K/V/Q/dO tiles, vectorised online softmax (see
// docs/kernels.md). Workspace comes from the caller (attention.cpp), sized by
// attn_*_workspace_bytes().
#pragma once

#include "backend/attention.h"

namespace upipe::cpu {

// Whether attention on dtype t runs on the bf16 dot product (bf16 inputs on the avx512bf16
// path; docs/kernels.md): its workspace has the bf16_dot layout of attention_tiles.h.
bool attn_bf16_dot(DType t);

// If acc is null the call is a normalised forward (writes o, lse); otherwise it continues the
// online softmax in acc/m/l.
void attention_forward(const AttnProblem& p, const Mat* o, const Mat* lse, const Mat* acc,
                       const Mat* m, const Mat* l, float* ws);
void attention_backward(const AttnProblem& p, const Mat& dout, const Mat& lse, const Mat& delta,
                        const Mat& dq, const Mat& dk, const Mat& dv, float* ws);
void attention_delta(const Mat& o, const Mat& dout, int d, const Mat& delta);
void attention_finalize(const Mat& acc, const Mat& m, const Mat& l, int d, const Mat& o,
                        const Mat& lse);
void lse_merge(const Mat& o, const Mat& lse, const Mat& o2, const Mat& lse2, int d);

}  // namespace upipe::cpu
