// CUDA flash attention on fp32 FMA (attention_cuda.h). Three kernels of 8 warps, each templated on
// the output columns per lane NC (4: d <= 128, 8: d <= 256):
//   fwd_kernel    block = (query tile, query head): online softmax over the visited key tiles;
//   bwd_q_kernel  block = (query tile, query head): dq over the visited key tiles;
//   bwd_kv_kernel block = (key tile, KV head): dk, dv over the group's query heads in increasing
//                 order, then the query tiles that may see the key tile in increasing order.
// Tiles of k/v (forward, dq) or q/do (dk, dv) are staged into shared memory as fp32 (bf16 widened,
// columns past d zero); in the score phase a warp owns rows of the "broadcast" operand and each
// lane two rows of the other (rows lane and lane + 32 of a 64-row tile); in the accumulation phase
// each lane owns output columns lane + 32 t. Every output element is one sequential fp32 FMA chain
// in a fixed order (docs/kernels.md): scores over e; o over keys in increasing order, rescaled per
// key tile; dq over keys increasing; dk, dv over heads, then query rows increasing. Masked and
// out-of-range entries enter those chains as exact zeros. Warp reductions (row max, row sum) use a
// fixed xor butterfly, so every lane holds the same bits. The normalised forward runs on cuDNN's
// fused attention instead where attention_cudnn.h takes it (bf16, no documents, plain causal).
#include "backend/cuda/attention_cuda.h"

#include <cuda_runtime.h>

#include "backend/cuda/attention_cudnn.h"
#include "backend/cuda/attention_plan.h"
#include "backend/cuda/cuda_check.h"

