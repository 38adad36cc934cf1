// Building blocks of the CPU flash-attention kernels, written once with Google Highway and
// compiled per target: key/value tiles packed into 16-wide panels and chunks (the same layout on
// every target: a panel row is two AVX2 vectors or one AVX-512 vector), and two register-blocked
// fp32 micro-kernels whose shape follows the target's register file (kScoreMr, kScoreNp,
// kAccNc below).
//
// Every output element is reduced by one sequential FMA chain in a fixed order (over the head
// dimension for scores, over increasing key or query index for the accumulating products), so
// the value of an element never depends on which other rows, columns or heads share its block.
// The scalar column tails use std::fma, which rounds exactly like a vector lane.
//
// Per-target header (see vec_math-inl.h).
#if defined(UPIPE_BACKEND_CPU_ATTN_MICRO_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef UPIPE_BACKEND_CPU_ATTN_MICRO_INL_H_
#undef UPIPE_BACKEND_CPU_ATTN_MICRO_INL_H_
#else
#define UPIPE_BACKEND_CPU_ATTN_MICRO_INL_H_
#endif

#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>
#include <utility>

#include "backend/cpu/attention_tiles.h"
#include "backend/cpu/vec_math-inl.h"
#include "core/dtype.h"

HWY_BEFORE_NAMESPACE();
namespace upipe::cpu {
namespace HWY_NAMESPACE {

constexpr int kNr = int(kAttnPanel);  // floats per panel row / chunk row
constexpr int kPv = kNr / kLanes;     // vectors per panel row: 2 (AVX2), 1 (AVX-512)
static_assert(kPv >= 1 && kNr % kLanes == 0);
// Register blocks: the score kernel kScoreMr rows x kScoreNp panels, the accumulating kernel
// kAccMr rows x kAccNc chunks: 12 accumulators of 16 ymm registers (AVX2), 24 of 32 zmm (AVX-512).
constexpr int kScoreMr = kPv == 2 ? 6 : 12;
constexpr int kScoreNp = kPv == 2 ? 1 : 2;
constexpr int kAccMr = 6;
constexpr int kAccNc = kPv == 2 ? 1 : 4;
static_assert(kAttnStripe % kScoreMr == 0 && kAttnStripe % kAccMr == 0);

inline int64_t round_up(int64_t x, int64_t m) {
  return (x + m - 1) / m * m;
}

// Eight consecutive values of a row of fp32 (bf16 = false) or bf16 as fp32.
template <bool kBf16>
HWY_INLINE __m256 load8(const void* p) {
  if constexpr (!kBf16) {
    return _mm256_loadu_ps(static_cast<const float*>(p));
  } else {
    const __m128i h = _mm_loadu_si128(static_cast<const __m128i*>(p));
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
  }
}
template <bool kBf16>
HWY_INLINE float load1(const void* p, int64_t i) {
  if constexpr (!kBf16)
    return static_cast<const float*>(p)[i];
  else
    return bf16_to_f32(static_cast<const uint16_t*>(p)[i]);
}

// In-register transpose of an 8x8 block: r[i] lane k becomes r[k] lane i.
HWY_INLINE void transpose8(__m256 r[8]) {
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

// Packs rows [0, n) of an (n, d) matrix (row j at src + j * ld elements) transposed into panels
// of kNr rows: dst[(j / kNr) * d * kNr + e * kNr + j % kNr] = x(j, e); the rows n ..
// round_up(n, kNr) of the last panel are zero. Size: round_up(n, kNr) * d floats. The 8x8
// transposes are 256-bit on every target (a panel row is 16 floats either way).
template <bool kBf16>
HWY_NOINLINE void pack_panels(const void* src, int64_t ld, int64_t n, int d, float* dst) {
  const int64_t esize = kBf16 ? 2 : 4;
  auto row = [&](int64_t j) HWY_ATTR { return static_cast<const char*>(src) + j * ld * esize; };
  for (int64_t j0 = 0; j0 < n; j0 += kNr) {
    float* panel = dst + j0 * d;
    for (int64_t half = 0; half < kNr; half += 8) {
      const int64_t jr = j0 + half;
      int e = 0;
      if (jr + 8 <= n) {
        for (; e + 8 <= d; e += 8) {
          __m256 r[8];
          for (int i = 0; i < 8; ++i) r[i] = load8<kBf16>(row(jr + i) + e * esize);
          transpose8(r);
          for (int i = 0; i < 8; ++i) _mm256_storeu_ps(panel + (e + i) * kNr + half, r[i]);
        }
      }
      for (; e < d; ++e)
        for (int64_t i = 0; i < 8; ++i)
          panel[e * kNr + half + i] = jr + i < n ? load1<kBf16>(row(jr + i), e) : 0.0f;
    }
  }
}

// Packs rows [0, n) of an (n, d) matrix (row j at src + j * ld elements) into column chunks of
// kNr: dst[(e / kNr) * cs + j * kNr + e % kNr] = x(j, e), columns d .. round_up(d, kNr) of the
// last chunk zero. Each chunk is then one sequential stream for acc_block.
template <bool kBf16>
HWY_NOINLINE void pack_chunks(const void* src, int64_t ld, int64_t n, int d, float* dst,
                              int64_t cs) {
  const int64_t esize = kBf16 ? 2 : 4;
  for (int64_t j = 0; j < n; ++j) {
    const char* row = static_cast<const char*>(src) + j * ld * esize;
    int e = 0;
    for (; e + kNr <= d; e += kNr) {
      float* out = dst + (e / kNr) * cs + j * kNr;
      _mm256_storeu_ps(out, load8<kBf16>(row + e * esize));
      _mm256_storeu_ps(out + 8, load8<kBf16>(row + (e + 8) * esize));
    }
    if (e < d) {
      float* out = dst + (e / kNr) * cs + j * kNr;
      for (int c = 0; c < kNr; ++c) out[c] = e + c < d ? load1<kBf16>(row, e + c) : 0.0f;
    }
  }
}

// Inverse of pack_chunks for fp32: rows [0, n) of the chunks back to a row-major (n, d) matrix.
HWY_INLINE void unpack_chunks(const float* src, int64_t cs, int64_t n, int d, float* dst,
                              int64_t ld) {
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

// Calls f.template operator()<MR>() for the runtime row count mr in [1, kMaxMr].
template <int kMaxMr, class F>
HWY_INLINE void with_rows(int mr, F&& f) {
  if constexpr (kMaxMr <= 1) {
    f.template operator()<1>();
  } else {
    if (mr >= kMaxMr)
      f.template operator()<kMaxMr>();
    else
      with_rows<kMaxMr - 1>(mr, f);
  }
}

// Score-like block: acc (MR, NP kNr) = A (MR, d) * NP panels (d, kNr), A row r at a + r * lda,
// panel p at panel + p * ps as packed by pack_panels. Each acc(r, c) is the FMA chain over
// e = 0 .. d-1. epi(r, p, v) receives row r's kPv vectors v[0..kPv) of panel p.
template <int MR, int NP, class Epi>
HWY_INLINE void score_block(const float* a, int64_t lda, const float* panel, int64_t ps, int d,
                            Epi&& epi) {
  const DF df;
  VF c[MR][NP * kPv];
#pragma GCC unroll 12
  for (int r = 0; r < MR; ++r)
#pragma GCC unroll 4
    for (int v = 0; v < NP * kPv; ++v) c[r][v] = hn::Zero(df);
#pragma GCC unroll 2
  for (int e = 0; e < d; ++e) {
    VF b[NP * kPv];
#pragma GCC unroll 4
    for (int v = 0; v < NP * kPv; ++v)
      b[v] = hn::LoadU(df, panel + (v / kPv) * ps + e * kNr + (v % kPv) * kLanes);
#pragma GCC unroll 12
    for (int r = 0; r < MR; ++r) {
      const VF av = hn::Set(df, a[r * lda + e]);
#pragma GCC unroll 4
      for (int v = 0; v < NP * kPv; ++v) c[r][v] = hn::MulAdd(av, b[v], c[r][v]);
    }
  }
#pragma GCC unroll 12
  for (int r = 0; r < MR; ++r)
#pragma GCC unroll 2
    for (int p = 0; p < NP; ++p) epi(r, p, &c[r][p * kPv]);
}

// Accumulating block: C (MR, NV vectors) += sum over k = k0 .. k1-1, in that order, of
// A(r, k) * B(k, :). A(r, k) is a[r * lda + k], or a[k * lda + r] with kTransA. B and C are in
// column chunks of kNr: vector v of B row k at b + (v / kPv) * bcs + k * ldb + (v % kPv) kLanes,
// of C row r likewise with ccs and ldc.
template <int MR, int NV, bool kTransA>
HWY_INLINE void acc_block(const float* a, int64_t lda, const float* b, int64_t ldb, int64_t bcs,
                          float* c, int64_t ldc, int64_t ccs, int64_t k0, int64_t k1) {
  const DF df;
  VF acc[MR][NV];
  auto at = [](int v, int64_t cs) HWY_ATTR { return (v / kPv) * cs + (v % kPv) * kLanes; };
#pragma GCC unroll 6
  for (int r = 0; r < MR; ++r)
#pragma GCC unroll 4
    for (int v = 0; v < NV; ++v) acc[r][v] = hn::LoadU(df, c + r * ldc + at(v, ccs));
#pragma GCC unroll 2
  for (int64_t k = k0; k < k1; ++k) {
    VF bv[NV];
#pragma GCC unroll 4
    for (int v = 0; v < NV; ++v) bv[v] = hn::LoadU(df, b + k * ldb + at(v, bcs));
#pragma GCC unroll 6
    for (int r = 0; r < MR; ++r) {
      const VF av = hn::Set(df, kTransA ? a[k * lda + r] : a[r * lda + k]);
#pragma GCC unroll 4
      for (int v = 0; v < NV; ++v) acc[r][v] = hn::MulAdd(av, bv[v], acc[r][v]);
    }
  }
#pragma GCC unroll 6
  for (int r = 0; r < MR; ++r)
#pragma GCC unroll 4
    for (int v = 0; v < NV; ++v) hn::StoreU(acc[r][v], df, c + r * ldc + at(v, ccs));
}

// C (mr, n) += A (mr, [k0, k1)) * B ([k0, k1), n) for any n and mr <= kAccMr: blocks of kAccNc
// chunks, then single vectors, then scalar columns. B and C are stored in column chunks of kNr:
// B(k, col) at b[(col / kNr) * bcs + k * ldb + col % kNr], C(r, col) likewise with ccs and ldc.
// A row-major matrix has chunk stride kNr; one packed by pack_chunks has ld kNr and its own
// chunk stride.
template <bool kTransA>
HWY_INLINE void acc_rows(int mr, int64_t n, const float* a, int64_t lda, const float* b,
                         int64_t ldb, int64_t bcs, float* c, int64_t ldc, int64_t ccs, int64_t k0,
                         int64_t k1) {
  int64_t col = 0;
  auto block = [&]<int NV>() HWY_ATTR {
    const float* bc = b + (col / kNr) * bcs + col % kNr;
    float* cc = c + (col / kNr) * ccs + col % kNr;
    with_rows<kAccMr>(mr, [&]<int MR>() HWY_ATTR {
      acc_block<MR, NV, kTransA>(a, lda, bc, ldb, bcs, cc, ldc, ccs, k0, k1);
    });
    col += NV * kLanes;
  };
  for (; col + kAccNc * kNr <= n;) block.template operator()<kAccNc * kPv>();
  for (; col + kNr <= n;) block.template operator()<kPv>();
  for (; col + kLanes <= n;) block.template operator()<1>();
  const float* bc = b + (col / kNr) * bcs + col % kNr;
  float* cc = c + (col / kNr) * ccs + col % kNr;
  for (int64_t t = 0; col + t < n; ++t)
    for (int r = 0; r < mr; ++r) {
      float s = cc[r * ldc + t];
      for (int64_t k = k0; k < k1; ++k)
        s = std::fma(kTransA ? a[k * lda + r] : a[r * lda + k], bc[k * ldb + t], s);
      cc[r * ldc + t] = s;
    }
}

#if HWY_TARGET == HWY_AVX3
// ---- bf16 operands on the AVX512-BF16 dot product (the avx512bf16 path) ----
//
// vdpbf16ps: acc.fp32[i] += a.bf16[2i] b.bf16[2i] + a.bf16[2i+1] b.bf16[2i+1], products exact,
// fp32 accumulation (subnormals flushed). Operands are pairs of bf16 along the contracted index,
// one pair per 32-bit word: panels hold [pair][16 columns] words, A is read one broadcast word at
// a time. This part of the AVX-512 target (and the bf16 kernels in attention_cpu.cpp) is compiled
// with AVX512-BF16 added (UPIPE_BF16_DOT_BEGIN), so the compiler schedules and allocates
// registers for the intrinsics itself; it runs only where cpu_isa() is avx512bf16 or amx. The
// region also enables the AMX tile instructions (amx-tile, amx-bf16) for the amx path's products
// (below); the compiler never emits those by itself, so the avx512bf16 code is the same with them.
// clang applies the outer (Highway's) target attribute rather than combining a nested one, so
// there the region replaces it, and restores it after.
#if HWY_COMPILER_CLANG
#define UPIPE_BF16_DOT_BEGIN \
  HWY_POP_ATTRIBUTES HWY_PUSH_ATTRIBUTES(HWY_TARGET_STR ",avx512bf16,amx-tile,amx-bf16")
#define UPIPE_BF16_DOT_END HWY_POP_ATTRIBUTES HWY_PUSH_ATTRIBUTES(HWY_TARGET_STR)
// Lambdas take no pragma attribute on clang: those in a region name the target themselves.
#define UPIPE_BF16_ATTR __attribute__((target(HWY_TARGET_STR ",avx512bf16,amx-tile,amx-bf16")))
#else
#define UPIPE_BF16_ATTR HWY_ATTR
#define UPIPE_BF16_DOT_BEGIN HWY_PUSH_ATTRIBUTES(HWY_TARGET_STR ",avx512bf16,amx-tile,amx-bf16")
#define UPIPE_BF16_DOT_END HWY_POP_ATTRIBUTES
#endif
UPIPE_BF16_DOT_BEGIN
constexpr bool kHaveBf16Dot = true;
constexpr int kScoreMrBf16 = 6, kScoreNpBf16 = 4;

// acc += pairs(b) . broadcast(word at p).
HWY_INLINE __m512 dot2_bcast(__m512 acc, __m512i b, const void* p) {
  uint32_t word;
  std::memcpy(&word, p, 4);
  return _mm512_dpbf16_ps(acc, __m512bh(b), __m512bh(_mm512_set1_epi32(int(word))));
}

// Packs rows [0, n) of an (n, d) bf16 matrix (row j at src + j * ld elements) as pair panels:
// dst[(j / kNr) * (d / 2) * kNr + e2 * kNr + j % kNr] = word (x(j, 2 e2), x(j, 2 e2 + 1)); rows
// past n zero. The 32-bit transposes of pack_panels on the rows' words (d is even).
HWY_NOINLINE void pack_pair_panels(const uint16_t* src, int64_t ld, int64_t n, int d,
                                   uint32_t* dst) {
  const int w = d / 2;
  for (int64_t j0 = 0; j0 < n; j0 += kNr) {
    uint32_t* panel = dst + j0 * w;
    for (int64_t half = 0; half < kNr; half += 8) {
      const int64_t jr = j0 + half;
      int e = 0;
      if (jr + 8 <= n) {
        for (; e + 8 <= w; e += 8) {
          __m256 r[8];
          for (int i = 0; i < 8; ++i)
            r[i] = _mm256_loadu_ps(reinterpret_cast<const float*>(src + (jr + i) * ld) + e);
          transpose8(r);
          for (int i = 0; i < 8; ++i)
            _mm256_storeu_ps(reinterpret_cast<float*>(panel + (e + i) * kNr + half), r[i]);
        }
      }
      for (; e < w; ++e)
        for (int64_t i = 0; i < 8; ++i) {
          uint32_t word = 0;
          if (jr + i < n) std::memcpy(&word, src + (jr + i) * ld + 2 * e, 4);
          panel[e * kNr + half + i] = word;
        }
    }
  }
}

// Packs rows [0, n) of an (n, d) bf16 matrix into pair chunks along the rows: dst[(c / kNr) * cs
// + (j / 2) * kNr + c % kNr] = word (x(j, c), x(j + 1, c)) for even j; columns past d and the row
// past n (odd n) zero. B operand of a product contracted over the rows.
HWY_NOINLINE void pack_pair_chunks(const uint16_t* src, int64_t ld, int64_t n, int d, uint32_t* dst,
                                   int64_t cs) {
  for (int64_t j = 0; j < n; j += 2) {
    const uint16_t* r0 = src + j * ld;
    const uint16_t* r1 = j + 1 < n ? r0 + ld : nullptr;
    int c = 0;
    for (; c + kNr <= d; c += kNr) {
      const __m256i a = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(r0 + c));
      const __m256i b = r1 ? _mm256_loadu_si256(reinterpret_cast<const __m256i*>(r1 + c))
                           : _mm256_setzero_si256();
      const __m256i lo = _mm256_unpacklo_epi16(a, b), hi = _mm256_unpackhi_epi16(a, b);
      uint32_t* out = dst + (c / kNr) * cs + (j / 2) * kNr;
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(out), _mm256_permute2x128_si256(lo, hi, 0x20));
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + 8),
                          _mm256_permute2x128_si256(lo, hi, 0x31));
    }
    if (c < d) {
      uint32_t* out = dst + (c / kNr) * cs + (j / 2) * kNr;
      for (int t = 0; t < kNr; ++t) {
        const uint32_t lo = c + t < d ? r0[c + t] : 0, hi = c + t < d && r1 ? r1[c + t] : 0;
        out[t] = lo | hi << 16;
      }
    }
  }
}

