// The whole attention block (projections, optional QK-norm, RoPE, causal GQA attention,
// o-projection), forward and backward, with the naive reference kernels in math type T: the fp64
// oracle that tolerances of merge-based strategies are measured against. Plain vectors: it is an
// oracle, not engine code.
#pragma once

#include <vector>

#include "attention/config.h"
#include "backend/reference/attention_ref.h"
#include "backend/reference/elementwise_ref.h"

namespace upipe::ref {

template <class T>
struct BlockData {
  std::vector<T> x, dy, wq, wk, wv, wo, wqn, wkn;  // inputs (S, D), weights (AttentionWeights)
  std::vector<T> y, dx, gq, gk, gv, go, gqn, gkn;  // outputs (gqn, gkn with cfg.qk_norm)
};

template <class T>
void attention_block(const AttentionConfig& c, BlockData<T>& b) {
  const int64_t s = c.seq_len, dm = c.model_dim(), d = c.head_dim;
  const int64_t qc = c.heads * d, kc = c.kv_heads * d;
  auto mk = [](int64_t n) { return std::vector<T>(size_t(n), T(0)); };
  auto V = [](std::vector<T>& v, int64_t r, int64_t cc) { return View<T>{v.data(), r, cc, cc}; };
  auto CV = [](const std::vector<T>& v, int64_t r, int64_t cc) {
    return View<const T>{v.data(), r, cc, cc};
  };
  std::vector<T> q = mk(s * qc), k = mk(s * kc), v = mk(s * kc), o = mk(s * qc),
                 lse = mk(c.heads * s);
  gemm<T>(CV(b.x, s, dm), false, CV(b.wq, qc, dm), true, V(q, s, qc));
  gemm<T>(CV(b.x, s, dm), false, CV(b.wk, kc, dm), true, V(k, s, kc));
  gemm<T>(CV(b.x, s, dm), false, CV(b.wv, kc, dm), true, V(v, s, kc));
  std::vector<int64_t> pos(static_cast<size_t>(s));
  for (int64_t i = 0; i < s; ++i) pos[size_t(i)] = i;
  const std::vector<double> inv_freq = rope_inv_freq(c.rope, int(d));
  // QK-norm: every d-wide head is a row of the (S*heads, d) view.
  std::vector<T> q_pre = q, k_pre = k;
  if (c.qk_norm) {
    rmsnorm_forward<T>(CV(q_pre, s * c.heads, d), b.wqn.data(), c.norm_eps, V(q, s * c.heads, d));
    rmsnorm_forward<T>(CV(k_pre, s * c.kv_heads, d), b.wkn.data(), c.norm_eps,
                       V(k, s * c.kv_heads, d));
  }
  rope<T>(V(q, s, qc), int(d), pos.data(), inv_freq, +1);
  rope<T>(V(k, s, kc), int(d), pos.data(), inv_freq, +1);
  AttnDims dims{s, s, c.heads, c.kv_heads, int(d)};
  attention_forward<T>(dims, CV(q, s, qc), CV(k, s, kc), CV(v, s, kc), V(o, s, qc),
                       V(lse, c.heads, s));
  b.y = mk(s * dm);
  gemm<T>(CV(o, s, qc), false, CV(b.wo, dm, qc), true, V(b.y, s, dm));
  // Backward.
  std::vector<T> dout = mk(s * qc), dq = mk(s * qc), dk = mk(s * kc), dv = mk(s * kc);
  gemm<T>(CV(b.dy, s, dm), false, CV(b.wo, dm, qc), false, V(dout, s, qc));
  b.go = mk(dm * qc);
  gemm<T>(CV(b.dy, s, dm), true, CV(o, s, qc), false, V(b.go, dm, qc));
  attention_backward<T>(dims, CV(q, s, qc), CV(k, s, kc), CV(v, s, kc), CV(dout, s, qc),
                        V(dq, s, qc), V(dk, s, kc), V(dv, s, kc));
  rope<T>(V(dq, s, qc), int(d), pos.data(), inv_freq, -1);
  rope<T>(V(dk, s, kc), int(d), pos.data(), inv_freq, -1);
  if (c.qk_norm) {
    b.gqn = mk(d);
    b.gkn = mk(d);
    const std::vector<T> dqn = dq, dkn = dk;
    rmsnorm_backward<T>(CV(q_pre, s * c.heads, d), b.wqn.data(), c.norm_eps,
                        CV(dqn, s * c.heads, d), V(dq, s * c.heads, d), b.gqn.data());
    rmsnorm_backward<T>(CV(k_pre, s * c.kv_heads, d), b.wkn.data(), c.norm_eps,
                        CV(dkn, s * c.kv_heads, d), V(dk, s * c.kv_heads, d), b.gkn.data());
  }
  b.dx = mk(s * dm);
  std::vector<T> tmp = mk(s * dm);
  gemm<T>(CV(dq, s, qc), false, CV(b.wq, qc, dm), false, V(b.dx, s, dm));
  gemm<T>(CV(dk, s, kc), false, CV(b.wk, kc, dm), false, V(tmp, s, dm));
  for (size_t i = 0; i < tmp.size(); ++i) b.dx[i] += tmp[i];
  gemm<T>(CV(dv, s, kc), false, CV(b.wv, kc, dm), false, V(tmp, s, dm));
  for (size_t i = 0; i < tmp.size(); ++i) b.dx[i] += tmp[i];
  b.gq = mk(qc * dm);
  b.gk = mk(kc * dm);
  b.gv = mk(kc * dm);
  gemm<T>(CV(dq, s, qc), true, CV(b.x, s, dm), false, V(b.gq, qc, dm));
  gemm<T>(CV(dk, s, kc), true, CV(b.x, s, dm), false, V(b.gk, kc, dm));
  gemm<T>(CV(dv, s, kc), true, CV(b.x, s, dm), false, V(b.gv, kc, dm));
}

}  // namespace upipe::ref
