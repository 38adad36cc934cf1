// The normalised attention forward and the backward on cuDNN's fused flash attention (SDPA,
// through cudnn-frontend's graph API), where attention_plan.h maps the call (sdpa_plan for the
// forward, within the call's workspace; the blocks of for_each_sdpa_block for the accumulate mode
// and the backward, within their fixed workspace); attention_cuda.cu falls back to the flash
// kernels otherwise. Each graph is built on the frontend's choice of implementation, or on
// COMPOSITE where that one is rejected or wants more workspace. Graphs are built once per layout
// and cached. Built only when CMake fetched the cudnn-frontend headers (UPIPE_CUDNN_SDPA); without
// them nothing runs here.
#pragma once

#include <cuda_runtime_api.h>

#include <string>

#include "backend/cuda/attention_cuda.h"

namespace upipe::cuda {

// Whether this build has the fast path.
bool cudnn_attention_built();
// "cuDNN 9.19.0 (frontend 1.32.0)": the library loaded and the headers built with, or "cuDNN not
// built in".
std::string cudnn_version();

// Runs o (sq, hq*d) and lse (hq, sq) of p on cuDNN and returns true, or returns false having run
// nothing (not mapped, not supported, or it would need more workspace than ws's ws_bytes, the
// call's; ws may be null).
bool cudnn_attention_forward(const DAttn& p, const DView& o, const DView& lse, void* ws,
                             int64_t ws_bytes, cudaStream_t s);

// Continues the online softmax acc (sq, hq*d), m, l (hq, sq), all fp32, of p over p's keys on
// cuDNN and returns true, or returns false having run nothing. The call is cut into the blocks of
// attn::for_each_sdpa_block; each is one cuDNN forward into a bf16 o and fp32 lse in ws (ws_bytes,
// attn::sdpa_fwd_layout) that the state takes (cuda::attention_merge_partial), in block order;
// false when the views are not sdpa_blocks_why_not's, some block has no cuDNN mask at every side
// tried, or cuDNN rejects a block's graph or wants a workspace for it.
bool cudnn_attention_forward_accumulate(const DAttn& p, const DView& acc, const DView& m,
                                        const DView& l, void* ws, int64_t ws_bytes, cudaStream_t s);

// Adds the backward of p into fp32 dq, dk, dv on cuDNN and returns true, or returns false having
// run nothing. o and dout (sq, hq*d) bf16, lse (hq, sq) the forward's. The call is cut into the
// blocks of attn::for_each_sdpa_block, each one cuDNN call into bf16 temporaries in ws (ws_bytes,
// attn::sdpa_bwd_layout) added into dq, dk, dv in block order; false when o is absent, the views
// are not sdpa_bwd_why_not's, some block has no cuDNN mask at every side tried, or cuDNN rejects
// a block or asks for more workspace than is left.
bool cudnn_attention_backward(const DAttn& p, const DView& o, const DView& dout, const DView& lse,
                              const DView& dq, const DView& dk, const DView& dv, void* ws,
                              int64_t ws_bytes, cudaStream_t s);

}  // namespace upipe::cuda
