// Flash-style causal attention (tiled, online softmax; no S x S matrix ever exists), forward
// and backward, with GQA and explicit strides.
//
// Layout: q is a (sq, hq*d) view and k, v are (sk, hk*d) views; head h occupies columns
// [h*d, (h+1)*d), and query head h reads KV head h / (hq/hk). Row strides (Mat::ld) let
// head-sharded and sequence-sharded slices be passed without copies. Query row i sits at global
// position q_pos0 + i, key row j at k_pos0 + j; with causal masking key j is visible to query
// i when k_pos0 + j <= q_pos0 + i. Ring and chunked strategies call the kernel on blocks.
//
// With documents (AttnProblem::q_docs, k_docs: backend.h) query row i sees key row j when both are
// in the same document and j's position in it is at most i's (document-causal); the kernels decide
// per (query tile, key tile) from the documents' spans whether to skip it, so the cost follows the
// sum of the documents' squared lengths.
//
// Rows that see no key get o = 0 and lse = -inf (and contribute nothing in backward).
// Reduction-order contract (CPU): see cpu/attention_tiles.h and docs/kernels.md. AttnProblem is
// in backend.h. Each call takes its workspace from the device arena (tag workspace).
#pragma once

#include "backend/device.h"

namespace upipe {

// Normalised output: o (sq, hq*d) in q's dtype, lse (hq, sq) fp32 natural-log log-sum-exp.
void attention_forward(Device& dev, const AttnProblem& p, const Mat& o, const Mat& lse);

// Online-softmax continuation for chunked strategies: acc (sq, hq*d) fp32 holds the
// un-normalised output sum_j exp(s_ij - m_i) v_j, m and l (hq, sq) fp32 the running row max
// and row sum. Start from attention_accumulate_init(); end with attention_finalize().
void attention_accumulate_init(Device& dev, const Mat& acc, const Mat& m, const Mat& l);
void attention_forward_accumulate(Device& dev, const AttnProblem& p, const Mat& acc, const Mat& m,
                                  const Mat& l);
// o = acc / l (in o's dtype), lse = m + log(l); rows with l = 0 get o = 0, lse = -inf.
void attention_finalize(Device& dev, const Mat& acc, const Mat& m, const Mat& l, int d,
                        const Mat& o, const Mat& lse);

// Merge of two partial results over disjoint key sets: (o, lse) <- merge((o, lse), (o2, lse2)).
// o, o2: (sq, hq*d); lse, lse2: (hq, sq) fp32.
void lse_merge(Device& dev, const Mat& o, const Mat& lse, const Mat& o2, const Mat& lse2, int d);

// delta (hq, sq) fp32 = rowsum(do * o) per head: the backward's preprocessing, computed before
// o is freed.
void attention_delta(Device& dev, const Mat& o, const Mat& dout, int d, const Mat& delta);

// Backward: accumulates (+=) into dq (sq, hq*d), dk and dv (sk, hk*d), all fp32. Needs the
// forward's final lse and delta over all keys, so it can be called key block by key block. o,
// the forward's output rows of q (empty where the caller no longer holds it), lets a backend
// run the call on a library kernel that derives delta from o itself (cuDNN's, on the CUDA
// backend); the result is the same op within the backend's precision contract either way.
void attention_backward(Device& dev, const AttnProblem& p, const Mat& dout, const Mat& lse,
                        const Mat& delta, const Mat& dq, const Mat& dk, const Mat& dv,
                        const Mat& o = {});

// Whether the backward of such calls wants the forward's o (Backend::attention_backward_reads_o):
// a caller that would free o before the backward keeps it through the call then.
bool attention_backward_reads_o(const Backend& be, int hq, int hk, int d, DType t);

// Workspace of one forward / backward call with hq query and hk KV heads of dim d on dtype t,
// with or without documents (the backend's query; it never depends on the rows).
int64_t attention_fwd_workspace_bytes(const Backend& be, int hq, int hk, int d, DType t,
                                      bool documents = false);
int64_t attention_bwd_workspace_bytes(const Backend& be, int hq, int hk, int d, DType t,
                                      bool documents = false);

}  // namespace upipe
