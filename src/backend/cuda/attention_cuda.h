// The CUDA backend's flash attention (attention_cuda.cu): forward (normalised or accumulate mode)
// and backward under the contract of docs/backend.md and docs/kernels.md, on plain device views.
// Tiled online softmax in shared memory with fp32 FMA; no sq x sk matrix exists. Tile decisions
// and sizes are the pure functions of attention_plan.h.
//
// Determinism: no atomics. The backward runs two kernels: one per (KV head, key tile) computing
// dk, dv over the query heads of its group in increasing order and the query tiles in increasing
// order; one per (query head, query tile) computing dq over the key tiles in increasing order.
// Every output element is one sequential FMA chain that continues from the value in memory.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "backend/cuda/dev_view.h"

namespace upipe::cuda {

struct DAttn {
  DView q, k, v;  // (sq, hq*d), (sk, hk*d), (sk, hk*d), same dtype (fp32 or bf16)
  int hq = 0, hk = 0, d = 0;
  int64_t q_pos0 = 0, k_pos0 = 0;
  bool causal = true;
  float scale = 0;       // already resolved (never 0 here)
  DDocs q_docs, k_docs;  // both empty (count 0) or both given (document-causal)
};

// Exact workspace of one call with hq, hk heads (0 on the flash kernels, which keep everything in
// registers and shared memory; the backward's cuDNN blocks otherwise: attention_plan.h).
int64_t attention_fwd_workspace_bytes(int hq, int hk, int d, DT t, bool documents);
int64_t attention_bwd_workspace_bytes(int hq, int hk, int d, DT t, bool documents);
// 1 <= d <= 256 (any d: tiles are staged element-wise and zero-padded; 256 bounds the per-lane
// register accumulators and the shared memory), fp32 or bf16, with or without documents.
bool attention_supports(int d, DT t, bool documents);
// Whether the backward of such calls may run on cuDNN given o (a build with cudnn-frontend, bf16,
// d a multiple of 8): the strategies then keep o through it (Backend::attention_backward_reads_o).
bool attention_backward_reads_o(int d, DT t);

// accumulate == false: writes o (sq, hq*d) in q's dtype and lse (hq, sq) fp32; acc, m, l unused.
// accumulate == true: continues acc (sq, hq*d) fp32, m, l (hq, sq) fp32 (from
// attention_accumulate_init: acc 0, m -inf, l 0); o, lse unused. A bf16 call cuDNN can take runs
// there (attention_cudnn.h), in blocks whose normalised partials, stored in bf16, the state takes.
void attention_forward(const DAttn& p, const DView& o, const DView& lse, const DView& acc,
                       const DView& m, const DView& l, bool accumulate, void* ws, cudaStream_t s);
// Accumulates (+=) into fp32 dq (sq, hq*d), dk, dv (sk, hk*d) using the final lse and delta
// (hq, sq) fp32; dout (sq, hq*d) in q's dtype. o (sq, hq*d), the forward's output, may be absent
// (data null); when given, a call cuDNN can take runs there (attention_cudnn.h), in blocks whose
// contributions are rounded to bf16 before they are added.
void attention_backward(const DAttn& p, const DView& o, const DView& dout, const DView& lse,
                        const DView& delta, const DView& dq, const DView& dk, const DView& dv,
                        void* ws, cudaStream_t s);

}  // namespace upipe::cuda
