// The pure logic of the CUDA attention kernels (attention_cuda.cu), compiled by nvcc for the
// kernels and by the host compiler for tests/unit/test_cuda_attention_plan.cpp: which key rows a
// query row sees (positions or document spans: the rule of cpu/attention_mask.h), the skip / full /
// partial class of a (query tile, key tile), the visited tile ranges, the tile shapes and
// shared-memory sizes, the online-softmax and backward per-element steps, and bf16 rounding; and
// how a call maps onto cuDNN's fused attention (attention_cudnn.cpp): the forward's plan, the
// blocks the backward and the accumulate mode are cut into, their masks and workspace layouts.
//
// Tiles are anchored at row 0 of the query and key views and depend only on d, so a row's
// arithmetic never depends on which other rows or heads share the call (docs/kernels.md,
// "Tiling and the reduction-order contract"): a tile a row sees nothing of, visited because another
// row of its tile does, adds exact zeros and rescales by exactly 1.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>
#include <initializer_list>

#include "backend/cuda/bf16.h"
#include "backend/cuda/dev_view.h"
#include "backend/cuda/hd.h"

namespace upipe::cuda::attn {

// ---- tiles ------------------------------------------------------------------------------------

constexpr int kWarps = 8;  // every kernel: 8 warps of 32 threads
constexpr int kThreads = kWarps * 32;
constexpr int kLaneTile = 64;  // tile side held by the lanes: 2 rows (or keys) per lane
constexpr int kMaxDim = 256;   // head dims up to 256: at most 8 output columns per lane

// Output columns per lane of a d-wide row (lane l holds columns l, l + 32, ...): the size of the
// kernels' register accumulators, hence their template parameter.
constexpr int cols_per_lane(int d) {
  return d <= 128 ? 4 : 8;
}
// Rows (or keys) each warp owns: fewer for wide heads, so 2 x rows x columns accumulators fit the
// register file.
constexpr int rows_per_warp(int nc) {
  return nc <= 4 ? 8 : 4;
}

// One kernel's tiles: bq query rows x bk key rows.
struct Tiles {
  int64_t bq = 0, bk = 0;
};
// Forward and the dq pass: warps own query rows, lanes own keys.
UPIPE_HD Tiles fwd_tiles(int d) {
  return {int64_t(kWarps) * rows_per_warp(cols_per_lane(d)), kLaneTile};
}
UPIPE_HD Tiles bwd_q_tiles(int d) {
  return fwd_tiles(d);
}
// The dk/dv pass: warps own keys, lanes own query rows.
UPIPE_HD Tiles bwd_kv_tiles(int d) {
  return {kLaneTile, int64_t(kWarps) * rows_per_warp(cols_per_lane(d))};
}

UPIPE_HD int64_t round_up(int64_t x, int64_t m) {
  return (x + m - 1) / m * m;
}
// Shared-memory row strides (floats). Tiles read with one row per warp (a broadcast) need only
// 16-byte rows; tiles read with one row per lane as float4 get 4 floats of padding on a multiple
// of 8, so the 8 lanes of a quarter warp hit 8 distinct 4-bank groups. Columns [d, ld) hold zeros:
// the float4 dot products run to round_up(d, 4) and add exact zeros there.
UPIPE_HD int64_t ld_bcast(int d) {
  return round_up(d, 4);
}
UPIPE_HD int64_t ld_lane(int d) {
  return round_up(d, 8) + 4;
}

// Dynamic shared memory of each kernel (bytes), as the kernels carve it (attention_cuda.cu):
// forward: q tile (bq, ld_bcast), k and v tiles (bk, ld_lane), probabilities (bq, bk), key ranges
// (2 bq int64);
// dq pass: q and do tiles (bq, ld_bcast), k and v tiles (bk, ld_lane), dS (bq, bk), lse and delta
// (2 bq), key ranges (2 bq int64);
// dk/dv pass: k and v tiles (bk, ld_bcast), q and do tiles (bq, ld_lane), P and dS (2 bk bq), lse
// and delta (2 bq), key ranges (2 bq int64).
UPIPE_HD int64_t fwd_smem_bytes(int d) {
  const Tiles t = fwd_tiles(d);
  return 4 * (t.bq * ld_bcast(d) + 2 * t.bk * ld_lane(d) + t.bq * t.bk) + 16 * t.bq;
}
UPIPE_HD int64_t bwd_q_smem_bytes(int d) {
  const Tiles t = bwd_q_tiles(d);
  return 4 * (2 * t.bq * ld_bcast(d) + 2 * t.bk * ld_lane(d) + t.bq * t.bk + 2 * t.bq) + 16 * t.bq;
}
UPIPE_HD int64_t bwd_kv_smem_bytes(int d) {
  const Tiles t = bwd_kv_tiles(d);
  return 4 * (2 * t.bk * ld_bcast(d) + 2 * t.bq * ld_lane(d) + 2 * t.bk * t.bq + 2 * t.bq) +
         16 * t.bq;
}
// What one block may have on sm_90 (227 KiB).
constexpr int64_t kMaxSmemBytes = 227 * 1024;

// Whether cuDNN's fused attention may take calls of this dtype and head dim at all (bf16, d a
// multiple of 8 up to 256); documents, views and masks decide per call (sdpa_plan,
// sdpa_bwd_why_not).
UPIPE_HD bool sdpa_shape(int d, DT t) {
  return t == DT::kBF16 && d >= 8 && d % 8 == 0 && d <= 256;
}
// Defined below ("cuDNN fused attention backward", "cuDNN accumulate-mode forward").
UPIPE_HD int64_t sdpa_bwd_workspace_bytes(int hq, int hk, int d);
UPIPE_HD int64_t sdpa_fwd_workspace_bytes(int hq, int d);

// Global workspace. The flash kernels need none: key ranges are found per block in shared memory
// and every partial sum lives in registers. With cuDNN (a build with cudnn-frontend) every bf16
// call of a d it takes, with documents or not, whether it then runs there or on the flash kernels,
// takes sdpa_fwd_workspace_bytes (forward: the accumulate mode's blocks; the normalised forward
// gives cuDNN what it asks of it, if it asks) or sdpa_bwd_workspace_bytes (backward): the queries
// depend on the heads, d and dtype only.
UPIPE_HD int64_t fwd_workspace_bytes(int hq, int, int d, DT t, bool, bool cudnn) {
  return cudnn && sdpa_shape(d, t) ? sdpa_fwd_workspace_bytes(hq, d) : 0;
}
UPIPE_HD int64_t bwd_workspace_bytes(int hq, int hk, int d, DT t, bool, bool cudnn) {
  return cudnn && sdpa_shape(d, t) ? sdpa_bwd_workspace_bytes(hq, hk, d) : 0;
}
// d up to 256 (register accumulators of 8 columns per lane, shared memory within 227 KiB); any
// d in [1, 256], since tiles are staged element by element and padded with zeros. fp32 or bf16.
UPIPE_HD bool supports(int d, DT t, bool) {
  return d >= 1 && d <= kMaxDim && (t == DT::kF32 || t == DT::kBF16);
}

// ---- masking ----------------------------------------------------------------------------------

// What decides visibility: positions (q_pos0, k_pos0, causal) or, when q_docs is given, the two
// span lists (device memory in the kernels, host memory in the tests).
struct Mask {
  int64_t sq = 0, sk = 0;
  int64_t q_pos0 = 0, k_pos0 = 0;
  bool causal = true;
  DDocs q_docs = {}, k_docs = {};
  UPIPE_HD bool documents() const { return q_docs.count > 0; }
};

struct Range {
  int64_t first = 0, end = 0;  // [first, end)
  UPIPE_HD bool empty() const { return first >= end; }
};

UPIPE_HD int64_t clamp64(int64_t x, int64_t lo, int64_t hi) {
  return x < lo ? lo : (x > hi ? hi : x);
}
UPIPE_HD int64_t min64(int64_t a, int64_t b) {
  return a < b ? a : b;
}
UPIPE_HD int64_t max64(int64_t a, int64_t b) {
  return a > b ? a : b;
}

// The span of list l holding list row r: the last span starting at or before r (-1 if none).
UPIPE_HD int64_t span_of(const DDocs& l, int64_t r) {
  int64_t a = 0, b = l.count;
  while (a < b) {
    const int64_t mid = a + (b - a) / 2;
    if (l.spans[mid].row <= r)
      a = mid + 1;
    else
      b = mid;
  }
  return a - 1;
}

// The list rows of document doc at positions <= pos: [first span of doc, through pos), or an empty
// range where such keys would be (so that, over sorted queries, both ends never decrease).
UPIPE_HD Range doc_keys(const DDocs& k, int64_t doc, int64_t pos) {
  if (k.count == 0) return {0, 0};
  int64_t a = 0, b = k.count;
  while (a < b) {  // first span with s.doc >= doc
    const int64_t mid = a + (b - a) / 2;
    if (k.spans[mid].doc < doc)
      a = mid + 1;
    else
      b = mid;
  }
  const int64_t first = a;
  b = k.count;
  while (a < b) {  // first span past (doc, pos)
    const int64_t mid = a + (b - a) / 2;
    const DSpan& s = k.spans[mid];
    if (s.doc > doc || (s.doc == doc && s.pos > pos))
      b = mid;
    else
      a = mid + 1;
  }
  const int64_t past = a;
  if (past > first) {
    const DSpan& s = k.spans[past - 1];
    return {k.spans[first].row, s.row + min64(s.rows, pos - s.pos + 1)};
  }
  const int64_t at =
      first < k.count ? k.spans[first].row : k.spans[k.count - 1].row + k.spans[k.count - 1].rows;
  return {at, at};
}

// The key rows [first, end) of the view that query row i sees (cpu/attention_mask.h key_ranges):
// causal [0, q_pos0 + i - k_pos0 + 1) clipped, not causal every key, documents the keys of the
// row's document up to its position. Both ends never decrease with i.
UPIPE_HD Range key_range(const Mask& m, int64_t i) {
  if (!m.documents()) {
    if (!m.causal) return {0, m.sk};
    return {0, clamp64(m.q_pos0 + i - m.k_pos0 + 1, 0, m.sk)};
  }
  const DDocs& q = m.q_docs;
  const int64_t row = i + q.row0;
  const int64_t si = span_of(q, row);
  // A row outside its list (a malformed call) sees nothing, at the end it would be on.
  if (si < 0) return {0, 0};
  const DSpan& s = q.spans[si];
  if (row >= s.row + s.rows) return {m.sk, m.sk};
  const Range kr = doc_keys(m.k_docs, s.doc, s.pos + (row - s.row));
  const int64_t lo = clamp64(kr.first - m.k_docs.row0, 0, m.sk);
  return {lo, clamp64(kr.end - m.k_docs.row0, lo, m.sk)};
}

// Whether a row with key range r sees some key of [j0, j1), and whether it sees all of them.
UPIPE_HD bool row_sees(const Range& r, int64_t j0, int64_t j1) {
  return !r.empty() && r.first < j1 && r.end > j0;
}
UPIPE_HD bool row_covers(const Range& r, int64_t j0, int64_t j1) {
  return r.first <= j0 && r.end >= j1;
}

// The first i of [lo, hi) where pred holds, hi if none; pred monotone over [lo, hi) (false ...
// false true ... true). Binary search: one thread.
template <class Pred>
UPIPE_HD int64_t first_true(int64_t lo, int64_t hi, const Pred& pred) {
  while (lo < hi) {
    const int64_t mid = lo + (hi - lo) / 2;
    if (pred(mid))
      hi = mid;
    else
      lo = mid + 1;
  }
  return lo;
}

// The same search by a block of `threads` threads (attention_cuda.cu's block_first_true): each
// round tests the candidates lo + t step (t < threads, below hi; step = ceil((hi - lo) / threads))
// at once and counts the false ones; the answer lies after the last false candidate and at or
// before the first true one, so [lo, hi) shrinks by a factor of `threads` per round (3 rounds for
// 1M rows of 256 threads, against binary search's 20 dependent steps).
struct SearchRange {
  int64_t lo = 0, hi = 0;
};
UPIPE_HD int64_t search_step(int64_t lo, int64_t hi, int threads) {
  return (hi - lo + threads - 1) / threads;
}
UPIPE_HD SearchRange search_round(int64_t lo, int64_t hi, int threads, int64_t falses) {
  if (falses == 0) return {lo, lo};  // the first candidate, lo itself, holds
  const int64_t step = search_step(lo, hi, threads);
  return {lo + (falses - 1) * step + 1, min64(hi, lo + falses * step)};
}
// The block search emulated on one thread (what the tests compare with first_true).
template <class Pred>
int64_t first_true_in_rounds(int64_t lo, int64_t hi, int threads, const Pred& pred,
                             int* rounds = nullptr) {
  if (rounds != nullptr) *rounds = 0;
  while (lo < hi) {
    const int64_t step = search_step(lo, hi, threads);
    int64_t falses = 0;
    for (int t = 0; t < threads; ++t) {
      const int64_t x = lo + int64_t(t) * step;
      falses += x < hi && !pred(x);
    }
    const SearchRange r = search_round(lo, hi, threads, falses);
    lo = r.lo;
    hi = r.hi;
    if (rounds != nullptr) ++*rounds;
  }
  return lo;
}

// query_rows's two predicates over query rows: the row's key range ends past j, starts at or past
// j. Both ends of the key ranges grow with the row, so both are monotone.
struct KeysEndPast {
  const Mask* m;
  int64_t j;
  UPIPE_HD bool operator()(int64_t i) const { return key_range(*m, i).end > j; }
};
struct KeysStartAtOrPast {
  const Mask* m;
  int64_t j;
  UPIPE_HD bool operator()(int64_t i) const { return key_range(*m, i).first >= j; }
};

// The query rows among which every row that sees a key of [j0, j0 + n) lies (rows inside may see
// none): cpu/attention_mask.h query_rows. With documents: the first row whose range ends past j0,
// and the first whose range starts at or past j0 + n (bwd_kv_kernel runs the same two searches
// with the whole block, block_query_rows).
UPIPE_HD Range query_rows(const Mask& m, int64_t j0, int64_t n) {
  if (!m.causal) return {0, m.sq};
  if (!m.documents()) return {clamp64(m.k_pos0 + j0 - m.q_pos0, 0, m.sq), m.sq};
  const int64_t first = first_true(0, m.sq, KeysEndPast{&m, j0});
  const int64_t end = first_true(0, m.sq, KeysStartAtOrPast{&m, j0 + n});
  return {first, max64(first, end)};
}

// The keys some of the n rows (key ranges lo, hi) sees: from the smallest first to the largest end
// over the rows that see any; empty ({0, 0}) when none does. cpu/attention_mask.h keys_seen.
UPIPE_HD Range keys_seen(const int64_t* lo, const int64_t* hi, int64_t n) {
  Range r{0, 0};
  bool any = false;
  for (int64_t i = 0; i < n; ++i) {
    if (lo[i] >= hi[i]) continue;
    r.first = any ? min64(r.first, lo[i]) : lo[i];
    r.end = max64(r.end, hi[i]);
    any = true;
  }
  return any ? r : Range{0, 0};
}

// A (query tile, key tile): no row sees any of its keys (skipped), every row sees every key, or
// anything else (masked per row).
enum class TileKind : uint8_t { kSkip = 0, kFull = 1, kPartial = 2 };

// Folds one row into the class of a tile built up from {any = false, all = true}.
struct TileClass {
  bool any = false, all = true;
  UPIPE_HD void add(const Range& r, int64_t j0, int64_t j1) {
    any = any || row_sees(r, j0, j1);
    all = all && row_covers(r, j0, j1);
  }
  UPIPE_HD TileKind kind() const {
    return !any ? TileKind::kSkip : (all ? TileKind::kFull : TileKind::kPartial);
  }
};

// The class of query rows [i0, i0 + bq) against key rows [j0, j0 + bk) (both clipped to the view).
UPIPE_HD TileKind classify(const Mask& m, int64_t i0, int64_t bq, int64_t j0, int64_t bk) {
  const int64_t i1 = min64(i0 + bq, m.sq), j1 = min64(j0 + bk, m.sk);
  TileClass c;
  for (int64_t i = i0; i < i1; ++i) c.add(key_range(m, i), j0, j1);
  return c.kind();
}

// The tile columns [first, end) of key tile [j0, j0 + bk) a row with key range r sees (first = end
// when none): cpu attention_cpu.cpp tile_cols.
UPIPE_HD Range tile_cols(const Range& r, int64_t j0, int64_t bk) {
  const int64_t lim = clamp64(r.end - j0, 0, bk);
  return {clamp64(r.first - j0, 0, lim), lim};
}

// The first tile (anchored at 0, side b) a loop over [first, ...) starts at.
UPIPE_HD int64_t tile_floor(int64_t first, int64_t b) {
  return first / b * b;
}

// ---- per-element steps (the same in the kernels and in the host emulation) -------------------

UPIPE_HD float neg_inf() {
  return -INFINITY;
}

// Online softmax over a key tile: m_new = max(m, tile max); the running output and sum are
// scaled by alpha (0 while the row has seen nothing: m = -inf); visible keys get exp(x - m_new).
UPIPE_HD float online_alpha(float m_old, float m_new) {
  return m_old == neg_inf() ? 0.0f : expf(m_old - m_new);
}
UPIPE_HD float online_prob(float x, float m_new) {
  return expf(x - m_new);
}
// Normalised row: o = acc * inv, lse; a row with l = 0 (no visible key) gets o = 0, lse = -inf.
UPIPE_HD float finalize_inv(float l) {
  return l > 0.0f ? 1.0f / l : 0.0f;
}
UPIPE_HD float finalize_lse(float m, float l) {
  return l > 0.0f ? m + logf(l) : neg_inf();
}
// Backward: P = exp(s scale - lse) for a visible key (never called with lse = -inf: such rows see
// nothing), dS = P (dP - delta) scale.
UPIPE_HD float bwd_prob(float s, float scale, float lse) {
  return expf(s * scale - lse);
}
UPIPE_HD float bwd_dscore(float p, float dp, float delta, float scale) {
  return p * (dp - delta) * scale;
}

// bf16 storage: bf16.h (fp32 rounded to nearest even, as core/dtype.h).
UPIPE_HD uint16_t to_bf16(float f) {
  return f32_to_bf16(f);
}
UPIPE_HD float from_bf16(uint16_t h) {
  return bf16_to_f32(h);
}

// ---- cuDNN fused attention (attention_cudnn.cpp) ----------------------------------------------

// A tensor in cuDNN's BHSD terms: dims {batch, heads, rows, cols} and their strides (elements).
struct Bhsd {
  int64_t dim[4] = {0, 0, 0, 0}, stride[4] = {0, 0, 0, 0};
};
// A (rows, heads*d) view with row stride ld: head h's (rows, d) block starts h*d elements in.
inline Bhsd bhsd_of(const DView& x, int heads, int d) {
  return {{1, heads, x.rows, d}, {x.rows * x.ld, d, x.ld, 1}};
}
// lse (hq, sq) as cuDNN's softmax stats {1, hq, sq, 1}.
inline Bhsd bhsd_stats(const DView& lse) {
  return {{1, lse.rows, lse.cols, 1}, {lse.rows * lse.ld, lse.ld, 1, 1}};
}

// The masks the fused kernel is given: every key (none), key j visible iff j <= i (top left), or
// iff j <= i + sk - sq (bottom right). Only these three, whose meaning is cuDNN's documented
// causal masks, are mapped; other offsets run on the flash kernels.
enum class SdpaMask : uint8_t { kNone = 0, kTopLeft = 1, kBottomRight = 2 };

struct SdpaPlan {
  bool use = false;
  const char* why_not = "";  // the first condition that failed, when !use
  SdpaMask mask = SdpaMask::kNone;
  Bhsd q, k, v, o, stats;
};

inline bool aligned16(const void* p) {
  return reinterpret_cast<uintptr_t>(p) % 16 == 0;
}

// Whether the normalised forward of this call may run on cuDNN, and its tensors. cuDNN's own
// support check (and a workspace within the call's) decide last, when the graph is built.
//   - no documents (the spans would need one ragged call per piece);
//   - bf16 (cuDNN's flash path has no fp32 inputs), d a multiple of 8 up to 256;
//   - q, k, v, o rows 16-byte aligned (ld a multiple of 8), lse packed (ld = sq) and aligned;
//   - every row sees a key and the visible keys are one of the three masks: not causal;
//     causal with q_pos0 - k_pos0 >= sk - 1 (every key visible); = 0 (top left); = sk - sq > 0
//     (bottom right). Other offsets leave rows with no key, which cuDNN does not define.
inline SdpaPlan sdpa_plan(const DView& q, const DView& k, const DView& v, const DView& o,
                          const DView& lse, int hq, int hk, int d, int64_t q_pos0, int64_t k_pos0,
                          bool causal, bool documents) {
  SdpaPlan p;
  auto no = [&](const char* why) {
    p.why_not = why;
    return p;
  };
  if (documents) return no("documents");
  if (q.dtype != DT::kBF16 || o.dtype != DT::kBF16) return no("not bf16");
  if (d % 8 != 0 || d > kMaxDim) return no("d not a multiple of 8 up to 256");
  if (q.rows < 1 || k.rows < 1) return no("empty");
  for (const DView* x : {&q, &k, &v, &o})
    if (x->ld % 8 != 0 || !aligned16(x->data)) return no("rows not 16-byte aligned");
  if (lse.ld != lse.cols || !aligned16(lse.data)) return no("lse not packed");
  const int64_t sq = q.rows, sk = k.rows, shift = q_pos0 - k_pos0;
  if (!causal || shift >= sk - 1)
    p.mask = SdpaMask::kNone;
  else if (shift == 0)
    p.mask = SdpaMask::kTopLeft;
  else if (shift == sk - sq && shift > 0)
    p.mask = SdpaMask::kBottomRight;
  else
    return no("causal offset other than 0, sk - sq or past every key");
  p.use = true;
  p.q = bhsd_of(q, hq, d);
  p.k = bhsd_of(k, hk, d);
  p.v = bhsd_of(v, hk, d);
  p.o = bhsd_of(o, hq, d);
  p.stats = bhsd_stats(lse);
  return p;
}

// ---- cuDNN fused attention backward (attention_cudnn.cpp) -------------------------------------
//
// cuDNN's backward writes dQ, dK, dV in the input dtype (bf16) and needs a workspace that grows
// with the rows (its fp32 dQ accumulator), while our backward accumulates into fp32 dq, dk, dv
// with a workspace fixed per backend and head dim. So the call is cut into blocks of c query rows
// x c key rows (anchored at row 0 of both views, the last ones shorter): each visited block runs
// as one cuDNN call on the block's rows of q, k, v, o, do and the global lse (its delta is cuDNN's
// own rowsum(do * o), which equals ours), into bf16 temporaries that are then added into dq, dk,
// dv, query blocks outer, key blocks inner. cuDNN runs its deterministic backward (no atomics:
// the same bits every run), which holds the block's dP, hq x c x c bf16. Every temporary and
// cuDNN's own workspace live in the call's workspace (sdpa_bwd_workspace_bytes: what a block of
// side kSdpaMaxBlock needs, so it grows with the call's heads, as the attention's other buffers
// do, and never with its rows).

// The smallest block side a call is cut into (a call whose views are smaller is one block): a
// call that would need smaller blocks runs on the flash kernels rather than as thousands of tiny
// cuDNN calls.
constexpr int64_t kSdpaMinBlock = 256;
// The block side: rows and keys of a call beyond it are cut. 4096 keeps a block's cuDNN call long
// against the launches around it (a stats copy and three additions) while its dP workspace stays
// hq x 32 MiB; the workspace is sized for it, so every call is cut at this side whatever its heads
// (a strategy attending U heads at a time cuts as one attending all of them).
constexpr int64_t kSdpaMaxBlock = 4096;

UPIPE_HD int64_t align256(int64_t x) {
  return round_up(x, 256);
}

// What one block's mask is: skipped (no row sees a key of it), or one of cuDNN's three masks, or
// none of them (then the call runs on the flash kernels). shift = position of the block's first
// query row minus that of its first key row.
struct SdpaBlockMask {
  bool skip = false, mapped = false;
  SdpaMask mask = SdpaMask::kNone;
};
UPIPE_HD SdpaBlockMask sdpa_block_mask(bool causal, int64_t shift, int64_t rows, int64_t keys) {
  SdpaBlockMask m;
  if (!causal || shift >= keys - 1) {
    m.mapped = true;  // every row sees every key
  } else if (shift + rows - 1 < 0) {
    m.skip = true;  // even the last row sees no key
  } else if (shift == 0) {
    m.mapped = true;
    m.mask = SdpaMask::kTopLeft;
  } else if (shift > 0 && shift == keys - rows) {
    m.mapped = true;
    m.mask = SdpaMask::kBottomRight;
  }
  return m;
}

// One visited block: query rows [q0, q0 + rows), key rows [k0, k0 + keys), its mask.
struct SdpaBlock {
  int64_t q0 = 0, rows = 0, k0 = 0, keys = 0;
  SdpaMask mask = SdpaMask::kNone;
};

// Calls f(block) for every visited block of side c, query blocks outer and key blocks inner, both
// ascending (the order the temporaries are added in), and returns true; returns false, calling
// nothing, when some block has no cuDNN mask.
template <class F>
bool for_each_sdpa_block(int64_t sq, int64_t sk, int64_t q_pos0, int64_t k_pos0, bool causal,
                         int64_t c, F&& f) {
  if (c < 1) return false;
  for (int pass = 0; pass < 2; ++pass)
    for (int64_t i0 = 0; i0 < sq; i0 += c)
      for (int64_t j0 = 0; j0 < sk; j0 += c) {
        const int64_t rows = min64(c, sq - i0), keys = min64(c, sk - j0);
        const SdpaBlockMask m = sdpa_block_mask(causal, q_pos0 + i0 - (k_pos0 + j0), rows, keys);
        if (m.skip) continue;
        if (!m.mapped) return false;  // only in pass 0: pass 1 sees the same blocks
        if (pass == 1) f(SdpaBlock{i0, rows, j0, keys, m.mask});
      }
  return true;
}

// The temporaries of block side c inside the workspace, each 256-byte aligned: dq (c, hq*d) bf16,
// dk and dv (c, hk*d) bf16, the block's lse packed (hq, c) fp32; cuDNN's own workspace follows.
struct SdpaBwdLayout {
  int64_t dq = 0, dk = 0, dv = 0, stats = 0, cudnn = 0;  // byte offsets
};
UPIPE_HD SdpaBwdLayout sdpa_bwd_layout(int64_t c, int hq, int hk, int d) {
  SdpaBwdLayout l;
  l.dk = l.dq + align256(c * hq * d * 2);
  l.dv = l.dk + align256(c * hk * d * 2);
  l.stats = l.dv + align256(c * hk * d * 2);
  l.cudnn = l.stats + align256(int64_t(hq) * c * 4);
  return l;
}
// What cuDNN's deterministic backward asks for a block of side c, as cudnn-frontend 1.32 sizes it
// (scaled_dot_product_flash_attention.h): dP, hq x c (to 64) x c (to 128) bf16, the softmax sum
// hq x c fp32, and, when it takes the dQ-accumulator path instead, hq x c x d fp32. The side is
// chosen with it and then checked against what the built graphs ask for.
UPIPE_HD int64_t sdpa_bwd_cudnn_guess(int64_t c, int hq, int, int d) {
  const int64_t dp = int64_t(hq) * round_up(c, 64) * round_up(c, 128) * 2;
  return dp + int64_t(hq) * c * 4 + c * hq * d * 4;
}
// Whether the temporaries of side c and the guess of cuDNN's workspace fit the budget.
UPIPE_HD bool sdpa_bwd_fits(int64_t c, int hq, int hk, int d, int64_t budget) {
  return sdpa_bwd_layout(c, hq, hk, d).cudnn + sdpa_bwd_cudnn_guess(c, hq, hk, d) <= budget;
}
// The side tried after c: half of it rounded up to 64, not below kSdpaMinBlock; 0 after that.
UPIPE_HD int64_t sdpa_bwd_next_side(int64_t c) {
  return c > kSdpaMinBlock ? max64(kSdpaMinBlock, round_up(c / 2, 64)) : 0;
}
// The arena aligns to 64 bytes, the temporaries start on a 256-byte boundary: up to 192 bytes of
// a workspace go to that, so each workspace below holds that much more.
constexpr int64_t kSdpaAlignSlack = 256;
// The backward's workspace for hq, hk, d: the temporaries and cuDNN's guessed workspace of a block
// of side kSdpaMaxBlock, and the alignment slack.
UPIPE_HD int64_t sdpa_bwd_workspace_bytes(int hq, int hk, int d) {
  return sdpa_bwd_layout(kSdpaMaxBlock, hq, hk, d).cudnn +
         sdpa_bwd_cudnn_guess(kSdpaMaxBlock, hq, hk, d) + kSdpaAlignSlack;
}
// The first side to try: the rows of the larger view rounded up to 64, at most kSdpaMaxBlock,
// then the next sides until one fits the budget; 0 when none does.
UPIPE_HD int64_t sdpa_bwd_first_side(int64_t sq, int64_t sk, int hq, int hk, int d,
                                     int64_t budget) {
  int64_t c = min64(round_up(max64(sq, sk), 64), kSdpaMaxBlock);
  while (c > 0 && !sdpa_bwd_fits(c, hq, hk, d, budget)) c = sdpa_bwd_next_side(c);
  return c;
}

// Whether a call may be cut into cuDNN blocks: no documents, bf16, d a multiple of 8 up to 256,
// q, k, v rows 16-byte aligned (null: it may). The masks are decided per block.
inline const char* sdpa_blocks_why_not(const DView& q, const DView& k, const DView& v, int d,
                                       bool documents) {
  if (documents) return "documents";
  if (q.dtype != DT::kBF16) return "not bf16";
  if (d % 8 != 0 || d > kMaxDim) return "d not a multiple of 8 up to 256";
  if (q.rows < 1 || k.rows < 1) return "empty";
  for (const DView* x : {&q, &k, &v})
    if (x->ld % 8 != 0 || !aligned16(x->data)) return "rows not 16-byte aligned";
  return nullptr;
}
// The same for the backward, which also needs o and do (bf16, 16-byte rows).
inline const char* sdpa_bwd_why_not(const DView& q, const DView& k, const DView& v, const DView& o,
                                    const DView& dout, int d, bool documents) {
  if (const char* w = sdpa_blocks_why_not(q, k, v, d, documents)) return w;
  if (o.data == nullptr) return "no o";
  if (o.dtype != DT::kBF16 || dout.dtype != DT::kBF16) return "not bf16";
  for (const DView* x : {&o, &dout})
    if (x->ld % 8 != 0 || !aligned16(x->data)) return "rows not 16-byte aligned";
  return nullptr;
}

// ---- cuDNN accumulate-mode forward (attention_cudnn.cpp) --------------------------------------
//
// The accumulate mode (ring steps, fpdt chunk pairs) continues an online softmax (acc, m, l) over
// more keys. On cuDNN a call is cut into the blocks of for_each_sdpa_block; each block runs as
// cuDNN's normalised forward into a bf16 o and an fp32 lse of its rows (the temporaries below),
// which the state of those rows then takes (partial_merge_*, elementwise_math.h), in block order.
// The temporaries of side c, 256-byte aligned: o (c, hq*d) bf16, lse (hq, c) fp32.
struct SdpaFwdLayout {
  int64_t o = 0, lse = 0, end = 0;  // byte offsets; end = the bytes
};
UPIPE_HD SdpaFwdLayout sdpa_fwd_layout(int64_t c, int hq, int d) {
  SdpaFwdLayout l;
  l.lse = l.o + align256(c * hq * d * 2);
  l.end = l.lse + align256(int64_t(hq) * c * 4);
  return l;
}
// The forward's workspace for hq, d: the temporaries of side kSdpaMaxBlock and the alignment
// slack (cuDNN's forward runs where its own workspace fits in what the temporaries leave, which at
// the largest side is that slack, usually 0 needed).
UPIPE_HD int64_t sdpa_fwd_workspace_bytes(int hq, int d) {
  return sdpa_fwd_layout(kSdpaMaxBlock, hq, d).end + kSdpaAlignSlack;
}
// The first side: the rows of the larger view rounded up to 64, at most kSdpaMaxBlock, halved (not
// below kSdpaMinBlock) until its temporaries fit the budget; 0 when none does.
UPIPE_HD int64_t sdpa_fwd_first_side(int64_t sq, int64_t sk, int hq, int d, int64_t budget) {
  int64_t c = min64(round_up(max64(sq, sk), 64), kSdpaMaxBlock);
  while (c > 0 && sdpa_fwd_layout(c, hq, d).end > budget) c = sdpa_bwd_next_side(c);
  return c;
}

}  // namespace upipe::cuda::attn