// Score-like block on pairs: acc (MR, NP kNr) = A (MR, d) * NP pair panels, A row r of bf16 at
// a + r * lda, panel p at panel + p * ps words. epi(r, p, v) receives row r's vector of panel p.
template <int MR, int NP, class Epi>
HWY_INLINE void score_block_bf16(const uint16_t* a, int64_t lda, const uint32_t* panel, int64_t ps,
                                 int d, Epi&& epi) {
  __m512 c[MR][NP];
#pragma GCC unroll 12
  for (int r = 0; r < MR; ++r)
#pragma GCC unroll 4
    for (int p = 0; p < NP; ++p) c[r][p] = _mm512_setzero_ps();
#pragma GCC unroll 2
  for (int e = 0; e < d / 2; ++e) {
    __m512i b[NP];
#pragma GCC unroll 4
    for (int p = 0; p < NP; ++p) b[p] = _mm512_loadu_si512(panel + p * ps + e * kNr);
#pragma GCC unroll 12
    for (int r = 0; r < MR; ++r)
#pragma GCC unroll 4
      for (int p = 0; p < NP; ++p) c[r][p] = dot2_bcast(c[r][p], b[p], a + r * lda + 2 * e);
  }
#pragma GCC unroll 12
  for (int r = 0; r < MR; ++r)
#pragma GCC unroll 4
    for (int p = 0; p < NP; ++p) {
      const VF v{c[r][p]};
      epi(r, p, &v);
    }
}

