// Small math for the CPU kernels: a scalar exp written so g++ -O3 vectorises the loops that call
// it (no libm calls, no branches on data), and its AVX2 twin on eight lanes, plus horizontal
// reductions in a fixed lane order (so a row's sum never depends on what else is computed).
#pragma once

#include <immintrin.h>

#include <cstdint>
#include <cstring>

namespace upipe::cpu {

// exp(x) for x <= 0 up to ~88 in magnitude (Cephes polynomial, ~1 ulp); inputs below -87.3
// are clamped, so exp(-inf) here is ~1e-38, never used: callers zero masked entries.
inline float exp_fast(float x) {
  x = x < -87.3f ? -87.3f : (x > 88.3f ? 88.3f : x);
  const float fx = __builtin_floorf(x * 1.44269504088896341f + 0.5f);
  float r = x - fx * 0.693359375f;
  r = r - fx * -2.12194440e-4f;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * r * r + r + 1.0f;
  const int32_t e = (static_cast<int32_t>(fx) + 127) << 23;
  float s;
  std::memcpy(&s, &e, 4);
  return p * s;
}

// exp(x) on eight lanes, cheaper than exp_fast: t = x log2(e) split into n + r with |r| <= 1/2,
// 2^r by a degree-6 minimax polynomial (<= 1.3 ulp on its range), 2^n added to the exponent
// bits. The rounding of t adds a relative error of about eps |x|, the same size as that of
// forming x itself. Inputs are clamped to t in [-126, 126]: exp(-inf) is ~1e-38, never used.
inline __m256 exp8(__m256 x) {
  __m256 t = _mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f));
  t = _mm256_min_ps(_mm256_max_ps(t, _mm256_set1_ps(-126.0f)), _mm256_set1_ps(126.0f));
  const __m256 n = _mm256_round_ps(t, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  const __m256 r = _mm256_sub_ps(t, n);
  __m256 p = _mm256_set1_ps(1.535336341e-4f);
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.339887618e-3f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(9.618436917e-3f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(5.550332367e-2f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(2.402264774e-1f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(6.931471825e-1f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f));
  const __m256i e = _mm256_slli_epi32(_mm256_cvtps_epi32(n), 23);
  return _mm256_castsi256_ps(_mm256_add_epi32(_mm256_castps_si256(p), e));
}

// Lane sum ((l0+l4) + (l2+l6)) + ((l1+l5) + (l3+l7)): a fixed tree.
inline float hsum8(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

inline float hmax8(__m256 v) {
  __m128 s = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_max_ps(s, _mm_movehl_ps(s, s));
  s = _mm_max_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

inline double hsum4d(__m256d v) {
  const __m128d s = _mm_add_pd(_mm256_castpd256_pd128(v), _mm256_extractf128_pd(v, 1));
  return _mm_cvtsd_f64(_mm_add_sd(s, _mm_unpackhi_pd(s, s)));
}

inline __m256 neg8(__m256 x) {
  return _mm256_xor_ps(x, _mm256_set1_ps(-0.0f));
}

// Lanes [0, n) all ones, the rest zero (n <= 0: none; n >= 8: all).
inline __m256 lane_mask(int64_t n) {
  const __m256i iota = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
  n = n < 0 ? 0 : (n > 8 ? 8 : n);
  return _mm256_castsi256_ps(_mm256_cmpgt_epi32(_mm256_set1_epi32(int32_t(n)), iota));
}

// Eight consecutive floats at offset c of a row, or the fewer that remain at its end (masked
// loads read zeros there and masked stores leave the memory alone).
struct Chunk8 {
  int64_t c;
  bool full;
  __m256i mask;
  __m256 load(const float* row) const {
    return full ? _mm256_loadu_ps(row + c) : _mm256_maskload_ps(row + c, mask);
  }
  void store(float* row, __m256 x) const {
    if (full)
      _mm256_storeu_ps(row + c, x);
    else
      _mm256_maskstore_ps(row + c, mask, x);
  }
  // x in the chunk's lanes, `fill` in the lanes past the row's end.
  __m256 select(__m256 x, __m256 fill) const {
    return full ? x : _mm256_blendv_ps(fill, x, _mm256_castsi256_ps(mask));
  }
};

// Calls f(Chunk8) over [0, n) in order: full chunks (where `full` is a constant once inlined,
// so the loop has no masks), then the masked tail.
template <class F>
inline void for_chunks8(int64_t n, F&& f) {
  int64_t c = 0;
  for (; c + 8 <= n; c += 8) f(Chunk8{c, true, _mm256_setzero_si256()});
  if (c < n) f(Chunk8{c, false, _mm256_castps_si256(lane_mask(n - c))});
}

}  // namespace upipe::cpu
