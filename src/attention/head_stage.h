// The pieces of one stage of the headwise engine (headwise.h: Ulysses, UPipe, FPDT): projecting a
// stage's query heads or a KV set straight into the all-to-all layout, the output projection,
// and the return of a stage's dq and a KV set's dK/dV to sequence layout (the head runs the
// kernel is called on are in upipe_schedule.h).
//
// Every helper works on x rows at given global positions: the whole shard (S/C rows) with N = 1,
// one sub-chunk (S/(N C) rows) with N > 1. After the all-to-all, a head-sharded buffer
// holds C times those rows, rank 0's first, so it covers n = C * rows tokens in rank order.
#pragma once

#include <vector>

#include "attention/config.h"
#include "attention/strategy.h"
#include "attention/upipe_schedule.h"
#include "backend/attention.h"
#include "backend/device.h"
#include "backend/rope.h"
#include "comm/communicator.h"
#include "core/tensor.h"

namespace upipe {

// What the stage helpers work with: the device, the all-to-all group, the block shape and the
// schedule.
struct StageEnv {
  Device& dev;
  Communicator& comm;
  const AttentionConfig& cfg;
  const UpipeSchedule& sch;
};

// Block j of a buffer that holds contiguous (rows, cols) matrices back to back (the layout of
// all-to-all staging buffers: block j goes to / comes from rank j).
Mat a2a_block(const Buffer& buf, DType t, int64_t rows, int64_t cols, int j);

// The stage's query heads of every rank's x rows: x (rows, D) at positions pos, projected per
// destination rank into staging (C blocks (rows, m*d)), QK-norm, RoPE: what the all-to-all
// sends.
void project_q_blocks(const StageEnv& e, const Mat& x, const RowPositions& pos,
                      const AttentionWeights& w, int stage, const Buffer& staging);
// q (n, m*d) <- project_q_blocks, then the all-to-all.
void project_q(const StageEnv& e, const Mat& x, const RowPositions& pos, const AttentionWeights& w,
               int stage, const Buffer& staging, const Mat& q);
// Bytes of one rank's block of a stage's all-to-all: (rows, m*d) of dtype t.
int64_t stage_bytes(const StageEnv& e, int64_t rows, DType t);

// k, v (n, R*d) <- KV set `set` (K < C: the one replicated head) of every rank's x rows, the
// same way; k gets QK-norm and RoPE.
void project_kv(const StageEnv& e, const Mat& x, const RowPositions& pos, const AttentionWeights& w,
                int set, const Buffer& staging, const Mat& k, const Mat& v);
// K >= C: one half of project_kv without its all-to-all: the K (pass 0, with QK-norm and RoPE) or
// V (pass 1) blocks of KV set `set` into staging (C blocks (rows, R*d), kv_stage_bytes),
// what the all-to-all into k or v sends. Stage overlap projects the next set this way.
void project_kv_blocks(const StageEnv& e, const Mat& x, const RowPositions& pos,
                       const AttentionWeights& w, int set, int pass, const Buffer& staging);
// Bytes of project_kv_blocks' staging for `rows` local rows: C (rows, R*d) blocks.
int64_t kv_stage_bytes(const AttentionConfig& c, const UpipeSchedule& s, int64_t rows);

// y (rows, D) = beta y + the stage's o blocks (C blocks (rows, m*d) in staging, back in sequence
// layout) times their slices of Wo.
void accumulate_out(const StageEnv& e, const Mat& wo, int stage, const Buffer& staging,
                    const Mat& y, float beta);

// The stage's fp32 dq blocks (C blocks (rows, m*d) in staging, back in sequence layout): RoPE and
// QK-norm backward (recomputing the pre-norm q), dx (rows, D) = dx_beta dx + dq Wq[stage rows],
// gq rows = dw_beta gq rows + dq^T x; g.wqn += (zero it first).
void return_q_grads(const StageEnv& e, const Mat& x, const RowPositions& pos,
                    const AttentionWeights& w, int stage, const Buffer& staging, const Mat& dx,
                    const AttentionGrads& g, float dx_beta, float dw_beta);
// Peak workspace of return_q_grads.
int64_t return_q_grads_bytes(const Backend& be, const AttentionConfig& c, const UpipeSchedule& s,
                             int64_t rows);

// Sends the set's fp32 gradients dk, dv (n, R*d) back to sequence layout through staging
// (fp32-sized), sums the replicas of a K < C head, applies RoPE and QK-norm backward to dk and
// accumulates dx (rows, D) += dk Wk + dv Wv; gk, gv rows = dk^T x + dw_beta * gk, gv rows;
// g.wkn +=.
void return_kv_grads(const StageEnv& e, const Mat& x, const RowPositions& pos,
                     const AttentionWeights& w, int set, const Mat& dk, const Mat& dv,
                     const Buffer& staging, const Mat& dx, const AttentionGrads& g, float dw_beta);
// Peak workspace of return_kv_grads.
int64_t return_kv_grads_bytes(const Backend& be, const AttentionConfig& c, const UpipeSchedule& s,
                              int64_t rows, DType dx);

// The kernel problem of one head run: the run's query heads of q (n, m*d) against the KV heads
// it reads in k, v (n', R*d); positions default to row 0 = position 0.
AttnProblem run_problem(const HeadRun& r, const Mat& q, const Mat& k, const Mat& v, int d);

// Staging blocks j of the backward's do: dy (rows, D) times the Wo columns of the stage's heads
// on rank j. Each block's columns are first copied to a contiguous (D, m*d) buffer: oneDNN runs
// a narrow B with a wide row stride at about half speed.
void project_do(const StageEnv& e, const Mat& dy, const Mat& wo, int stage, const Buffer& staging);
// Peak workspace of project_do.
int64_t project_do_bytes(const Backend& be, const AttentionConfig& c, const UpipeSchedule& s,
                         int64_t rows);

// gwo[:, columns of rank j's stage heads] = beta gwo[...] + dy^T o_j for the o blocks (rows, m*d)
// in staging, computed as (o_j^T dy)^T through an fp32 (m*d, D) buffer: oneDNN's transposed-A
// GEMM with a narrow N runs at about half speed.
void accumulate_dwo(const StageEnv& e, const Mat& dy, int stage, const Buffer& staging,
                    const Mat& gwo, float beta);
// Peak workspace of accumulate_dwo.
int64_t accumulate_dwo_bytes(const Backend& be, const AttentionConfig& c, const UpipeSchedule& s,
                             int64_t rows);

// The all-to-all calls and bytes of one forward (backward = false) or backward pass over every
// KV set and stage, for `rows` local rows (S/C for headwise, S/(N C) per fpdt chunk): k and v per
// set (+ dk, dv), q and o per stage (+ do, dq).
void add_headwise_pass_comm(CommStats& st, const AttentionConfig& c, const UpipeSchedule& s,
                            int64_t rows, bool backward);

}  // namespace upipe