// A of a pair product: the word of row r and pair k at a + r * rs + k * ks (words): rs = ld / 2,
// ks = 1 for a bf16 row-major matrix contracted over its columns; rs = 1, ks = ld for a pair
// panel contracted over its rows.
struct PairA {
  const uint32_t* a;
  int64_t rs, ks;
};

// Accumulating block on pairs: C (MR, NC chunks) += sum over pairs k = k0 .. k1-1, in order, of
// A(r, k) . B(k, :), B chunk c at b + c * bcs + k * kNr words, C chunk c of row r at
// c + c * ccs + r * ldc floats; the last chunk keeps only its first `last` columns.
template <int MR, int NC>
HWY_INLINE void acc_block_bf16(const PairA& a, const uint32_t* b, int64_t bcs, float* c,
                               int64_t ldc, int64_t ccs, int last, int64_t k0, int64_t k1) {
  const __mmask16 keep = last >= kNr ? __mmask16(0xffff) : __mmask16((1u << last) - 1);
  __m512 acc[MR][NC];
#pragma GCC unroll 6
  for (int r = 0; r < MR; ++r)
#pragma GCC unroll 4
    for (int v = 0; v < NC; ++v)
      acc[r][v] =
          _mm512_maskz_loadu_ps(v == NC - 1 ? keep : __mmask16(0xffff), c + v * ccs + r * ldc);
#pragma GCC unroll 2
  for (int64_t k = k0; k < k1; ++k) {
    __m512i bv[NC];
#pragma GCC unroll 4
    for (int v = 0; v < NC; ++v) bv[v] = _mm512_loadu_si512(b + v * bcs + k * kNr);
#pragma GCC unroll 6
    for (int r = 0; r < MR; ++r)
#pragma GCC unroll 4
      for (int v = 0; v < NC; ++v)
        acc[r][v] = dot2_bcast(acc[r][v], bv[v], a.a + r * a.rs + k * a.ks);
  }
#pragma GCC unroll 6
  for (int r = 0; r < MR; ++r)
#pragma GCC unroll 4
    for (int v = 0; v < NC; ++v)
      _mm512_mask_storeu_ps(c + v * ccs + r * ldc, v == NC - 1 ? keep : __mmask16(0xffff),
                            acc[r][v]);
}

