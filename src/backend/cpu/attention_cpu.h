// CPU flash-attention kernels (internal to backend/cpu): tiles of attention_tiles.h, Highway
// micro-kernels of attn_micro-inl.h on packed K/V/Q/dO tiles, vectorised online softmax (see
// docs/kernels.md). Workspace comes from the caller (attention.cpp), sized by
// attn_*_workspace_bytes().
#pragma once

#include "backend/attention.h"

namespace upipe::cpu {

// Which kernels bf16 attention runs on: converted to fp32 (avx2, avx512), on the AVX512-BF16 dot
// product (avx512bf16) or on AMX tiles (amx; head_dim % 32 != 0 falls back to the dot product);
// docs/kernels.md.
enum class AttnBf16 : int { kNone, kDot, kAmx };
AttnBf16 attn_bf16_mode(DType t);

// Whether attention on dtype t keeps its tiles in bf16 (kDot or kAmx): its workspace has the
// bf16_dot layout of attention_tiles.h.
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
