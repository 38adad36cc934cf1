// AVX2/FMA building blocks of the CPU flash-attention kernels: key/value panels packed
// transposed, and two register-blocked fp32 micro-kernels of kMr rows x kNr columns.
//
// Every output element is reduced by one sequential FMA chain in a fixed order (over the head
// dimension for scores, over increasing key or query index for the accumulating products), so
// the value of an element never depends on which other rows, columns or heads share its block.
// The scalar column tails use std::fma, which rounds exactly like a vector lane.
#pragma once

#include <immintrin.h>

#include <cmath>
#include <cstdint>

#include "core/dtype.h"

namespace upipe::cpu {

constexpr int kMr = 6;   // rows per register block
constexpr int kNr = 16;  // columns per register block (two ymm)

inline int64_t round_up(int64_t x, int64_t m) {
  return (x + m - 1) / m * m;
}

// Eight consecutive values of type T as fp32.
template <DType T>
inline __m256 load8(const void* p) {
  if constexpr (T == DType::kF32) {
    return _mm256_loadu_ps(static_cast<const float*>(p));
  } else {
    const __m128i h = _mm_loadu_si128(static_cast<const __m128i*>(p));
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
  }
}

template <DType T>
inline float load1(const void* p, int64_t i) {
  if constexpr (T == DType::kF32) {
    return static_cast<const float*>(p)[i];
  } else {
    return bf16_to_f32(static_cast<const uint16_t*>(p)[i]);
  }
}

// In-register transpose of an 8x8 block: r[i] lane k becomes r[k] lane i.
inline void transpose8(__m256 r[8]) {
  const __m256 t0 = _mm256_unpacklo_ps(r[0], r[1]), t1 = _mm256_unpackhi_ps(r[0], r[1]);
  const __m256 t2 = _mm256_unpacklo_ps(r[2], r[3]), t3 = _mm256_unpackhi_ps(r[2], r[3]);
  const __m256 t4 = _mm256_unpacklo_ps(r[4], r[5]), t5 = _mm256_unpackhi_ps(r[4], r[5]);
  const __m256 t6 = _mm256_unpacklo_ps(r[6], r[7]), t7 = _mm256_unpackhi_ps(r[6], r[7]);
  const __m256 s0 = _mm256_shuffle_ps(t0, t2, 0x44), s1 = _mm256_shuffle_ps(t0, t2, 0xee);
  const __m256 s2 = _mm256_shuffle_ps(t1, t3, 0x44), s3 = _mm256_shuffle_ps(t1, t3, 0xee);
  const __m256 s4 = _mm256_shuffle_ps(t4, t6, 0x44), s5 = _mm256_shuffle_ps(t4, t6, 0xee);
  const __m256 s6 = _mm256_shuffle_ps(t5, t7, 0x44), s7 = _mm256_shuffle_ps(t5, t7, 0xee);
  r[0] = _mm256_permute2f128_ps(s0, s4, 0x20);
  r[1] = _mm256_permute2f128_ps(s1, s5, 0x20);
  r[2] = _mm256_permute2f128_ps(s2, s6, 0x20);
  r[3] = _mm256_permute2f128_ps(s3, s7, 0x20);
  r[4] = _mm256_permute2f128_ps(s0, s4, 0x31);
  r[5] = _mm256_permute2f128_ps(s1, s5, 0x31);
  r[6] = _mm256_permute2f128_ps(s2, s6, 0x31);
  r[7] = _mm256_permute2f128_ps(s3, s7, 0x31);
}

// Packs rows [0, n) of an (n, d) matrix of type T (row j at src + j * ld elements) transposed
// into panels of kNr rows: dst[(j / kNr) * d * kNr + e * kNr + j % kNr] = x(j, e); the rows
// n .. round_up(n, kNr) of the last panel are zero. Size: round_up(n, kNr) * d floats.
template <DType T>
void pack_panels(const void* src, int64_t ld, int64_t n, int d, float* dst) {
  const int64_t esize = dtype_size(T);
  auto row = [&](int64_t j) { return static_cast<const char*>(src) + j * ld * esize; };
  for (int64_t j0 = 0; j0 < n; j0 += kNr) {
    float* panel = dst + j0 * d;
    for (int64_t half = 0; half < kNr; half += 8) {
      const int64_t jr = j0 + half;
      int e = 0;
      if (jr + 8 <= n) {
        for (; e + 8 <= d; e += 8) {
          __m256 r[8];
          for (int i = 0; i < 8; ++i) r[i] = load8<T>(row(jr + i) + e * esize);
          transpose8(r);
          for (int i = 0; i < 8; ++i) _mm256_storeu_ps(panel + (e + i) * kNr + half, r[i]);
        }
      }
      for (; e < d; ++e) {
        for (int64_t i = 0; i < 8; ++i) {
          panel[e * kNr + half + i] = jr + i < n ? load1<T>(row(jr + i), e) : 0.0f;
        }
      }
    }
  }
}

// Packs rows [0, n) of an (n, d) matrix of type T (row j at src + j * ld elements) into column
// chunks of kNr: dst[(e / kNr) * cs + j * kNr + e % kNr] = x(j, e), columns d .. round_up(d, kNr)
// of the last chunk zero. Each chunk is then one sequential stream for acc_block.
template <DType T>
void pack_chunks(const void* src, int64_t ld, int64_t n, int d, float* dst, int64_t cs) {
  const int64_t esize = dtype_size(T);
  for (int64_t j = 0; j < n; ++j) {
    const char* row = static_cast<const char*>(src) + j * ld * esize;
    int e = 0;
    for (; e + kNr <= d; e += kNr) {
      float* out = dst + (e / kNr) * cs + j * kNr;
      _mm256_storeu_ps(out, load8<T>(row + e * esize));
      _mm256_storeu_ps(out + 8, load8<T>(row + (e + 8) * esize));
    }
    if (e < d) {
      float* out = dst + (e / kNr) * cs + j * kNr;
      for (int c = 0; c < kNr; ++c) out[c] = e + c < d ? load1<T>(row, e + c) : 0.0f;
    }
  }
}

// Inverse of pack_chunks for fp32: rows [0, n) of the chunks back to a row-major (n, d) matrix.
inline void unpack_chunks(const float* src, int64_t cs, int64_t n, int d, float* dst, int64_t ld) {
  for (int64_t j = 0; j < n; ++j) {
    int e = 0;
    for (; e + kNr <= d; e += kNr) {
      const float* in = src + (e / kNr) * cs + j * kNr;
      _mm256_storeu_ps(dst + j * ld + e, _mm256_loadu_ps(in));
      _mm256_storeu_ps(dst + j * ld + e + 8, _mm256_loadu_ps(in + 8));
    }
    for (; e < d; ++e) dst[j * ld + e] = src[(e / kNr) * cs + j * kNr + e % kNr];
  }
}

// Calls f.template operator()<MR>() for the runtime row count mr in [1, kMr].
template <class F>
inline void with_rows(int mr, F&& f) {
  switch (mr) {
    case 6:
      f.template operator()<6>();
      break;
    case 5:
      f.template operator()<5>();
      break;
    case 4:
      f.template operator()<4>();
      break;
    case 3:
      f.template operator()<3>();
      break;
    case 2:
      f.template operator()<2>();
      break;
    default:
      f.template operator()<1>();
      break;
  }
}

// Score-like block: acc (MR, kNr) = A (MR, d) * panel (d, kNr), A row r at a + r * lda, panel as
// packed by pack_panels. Each acc(r, c) is the FMA chain over e = 0 .. d-1. epi(r, lo, hi)
// receives the two vectors of row r (columns 0-7 and 8-15).
template <int MR, class Epi>
inline void score_block(const float* a, int64_t lda, const float* panel, int d, Epi&& epi) {
  __m256 c0[MR], c1[MR];
#pragma GCC unroll 6
  for (int r = 0; r < MR; ++r) c0[r] = c1[r] = _mm256_setzero_ps();
#pragma GCC unroll 2
  for (int e = 0; e < d; ++e) {
    const __m256 b0 = _mm256_loadu_ps(panel + e * kNr), b1 = _mm256_loadu_ps(panel + e * kNr + 8);
#pragma GCC unroll 6
    for (int r = 0; r < MR; ++r) {
      const __m256 av = _mm256_broadcast_ss(a + r * lda + e);
      c0[r] = _mm256_fmadd_ps(av, b0, c0[r]);
      c1[r] = _mm256_fmadd_ps(av, b1, c1[r]);
    }
  }
#pragma GCC unroll 6
  for (int r = 0; r < MR; ++r) epi(r, c0[r], c1[r]);
}

// Accumulating block: C (MR, 8 NV) += sum over k = k0 .. k1-1, in that order, of
// A(r, k) * B(k, :). A(r, k) is a[r * lda + k], or a[k * lda + r] with kTransA; row k of B at
// b + k * ldb; row r of C at c + r * ldc.
template <int MR, int NV, bool kTransA>
inline void acc_block(const float* a, int64_t lda, const float* b, int64_t ldb, float* c,
                      int64_t ldc, int64_t k0, int64_t k1) {
  __m256 acc[MR][NV];
#pragma GCC unroll 6
  for (int r = 0; r < MR; ++r) {
#pragma GCC unroll 2
    for (int v = 0; v < NV; ++v) acc[r][v] = _mm256_loadu_ps(c + r * ldc + 8 * v);
  }
#pragma GCC unroll 2
  for (int64_t k = k0; k < k1; ++k) {
    __m256 bv[NV];
#pragma GCC unroll 2
    for (int v = 0; v < NV; ++v) bv[v] = _mm256_loadu_ps(b + k * ldb + 8 * v);
#pragma GCC unroll 6
    for (int r = 0; r < MR; ++r) {
      const __m256 av = _mm256_broadcast_ss(kTransA ? a + k * lda + r : a + r * lda + k);
#pragma GCC unroll 2
      for (int v = 0; v < NV; ++v) acc[r][v] = _mm256_fmadd_ps(av, bv[v], acc[r][v]);
    }
  }
#pragma GCC unroll 6
  for (int r = 0; r < MR; ++r) {
#pragma GCC unroll 2
    for (int v = 0; v < NV; ++v) _mm256_storeu_ps(c + r * ldc + 8 * v, acc[r][v]);
  }
}

// C (mr, n) += A (mr, [k0, k1)) * B ([k0, k1), n) for any n: kNr-column register blocks, then an
// 8-column block, then scalar columns. B and C are stored in column chunks of kNr: B(k, col) at
// b[(col / kNr) * bcs + k * ldb + col % kNr], C(r, col) likewise with ccs and ldc. A row-major
// matrix has chunk stride kNr; one packed by pack_chunks has ld kNr and its own chunk stride.
template <bool kTransA>
inline void acc_rows(int mr, int64_t n, const float* a, int64_t lda, const float* b, int64_t ldb,
                     int64_t bcs, float* c, int64_t ldc, int64_t ccs, int64_t k0, int64_t k1) {
  int64_t col = 0;
  for (; col + kNr <= n; col += kNr) {
    const float* bc = b + (col / kNr) * bcs;
    float* cc = c + (col / kNr) * ccs;
    with_rows(mr, [&]<int MR>() { acc_block<MR, 2, kTransA>(a, lda, bc, ldb, cc, ldc, k0, k1); });
  }
  const float* bc = b + (col / kNr) * bcs;
  float* cc = c + (col / kNr) * ccs;
  if (col + 8 <= n) {
    with_rows(mr, [&]<int MR>() { acc_block<MR, 1, kTransA>(a, lda, bc, ldb, cc, ldc, k0, k1); });
    bc += 8;
    cc += 8;
    col += 8;
  }
  for (int64_t t = 0; col + t < n; ++t) {
    for (int r = 0; r < mr; ++r) {
      float s = cc[r * ldc + t];
      for (int64_t k = k0; k < k1; ++k) {
        s = std::fma(kTransA ? a[k * lda + r] : a[r * lda + k], bc[k * ldb + t], s);
      }
      cc[r * ldc + t] = s;
    }
  }
}

}  // namespace upipe::cpu