// C (mr, n) += A (mr, pairs [k0, k1)) . B for any n (columns in chunks of kNr, the last one
// masked) and mr <= kAccMr.
HWY_INLINE void acc_rows_bf16(int mr, int64_t n, PairA a, const uint32_t* b, int64_t bcs, float* c,
                              int64_t ldc, int64_t ccs, int64_t k0, int64_t k1) {
  for (int64_t col = 0; col < n;) {
    const int64_t chunks = std::min<int64_t>(kAccNc, (n - col + kNr - 1) / kNr);
    const int last = int(std::min<int64_t>(kNr, n - col - (chunks - 1) * kNr));
    const uint32_t* bc = b + (col / kNr) * bcs;
    float* cc = c + (col / kNr) * ccs;
    with_rows<kAccMr>(mr, [&]<int MR>() UPIPE_BF16_ATTR {
      switch (chunks) {
        case 4:
          return acc_block_bf16<MR, 4>(a, bc, bcs, cc, ldc, ccs, last, k0, k1);
        case 3:
          return acc_block_bf16<MR, 3>(a, bc, bcs, cc, ldc, ccs, last, k0, k1);
        case 2:
          return acc_block_bf16<MR, 2>(a, bc, bcs, cc, ldc, ccs, last, k0, k1);
        default:
          return acc_block_bf16<MR, 1>(a, bc, bcs, cc, ldc, ccs, last, k0, k1);
      }
    });
    col += chunks * kNr;
  }
}

