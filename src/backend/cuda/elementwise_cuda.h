// The CUDA backend's own kernels for every op of backend.h other than GEMM and attention, on
// strided device views (dev_view.h): each call queues its kernels on stream s and returns, except
// cross_entropy and sum_squares, which return a host value, and gather_rows and scatter_add_rows,
// which pass their ids through the parameter block: these synchronise s. Semantics are
// docs/backend.md's contract ("The contract of every op"); the per-element math and the fixed
// reduction partitions are in elementwise_math.h. Results are deterministic: no atomics, every
// reduction in a fixed order that depends on the shapes only. Ops without a workspace query take
// no device memory (RoPE's runs and frequencies travel in kernel parameters).
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "backend/cuda/dev_view.h"
#include "backend/cuda/param_block.h"

namespace upipe::cuda {

// x = value in x's dtype (any view).
void fill(const DView& x, float value, cudaStream_t s);
// dst = src, dtypes may differ (through fp32, bf16 rounded once); same dtypes copy the bytes.
void convert(const DView& dst, const DView& src, cudaStream_t s);
// dst += src in fp32, rounded once into dst's dtype (any mix of fp32 and bf16).
void add_into(const DView& dst, const DView& src, cudaStream_t s);
// dst (r, c) = beta dst + src^T, fp32 dst (r, c) and src (c, r); beta = 0 does not read dst.
void add_transposed(const DView& dst, const DView& src, float beta, cudaStream_t s);
// Embedding rows (backend.h gather_rows, scatter_add_rows); ids: n host ints, each a row of
// table, copied through pb in chunks (row_groups.h). gather: dst row r = table row ids[r], any
// dtypes. scatter_add: table row ids[r] += src row r in fp32, rounded into table's dtype after
// each addition, r ascending (row_groups.h: grouped on the host, no atomics).
void gather_rows(const DView& dst, const DView& table, const int32_t* ids, int64_t n,
                 ParamBlock& pb, cudaStream_t s);
void scatter_add_rows(const DView& table, const DView& src, const int32_t* ids, int64_t n,
                      ParamBlock& pb, cudaStream_t s);

// Rows [row, row + rows) of x hold positions [pos, pos + rows).
struct RopeRun {
  int64_t row, rows, pos;
};
// In-place rotate-half RoPE of every d-wide head of x (rows, heads*d), sign -1 the inverse. runs
// (nruns) and inv_freq (d/2) are host arrays, passed to the kernels by value.
void rope(const DView& x, int d, const RopeRun* runs, int64_t nruns, const double* inv_freq,
          int sign, cudaStream_t s);

// rmsnorm_forward uses none of it; rmsnorm_backward the dw partials (elementwise_math.h).
int64_t rmsnorm_workspace_bytes(int64_t group);
// y = x / rms(x) * w over each group of x (rows, cols); w (1, group); y may be x.
void rmsnorm_forward(const DView& x, const DView& w, int64_t group, float eps, const DView& y,
                     void* ws, cudaStream_t s);
// dx (may alias dy) = d(y)/d(x)^T dy; dw (1, group) fp32 += sum over the units.
void rmsnorm_backward(const DView& x, const DView& w, int64_t group, float eps, const DView& dy,
                      const DView& dx, const DView& dw, void* ws, cudaStream_t s);

// 0: SwiGLU is elementwise on the GPU.
int64_t swiglu_workspace_bytes(int64_t cols);
// h = silu(a) * b, (T, F) each.
void swiglu_forward(const DView& a, const DView& b, const DView& h, void* ws, cudaStream_t s);
void swiglu_backward(const DView& a, const DView& b, const DView& dh, const DView& da,
                     const DView& db, void* ws, cudaStream_t s);

// In place on fp32 logits (T, V): rows with labels[r] >= 0 become scale (softmax - onehot), rows
// with -1 become 0. labels: T = logits.rows host ints, copied through pb (in chunks of
// ce_layout's rows). Returns the unscaled loss sum (fp64, row order); synchronises s.
double cross_entropy(const DView& logits, const int32_t* labels, int64_t n, float scale,
                     ParamBlock& pb, cudaStream_t s);
// sum x^2 of an fp32 view in fp64, in a fixed order (the same bits every call); synchronises s.
double sum_squares(const DView& x, ParamBlock& pb, cudaStream_t s);

struct AdamWParams {
  double lr, beta1, beta2, eps, weight_decay, grad_scale;
  int64_t step;  // t, from 1
};
// One AdamW step on fp32 w with gradient g and moments m, v (same shape), in place.
void adamw(const DView& w, const DView& g, const DView& m, const DView& v, const AdamWParams& a,
           cudaStream_t s);

// acc (sq, hq*d) = 0, m (hq, sq) = -inf, l (hq, sq) = 0.
void attention_accumulate_init(const DView& acc, const DView& m, const DView& l, cudaStream_t s);
// o (sq, hq*d) = acc / l, lse (hq, sq) = m + log(l); rows with l = 0: o = 0, lse = -inf.
void attention_finalize(const DView& acc, const DView& m, const DView& l, int d, const DView& o,
                        const DView& lse, cudaStream_t s);
// (o, lse) <- merge((o, lse), (o2, lse2)) over disjoint key sets; -inf is an empty partial.
void lse_merge(const DView& o, const DView& lse, const DView& o2, const DView& lse2, int d,
               cudaStream_t s);
// The online state acc (sq, hq*d), m, l (hq, sq), all fp32, takes a normalised partial o2
// (sq, hq*d, any dtype), lse2 (hq, sq) fp32 over other keys (elementwise_math.h partial_merge_*).
void attention_merge_partial(const DView& acc, const DView& m, const DView& l, const DView& o2,
                             const DView& lse2, int d, cudaStream_t s);
// delta (hq, sq) fp32 = rowsum(o * dout) per head; o, dout (sq, hq*d).
void attention_delta(const DView& o, const DView& dout, int d, const DView& delta, cudaStream_t s);

}  // namespace upipe::cuda
