#include "kernels/cpu/attention_cpu.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "kernels/attention_tiles.h"
#include "kernels/cpu/vec_math.h"
#include "kernels/gemm.h"

namespace upipe::cpu {
namespace {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

// A (rows, d) fp32 tile of head `head` of view x starting at row r0: a direct pointer into fp32
// data, or a converted copy in `stage` for bf16.
struct Tile {
  const float* ptr;
  int64_t ld;
};
Tile load_tile(const Mat& x, int64_t r0, int64_t rows, int head, int d, float* stage) {
  if (x.dtype == DType::kF32) return {static_cast<const float*>(x.at(r0, int64_t(head) * d)), x.ld};
  for (int64_t r = 0; r < rows; ++r) to_f32(x.at(r0 + r, int64_t(head) * d), x.dtype, stage + r * d, d);
  return {stage, d};
}

// Number of keys of tile [j0, j0+bk) visible to query row i (causal), in [0, bk].
inline int64_t visible(const AttnProblem& p, int64_t i, int64_t j0, int64_t bk) {
  if (!p.causal) return bk;
  return std::clamp<int64_t>(p.q_pos0 + i - p.k_pos0 - j0 + 1, 0, bk);
}

// Number of key rows any query row of [i0, i0+bq) can see.
inline int64_t key_limit(const AttnProblem& p, int64_t i0, int64_t bq) {
  if (!p.causal) return p.sk();
  return std::clamp<int64_t>(p.q_pos0 + i0 + bq - 1 - p.k_pos0 + 1, 0, p.sk());
}

inline float* lse_at(const Mat& x, int h, int64_t i) {
  return static_cast<float*>(x.at(h, i));
}

float row_max(const float* x, int64_t n) {
  float m = kNegInf;
#pragma omp simd reduction(max : m)
  for (int64_t c = 0; c < n; ++c) m = std::max(m, x[c]);
  return m;
}

}  // namespace

void attention_forward(const AttnProblem& p, const Mat* o, const Mat* lse, const Mat* acc,
                       const Mat* m_state, const Mat* l_state, float* ws) {
  const int64_t sq = p.sq(), d = p.d;
  const int group = p.hq / p.hk;
  const float scale = p.softmax_scale();
  float* s_tile = ws;                            // (Bq, Bk)
  float* o_tile = s_tile + kAttnFwdBq * kAttnFwdBk;  // (Bq, d)
  float* m = o_tile + kAttnFwdBq * d;            // (Bq)
  float* l = m + kAttnFwdBq;                     // (Bq)
  float* q_stage = l + kAttnFwdBq;               // (Bq, d), bf16 only
  float* k_stage = q_stage + kAttnFwdBq * d;     // (Bk, d)
  float* v_stage = k_stage + kAttnFwdBk * d;     // (Bk, d)

  for (int h = 0; h < p.hq; ++h) {
    const int kvh = h / group;
    for (int64_t i0 = 0; i0 < sq; i0 += kAttnFwdBq) {
      const int64_t bq = std::min(kAttnFwdBq, sq - i0);
      const int64_t n_keys = key_limit(p, i0, bq);
      if (acc) {
        for (int64_t r = 0; r < bq; ++r) {
          m[r] = *lse_at(*m_state, h, i0 + r);
          l[r] = *lse_at(*l_state, h, i0 + r);
          std::copy_n(static_cast<const float*>(acc->at(i0 + r, h * d)), d, o_tile + r * d);
        }
        if (n_keys == 0) continue;
      } else {
        std::fill_n(m, bq, kNegInf);
        std::fill_n(l, bq, 0.0f);
        std::fill_n(o_tile, bq * d, 0.0f);
      }
      if (n_keys > 0) {
        const Tile qt = load_tile(p.q, i0, bq, h, int(d), q_stage);
        for (int64_t j0 = 0; j0 < n_keys; j0 += kAttnFwdBk) {
          const int64_t bk = std::min(kAttnFwdBk, n_keys - j0);
          const Tile kt = load_tile(p.k, j0, bk, kvh, int(d), k_stage);
          sgemm_raw(false, true, bq, bk, d, scale, qt.ptr, qt.ld, kt.ptr, kt.ld, 0.0f, s_tile,
                    kAttnFwdBk);
          for (int64_t r = 0; r < bq; ++r) {
            float* row = s_tile + r * kAttnFwdBk;
            const int64_t lim = visible(p, i0 + r, j0, bk);
            const float m_new = std::max(m[r], row_max(row, lim));
            if (m_new == kNegInf) {
              std::fill_n(row, bk, 0.0f);
              continue;
            }
            float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
            for (int64_t c = 0; c < lim; ++c) {
              const float e = exp_fast(row[c] - m_new);
              row[c] = e;
              sum += e;
            }
            std::fill(row + lim, row + bk, 0.0f);
            const float alpha = m[r] == kNegInf ? 0.0f : exp_fast(m[r] - m_new);
            l[r] = l[r] * alpha + sum;
            m[r] = m_new;
            if (alpha != 1.0f) {
              float* orow = o_tile + r * d;
#pragma omp simd
              for (int64_t e = 0; e < d; ++e) orow[e] *= alpha;
            }
          }
          const Tile vt = load_tile(p.v, j0, bk, kvh, int(d), v_stage);
          sgemm_raw(false, false, bq, d, bk, 1.0f, s_tile, kAttnFwdBk, vt.ptr, vt.ld, 1.0f, o_tile,
                    d);
        }
      }
      if (acc) {
        for (int64_t r = 0; r < bq; ++r) {
          *lse_at(*m_state, h, i0 + r) = m[r];
          *lse_at(*l_state, h, i0 + r) = l[r];
          std::copy_n(o_tile + r * d, d, static_cast<float*>(acc->at(i0 + r, h * d)));
        }
      } else {
        for (int64_t r = 0; r < bq; ++r) {
          float* orow = o_tile + r * d;
          const float inv = l[r] > 0.0f ? 1.0f / l[r] : 0.0f;
#pragma omp simd
          for (int64_t e = 0; e < d; ++e) orow[e] *= inv;
          from_f32(orow, o->at(i0 + r, h * d), o->dtype, d);
          *lse_at(*lse, h, i0 + r) = l[r] > 0.0f ? m[r] + std::log(l[r]) : kNegInf;
        }
      }
    }
  }
}

void attention_backward(const AttnProblem& p, const Mat& dout, const Mat& lse, const Mat& delta,
                        const Mat& dq, const Mat& dk, const Mat& dv, float* ws) {
  const int64_t sq = p.sq(), sk = p.sk(), d = p.d;
  const int group = p.hq / p.hk;
  const float scale = p.softmax_scale();
  float* p_tile = ws;                                   // (Bq, Bk)
  float* dp_tile = p_tile + kAttnBwdBq * kAttnBwdBk;    // (Bq, Bk)
  float* q_stage = dp_tile + kAttnBwdBq * kAttnBwdBk;   // (Bq, d), bf16 only
  float* do_stage = q_stage + kAttnBwdBq * d;           // (Bq, d)
  float* k_stage = do_stage + kAttnBwdBq * d;           // (Bk, d)
  float* v_stage = k_stage + kAttnBwdBk * d;            // (Bk, d)

  for (int h = 0; h < p.hq; ++h) {
    const int kvh = h / group;
    for (int64_t j0 = 0; j0 < sk; j0 += kAttnBwdBk) {
      const int64_t bk = std::min(kAttnBwdBk, sk - j0);
      int64_t i_first = 0;
      if (p.causal) {
        i_first = std::clamp<int64_t>(p.k_pos0 + j0 - p.q_pos0, 0, sq);
        i_first = i_first / kAttnBwdBq * kAttnBwdBq;
      }
      if (i_first >= sq) continue;
      const Tile kt = load_tile(p.k, j0, bk, kvh, int(d), k_stage);
      const Tile vt = load_tile(p.v, j0, bk, kvh, int(d), v_stage);
      float* dk_t = static_cast<float*>(dk.at(j0, int64_t(kvh) * d));
      float* dv_t = static_cast<float*>(dv.at(j0, int64_t(kvh) * d));
      for (int64_t i0 = i_first; i0 < sq; i0 += kAttnBwdBq) {
        const int64_t bq = std::min(kAttnBwdBq, sq - i0);
        const Tile qt = load_tile(p.q, i0, bq, h, int(d), q_stage);
        const Tile dot = load_tile(dout, i0, bq, h, int(d), do_stage);
        sgemm_raw(false, true, bq, bk, d, scale, qt.ptr, qt.ld, kt.ptr, kt.ld, 0.0f, p_tile,
                  kAttnBwdBk);
        for (int64_t r = 0; r < bq; ++r) {
          float* row = p_tile + r * kAttnBwdBk;
          const float lr = *lse_at(lse, h, i0 + r);
          const int64_t lim = lr == kNegInf ? 0 : visible(p, i0 + r, j0, bk);
#pragma omp simd
          for (int64_t c = 0; c < lim; ++c) row[c] = exp_fast(row[c] - lr);
          std::fill(row + lim, row + bk, 0.0f);
        }
        // dV += P^T dO
        sgemm_raw(true, false, bk, d, bq, 1.0f, p_tile, kAttnBwdBk, dot.ptr, dot.ld, 1.0f, dv_t,
                  dv.ld);
        // dP = dO V^T
        sgemm_raw(false, true, bq, bk, d, 1.0f, dot.ptr, dot.ld, vt.ptr, vt.ld, 0.0f, dp_tile,
                  kAttnBwdBk);
        // dS = P * (dP - delta) * scale, in place of dP
        for (int64_t r = 0; r < bq; ++r) {
          const float* prow = p_tile + r * kAttnBwdBk;
          float* dsrow = dp_tile + r * kAttnBwdBk;
          const float dl = *lse_at(delta, h, i0 + r);
#pragma omp simd
          for (int64_t c = 0; c < bk; ++c) dsrow[c] = prow[c] * (dsrow[c] - dl) * scale;
        }
        // dQ += dS K ; dK += dS^T Q
        sgemm_raw(false, false, bq, d, bk, 1.0f, dp_tile, kAttnBwdBk, kt.ptr, kt.ld, 1.0f,
                  static_cast<float*>(dq.at(i0, int64_t(h) * d)), dq.ld);
        sgemm_raw(true, false, bk, d, bq, 1.0f, dp_tile, kAttnBwdBk, qt.ptr, qt.ld, 1.0f, dk_t,
                  dk.ld);
      }
    }
  }
}

void attention_delta(const Mat& o, const Mat& dout, int d, const Mat& delta) {
  const int hq = int(o.cols / d);
  float orow[1024], drow[1024];
  UPIPE_CHECK(d <= 1024, "head_dim {} above 1024 is not supported", d);
  for (int64_t i = 0; i < o.rows; ++i) {
    for (int h = 0; h < hq; ++h) {
      to_f32(o.at(i, int64_t(h) * d), o.dtype, orow, d);
      to_f32(dout.at(i, int64_t(h) * d), dout.dtype, drow, d);
      float s = 0.0f;
#pragma omp simd reduction(+ : s)
      for (int e = 0; e < d; ++e) s += orow[e] * drow[e];
      *lse_at(delta, h, i) = s;
    }
  }
}

void attention_finalize(const Mat& acc, const Mat& m, const Mat& l, int d, const Mat& o,
                        const Mat& lse) {
  const int hq = int(acc.cols / d);
  float row[1024];
  UPIPE_CHECK(d <= 1024, "head_dim {} above 1024 is not supported", d);
  for (int64_t i = 0; i < acc.rows; ++i) {
    for (int h = 0; h < hq; ++h) {
      const float li = *lse_at(l, h, i);
      const float inv = li > 0.0f ? 1.0f / li : 0.0f;
      const float* a = static_cast<const float*>(acc.at(i, int64_t(h) * d));
      for (int e = 0; e < d; ++e) row[e] = a[e] * inv;
      from_f32(row, o.at(i, int64_t(h) * d), o.dtype, d);
      *lse_at(lse, h, i) = li > 0.0f ? *lse_at(m, h, i) + std::log(li) : kNegInf;
    }
  }
}

void lse_merge(const Mat& o, const Mat& lse, const Mat& o2, const Mat& lse2, int d) {
  const int hq = int(o.cols / d);
  float a[1024], b[1024];
  UPIPE_CHECK(d <= 1024, "head_dim {} above 1024 is not supported", d);
  for (int64_t i = 0; i < o.rows; ++i) {
    for (int h = 0; h < hq; ++h) {
      float* l1 = lse_at(lse, h, i);
      const float l2 = *lse_at(lse2, h, i);
      if (l2 == kNegInf) continue;
      if (*l1 == kNegInf) {
        *l1 = l2;
        std::memcpy(o.at(i, int64_t(h) * d), o2.at(i, int64_t(h) * d), size_t(d * dtype_size(o.dtype)));
        continue;
      }
      const float mx = std::max(*l1, l2);
      const float w1 = std::exp(*l1 - mx), w2 = std::exp(l2 - mx);
      const float inv = 1.0f / (w1 + w2);
      to_f32(o.at(i, int64_t(h) * d), o.dtype, a, d);
      to_f32(o2.at(i, int64_t(h) * d), o2.dtype, b, d);
      for (int e = 0; e < d; ++e) a[e] = (a[e] * w1 + b[e] * w2) * inv;
      from_f32(a, o.at(i, int64_t(h) * d), o.dtype, d);
      *l1 = mx + std::log(w1 + w2);
    }
  }
}

}  // namespace upipe::cpu