// fp32 to bf16 on the AVX512-BF16 conversions (round to nearest even; subnormal inputs flush to
// zero, as the dot product would treat them): one vector, and two (b in the low half).
HWY_INLINE __m256i cvt_bf16(__m512 a) {
  return __m256i(_mm512_cvtneps_pbh(a));
}
HWY_INLINE __m512i cvt2_bf16(__m512 a, __m512 b) {
  return __m512i(_mm512_cvtne2ps_pbh(a, b));
}

// Sixteen columns of rows i and i + 1 of an fp32 matrix rounded to bf16 and zipped into words
// (the pair panel of a product contracted over rows): word j = (bf16 row0[j], bf16 row1[j]).
HWY_INLINE __m512i zip_bf16(__m512 row0, __m512 row1) {
  const __m512i zip = _mm512_set_epi16(31, 15, 30, 14, 29, 13, 28, 12, 27, 11, 26, 10, 25, 9, 24, 8,
                                       23, 7, 22, 6, 21, 5, 20, 4, 19, 3, 18, 2, 17, 1, 16, 0);
  return _mm512_permutexvar_epi16(zip, cvt2_bf16(row1, row0));
}

// ---- bf16 products on AMX tiles (the amx path) ----
//
// TDPBF16PS: C(m, n) += A(m, pair k) . B(pair k, n) over the 16 pairs of a tile row, C in fp32
// (mr x 16), A mr rows of 16 words (32 bf16), B 16 rows of 16 words: exactly a pair panel or
// a pair chunk of 16 pairs, so the amx path reads the avx512bf16 path's packed layouts. Each C
// element depends on its own A row and B column only, so which rows share a tile never changes
// a row (the head-subset and query-prefix contracts hold as on the other paths). Contracted
// ranges are whole tiles of 16 pairs: callers round them out over exact zeros.
//
// Tiles: 0-3 accumulators (R rows), 4-5 A (R rows), 6-7 B (16 rows), all 64 bytes wide.
struct AmxTileConfig {
  uint8_t palette = 1, start_row = 0, reserved[14] = {};
  uint16_t colsb[16] = {};
  uint8_t rows[16] = {};
};
static_assert(sizeof(AmxTileConfig) == 64);

