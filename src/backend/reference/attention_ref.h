// Naive causal GQA attention, forward and backward: one query row at a time, a score row of
// sk values (never an S x S matrix), no tiling, no online softmax. Same layouts and masking
// rules as backend/attention.h, document-causal masking written out per row. `operand` rounds the
// computed operands of the products (the probabilities P before P V and P^T dO, dS before dS K and
// dS^T Q) the way the tested kernel stores them for its dot products: identity for fp32, to bf16
// for bf16 attention (docs/kernels.md, "Precision").
#pragma once

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "backend/reference/ref_view.h"

namespace upipe::ref {

struct AttnDims {
  int64_t sq, sk;
  int hq, hk, d;
  int64_t q_pos0 = 0, k_pos0 = 0;
  bool causal = true;
  double scale = 0;  // 0 means 1/sqrt(d)
  // Document-causal masking when given: the document and the position inside it of every query
  // row (sq each) and key row (sk each); q_pos0, k_pos0 are then unused.
  std::vector<int64_t> q_doc = {}, q_pos = {}, k_doc = {}, k_pos = {};
  double softmax_scale() const { return scale != 0 ? scale : 1.0 / std::sqrt(double(d)); }
  bool visible(int64_t i, int64_t j) const {
    if (!q_doc.empty())
      return q_doc[size_t(i)] == k_doc[size_t(j)] && k_pos[size_t(j)] <= q_pos[size_t(i)];
    return !causal || k_pos0 + j <= q_pos0 + i;
  }
};

// Probabilities of query row i, head h, into p (sk); returns the log-sum-exp (-inf if none).
template <class T>
T attention_row(const AttnDims& a, const View<const T>& q, const View<const T>& k, int h, int64_t i,
                std::vector<T>& p) {
  const int kvh = h / (a.hq / a.hk);
  const T scale = T(a.softmax_scale());
  T mx = -std::numeric_limits<T>::infinity();
  for (int64_t j = 0; j < a.sk; ++j) {
    if (!a.visible(i, j)) {
      p[j] = -std::numeric_limits<T>::infinity();
      continue;
    }
    T s = 0;
    for (int e = 0; e < a.d; ++e) s += q(i, int64_t(h) * a.d + e) * k(j, int64_t(kvh) * a.d + e);
    p[j] = s * scale;
    mx = std::max(mx, p[j]);
  }
  if (mx == -std::numeric_limits<T>::infinity()) {
    std::fill(p.begin(), p.end(), T(0));
    return mx;
  }
  T sum = 0;
  for (int64_t j = 0; j < a.sk; ++j) {
    p[j] = a.visible(i, j) ? std::exp(p[j] - mx) : T(0);
    sum += p[j];
  }
  for (int64_t j = 0; j < a.sk; ++j) p[j] /= sum;
  return mx + std::log(sum);
}

template <class T>
T keep(T x) {
  return x;
}

// One output row of P V: out[e] = 0 + operand(p[0]) v(0, kc + e) + operand(p[1]) v(1, kc + e)
// + ... in increasing key order. Keys with a zero operand (masked keys, underflowed weights) are
// skipped, as the kernels skip them: for finite v they add an exact zero. The e loop runs
// innermost over a contiguous row of v.
template <class T, class Operand>
void pv_row(const AttnDims& a, const View<const T>& v, int64_t kc, const std::vector<T>& p,
            Operand operand, std::vector<T>& out) {
  std::fill(out.begin(), out.end(), T(0));
  for (int64_t j = 0; j < a.sk; ++j) {
    const T pj = operand(p[size_t(j)]);
    if (pj == T(0)) continue;
    const T* vr = &v(j, kc);
    for (int e = 0; e < a.d; ++e) out[size_t(e)] += pj * vr[e];
  }
}

// o (sq, hq*d), lse (hq, sq).
template <class T, class Operand = T (*)(T)>
void attention_forward(const AttnDims& a, const View<const T>& q, const View<const T>& k,
                       const View<const T>& v, const View<T>& o, const View<T>& lse,
                       Operand operand = keep<T>) {
  std::vector<T> p(size_t(a.sk)), orow(size_t(a.d));
  const int g = a.hq / a.hk;
  for (int h = 0; h < a.hq; ++h) {
    const int64_t kc = int64_t(h / g) * a.d;
    for (int64_t i = 0; i < a.sq; ++i) {
      lse(h, i) = attention_row(a, q, k, h, i, p);
      pv_row(a, v, kc, p, operand, orow);
      for (int e = 0; e < a.d; ++e) o(i, int64_t(h) * a.d + e) = orow[size_t(e)];
    }
  }
}

// Accumulates (+=) dq (sq, hq*d), dk, dv (sk, hk*d). store_o rounds o the way the tested
// implementation stores it (bf16 storage) before delta = rowsum(do * o) is formed.
template <class T, class StoreO = T (*)(T), class Operand = T (*)(T)>
void attention_backward(const AttnDims& a, const View<const T>& q, const View<const T>& k,
                        const View<const T>& v, const View<const T>& dout, const View<T>& dq,
                        const View<T>& dk, const View<T>& dv, StoreO store_o = keep<T>,
                        Operand operand = keep<T>) {
  std::vector<T> p(size_t(a.sk)), orow(size_t(a.d));
  const int g = a.hq / a.hk;
  const T scale = T(a.softmax_scale());
  for (int h = 0; h < a.hq; ++h) {
    const int64_t qc = int64_t(h) * a.d, kc = int64_t(h / g) * a.d;
    for (int64_t i = 0; i < a.sq; ++i) {
      attention_row(a, q, k, h, i, p);
      pv_row(a, v, kc, p, operand, orow);
      T delta = 0;
      for (int e = 0; e < a.d; ++e) delta += store_o(orow[size_t(e)]) * dout(i, qc + e);
      for (int64_t j = 0; j < a.sk; ++j) {
        if (p[j] == T(0)) continue;
        T dp = 0;
        for (int e = 0; e < a.d; ++e) dp += dout(i, qc + e) * v(j, kc + e);
        const T ds = operand(p[j] * (dp - delta) * scale), pj = operand(p[j]);
        for (int e = 0; e < a.d; ++e) {
          dq(i, qc + e) += ds * k(j, kc + e);
          dk(j, kc + e) += ds * q(i, qc + e);
          dv(j, kc + e) += pj * dout(i, qc + e);
        }
      }
    }
  }
}

}  // namespace upipe::ref
