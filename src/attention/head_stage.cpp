#include "attention/head_stage.h"

#include <algorithm>

#include "backend/gemm.h"
#include "backend/rmsnorm.h"
#include "backend/tensor_ops.h"
#include "core/check.h"

namespace upipe {

Mat a2a_block(const Buffer& buf, DType t, int64_t rows, int64_t cols, int j) {
  return Mat{static_cast<char*>(buf.data()) + int64_t(j) * rows * cols * dtype_size(t), t, rows,
             cols, cols};
}

void project_q_blocks(const StageEnv& e, const Mat& x, const RowPositions& pos,
                      const AttentionWeights& w, int stage, const Buffer& staging) {
  const AttentionConfig& c = e.cfg;
  const int d = c.head_dim, m = e.sch.m;
  for (int j = 0; j < e.sch.ranks; ++j) {
    const Mat blk = a2a_block(staging, c.dtype, x.rows, int64_t(m) * d, j);
    gemm(e.dev, x, false, w.wq.rows_of(int64_t(e.sch.q_head(stage, j)) * d, int64_t(m) * d), true,
         blk);
    if (c.qk_norm) rmsnorm_forward(e.dev, blk, w.wqn, c.norm_eps, blk, d);
    rope_forward(e.dev, blk, d, pos, c.rope);
  }
}

void project_q(const StageEnv& e, const Mat& x, const RowPositions& pos, const AttentionWeights& w,
               int stage, const Buffer& staging, const Mat& q) {
  project_q_blocks(e, x, pos, w, stage, staging);
  e.comm.all_to_all(staging.data(), q.data, stage_bytes(e, x.rows, e.cfg.dtype));
}

int64_t stage_bytes(const StageEnv& e, int64_t rows, DType t) {
  return mat_bytes(rows, int64_t(e.sch.m) * e.cfg.head_dim, t);
}

namespace {

// A k block (rows, heads*d) fresh from its projection: QK-norm and RoPE in place.
void finish_k(const StageEnv& e, const Mat& blk, const AttentionWeights& w,
              const RowPositions& pos) {
  const AttentionConfig& c = e.cfg;
  if (c.qk_norm) rmsnorm_forward(e.dev, blk, w.wkn, c.norm_eps, blk, c.head_dim);
  rope_forward(e.dev, blk, c.head_dim, pos, c.rope);
}

// QK-norm backward in place on grad (rows, heads*d) fp32 at the norm's output: recomputes the
// pre-norm values x wrows^T and accumulates the norm weight's gradient into gnorm.
void norm_backward(const StageEnv& e, const Mat& x, const Mat& wrows, const Mat& wnorm,
                   const Mat& grad, const Mat& gnorm) {
  const AttentionConfig& c = e.cfg;
  Tensor pre(e.dev.mem(), Tag::kQkv, c.dtype, grad.rows, grad.cols);
  gemm(e.dev, x, false, wrows, true, pre);
  rmsnorm_backward(e.dev, pre, wnorm, c.norm_eps, grad, grad, gnorm, c.head_dim);
}

int64_t norm_backward_bytes(const Backend& be, const AttentionConfig& c, int64_t rows,
                            int64_t cols) {
  if (!c.qk_norm) return 0;
  const DType t = c.dtype;
  return mat_bytes(rows, cols, t) +
         std::max(gemm_workspace_bytes(be, rows, cols, c.model_dim(), t, t, t),
                  rmsnorm_workspace_bytes(be, c.head_dim));
}

}  // namespace

void project_kv_blocks(const StageEnv& e, const Mat& x, const RowPositions& pos,
                       const AttentionWeights& w, int set, int pass, const Buffer& staging) {
  const UpipeSchedule& s = e.sch;
  UPIPE_CHECK(!s.replicated(), "project_kv_blocks: K ({}) < C ({}) replicates heads", s.kv_heads,
              s.ranks);
  const int64_t d = e.cfg.head_dim, rd = int64_t(s.kv_per_rank) * d;
  const Mat& wmat = pass == 0 ? w.wk : w.wv;
  for (int j = 0; j < s.ranks; ++j) {
    const Mat blk = a2a_block(staging, e.cfg.dtype, x.rows, rd, j);
    gemm(e.dev, x, false, wmat.rows_of(int64_t(s.kv_head(set, j)) * d, rd), true, blk);
    if (pass == 0) finish_k(e, blk, w, pos);
  }
}

int64_t kv_stage_bytes(const AttentionConfig& c, const UpipeSchedule& s, int64_t rows) {
  return int64_t(s.ranks) * mat_bytes(rows, int64_t(s.kv_per_rank) * c.head_dim, c.dtype);
}

void project_kv(const StageEnv& e, const Mat& x, const RowPositions& pos, const AttentionWeights& w,
                int set, const Buffer& staging, const Mat& k, const Mat& v) {
  const AttentionConfig& c = e.cfg;
  const UpipeSchedule& s = e.sch;
  const int cr = s.ranks, d = c.head_dim;
  const int64_t sl = x.rows;
  const DType t = c.dtype;
  if (!s.replicated()) {
    for (int pass = 0; pass < 2; ++pass) {
      project_kv_blocks(e, x, pos, w, set, pass, staging);
      e.comm.all_to_all(staging.data(), (pass == 0 ? k : v).data,
                        mat_bytes(sl, int64_t(s.kv_per_rank) * d, t));
    }
    return;
  }
  // K < C: project each KV head once; the all-to-allv sends head j / (C/K) to rank j.
  const int kh = c.kv_heads, rep = cr / kh;
  const int64_t blk_bytes = mat_bytes(sl, d, t);
  const size_t ucr = static_cast<size_t>(cr);
  std::vector<int64_t> sb(ucr, blk_bytes), sd(ucr), rb(ucr, blk_bytes), rd(ucr);
  for (int j = 0; j < cr; ++j) {
    sd[size_t(j)] = (j / rep) * blk_bytes;
    rd[size_t(j)] = j * blk_bytes;
  }
  for (int pass = 0; pass < 2; ++pass) {
    const Mat& wmat = pass == 0 ? w.wk : w.wv;
    for (int a = 0; a < kh; ++a) {
      const Mat blk = a2a_block(staging, t, sl, d, a);
      gemm(e.dev, x, false, wmat.rows_of(int64_t(a) * d, d), true, blk);
      if (pass == 0) finish_k(e, blk, w, pos);
    }
    e.comm.all_to_allv(staging.data(), sb.data(), sd.data(), (pass == 0 ? k : v).data, rb.data(),
                       rd.data());
  }
}

void accumulate_out(const StageEnv& e, const Mat& wo, int stage, const Buffer& staging,
                    const Mat& y, float beta) {
  const int64_t d = e.cfg.head_dim, md = int64_t(e.sch.m) * d;
  for (int j = 0; j < e.sch.ranks; ++j)
    gemm(e.dev, a2a_block(staging, e.cfg.dtype, y.rows, md, j), false,
         wo.cols_of(int64_t(e.sch.q_head(stage, j)) * d, md), true, y, 1.0f, j == 0 ? beta : 1.0f);
}

void return_q_grads(const StageEnv& e, const Mat& x, const RowPositions& pos,
                    const AttentionWeights& w, int stage, const Buffer& staging, const Mat& dx,
                    const AttentionGrads& g, float dx_beta, float dw_beta) {
  const AttentionConfig& c = e.cfg;
  const int64_t d = c.head_dim, md = int64_t(e.sch.m) * d;
  for (int j = 0; j < e.sch.ranks; ++j) {
    const Mat blk = a2a_block(staging, DType::kF32, x.rows, md, j);
    const int64_t row0 = int64_t(e.sch.q_head(stage, j)) * d;
    const Mat wq = w.wq.rows_of(row0, md);
    rope_backward(e.dev, blk, int(d), pos, c.rope);
    if (c.qk_norm) norm_backward(e, x, wq, w.wqn, blk, g.wqn);
    gemm(e.dev, blk, false, wq, false, dx, 1.0f, j == 0 ? dx_beta : 1.0f);
    gemm(e.dev, blk, true, x, false, g.wq.rows_of(row0, md), 1.0f, dw_beta);
  }
}

int64_t return_q_grads_bytes(const Backend& be, const AttentionConfig& c, const UpipeSchedule& s,
                             int64_t rows) {
  const int64_t md = int64_t(s.m) * c.head_dim, dm = c.model_dim();
  const DType t = c.dtype, f32 = DType::kF32;
  return std::max({norm_backward_bytes(be, c, rows, md),
                   gemm_workspace_bytes(be, rows, dm, md, f32, t, f32),
                   gemm_workspace_bytes(be, md, dm, rows, f32, t, f32)});
}

void return_kv_grads(const StageEnv& e, const Mat& x, const RowPositions& pos,
                     const AttentionWeights& w, int set, const Mat& dk, const Mat& dv,
                     const Buffer& staging, const Mat& dx, const AttentionGrads& g, float dw_beta) {
  const AttentionConfig& c = e.cfg;
  const UpipeSchedule& s = e.sch;
  const int cr = s.ranks, d = c.head_dim;
  const int64_t sl = x.rows;
  const DType f32 = DType::kF32;
  // grad: (sl, heads*d) fp32 of the k (pass 0) or v (pass 1) heads at rows wrows of Wk / Wv.
  auto apply = [&](int pass, const Mat& grad, int64_t row0, int64_t nrows) {
    const Mat wrows = (pass == 0 ? w.wk : w.wv).rows_of(row0, nrows);
    if (pass == 0) {
      rope_backward(e.dev, grad, d, pos, c.rope);
      if (c.qk_norm) norm_backward(e, x, wrows, w.wkn, grad, g.wkn);
    }
    gemm(e.dev, grad, false, wrows, false, dx, 1.0f, 1.0f);  // dx += dk Wk
    gemm(e.dev, grad, true, x, false, (pass == 0 ? g.wk : g.wv).rows_of(row0, nrows), 1.0f,
         dw_beta);  // dWk rows = dk^T x
  };
  for (int pass = 0; pass < 2; ++pass) {
    const Mat& src = pass == 0 ? dk : dv;
    if (!s.replicated()) {
      const int64_t rd = int64_t(s.kv_per_rank) * d;
      e.comm.all_to_all(src.data, staging.data(), mat_bytes(sl, rd, f32));
      for (int j = 0; j < cr; ++j)
        apply(pass, a2a_block(staging, f32, sl, rd, j), int64_t(s.kv_head(set, j)) * d, rd);
      continue;
    }
    // K < C: block j holds the contribution of rank j's replica; sum the replicas of each head.
    e.comm.all_to_all(src.data, staging.data(), mat_bytes(sl, d, f32));
    const int rep = cr / c.kv_heads;
    for (int a = 0; a < c.kv_heads; ++a) {
      const Mat sum = a2a_block(staging, f32, sl, d, a * rep);
      for (int j = a * rep + 1; j < (a + 1) * rep; ++j)
        add_into(e.dev, sum, a2a_block(staging, f32, sl, d, j));
      apply(pass, sum, int64_t(a) * d, d);
    }
  }
}

int64_t return_kv_grads_bytes(const Backend& be, const AttentionConfig& c, const UpipeSchedule& s,
                              int64_t rows, DType dx) {
  const int64_t pd = s.replicated() ? c.head_dim : int64_t(s.kv_per_rank) * c.head_dim;
  const int64_t dm = c.model_dim();
  const DType t = c.dtype, f32 = DType::kF32;
  return std::max({norm_backward_bytes(be, c, rows, pd),
                   gemm_workspace_bytes(be, rows, dm, pd, f32, t, dx),
                   gemm_workspace_bytes(be, pd, dm, rows, f32, t, f32)});
}

AttnProblem run_problem(const HeadRun& r, const Mat& q, const Mat& k, const Mat& v, int d) {
  const int64_t qc = int64_t(r.q0) * d, kc = int64_t(r.k0) * d;
  const int64_t qn = int64_t(r.nh) * d, kn = int64_t(r.nk) * d;
  return AttnProblem{q.cols_of(qc, qn), k.cols_of(kc, kn), v.cols_of(kc, kn), r.nh, r.nk, d};
}

void project_do(const StageEnv& e, const Mat& dy, const Mat& wo, int stage, const Buffer& staging) {
  const int64_t d = e.cfg.head_dim, md = int64_t(e.sch.m) * d, rows = dy.rows;
  Tensor cols(e.dev.mem(), Tag::kWorkspace, wo.dtype, wo.rows, md);
  for (int j = 0; j < e.sch.ranks; ++j) {
    copy(e.dev, cols, wo.cols_of(int64_t(e.sch.q_head(stage, j)) * d, md));
    gemm(e.dev, dy, false, cols, false, a2a_block(staging, e.cfg.dtype, rows, md, j));
  }
}

int64_t project_do_bytes(const Backend& be, const AttentionConfig& c, const UpipeSchedule& s,
                         int64_t rows) {
  const int64_t md = int64_t(s.m) * c.head_dim, dm = c.model_dim();
  const DType t = c.dtype;
  return mat_bytes(dm, md, t) + gemm_workspace_bytes(be, rows, md, dm, c.out_dtype(), t, t);
}

void accumulate_dwo(const StageEnv& e, const Mat& dy, int stage, const Buffer& staging,
                    const Mat& gwo, float beta) {
  const int64_t d = e.cfg.head_dim, md = int64_t(e.sch.m) * d, rows = dy.rows;
  Tensor tmp(e.dev.mem(), Tag::kWorkspace, DType::kF32, md, dy.cols);
  for (int j = 0; j < e.sch.ranks; ++j) {
    gemm(e.dev, a2a_block(staging, e.cfg.dtype, rows, md, j), true, dy, false, tmp);
    add_transposed(e.dev, gwo.cols_of(int64_t(e.sch.q_head(stage, j)) * d, md), tmp, beta);
  }
}

int64_t accumulate_dwo_bytes(const Backend& be, const AttentionConfig& c, const UpipeSchedule& s,
                             int64_t rows) {
  const int64_t md = int64_t(s.m) * c.head_dim, dm = c.model_dim();
  const DType t = c.dtype;
  return mat_bytes(md, dm, DType::kF32) +
         gemm_workspace_bytes(be, md, dm, rows, t, c.out_dtype(), DType::kF32);
}

void add_headwise_pass_comm(CommStats& st, const AttentionConfig& c, const UpipeSchedule& s,
                            int64_t rows, bool backward) {
  const int64_t d = c.head_dim, md = int64_t(s.m) * d;
  const int64_t b = dtype_size(c.dtype), others = s.ranks - 1;
  const int64_t kv_blk = rows * (s.replicated() ? d : int64_t(s.kv_per_rank) * d);
  const CommOp kv_op = s.replicated() ? CommOp::kAllToAllV : CommOp::kAllToAll;
  for (int set = 0; set < s.sets; ++set) {
    st.add(kv_op, kv_blk * b * others);  // k
    st.add(kv_op, kv_blk * b * others);  // v
    if (backward) {
      st.add(CommOp::kAllToAll, kv_blk * 4 * others);  // dk
      st.add(CommOp::kAllToAll, kv_blk * 4 * others);  // dv
    }
  }
  for (int stage = 0; stage < s.stages(); ++stage) {
    st.add(CommOp::kAllToAll, rows * md * b * others);  // q
    st.add(CommOp::kAllToAll, rows * md * b * others);  // o back
    if (backward) {
      st.add(CommOp::kAllToAll, rows * md * b * others);  // do
      st.add(CommOp::kAllToAll, rows * md * 4 * others);  // dq back
    }
  }
}

}  // namespace upipe