// The tile configuration of one kernel call: loaded when the call starts (other code, oneDNN's
// GEMMs among it, configures the tiles its own way in between), reloaded only when the row count
// R changes, released when the call ends.
class AmxTiles {
 public:
  explicit AmxTiles(bool on) : on_(on) {}
  AmxTiles(const AmxTiles&) = delete;
  AmxTiles& operator=(const AmxTiles&) = delete;
  ~AmxTiles() {
    if (rows_ > 0) _tile_release();
  }
  bool on() const { return on_; }
  void rows(int r) {
    if (r == rows_) return;
    alignas(64) AmxTileConfig c;
    for (int t = 0; t < 8; ++t) {
      c.colsb[t] = 64;
      c.rows[t] = uint8_t(t < 6 ? r : 16);
    }
    _tile_loadconfig(&c);
    rows_ = r;
  }

 private:
  bool on_;
  int rows_ = 0;
};

// The tile instructions are asm statements without a memory clobber: a barrier on each side of a
// product keeps the compiler from moving ordinary loads and stores across them.
HWY_INLINE void amx_barrier() {
  asm volatile("" ::: "memory");
}

template <int T>
HWY_INLINE void amx_zero() {
  if constexpr (T == 0) _tile_zero(0);
  if constexpr (T == 1) _tile_zero(1);
  if constexpr (T == 2) _tile_zero(2);
  if constexpr (T == 3) _tile_zero(3);
}
template <int T>
HWY_INLINE void amx_load(const void* p, int64_t stride) {
  if constexpr (T == 0) _tile_loadd(0, p, stride);
  if constexpr (T == 1) _tile_loadd(1, p, stride);
  if constexpr (T == 2) _tile_loadd(2, p, stride);
  if constexpr (T == 3) _tile_loadd(3, p, stride);
  if constexpr (T == 4) _tile_loadd(4, p, stride);
  if constexpr (T == 5) _tile_loadd(5, p, stride);
  if constexpr (T == 6) _tile_loadd(6, p, stride);
  if constexpr (T == 7) _tile_loadd(7, p, stride);
}
template <int T>
HWY_INLINE void amx_store(void* p, int64_t stride) {
  if constexpr (T == 0) _tile_stored(0, p, stride);
  if constexpr (T == 1) _tile_stored(1, p, stride);
  if constexpr (T == 2) _tile_stored(2, p, stride);
  if constexpr (T == 3) _tile_stored(3, p, stride);
}
// Accumulator C += A . B.
template <int C, int A, int B>
HWY_INLINE void amx_dot() {
  if constexpr (A == 4 && B == 6) {
    if constexpr (C == 0) _tile_dpbf16ps(0, 4, 6);
    if constexpr (C == 1) _tile_dpbf16ps(1, 4, 6);
    if constexpr (C == 2) _tile_dpbf16ps(2, 4, 6);
    if constexpr (C == 3) _tile_dpbf16ps(3, 4, 6);
  } else if constexpr (A == 4 && B == 7) {
    if constexpr (C == 0) _tile_dpbf16ps(0, 4, 7);
    if constexpr (C == 1) _tile_dpbf16ps(1, 4, 7);
    if constexpr (C == 2) _tile_dpbf16ps(2, 4, 7);
    if constexpr (C == 3) _tile_dpbf16ps(3, 4, 7);
  } else if constexpr (A == 5 && B == 6) {
    if constexpr (C == 0) _tile_dpbf16ps(0, 5, 6);
    if constexpr (C == 1) _tile_dpbf16ps(1, 5, 6);
    if constexpr (C == 2) _tile_dpbf16ps(2, 5, 6);
    if constexpr (C == 3) _tile_dpbf16ps(3, 5, 6);
  } else {
    static_assert(A == 5 && B == 7);
    if constexpr (C == 0) _tile_dpbf16ps(0, 5, 7);
    if constexpr (C == 1) _tile_dpbf16ps(1, 5, 7);
    if constexpr (C == 2) _tile_dpbf16ps(2, 5, 7);
    if constexpr (C == 3) _tile_dpbf16ps(3, 5, 7);
  }
}

