// The normalised attention forward on cuDNN's fused flash attention (SDPA, through cudnn-frontend's
// graph API), where attn::sdpa_plan (attention_plan.h) maps the call and cuDNN supports its graph
// with no workspace; attention_forward (attention_cuda.cu) falls back to the flash kernels
// otherwise. Graphs are built once per layout and cached. Built only when CMake fetched the
// cudnn-frontend headers (UPIPE_CUDNN_SDPA); without them nothing runs here.
#pragma once

#include <cuda_runtime_api.h>

#include "backend/cuda/attention_cuda.h"

namespace upipe::cuda {

// Whether this build has the fast path.
bool cudnn_attention_built();

// Runs o (sq, hq*d) and lse (hq, sq) of p on cuDNN and returns true, or returns false having run
// nothing (not mapped, not supported, or it would need a workspace).
bool cudnn_attention_forward(const DAttn& p, const DView& o, const DView& lse, cudaStream_t s);

}  // namespace upipe::cuda
