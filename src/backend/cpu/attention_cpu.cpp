#include "backend/cpu/attention_cpu.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "backend/cpu/attention_tiles.h"
#include "backend/cpu/attn_micro.h"
#include "backend/cpu/vec_math.h"

namespace upipe::cpu {
namespace {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();
static_assert(kAttnStripe == kMr && kAttnPanel == kNr, "tile constants and micro-kernel shape");

// A (rows, d) fp32 tile of head `head` of view x starting at row r0: a direct pointer into fp32
// data, or a converted copy in `stage` for bf16.
struct Tile {
  const float* ptr;
  int64_t ld;
};
Tile load_tile(const Mat& x, int64_t r0, int64_t rows, int head, int d, float* stage) {
  if (x.dtype == DType::kF32) return {static_cast<const float*>(x.at(r0, int64_t(head) * d)), x.ld};
  for (int64_t r = 0; r < rows; ++r)
    to_f32(x.at(r0 + r, int64_t(head) * d), x.dtype, stage + r * d, d);
  return {stage, d};
}

// Packs rows [r0, r0 + rows) of head `head` of x transposed into kNr-row panels.
void pack_tile_t(const Mat& x, int64_t r0, int64_t rows, int head, int d, float* dst) {
  const void* src = x.at(r0, int64_t(head) * d);
  if (x.dtype == DType::kF32) {
    pack_panels<DType::kF32>(src, x.ld, rows, d, dst);
  } else {
    pack_panels<DType::kBF16>(src, x.ld, rows, d, dst);
  }
}

// Packs rows [r0, r0 + rows) of head `head` of x into kNr-column chunks cs floats apart.
void pack_tile_chunks(const Mat& x, int64_t r0, int64_t rows, int head, int d, float* dst,
                      int64_t cs) {
  const void* src = x.at(r0, int64_t(head) * d);
  if (x.dtype == DType::kF32) {
    pack_chunks<DType::kF32>(src, x.ld, rows, d, dst, cs);
  } else {
    pack_chunks<DType::kBF16>(src, x.ld, rows, d, dst, cs);
  }
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

// The buffers carved out of ws end where attn_*_workspace_bytes says (fp32 inputs need no staging).
void check_layout(const float* ws, const float* end_f32, const float* end_bf16, int64_t bytes,
                  DType t) {
  const int64_t used = (t == DType::kF32 ? end_f32 : end_bf16) - ws;
  UPIPE_CHECK(used * 4 == bytes, "attention workspace layout uses {} bytes, formula says {}",
              used * 4, bytes);
}

inline float* lse_at(const Mat& x, int h, int64_t i) {
  return static_cast<float*>(x.at(h, i));
}

// Online-softmax step of one query row over the scores s[0, lim) of a key tile (lim >= 1) whose
// maximum is mx: overwrites s[0, n) with p = exp(s - m_new) and zeros past lim (n >= lim),
// updates the running max m and sum l, and returns the factor alpha the row's output
// accumulator must be scaled by.
float softmax_row(float* s, int64_t lim, int64_t n, float mx, float& m, float& l) {
  const float m_new = std::max(m, mx);
  const __m256 vm = _mm256_set1_ps(m_new);
  __m256 vsum = _mm256_setzero_ps();
  int64_t c = 0;
  for (; c + 8 <= lim; c += 8) {
    const __m256 e = exp8(_mm256_sub_ps(_mm256_loadu_ps(s + c), vm));
    _mm256_storeu_ps(s + c, e);
    vsum = _mm256_add_ps(vsum, e);
  }
  if (c < lim) {
    // s has room up to the next multiple of kNr past lim: the lanes past lim are zeroed.
    const __m256 e =
        _mm256_and_ps(exp8(_mm256_sub_ps(_mm256_loadu_ps(s + c), vm)), lane_mask(lim - c));
    _mm256_storeu_ps(s + c, e);
    vsum = _mm256_add_ps(vsum, e);
    c += 8;
  }
  for (; c < n; c += 8) _mm256_storeu_ps(s + c, _mm256_setzero_ps());
  const float alpha = m == kNegInf ? 0.0f : exp_fast(m - m_new);
  l = l * alpha + hsum8(vsum);
  m = m_new;
  return alpha;
}

}  // namespace

void attention_forward(const AttnProblem& p, const Mat* o, const Mat* lse, const Mat* acc,
                       const Mat* m_state, const Mat* l_state, float* ws) {
  const int64_t sq = p.sq(), d = p.d;
  const int group = p.hq / p.hk;
  const float scale = p.softmax_scale();
  const int64_t dp = attn_padded_dim(d);
  float* k_panel = ws;                                 // (Bk, d) packed transposed
  float* v_pack = k_panel + kAttnFwdBk * d;            // (Bk, dp) packed in column chunks
  float* s_rows = v_pack + kAttnFwdBk * dp;            // (6, Bk + 16) scores, then probabilities
  float* o_tile = s_rows + kAttnStripe * kAttnFwdSld;  // (Bq, dp) un-normalised output
  float* m = o_tile + kAttnFwdBq * dp;                 // (Bq)
  float* l = m + kAttnFwdBq;                           // (Bq)
  float* q_stage = l + kAttnFwdBq;                     // (Bq, d) the q tile, fp32
  const __m256 vscale = _mm256_set1_ps(scale), neg_inf = _mm256_set1_ps(kNegInf);
  check_layout(ws, q_stage + kAttnFwdBq * d, q_stage + kAttnFwdBq * d,
               attn_fwd_workspace_bytes(d, p.q.dtype), p.q.dtype);

  for (int h = 0; h < p.hq; ++h) {
    const int kvh = h / group;
    for (int64_t i0 = 0; i0 < sq; i0 += kAttnFwdBq) {
      const int64_t bq = std::min(kAttnFwdBq, sq - i0);
      const int64_t n_keys = key_limit(p, i0, bq);
      if (acc) {
        for (int64_t r = 0; r < bq; ++r) {
          m[r] = *lse_at(*m_state, h, i0 + r);
          l[r] = *lse_at(*l_state, h, i0 + r);
          std::copy_n(static_cast<const float*>(acc->at(i0 + r, h * d)), d, o_tile + r * dp);
          std::fill(o_tile + r * dp + d, o_tile + (r + 1) * dp, 0.0f);
        }
        if (n_keys == 0) continue;
      } else {
        std::fill_n(m, bq, kNegInf);
        std::fill_n(l, bq, 0.0f);
        std::fill_n(o_tile, bq * dp, 0.0f);
      }
      // The q tile, staged contiguous once: it is read again for every key tile.
      if (n_keys > 0) {
        for (int64_t r = 0; r < bq; ++r)
          to_f32(p.q.at(i0 + r, h * d), p.q.dtype, q_stage + r * d, d);
      }
      for (int64_t j0 = 0; j0 < n_keys; j0 += kAttnFwdBk) {
        const int64_t bk = std::min(kAttnFwdBk, n_keys - j0);
        pack_tile_t(p.k, j0, bk, kvh, int(d), k_panel);
        pack_tile_chunks(p.v, j0, bk, kvh, int(d), v_pack, kAttnFwdBk * kNr);
        for (int64_t r0 = 0; r0 < bq; r0 += kAttnStripe) {
          const int mr = int(std::min(kAttnStripe, bq - r0));
          int64_t lim[kAttnStripe], smax = 0;
          for (int r = 0; r < mr; ++r) {
            lim[r] = visible(p, i0 + r0 + r, j0, bk);
            smax = std::max(smax, lim[r]);
          }
          if (smax == 0) continue;
          const int64_t n_panels = (smax + kNr - 1) / kNr;
          const float* qs = q_stage + r0 * d;
          // Scores, scaled, and their row maxima over the visible keys.
          __m256 vmax[kAttnStripe];
          for (int r = 0; r < mr; ++r) vmax[r] = _mm256_set1_ps(kNegInf);
          with_rows(mr, [&]<int MR>() {
            for (int64_t b = 0; b < n_panels; ++b) {
              score_block<MR>(qs, d, k_panel + b * kNr * d, int(d),
                              [&](int r, __m256 lo, __m256 hi) {
                                float* dst = s_rows + r * kAttnFwdSld + b * kNr;
                                lo = _mm256_mul_ps(lo, vscale);
                                hi = _mm256_mul_ps(hi, vscale);
                                _mm256_storeu_ps(dst, lo);
                                _mm256_storeu_ps(dst + 8, hi);
                                const int64_t n = lim[r] - b * kNr;
                                if (n < kNr) {
                                  lo = _mm256_blendv_ps(neg_inf, lo, lane_mask(n));
                                  hi = _mm256_blendv_ps(neg_inf, hi, lane_mask(n - 8));
                                }
                                vmax[r] = _mm256_max_ps(vmax[r], _mm256_max_ps(lo, hi));
                              });
            }
          });
          for (int r = 0; r < mr; ++r) {
            float* srow = s_rows + r * kAttnFwdSld;
            if (lim[r] == 0) {
              std::fill_n(srow, smax, 0.0f);
              continue;
            }
            const float alpha =
                softmax_row(srow, lim[r], smax, hmax8(vmax[r]), m[r0 + r], l[r0 + r]);
            if (alpha != 1.0f) {
              float* orow = o_tile + (r0 + r) * dp;
              for (int64_t e = 0; e < d; ++e) orow[e] *= alpha;
            }
          }
          // O += P V over the keys [0, smax): rows with fewer visible keys add exact zeros.
          acc_rows<false>(mr, dp, s_rows, kAttnFwdSld, v_pack, kNr, kAttnFwdBk * kNr,
                          o_tile + r0 * dp, dp, kNr, 0, smax);
        }
      }
      if (acc) {
        for (int64_t r = 0; r < bq; ++r) {
          *lse_at(*m_state, h, i0 + r) = m[r];
          *lse_at(*l_state, h, i0 + r) = l[r];
          std::copy_n(o_tile + r * dp, d, static_cast<float*>(acc->at(i0 + r, h * d)));
        }
      } else {
        for (int64_t r = 0; r < bq; ++r) {
          float* orow = o_tile + r * dp;
          const float inv = l[r] > 0.0f ? 1.0f / l[r] : 0.0f;
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
  const int64_t dp = attn_padded_dim(d);
  constexpr int64_t kcs = kAttnBwdBk * kNr, qcs = kAttnBwdBq * kNr;  // chunk strides
  float* k_panel = ws;                                               // (Bk, d) packed transposed
  float* v_panel = k_panel + kAttnBwdBk * d;                         // (Bk, d) packed transposed
  float* k_pack = v_panel + kAttnBwdBk * d;            // (Bk, dp) packed in column chunks
  float* p_tile = k_pack + kAttnBwdBk * dp;            // (Bq, Bk + 16)
  float* ds_tile = p_tile + kAttnBwdBq * kAttnBwdSld;  // (Bq, Bk + 16)
  float* q_pack = ds_tile + kAttnBwdBq * kAttnBwdSld;  // (Bq, dp) packed in column chunks
  float* do_pack = q_pack + kAttnBwdBq * dp;           // (Bq, dp) packed in column chunks
  float* dk_acc = do_pack + kAttnBwdBq * dp;           // (Bk, dp) dk of the tile, in chunks
  float* dv_acc = dk_acc + kAttnBwdBk * dp;            // (Bk, dp) dv of the tile, in chunks
  float* q_stage = dv_acc + kAttnBwdBk * dp;           // (Bq, d), bf16 only
  float* do_stage = q_stage + kAttnBwdBq * d;          // (Bq, d), bf16 only
  check_layout(ws, q_stage, do_stage + kAttnBwdBq * d, attn_bwd_workspace_bytes(d, p.q.dtype),
               p.q.dtype);
  const __m256 vscale = _mm256_set1_ps(scale);
  const __m256i iota = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);

  for (int h = 0; h < p.hq; ++h) {
    const int kvh = h / group;
    for (int64_t j0 = 0; j0 < sk; j0 += kAttnBwdBk) {
      const int64_t bk = std::min(kAttnBwdBk, sk - j0);
      const int64_t bkp = round_up(bk, kNr);
      // First query row that sees key j0.
      const int64_t i_first = p.causal ? std::clamp<int64_t>(p.k_pos0 + j0 - p.q_pos0, 0, sq) : 0;
      if (i_first >= sq) continue;
      pack_tile_t(p.k, j0, bk, kvh, int(d), k_panel);
      pack_tile_t(p.v, j0, bk, kvh, int(d), v_panel);
      pack_tile_chunks(p.k, j0, bk, kvh, int(d), k_pack, kcs);
      // dK and dV of the tile are accumulated in place of dk and dv, in chunks: the same FMA
      // chains, in a contiguous buffer.
      pack_tile_chunks(dk, j0, bk, kvh, int(d), dk_acc, kcs);
      pack_tile_chunks(dv, j0, bk, kvh, int(d), dv_acc, kcs);
      for (int64_t i0 = i_first / kAttnBwdBq * kAttnBwdBq; i0 < sq; i0 += kAttnBwdBq) {
        const int64_t bq = std::min(kAttnBwdBq, sq - i0);
        const Tile qt = load_tile(p.q, i0, bq, h, int(d), q_stage);
        const Tile dot = load_tile(dout, i0, bq, h, int(d), do_stage);
        pack_tile_chunks(p.q, i0, bq, h, int(d), q_pack, qcs);
        pack_tile_chunks(dout, i0, bq, h, int(d), do_pack, qcs);
        float* dq_t = static_cast<float*>(dq.at(i0, int64_t(h) * d));
        for (int64_t r0 = 0; r0 < bq; r0 += kAttnStripe) {
          const int mr = int(std::min(kAttnStripe, bq - r0));
          int64_t lim[kAttnStripe], smax = 0;
          __m256 vlse[kAttnStripe], vdelta[kAttnStripe];
          for (int r = 0; r < mr; ++r) {
            const float lr = *lse_at(lse, h, i0 + r0 + r);
            lim[r] = lr == kNegInf ? 0 : visible(p, i0 + r0 + r, j0, bk);
            smax = std::max(smax, lim[r]);
            vlse[r] = _mm256_set1_ps(lr);
            vdelta[r] = _mm256_set1_ps(*lse_at(delta, h, i0 + r0 + r));
          }
          const int64_t n_panels = (smax + kNr - 1) / kNr;
          float* p_rows = p_tile + r0 * kAttnBwdSld;
          float* ds_rows = ds_tile + r0 * kAttnBwdSld;
          // Keys past the stripe's last visible panel: zero, read by the dV and dK products.
          for (int r = 0; r < mr; ++r) {
            std::fill(p_rows + r * kAttnBwdSld + n_panels * kNr, p_rows + r * kAttnBwdSld + bkp,
                      0.0f);
            std::fill(ds_rows + r * kAttnBwdSld + n_panels * kNr, ds_rows + r * kAttnBwdSld + bkp,
                      0.0f);
          }
          if (n_panels == 0) continue;
          with_rows(mr, [&]<int MR>() {
            const float* qs = qt.ptr + r0 * qt.ld;
            const float* ds_src = dot.ptr + r0 * dot.ld;
            for (int64_t b = 0; b < n_panels; ++b) {
              // P = exp(scale * q k^T - lse), zero where masked.
              score_block<MR>(
                  qs, qt.ld, k_panel + b * kNr * d, int(d), [&](int r, __m256 lo, __m256 hi) {
                    float* dst = p_rows + r * kAttnBwdSld + b * kNr;
                    __m256 p0 = exp8(_mm256_fmsub_ps(lo, vscale, vlse[r]));
                    __m256 p1 = exp8(_mm256_fmsub_ps(hi, vscale, vlse[r]));
                    if ((b + 1) * kNr > lim[r]) {
                      const __m256i n = _mm256_set1_epi32(int32_t(lim[r] - b * kNr));
                      p0 = _mm256_and_ps(p0, _mm256_castsi256_ps(_mm256_cmpgt_epi32(n, iota)));
                      p1 = _mm256_and_ps(p1, _mm256_castsi256_ps(_mm256_cmpgt_epi32(
                                                 n, _mm256_add_epi32(iota, _mm256_set1_epi32(8)))));
                    }
                    _mm256_storeu_ps(dst, p0);
                    _mm256_storeu_ps(dst + 8, p1);
                  });
              // dS = P * (do v^T - delta) * scale.
              score_block<MR>(
                  ds_src, dot.ld, v_panel + b * kNr * d, int(d), [&](int r, __m256 lo, __m256 hi) {
                    const float* pr = p_rows + r * kAttnBwdSld + b * kNr;
                    float* dst = ds_rows + r * kAttnBwdSld + b * kNr;
                    const __m256 s0 = _mm256_mul_ps(
                        _mm256_mul_ps(_mm256_loadu_ps(pr), _mm256_sub_ps(lo, vdelta[r])), vscale);
                    const __m256 s1 = _mm256_mul_ps(
                        _mm256_mul_ps(_mm256_loadu_ps(pr + 8), _mm256_sub_ps(hi, vdelta[r])),
                        vscale);
                    _mm256_storeu_ps(dst, s0);
                    _mm256_storeu_ps(dst + 8, s1);
                  });
            }
          });
          // dQ += dS K over the keys [0, smax), in increasing key order.
          acc_rows<false>(mr, d, ds_rows, kAttnBwdSld, k_pack, kNr, kcs, dq_t + r0 * dq.ld, dq.ld,
                          kNr, 0, smax);
        }
        // dV += P^T dO and dK += dS^T Q, six keys at a time, over the query rows that see them
        // (in increasing row order; rows before the first that sees a key add exact zeros).
        for (int64_t jb = 0; jb < bk; jb += kAttnStripe) {
          const int mr = int(std::min(kAttnStripe, bk - jb));
          const int64_t i_lo =
              p.causal ? std::clamp<int64_t>(p.k_pos0 + j0 + jb - p.q_pos0 - i0, 0, bq) : 0;
          if (i_lo >= bq) break;
          acc_rows<true>(mr, dp, p_tile + jb, kAttnBwdSld, do_pack, kNr, qcs, dv_acc + jb * kNr,
                         kNr, kcs, i_lo, bq);
          acc_rows<true>(mr, dp, ds_tile + jb, kAttnBwdSld, q_pack, kNr, qcs, dk_acc + jb * kNr,
                         kNr, kcs, i_lo, bq);
        }
      }
      unpack_chunks(dk_acc, kcs, bk, int(d), static_cast<float*>(dk.at(j0, int64_t(kvh) * d)),
                    dk.ld);
      unpack_chunks(dv_acc, kcs, bk, int(d), static_cast<float*>(dv.at(j0, int64_t(kvh) * d)),
                    dv.ld);
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
        std::memcpy(o.at(i, int64_t(h) * d), o2.at(i, int64_t(h) * d),
                    size_t(d * dtype_size(o.dtype)));
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