template <int... I, class F>
HWY_INLINE void amx_each(std::integer_sequence<int, I...>, F&& f) {
  (f(std::integral_constant<int, I>()), ...);
}

// Scores on tiles: out (R, NP kNr) = A (R, d) . NP pair panels (as score_block_bf16; R the
// configured rows), A row r of bf16 at a + r * lda, panel p at panel + p * ps words; out row r
// at out + r * ldo floats. d % 32 == 0.
template <int NP>
HWY_INLINE void amx_score_block(const uint16_t* a, int64_t lda, const uint32_t* panel, int64_t ps,
                                int d, float* out, int64_t ldo) {
  static_assert(NP >= 1 && NP <= 4);
  using Panels = std::make_integer_sequence<int, NP>;
  amx_barrier();
  amx_each(Panels(), [&](auto p) UPIPE_BF16_ATTR { amx_zero<p()>(); });
  for (int e = 0; e < d; e += 32) {
    amx_load<4>(a + e, lda * 2);
    amx_each(Panels(), [&](auto p) UPIPE_BF16_ATTR {
      constexpr int kB = p() % 2 == 0 ? 6 : 7;
      amx_load<kB>(panel + p() * ps + e / 2 * kNr, 64);
      amx_dot<p(), 4, kB>();
    });
  }
  amx_each(Panels(), [&](auto p) UPIPE_BF16_ATTR { amx_store<p()>(out + p() * kNr, ldo * 4); });
  amx_barrier();
}

// amx_score_block for np = 1..4 panels.
HWY_INLINE void amx_score_panels(int np, const uint16_t* a, int64_t lda, const uint32_t* panel,
                                 int64_t ps, int d, float* out, int64_t ldo) {
  switch (np) {
    case 4:
      return amx_score_block<4>(a, lda, panel, ps, d, out, ldo);
    case 3:
      return amx_score_block<3>(a, lda, panel, ps, d, out, ldo);
    case 2:
      return amx_score_block<2>(a, lda, panel, ps, d, out, ldo);
    default:
      return amx_score_block<1>(a, lda, panel, ps, d, out, ldo);
  }
}

// Accumulation on tiles: C (R, NC kNr) += A (R, pairs [k0, k1)) . B over whole tiles of 16
// pairs (k0 and k1 multiples of 16), in increasing order; A row r's pair k at a + r * lda / 2 + k
// words (lda in bf16), B chunk c at b + c * bcs + k * kNr words, C row r at c + r * ldc floats.
template <int NC>
HWY_INLINE void amx_acc_block(const uint16_t* a, int64_t lda, const uint32_t* b, int64_t bcs,
                              float* c, int64_t ldc, int64_t k0, int64_t k1) {
  static_assert(NC >= 1 && NC <= 4);
  using Chunks = std::make_integer_sequence<int, NC>;
  amx_barrier();
  amx_each(Chunks(), [&](auto v) UPIPE_BF16_ATTR { amx_load<v()>(c + v() * kNr, ldc * 4); });
  for (int64_t k = k0; k < k1; k += 16) {
    amx_load<4>(a + 2 * k, lda * 2);
    amx_each(Chunks(), [&](auto v) UPIPE_BF16_ATTR {
      constexpr int kB = v() % 2 == 0 ? 6 : 7;
      amx_load<kB>(b + v() * bcs + k * kNr, 64);
      amx_dot<v(), 4, kB>();
    });
  }
  amx_each(Chunks(), [&](auto v) UPIPE_BF16_ATTR { amx_store<v()>(c + v() * kNr, ldc * 4); });
  amx_barrier();
}

// C (R, n) += A . B (amx_acc_block) for any n that is a multiple of kNr, 4 chunks at a time.
HWY_INLINE void amx_acc_rows(int64_t n, const uint16_t* a, int64_t lda, const uint32_t* b,
                             int64_t bcs, float* c, int64_t ldc, int64_t k0, int64_t k1) {
  for (int64_t col = 0; col < n; col += 4 * kNr) {
    const uint32_t* bc = b + (col / kNr) * bcs;
    float* cc = c + col;
    switch (std::min<int64_t>(4, (n - col) / kNr)) {
      case 4:
        amx_acc_block<4>(a, lda, bc, bcs, cc, ldc, k0, k1);
        break;
      case 3:
        amx_acc_block<3>(a, lda, bc, bcs, cc, ldc, k0, k1);
        break;
      case 2:
        amx_acc_block<2>(a, lda, bc, bcs, cc, ldc, k0, k1);
        break;
      default:
        amx_acc_block<1>(a, lda, bc, bcs, cc, ldc, k0, k1);
    }
  }
}

