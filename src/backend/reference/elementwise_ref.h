// Naive references for RoPE, RMSNorm, SwiGLU and GEMM (see backend/rope.h, rmsnorm.h,
// swiglu.h, gemm.h for the contracts).
#pragma once

#include <algorithm>
#include <cmath>

#include <vector>

#include "backend/backend.h"
#include "backend/reference/ref_view.h"
#include "core/checked.h"

namespace upipe::ref {

// RoPE inverse frequencies theta^(-2i/d), i < d/2, with Hugging Face transformers' "llama3"
// rescaling when enabled, written out as transformers writes it (masks over wavelengths).
inline std::vector<double> rope_inv_freq(const RopeParams& rp, int d) {
  std::vector<double> f;
  for (int i = 0; i < d; i += 2) f.push_back(1.0 / std::pow(rp.theta, double(i) / d));
  if (!rp.scaling.enabled) return f;
  const RopeScaling& s = rp.scaling;
  const double old_ctx = double(s.original_max_position);
  const double low_freq_wavelen = old_ctx / s.low_freq_factor;
  const double high_freq_wavelen = old_ctx / s.high_freq_factor;
  for (double& inv : f) {
    const double wavelen = 2 * M_PI / inv;
    double llama = wavelen > low_freq_wavelen ? inv / s.factor : inv;
    const double smooth =
        (old_ctx / wavelen - s.low_freq_factor) / (s.high_freq_factor - s.low_freq_factor);
    const double smoothed = (1 - smooth) * llama / s.factor + smooth * llama;
    const bool medium = !(wavelen < high_freq_wavelen) && !(wavelen > low_freq_wavelen);
    inv = medium ? smoothed : llama;
  }
  return f;
}

// Rotate-half RoPE on x (rows, heads*d): row r at position pos[r] with the d/2 frequencies
// inv_freq; sign -1 applies the inverse rotation (the backward).
template <class T>
void rope(const View<T>& x, int d, const int64_t* pos, const std::vector<double>& inv_freq,
          int sign) {
  const int64_t heads = x.cols / d;
  for (int64_t r = 0; r < x.rows; ++r) {
    for (int i = 0; i < d / 2; ++i) {
      const double ang = double(pos[r]) * inv_freq[size_t(i)];
      const T c = T(std::cos(ang)), s = T(sign * std::sin(ang));
      for (int64_t h = 0; h < heads; ++h) {
        T& a = x(r, h * d + i);
        T& b = x(r, h * d + i + d / 2);
        const T x1 = a, x2 = b;
        a = x1 * c - x2 * s;
        b = x2 * c + x1 * s;
      }
    }
  }
}

// y = x / sqrt(mean(x^2) + eps) * w, per row.
template <class T>
void rmsnorm_forward(const View<const T>& x, const T* w, double eps, const View<T>& y) {
  for (int64_t r = 0; r < x.rows; ++r) {
    T ss = 0;
    for (int64_t c = 0; c < x.cols; ++c) ss += x(r, c) * x(r, c);
    const T inv = T(1) / std::sqrt(ss / T(x.cols) + T(eps));
    for (int64_t c = 0; c < x.cols; ++c) y(r, c) = x(r, c) * inv * w[c];
  }
}

// dx = (w*dy)/rms - x * sum(w*dy*x) / (n rms^3); dw += sum_rows dy * x / rms.
template <class T>
void rmsnorm_backward(const View<const T>& x, const T* w, double eps, const View<const T>& dy,
                      const View<T>& dx, T* dw) {
  const T n = T(x.cols);
  for (int64_t r = 0; r < x.rows; ++r) {
    T ss = 0, dot = 0;
    for (int64_t c = 0; c < x.cols; ++c) {
      ss += x(r, c) * x(r, c);
      dot += w[c] * dy(r, c) * x(r, c);
    }
    const T inv = T(1) / std::sqrt(ss / n + T(eps));
    for (int64_t c = 0; c < x.cols; ++c) {
      dx(r, c) = w[c] * dy(r, c) * inv - x(r, c) * dot * inv * inv * inv / n;
      dw[c] += dy(r, c) * x(r, c) * inv;
    }
  }
}

// h = silu(a) * b.
template <class T>
void swiglu_forward(const View<const T>& a, const View<const T>& b, const View<T>& h) {
  for (int64_t r = 0; r < a.rows; ++r)
    for (int64_t c = 0; c < a.cols; ++c) {
      const T sg = T(1) / (T(1) + std::exp(-a(r, c)));
      h(r, c) = a(r, c) * sg * b(r, c);
    }
}

template <class T>
void swiglu_backward(const View<const T>& a, const View<const T>& b, const View<const T>& dh,
                     const View<T>& da, const View<T>& db) {
  for (int64_t r = 0; r < a.rows; ++r)
    for (int64_t c = 0; c < a.cols; ++c) {
      const T x = a(r, c), sg = T(1) / (T(1) + std::exp(-x));
      da(r, c) = dh(r, c) * b(r, c) * sg * (T(1) + x * (T(1) - sg));
      db(r, c) = dh(r, c) * x * sg;
    }
}

// c = op(a) op(b), naive: every c(i, j) is 0 + op(a)(i, 0) op(b)(0, j) + op(a)(i, 1) op(b)(1, j)
// + ... in increasing p. The loops run i, p, j over contiguous copies of op(a) and op(b), so the
// j loop streams rows (and vectorises) while each element's sum keeps that order.
template <class T>
void gemm(const View<const T>& a, bool ta, const View<const T>& b, bool tb, const View<T>& c) {
  const int64_t m = c.rows, n = c.cols, k = ta ? a.rows : a.cols;
  std::vector<T> ap(static_cast<size_t>(checked_mul(m, k, "reference gemm a"))),
      bp(static_cast<size_t>(checked_mul(k, n, "reference gemm b"))), row(static_cast<size_t>(n));
  for (int64_t i = 0; i < m; ++i)
    for (int64_t p = 0; p < k; ++p) ap[size_t(i * k + p)] = ta ? a(p, i) : a(i, p);
  for (int64_t p = 0; p < k; ++p)
    for (int64_t j = 0; j < n; ++j) bp[size_t(p * n + j)] = tb ? b(j, p) : b(p, j);
  for (int64_t i = 0; i < m; ++i) {
    std::fill(row.begin(), row.end(), T(0));
    for (int64_t p = 0; p < k; ++p) {
      const T aip = ap[size_t(i * k + p)];
      const T* bq = bp.data() + p * n;
      for (int64_t j = 0; j < n; ++j) row[size_t(j)] += aip * bq[j];
    }
    for (int64_t j = 0; j < n; ++j) c(i, j) = row[size_t(j)];
  }
}

}  // namespace upipe::ref