namespace upipe::cuda {
namespace {

using attn::kThreads;
using attn::kWarps;
using attn::Mask;
using attn::Range;

constexpr unsigned kFull = 0xffffffffu;
constexpr int kTile = attn::kLaneTile;  // the lanes' side of every tile

struct FwdParams {
  DAttn p;
  Mask mask;
  DView o, lse;     // (sq, hq*d) q's dtype, (hq, sq) fp32
  DView acc, m, l;  // (sq, hq*d) fp32, (hq, sq) fp32, (hq, sq) fp32
  bool accumulate;
};
struct BwdParams {
  DAttn p;
  Mask mask;
  DView dout, lse, delta;  // (sq, hq*d) q's dtype, (hq, sq) fp32, (hq, sq) fp32
  DView dq, dk, dv;        // (sq, hq*d), (sk, hk*d), (sk, hk*d) fp32, accumulated
};

__device__ __forceinline__ float load(const DView& x, int64_t r, int64_t c) {
  const int64_t i = r * x.ld + c;
  if (x.dtype == DT::kF32) return static_cast<const float*>(x.data)[i];
  return attn::from_bf16(static_cast<const uint16_t*>(x.data)[i]);
}
__device__ __forceinline__ float* f32_at(const DView& x, int64_t r, int64_t c) {
  return static_cast<float*>(x.data) + r * x.ld + c;
}
__device__ __forceinline__ void store(const DView& x, int64_t r, int64_t c, float v) {
  const int64_t i = r * x.ld + c;
  if (x.dtype == DT::kF32)
    static_cast<float*>(x.data)[i] = v;
  else
    static_cast<uint16_t*>(x.data)[i] = attn::to_bf16(v);
}

// rows x ld floats at dst <- rows [r0, r0 + n) and columns [c0, c0 + d) of x, zeros elsewhere.
// Called by the whole block; one warp per row, so a row's global reads are coalesced.
__device__ void stage(float* dst, int64_t ld, int rows, const DView& x, int64_t r0, int64_t n,
                      int64_t c0, int d) {
  const int warp = int(threadIdx.x) >> 5, lane = int(threadIdx.x) & 31;
  for (int r = warp; r < rows; r += kWarps)
    for (int64_t e = lane; e < ld; e += 32)
      dst[r * ld + e] = (r < n && e < d) ? load(x, r0 + r, c0 + e) : 0.0f;
}

// acc + a . b over the 4 components in order.
__device__ __forceinline__ float dot4(const float4& a, const float4& b, float acc) {
  acc = fmaf(a.x, b.x, acc);
  acc = fmaf(a.y, b.y, acc);
  acc = fmaf(a.z, b.z, acc);
  return fmaf(a.w, b.w, acc);
}
__device__ __forceinline__ const float4* row4(const float* base, int64_t ld, int64_t r) {
  return reinterpret_cast<const float4*>(base + r * ld);
}
__device__ __forceinline__ float comp(const float4& v, int u) {
  return u == 0 ? v.x : (u == 1 ? v.y : (u == 2 ? v.z : v.w));
}

__device__ __forceinline__ float warp_max(float x) {
  for (int o = 16; o > 0; o >>= 1) x = fmaxf(x, __shfl_xor_sync(kFull, x, o));
  return x;
}
// Every lane ends with the same bits: each level adds x and its partner's x, which commute.
__device__ __forceinline__ float warp_sum(float x) {
  for (int o = 16; o > 0; o >>= 1) x += __shfl_xor_sync(kFull, x, o);
  return x;
}

// The union [first, end) of the tile columns that the rows (key ranges lo, hi) given by the
// predicate see, widened to whole float4s: the keys a warp's accumulation runs over. The entries
// inside it that a row does not see are exact zeros. Empty when no row sees any.
struct Cols {
  int first = kTile, end = 0;
  __device__ void add(const Range& tc) {
    if (tc.empty()) return;
    first = min(first, int(tc.first));
    end = max(end, int(tc.end));
  }
  __device__ bool empty() const { return first >= end; }
  __device__ int begin4() const { return first & ~3; }
  __device__ int end4() const { return (end + 3) & ~3; }
};

// ---- forward ---------------------------------------------------------------------------------

// Loads the running state of the warp's rows (accumulate mode) or resets it.
template <int NC, int R>
__device__ __forceinline__ void fwd_begin(const FwdParams& a, int h, int64_t i0, int64_t bq,
                                          int warp, int lane, float (&m)[R], float (&l)[R],
                                          float (&o)[R][NC]) {
  const int d = a.p.d;
#pragma unroll
  for (int k = 0; k < R; ++k) {
    const int64_t r = warp * R + k, i = i0 + r;
    const bool have = a.accumulate && r < bq;
    m[k] = have ? *f32_at(a.m, h, i) : attn::neg_inf();
    l[k] = have ? *f32_at(a.l, h, i) : 0.0f;
#pragma unroll
    for (int t = 0; t < NC; ++t) {
      const int e = lane + 32 * t;
      o[k][t] = have && e < d ? *f32_at(a.acc, i, int64_t(h) * d + e) : 0.0f;
    }
  }
}

// Stores the running state (accumulate mode) or the normalised output and lse.
template <int NC, int R>
__device__ __forceinline__ void fwd_end(const FwdParams& a, int h, int64_t i0, int64_t bq, int warp,
                                        int lane, const float (&m)[R], const float (&l)[R],
                                        const float (&o)[R][NC]) {
  const int d = a.p.d;
#pragma unroll
  for (int k = 0; k < R; ++k) {
    const int64_t r = warp * R + k, i = i0 + r;
    if (r >= bq) break;
    if (a.accumulate) {
      if (lane == 0) {
        *f32_at(a.m, h, i) = m[k];
        *f32_at(a.l, h, i) = l[k];
      }
#pragma unroll
      for (int t = 0; t < NC; ++t) {
        const int e = lane + 32 * t;
        if (e < d) *f32_at(a.acc, i, int64_t(h) * d + e) = o[k][t];
      }
      continue;
    }
    const float inv = attn::finalize_inv(l[k]);
#pragma unroll
    for (int t = 0; t < NC; ++t) {
      const int e = lane + 32 * t;
      if (e < d) store(a.o, i, int64_t(h) * d + e, o[k][t] * inv);
    }
    if (lane == 0) *f32_at(a.lse, h, i) = attn::finalize_lse(m[k], l[k]);
  }
}

// One key tile [j0, j0 + bk) (staged in sK, sV) for the warp's rows: scores, online softmax
// (probabilities into the warp's rows of sP), o rescaled by alpha, then o += P V over the columns
// the warp's rows see, in increasing key order.
template <int NC, int R>
__device__ __forceinline__ void fwd_tile(const FwdParams& a, const float* sQ, const float* sK,
                                         const float* sV, float* sP, const int64_t* sLo,
                                         const int64_t* sHi, int64_t j0, int64_t bk, int warp,
                                         int lane, float (&m)[R], float (&l)[R],
                                         float (&o)[R][NC]) {
  const int d = a.p.d;
  const int64_t ldq = attn::ld_bcast(d), ldk = attn::ld_lane(d);
  float s[R][2];
#pragma unroll
  for (int k = 0; k < R; ++k) s[k][0] = s[k][1] = 0.0f;
  const float4* k0 = row4(sK, ldk, lane);
  const float4* k1 = row4(sK, ldk, lane + 32);
  for (int64_t e4 = 0; e4 < ldq / 4; ++e4) {
    const float4 ka = k0[e4], kb = k1[e4];
#pragma unroll
    for (int k = 0; k < R; ++k) {
      const float4 qv = row4(sQ, ldq, warp * R + k)[e4];
      s[k][0] = dot4(qv, ka, s[k][0]);
      s[k][1] = dot4(qv, kb, s[k][1]);
    }
  }
  Cols cols;
#pragma unroll
  for (int k = 0; k < R; ++k) {
    const int r = warp * R + k;
    const Range tc = attn::tile_cols({sLo[r], sHi[r]}, j0, bk);
    cols.add(tc);
    const bool v0 = lane >= tc.first && lane < tc.end;
    const bool v1 = lane + 32 >= tc.first && lane + 32 < tc.end;
    const float x0 = v0 ? s[k][0] * a.p.scale : attn::neg_inf();
    const float x1 = v1 ? s[k][1] * a.p.scale : attn::neg_inf();
    const float m_new = fmaxf(m[k], warp_max(fmaxf(x0, x1)));
    const float alpha = attn::online_alpha(m[k], m_new);
    const float p0 = v0 ? attn::online_prob(x0, m_new) : 0.0f;
    const float p1 = v1 ? attn::online_prob(x1, m_new) : 0.0f;
    l[k] = l[k] * alpha + warp_sum(p0 + p1);
    m[k] = m_new;
    sP[r * kTile + lane] = p0;
    sP[r * kTile + lane + 32] = p1;
#pragma unroll
    for (int t = 0; t < NC; ++t) o[k][t] *= alpha;
  }
  __syncwarp();
  if (cols.empty()) return;
  for (int c = cols.begin4(); c < cols.end4(); c += 4) {
    float4 pk[R];
#pragma unroll
    for (int k = 0; k < R; ++k) pk[k] = row4(sP, kTile, warp * R + k)[c / 4];
#pragma unroll
    for (int u = 0; u < 4; ++u) {
      const float* vrow = sV + (c + u) * ldk;
#pragma unroll
      for (int t = 0; t < NC; ++t) {
        const int e = lane + 32 * t;
        if (e >= d) break;
        const float vv = vrow[e];
#pragma unroll
        for (int k = 0; k < R; ++k) o[k][t] = fmaf(comp(pk[k], u), vv, o[k][t]);
      }
    }
  }
}

template <int NC>
__global__ void __launch_bounds__(kThreads, 1) fwd_kernel(const FwdParams a) {
  constexpr int R = attn::rows_per_warp(NC), BQ = kWarps * R;
  const int d = a.p.d;
  const int h = int(blockIdx.y), kvh = h / (a.p.hq / a.p.hk);
  const int64_t i0 = int64_t(blockIdx.x) * BQ, bq = attn::min64(BQ, a.mask.sq - i0);
  const int warp = int(threadIdx.x) >> 5, lane = int(threadIdx.x) & 31;
  const int64_t ldq = attn::ld_bcast(d), ldk = attn::ld_lane(d);
  extern __shared__ float4 smem4[];
  float* sQ = reinterpret_cast<float*>(smem4);                 // (BQ, ldq)
  float* sK = sQ + BQ * ldq;                                   // (kTile, ldk)
  float* sV = sK + kTile * ldk;                                // (kTile, ldk)
  float* sP = sV + kTile * ldk;                                // (BQ, kTile)
  int64_t* sLo = reinterpret_cast<int64_t*>(sP + BQ * kTile);  // (BQ) key ranges
  int64_t* sHi = sLo + BQ;

  for (int r = int(threadIdx.x); r < BQ; r += kThreads) {
    const Range kr = r < bq ? attn::key_range(a.mask, i0 + r) : Range{0, 0};
    sLo[r] = kr.first;
    sHi[r] = kr.end;
  }
  stage(sQ, ldq, BQ, a.p.q, i0, bq, int64_t(h) * d, d);
  __syncthreads();
  const Range keys = attn::keys_seen(sLo, sHi, BQ);
  float m[R], l[R], o[R][NC];
  fwd_begin<NC, R>(a, h, i0, bq, warp, lane, m, l, o);
  if (a.accumulate && keys.empty()) return;
  for (int64_t j0 = attn::tile_floor(keys.first, kTile); j0 < keys.end; j0 += kTile) {
    const int64_t bk = attn::min64(kTile, a.mask.sk - j0);
    // Skip tiles (no row sees a key of it); the barrier also ends the previous tile's reads.
    const int sees =
        int(threadIdx.x) < BQ && attn::row_sees({sLo[threadIdx.x], sHi[threadIdx.x]}, j0, j0 + bk);
    if (!__syncthreads_or(sees)) continue;
    stage(sK, ldk, kTile, a.p.k, j0, bk, int64_t(kvh) * d, d);
    stage(sV, ldk, kTile, a.p.v, j0, bk, int64_t(kvh) * d, d);
    __syncthreads();
    fwd_tile<NC, R>(a, sQ, sK, sV, sP, sLo, sHi, j0, bk, warp, lane, m, l, o);
  }
  fwd_end<NC, R>(a, h, i0, bq, warp, lane, m, l, o);
}

// ---- backward: dq ----------------------------------------------------------------------------

// The state of the tile's rows shared by the backward kernels: key range (empty for rows past the
// view and rows with lse = -inf, which contribute nothing), lse and delta. Thread r < rows fills
// row r; returns whether that row sees a key of [j0, j1).
__device__ __forceinline__ int bwd_rows(const BwdParams& a, int h, int64_t i0, int64_t bq, int rows,
                                        int64_t* sLo, int64_t* sHi, float* sLse, float* sDelta,
                                        int64_t j0, int64_t j1) {
  const int r = int(threadIdx.x);
  if (r >= rows) return 0;
  const float lse = r < bq ? *f32_at(a.lse, h, i0 + r) : attn::neg_inf();
  const Range kr = lse == attn::neg_inf() ? Range{0, 0} : attn::key_range(a.mask, i0 + r);
  sLo[r] = kr.first;
  sHi[r] = kr.end;
  sLse[r] = lse;
  sDelta[r] = r < bq ? *f32_at(a.delta, h, i0 + r) : 0.0f;
  return attn::row_sees(kr, j0, j1);
}

// One key tile for the warp's rows: P and dS (into the warp's rows of sDS), then dq += dS K in
// increasing key order.
template <int NC, int R>
__device__ __forceinline__ void bwd_q_tile(const BwdParams& a, const float* sQ, const float* sO,
                                           const float* sK, const float* sV, float* sDS,
                                           const int64_t* sLo, const int64_t* sHi,
                                           const float* sLse, const float* sDelta, int64_t j0,
                                           int64_t bk, int warp, int lane, float (&acc)[R][NC]) {
  const int d = a.p.d;
  const int64_t ldq = attn::ld_bcast(d), ldk = attn::ld_lane(d);
  const float scale = a.p.scale;
  float s[R][2], dp[R][2];
#pragma unroll
  for (int k = 0; k < R; ++k) s[k][0] = s[k][1] = dp[k][0] = dp[k][1] = 0.0f;
  const float4* k0 = row4(sK, ldk, lane);
  const float4* k1 = row4(sK, ldk, lane + 32);
  const float4* v0 = row4(sV, ldk, lane);
  const float4* v1 = row4(sV, ldk, lane + 32);
  for (int64_t e4 = 0; e4 < ldq / 4; ++e4) {
    const float4 ka = k0[e4], kb = k1[e4], va = v0[e4], vb = v1[e4];
#pragma unroll
    for (int k = 0; k < R; ++k) {
      const float4 qv = row4(sQ, ldq, warp * R + k)[e4];
      const float4 ov = row4(sO, ldq, warp * R + k)[e4];
      s[k][0] = dot4(qv, ka, s[k][0]);
      s[k][1] = dot4(qv, kb, s[k][1]);
      dp[k][0] = dot4(ov, va, dp[k][0]);
      dp[k][1] = dot4(ov, vb, dp[k][1]);
    }
  }
  Cols cols;
#pragma unroll
  for (int k = 0; k < R; ++k) {
    const int r = warp * R + k;
    const Range tc = attn::tile_cols({sLo[r], sHi[r]}, j0, bk);
    cols.add(tc);
#pragma unroll
    for (int u = 0; u < 2; ++u) {
      const int c = lane + 32 * u;
      float ds = 0.0f;
      if (c >= tc.first && c < tc.end) {
        const float p = attn::bwd_prob(s[k][u], scale, sLse[r]);
        ds = attn::bwd_dscore(p, dp[k][u], sDelta[r], scale);
      }
      sDS[r * kTile + c] = ds;
    }
  }
  __syncwarp();
  if (cols.empty()) return;
  for (int c = cols.begin4(); c < cols.end4(); c += 4) {
    float4 dk4[R];
#pragma unroll
    for (int k = 0; k < R; ++k) dk4[k] = row4(sDS, kTile, warp * R + k)[c / 4];
#pragma unroll
    for (int u = 0; u < 4; ++u) {
      const float* krow = sK + (c + u) * ldk;
#pragma unroll
      for (int t = 0; t < NC; ++t) {
        const int e = lane + 32 * t;
        if (e >= d) break;
        const float kv = krow[e];
#pragma unroll
        for (int k = 0; k < R; ++k) acc[k][t] = fmaf(comp(dk4[k], u), kv, acc[k][t]);
      }
    }
  }
}

template <int NC>
__global__ void __launch_bounds__(kThreads, 1) bwd_q_kernel(const BwdParams a) {
  constexpr int R = attn::rows_per_warp(NC), BQ = kWarps * R;
  const int d = a.p.d;
  const int h = int(blockIdx.y), kvh = h / (a.p.hq / a.p.hk);
  const int64_t i0 = int64_t(blockIdx.x) * BQ, bq = attn::min64(BQ, a.mask.sq - i0);
  const int warp = int(threadIdx.x) >> 5, lane = int(threadIdx.x) & 31;
  const int64_t ldq = attn::ld_bcast(d), ldk = attn::ld_lane(d);
  extern __shared__ float4 smem4[];
  float* sQ = reinterpret_cast<float*>(smem4);  // (BQ, ldq)
  float* sO = sQ + BQ * ldq;                    // (BQ, ldq) do
  float* sK = sO + BQ * ldq;                    // (kTile, ldk)
  float* sV = sK + kTile * ldk;                 // (kTile, ldk)
  float* sDS = sV + kTile * ldk;                // (BQ, kTile)
  float* sLse = sDS + BQ * kTile;               // (BQ)
  float* sDelta = sLse + BQ;                    // (BQ)
  int64_t* sLo = reinterpret_cast<int64_t*>(sDelta + BQ);
  int64_t* sHi = sLo + BQ;

  bwd_rows(a, h, i0, bq, BQ, sLo, sHi, sLse, sDelta, 0, 0);
  stage(sQ, ldq, BQ, a.p.q, i0, bq, int64_t(h) * d, d);
  stage(sO, ldq, BQ, a.dout, i0, bq, int64_t(h) * d, d);
  __syncthreads();
  const Range keys = attn::keys_seen(sLo, sHi, BQ);
  if (keys.empty()) return;
  float acc[R][NC];
#pragma unroll
  for (int k = 0; k < R; ++k) {
    const int64_t r = warp * R + k;
#pragma unroll
    for (int t = 0; t < NC; ++t) {
      const int e = lane + 32 * t;
      acc[k][t] = r < bq && e < d ? *f32_at(a.dq, i0 + r, int64_t(h) * d + e) : 0.0f;
    }
  }
  for (int64_t j0 = attn::tile_floor(keys.first, kTile); j0 < keys.end; j0 += kTile) {
    const int64_t bk = attn::min64(kTile, a.mask.sk - j0);
    const int sees =
        int(threadIdx.x) < BQ && attn::row_sees({sLo[threadIdx.x], sHi[threadIdx.x]}, j0, j0 + bk);
    if (!__syncthreads_or(sees)) continue;
    stage(sK, ldk, kTile, a.p.k, j0, bk, int64_t(kvh) * d, d);
    stage(sV, ldk, kTile, a.p.v, j0, bk, int64_t(kvh) * d, d);
    __syncthreads();
    bwd_q_tile<NC, R>(a, sQ, sO, sK, sV, sDS, sLo, sHi, sLse, sDelta, j0, bk, warp, lane, acc);
  }
#pragma unroll
  for (int k = 0; k < R; ++k) {
    const int64_t r = warp * R + k;
    if (r >= bq) break;
#pragma unroll
    for (int t = 0; t < NC; ++t) {
      const int e = lane + 32 * t;
      if (e < d) *f32_at(a.dq, i0 + r, int64_t(h) * d + e) = acc[k][t];
    }
  }
}

// ---- backward: dk, dv ------------------------------------------------------------------------

// The first and one past the last of the 64 tile rows (row lane in bit lane of b0, row lane + 32 of
// b1) whose bit is set; first >= end when none.
__device__ __forceinline__ void ballot_rows(unsigned b0, unsigned b1, int& first, int& end) {
  first = b0 ? __ffs(int(b0)) - 1 : (b1 ? 32 + __ffs(int(b1)) - 1 : kTile);
  end = b1 ? 64 - __clz(int(b1)) : (b0 ? 32 - __clz(int(b0)) : 0);
}

// One query tile of head h (staged in sQ, sO; row state in sLo.. sDelta) for the warp's keys:
// P and dS (into the warp's keys' rows of sP, sDS), then dv += P^T do and dk += dS^T q over the
// query rows that see some key of the warp, in increasing row order.
template <int NC, int R>
__device__ __forceinline__ void bwd_kv_tile(const BwdParams& a, const float* sK, const float* sV,
                                            const float* sQ, const float* sO, float* sP, float* sDS,
                                            const int64_t* sLo, const int64_t* sHi,
                                            const float* sLse, const float* sDelta, int64_t j0,
                                            int64_t bk, int warp, int lane, float (&dk)[R][NC],
                                            float (&dv)[R][NC]) {
  const int d = a.p.d;
  const int64_t ldk = attn::ld_bcast(d), ldq = attn::ld_lane(d);
  const float scale = a.p.scale;
  float s[R][2], dp[R][2];
#pragma unroll
  for (int k = 0; k < R; ++k) s[k][0] = s[k][1] = dp[k][0] = dp[k][1] = 0.0f;
  const float4* q0 = row4(sQ, ldq, lane);
  const float4* q1 = row4(sQ, ldq, lane + 32);
  const float4* o0 = row4(sO, ldq, lane);
  const float4* o1 = row4(sO, ldq, lane + 32);
  for (int64_t e4 = 0; e4 < ldk / 4; ++e4) {
    const float4 qa = q0[e4], qb = q1[e4], oa = o0[e4], ob = o1[e4];
#pragma unroll
    for (int k = 0; k < R; ++k) {
      const float4 kv = row4(sK, ldk, warp * R + k)[e4];
      const float4 vv = row4(sV, ldk, warp * R + k)[e4];
      s[k][0] = dot4(qa, kv, s[k][0]);
      s[k][1] = dot4(qb, kv, s[k][1]);
      dp[k][0] = dot4(oa, vv, dp[k][0]);
      dp[k][1] = dot4(ob, vv, dp[k][1]);
    }
  }
  // The warp's keys [w0, w1) of the tile (tile columns).
  const int64_t w0 = int64_t(warp) * R, w1 = attn::min64(w0 + R, bk);
  bool seen[2];
#pragma unroll
  for (int u = 0; u < 2; ++u) {
    const int r = lane + 32 * u;
    const Range kr{sLo[r], sHi[r]};
    const Range tc = attn::tile_cols(kr, j0, bk);
    seen[u] = w0 < w1 && attn::row_sees(kr, j0 + w0, j0 + w1);
#pragma unroll
    for (int k = 0; k < R; ++k) {
      const int c = warp * R + k;
      float p = 0.0f, ds = 0.0f;
      if (c >= tc.first && c < tc.end) {
        p = attn::bwd_prob(s[k][u], scale, sLse[r]);
        ds = attn::bwd_dscore(p, dp[k][u], sDelta[r], scale);
      }
      sP[c * kTile + r] = p;
      sDS[c * kTile + r] = ds;
    }
  }
  int first = 0, end = 0;
  ballot_rows(__ballot_sync(kFull, seen[0]), __ballot_sync(kFull, seen[1]), first, end);
  __syncwarp();
  if (first >= end) return;
  const int r0 = first & ~3, r1 = (end + 3) & ~3;
  // dv += P^T do, then dk += dS^T q: two passes, so each holds only one operand's rows.
  for (int r = r0; r < r1; r += 4) {
    float4 pk[R];
#pragma unroll
    for (int k = 0; k < R; ++k) pk[k] = row4(sP, kTile, warp * R + k)[r / 4];
#pragma unroll
    for (int u = 0; u < 4; ++u) {
      const float* orow = sO + (r + u) * ldq;
#pragma unroll
      for (int t = 0; t < NC; ++t) {
        const int e = lane + 32 * t;
        if (e >= d) break;
        const float ov = orow[e];
#pragma unroll
        for (int k = 0; k < R; ++k) dv[k][t] = fmaf(comp(pk[k], u), ov, dv[k][t]);
      }
    }
  }
  for (int r = r0; r < r1; r += 4) {
    float4 dk4[R];
#pragma unroll
    for (int k = 0; k < R; ++k) dk4[k] = row4(sDS, kTile, warp * R + k)[r / 4];
#pragma unroll
    for (int u = 0; u < 4; ++u) {
      const float* qrow = sQ + (r + u) * ldq;
#pragma unroll
      for (int t = 0; t < NC; ++t) {
        const int e = lane + 32 * t;
        if (e >= d) break;
        const float qv = qrow[e];
#pragma unroll
        for (int k = 0; k < R; ++k) dk[k][t] = fmaf(comp(dk4[k], u), qv, dk[k][t]);
      }
    }
  }
}

// attn::first_true by the whole block (attn::search_round; every thread computes the same lo and
// hi, so the loop is uniform): log_256 of the rows in rounds instead of log_2 dependent steps.
template <class Pred>
__device__ int64_t block_first_true(int64_t lo, int64_t hi, const Pred& pred) {
  while (lo < hi) {
    const int64_t x = lo + int64_t(threadIdx.x) * attn::search_step(lo, hi, kThreads);
    const int falses = __syncthreads_count(x < hi && !pred(x));
    const attn::SearchRange r = attn::search_round(lo, hi, kThreads, falses);
    lo = r.lo;
    hi = r.hi;
  }
  return lo;
}

// attn::query_rows with its two document searches run by the whole block (one thread's binary
// searches over a million rows, each step three binary searches of the span lists, kept the
// other 255 threads waiting). Every thread must call it.
__device__ attn::Range block_query_rows(const attn::Mask& m, int64_t j0, int64_t n) {
  if (!m.causal || !m.documents()) return attn::query_rows(m, j0, n);
  const int64_t first = block_first_true(0, m.sq, attn::KeysEndPast{&m, j0});
  const int64_t end = block_first_true(0, m.sq, attn::KeysStartAtOrPast{&m, j0 + n});
  return {first, attn::max64(first, end)};
}

template <int NC>
__global__ void __launch_bounds__(kThreads, 1) bwd_kv_kernel(const BwdParams a) {
  constexpr int R = attn::rows_per_warp(NC), BK = kWarps * R;
  const int d = a.p.d, group = a.p.hq / a.p.hk;
  const int g = int(blockIdx.y);
  const int64_t j0 = int64_t(blockIdx.x) * BK, bk = attn::min64(BK, a.mask.sk - j0);
  const int warp = int(threadIdx.x) >> 5, lane = int(threadIdx.x) & 31;
  const int64_t ldk = attn::ld_bcast(d), ldq = attn::ld_lane(d);
  extern __shared__ float4 smem4[];
  float* sK = reinterpret_cast<float*>(smem4);  // (BK, ldk)
  float* sV = sK + BK * ldk;                    // (BK, ldk)
  float* sQ = sV + BK * ldk;                    // (kTile, ldq)
  float* sO = sQ + kTile * ldq;                 // (kTile, ldq) do
  float* sP = sO + kTile * ldq;                 // (BK, kTile) P^T
  float* sDS = sP + BK * kTile;                 // (BK, kTile) dS^T
  float* sLse = sDS + BK * kTile;               // (kTile)
  float* sDelta = sLse + kTile;                 // (kTile)
  int64_t* sLo = reinterpret_cast<int64_t*>(sDelta + kTile);
  int64_t* sHi = sLo + kTile;
  const Range rows = block_query_rows(a.mask, j0, bk);
  if (rows.empty()) return;  // the same on every thread
  stage(sK, ldk, BK, a.p.k, j0, bk, int64_t(g) * d, d);
  stage(sV, ldk, BK, a.p.v, j0, bk, int64_t(g) * d, d);
  __syncthreads();
  float dk[R][NC], dv[R][NC];
#pragma unroll
  for (int k = 0; k < R; ++k) {
    const int64_t c = warp * R + k;
#pragma unroll
    for (int t = 0; t < NC; ++t) {
      const int e = lane + 32 * t;
      const bool in = c < bk && e < d;
      dk[k][t] = in ? *f32_at(a.dk, j0 + c, int64_t(g) * d + e) : 0.0f;
      dv[k][t] = in ? *f32_at(a.dv, j0 + c, int64_t(g) * d + e) : 0.0f;
    }
  }
  for (int h = g * group; h < (g + 1) * group; ++h) {
    for (int64_t i0 = attn::tile_floor(rows.first, kTile); i0 < rows.end; i0 += kTile) {
      const int64_t bq = attn::min64(kTile, a.mask.sq - i0);
      const int sees = bwd_rows(a, h, i0, bq, kTile, sLo, sHi, sLse, sDelta, j0, j0 + bk);
      if (!__syncthreads_or(sees)) continue;
      stage(sQ, ldq, kTile, a.p.q, i0, bq, int64_t(h) * d, d);
      stage(sO, ldq, kTile, a.dout, i0, bq, int64_t(h) * d, d);
      __syncthreads();
      bwd_kv_tile<NC, R>(a, sK, sV, sQ, sO, sP, sDS, sLo, sHi, sLse, sDelta, j0, bk, warp, lane, dk,
                         dv);
      __syncthreads();  // the next query tile overwrites the row state and tiles read here
    }
  }
#pragma unroll
  for (int k = 0; k < R; ++k) {
    const int64_t c = warp * R + k;
    if (c >= bk) break;
#pragma unroll
    for (int t = 0; t < NC; ++t) {
      const int e = lane + 32 * t;
      if (e >= d) continue;
      *f32_at(a.dk, j0 + c, int64_t(g) * d + e) = dk[k][t];
      *f32_at(a.dv, j0 + c, int64_t(g) * d + e) = dv[k][t];
    }
  }
}

// ---- launches --------------------------------------------------------------------------------

Mask mask_of(const DAttn& p) {
  Mask m;
  m.sq = p.q.rows;
  m.sk = p.k.rows;
  m.q_pos0 = p.q_pos0;
  m.k_pos0 = p.k_pos0;
  m.causal = p.causal;
  m.q_docs = p.q_docs;
  m.k_docs = p.k_docs;
  return m;
}

int64_t blocks(int64_t n, int64_t b) {
  return (n + b - 1) / b;
}

template <class Params>
void launch(void (*kernel)(Params), int64_t grid_x, int grid_y, int64_t smem, const Params& a,
            cudaStream_t s) {
  UPIPE_CUDA_CHECK(
      cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
  kernel<<<dim3(unsigned(grid_x), unsigned(grid_y)), kThreads, size_t(smem), s>>>(a);
  UPIPE_CUDA_CHECK(cudaGetLastError());
}

}  // namespace

int64_t attention_fwd_workspace_bytes(int hq, int hk, int d, DT t, bool documents) {
  return attn::fwd_workspace_bytes(hq, hk, d, t, documents, cudnn_attention_built());
}
int64_t attention_bwd_workspace_bytes(int hq, int hk, int d, DT t, bool documents) {
  return attn::bwd_workspace_bytes(hq, hk, d, t, documents, cudnn_attention_built());
}
bool attention_backward_reads_o(int d, DT t) {
  return cudnn_attention_built() && attn::sdpa_shape(d, t);
}
bool attention_supports(int d, DT t, bool documents) {
  return attn::supports(d, t, documents);
}

void attention_forward(const DAttn& p, const DView& o, const DView& lse, const DView& acc,
                       const DView& m, const DView& l, bool accumulate, void* ws, cudaStream_t s) {
  const FwdParams a{p, mask_of(p), o, lse, acc, m, l, accumulate};
  if (a.mask.sq == 0) return;
  const int64_t ws_bytes =
      attention_fwd_workspace_bytes(p.hq, p.hk, p.d, p.q.dtype, p.q_docs.count > 0);
  if (!accumulate && cudnn_attention_forward(p, o, lse, ws, ws_bytes, s)) return;
  if (accumulate && a.mask.sk > 0 && ws_bytes > 0 &&
      cudnn_attention_forward_accumulate(p, acc, m, l, ws, ws_bytes, s))
    return;
  const int64_t grid = blocks(a.mask.sq, attn::fwd_tiles(p.d).bq), smem = attn::fwd_smem_bytes(p.d);
  if (attn::cols_per_lane(p.d) == 4)
    launch(fwd_kernel<4>, grid, p.hq, smem, a, s);
  else
    launch(fwd_kernel<8>, grid, p.hq, smem, a, s);
}

void attention_backward(const DAttn& p, const DView& o, const DView& dout, const DView& lse,
                        const DView& delta, const DView& dq, const DView& dk, const DView& dv,
                        void* ws, cudaStream_t s) {
  const BwdParams a{p, mask_of(p), dout, lse, delta, dq, dk, dv};
  if (a.mask.sq == 0 || a.mask.sk == 0) return;
  const int64_t ws_bytes =
      attention_bwd_workspace_bytes(p.hq, p.hk, p.d, p.q.dtype, p.q_docs.count > 0);
  if (ws_bytes > 0 && cudnn_attention_backward(p, o, dout, lse, dq, dk, dv, ws, ws_bytes, s))
    return;
  const bool narrow = attn::cols_per_lane(p.d) == 4;
  // The two passes write disjoint outputs and read only inputs: one stream, no ordering needed.
  const int64_t kv_grid = blocks(a.mask.sk, attn::bwd_kv_tiles(p.d).bk);
  const int64_t q_grid = blocks(a.mask.sq, attn::bwd_q_tiles(p.d).bq);
  if (narrow) {
    launch(bwd_kv_kernel<4>, kv_grid, p.hk, attn::bwd_kv_smem_bytes(p.d), a, s);
    launch(bwd_q_kernel<4>, q_grid, p.hq, attn::bwd_q_smem_bytes(p.d), a, s);
  } else {
    launch(bwd_kv_kernel<8>, kv_grid, p.hk, attn::bwd_kv_smem_bytes(p.d), a, s);
    launch(bwd_q_kernel<8>, q_grid, p.hq, attn::bwd_q_smem_bytes(p.d), a, s);
  }
}

}  // namespace upipe::cuda