// Transposed accumulation on tiles: C (32, NJ kNr) += A (32, pairs [k0, k1)) . B, k0 and k1
// multiples of 16, in increasing order; A row e's pair k at a + e * lda + k words, B pair row k at
// b + k * ldb words (kNr columns per tile, NJ tiles side by side), C row e at c + e * ldc floats.
// Configured rows: 16.
template <int NJ>
HWY_INLINE void amx_acc_t(const uint32_t* a, int64_t lda, const uint32_t* b, int64_t ldb, float* c,
                          int64_t ldc, int64_t k0, int64_t k1) {
  static_assert(NJ == 1 || NJ == 2);
  amx_barrier();
  amx_load<0>(c, ldc * 4);
  amx_load<2>(c + 16 * ldc, ldc * 4);
  if constexpr (NJ == 2) {
    amx_load<1>(c + kNr, ldc * 4);
    amx_load<3>(c + 16 * ldc + kNr, ldc * 4);
  }
  for (int64_t k = k0; k < k1; k += 16) {
    amx_load<4>(a + k, lda * 4);
    amx_load<5>(a + 16 * lda + k, lda * 4);
    amx_load<6>(b + k * ldb, ldb * 4);
    amx_dot<0, 4, 6>();
    amx_dot<2, 5, 6>();
    if constexpr (NJ == 2) {
      amx_load<7>(b + k * ldb + kNr, ldb * 4);
      amx_dot<1, 4, 7>();
      amx_dot<3, 5, 7>();
    }
  }
  amx_store<0>(c, ldc * 4);
  amx_store<2>(c + 16 * ldc, ldc * 4);
  if constexpr (NJ == 2) {
    amx_store<1>(c + kNr, ldc * 4);
    amx_store<3>(c + 16 * ldc + kNr, ldc * 4);
  }
  amx_barrier();
}

// Transposes the 16 x 16 matrix of 32-bit words in r (row i in r[i]) in place.
HWY_INLINE void transpose16_epi32(__m512i* r) {
  __m512i t[16];
  for (int i = 0; i < 16; i += 2) {
    t[i] = _mm512_unpacklo_epi32(r[i], r[i + 1]);
    t[i + 1] = _mm512_unpackhi_epi32(r[i], r[i + 1]);
  }
  for (int i = 0; i < 16; i += 4) {
    r[i] = _mm512_unpacklo_epi64(t[i], t[i + 2]);
    r[i + 1] = _mm512_unpackhi_epi64(t[i], t[i + 2]);
    r[i + 2] = _mm512_unpacklo_epi64(t[i + 1], t[i + 3]);
    r[i + 3] = _mm512_unpackhi_epi64(t[i + 1], t[i + 3]);
  }
  // Each 128-bit lane now holds one row of a 4 x 4 block: gather the lanes, in two steps.
  for (int i = 0; i < 8; ++i) {
    const int a = (i / 4) * 8 + i % 4;  // 0-3, 8-11
    t[a] = _mm512_shuffle_i32x4(r[a], r[a + 4], 0x88);
    t[a + 4] = _mm512_shuffle_i32x4(r[a], r[a + 4], 0xdd);
  }
  for (int i = 0; i < 8; ++i) {
    r[i] = _mm512_shuffle_i32x4(t[i], t[i + 8], 0x88);
    r[i + 8] = _mm512_shuffle_i32x4(t[i], t[i + 8], 0xdd);
  }
}

// Packs rows [0, n) of an (n, d) bf16 matrix transposed in pairs of rows: dst[e * dld + i / 2] =
// word (x(i, e), x(i + 1, e)) for even i < rows (a multiple of 32 >= n); rows past n are zero.
// The A operand of a transposed product contracted over the rows (amx_acc_t); d % 16 == 0.
// Sixteen row pairs by sixteen columns at a time: the pairs' words, then a 16 x 16 transpose.
HWY_NOINLINE void pack_pair_rows_t(const uint16_t* src, int64_t ld, int64_t n, int64_t rows, int d,
                                   uint32_t* dst, int64_t dld) {
  for (int64_t p0 = 0; p0 < rows / 2; p0 += 16)
    for (int e0 = 0; e0 < d; e0 += 16) {
      __m512i r[16];
      for (int t = 0; t < 16; ++t) {
        const int64_t i = 2 * (p0 + t);
        const __m256i a =
            i < n ? _mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + i * ld + e0))
                  : _mm256_setzero_si256();
        const __m256i b =
            i + 1 < n
                ? _mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + (i + 1) * ld + e0))
                : _mm256_setzero_si256();
        const __m256i lo = _mm256_unpacklo_epi16(a, b), hi = _mm256_unpackhi_epi16(a, b);
        r[t] = _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_permute2x128_si256(lo, hi, 0x20)),
                                  _mm256_permute2x128_si256(lo, hi, 0x31), 1);
      }
      transpose16_epi32(r);
      for (int t = 0; t < 16; ++t) _mm512_storeu_si512(dst + (e0 + t) * dld + p0, r[t]);
    }
}
UPIPE_BF16_DOT_END
#else
constexpr bool kHaveBf16Dot = false;
#endif  // HWY_TARGET == HWY_AVX3

}  // namespace HWY_NAMESPACE
}  // namespace upipe::cpu
HWY_AFTER_NAMESPACE();

#endif  // toggle guard
