// CPU flash-attention kernels, compiled once per vector target by Highway's foreach_target
// (AVX2, AVX-512) and dispatched at run time (cpu_isa.h). The tiles and their order are the same
// on every target (attention_tiles.h); only the register blocks of the micro-kernels differ.
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "backend/cpu/attention_cpu.cpp"
#include <hwy/foreach_target.h>  // IWYU pragma: keep
//
#include <hwy/highway.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "backend/cpu/attention_cpu.h"
#include "backend/cpu/attention_mask.h"
#include "backend/cpu/attention_tiles.h"
#include "backend/cpu/attn_micro-inl.h"
#include "backend/cpu/cpu_isa.h"
#include "backend/cpu/vec_math-inl.h"
#include "backend/cpu/vec_math.h"

HWY_BEFORE_NAMESPACE();
namespace upipe::cpu {
namespace HWY_NAMESPACE {
namespace {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

bool is_bf16(const Mat& x) {
  return x.dtype == DType::kBF16;
}

// A (rows, d) fp32 tile of head `head` of view x starting at row r0: a direct pointer into fp32
// data, or a converted copy in `stage` for bf16.
struct Tile {
  const float* ptr;
  int64_t ld;
};
Tile load_tile(const Mat& x, int64_t r0, int64_t rows, int head, int d, float* stage) {
  if (!is_bf16(x)) return {static_cast<const float*>(x.at(r0, int64_t(head) * d)), x.ld};
  for (int64_t r = 0; r < rows; ++r)
    widen_row(x.at(r0 + r, int64_t(head) * d), true, stage + r * d, d);
  return {stage, d};
}

// Packs rows [r0, r0 + rows) of head `head` of x transposed into kNr-row panels.
void pack_tile_t(const Mat& x, int64_t r0, int64_t rows, int head, int d, float* dst) {
  const void* src = x.at(r0, int64_t(head) * d);
  if (is_bf16(x))
    pack_panels<true>(src, x.ld, rows, d, dst);
  else
    pack_panels<false>(src, x.ld, rows, d, dst);
}

// Packs rows [r0, r0 + rows) of head `head` of x into kNr-column chunks cs floats apart.
void pack_tile_chunks(const Mat& x, int64_t r0, int64_t rows, int head, int d, float* dst,
                      int64_t cs) {
  const void* src = x.at(r0, int64_t(head) * d);
  if (is_bf16(x))
    pack_chunks<true>(src, x.ld, rows, d, dst, cs);
  else
    pack_chunks<false>(src, x.ld, rows, d, dst, cs);
}

// The keys [start, lim) of the key tile [j0, j0 + bk) that a query row with key range [lo, hi)
// sees, in tile columns (start = lim when none).
struct TileCols {
  int64_t start, lim;
};
inline TileCols tile_cols(int64_t lo, int64_t hi, int64_t j0, int64_t bk) {
  const int64_t lim = std::clamp<int64_t>(hi - j0, 0, bk);
  return {std::clamp<int64_t>(lo - j0, 0, lim), lim};
}

// The columns a stripe of rows computes: panels from the one holding the first key any row sees
// (c0, a multiple of kNr) to the last (smax); smax = 0 when no row sees a key of the tile.
struct StripeCols {
  int64_t c0 = 0, smax = 0;
};
inline StripeCols stripe_cols(const int64_t* start, const int64_t* lim, int mr) {
  StripeCols c;
  int64_t first = -1;
  for (int r = 0; r < mr; ++r) {
    if (start[r] >= lim[r]) continue;
    first = first < 0 ? start[r] : std::min(first, start[r]);
    c.smax = std::max(c.smax, lim[r]);
  }
  if (first >= 0) c.c0 = first / kAttnPanel * kAttnPanel;
  return c;
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

// Prefetches columns [c0, c0 + n) of rows [r0, r0 + rows) of x (clipped to its rows), into L1
// (kL1) or L2. The backward reads a head's rows of q, do and dq 1-2 KiB apart, a stride the
// hardware prefetcher does not follow, once per key tile.
enum class Near { kL1, kL2 };
inline void prefetch_rows(const Mat& x, int64_t r0, int64_t rows, int64_t c0, int64_t n, Near to) {
  const int64_t bytes = n * dtype_size(x.dtype), end = std::min(r0 + rows, x.rows);
  // The hint must be a compile-time constant (clang checks it), hence two loops.
  for (int64_t r = r0; r < end; ++r) {
    const char* row = static_cast<const char*>(x.at(r, c0));
    if (to == Near::kL1)
      for (int64_t b = 0; b < bytes; b += 64) _mm_prefetch(row + b, _MM_HINT_T0);
    else
      for (int64_t b = 0; b < bytes; b += 64) _mm_prefetch(row + b, _MM_HINT_T1);
  }
}

// Lanes [0, n) of a vector (n <= 0: none; n >= kLanes: all).
HWY_INLINE hn::Mask<DF> lanes_below(int64_t n) {
  return hn::FirstN(DF(), size_t(std::clamp<int64_t>(n, 0, kLanes)));
}

// Lanes [lo, hi) of a vector (relative to its first lane).
HWY_INLINE hn::Mask<DF> lanes_in(int64_t lo, int64_t hi) {
  return hn::AndNot(lanes_below(lo), lanes_below(hi));
}

// The running maximum vmax of one query row's visible scores [start, lim), in lanes, updated with
// the vector x of scores at tile columns [c, c + kLanes) (the score kernels' epilogues keep it, so
// the softmax needs no pass of its own for it).
HWY_INLINE void row_max_add(VF& vmax, VF x, int64_t c, int64_t start, int64_t lim) {
  if (c >= start && c + kLanes <= lim)
    vmax = hn::Max(vmax, x);
  else if (c < lim && c + kLanes > start)
    vmax = hn::Max(vmax, hn::IfThenElse(lanes_in(start - c, lim - c), x, vmax));
}

// Online-softmax step of one query row over the scores s[start, lim) of a key tile (start < lim),
// scores defined from c0 (a multiple of kNr, <= start), vmax their maximum in lanes: overwrites
// s[c0, n) with p = exp(s - m_new) inside [start, lim) and zeros outside (n >= lim, s has room up
// to a multiple of kNr), updates the running max m and sum l, and returns the factor alpha the
// row's output accumulator must be scaled by.
float softmax_row(float* s, int64_t c0, int64_t start, int64_t lim, int64_t n, VF vmax, float& m,
                  float& l) {
  const DF df;
  const float m_new = std::max(m, max_lanes(vmax));
  const VF vm = hn::Set(df, m_new);
  VF vsum = hn::Zero(df);
  int64_t c = c0;
  // Vectors before the row's first key (another document's keys): masked.
  for (; c < start && c < lim; c += kLanes) {
    const VF e =
        hn::IfThenElseZero(lanes_in(start - c, lim - c), exp_v(hn::Sub(hn::LoadU(df, s + c), vm)));
    hn::StoreU(e, df, s + c);
    vsum = hn::Add(vsum, e);
  }
  for (; c + kLanes <= lim; c += kLanes) {
    const VF e = exp_v(hn::Sub(hn::LoadU(df, s + c), vm));
    hn::StoreU(e, df, s + c);
    vsum = hn::Add(vsum, e);
  }
  if (c < lim) {
    const VF e = hn::IfThenElseZero(lanes_below(lim - c), exp_v(hn::Sub(hn::LoadU(df, s + c), vm)));
    hn::StoreU(e, df, s + c);
    vsum = hn::Add(vsum, e);
    c += kLanes;
  }
  for (; c < n; c += kLanes) hn::StoreU(hn::Zero(df), df, s + c);
  const float alpha = m == kNegInf ? 0.0f : exp_fast(m - m_new);
  l = l * alpha + sum_lanes(vsum);
  m = m_new;
  return alpha;
}

// The forward's buffers, carved out of the workspace (attn_fwd_workspace_bytes).
struct FwdBuffers {
  float* k_panel;  // (Bk, d) packed transposed
  float* v_pack;   // (Bk, dp) packed in column chunks
  float* s_rows;   // (stripe, Bk + 16) scores, then probabilities
  float* o_tile;   // (Bq, dp) un-normalised output
  float* m;        // (Bq)
  float* l;        // (Bq)
  float* q_stage;  // (Bq, d) the q tile, fp32
  FwdBuffers() = default;
  FwdBuffers(float* ws, int64_t d, DType t) {
    const int64_t dp = attn_padded_dim(d);
    k_panel = ws;
    v_pack = k_panel + kAttnFwdBk * d;
    s_rows = v_pack + kAttnFwdBk * dp;
    o_tile = s_rows + kAttnStripe * kAttnFwdSld;
    m = o_tile + kAttnFwdBq * dp;
    l = m + kAttnFwdBq;
    q_stage = l + kAttnFwdBq;
    check_layout(ws, q_stage + kAttnFwdBq * d, q_stage + kAttnFwdBq * d,
                 attn_fwd_workspace_bytes(d, t), t);
  }
};

// The tile columns each row of a stripe sees, from the rows' key ranges lo, hi (mr rows).
struct FwdStripe {
  int64_t start[kAttnStripe], lim[kAttnStripe];
  StripeCols cols;
  FwdStripe(const int64_t* lo, const int64_t* hi, int mr, int64_t j0, int64_t bk) {
    for (int r = 0; r < mr; ++r) {
      const TileCols t = tile_cols(lo[r], hi[r], j0, bk);
      start[r] = t.start;
      lim[r] = t.lim;
    }
    cols = stripe_cols(start, lim, mr);
  }
};

// One stripe of query rows [r0, r0 + mr) of the staged q tile, with key ranges lo, hi, against
// the packed key tile of bk keys starting at key j0: scores, online softmax, O += P V, over the
// panels some row of the stripe sees.
void fwd_stripe(const AttnProblem& p, const FwdBuffers& w, const int64_t* lo, const int64_t* hi,
                int64_t r0, int mr, int64_t j0, int64_t bk) {
  const DF df;
  const int d = p.d;
  const int64_t dp = attn_padded_dim(d);
  const VF vscale = hn::Set(df, p.softmax_scale());
  const FwdStripe st(lo + r0, hi + r0, mr, j0, bk);
  const int64_t smax = st.cols.smax, c0 = st.cols.c0;
  if (smax == 0) return;
  const int64_t n_panels = (smax + kNr - 1) / kNr, ps = int64_t(kNr) * d;
  // Scores, scaled, in row groups of kScoreMr and kScoreNp panels at a time, and each row's
  // maximum over the scores it sees.
  VF vmax[kAttnStripe];
  for (VF& v : vmax) v = hn::Set(df, kNegInf);
  for (int g = 0; g < mr; g += kScoreMr) {
    const float* qs = w.q_stage + (r0 + g) * d;
    float* srow = w.s_rows + g * kAttnFwdSld;
    with_rows<kScoreMr>(std::min(kScoreMr, mr - g), [&]<int MR>() HWY_ATTR {
      auto store = [&](int64_t b) HWY_ATTR {
        return [&, b](int r, int pn, const VF* v) HWY_ATTR {
          const int64_t c = (b + pn) * kNr;
          for (int i = 0; i < kPv; ++i) {
            const VF x = hn::Mul(v[i], vscale);
            hn::StoreU(x, df, srow + r * kAttnFwdSld + c + i * kLanes);
            row_max_add(vmax[g + r], x, c + i * kLanes, st.start[g + r], st.lim[g + r]);
          }
        };
      };
      int64_t b = c0 / kNr;
      for (; b + kScoreNp <= n_panels; b += kScoreNp)
        score_block<MR, kScoreNp>(qs, d, w.k_panel + b * ps, ps, d, store(b));
      for (; b < n_panels; ++b) score_block<MR, 1>(qs, d, w.k_panel + b * ps, ps, d, store(b));
    });
  }
  for (int r = 0; r < mr; ++r) {
    float* srow = w.s_rows + r * kAttnFwdSld;
    if (st.start[r] >= st.lim[r]) {
      std::fill(srow + c0, srow + smax, 0.0f);
      continue;
    }
    const float alpha =
        softmax_row(srow, c0, st.start[r], st.lim[r], smax, vmax[r], w.m[r0 + r], w.l[r0 + r]);
    if (alpha != 1.0f) {
      float* orow = w.o_tile + (r0 + r) * dp;
      for (int64_t e = 0; e < d; ++e) orow[e] *= alpha;
    }
  }
  // O += P V over the keys [c0, smax): keys a row does not see add exact zeros.
  for (int g = 0; g < mr; g += kAccMr)
    acc_rows<false>(std::min(kAccMr, mr - g), dp, w.s_rows + g * kAttnFwdSld, kAttnFwdSld, w.v_pack,
                    kNr, kAttnFwdBk * kNr, w.o_tile + (r0 + g) * dp, dp, kNr, c0, smax);
}

// Loads the tile's running state (accumulate mode) or resets it.
void fwd_tile_begin(const FwdBuffers& w, const Mat* acc, const Mat* m_state, const Mat* l_state,
                    int h, int64_t i0, int64_t bq, int d) {
  const int64_t dp = attn_padded_dim(d);
  if (!acc) {
    std::fill_n(w.m, bq, kNegInf);
    std::fill_n(w.l, bq, 0.0f);
    std::fill_n(w.o_tile, bq * dp, 0.0f);
    return;
  }
  for (int64_t r = 0; r < bq; ++r) {
    w.m[r] = *lse_at(*m_state, h, i0 + r);
    w.l[r] = *lse_at(*l_state, h, i0 + r);
    std::copy_n(static_cast<const float*>(acc->at(i0 + r, int64_t(h) * d)), d, w.o_tile + r * dp);
    std::fill(w.o_tile + r * dp + d, w.o_tile + (r + 1) * dp, 0.0f);
  }
}

// Stores the tile's running state (accumulate mode) or its normalised output and lse.
void fwd_tile_end(const FwdBuffers& w, const Mat* o, const Mat* lse, const Mat* acc,
                  const Mat* m_state, const Mat* l_state, int h, int64_t i0, int64_t bq, int d) {
  const int64_t dp = attn_padded_dim(d);
  for (int64_t r = 0; r < bq; ++r) {
    float* orow = w.o_tile + r * dp;
    if (acc) {
      *lse_at(*m_state, h, i0 + r) = w.m[r];
      *lse_at(*l_state, h, i0 + r) = w.l[r];
      std::copy_n(orow, d, static_cast<float*>(acc->at(i0 + r, int64_t(h) * d)));
      continue;
    }
    const float inv = w.l[r] > 0.0f ? 1.0f / w.l[r] : 0.0f;
    for (int64_t e = 0; e < d; ++e) orow[e] *= inv;
    narrow_row(orow, o->at(i0 + r, int64_t(h) * d), is_bf16(*o), d);
    *lse_at(*lse, h, i0 + r) = w.l[r] > 0.0f ? w.m[r] + std::log(w.l[r]) : kNegInf;
  }
}

}  // namespace

#if HWY_TARGET == HWY_AVX3
// The bf16-dot kernels (below): bf16 inputs on the avx512bf16 path.
UPIPE_BF16_DOT_BEGIN
void attention_forward_bf16(const AttnProblem& p, const Mat* o, const Mat* lse, const Mat* acc,
                            const Mat* m_state, const Mat* l_state, float* ws, bool amx);
void attention_backward_bf16(const AttnProblem& p, const Mat& dout, const Mat& lse,
                             const Mat& delta, const Mat& dq, const Mat& dk, const Mat& dv,
                             float* ws, bool amx);
UPIPE_BF16_DOT_END
#endif

void attention_forward_t(const AttnProblem& p, const Mat* o, const Mat* lse, const Mat* acc,
                         const Mat* m_state, const Mat* l_state, float* ws, int bf16_mode) {
#if HWY_TARGET == HWY_AVX3
  if (bf16_mode != int(AttnBf16::kNone))
    return attention_forward_bf16(p, o, lse, acc, m_state, l_state, ws,
                                  bf16_mode == int(AttnBf16::kAmx));
#endif
  (void)bf16_mode;
  const int64_t sq = p.sq();
  const int d = p.d, group = p.hq / p.hk;
  const FwdBuffers w(ws, d, p.q.dtype);
  int64_t lo[kAttnFwdBq], hi[kAttnFwdBq];  // the key range of each row of the query tile
  for (int h = 0; h < p.hq; ++h) {
    const int kvh = h / group;
    for (int64_t i0 = 0; i0 < sq; i0 += kAttnFwdBq) {
      const int64_t bq = std::min(kAttnFwdBq, sq - i0);
      key_ranges(p, i0, bq, lo, hi);
      const RowRange keys = keys_seen(lo, hi, bq);
      fwd_tile_begin(w, acc, m_state, l_state, h, i0, bq, d);
      if (acc && keys.end == 0) continue;
      // The q tile, staged contiguous once: it is read again for every key tile.
      if (keys.end > 0)
        for (int64_t r = 0; r < bq; ++r)
          widen_row(p.q.at(i0 + r, int64_t(h) * d), is_bf16(p.q), w.q_stage + r * d, d);
      // Key tiles stay anchored at key 0; those before the first key any row sees are skipped.
      for (int64_t j0 = keys.first / kAttnFwdBk * kAttnFwdBk; j0 < keys.end; j0 += kAttnFwdBk) {
        const int64_t bk = std::min(kAttnFwdBk, keys.end - j0);
        pack_tile_t(p.k, j0, bk, kvh, d, w.k_panel);
        pack_tile_chunks(p.v, j0, bk, kvh, d, w.v_pack, kAttnFwdBk * kNr);
        for (int64_t r0 = 0; r0 < bq; r0 += kAttnStripe)
          fwd_stripe(p, w, lo, hi, r0, int(std::min(kAttnStripe, bq - r0)), j0, bk);
      }
      fwd_tile_end(w, o, lse, acc, m_state, l_state, h, i0, bq, d);
    }
  }
}

#if HWY_TARGET == HWY_AVX3
UPIPE_BF16_DOT_BEGIN
namespace {

// softmax_row writing the probabilities p[c0, n) in bf16 (zeros outside [start, lim), n a
// multiple of kNr) while their sum l is kept in fp32; vmax holds the row's maximum over its
// visible scores in lanes (from the score epilogue).
float softmax_row_bf16(const float* s, int64_t c0, int64_t start, int64_t lim, int64_t n, VF vmax,
                       float& m, float& l, uint16_t* p) {
  const DF df;
  const float m_new = std::max(m, max_lanes(vmax));
  const VF vm = hn::Set(df, m_new);
  VF vsum = hn::Zero(df);
  auto prob = [&](int64_t c) UPIPE_BF16_ATTR {
    VF e = exp_v(hn::Sub(hn::LoadU(df, s + c), vm));
    if (c < start || c + kLanes > lim) e = hn::IfThenElseZero(lanes_in(start - c, lim - c), e);
    vsum = hn::Add(vsum, e);
    return e.raw;
  };
  int64_t c = c0;
  for (; c + 2 * kLanes <= n && c < lim; c += 2 * kLanes) {
    const __m512 lo = prob(c), hi = prob(c + kLanes);
    _mm512_storeu_si512(p + c, cvt2_bf16(hi, lo));
  }
  for (; c < n && c < lim; c += kLanes)
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(p + c), cvt_bf16(prob(c)));
  std::fill(p + c, p + n, uint16_t(0));
  const float alpha = m == kNegInf ? 0.0f : exp_fast(m - m_new);
  l = l * alpha + sum_lanes(vsum);
  m = m_new;
  return alpha;
}

// The bf16-dot forward's buffers (attn_fwd_workspace_bytes with bf16_dot).
struct FwdBuffersBf16 {
  uint32_t* k_panel;  // (Bk, d) bf16 in pair panels
  uint32_t* v_pack;   // (Bk, dp) bf16 in pair chunks along the keys
  float* s_rows;      // (stripe, Bk + 16) scores, then probabilities
  uint16_t* p16;      // (stripe, Bk + 16) probabilities in bf16
  float* o_tile;      // (Bq, dp) un-normalised output
  float* m;           // (Bq)
  float* l;           // (Bq)
  FwdBuffersBf16(float* ws, int64_t d) {
    const int64_t dp = attn_padded_dim(d);
    k_panel = reinterpret_cast<uint32_t*>(ws);
    v_pack = k_panel + kAttnFwdBk * d / 2;
    s_rows = reinterpret_cast<float*>(v_pack + kAttnFwdBk * dp / 2);
    p16 = reinterpret_cast<uint16_t*>(s_rows + kAttnStripe * kAttnFwdSld);
    o_tile = reinterpret_cast<float*>(p16 + kAttnStripe * kAttnFwdSld);
    m = o_tile + kAttnFwdBq * dp;
    l = m + kAttnFwdBq;
    check_layout(ws, l + kAttnFwdBq, l + kAttnFwdBq,
                 attn_fwd_workspace_bytes(d, DType::kBF16, true), DType::kBF16);
  }
  FwdBuffers as_fp32() const {
    FwdBuffers f{};
    f.s_rows = s_rows, f.o_tile = o_tile, f.m = m, f.l = l;
    return f;
  }
};

// The online softmax of a bf16-dot stripe's rows [r0, r0 + mr) over the scores [c0, sp) in
// s_rows: probabilities in bf16 into p16 (zeros for a row that sees nothing), m and l updated,
// the row's output accumulator rescaled.
void softmax_stripe_bf16(const FwdBuffersBf16& w, const FwdStripe& st, int mr, int64_t r0,
                         int64_t c0, int64_t sp, const VF* vmax, int d) {
  const int64_t dp = attn_padded_dim(d);
  for (int r = 0; r < mr; ++r) {
    uint16_t* prow = w.p16 + r * kAttnFwdSld;
    if (st.start[r] >= st.lim[r]) {
      std::fill(prow + c0, prow + sp, uint16_t(0));
      continue;
    }
    const float alpha = softmax_row_bf16(w.s_rows + r * kAttnFwdSld, c0, st.start[r], st.lim[r], sp,
                                         vmax[r], w.m[r0 + r], w.l[r0 + r], prow);
    if (alpha != 1.0f) {
      float* orow = w.o_tile + (r0 + r) * dp;
      for (int64_t e = 0; e < d; ++e) orow[e] *= alpha;
    }
  }
}

// Zeroes the pairs [ceil(n / 2), round_up(n, 32) / 2) of every chunk of a pair-chunk pack of n
// rows (chunk stride cs words, dp columns): the amx path contracts whole tiles of 16 pairs.
void zero_pair_tail(uint32_t* pack, int64_t cs, int64_t dp, int64_t n) {
  const int64_t from = (n + 1) / 2, to = round_up(n, 32) / 2;
  for (int64_t c = 0; c < dp / kNr; ++c)
    std::fill(pack + c * cs + from * kNr, pack + c * cs + to * kNr, 0u);
}

// fwd_stripe_bf16's stripe on AMX tiles (the amx path; d % 32 == 0): the same scores and
// softmax, with the panel and pair ranges rounded out to whole tiles (the probabilities are zero
// there, and the V pairs past the tile's keys are zeroed by the caller).
void fwd_stripe_amx(const AttnProblem& p, const FwdBuffersBf16& w, AmxTiles& tiles,
                    const FwdStripe& st, const uint16_t* q, int mr, int64_t r0, int64_t n_panels,
                    VF* vmax) {
  const DF df;
  const int d = p.d;
  const int64_t dp = attn_padded_dim(d), ps = int64_t(kNr) * d / 2;
  const VF vscale = hn::Set(df, p.softmax_scale());
  const int64_t c0 = st.cols.c0 / 32 * 32;
  const int64_t sp = round_up(n_panels * kNr, 32);  // probabilities defined up to here
  tiles.rows(mr);
  alignas(64) float out[kAttnStripe * 4 * kNr];
  for (int64_t b = st.cols.c0 / kNr; b < n_panels; b += 4) {
    const int np = int(std::min<int64_t>(4, n_panels - b));
    amx_score_panels(np, q, p.q.ld, w.k_panel + b * ps, ps, d, out, 4 * kNr);
    for (int r = 0; r < mr; ++r)
      for (int pn = 0; pn < np; ++pn) {
        const VF x = hn::Mul(hn::Load(df, out + r * 4 * kNr + pn * kNr), vscale);
        const int64_t c = (b + pn) * kNr;
        hn::StoreU(x, df, w.s_rows + r * kAttnFwdSld + c);
        row_max_add(vmax[r], x, c, st.start[r], st.lim[r]);
      }
  }
  softmax_stripe_bf16(w, st, mr, r0, c0, sp, vmax, d);
  // O += P V over the key pairs [c0 / 2, sp / 2), whole tiles of 16 pairs.
  amx_acc_rows(dp, w.p16, kAttnFwdSld, w.v_pack, kAttnFwdBk / 2 * kNr, w.o_tile + r0 * dp, dp,
               c0 / 2, sp / 2);
}

// fwd_stripe with bf16 q, k, v on the dot-product instruction: scores from the pair panels, the
// probabilities rounded to bf16 for O += P V (their row sum stays fp32).
void fwd_stripe_bf16(const AttnProblem& p, const FwdBuffersBf16& w, AmxTiles& tiles,
                     const int64_t* lo, const int64_t* hi, int h, int64_t i0, int64_t r0, int mr,
                     int64_t j0, int64_t bk) {
  const DF df;
  const int d = p.d;
  const int64_t dp = attn_padded_dim(d);
  const VF vscale = hn::Set(df, p.softmax_scale());
  const FwdStripe st(lo + r0, hi + r0, mr, j0, bk);
  const int64_t smax = st.cols.smax, c0 = st.cols.c0;
  if (smax == 0) return;
  const int64_t n_panels = (smax + kNr - 1) / kNr, ps = int64_t(kNr) * d / 2;
  const uint16_t* q = static_cast<const uint16_t*>(p.q.at(i0 + r0, int64_t(h) * d));
  // Each row's maximum over the scores it sees, in lanes, kept by the score epilogue.
  VF vmax[kAttnStripe];
  for (VF& v : vmax) v = hn::Set(df, kNegInf);
  if (tiles.on()) return fwd_stripe_amx(p, w, tiles, st, q, mr, r0, n_panels, vmax);
  for (int g = 0; g < mr; g += kScoreMrBf16) {
    float* srow = w.s_rows + g * kAttnFwdSld;
    with_rows<kScoreMrBf16>(std::min(kScoreMrBf16, mr - g), [&]<int MR>() UPIPE_BF16_ATTR {
      auto store = [&](int64_t b) UPIPE_BF16_ATTR {
        return [&, b](int r, int pn, const VF* v) UPIPE_BF16_ATTR {
          const VF x = hn::Mul(v[0], vscale);
          const int64_t c = (b + pn) * kNr;
          hn::StoreU(x, df, srow + r * kAttnFwdSld + c);
          row_max_add(vmax[g + r], x, c, st.start[g + r], st.lim[g + r]);
        };
      };
      const uint16_t* qg = q + g * p.q.ld;
      int64_t b = c0 / kNr;
      for (; b + kScoreNpBf16 <= n_panels; b += kScoreNpBf16)
        score_block_bf16<MR, kScoreNpBf16>(qg, p.q.ld, w.k_panel + b * ps, ps, d, store(b));
      for (; b < n_panels; ++b)
        score_block_bf16<MR, 1>(qg, p.q.ld, w.k_panel + b * ps, ps, d, store(b));
    });
  }
  const int64_t sp = n_panels * kNr;  // scores and probabilities defined up to here
  softmax_stripe_bf16(w, st, mr, r0, c0, sp, vmax, d);
  // O += P V over the key pairs [c0 / 2, ceil(smax / 2)): keys a row does not see add zeros.
  for (int g = 0; g < mr; g += kAccMr) {
    const PairA a{reinterpret_cast<const uint32_t*>(w.p16 + g * kAttnFwdSld), kAttnFwdSld / 2, 1};
    acc_rows_bf16(std::min(kAccMr, mr - g), dp, a, w.v_pack, kAttnFwdBk / 2 * kNr,
                  w.o_tile + (r0 + g) * dp, dp, kNr, c0 / 2, (smax + 1) / 2);
  }
}

}  // namespace

void attention_forward_bf16(const AttnProblem& p, const Mat* o, const Mat* lse, const Mat* acc,
                            const Mat* m_state, const Mat* l_state, float* ws, bool amx) {
  const int64_t sq = p.sq();
  const int d = p.d, group = p.hq / p.hk;
  const FwdBuffersBf16 w(ws, d);
  AmxTiles tiles(amx && d % 32 == 0);
  const int64_t dp = attn_padded_dim(d);
  const FwdBuffers wf = w.as_fp32();
  int64_t lo[kAttnFwdBq], hi[kAttnFwdBq];  // the key range of each row of the query tile
  for (int h = 0; h < p.hq; ++h) {
    const int kvh = h / group;
    for (int64_t i0 = 0; i0 < sq; i0 += kAttnFwdBq) {
      const int64_t bq = std::min(kAttnFwdBq, sq - i0);
      key_ranges(p, i0, bq, lo, hi);
      const RowRange keys = keys_seen(lo, hi, bq);
      fwd_tile_begin(wf, acc, m_state, l_state, h, i0, bq, d);
      if (acc && keys.end == 0) continue;
      for (int64_t j0 = keys.first / kAttnFwdBk * kAttnFwdBk; j0 < keys.end; j0 += kAttnFwdBk) {
        const int64_t bk = std::min(kAttnFwdBk, keys.end - j0);
        pack_pair_panels(static_cast<const uint16_t*>(p.k.at(j0, int64_t(kvh) * d)), p.k.ld, bk, d,
                         w.k_panel);
        pack_pair_chunks(static_cast<const uint16_t*>(p.v.at(j0, int64_t(kvh) * d)), p.v.ld, bk, d,
                         w.v_pack, kAttnFwdBk / 2 * kNr);
        if (tiles.on()) zero_pair_tail(w.v_pack, kAttnFwdBk / 2 * kNr, dp, bk);
        for (int64_t r0 = 0; r0 < bq; r0 += kAttnStripe)
          fwd_stripe_bf16(p, w, tiles, lo, hi, h, i0, r0, int(std::min(kAttnStripe, bq - r0)), j0,
                          bk);
      }
      fwd_tile_end(wf, o, lse, acc, m_state, l_state, h, i0, bq, d);
    }
  }
}
UPIPE_BF16_DOT_END
#endif  // HWY_TARGET == HWY_AVX3

namespace {

// The backward's buffers, carved out of the workspace (attn_bwd_workspace_bytes).
struct BwdBuffers {
  static constexpr int64_t kcs = kAttnBwdBk * kNr, qcs = kAttnBwdBq * kNr;  // chunk strides
  float* k_panel;   // (Bk, d) packed transposed
  float* v_panel;   // (Bk, d) packed transposed
  float* k_pack;    // (Bk, dp) packed in column chunks
  float* p_tile;    // (Bq, Bk + 16)
  float* ds_tile;   // (Bq, Bk + 16)
  float* q_pack;    // (Bq, dp) packed in column chunks
  float* do_pack;   // (Bq, dp) packed in column chunks
  float* dk_acc;    // (Bk, dp) dk of the tile, in chunks
  float* dv_acc;    // (Bk, dp) dv of the tile, in chunks
  float* q_stage;   // (Bq, d), bf16 only
  float* do_stage;  // (Bq, d), bf16 only
  BwdBuffers(float* ws, int64_t d, DType t) {
    const int64_t dp = attn_padded_dim(d);
    k_panel = ws;
    v_panel = k_panel + kAttnBwdBk * d;
    k_pack = v_panel + kAttnBwdBk * d;
    p_tile = k_pack + kAttnBwdBk * dp;
    ds_tile = p_tile + kAttnBwdBq * kAttnBwdSld;
    q_pack = ds_tile + kAttnBwdBq * kAttnBwdSld;
    do_pack = q_pack + kAttnBwdBq * dp;
    dk_acc = do_pack + kAttnBwdBq * dp;
    dv_acc = dk_acc + kAttnBwdBk * dp;
    q_stage = dv_acc + kAttnBwdBk * dp;
    do_stage = q_stage + kAttnBwdBq * d;
    check_layout(ws, q_stage, do_stage + kAttnBwdBq * d, attn_bwd_workspace_bytes(d, t), t);
  }
};

// The per-row inputs of one backward stripe: rows [r0, r0 + mr) of the query tile i0 with key
// ranges lo, hi against the key tile [j0, j0 + bk); a row whose lse is -inf sees nothing.
struct BwdStripe {
  int mr;
  int64_t start[kAttnStripe], lim[kAttnStripe];
  float lse[kAttnStripe], delta[kAttnStripe];
  int64_t c0 = 0, smax = 0;
  BwdStripe(const Mat& lse_m, const Mat& delta_m, int h, int64_t i0, int64_t r0, int rows,
            const int64_t* lo, const int64_t* hi, int64_t j0, int64_t bk)
      : mr(rows) {
    for (int r = 0; r < mr; ++r) {
      lse[r] = *lse_at(lse_m, h, i0 + r0 + r);
      delta[r] = *lse_at(delta_m, h, i0 + r0 + r);
      const TileCols t =
          lse[r] == kNegInf ? TileCols{0, 0} : tile_cols(lo[r0 + r], hi[r0 + r], j0, bk);
      start[r] = t.start;
      lim[r] = t.lim;
    }
    const StripeCols c = stripe_cols(start, lim, mr);
    c0 = c.c0;
    smax = c.smax;
  }
  // The stripe computes panels [c0 / kNr, n_panels()); none when no row sees a key.
  int64_t n_panels() const { return (smax + kAttnPanel - 1) / kAttnPanel; }
};

// Prefetches the dq rows of the stripe [r0, r0 + mr) of query tile [i0, i0 + bq) of head h, and
// the next query tile's rows of q, do and dq at the same offset.
void prefetch_stripe_rows(const AttnProblem& p, const Mat& dout, const Mat& dq, int h, int64_t i0,
                          int64_t bq, int64_t r0, int mr) {
  const int64_t c0 = int64_t(h) * p.d;
  prefetch_rows(dq, i0 + r0, mr, c0, p.d, Near::kL1);
  prefetch_rows(p.q, i0 + bq + r0, mr, c0, p.d, Near::kL2);
  prefetch_rows(dout, i0 + bq + r0, mr, c0, p.d, Near::kL2);
  prefetch_rows(dq, i0 + bq + r0, mr, c0, p.d, Near::kL2);
}

// The query rows [lo, hi) of a tile (key ranges klo, khi, bq rows) that see some key of the tile
// columns [jb, jb + n) of key tile j0; lo >= hi when none does.
RowRange tile_rows_seeing(const int64_t* klo, const int64_t* khi, int64_t bq, int64_t j0,
                          int64_t jb, int64_t n) {
  const int64_t k = j0 + jb;
  const int64_t first =
      std::partition_point(khi, khi + bq, [k](int64_t h) { return h <= k; }) - khi;
  const int64_t end =
      std::partition_point(klo, klo + bq, [k, n](int64_t l) { return l < k + n; }) - klo;
  return {first, end};
}

// P = exp(scale q k^T - lse) (zero where masked) and dS = P (do v^T - delta) scale for the rows
// [r0, r0 + mr) of the query tile against the key tile's panels [c0 / kNr, n_panels).
void bwd_scores(const BwdBuffers& w, const BwdStripe& st, const Tile& qt, const Tile& dot,
                int64_t r0, int64_t n_panels, int d, float scale) {
  const DF df;
  const VF vscale = hn::Set(df, scale);
  const int64_t ps = int64_t(kNr) * d;
  for (int g = 0; g < st.mr; g += kScoreMr) {
    float* p_rows = w.p_tile + (r0 + g) * kAttnBwdSld;
    float* ds_rows = w.ds_tile + (r0 + g) * kAttnBwdSld;
    const float* qs = qt.ptr + (r0 + g) * qt.ld;
    const float* ds_src = dot.ptr + (r0 + g) * dot.ld;
    with_rows<kScoreMr>(std::min(kScoreMr, st.mr - g), [&]<int MR>() HWY_ATTR {
      auto p_epi = [&](int64_t b) HWY_ATTR {
        return [&, b](int r, int pn, const VF* v) HWY_ATTR {
          const VF vlse = hn::Set(df, st.lse[g + r]);
          const int64_t n = st.lim[g + r] - (b + pn) * kNr, n0 = st.start[g + r] - (b + pn) * kNr;
          float* dst = p_rows + r * kAttnBwdSld + (b + pn) * kNr;
          for (int i = 0; i < kPv; ++i) {
            VF x = exp_v(hn::MulSub(v[i], vscale, vlse));
            if (n < kNr || n0 > 0)
              x = hn::IfThenElseZero(lanes_in(n0 - i * kLanes, n - i * kLanes), x);
            hn::StoreU(x, df, dst + i * kLanes);
          }
        };
      };
      auto ds_epi = [&](int64_t b) HWY_ATTR {
        return [&, b](int r, int pn, const VF* v) HWY_ATTR {
          const VF vdelta = hn::Set(df, st.delta[g + r]);
          const float* pr = p_rows + r * kAttnBwdSld + (b + pn) * kNr;
          float* dst = ds_rows + r * kAttnBwdSld + (b + pn) * kNr;
          for (int i = 0; i < kPv; ++i) {
            const VF pv = hn::LoadU(df, pr + i * kLanes);
            hn::StoreU(hn::Mul(hn::Mul(pv, hn::Sub(v[i], vdelta)), vscale), df, dst + i * kLanes);
          }
        };
      };
      int64_t b = st.c0 / kNr;
      for (; b + kScoreNp <= n_panels; b += kScoreNp) {
        score_block<MR, kScoreNp>(qs, qt.ld, w.k_panel + b * ps, ps, d, p_epi(b));
        score_block<MR, kScoreNp>(ds_src, dot.ld, w.v_panel + b * ps, ps, d, ds_epi(b));
      }
      for (; b < n_panels; ++b) {
        score_block<MR, 1>(qs, qt.ld, w.k_panel + b * ps, ps, d, p_epi(b));
        score_block<MR, 1>(ds_src, dot.ld, w.v_panel + b * ps, ps, d, ds_epi(b));
      }
    });
  }
}

// Zeroes the P and dS rows of a stripe outside the panels it computes (read by the dV and dK
// products): columns [0, c0) and [n_panels kNr, bkp).
void zero_outside(float* p_rows, float* ds_rows, const BwdStripe& st, int64_t bkp) {
  const int64_t c1 = st.n_panels() * kAttnPanel, c0 = std::min(st.c0, c1);
  for (int r = 0; r < st.mr; ++r) {
    float* pr = p_rows + r * kAttnBwdSld;
    float* dr = ds_rows + r * kAttnBwdSld;
    std::fill(pr, pr + c0, 0.0f);
    std::fill(dr, dr + c0, 0.0f);
    std::fill(pr + c1, pr + bkp, 0.0f);
    std::fill(dr + c1, dr + bkp, 0.0f);
  }
}

// One query tile [i0, i0 + bq) of the backward against the packed key tile [j0, j0 + bk).
void bwd_query_tile(const AttnProblem& p, const BwdBuffers& w, const Mat& dout, const Mat& lse,
                    const Mat& delta, const Mat& dq, int h, int64_t j0, int64_t bk, int64_t i0,
                    int64_t bq) {
  const int d = p.d;
  const int64_t dp = attn_padded_dim(d), bkp = round_up(bk, kNr);
  int64_t lo[kAttnBwdBq], hi[kAttnBwdBq];
  key_ranges(p, i0, bq, lo, hi);
  const Tile qt = load_tile(p.q, i0, bq, h, d, w.q_stage);
  const Tile dot = load_tile(dout, i0, bq, h, d, w.do_stage);
  pack_tile_chunks(p.q, i0, bq, h, d, w.q_pack, w.qcs);
  pack_tile_chunks(dout, i0, bq, h, d, w.do_pack, w.qcs);
  float* dq_t = static_cast<float*>(dq.at(i0, int64_t(h) * d));
  for (int64_t r0 = 0; r0 < bq; r0 += kAttnStripe) {
    const BwdStripe st(lse, delta, h, i0, r0, int(std::min(kAttnStripe, bq - r0)), lo, hi, j0, bk);
    const int64_t n_panels = st.n_panels();
    zero_outside(w.p_tile + r0 * kAttnBwdSld, w.ds_tile + r0 * kAttnBwdSld, st, bkp);
    prefetch_stripe_rows(p, dout, dq, h, i0, bq, r0, st.mr);
    if (n_panels == 0) continue;
    bwd_scores(w, st, qt, dot, r0, n_panels, d, p.softmax_scale());
    // dQ += dS K over the keys [c0, smax), in increasing key order.
    for (int g = 0; g < st.mr; g += kAccMr)
      acc_rows<false>(std::min(kAccMr, st.mr - g), d, w.ds_tile + (r0 + g) * kAttnBwdSld,
                      kAttnBwdSld, w.k_pack, kNr, w.kcs, dq_t + (r0 + g) * dq.ld, dq.ld, kNr, st.c0,
                      st.smax);
  }
  // dV += P^T dO and dK += dS^T Q, kAccMr keys at a time, over the query rows that may see them
  // (in increasing row order; rows in that range that do not see a key add exact zeros).
  for (int64_t jb = 0; jb < bk; jb += kAccMr) {
    const int mr = int(std::min<int64_t>(kAccMr, bk - jb));
    const RowRange rows = tile_rows_seeing(lo, hi, bq, j0, jb, mr);
    if (rows.first >= bq) break;
    if (rows.first >= rows.end) continue;
    acc_rows<true>(mr, dp, w.p_tile + jb, kAttnBwdSld, w.do_pack, kNr, w.qcs, w.dv_acc + jb * kNr,
                   kNr, w.kcs, rows.first, rows.end);
    acc_rows<true>(mr, dp, w.ds_tile + jb, kAttnBwdSld, w.q_pack, kNr, w.qcs, w.dk_acc + jb * kNr,
                   kNr, w.kcs, rows.first, rows.end);
  }
}

}  // namespace

void attention_backward_t(const AttnProblem& p, const Mat& dout, const Mat& lse, const Mat& delta,
                          const Mat& dq, const Mat& dk, const Mat& dv, float* ws, int bf16_mode) {
#if HWY_TARGET == HWY_AVX3
  if (bf16_mode != int(AttnBf16::kNone))
    return attention_backward_bf16(p, dout, lse, delta, dq, dk, dv, ws,
                                   bf16_mode == int(AttnBf16::kAmx));
#endif
  (void)bf16_mode;
  const int64_t sq = p.sq(), sk = p.sk();
  const int d = p.d, group = p.hq / p.hk;
  const BwdBuffers w(ws, d, p.q.dtype);
  for (int h = 0; h < p.hq; ++h) {
    const int kvh = h / group;
    for (int64_t j0 = 0; j0 < sk; j0 += kAttnBwdBk) {
      const int64_t bk = std::min(kAttnBwdBk, sk - j0);
      // The query rows that may see the key tile.
      const RowRange rows = query_rows(p, j0, bk);
      if (rows.first >= rows.end) continue;
      pack_tile_t(p.k, j0, bk, kvh, d, w.k_panel);
      pack_tile_t(p.v, j0, bk, kvh, d, w.v_panel);
      pack_tile_chunks(p.k, j0, bk, kvh, d, w.k_pack, w.kcs);
      // dK and dV of the tile are accumulated in place of dk and dv, in chunks: the same FMA
      // chains, in a contiguous buffer.
      pack_tile_chunks(dk, j0, bk, kvh, d, w.dk_acc, w.kcs);
      pack_tile_chunks(dv, j0, bk, kvh, d, w.dv_acc, w.kcs);
      for (int64_t i0 = rows.first / kAttnBwdBq * kAttnBwdBq; i0 < rows.end; i0 += kAttnBwdBq)
        bwd_query_tile(p, w, dout, lse, delta, dq, h, j0, bk, i0, std::min(kAttnBwdBq, sq - i0));
      unpack_chunks(w.dk_acc, w.kcs, bk, d, static_cast<float*>(dk.at(j0, int64_t(kvh) * d)),
                    dk.ld);
      unpack_chunks(w.dv_acc, w.kcs, bk, d, static_cast<float*>(dv.at(j0, int64_t(kvh) * d)),
                    dv.ld);
    }
  }
}

#if HWY_TARGET == HWY_AVX3
UPIPE_BF16_DOT_BEGIN
namespace {

// The bf16-dot backward's buffers (attn_bwd_workspace_bytes with bf16_dot).
struct BwdBuffersBf16 {
  static constexpr int64_t kcs = kAttnBwdBk / 2 * kNr, qcs = kAttnBwdBq / 2 * kNr;  // in words
  static constexpr int64_t kcsf = kAttnBwdBk * kNr;  // dK, dV accumulators (floats)
  uint32_t* k_panel;                                 // (Bk, d) bf16 pair panels
  uint32_t* v_panel;                                 // (Bk, d) bf16 pair panels
  uint32_t* k_pack;                                  // (Bk, dp) bf16 pair chunks along the keys
  float* p_rows;                                     // (stripe, Bk + 16) the stripe's P
  float* ds_rows;                                    // (stripe, Bk + 16) the stripe's dS
  uint16_t* ds16;                                    // (stripe, Bk + 16) the stripe's dS in bf16
  uint32_t* p_pairs;                                 // (Bq / 2, Bk) P in bf16 pairs of query rows
  uint32_t* ds_pairs;                                // (Bq / 2, Bk) dS likewise
  uint32_t* q_pack;   // (Bq, dp) bf16 pair chunks along the query rows
  uint32_t* do_pack;  // (Bq, dp) likewise
  float* dk_acc;      // (Bk, dp) dk of the tile, in chunks
  float* dv_acc;      // (Bk, dp) dv of the tile, in chunks
  BwdBuffersBf16(float* ws, int64_t d) {
    const int64_t dp = attn_padded_dim(d);
    k_panel = reinterpret_cast<uint32_t*>(ws);
    v_panel = k_panel + kAttnBwdBk * d / 2;
    k_pack = v_panel + kAttnBwdBk * d / 2;
    p_rows = reinterpret_cast<float*>(k_pack + kAttnBwdBk * dp / 2);
    ds_rows = p_rows + kAttnStripe * kAttnBwdSld;
    ds16 = reinterpret_cast<uint16_t*>(ds_rows + kAttnStripe * kAttnBwdSld);
    p_pairs = reinterpret_cast<uint32_t*>(ds16 + kAttnStripe * kAttnBwdSld);
    ds_pairs = p_pairs + kAttnBwdBq / 2 * kAttnBwdBk;
    q_pack = ds_pairs + kAttnBwdBq / 2 * kAttnBwdBk;
    do_pack = q_pack + kAttnBwdBq * dp / 2;
    dk_acc = reinterpret_cast<float*>(do_pack + kAttnBwdBq * dp / 2);
    dv_acc = dk_acc + kAttnBwdBk * dp;
    const float* end = dv_acc + kAttnBwdBk * dp;
    check_layout(ws, end, end, attn_bwd_workspace_bytes(d, DType::kBF16, true), DType::kBF16);
  }
};

// P and dS of rows [r0, r0 + mr) (r0 even) against the key tile's pair panels [c0 / kNr,
// n_panels), as bwd_scores, kept for the stripe only: dS rounded to bf16 for dQ, and both zipped
// into bf16 pairs of query rows (row pairs r0 / 2 ..) for dV and dK as soon as a pair's second
// row is done (an odd last row is paired with zeros).
void bwd_scores_bf16(const BwdBuffersBf16& w, const BwdStripe& st, const uint16_t* q, int64_t ldq,
                     const uint16_t* dout, int64_t ldo, int64_t r0, int64_t n_panels, int d,
                     float scale) {
  const DF df;
  const VF vscale = hn::Set(df, scale);
  const int64_t ps = int64_t(kNr) * d / 2;
  static_assert(kScoreMrBf16 % 2 == 0 && kAttnStripe % 2 == 0);
  for (int g = 0; g < st.mr; g += kScoreMrBf16) {
    float* p_rows = w.p_rows + g * kAttnBwdSld;
    float* ds_rows = w.ds_rows + g * kAttnBwdSld;
    uint16_t* ds16_rows = w.ds16 + g * kAttnBwdSld;
    uint32_t* p_pairs = w.p_pairs + (r0 + g) / 2 * kAttnBwdBk;
    uint32_t* ds_pairs = w.ds_pairs + (r0 + g) / 2 * kAttnBwdBk;
    const uint16_t* qs = q + (r0 + g) * ldq;
    const uint16_t* dos = dout + (r0 + g) * ldo;
    with_rows<kScoreMrBf16>(std::min(kScoreMrBf16, st.mr - g), [&]<int MR>() UPIPE_BF16_ATTR {
      auto p_epi = [&](int64_t b) UPIPE_BF16_ATTR {
        return [&, b](int r, int pn, const VF* v) UPIPE_BF16_ATTR {
          const int64_t n = st.lim[g + r] - (b + pn) * kNr, n0 = st.start[g + r] - (b + pn) * kNr;
          VF x = exp_v(hn::MulSub(v[0], vscale, hn::Set(df, st.lse[g + r])));
          if (n < kNr || n0 > 0) x = hn::IfThenElseZero(lanes_in(n0, n), x);
          hn::StoreU(x, df, p_rows + r * kAttnBwdSld + (b + pn) * kNr);
        };
      };
      auto ds_epi = [&](int64_t b) UPIPE_BF16_ATTR {
        return [&, b](int r, int pn, const VF* v) UPIPE_BF16_ATTR {
          const int64_t c = (b + pn) * kNr, at = r * kAttnBwdSld + c;
          const VF pv = hn::LoadU(df, p_rows + at);
          const VF ds = hn::Mul(hn::Mul(pv, hn::Sub(v[0], hn::Set(df, st.delta[g + r]))), vscale);
          hn::StoreU(ds, df, ds_rows + at);
          _mm256_storeu_si256(reinterpret_cast<__m256i*>(ds16_rows + at), cvt_bf16(ds.raw));
          if (r % 2 == 1) {
            const int64_t prev = at - kAttnBwdSld, pair = r / 2 * kAttnBwdBk + c;
            _mm512_storeu_si512(p_pairs + pair, zip_bf16(hn::LoadU(df, p_rows + prev).raw, pv.raw));
            _mm512_storeu_si512(ds_pairs + pair,
                                zip_bf16(hn::LoadU(df, ds_rows + prev).raw, ds.raw));
          } else if (r == MR - 1) {
            const int64_t pair = r / 2 * kAttnBwdBk + c;
            _mm512_storeu_si512(p_pairs + pair, zip_bf16(pv.raw, _mm512_setzero_ps()));
            _mm512_storeu_si512(ds_pairs + pair, zip_bf16(ds.raw, _mm512_setzero_ps()));
          }
        };
      };
      int64_t b = st.c0 / kNr;
      for (; b + kScoreNpBf16 <= n_panels; b += kScoreNpBf16) {
        score_block_bf16<MR, kScoreNpBf16>(qs, ldq, w.k_panel + b * ps, ps, d, p_epi(b));
        score_block_bf16<MR, kScoreNpBf16>(dos, ldo, w.v_panel + b * ps, ps, d, ds_epi(b));
      }
      for (; b < n_panels; ++b) {
        score_block_bf16<MR, 1>(qs, ldq, w.k_panel + b * ps, ps, d, p_epi(b));
        score_block_bf16<MR, 1>(dos, ldo, w.v_panel + b * ps, ps, d, ds_epi(b));
      }
    });
  }
}

// Zeroes the bf16 row pairs of P and dS of a stripe (rows [r0, r0 + st.mr), r0 even) outside
// the panels it computes: columns [0, c0) and [n_panels kNr, bkp) (all of them when it computes
// none). They are read by the dV and dK products.
void zero_pairs_outside(const BwdBuffersBf16& w, const BwdStripe& st, int64_t r0, int64_t bkp) {
  const int64_t c1 = st.n_panels() * kAttnPanel, c0 = std::min(st.c0, c1);
  for (int64_t pr = r0 / 2; pr < (r0 + st.mr + 1) / 2; ++pr)
    for (uint32_t* x : {w.p_pairs + pr * kAttnBwdBk, w.ds_pairs + pr * kAttnBwdBk}) {
      std::fill(x, x + c0, 0u);
      std::fill(x + c1, x + bkp, 0u);
    }
}

// Rows [j0, j0 + bk) of head `head` of the fp32 matrix x (bk, d) to / from the transposed tile t
// (d, ld): t[e * ld + j] = x(j0 + j, e) (back: x = t).
void transpose_tile(const Mat& x, int64_t j0, int64_t bk, int head, int d, float* t, int64_t ld,
                    bool back) {
  for (int64_t j = 0; j < bk; ++j) {
    float* row = static_cast<float*>(x.at(j0 + j, int64_t(head) * d));
    for (int e = 0; e < d; ++e) {
      if (back)
        row[e] = t[e * ld + j];
      else
        t[e * ld + j] = row[e];
    }
  }
}

// bwd_scores_bf16 on AMX tiles for the whole stripe (st.mr rows): S and dP of up to 4 panels at
// a time, then the same epilogue, row by row.
void bwd_scores_amx(const BwdBuffersBf16& w, AmxTiles& tiles, const BwdStripe& st,
                    const uint16_t* q, int64_t ldq, const uint16_t* dout, int64_t ldo, int64_t r0,
                    int64_t n_panels, int d, float scale) {
  const DF df;
  const VF vscale = hn::Set(df, scale);
  const int64_t ps = int64_t(kNr) * d / 2, lo = 4 * kNr;
  const int mr = st.mr;
  const uint16_t* qs = q + r0 * ldq;
  const uint16_t* dos = dout + r0 * ldo;
  uint32_t* p_pairs = w.p_pairs + r0 / 2 * kAttnBwdBk;
  uint32_t* ds_pairs = w.ds_pairs + r0 / 2 * kAttnBwdBk;
  tiles.rows(mr);
  alignas(64) float s_out[kAttnStripe * 4 * kNr], dp_out[kAttnStripe * 4 * kNr];
  for (int64_t b = st.c0 / kNr; b < n_panels; b += 4) {
    const int np = int(std::min<int64_t>(4, n_panels - b));
    amx_score_panels(np, qs, ldq, w.k_panel + b * ps, ps, d, s_out, lo);
    amx_score_panels(np, dos, ldo, w.v_panel + b * ps, ps, d, dp_out, lo);
    for (int r = 0; r < mr; ++r)
      for (int pn = 0; pn < np; ++pn) {
        const int64_t c = (b + pn) * kNr, at = r * kAttnBwdSld + c;
        const int64_t n = st.lim[r] - c, n0 = st.start[r] - c;
        VF pv = exp_v(
            hn::MulSub(hn::Load(df, s_out + r * lo + pn * kNr), vscale, hn::Set(df, st.lse[r])));
        if (n < kNr || n0 > 0) pv = hn::IfThenElseZero(lanes_in(n0, n), pv);
        hn::StoreU(pv, df, w.p_rows + at);
        const VF dpv = hn::Load(df, dp_out + r * lo + pn * kNr);
        const VF ds = hn::Mul(hn::Mul(pv, hn::Sub(dpv, hn::Set(df, st.delta[r]))), vscale);
        hn::StoreU(ds, df, w.ds_rows + at);
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(w.ds16 + at), cvt_bf16(ds.raw));
        if (r % 2 == 1) {
          const int64_t prev = at - kAttnBwdSld, pair = r / 2 * kAttnBwdBk + c;
          _mm512_storeu_si512(p_pairs + pair, zip_bf16(hn::LoadU(df, w.p_rows + prev).raw, pv.raw));
          _mm512_storeu_si512(ds_pairs + pair,
                              zip_bf16(hn::LoadU(df, w.ds_rows + prev).raw, ds.raw));
        } else if (r == mr - 1) {
          const int64_t pair = r / 2 * kAttnBwdBk + c;
          _mm512_storeu_si512(p_pairs + pair, zip_bf16(pv.raw, _mm512_setzero_ps()));
          _mm512_storeu_si512(ds_pairs + pair, zip_bf16(ds.raw, _mm512_setzero_ps()));
        }
      }
  }
}

// bwd_query_tile_bf16 on AMX tiles (the amx path; d % 32 == 0): dQ += dS K as in the forward's
// O += P V; dV and dK transposed, dV^T += dO^T P and dK^T += Q^T dS, with dO and Q packed
// transposed in pairs of rows (q_pack, do_pack) and the accumulators dv_acc, dk_acc as
// (dp, Bk). Ranges are rounded out to whole tiles over exact zeros: the pair rows of P and dS
// past the tile's rows and their columns up to round_up(bk, 32) are zeroed.
void bwd_query_tile_amx(const AttnProblem& p, const BwdBuffersBf16& w, AmxTiles& tiles,
                        const Mat& dout, const Mat& lse, const Mat& delta, const Mat& dq, int h,
                        int64_t j0, int64_t bk, int64_t i0, int64_t bq) {
  const int d = p.d;
  const int64_t bk32 = round_up(bk, 32), pld = kAttnBwdBq / 2;
  int64_t lo[kAttnBwdBq], hi[kAttnBwdBq];
  key_ranges(p, i0, bq, lo, hi);
  const uint16_t* q = static_cast<const uint16_t*>(p.q.at(i0, int64_t(h) * d));
  const uint16_t* dot = static_cast<const uint16_t*>(dout.at(i0, int64_t(h) * d));
  pack_pair_rows_t(q, p.q.ld, bq, kAttnBwdBq, d, w.q_pack, pld);
  pack_pair_rows_t(dot, dout.ld, bq, kAttnBwdBq, d, w.do_pack, pld);
  for (int64_t pr = (bq + 1) / 2; pr < pld; ++pr)
    for (uint32_t* x : {w.p_pairs + pr * kAttnBwdBk, w.ds_pairs + pr * kAttnBwdBk})
      std::fill(x, x + bk32, 0u);
  float* dq_t = static_cast<float*>(dq.at(i0, int64_t(h) * d));
  for (int64_t r0 = 0; r0 < bq; r0 += kAttnStripe) {
    const BwdStripe st(lse, delta, h, i0, r0, int(std::min(kAttnStripe, bq - r0)), lo, hi, j0, bk);
    const int64_t n_panels = st.n_panels();
    zero_pairs_outside(w, st, r0, bk32);
    prefetch_stripe_rows(p, dout, dq, h, i0, bq, r0, st.mr);
    if (n_panels == 0) continue;
    bwd_scores_amx(w, tiles, st, q, p.q.ld, dot, dout.ld, r0, n_panels, d, p.softmax_scale());
    // dQ += dS K over whole tiles of key pairs: dS in bf16 zeroed outside the computed panels.
    const int64_t c0 = st.c0 / 32 * 32, c1 = n_panels * kNr, sp = round_up(c1, 32);
    for (int r = 0; r < st.mr; ++r) {
      uint16_t* row = w.ds16 + r * kAttnBwdSld;
      std::fill(row + c0, row + st.c0, uint16_t(0));
      std::fill(row + c1, row + sp, uint16_t(0));
    }
    tiles.rows(st.mr);
    amx_acc_rows(d, w.ds16, kAttnBwdSld, w.k_pack, w.kcs, dq_t + r0 * dq.ld, dq.ld, c0 / 2, sp / 2);
  }
  // dV^T += dO^T P and dK^T += Q^T dS, 32 keys and 32 columns at a time, over the pair tiles
  // from the one holding the first row that sees the keys.
  tiles.rows(16);
  for (int64_t jb = 0; jb < bk; jb += 32) {
    const RowRange rows = tile_rows_seeing(lo, hi, bq, j0, jb, std::min<int64_t>(32, bk - jb));
    if (rows.first >= bq) break;
    if (rows.first >= rows.end) continue;
    const int64_t k0 = rows.first / 32 * 16, k1 = round_up((rows.end + 1) / 2, 16);
    for (int64_t e0 = 0; e0 < d; e0 += 32) {
      float* dv_t = w.dv_acc + e0 * kAttnBwdBk + jb;
      float* dk_t = w.dk_acc + e0 * kAttnBwdBk + jb;
      if (jb + 16 < bk) {
        amx_acc_t<2>(w.do_pack + e0 * pld, pld, w.p_pairs + jb, kAttnBwdBk, dv_t, kAttnBwdBk, k0,
                     k1);
        amx_acc_t<2>(w.q_pack + e0 * pld, pld, w.ds_pairs + jb, kAttnBwdBk, dk_t, kAttnBwdBk, k0,
                     k1);
      } else {
        amx_acc_t<1>(w.do_pack + e0 * pld, pld, w.p_pairs + jb, kAttnBwdBk, dv_t, kAttnBwdBk, k0,
                     k1);
        amx_acc_t<1>(w.q_pack + e0 * pld, pld, w.ds_pairs + jb, kAttnBwdBk, dk_t, kAttnBwdBk, k0,
                     k1);
      }
    }
  }
}

// bwd_query_tile with bf16 inputs on the dot-product instruction.
void bwd_query_tile_bf16(const AttnProblem& p, const BwdBuffersBf16& w, const Mat& dout,
                         const Mat& lse, const Mat& delta, const Mat& dq, int h, int64_t j0,
                         int64_t bk, int64_t i0, int64_t bq) {
  const int d = p.d;
  const int64_t dp = attn_padded_dim(d), bkp = round_up(bk, kNr);
  int64_t lo[kAttnBwdBq], hi[kAttnBwdBq];
  key_ranges(p, i0, bq, lo, hi);
  const uint16_t* q = static_cast<const uint16_t*>(p.q.at(i0, int64_t(h) * d));
  const uint16_t* dot = static_cast<const uint16_t*>(dout.at(i0, int64_t(h) * d));
  pack_pair_chunks(q, p.q.ld, bq, d, w.q_pack, w.qcs);
  pack_pair_chunks(dot, dout.ld, bq, d, w.do_pack, w.qcs);
  float* dq_t = static_cast<float*>(dq.at(i0, int64_t(h) * d));
  for (int64_t r0 = 0; r0 < bq; r0 += kAttnStripe) {
    const BwdStripe st(lse, delta, h, i0, r0, int(std::min(kAttnStripe, bq - r0)), lo, hi, j0, bk);
    const int64_t n_panels = st.n_panels();
    zero_pairs_outside(w, st, r0, bkp);
    prefetch_stripe_rows(p, dout, dq, h, i0, bq, r0, st.mr);
    if (n_panels == 0) continue;
    bwd_scores_bf16(w, st, q, p.q.ld, dot, dout.ld, r0, n_panels, d, p.softmax_scale());
    // dQ += dS K over the key pairs [c0 / 2, ceil(smax / 2)), in increasing order.
    for (int g = 0; g < st.mr; g += kAccMr) {
      const PairA a{reinterpret_cast<const uint32_t*>(w.ds16 + g * kAttnBwdSld), kAttnBwdSld / 2,
                    1};
      acc_rows_bf16(std::min(kAccMr, st.mr - g), d, a, w.k_pack, w.kcs, dq_t + (r0 + g) * dq.ld,
                    dq.ld, kNr, st.c0 / 2, (st.smax + 1) / 2);
    }
  }
  // dV += P^T dO and dK += dS^T Q on the bf16 row pairs, kAccMr keys at a time, over the row
  // pairs from the one holding the first row that sees them.
  for (int64_t jb = 0; jb < bk; jb += kAccMr) {
    const int mr = int(std::min<int64_t>(kAccMr, bk - jb));
    const RowRange rows = tile_rows_seeing(lo, hi, bq, j0, jb, mr);
    if (rows.first >= bq) break;
    if (rows.first >= rows.end) continue;
    const PairA pa{w.p_pairs + jb, 1, kAttnBwdBk}, da{w.ds_pairs + jb, 1, kAttnBwdBk};
    acc_rows_bf16(mr, dp, pa, w.do_pack, w.qcs, w.dv_acc + jb * kNr, kNr, w.kcsf, rows.first / 2,
                  (rows.end + 1) / 2);
    acc_rows_bf16(mr, dp, da, w.q_pack, w.qcs, w.dk_acc + jb * kNr, kNr, w.kcsf, rows.first / 2,
                  (rows.end + 1) / 2);
  }
}

}  // namespace

void attention_backward_bf16(const AttnProblem& p, const Mat& dout, const Mat& lse,
                             const Mat& delta, const Mat& dq, const Mat& dk, const Mat& dv,
                             float* ws, bool amx) {
  const int64_t sq = p.sq(), sk = p.sk();
  const int d = p.d, group = p.hq / p.hk;
  const BwdBuffersBf16 w(ws, d);
  AmxTiles tiles(amx && d % 32 == 0);
  for (int h = 0; h < p.hq; ++h) {
    const int kvh = h / group;
    for (int64_t j0 = 0; j0 < sk; j0 += kAttnBwdBk) {
      const int64_t bk = std::min(kAttnBwdBk, sk - j0);
      const RowRange rows = query_rows(p, j0, bk);
      if (rows.first >= rows.end) continue;
      const uint16_t* k = static_cast<const uint16_t*>(p.k.at(j0, int64_t(kvh) * d));
      const uint16_t* v = static_cast<const uint16_t*>(p.v.at(j0, int64_t(kvh) * d));
      pack_pair_panels(k, p.k.ld, bk, d, w.k_panel);
      pack_pair_panels(v, p.v.ld, bk, d, w.v_panel);
      pack_pair_chunks(k, p.k.ld, bk, d, w.k_pack, w.kcs);
      if (tiles.on()) {
        zero_pair_tail(w.k_pack, w.kcs, d, bk);
        transpose_tile(dk, j0, bk, kvh, d, w.dk_acc, kAttnBwdBk, false);
        transpose_tile(dv, j0, bk, kvh, d, w.dv_acc, kAttnBwdBk, false);
        for (int64_t i0 = rows.first / kAttnBwdBq * kAttnBwdBq; i0 < rows.end; i0 += kAttnBwdBq)
          bwd_query_tile_amx(p, w, tiles, dout, lse, delta, dq, h, j0, bk, i0,
                             std::min(kAttnBwdBq, sq - i0));
        transpose_tile(dk, j0, bk, kvh, d, w.dk_acc, kAttnBwdBk, true);
        transpose_tile(dv, j0, bk, kvh, d, w.dv_acc, kAttnBwdBk, true);
        continue;
      }
      pack_tile_chunks(dk, j0, bk, kvh, d, w.dk_acc, w.kcsf);
      pack_tile_chunks(dv, j0, bk, kvh, d, w.dv_acc, w.kcsf);
      for (int64_t i0 = rows.first / kAttnBwdBq * kAttnBwdBq; i0 < rows.end; i0 += kAttnBwdBq)
        bwd_query_tile_bf16(p, w, dout, lse, delta, dq, h, j0, bk, i0,
                            std::min(kAttnBwdBq, sq - i0));
      unpack_chunks(w.dk_acc, w.kcsf, bk, d, static_cast<float*>(dk.at(j0, int64_t(kvh) * d)),
                    dk.ld);
      unpack_chunks(w.dv_acc, w.kcsf, bk, d, static_cast<float*>(dv.at(j0, int64_t(kvh) * d)),
                    dv.ld);
    }
  }
}
UPIPE_BF16_DOT_END
#endif  // HWY_TARGET == HWY_AVX3

// delta(h, i) = sum_e o(i, e) do(i, e) on kLanes lanes, reduced in the target's fixed order.
void attention_delta_t(const Mat& o, const Mat& dout, int d, const Mat& delta) {
  const DF df;
  const int hq = int(o.cols / d);
  float orow[1024], drow[1024];
  UPIPE_CHECK(d <= 1024, "head_dim {} above 1024 is not supported", d);
  for (int64_t i = 0; i < o.rows; ++i)
    for (int h = 0; h < hq; ++h) {
      widen_row(o.at(i, int64_t(h) * d), is_bf16(o), orow, d);
      widen_row(dout.at(i, int64_t(h) * d), is_bf16(dout), drow, d);
      VF s = hn::Zero(df);
      for_chunks(d,
                 [&](const Chunk& k) HWY_ATTR { s = hn::MulAdd(k.load(orow), k.load(drow), s); });
      *lse_at(delta, h, i) = sum_lanes(s);
    }
}

void attention_finalize_t(const Mat& acc, const Mat& m, const Mat& l, int d, const Mat& o,
                          const Mat& lse) {
  const DF df;
  const int hq = int(acc.cols / d);
  float row[1024];
  UPIPE_CHECK(d <= 1024, "head_dim {} above 1024 is not supported", d);
  for (int64_t i = 0; i < acc.rows; ++i)
    for (int h = 0; h < hq; ++h) {
      const float li = *lse_at(l, h, i);
      const VF inv = hn::Set(df, li > 0.0f ? 1.0f / li : 0.0f);
      const float* a = static_cast<const float*>(acc.at(i, int64_t(h) * d));
      for_chunks(d, [&](const Chunk& k) HWY_ATTR { k.store(row, hn::Mul(k.load(a), inv)); });
      narrow_row(row, o.at(i, int64_t(h) * d), is_bf16(o), d);
      *lse_at(lse, h, i) = li > 0.0f ? *lse_at(m, h, i) + std::log(li) : kNegInf;
    }
}

void lse_merge_t(const Mat& o, const Mat& lse, const Mat& o2, const Mat& lse2, int d) {
  const DF df;
  const int hq = int(o.cols / d);
  float a[1024], b[1024];
  UPIPE_CHECK(d <= 1024, "head_dim {} above 1024 is not supported", d);
  for (int64_t i = 0; i < o.rows; ++i)
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
      const VF inv = hn::Set(df, 1.0f / (w1 + w2)), vw1 = hn::Set(df, w1), vw2 = hn::Set(df, w2);
      widen_row(o.at(i, int64_t(h) * d), is_bf16(o), a, d);
      widen_row(o2.at(i, int64_t(h) * d), is_bf16(o2), b, d);
      for_chunks(d, [&](const Chunk& k) HWY_ATTR {
        k.store(a, hn::Mul(hn::Add(hn::Mul(k.load(a), vw1), hn::Mul(k.load(b), vw2)), inv));
      });
      narrow_row(a, o.at(i, int64_t(h) * d), is_bf16(o), d);
      *l1 = mx + std::log(w1 + w2);
    }
}

}  // namespace HWY_NAMESPACE
}  // namespace upipe::cpu
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace upipe::cpu {

AttnBf16 attn_bf16_mode(DType t) {
  const CpuIsa isa = cpu_isa();  // first: it also makes the dispatch below use the chosen path
  if (t != DType::kBF16 || isa < CpuIsa::kAvx512Bf16) return AttnBf16::kNone;
  return isa == CpuIsa::kAmx ? AttnBf16::kAmx : AttnBf16::kDot;
}

bool attn_bf16_dot(DType t) {
  return attn_bf16_mode(t) != AttnBf16::kNone;
}

HWY_EXPORT(attention_forward_t);
HWY_EXPORT(attention_backward_t);
HWY_EXPORT(attention_delta_t);
HWY_EXPORT(attention_finalize_t);
HWY_EXPORT(lse_merge_t);

void attention_forward(const AttnProblem& p, const Mat* o, const Mat* lse, const Mat* acc,
                       const Mat* m, const Mat* l, float* ws) {
  const int mode = int(attn_bf16_mode(p.q.dtype));
  HWY_DYNAMIC_DISPATCH(attention_forward_t)(p, o, lse, acc, m, l, ws, mode);
}

void attention_backward(const AttnProblem& p, const Mat& dout, const Mat& lse, const Mat& delta,
                        const Mat& dq, const Mat& dk, const Mat& dv, float* ws) {
  const int mode = int(attn_bf16_mode(p.q.dtype));
  HWY_DYNAMIC_DISPATCH(attention_backward_t)(p, dout, lse, delta, dq, dk, dv, ws, mode);
}

void attention_delta(const Mat& o, const Mat& dout, int d, const Mat& delta) {
  cpu_isa();
  HWY_DYNAMIC_DISPATCH(attention_delta_t)(o, dout, d, delta);
}

void attention_finalize(const Mat& acc, const Mat& m, const Mat& l, int d, const Mat& o,
                        const Mat& lse) {
  cpu_isa();
  HWY_DYNAMIC_DISPATCH(attention_finalize_t)(acc, m, l, d, o, lse);
}

void lse_merge(const Mat& o, const Mat& lse, const Mat& o2, const Mat& lse2, int d) {
  cpu_isa();
  HWY_DYNAMIC_DISPATCH(lse_merge_t)(o, lse, o2, lse2, d);
}

}  // namespace upipe::cpu
#endif  // HWY_ONCE
