// The CUDA attention's pure logic (backend/cuda/attention_plan.h) on the CPU, and the kernels
// themselves where a GPU is present.
//
// 1. Masking: key ranges, tile classes (skip / full / partial), the query rows a key tile may be
//    seen by and the keys a query tile sees, against cpu/attention_mask.h and the reference's
//    per-element visibility, on random document layouts (contiguous and zigzag lists, sub-views,
//    length-1 documents) and random position offsets; edge cases; the cost rule (tiles visited
//    follow the sum of squared document lengths); shared memory, workspace and bf16 rounding.
// 2. A host emulation of the three kernels' tile loops (the same tiles, visiting order, skip rule,
//    online-softmax and backward steps from attention_plan.h, the same FMA chain orders and the
//    warps' butterfly sum) against reference/attention_ref.h within the kernels' tolerance rule
//    (twice a same-precision naive baseline's error against fp64, plus 4 ulp), in normalised and
//    accumulate mode and key block by key block.
// 3. With a GPU (skipped with the reason otherwise): the kernels against the same rule and the CPU
//    backend, and the reduction-order contract (determinism, head subsets and query prefixes
//    bitwise).
#include <gtest/gtest.h>

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <ostream>
#include <random>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "backend/attention.h"
#include "backend/cpu/attention_mask.h"
#include "backend/cuda/attention_plan.h"
#include "backend/reference/attention_ref.h"
#include "common/test_util.h"

#if UPIPE_HAVE_CUDA
#include "backend/cuda/attention_cuda.h"
#include "backend/cuda/attention_cudnn.h"
#include "backend/cuda/elementwise_cuda.h"
#endif

namespace upipe {
namespace {

namespace attn = cuda::attn;
constexpr float kInf = std::numeric_limits<float>::infinity();

// ---- document layouts -------------------------------------------------------------------------

// The span list of the rows of a packed sequence (documents of lengths lens, document n has id
// 3 n + 7: any numbering both lists share) that a shard holds: runs [a, b) in order (one for a
// contiguous shard, two for zigzag), list rows numbered from 0.
std::vector<DocSpan> list_of(const std::vector<int64_t>& lens,
                             const std::vector<std::pair<int64_t, int64_t>>& runs) {
  std::vector<DocSpan> out;
  int64_t row = 0;
  for (const auto& [a, b] : runs) {
    int64_t start = 0;
    for (size_t n = 0; n < lens.size(); ++n) {
      const int64_t s = start, e = start + lens[n];
      start = e;
      const int64_t lo = std::max(s, a), hi = std::min(e, b);
      if (lo >= hi) continue;
      out.push_back({row, hi - lo, int64_t(3 * n + 7), lo - s});
      row += hi - lo;
    }
  }
  return out;
}

std::vector<cuda::DSpan> dspans_of(const std::vector<DocSpan>& s) {
  std::vector<cuda::DSpan> out;
  for (const DocSpan& x : s) out.push_back({x.row, x.rows, x.doc, x.pos});
  return out;
}

// The document and position of each of a view's n rows (list rows row0 ...); -1 outside the list.
void expand(const std::vector<DocSpan>& spans, int64_t row0, int64_t n, std::vector<int64_t>& doc,
            std::vector<int64_t>& pos) {
  doc.assign(size_t(n), -1);
  pos.assign(size_t(n), -1);
  for (const DocSpan& sp : spans)
    for (int64_t r = 0; r < sp.rows; ++r) {
      const int64_t i = sp.row + r - row0;
      if (i < 0 || i >= n) continue;
      doc[size_t(i)] = sp.doc;
      pos[size_t(i)] = sp.pos + r;
    }
}

// The visibility of one attention call: positions, or the span lists of q and k with the list rows
// of the views' row 0. Gives the plan's Mask, the CPU's AttnProblem (views without data: the mask
// functions read only the row counts) and the reference's per-element rule.
struct MaskCase {
  int64_t sq = 0, sk = 0, q_pos0 = 0, k_pos0 = 0;
  bool causal = true;
  std::vector<DocSpan> qs, ks;
  int64_t q_row0 = 0, k_row0 = 0;
  std::vector<cuda::DSpan> dqs, dks;
  ref::AttnDims dims;

  void finish() {
    dqs = dspans_of(qs);
    dks = dspans_of(ks);
    dims = ref::AttnDims{sq, sk, 1, 1, 1, q_pos0, k_pos0, causal};
    if (!qs.empty()) {
      expand(qs, q_row0, sq, dims.q_doc, dims.q_pos);
      expand(ks, k_row0, sk, dims.k_doc, dims.k_pos);
    }
  }
  attn::Mask mask() const {
    attn::Mask m;
    m.sq = sq;
    m.sk = sk;
    m.q_pos0 = q_pos0;
    m.k_pos0 = k_pos0;
    m.causal = causal;
    if (!qs.empty()) {
      m.q_docs = {dqs.data(), int64_t(dqs.size()), q_row0};
      m.k_docs = {dks.data(), int64_t(dks.size()), k_row0};
    }
    return m;
  }
  AttnProblem problem() const {
    AttnProblem p;
    p.q = Mat{nullptr, DType::kF32, sq, 1, 1};
    p.k = Mat{nullptr, DType::kF32, sk, 1, 1};
    p.v = p.k;
    p.hq = p.hk = p.d = 1;
    p.q_pos0 = q_pos0;
    p.k_pos0 = k_pos0;
    p.causal = causal;
    if (!qs.empty()) {
      p.q_docs = {qs.data(), int64_t(qs.size()), q_row0};
      p.k_docs = {ks.data(), int64_t(ks.size()), k_row0};
    }
    return p;
  }
  bool visible(int64_t i, int64_t j) const { return dims.visible(i, j); }
  std::string describe() const {
    std::string s = "sq=" + std::to_string(sq) + " sk=" + std::to_string(sk);
    if (qs.empty())
      return s + " q_pos0=" + std::to_string(q_pos0) + " k_pos0=" + std::to_string(k_pos0) +
             (causal ? " causal" : " full");
    return s + " q spans=" + std::to_string(qs.size()) + " row0=" + std::to_string(q_row0) +
           " k spans=" + std::to_string(ks.size()) + " row0=" + std::to_string(k_row0);
  }
};

int64_t uniform(std::mt19937_64& rng, int64_t lo, int64_t hi) {  // [lo, hi]
  return std::uniform_int_distribution<int64_t>(lo, hi)(rng);
}

// Runs of the sequence [0, S) a shard holds: the whole sequence, one range, or two (zigzag).
std::vector<std::pair<int64_t, int64_t>> random_runs(std::mt19937_64& rng, int64_t S) {
  switch (uniform(rng, 0, 2)) {
    case 0:
      return {{0, S}};
    case 1: {
      const int64_t a = uniform(rng, 0, S - 1);
      return {{a, uniform(rng, a + 1, S)}};
    }
    default: {
      if (S < 4) return {{0, S}};
      const int64_t a = uniform(rng, 0, S / 2 - 1), b = uniform(rng, a + 1, S / 2);
      const int64_t c = uniform(rng, b, S - 1);
      return {{a, b}, {c, uniform(rng, c + 1, S)}};
    }
  }
}

// Packed documents (a quarter of them of length 1), q and k lists of random shards of the
// sequence, views of random sub-ranges of the lists.
MaskCase random_docs_case(std::mt19937_64& rng) {
  const int64_t S = uniform(rng, 1, 420);
  std::vector<int64_t> lens;
  for (int64_t t = 0; t < S;) {
    const int64_t l = std::min(S - t, uniform(rng, 0, 3) == 0 ? 1 : uniform(rng, 1, 160));
    lens.push_back(l);
    t += l;
  }
  MaskCase c;
  c.qs = list_of(lens, random_runs(rng, S));
  c.ks = list_of(lens, random_runs(rng, S));
  auto rows_of = [](const std::vector<DocSpan>& l) { return l.back().row + l.back().rows; };
  const int64_t nq = rows_of(c.qs), nk = rows_of(c.ks);
  c.q_row0 = uniform(rng, 0, nq - 1);
  c.sq = uniform(rng, 1, nq - c.q_row0);
  c.k_row0 = uniform(rng, 0, nk - 1);
  c.sk = uniform(rng, 1, nk - c.k_row0);
  c.finish();
  return c;
}

MaskCase random_pos_case(std::mt19937_64& rng) {
  MaskCase c;
  c.sq = uniform(rng, 1, 330);
  c.sk = uniform(rng, 1, 330);
  c.q_pos0 = uniform(rng, 0, 400);
  c.k_pos0 = uniform(rng, 0, 400);
  c.causal = uniform(rng, 0, 4) != 0;
  c.finish();
  return c;
}

std::vector<MaskCase> random_cases(int n) {
  std::mt19937_64 rng(20240611);
  std::vector<MaskCase> v;
  for (int i = 0; i < n; ++i)
    v.push_back(i % 3 == 0 ? random_pos_case(rng) : random_docs_case(rng));
  return v;
}

// The tile shapes of every kernel and head-dim class.
std::vector<attn::Tiles> all_tiles() {
  return {attn::fwd_tiles(64), attn::fwd_tiles(256), attn::bwd_kv_tiles(64),
          attn::bwd_kv_tiles(256)};
}

// ---- 1. masking -------------------------------------------------------------------------------

TEST(CudaAttnPlan, KeyRangesAreTheCpuRangesAndExactlyTheVisibleKeys) {
  for (const MaskCase& c : random_cases(240)) {
    const attn::Mask m = c.mask();
    std::vector<int64_t> lo(size_t(c.sq)), hi(size_t(c.sq));
    cpu::key_ranges(c.problem(), 0, c.sq, lo.data(), hi.data());
    for (int64_t i = 0; i < c.sq; ++i) {
      const attn::Range r = attn::key_range(m, i);
      ASSERT_EQ(r.first, lo[size_t(i)]) << c.describe() << " row " << i;
      ASSERT_EQ(r.end, hi[size_t(i)]) << c.describe() << " row " << i;
      for (int64_t j = 0; j < c.sk; ++j)
        ASSERT_EQ(c.visible(i, j), j >= r.first && j < r.end)
            << c.describe() << " row " << i << " key " << j;
      if (i > 0) {  // both ends never decrease: what the tile decisions rely on
        const attn::Range p = attn::key_range(m, i - 1);
        ASSERT_LE(p.first, r.first) << c.describe();
        ASSERT_LE(p.end, r.end) << c.describe();
      }
    }
  }
}

TEST(CudaAttnPlan, TileClassesAreThoseOfTheVisiblePairs) {
  int64_t kinds[3] = {0, 0, 0};
  for (const MaskCase& c : random_cases(120)) {
    const attn::Mask m = c.mask();
    for (const attn::Tiles& t : all_tiles())
      for (int64_t i0 = 0; i0 < c.sq; i0 += t.bq)
        for (int64_t j0 = 0; j0 < c.sk; j0 += t.bk) {
          bool any = false, all = true;
          for (int64_t i = i0; i < std::min(c.sq, i0 + t.bq); ++i)
            for (int64_t j = j0; j < std::min(c.sk, j0 + t.bk); ++j) {
              const bool v = c.visible(i, j);
              any = any || v;
              all = all && v;
            }
          const attn::TileKind want = !any  ? attn::TileKind::kSkip
                                      : all ? attn::TileKind::kFull
                                            : attn::TileKind::kPartial;
          const attn::TileKind got = attn::classify(m, i0, t.bq, j0, t.bk);
          ASSERT_EQ(int(got), int(want)) << c.describe() << " tile " << i0 << "," << j0;
          ++kinds[int(got)];
        }
  }
  // The random layouts reach every class.
  EXPECT_GT(kinds[0], 0);
  EXPECT_GT(kinds[1], 0);
  EXPECT_GT(kinds[2], 0);
}

TEST(CudaAttnPlan, QueryRowsAreTheCpuRowsAndHoldEverySeeingRow) {
  for (const MaskCase& c : random_cases(200)) {
    const attn::Mask m = c.mask();
    const AttnProblem p = c.problem();
    for (const attn::Tiles& t : {attn::bwd_kv_tiles(64), attn::bwd_kv_tiles(256)})
      for (int64_t j0 = 0; j0 < c.sk; j0 += t.bk) {
        const int64_t n = std::min(t.bk, c.sk - j0);
        const attn::Range r = attn::query_rows(m, j0, n);
        const cpu::RowRange want = cpu::query_rows(p, j0, n);
        ASSERT_EQ(r.first, want.first) << c.describe() << " key tile " << j0;
        ASSERT_EQ(r.end, want.end) << c.describe() << " key tile " << j0;
        for (int64_t i = 0; i < c.sq; ++i)
          for (int64_t j = j0; j < j0 + n; ++j)
            if (c.visible(i, j)) {
              ASSERT_TRUE(i >= r.first && i < r.end) << c.describe() << " row " << i;
            }
      }
  }
}

// bwd_kv_kernel's block search (attn::search_round, emulated by first_true_in_rounds) finds what
// binary search finds, for every answer position, length and thread count, in at most
// ceil(log_threads(n)) + 1 rounds; and on the document masks, query_rows's two predicates.
TEST(CudaAttnPlan, BlockSearchFindsWhatBinarySearchFinds) {
  for (const int threads : {2, 3, 7, 32, attn::kThreads})
    for (const int64_t n :
         {int64_t(0), int64_t(1), int64_t(2), int64_t(5), int64_t(255), int64_t(256), int64_t(257),
          int64_t(1000), int64_t(65537), int64_t(1) << 20}) {
      int max_rounds = 1;
      for (int64_t c = 1; c < n; c *= threads) ++max_rounds;
      for (int64_t a = 0; a <= n; a += std::max<int64_t>(1, n / 97)) {
        for (const int64_t at : {a, std::min(n, a + 1), n}) {
          const auto pred = [at](int64_t i) { return i >= at; };
          int rounds = 0;
          ASSERT_EQ(attn::first_true_in_rounds(0, n, threads, pred, &rounds), at)
              << threads << " threads, n " << n;
          ASSERT_EQ(attn::first_true(0, n, pred), at);
          ASSERT_LE(rounds, max_rounds) << threads << " threads, n " << n << ", answer " << at;
        }
      }
    }
  for (const MaskCase& c : random_cases(200)) {
    const attn::Mask m = c.mask();
    if (!m.documents()) continue;
    for (int64_t j = 0; j <= c.sk; j += 7) {
      const attn::KeysEndPast ends{&m, j};
      const attn::KeysStartAtOrPast starts{&m, j};
      ASSERT_EQ(attn::first_true_in_rounds(0, c.sq, attn::kThreads, ends),
                attn::first_true(0, c.sq, ends))
          << c.describe() << " key " << j;
      ASSERT_EQ(attn::first_true_in_rounds(0, c.sq, attn::kThreads, starts),
                attn::first_true(0, c.sq, starts))
          << c.describe() << " key " << j;
      ASSERT_EQ(attn::first_true_in_rounds(0, c.sq, 3, starts), attn::first_true(0, c.sq, starts))
          << c.describe() << " key " << j;
    }
  }
}

TEST(CudaAttnPlan, KeysSeenAreTheCpuKeysOfEachQueryTile) {
  for (const MaskCase& c : random_cases(200)) {
    const attn::Mask m = c.mask();
    for (const attn::Tiles& t : {attn::fwd_tiles(64), attn::fwd_tiles(256)})
      for (int64_t i0 = 0; i0 < c.sq; i0 += t.bq) {
        // The kernels' arrays: bq entries, rows past the view empty.
        std::vector<int64_t> lo(size_t(t.bq), 0), hi(size_t(t.bq), 0);
        const int64_t n = std::min(t.bq, c.sq - i0);
        for (int64_t r = 0; r < n; ++r) {
          const attn::Range kr = attn::key_range(m, i0 + r);
          lo[size_t(r)] = kr.first;
          hi[size_t(r)] = kr.end;
        }
        std::vector<int64_t> clo(static_cast<size_t>(n)), chi(static_cast<size_t>(n));
        cpu::key_ranges(c.problem(), i0, n, clo.data(), chi.data());
        const cpu::RowRange want = cpu::keys_seen(clo.data(), chi.data(), n);
        const attn::Range got = attn::keys_seen(lo.data(), hi.data(), t.bq);
        ASSERT_EQ(got.first, want.first) << c.describe();
        ASSERT_EQ(got.end, want.end) << c.describe();
        // Every visible key lies in the visited key tiles.
        for (int64_t i = i0; i < i0 + n; ++i)
          for (int64_t j = 0; j < c.sk; ++j)
            if (c.visible(i, j)) {
              ASSERT_TRUE(j >= attn::tile_floor(got.first, t.bk) && j < got.end) << c.describe();
            }
      }
  }
}

TEST(CudaAttnPlan, TileColumnsAreTheRowsVisibleKeysInTheTile) {
  for (const MaskCase& c : random_cases(90)) {
    const attn::Mask m = c.mask();
    for (int64_t i = 0; i < c.sq; ++i)
      for (int64_t j0 = 0; j0 < c.sk; j0 += attn::kLaneTile) {
        const int64_t bk = std::min<int64_t>(attn::kLaneTile, c.sk - j0);
        const attn::Range tc = attn::tile_cols(attn::key_range(m, i), j0, bk);
        for (int64_t x = 0; x < bk; ++x)
          ASSERT_EQ(c.visible(i, j0 + x), x >= tc.first && x < tc.end) << c.describe();
      }
  }
}

MaskCase docs_case(const std::vector<int64_t>& lens) {
  MaskCase c;
  int64_t S = 0;
  for (int64_t l : lens) S += l;
  c.qs = c.ks = list_of(lens, {{0, S}});
  c.sq = c.sk = S;
  c.finish();
  return c;
}

TEST(CudaAttnPlan, EdgeCases) {
  {  // Documents of length 1: each row sees itself only.
    const MaskCase c = docs_case(std::vector<int64_t>(100, 1));
    for (int64_t i = 0; i < c.sq; ++i) {
      const attn::Range r = attn::key_range(c.mask(), i);
      EXPECT_EQ(r.first, i);
      EXPECT_EQ(r.end, i + 1);
    }
    EXPECT_EQ(int(attn::classify(c.mask(), 0, 64, 0, 64)), int(attn::TileKind::kPartial));
    EXPECT_EQ(int(attn::classify(c.mask(), 64, 64, 0, 64)), int(attn::TileKind::kSkip));
  }
  {  // A key block entirely in the future: no row sees anything.
    MaskCase c;
    c.sq = 130;
    c.sk = 140;
    c.k_pos0 = 130;
    c.finish();
    std::vector<int64_t> lo(64), hi(64);
    for (int64_t i0 = 0; i0 < c.sq; i0 += 64) {
      for (int64_t r = 0; r < 64; ++r) {
        const attn::Range kr =
            i0 + r < c.sq ? attn::key_range(c.mask(), i0 + r) : attn::Range{0, 0};
        EXPECT_TRUE(kr.empty());
        lo[size_t(r)] = kr.first;
        hi[size_t(r)] = kr.end;
      }
      EXPECT_TRUE(attn::keys_seen(lo.data(), hi.data(), 64).empty());
      for (int64_t j0 = 0; j0 < c.sk; j0 += 64)
        EXPECT_EQ(int(attn::classify(c.mask(), i0, 64, j0, 64)), int(attn::TileKind::kSkip));
    }
    for (int64_t j0 = 0; j0 < c.sk; j0 += 32)
      EXPECT_TRUE(attn::query_rows(c.mask(), j0, 32).empty());
  }
  {  // Partly in the future: the first 10 rows see nothing, the last row every key.
    MaskCase c;
    c.sq = 100;
    c.sk = 90;
    c.k_pos0 = 10;
    c.finish();
    EXPECT_TRUE(attn::key_range(c.mask(), 9).empty());
    EXPECT_EQ(attn::key_range(c.mask(), 10).end, 1);
    EXPECT_EQ(attn::key_range(c.mask(), 99).end, 90);
    EXPECT_EQ(attn::query_rows(c.mask(), 0, 32).first, 10);
  }
  {  // The query rows' documents have no key in the key list (another shard's documents).
    const std::vector<int64_t> lens = {50, 50, 50};
    MaskCase c;
    c.qs = list_of(lens, {{100, 150}});
    c.ks = list_of(lens, {{0, 100}});
    c.sq = 50;
    c.sk = 100;
    c.finish();
    for (int64_t i = 0; i < c.sq; ++i) {
      const attn::Range r = attn::key_range(c.mask(), i);
      EXPECT_TRUE(r.empty());
      EXPECT_EQ(r.first, 100);  // where such keys would be: past the list
    }
    EXPECT_TRUE(attn::query_rows(c.mask(), 0, 64).empty());
  }
  {  // Not causal: every tile is full.
    MaskCase c;
    c.sq = 100;
    c.sk = 70;
    c.causal = false;
    c.finish();
    EXPECT_EQ(int(attn::classify(c.mask(), 64, 64, 64, 64)), int(attn::TileKind::kFull));
    EXPECT_EQ(attn::query_rows(c.mask(), 64, 6).first, 0);
  }
}

// The forward visits (query tile, key tile) pairs in proportion to the sum of squared document
// lengths, not S^2: 8 documents of 2 tiles each visit 3 tiles per document.
TEST(CudaAttnPlan, VisitedTilesFollowTheSumOfSquaredLengths) {
  const MaskCase c = docs_case(std::vector<int64_t>(8, 128));
  const attn::Tiles t = attn::fwd_tiles(64);
  ASSERT_EQ(t.bq, 64);
  ASSERT_EQ(t.bk, 64);
  int64_t kinds[3] = {0, 0, 0};
  for (int64_t i0 = 0; i0 < c.sq; i0 += t.bq)
    for (int64_t j0 = 0; j0 < c.sk; j0 += t.bk)
      ++kinds[int(attn::classify(c.mask(), i0, t.bq, j0, t.bk))];
  EXPECT_EQ(kinds[int(attn::TileKind::kFull)], 8);
  EXPECT_EQ(kinds[int(attn::TileKind::kPartial)], 16);
  EXPECT_EQ(kinds[int(attn::TileKind::kSkip)], 256 - 24);
}

TEST(CudaAttnPlan, SharedMemoryFitsAndWorkspaceIsZeroWithoutCudnn) {
  for (int d = 1; d <= attn::kMaxDim; ++d) {
    for (cuda::DT t : {cuda::DT::kF32, cuda::DT::kBF16})
      for (bool docs : {false, true}) {
        EXPECT_TRUE(attn::supports(d, t, docs));
        EXPECT_EQ(attn::fwd_workspace_bytes(8, 2, d, t, docs, false), 0);
        EXPECT_EQ(attn::bwd_workspace_bytes(8, 2, d, t, docs, false), 0);
        // With cuDNN: its backward's workspace for every bf16 call of a d it may take (with
        // documents too, so formulas need not know which calls have them).
        const bool sdpa = t == cuda::DT::kBF16 && d % 8 == 0;
        EXPECT_EQ(attn::bwd_workspace_bytes(8, 2, d, t, docs, true),
                  sdpa ? attn::sdpa_bwd_workspace_bytes(8, 2, d) : 0)
            << d;
        EXPECT_EQ(attn::fwd_workspace_bytes(8, 2, d, t, docs, true),
                  sdpa ? attn::sdpa_fwd_workspace_bytes(8, d) : 0)
            << d;
      }
    EXPECT_LE(attn::fwd_smem_bytes(d), attn::kMaxSmemBytes) << d;
    EXPECT_LE(attn::bwd_q_smem_bytes(d), attn::kMaxSmemBytes) << d;
    EXPECT_LE(attn::bwd_kv_smem_bytes(d), attn::kMaxSmemBytes) << d;
    // Rows read one per lane as float4: 16-byte aligned, and (ld / 4) odd so a quarter warp's
    // 8 rows start in 8 distinct 4-bank groups.
    EXPECT_EQ(attn::ld_lane(d) % 4, 0);
    EXPECT_EQ(attn::ld_lane(d) / 4 % 2, 1);
    EXPECT_EQ(attn::ld_bcast(d) % 4, 0);
    EXPECT_GE(attn::ld_bcast(d), d);
    // Accumulators: columns lane + 32 t, t < cols_per_lane, cover the head.
    EXPECT_GE(32 * attn::cols_per_lane(d), d);
  }
  EXPECT_FALSE(attn::supports(0, cuda::DT::kF32, false));
  EXPECT_FALSE(attn::supports(attn::kMaxDim + 1, cuda::DT::kF32, false));
  // The lanes hold 2 rows (or keys) each of every 64-side, warps the other side.
  for (int d : {64, 128, 256}) {
    EXPECT_EQ(attn::fwd_tiles(d).bk, 2 * 32);
    EXPECT_EQ(attn::bwd_kv_tiles(d).bq, 2 * 32);
    EXPECT_EQ(attn::fwd_tiles(d).bq, attn::kWarps * attn::rows_per_warp(attn::cols_per_lane(d)));
  }
}

TEST(CudaAttnPlan, Bf16RoundingIsCoreRounding) {
  std::mt19937_64 rng(7);
  std::vector<float> xs = {0.0f,
                           -0.0f,
                           1.0f,
                           -1.0f,
                           kInf,
                           -kInf,
                           std::numeric_limits<float>::quiet_NaN(),
                           std::numeric_limits<float>::denorm_min(),
                           3.0e38f,
                           1.00390625f,
                           1.01171875f};
  for (int i = 0; i < 100000; ++i) {
    const uint32_t u = uint32_t(rng());
    float f;
    std::memcpy(&f, &u, 4);
    xs.push_back(f);
  }
  for (float x : xs) {
    ASSERT_EQ(attn::to_bf16(x), f32_to_bf16(x)) << x;
    const uint16_t h = f32_to_bf16(x);
    const float a = attn::from_bf16(h), b = bf16_to_f32(h);
    ASSERT_EQ(std::memcmp(&a, &b, 4), 0);
  }
}

// cuDNN's BHSD view of a strided (rows, heads*d) view addresses the same elements, and the three
// masks it is given are exactly the reference's visibility on the calls sdpa_plan takes.
TEST(CudaAttnPlan, SdpaPlanLayoutAndMasks) {
  void* const at = reinterpret_cast<void*>(uintptr_t(1) << 20);  // 16-byte aligned, never read
  auto view = [&](int64_t rows, int64_t cols, int64_t ld, cuda::DT t = cuda::DT::kBF16) {
    return cuda::DView{at, t, rows, cols, ld};
  };
  const int hq = 4, hk = 2, d = 64;
  const cuda::DView q = view(100, hq * d, 264), k = view(90, hk * d, 136),
                    v = view(90, hk * d, 128), o = view(100, hq * d, 256),
                    lse = view(hq, 100, 100, cuda::DT::kF32);
  const attn::SdpaPlan p = attn::sdpa_plan(q, k, v, o, lse, hq, hk, d, 0, 0, true, false);
  ASSERT_TRUE(p.use) << p.why_not;
  EXPECT_EQ(int(p.mask), int(attn::SdpaMask::kTopLeft));
  const attn::Bhsd want_q{{1, hq, 100, d}, {100 * 264, d, 264, 1}};
  for (int i = 0; i < 4; ++i) {
    EXPECT_EQ(p.q.dim[i], want_q.dim[i]);
    EXPECT_EQ(p.q.stride[i], want_q.stride[i]);
  }
  // Element (0, h, r, e) of each BHSD tensor is element (r, h*d + e) of its view; stats (0, h, i,
  // 0) is lse (h, i).
  std::mt19937_64 rng(3);
  for (int n = 0; n < 1000; ++n) {
    for (const auto& [t, x, heads] : {std::tuple{p.q, q, hq}, std::tuple{p.k, k, hk},
                                      std::tuple{p.v, v, hk}, std::tuple{p.o, o, hq}}) {
      const int64_t h = uniform(rng, 0, heads - 1), r = uniform(rng, 0, x.rows - 1),
                    e = uniform(rng, 0, d - 1);
      ASSERT_EQ(t.dim[0], 1);
      ASSERT_EQ(t.dim[1], heads);
      ASSERT_EQ(t.dim[2], x.rows);
      ASSERT_EQ(t.dim[3], d);
      ASSERT_EQ(h * t.stride[1] + r * t.stride[2] + e * t.stride[3], r * x.ld + h * d + e);
    }
    const int64_t h = uniform(rng, 0, hq - 1), i = uniform(rng, 0, 99);
    ASSERT_EQ(h * p.stats.stride[1] + i * p.stats.stride[2], h * lse.ld + i);
  }
  EXPECT_EQ(p.stats.dim[1], hq);
  EXPECT_EQ(p.stats.dim[2], 100);
  EXPECT_EQ(p.stats.dim[3], 1);

  // Masks against the reference, on random shapes and offsets; all three are reached.
  int64_t used[3] = {0, 0, 0};
  for (int n = 0; n < 3000; ++n) {
    MaskCase c;
    c.sq = uniform(rng, 1, 70);
    c.sk = uniform(rng, 1, 70);
    c.causal = uniform(rng, 0, 3) != 0;
    c.q_pos0 = uniform(rng, 0, 100);
    switch (uniform(rng, 0, 3)) {  // the offsets that map, and any
      case 0:
        c.k_pos0 = c.q_pos0;
        break;
      case 1:
        c.k_pos0 = c.q_pos0 - (c.sk - c.sq);
        break;
      case 2:
        c.k_pos0 = c.q_pos0 - uniform(rng, c.sk - 1, c.sk + 5);
        break;
      default:
        c.k_pos0 = uniform(rng, 0, 100);
    }
    c.finish();
    const attn::SdpaPlan s = attn::sdpa_plan(view(c.sq, d, d), view(c.sk, d, d), view(c.sk, d, d),
                                             view(c.sq, d, d), view(1, c.sq, c.sq, cuda::DT::kF32),
                                             1, 1, d, c.q_pos0, c.k_pos0, c.causal, false);
    if (!s.use) {
      // Only causal calls with another offset are left to the flash kernels.
      ASSERT_TRUE(c.causal) << c.describe();
      continue;
    }
    ++used[int(s.mask)];
    for (int64_t i = 0; i < c.sq; ++i) {
      bool any = false;
      for (int64_t j = 0; j < c.sk; ++j) {
        const bool m = s.mask == attn::SdpaMask::kNone      ? true
                       : s.mask == attn::SdpaMask::kTopLeft ? j <= i
                                                            : j <= i + c.sk - c.sq;
        ASSERT_EQ(m, c.visible(i, j)) << c.describe() << " " << i << "," << j;
        any = any || m;
      }
      ASSERT_TRUE(any) << c.describe() << " row " << i;  // cuDNN never sees an empty row
    }
  }
  EXPECT_GT(used[0], 0);
  EXPECT_GT(used[1], 0);
  EXPECT_GT(used[2], 0);

  // What stays on the flash kernels.
  auto plan = [&](cuda::DView qq, cuda::DView oo, cuda::DView ll, int dd, int64_t qp, bool docs) {
    return attn::sdpa_plan(qq, k, v, oo, ll, hq, hk, dd, qp, 0, true, docs).use;
  };
  EXPECT_TRUE(plan(q, o, lse, d, 0, false));
  EXPECT_FALSE(plan(q, o, lse, d, 0, true));                                        // documents
  EXPECT_FALSE(plan(view(100, hq * d, 264, cuda::DT::kF32), o, lse, d, 0, false));  // fp32
  EXPECT_FALSE(plan(q, o, lse, 60, 0, false));                                      // d % 8
  EXPECT_FALSE(plan(view(100, hq * d, 260), o, lse, d, 0, false));                  // ld % 8
  EXPECT_FALSE(plan(q, o, view(hq, 100, 101, cuda::DT::kF32), d, 0, false));        // lse strided
  EXPECT_FALSE(plan(q, o, lse, d, 7, false));                                       // offset 7
  cuda::DView odd = o;
  odd.data = static_cast<char*>(at) + 2;
  EXPECT_FALSE(plan(q, odd, lse, d, 0, false));  // misaligned
}

// A block mask's visibility: key j of the block seen by row i.
bool sdpa_sees(attn::SdpaMask m, int64_t i, int64_t j, int64_t rows, int64_t keys) {
  return m == attn::SdpaMask::kNone      ? true
         : m == attn::SdpaMask::kTopLeft ? j <= i
                                         : j <= i + keys - rows;
}

// Every (causal, shift, rows, keys) of a block: skipped exactly when no row sees a key of it;
// mapped to a mask exactly when one of cuDNN's three masks is its visibility with no empty row.
TEST(CudaAttnPlan, SdpaBlockMaskIsTheBlocksVisibility) {
  int outcomes[3] = {0, 0, 0};  // skipped, mapped, left to the flash kernels
  for (bool causal : {true, false})
    for (int64_t rows = 1; rows <= 9; ++rows)
      for (int64_t keys = 1; keys <= 9; ++keys)
        for (int64_t shift = -12; shift <= 12; ++shift) {
          auto truth = [&](int64_t i, int64_t j) { return !causal || j <= shift + i; };
          bool any = false, every_row = true;
          for (int64_t i = 0; i < rows; ++i) {
            bool row_any = false;
            for (int64_t j = 0; j < keys; ++j) row_any = row_any || truth(i, j);
            any = any || row_any;
            every_row = every_row && row_any;
          }
          const attn::SdpaBlockMask m = attn::sdpa_block_mask(causal, shift, rows, keys);
          const std::string at =
              fmt::format("causal {} shift {} rows {} keys {}", causal, shift, rows, keys);
          ASSERT_EQ(m.skip, !any) << at;
          ASSERT_FALSE(m.skip && m.mapped) << at;
          // Which of the three masks is the truth (with every row seeing a key).
          bool fits[3] = {false, false, false};
          for (int k = 0; k < 3; ++k) {
            bool same = every_row;
            for (int64_t i = 0; i < rows && same; ++i)
              for (int64_t j = 0; j < keys && same; ++j)
                same = sdpa_sees(attn::SdpaMask(k), i, j, rows, keys) == truth(i, j);
            fits[k] = same;
          }
          if (m.mapped) {
            ASSERT_TRUE(fits[int(m.mask)]) << at;
          } else if (!m.skip) {
            ASSERT_FALSE(fits[0] || fits[1] || fits[2]) << at << ": a mask would have fit";
          }
          ++outcomes[m.skip ? 0 : (m.mapped ? 1 : 2)];
        }
  EXPECT_GT(outcomes[0], 0);
  EXPECT_GT(outcomes[1], 0);
  EXPECT_GT(outcomes[2], 0);
}

// The blocks of a call cover each visible (query, key) pair of it exactly once through their
// masks, skip only invisible pairs, come query block by query block, and the call is refused
// exactly when some block has no mask.
TEST(CudaAttnPlan, SdpaBlocksCoverEveryVisiblePairOnce) {
  std::mt19937_64 rng(11);
  int taken = 0, refused = 0, multi = 0;
  for (int n = 0; n < 4000; ++n) {
    const int64_t sq = uniform(rng, 1, 40), sk = uniform(rng, 1, 40), c = uniform(rng, 1, 24);
    const bool causal = uniform(rng, 0, 5) != 0;
    const int64_t q_pos0 = uniform(rng, 0, 60);
    int64_t k_pos0;
    switch (uniform(rng, 0, 3)) {  // offsets that are multiples of c, the bottom-right one, any
      case 0:
        k_pos0 = q_pos0 - c * uniform(rng, -2, 2);
        break;
      case 1:
        k_pos0 = q_pos0 - (sk - sq);
        break;
      default:
        k_pos0 = uniform(rng, 0, 60);
    }
    const std::string at =
        fmt::format("sq {} sk {} pos {}/{} causal {} c {}", sq, sk, q_pos0, k_pos0, causal, c);
    std::vector<int> covered(size_t(sq * sk), 0);
    int64_t last_q0 = -1, last_k0 = -1, blocks = 0;
    const bool ok =
        attn::for_each_sdpa_block(sq, sk, q_pos0, k_pos0, causal, c, [&](const attn::SdpaBlock& b) {
          ASSERT_TRUE(b.q0 > last_q0 || (b.q0 == last_q0 && b.k0 > last_k0)) << at;
          last_q0 = b.q0;
          last_k0 = b.k0;
          ASSERT_EQ(b.q0 % c, 0);
          ASSERT_EQ(b.k0 % c, 0);
          ASSERT_EQ(b.rows, std::min(c, sq - b.q0));
          ASSERT_EQ(b.keys, std::min(c, sk - b.k0));
          ++blocks;
          for (int64_t i = 0; i < b.rows; ++i)
            for (int64_t j = 0; j < b.keys; ++j)
              if (sdpa_sees(b.mask, i, j, b.rows, b.keys))
                ++covered[size_t((b.q0 + i) * sk + b.k0 + j)];
        });
    // Whether some block has no mask, straight from the definition.
    bool unmapped = false;
    for (int64_t i0 = 0; i0 < sq; i0 += c)
      for (int64_t j0 = 0; j0 < sk; j0 += c) {
        const attn::SdpaBlockMask m = attn::sdpa_block_mask(
            causal, q_pos0 + i0 - (k_pos0 + j0), std::min(c, sq - i0), std::min(c, sk - j0));
        unmapped = unmapped || (!m.skip && !m.mapped);
      }
    ASSERT_EQ(ok, !unmapped) << at;
    if (!ok) {
      ASSERT_EQ(blocks, 0) << at << ": a refused call ran blocks";
      ++refused;
      continue;
    }
    ++taken;
    multi += blocks > 1;
    for (int64_t i = 0; i < sq; ++i)
      for (int64_t j = 0; j < sk; ++j) {
        const bool vis = !causal || k_pos0 + j <= q_pos0 + i;
        ASSERT_EQ(covered[size_t(i * sk + j)], vis ? 1 : 0) << at << " pair " << i << "," << j;
      }
  }
  EXPECT_GT(taken, 1000);
  EXPECT_GT(refused, 100);
  EXPECT_GT(multi, 500);
}

// The backward's workspace: the temporaries in order, 256-byte aligned, each as large as its
// tensor; with the workspace of the heads, every call is cut at min(rows, kSdpaMaxBlock) whatever
// its heads; with less, the first side fits and the one before it in the halving would not.
TEST(CudaAttnPlan, SdpaBackwardWorkspaceLayoutAndSides) {
  std::mt19937_64 rng(5);
  for (int d : {64, 128, 256})
    for (int hq : {1, 2, 4, 8, 16, 32, 64})
      for (int hk : {1, hq / 4, hq}) {
        if (hk < 1 || hq % hk != 0) continue;
        for (int64_t c : {int64_t(64), int64_t(256), int64_t(1000), attn::kSdpaMaxBlock}) {
          const attn::SdpaBwdLayout l = attn::sdpa_bwd_layout(c, hq, hk, d);
          EXPECT_EQ(l.dq, 0);
          for (int64_t off : {l.dk, l.dv, l.stats, l.cudnn}) EXPECT_EQ(off % 256, 0);
          EXPECT_GE(l.dk - l.dq, c * hq * d * 2);
          EXPECT_GE(l.dv - l.dk, c * hk * d * 2);
          EXPECT_GE(l.stats - l.dv, c * hk * d * 2);
          EXPECT_GE(l.cudnn - l.stats, int64_t(hq) * c * 4);
          EXPECT_LT(l.cudnn - l.stats, int64_t(hq) * c * 4 + 256);
          // The guess holds cuDNN's deterministic dP (hq x c x c bf16) at least.
          EXPECT_GE(attn::sdpa_bwd_cudnn_guess(c, hq, hk, d), int64_t(hq) * c * c * 2);
        }
        const int64_t ws = attn::sdpa_bwd_workspace_bytes(hq, hk, d);
        EXPECT_EQ(ws, attn::sdpa_bwd_layout(attn::kSdpaMaxBlock, hq, hk, d).cudnn +
                          attn::sdpa_bwd_cudnn_guess(attn::kSdpaMaxBlock, hq, hk, d) +
                          attn::kSdpaAlignSlack);
        for (int64_t s :
             {int64_t(1), int64_t(200), int64_t(4096), int64_t(5000), int64_t(1) << 20}) {
          const std::string at = fmt::format("s {} hq {} hk {} d {}", s, hq, hk, d);
          const int64_t whole = std::min((s + 63) / 64 * 64, attn::kSdpaMaxBlock);
          EXPECT_EQ(attn::sdpa_bwd_first_side(s, s, hq, hk, d, ws), whole) << at;
          // Also after the worst alignment loss (a 64-byte aligned arena block moved to 256).
          EXPECT_EQ(attn::sdpa_bwd_first_side(s, s, hq, hk, d, ws - 192), whole) << at;
          // A smaller workspace: the side halves until it fits.
          const int64_t budget = uniform(rng, ws / 64, ws);
          const int64_t c = attn::sdpa_bwd_first_side(s, s, hq, hk, d, budget);
          if (c == 0) {
            EXPECT_FALSE(
                attn::sdpa_bwd_fits(std::min(whole, attn::kSdpaMinBlock), hq, hk, d, budget))
                << at;
            continue;
          }
          EXPECT_EQ(c % 64, 0) << at;
          EXPECT_LE(c, whole) << at;
          EXPECT_TRUE(attn::sdpa_bwd_fits(c, hq, hk, d, budget)) << at;
          if (c < whole) {  // 2c is at least the side tried before c, which did not fit
            EXPECT_FALSE(attn::sdpa_bwd_fits(std::min(whole, 2 * c), hq, hk, d, budget)) << at;
          }
        }
      }
  // The accumulate-mode forward: o (c, hq*d) bf16 then lse (hq, c) fp32, aligned; with its heads'
  // workspace every call is cut at min(rows, kSdpaMaxBlock); with less, the side halves.
  for (int d : {64, 128, 256})
    for (int hq : {1, 3, 8, 32}) {
      for (int64_t c : {int64_t(64), int64_t(1000), attn::kSdpaMaxBlock}) {
        const attn::SdpaFwdLayout l = attn::sdpa_fwd_layout(c, hq, d);
        EXPECT_EQ(l.o, 0);
        EXPECT_EQ(l.lse % 256, 0);
        EXPECT_EQ(l.end % 256, 0);
        EXPECT_GE(l.lse - l.o, c * hq * d * 2);
        EXPECT_GE(l.end - l.lse, int64_t(hq) * c * 4);
        EXPECT_LT(l.end - l.lse, int64_t(hq) * c * 4 + 256);
      }
      const int64_t ws = attn::sdpa_fwd_workspace_bytes(hq, d);
      EXPECT_EQ(ws, attn::sdpa_fwd_layout(attn::kSdpaMaxBlock, hq, d).end + attn::kSdpaAlignSlack);
      for (int64_t s : {int64_t(1), int64_t(300), int64_t(4096), int64_t(1) << 20}) {
        const int64_t whole = std::min((s + 63) / 64 * 64, attn::kSdpaMaxBlock);
        EXPECT_EQ(attn::sdpa_fwd_first_side(s, s / 2 + 1, hq, d, ws), whole) << s;
        EXPECT_EQ(attn::sdpa_fwd_first_side(s, s, hq, d, ws - 192), whole) << s;
        // One byte less than the whole side's temporaries: the next side, which fits.
        const int64_t tight = attn::sdpa_fwd_layout(whole, hq, d).end - 1;
        const int64_t c = attn::sdpa_fwd_first_side(s, s, hq, d, tight);
        if (whole <= attn::kSdpaMinBlock) {
          EXPECT_EQ(c, 0) << s;
          continue;
        }
        EXPECT_EQ(c, attn::sdpa_bwd_next_side(whole)) << s;
        EXPECT_LE(attn::sdpa_fwd_layout(c, hq, d).end, tight) << s;
      }
    }
  EXPECT_EQ(attn::sdpa_fwd_first_side(4096, 4096, 8, 128, 1 << 10), 0);

  // Sides go down by halves to kSdpaMinBlock, then stop; a budget below the smallest gives 0.
  EXPECT_EQ(attn::sdpa_bwd_next_side(4096), 2048);
  EXPECT_EQ(attn::sdpa_bwd_next_side(640), 320);
  EXPECT_EQ(attn::sdpa_bwd_next_side(300), attn::kSdpaMinBlock);
  EXPECT_EQ(attn::sdpa_bwd_next_side(attn::kSdpaMinBlock), 0);
  EXPECT_EQ(attn::sdpa_bwd_first_side(4096, 4096, 8, 8, 128, 1 << 20), 0);
  // A small call is one block of its own size, below the smallest side.
  EXPECT_EQ(
      attn::sdpa_bwd_first_side(100, 70, 8, 8, 128, attn::sdpa_bwd_workspace_bytes(8, 8, 128)),
      128);
}

// Which backward calls may go to cuDNN at all (before masks and cuDNN's own check).
TEST(CudaAttnPlan, SdpaBackwardConditions) {
  void* const at = reinterpret_cast<void*>(uintptr_t(1) << 20);
  auto view = [&](int64_t rows, int64_t cols, int64_t ld, cuda::DT t = cuda::DT::kBF16) {
    return cuda::DView{at, t, rows, cols, ld};
  };
  const int d = 64;
  const cuda::DView q = view(100, 4 * d, 264), k = view(90, 2 * d, 136), o = view(100, 4 * d, 256);
  auto why = [&](cuda::DView qq, cuda::DView oo, cuda::DView dd, int hd, bool docs) {
    const char* w = attn::sdpa_bwd_why_not(qq, k, k, oo, dd, hd, docs);
    return std::string(w ? w : "");
  };
  EXPECT_EQ(why(q, o, q, d, false), "");
  EXPECT_EQ(why(q, o, q, d, true), "documents");
  EXPECT_EQ(why(q, cuda::DView{}, q, d, false), "no o");
  EXPECT_EQ(why(view(100, 4 * d, 264, cuda::DT::kF32), o, q, d, false), "not bf16");
  EXPECT_EQ(why(q, o, q, 60, false), "d not a multiple of 8 up to 256");
  EXPECT_EQ(why(q, o, view(100, 4 * d, 260), d, false), "rows not 16-byte aligned");
  cuda::DView odd = o;
  odd.data = static_cast<char*>(at) + 2;
  EXPECT_EQ(why(q, odd, q, d, false), "rows not 16-byte aligned");
}

// ---- problems with data -----------------------------------------------------------------------

// A host matrix stored in dtype t with row stride cols + pad; the padding holds NaN (bf16 and fp32
// alike: the words are 0x7fc07fc0), so reading it would show.
struct HostMat {
  std::vector<uint32_t> words;
  Mat m;
  HostMat() = default;
  HostMat(DType t, int64_t rows, int64_t cols, int64_t pad = 0) {
    const int64_t ld = cols + pad;
    words.assign(size_t((rows * ld * int64_t(dtype_size(t)) + 3) / 4 + 1), 0x7fc07fc0u);
    m = Mat{words.data(), t, rows, cols, ld};
  }
};

float rd(const Mat& m, int64_t r, int64_t c) {
  if (m.dtype == DType::kF32) return *static_cast<const float*>(m.at(r, c));
  return bf16_to_f32(*static_cast<const uint16_t*>(m.at(r, c)));
}
void wr(const Mat& m, int64_t r, int64_t c, float v) {
  if (m.dtype == DType::kF32)
    *static_cast<float*>(m.at(r, c)) = v;
  else
    *static_cast<uint16_t*>(m.at(r, c)) = f32_to_bf16(v);
}
void fill(const Mat& m, float v) {
  for (int64_t r = 0; r < m.rows; ++r)
    for (int64_t c = 0; c < m.cols; ++c) wr(m, r, c, v);
}
// Dense row-major values.
std::vector<double> dense(const Mat& m) {
  std::vector<double> out(size_t(m.rows * m.cols));
  for (int64_t r = 0; r < m.rows; ++r)
    for (int64_t c = 0; c < m.cols; ++c) out[size_t(r * m.cols + c)] = rd(m, r, c);
  return out;
}

struct Case {
  int64_t sq, sk;
  int hq, hk, d;
  int64_t q_pos0, k_pos0;  // with documents: the views' first rows in the sequence's list
  bool causal;
  DType t;
  std::vector<int64_t> lens = {};  // documents of a packed sequence: one list for q and k
  std::string tag = {};
  bool aligned = false;  // 16-byte rows and packed lse, as cuDNN's fused attention needs
};

std::string case_name(const Case& c) {
  return "sq" + std::to_string(c.sq) + "_sk" + std::to_string(c.sk) + "_h" + std::to_string(c.hq) +
         "_" + std::to_string(c.hk) + "_d" + std::to_string(c.d) + "_qp" +
         std::to_string(c.q_pos0) + "_kp" + std::to_string(c.k_pos0) +
         (c.causal ? "_causal_" : "_full_") + dtype_name(c.t) + (c.tag.empty() ? "" : "_" + c.tag);
}

// gtest prints a case by its name (not its bytes, which hold pointers).
void PrintTo(const Case& c, std::ostream* os) {
  *os << case_name(c);
}

// Inputs of a case as stored (strided, NaN padding), their visibility and the reference's view.
struct Inputs {
  Case c;
  HostMat q, k, v, dout;
  MaskCase mc;
  float scale = 0;

  explicit Inputs(const Case& cc) : c(cc) {
    const int64_t qc = int64_t(c.hq) * c.d, kc = int64_t(c.hk) * c.d;
    const int64_t u = c.aligned ? 8 : 1;  // pads in whole 16-byte units when aligned
    q = HostMat(c.t, c.sq, qc, 5 * u);
    k = HostMat(c.t, c.sk, kc, 3 * u);
    v = HostMat(c.t, c.sk, kc, 1 * u);
    dout = HostMat(c.t, c.sq, qc, 2 * u);
    uint64_t seed = 11;
    for (const Mat* m : {&q.m, &k.m, &v.m, &dout.m}) {
      for (int64_t r = 0; r < m->rows; ++r)
        for (int64_t col = 0; col < m->cols; ++col)
          wr(*m, r, col, float(normal_at(seed, uint64_t(r * m->cols + col))));
      ++seed;
    }
    mc.sq = c.sq;
    mc.sk = c.sk;
    mc.causal = c.causal;
    if (c.lens.empty()) {
      mc.q_pos0 = c.q_pos0;
      mc.k_pos0 = c.k_pos0;
    } else {
      int64_t S = 0;
      for (int64_t l : c.lens) S += l;
      mc.qs = mc.ks = list_of(c.lens, {{0, S}});
      mc.q_row0 = c.q_pos0;
      mc.k_row0 = c.k_pos0;
    }
    mc.finish();
    scale = 1.0f / std::sqrt(float(c.d));
  }
  ref::AttnDims dims() const {
    ref::AttnDims a = mc.dims;
    a.hq = c.hq;
    a.hk = c.hk;
    a.d = c.d;
    return a;
  }
  AttnProblem cpu_problem() const {
    AttnProblem p = mc.problem();
    p.q = q.m;
    p.k = k.m;
    p.v = v.m;
    p.hq = c.hq;
    p.hk = c.hk;
    p.d = c.d;
    return p;
  }
};

// fp64 references and same-precision baselines of a case (reference/attention_ref.h; the
// baseline rounds o and the operands P, dS as bf16 attention's kernels may, docs/kernels.md).
struct Refs {
  std::vector<double> o64, lse64, dq64, dk64, dv64;
  std::vector<double> o32, lse32, dq32, dk32, dv32;
};
Refs refs_of(const Inputs& in) {
  const Case& c = in.c;
  const int64_t qc = int64_t(c.hq) * c.d, kc = int64_t(c.hk) * c.d;
  const ref::AttnDims a = in.dims();
  const std::vector<double> q = dense(in.q.m), k = dense(in.k.m), v = dense(in.v.m),
                            dout = dense(in.dout.m);
  using test::cview;
  using test::view;
  Refs r;
  r.o64.assign(size_t(c.sq * qc), 0);
  r.lse64.assign(size_t(c.hq * c.sq), 0);
  r.dq64.assign(size_t(c.sq * qc), 0);
  r.dk64.assign(size_t(c.sk * kc), 0);
  r.dv64.assign(size_t(c.sk * kc), 0);
  ref::attention_forward<double>(a, cview(q, c.sq, qc), cview(k, c.sk, kc), cview(v, c.sk, kc),
                                 view(r.o64, c.sq, qc), view(r.lse64, c.hq, c.sq));
  ref::attention_backward<double>(a, cview(q, c.sq, qc), cview(k, c.sk, kc), cview(v, c.sk, kc),
                                  cview(dout, c.sq, qc), view(r.dq64, c.sq, qc),
                                  view(r.dk64, c.sk, kc), view(r.dv64, c.sk, kc));
  const auto q32 = test::cast<float>(q), k32 = test::cast<float>(k), v32 = test::cast<float>(v),
             d32 = test::cast<float>(dout);
  std::vector<float> o32(r.o64.size()), lse32(r.lse64.size()), dq32(r.dq64.size(), 0.f),
      dk32(r.dk64.size(), 0.f), dv32(r.dv64.size(), 0.f);
  auto stored = [&](float x) { return c.t == DType::kF32 ? x : bf16_to_f32(f32_to_bf16(x)); };
  ref::attention_forward<float>(a, cview(q32, c.sq, qc), cview(k32, c.sk, kc), cview(v32, c.sk, kc),
                                view(o32, c.sq, qc), view(lse32, c.hq, c.sq), stored);
  ref::attention_backward<float>(a, cview(q32, c.sq, qc), cview(k32, c.sk, kc),
                                 cview(v32, c.sk, kc), cview(d32, c.sq, qc), view(dq32, c.sq, qc),
                                 view(dk32, c.sk, kc), view(dv32, c.sk, kc), stored, stored);
  r.o32 = test::rounded(test::cast<double>(o32), c.t);
  r.lse32 = test::cast<double>(lse32);
  r.dq32 = test::cast<double>(dq32);
  r.dk32 = test::cast<double>(dk32);
  r.dv32 = test::cast<double>(dv32);
  return r;
}

// The outputs of one implementation.
struct Outs {
  HostMat o, lse, dq, dk, dv;
  explicit Outs(const Case& c) {
    const int64_t qc = int64_t(c.hq) * c.d, kc = int64_t(c.hk) * c.d;
    o = HostMat(c.t, c.sq, qc, c.aligned ? 8 : 3);
    lse = HostMat(DType::kF32, c.hq, c.sq, c.aligned ? 0 : 1);
    dq = HostMat(DType::kF32, c.sq, qc, 2);
    dk = HostMat(DType::kF32, c.sk, kc, 1);
    dv = HostMat(DType::kF32, c.sk, kc, 4);
    fill(dq.m, 0);
    fill(dk.m, 0);
    fill(dv.m, 0);
  }
};

void expect_within_rule(const Outs& f, const Refs& r, const std::string& what) {
  test::expect_close(dense(f.o.m), r.o64, r.o32, what + " o");
  test::expect_close(dense(f.lse.m), r.lse64, r.lse32, what + " lse");
  test::expect_close(dense(f.dq.m), r.dq64, r.dq32, what + " dq");
  test::expect_close(dense(f.dk.m), r.dk64, r.dk32, what + " dk");
  test::expect_close(dense(f.dv.m), r.dv64, r.dv32, what + " dv");
}

// delta (hq, sq) = rowsum(do * o) per head, o as stored: the CPU backend's attention_delta.
HostMat delta_of(const Inputs& in, const Mat& o) {
  Device dev;
  HostMat delta(DType::kF32, in.c.hq, in.c.sq, 2);
  attention_delta(dev, o, in.dout.m, in.c.d, delta.m);
  return delta;
}

// ---- 2. host emulation of the kernels ---------------------------------------------------------

// One call as the kernels see it: views, heads, the resolved scale and the mask.
struct Emu {
  Mat q, k, v;
  int hq, hk, d;
  float scale;
  attn::Mask mask;
};

Emu emu_of(const Inputs& in) {
  return {in.q.m, in.k.m, in.v.m, in.c.hq, in.c.hk, in.c.d, in.scale, in.mc.mask()};
}

// The score chain of the kernels: over e in order, one fma each (their padding adds exact zeros).
float dot_row(const Mat& a, int64_t ra, const Mat& b, int64_t rb, int64_t c0a, int64_t c0b, int d) {
  float s = 0;
  for (int e = 0; e < d; ++e) s = std::fma(rd(a, ra, c0a + e), rd(b, rb, c0b + e), s);
  return s;
}

// The warps' row sum: lane l adds its keys l and l + 32, then the xor butterfly (lane 0's value;
// every lane's is the same).
float butterfly_sum(const float* p) {
  float lanes[32];
  for (int l = 0; l < 32; ++l) lanes[l] = p[l] + p[l + 32];
  for (int o = 16; o > 0; o >>= 1) {
    float next[32];
    for (int l = 0; l < 32; ++l) next[l] = lanes[l] + lanes[l ^ o];
    std::memcpy(lanes, next, sizeof lanes);
  }
  return lanes[0];
}

// fwd_kernel: per head and query tile, the key tiles from the first key any row sees to the last,
// tiles no row sees skipped; per row the online-softmax step over the tile's 64 keys.
void emu_forward(const Emu& p, const Mat* o, const Mat* lse, const Mat* acc, const Mat* m_st,
                 const Mat* l_st, bool accumulate) {
  const attn::Tiles t = attn::fwd_tiles(p.d);
  const int64_t sq = p.q.rows, sk = p.k.rows, d = p.d;
  std::vector<int64_t> lo(size_t(t.bq)), hi(size_t(t.bq));
  std::vector<float> x(size_t(t.bk)), pr(size_t(t.bk));
  for (int h = 0; h < p.hq; ++h) {
    const int kvh = h / (p.hq / p.hk);
    for (int64_t i0 = 0; i0 < sq; i0 += t.bq) {
      const int64_t bq = std::min(t.bq, sq - i0);
      for (int64_t r = 0; r < t.bq; ++r) {
        const attn::Range kr = r < bq ? attn::key_range(p.mask, i0 + r) : attn::Range{0, 0};
        lo[size_t(r)] = kr.first;
        hi[size_t(r)] = kr.end;
      }
      const attn::Range keys = attn::keys_seen(lo.data(), hi.data(), t.bq);
      std::vector<float> M(size_t(bq), -kInf), L(size_t(bq), 0.f), O(size_t(bq * d), 0.f);
      if (accumulate)
        for (int64_t r = 0; r < bq; ++r) {
          M[size_t(r)] = rd(*m_st, h, i0 + r);
          L[size_t(r)] = rd(*l_st, h, i0 + r);
          for (int64_t e = 0; e < d; ++e) O[size_t(r * d + e)] = rd(*acc, i0 + r, h * d + e);
        }
      if (accumulate && keys.empty()) continue;
      for (int64_t j0 = attn::tile_floor(keys.first, t.bk); j0 < keys.end; j0 += t.bk) {
        const int64_t bk = std::min(t.bk, sk - j0);
        attn::TileClass cls;
        for (int64_t r = 0; r < bq; ++r) cls.add({lo[size_t(r)], hi[size_t(r)]}, j0, j0 + bk);
        if (cls.kind() == attn::TileKind::kSkip) continue;
        for (int64_t r = 0; r < bq; ++r) {
          const attn::Range tc = attn::tile_cols({lo[size_t(r)], hi[size_t(r)]}, j0, bk);
          float tmax = -kInf;
          for (int64_t c = 0; c < t.bk; ++c) {
            const bool vis = c >= tc.first && c < tc.end;
            x[size_t(c)] =
                vis ? dot_row(p.q, i0 + r, p.k, j0 + c, h * d, kvh * d, p.d) * p.scale : -kInf;
            tmax = std::max(tmax, x[size_t(c)]);
          }
          float& m = M[size_t(r)];
          const float m_new = std::max(m, tmax);
          const float alpha = attn::online_alpha(m, m_new);
          for (int64_t c = 0; c < t.bk; ++c)
            pr[size_t(c)] =
                c >= tc.first && c < tc.end ? attn::online_prob(x[size_t(c)], m_new) : 0.0f;
          L[size_t(r)] = L[size_t(r)] * alpha + butterfly_sum(pr.data());
          m = m_new;
          float* orow = O.data() + r * d;
          for (int64_t e = 0; e < d; ++e) orow[e] *= alpha;
          for (int64_t c = 0; c < bk; ++c)
            for (int64_t e = 0; e < d; ++e)
              orow[e] = std::fma(pr[size_t(c)], rd(p.v, j0 + c, kvh * d + e), orow[e]);
        }
      }
      for (int64_t r = 0; r < bq; ++r) {
        const int64_t i = i0 + r;
        if (accumulate) {
          wr(*m_st, h, i, M[size_t(r)]);
          wr(*l_st, h, i, L[size_t(r)]);
          for (int64_t e = 0; e < d; ++e) wr(*acc, i, h * d + e, O[size_t(r * d + e)]);
          continue;
        }
        const float inv = attn::finalize_inv(L[size_t(r)]);
        for (int64_t e = 0; e < d; ++e) wr(*o, i, h * d + e, O[size_t(r * d + e)] * inv);
        wr(*lse, h, i, attn::finalize_lse(M[size_t(r)], L[size_t(r)]));
      }
    }
  }
}

// A tile's row state in the backward kernels: key range (empty for rows with lse = -inf), lse,
// delta.
struct BwdRow {
  attn::Range kr;
  float lse, delta;
};
BwdRow bwd_row(const Emu& p, const Mat& lse, const Mat& delta, int h, int64_t i) {
  const float l = rd(lse, h, i);
  return {l == -kInf ? attn::Range{0, 0} : attn::key_range(p.mask, i), l, rd(delta, h, i)};
}

// P and dS of query row i (state b) against key j0 + c of a tile of bk keys: zero where unseen.
void bwd_p_ds(const Emu& p, const Mat& dout, const BwdRow& b, int h, int64_t i, int64_t j0,
              int64_t c, int64_t bk, float& pv, float& ds) {
  const attn::Range tc = attn::tile_cols(b.kr, j0, bk);
  pv = ds = 0;
  if (c < tc.first || c >= tc.end) return;
  const int kvh = h / (p.hq / p.hk);
  const float s = dot_row(p.q, i, p.k, j0 + c, int64_t(h) * p.d, int64_t(kvh) * p.d, p.d);
  const float dp = dot_row(dout, i, p.v, j0 + c, int64_t(h) * p.d, int64_t(kvh) * p.d, p.d);
  pv = attn::bwd_prob(s, p.scale, b.lse);
  ds = attn::bwd_dscore(pv, dp, b.delta, p.scale);
}

// bwd_kv_kernel: per KV head and key tile, the query rows that may see it; per query head of the
// group (increasing), query tile (increasing, skipped if no row sees the tile) and row
// (increasing): dv += P do, dk += dS q, continuing from dk, dv.
void emu_backward_kv(const Emu& p, const Mat& dout, const Mat& lse, const Mat& delta, const Mat& dk,
                     const Mat& dv) {
  const attn::Tiles t = attn::bwd_kv_tiles(p.d);
  const int64_t sq = p.q.rows, sk = p.k.rows, d = p.d;
  const int group = p.hq / p.hk;
  for (int g = 0; g < p.hk; ++g)
    for (int64_t j0 = 0; j0 < sk; j0 += t.bk) {
      const int64_t bk = std::min(t.bk, sk - j0);
      const attn::Range rows = attn::query_rows(p.mask, j0, bk);
      if (rows.empty()) continue;
      std::vector<float> DK(size_t(bk * d)), DV(size_t(bk * d));
      for (int64_t c = 0; c < bk; ++c)
        for (int64_t e = 0; e < d; ++e) {
          DK[size_t(c * d + e)] = rd(dk, j0 + c, g * d + e);
          DV[size_t(c * d + e)] = rd(dv, j0 + c, g * d + e);
        }
      for (int h = g * group; h < (g + 1) * group; ++h)
        for (int64_t i0 = attn::tile_floor(rows.first, t.bq); i0 < rows.end; i0 += t.bq) {
          const int64_t bq = std::min(t.bq, sq - i0);
          std::vector<BwdRow> st;
          attn::TileClass cls;
          for (int64_t r = 0; r < bq; ++r) {
            st.push_back(bwd_row(p, lse, delta, h, i0 + r));
            cls.add(st.back().kr, j0, j0 + bk);
          }
          if (cls.kind() == attn::TileKind::kSkip) continue;
          for (int64_t c = 0; c < bk; ++c)
            for (int64_t r = 0; r < bq; ++r) {
              float pv, ds;
              bwd_p_ds(p, dout, st[size_t(r)], h, i0 + r, j0, c, bk, pv, ds);
              for (int64_t e = 0; e < d; ++e) {
                float& a = DV[size_t(c * d + e)];
                a = std::fma(pv, rd(dout, i0 + r, h * d + e), a);
                float& b = DK[size_t(c * d + e)];
                b = std::fma(ds, rd(p.q, i0 + r, h * d + e), b);
              }
            }
        }
      for (int64_t c = 0; c < bk; ++c)
        for (int64_t e = 0; e < d; ++e) {
          wr(dk, j0 + c, g * d + e, DK[size_t(c * d + e)]);
          wr(dv, j0 + c, g * d + e, DV[size_t(c * d + e)]);
        }
    }
}

// bwd_q_kernel: per query head and tile, the key tiles its rows see (increasing, unseen skipped),
// keys increasing: dq += dS k, continuing from dq.
void emu_backward_q(const Emu& p, const Mat& dout, const Mat& lse, const Mat& delta,
                    const Mat& dq) {
  const attn::Tiles t = attn::bwd_q_tiles(p.d);
  const int64_t sq = p.q.rows, sk = p.k.rows, d = p.d;
  for (int h = 0; h < p.hq; ++h) {
    const int kvh = h / (p.hq / p.hk);
    for (int64_t i0 = 0; i0 < sq; i0 += t.bq) {
      const int64_t bq = std::min(t.bq, sq - i0);
      std::vector<BwdRow> st;
      std::vector<int64_t> lo(size_t(t.bq), 0), hi(size_t(t.bq), 0);
      for (int64_t r = 0; r < bq; ++r) {
        st.push_back(bwd_row(p, lse, delta, h, i0 + r));
        lo[size_t(r)] = st.back().kr.first;
        hi[size_t(r)] = st.back().kr.end;
      }
      const attn::Range keys = attn::keys_seen(lo.data(), hi.data(), t.bq);
      if (keys.empty()) continue;
      std::vector<float> DQ(size_t(bq * d));
      for (int64_t r = 0; r < bq; ++r)
        for (int64_t e = 0; e < d; ++e) DQ[size_t(r * d + e)] = rd(dq, i0 + r, h * d + e);
      for (int64_t j0 = attn::tile_floor(keys.first, t.bk); j0 < keys.end; j0 += t.bk) {
        const int64_t bk = std::min(t.bk, sk - j0);
        attn::TileClass cls;
        for (int64_t r = 0; r < bq; ++r) cls.add(st[size_t(r)].kr, j0, j0 + bk);
        if (cls.kind() == attn::TileKind::kSkip) continue;
        for (int64_t r = 0; r < bq; ++r)
          for (int64_t c = 0; c < bk; ++c) {
            float pv, ds;
            bwd_p_ds(p, dout, st[size_t(r)], h, i0 + r, j0, c, bk, pv, ds);
            for (int64_t e = 0; e < d; ++e) {
              float& a = DQ[size_t(r * d + e)];
              a = std::fma(ds, rd(p.k, j0 + c, kvh * d + e), a);
            }
          }
      }
      for (int64_t r = 0; r < bq; ++r)
        for (int64_t e = 0; e < d; ++e) wr(dq, i0 + r, h * d + e, DQ[size_t(r * d + e)]);
    }
  }
}

void emu_backward(const Emu& p, const Mat& dout, const Mat& lse, const Mat& delta, const Mat& dq,
                  const Mat& dk, const Mat& dv) {
  emu_backward_kv(p, dout, lse, delta, dk, dv);
  emu_backward_q(p, dout, lse, delta, dq);
}

const DType F = DType::kF32, B = DType::kBF16;
// Small enough for the naive emulation; every path of the kernels: ragged tiles, GQA, offsets,
// keys in the future, non-causal, d not a multiple of 4 or 32, d > 128 (8 columns per lane),
// bf16, documents on whole views and on sub-views (ring-like pieces), length-1 documents.
std::vector<Case> emu_cases() {
  return {
      Case{150, 150, 2, 2, 32, 0, 0, true, F},
      Case{140, 100, 4, 1, 64, 1000, 930, true, F},
      Case{70, 80, 2, 2, 16, 0, 90, true, F, {}, "future"},
      Case{40, 200, 2, 1, 40, 500, 0, true, F},
      Case{100, 100, 2, 2, 24, 0, 0, false, F},
      Case{90, 110, 3, 1, 20, 60, 0, true, B},
      Case{70, 75, 2, 1, 150, 5, 0, true, F},
      Case{67, 67, 2, 1, 7, 0, 0, true, B},
      Case{200, 200, 4, 2, 16, 0, 0, true, F, {1, 50, 1, 1, 90, 37, 20}, "docs"},
      Case{90, 120, 2, 1, 24, 110, 0, true, B, {1, 50, 1, 1, 90, 37, 20}, "docs_piece"},
  };
}

// The forward is run in normalised mode (o, lse) and, separately, in accumulate mode over three
// key blocks then finalised; the backward in one call and key block by key block.
struct KeyBlocks {
  std::vector<int64_t> starts;  // block b is keys [starts[b], starts[b + 1])
};
KeyBlocks key_blocks(int64_t sk) {
  return {{0, sk / 3, sk / 3 + sk / 4 + 1, sk}};
}
// The mask of the call on keys [j0, j1): its positions or list rows moved along.
attn::Mask mask_block(attn::Mask m, int64_t j0, int64_t j1) {
  m.sk = j1 - j0;
  if (m.documents())
    m.k_docs.row0 += j0;
  else
    m.k_pos0 += j0;
  return m;
}

class CudaAttnEmu : public ::testing::TestWithParam<Case> {};

TEST_P(CudaAttnEmu, KernelAlgorithmWithinTwiceBaselineError) {
  const Inputs in(GetParam());
  const Refs r = refs_of(in);
  const Emu p = emu_of(in);
  Outs f(in.c);
  emu_forward(p, &f.o.m, &f.lse.m, nullptr, nullptr, nullptr, false);
  const HostMat delta = delta_of(in, f.o.m);
  emu_backward(p, in.dout.m, f.lse.m, delta.m, f.dq.m, f.dk.m, f.dv.m);
  expect_within_rule(f, r, "emulation");
}

TEST_P(CudaAttnEmu, AccumulateAndKeyBlocksWithinTwiceBaselineError) {
  const Inputs in(GetParam());
  const Case& c = in.c;
  const Refs r = refs_of(in);
  const Emu p = emu_of(in);
  Outs f(c);
  HostMat acc(DType::kF32, c.sq, int64_t(c.hq) * c.d, 1), m(DType::kF32, c.hq, c.sq, 2),
      l(DType::kF32, c.hq, c.sq, 3);
  fill(acc.m, 0);
  fill(m.m, -kInf);
  fill(l.m, 0);
  const KeyBlocks kb = key_blocks(c.sk);
  for (size_t b = 0; b + 1 < kb.starts.size(); ++b) {
    const int64_t j0 = kb.starts[b], j1 = kb.starts[b + 1];
    Emu pb = p;
    pb.k = p.k.rows_of(j0, j1 - j0);
    pb.v = p.v.rows_of(j0, j1 - j0);
    pb.mask = mask_block(p.mask, j0, j1);
    emu_forward(pb, nullptr, nullptr, &acc.m, &m.m, &l.m, true);
  }
  for (int h = 0; h < c.hq; ++h)  // attention_finalize
    for (int64_t i = 0; i < c.sq; ++i) {
      const float li = rd(l.m, h, i), inv = attn::finalize_inv(li);
      for (int e = 0; e < c.d; ++e)
        wr(f.o.m, i, int64_t(h) * c.d + e, rd(acc.m, i, int64_t(h) * c.d + e) * inv);
      wr(f.lse.m, h, i, attn::finalize_lse(rd(m.m, h, i), li));
    }
  const HostMat delta = delta_of(in, f.o.m);
  for (size_t b = kb.starts.size() - 1; b-- > 0;) {  // last block first, as ring's order may be
    const int64_t j0 = kb.starts[b], j1 = kb.starts[b + 1];
    Emu pb = p;
    pb.k = p.k.rows_of(j0, j1 - j0);
    pb.v = p.v.rows_of(j0, j1 - j0);
    pb.mask = mask_block(p.mask, j0, j1);
    emu_backward(pb, in.dout.m, f.lse.m, delta.m, f.dq.m, f.dk.m.rows_of(j0, j1 - j0),
                 f.dv.m.rows_of(j0, j1 - j0));
  }
  expect_within_rule(f, r, "emulation by key blocks");
}

// A tile visited only because another row of its query tile sees it changes nothing: the first
// rows of a call are bitwise those of a call on fewer rows (the kernels' query-prefix contract).
TEST_P(CudaAttnEmu, QueryPrefixIsBitwiseEqual) {
  const Inputs in(GetParam());
  const Case& c = in.c;
  const Emu p = emu_of(in);
  Outs f(c);
  emu_forward(p, &f.o.m, &f.lse.m, nullptr, nullptr, nullptr, false);
  const int64_t n = c.sq / 2 + 3;
  Emu pn = p;
  pn.q = p.q.rows_of(0, n);
  pn.mask.sq = n;
  HostMat o2(c.t, n, int64_t(c.hq) * c.d), lse2(DType::kF32, c.hq, n);
  emu_forward(pn, &o2.m, &lse2.m, nullptr, nullptr, nullptr, false);
  EXPECT_EQ(dense(o2.m), dense(f.o.m.rows_of(0, n)));
  EXPECT_EQ(dense(lse2.m), dense(f.lse.m.cols_of(0, n)));
}

INSTANTIATE_TEST_SUITE_P(Cases, CudaAttnEmu, ::testing::ValuesIn(emu_cases()),
                         [](const auto& i) { return case_name(i.param); });

// ---- 3. the kernels (GPU only) ----------------------------------------------------------------

#if UPIPE_HAVE_CUDA

// Why no kernel can run here, or "" when a device is present.
std::string no_gpu_reason() {
  int n = 0;
  const cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess) return std::string("no CUDA device: ") + cudaGetErrorString(e);
  if (n == 0) return "no CUDA device";
  return "";
}

#define UPIPE_REQUIRE_GPU()                   \
  do {                                        \
    const std::string why_ = no_gpu_reason(); \
    if (!why_.empty()) GTEST_SKIP() << why_;  \
  } while (0)

void cuda_ok(cudaError_t e) {
  ASSERT_EQ(e, cudaSuccess) << cudaGetErrorString(e);
}

// A device copy of a host matrix, the same layout (padding included).
struct DevMat {
  void* p = nullptr;
  size_t bytes = 0;
  Mat m;
  explicit DevMat(const HostMat& h) : bytes(h.words.size() * 4) {
    cuda_ok(cudaMalloc(&p, bytes));
    cuda_ok(cudaMemcpy(p, h.words.data(), bytes, cudaMemcpyHostToDevice));
    m = h.m;
    m.data = p;
  }
  DevMat(const DevMat&) = delete;
  DevMat& operator=(const DevMat&) = delete;
  ~DevMat() { cudaFree(p); }
  void read_into(HostMat& h) const {
    cuda_ok(cudaMemcpy(h.words.data(), p, bytes, cudaMemcpyDeviceToHost));
  }
  cuda::DView dview() const {
    return {m.data, m.dtype == DType::kF32 ? cuda::DT::kF32 : cuda::DT::kBF16, m.rows, m.cols,
            m.ld};
  }
  cuda::DView rows(int64_t r0, int64_t n) const {
    cuda::DView v = dview();
    v.data = m.rows_of(r0, n).data;
    v.rows = n;
    return v;
  }
};

struct DevSpans {
  void* p = nullptr;
  explicit DevSpans(const std::vector<cuda::DSpan>& s) {
    if (s.empty()) return;
    cuda_ok(cudaMalloc(&p, s.size() * sizeof(cuda::DSpan)));
    cuda_ok(cudaMemcpy(p, s.data(), s.size() * sizeof(cuda::DSpan), cudaMemcpyHostToDevice));
  }
  DevSpans(const DevSpans&) = delete;
  DevSpans& operator=(const DevSpans&) = delete;
  ~DevSpans() { cudaFree(p); }
};

// Inputs of a case on the device and the kernels' problem.
struct DevInputs {
  DevMat q, k, v, dout;
  DevSpans qs, ks;
  cuda::DAttn p;
  explicit DevInputs(const Inputs& in)
      : q(in.q), k(in.k), v(in.v), dout(in.dout), qs(in.mc.dqs), ks(in.mc.dks) {
    p.q = q.dview();
    p.k = k.dview();
    p.v = v.dview();
    p.hq = in.c.hq;
    p.hk = in.c.hk;
    p.d = in.c.d;
    p.q_pos0 = in.mc.q_pos0;
    p.k_pos0 = in.mc.k_pos0;
    p.causal = in.mc.causal;
    p.scale = in.scale;
    if (!in.mc.dqs.empty()) {
      p.q_docs = {static_cast<const cuda::DSpan*>(qs.p), int64_t(in.mc.dqs.size()), in.mc.q_row0};
      p.k_docs = {static_cast<const cuda::DSpan*>(ks.p), int64_t(in.mc.dks.size()), in.mc.k_row0};
    }
  }
};

// Forward then backward on the device into f (delta from the device's o, on the host).
void gpu_run(const Inputs& in, const DevInputs& di, Outs& f) {
  DevMat o(f.o), lse(f.lse), dq(f.dq), dk(f.dk), dv(f.dv);
  const cuda::DView none{};
  cuda::attention_forward(di.p, o.dview(), lse.dview(), none, none, none, false, nullptr, 0);
  cuda_ok(cudaDeviceSynchronize());
  o.read_into(f.o);
  lse.read_into(f.lse);
  const HostMat delta = delta_of(in, f.o.m);
  DevMat ddelta(delta);
  cuda::attention_backward(di.p, cuda::DView{}, di.dout.dview(), lse.dview(), ddelta.dview(),
                           dq.dview(), dk.dview(), dv.dview(), nullptr, 0);
  cuda_ok(cudaDeviceSynchronize());
  dq.read_into(f.dq);
  dk.read_into(f.dk);
  dv.read_into(f.dv);
}

// The CPU backend on the same stored inputs.
void cpu_run(const Inputs& in, Outs& f) {
  Device dev;
  const AttnProblem p = in.cpu_problem();
  attention_forward(dev, p, f.o.m, f.lse.m);
  const HostMat delta = delta_of(in, f.o.m);
  attention_backward(dev, p, in.dout.m, f.lse.m, delta.m, f.dq.m, f.dk.m, f.dv.m);
}

std::vector<Case> gpu_cases() {
  std::vector<Case> v = emu_cases();
  for (const Case& c : {
           Case{700, 700, 4, 1, 64, 0, 0, true, F},
           Case{1100, 1000, 4, 2, 128, 0, 100, true, B},
           Case{333, 250, 2, 1, 256, 17, 100, true, F},
           Case{520, 520, 2, 2, 96, 0, 0, false, B},
           Case{1000, 1000, 4, 2, 64, 0, 0, true, F, {1, 300, 1, 64, 64, 129, 1, 200, 240}, "docs"},
           // Layouts cuDNN's fused attention takes (attention_cudnn.h), and one it leaves.
           Case{512, 512, 8, 2, 64, 0, 0, true, B, {}, "aligned", true},
           Case{384, 640, 4, 4, 128, 256, 0, true, B, {}, "aligned", true},
           Case{300, 200, 2, 1, 64, 0, 0, false, B, {}, "aligned", true},
           Case{128, 256, 2, 1, 64, 1000, 0, true, B, {}, "aligned", true},
           Case{200, 300, 2, 1, 64, 0, 50, true, B, {}, "aligned", true},
       })
    v.push_back(c);
  return v;
}

class CudaAttnKernel : public ::testing::TestWithParam<Case> {};

TEST_P(CudaAttnKernel, WithinTwiceBaselineErrorAndNearTheCpuBackend) {
  UPIPE_REQUIRE_GPU();
  const Inputs in(GetParam());
  const Refs r = refs_of(in);
  const DevInputs di(in);
  Outs g(in.c), c(in.c);
  gpu_run(in, di, g);
  expect_within_rule(g, r, "cuda");
  cpu_run(in, c);
  // Both within the rule of the fp64 reference, so within twice it of each other.
  auto near = [&](const HostMat& a, const HostMat& b, const std::vector<double>& r64,
                  const std::vector<double>& base, const char* what) {
    const double bound =
        2 * (2 * test::max_abs_diff(base, r64) + 4 * test::kEps32 * test::max_abs(r64));
    EXPECT_LE(test::max_abs_diff(dense(a.m), dense(b.m)), bound) << what;
  };
  near(g.o, c.o, r.o64, r.o32, "o");
  near(g.lse, c.lse, r.lse64, r.lse32, "lse");
  near(g.dq, c.dq, r.dq64, r.dq32, "dq");
  near(g.dk, c.dk, r.dk64, r.dk32, "dk");
  near(g.dv, c.dv, r.dv64, r.dv32, "dv");
}

TEST_P(CudaAttnKernel, DeterministicAndAccumulateModeWithinRule) {
  UPIPE_REQUIRE_GPU();
  const Inputs in(GetParam());
  const Case& c = in.c;
  const DevInputs di(in);
  Outs a(c), b(c);
  gpu_run(in, di, a);
  gpu_run(in, di, b);
  EXPECT_EQ(dense(a.o.m), dense(b.o.m));
  EXPECT_EQ(dense(a.lse.m), dense(b.lse.m));
  EXPECT_EQ(dense(a.dq.m), dense(b.dq.m));
  EXPECT_EQ(dense(a.dk.m), dense(b.dk.m));
  EXPECT_EQ(dense(a.dv.m), dense(b.dv.m));

  // Accumulate over three key blocks, finalised on the host, and the backward block by block.
  const Refs r = refs_of(in);
  Outs f(c);
  HostMat acc(DType::kF32, c.sq, int64_t(c.hq) * c.d, 1), m(DType::kF32, c.hq, c.sq, 2),
      l(DType::kF32, c.hq, c.sq, 3);
  fill(acc.m, 0);
  fill(m.m, -kInf);
  fill(l.m, 0);
  DevMat dacc(acc), dm(m), dl(l);
  const KeyBlocks kb = key_blocks(c.sk);
  auto block = [&](size_t i) {
    const int64_t j0 = kb.starts[i], j1 = kb.starts[i + 1];
    cuda::DAttn pb = di.p;
    pb.k = di.k.rows(j0, j1 - j0);
    pb.v = di.v.rows(j0, j1 - j0);
    if (in.mc.qs.empty())
      pb.k_pos0 += j0;
    else
      pb.k_docs.row0 += j0;
    return pb;
  };
  const cuda::DView none{};
  for (size_t i = 0; i + 1 < kb.starts.size(); ++i)
    cuda::attention_forward(block(i), none, none, dacc.dview(), dm.dview(), dl.dview(), true,
                            nullptr, 0);
  cuda_ok(cudaDeviceSynchronize());
  dacc.read_into(acc);
  dm.read_into(m);
  dl.read_into(l);
  for (int h = 0; h < c.hq; ++h)
    for (int64_t i = 0; i < c.sq; ++i) {
      const float li = rd(l.m, h, i), inv = attn::finalize_inv(li);
      for (int e = 0; e < c.d; ++e)
        wr(f.o.m, i, int64_t(h) * c.d + e, rd(acc.m, i, int64_t(h) * c.d + e) * inv);
      wr(f.lse.m, h, i, attn::finalize_lse(rd(m.m, h, i), li));
    }
  const HostMat delta = delta_of(in, f.o.m);
  DevMat dlse(f.lse), ddelta(delta), dq(f.dq), dk(f.dk), dv(f.dv);
  for (size_t i = 0; i + 1 < kb.starts.size(); ++i) {
    const int64_t j0 = kb.starts[i], j1 = kb.starts[i + 1];
    cuda::attention_backward(block(i), cuda::DView{}, di.dout.dview(), dlse.dview(), ddelta.dview(),
                             dq.dview(), dk.rows(j0, j1 - j0), dv.rows(j0, j1 - j0), nullptr, 0);
  }
  cuda_ok(cudaDeviceSynchronize());
  dq.read_into(f.dq);
  dk.read_into(f.dk);
  dv.read_into(f.dv);
  expect_within_rule(f, r, "cuda by key blocks");
}

INSTANTIATE_TEST_SUITE_P(Cases, CudaAttnKernel, ::testing::ValuesIn(gpu_cases()),
                         [](const auto& i) { return case_name(i.param); });

// The reduction-order contract (docs/kernels.md): the heads of one KV head run alone through
// strided views, and the first rows of the queries run alone, give bitwise the all-heads /
// all-rows values.
TEST(CudaAttnContract, HeadSubsetAndQueryPrefixAreBitwiseEqual) {
  UPIPE_REQUIRE_GPU();
  // fp32 and bf16 on the flash kernels; bf16 with aligned layouts on cuDNN's forward where built.
  for (const auto& [t, aligned] : {std::pair{F, false}, std::pair{B, false}, std::pair{B, true}}) {
    const Inputs in(Case{530, 530, 8, 2, 64, 0, 0, true, t, {}, "", aligned});
    const DevInputs di(in);
    Outs all(in.c);
    gpu_run(in, di, all);

    const int d = in.c.d;
    Case sub = in.c;
    sub.hq = 4;
    sub.hk = 1;
    Outs part(sub);
    cuda::DAttn p = di.p;
    p.hq = 4;
    p.hk = 1;
    p.q.data = di.q.m.cols_of(4 * d, 4 * d).data;
    p.q.cols = 4 * d;
    p.k.data = di.k.m.cols_of(d, d).data;
    p.k.cols = d;
    p.v.data = di.v.m.cols_of(d, d).data;
    p.v.cols = d;
    DevMat o(part.o), lse(part.lse), dq(part.dq), dk(part.dk), dv(part.dv);
    const cuda::DView none{};
    cuda::attention_forward(p, o.dview(), lse.dview(), none, none, none, false, nullptr, 0);
    cuda_ok(cudaDeviceSynchronize());
    o.read_into(part.o);
    lse.read_into(part.lse);
    EXPECT_EQ(dense(part.o.m), dense(all.o.m.cols_of(4 * d, 4 * d)));
    EXPECT_EQ(dense(part.lse.m), dense(all.lse.m.rows_of(4, 4)));
    // Backward with the all-heads call's lse and delta rows of these heads.
    const HostMat delta_all = delta_of(in, all.o.m);
    DevMat dlse(all.lse), ddelta(delta_all);
    cuda::DView lse4 = dlse.dview(), delta4 = ddelta.dview();
    lse4.data = dlse.m.rows_of(4, 4).data;
    lse4.rows = 4;
    delta4.data = ddelta.m.rows_of(4, 4).data;
    delta4.rows = 4;
    cuda::DView dout4 = di.dout.dview();
    dout4.data = di.dout.m.cols_of(4 * d, 4 * d).data;
    dout4.cols = 4 * d;
    cuda::attention_backward(p, cuda::DView{}, dout4, lse4, delta4, dq.dview(), dk.dview(),
                             dv.dview(), nullptr, 0);
    cuda_ok(cudaDeviceSynchronize());
    dq.read_into(part.dq);
    dk.read_into(part.dk);
    dv.read_into(part.dv);
    EXPECT_EQ(dense(part.dq.m), dense(all.dq.m.cols_of(4 * d, 4 * d)));
    EXPECT_EQ(dense(part.dk.m), dense(all.dk.m.cols_of(d, d)));
    EXPECT_EQ(dense(part.dv.m), dense(all.dv.m.cols_of(d, d)));

    // The first 201 query rows alone: their o, lse and dq.
    const int64_t n = 201;
    Case pre = in.c;
    pre.sq = n;
    Outs first(pre);
    cuda::DAttn pn = di.p;
    pn.q.rows = n;
    DevMat o2(first.o), lse2(first.lse), dq2(first.dq), dk2(first.dk), dv2(first.dv);
    cuda::attention_forward(pn, o2.dview(), lse2.dview(), none, none, none, false, nullptr, 0);
    cuda_ok(cudaDeviceSynchronize());
    o2.read_into(first.o);
    lse2.read_into(first.lse);
    EXPECT_EQ(dense(first.o.m), dense(all.o.m.rows_of(0, n)));
    EXPECT_EQ(dense(first.lse.m), dense(all.lse.m.cols_of(0, n)));
    cuda::DView lsen = dlse.dview(), deltan = ddelta.dview(), doutn = di.dout.dview();
    lsen.cols = deltan.cols = n;
    doutn.rows = n;
    cuda::attention_backward(pn, cuda::DView{}, doutn, lsen, deltan, dq2.dview(), dk2.dview(),
                             dv2.dview(), nullptr, 0);
    cuda_ok(cudaDeviceSynchronize());
    dq2.read_into(first.dq);
    EXPECT_EQ(dense(first.dq.m), dense(all.dq.m.rows_of(0, n)));
  }
}

// The calls sdpa_plan maps run on cuDNN (when the build has it) and meet the kernels' rule; the
// backward (flash kernels) takes cuDNN's lse.
TEST(CudaAttnCudnn, MappedCallsRunOnCudnnWithinRule) {
  UPIPE_REQUIRE_GPU();
  if (!cuda::cudnn_attention_built())
    GTEST_SKIP() << "built without cudnn-frontend (UPIPE_CUDNN_SDPA off or its fetch failed)";
  for (const Case& c : {Case{512, 512, 8, 2, 64, 0, 0, true, B, {}, "", true},
                        Case{384, 640, 4, 4, 128, 256, 0, true, B, {}, "", true},
                        Case{128, 256, 2, 1, 64, 1000, 0, true, B, {}, "", true}}) {
    const Inputs in(c);
    const DevInputs di(in);
    Outs f(c);
    DevMat o(f.o), lse(f.lse);
    const attn::SdpaPlan plan =
        attn::sdpa_plan(di.p.q, di.p.k, di.p.v, o.dview(), lse.dview(), c.hq, c.hk, c.d,
                        di.p.q_pos0, di.p.k_pos0, c.causal, false);
    ASSERT_TRUE(plan.use) << case_name(c) << ": " << plan.why_not;
    // The call's workspace, as the backend gives it (the accumulate mode's size).
    const int64_t ws_bytes = attn::sdpa_fwd_workspace_bytes(c.hq, c.d);
    void* ws = nullptr;
    cuda_ok(cudaMalloc(&ws, size_t(ws_bytes)));
    const bool ran = cuda::cudnn_attention_forward(di.p, o.dview(), lse.dview(), ws, ws_bytes, 0);
    cuda_ok(cudaDeviceSynchronize());
    cuda_ok(cudaFree(ws));
    ASSERT_TRUE(ran) << case_name(c) << ": cuDNN rejected the graph or wants more workspace";
    o.read_into(f.o);
    lse.read_into(f.lse);
    const Refs r = refs_of(in);
    test::expect_close(dense(f.o.m), r.o64, r.o32, case_name(c) + " cudnn o");
    test::expect_close(dense(f.lse.m), r.lse64, r.lse32, case_name(c) + " cudnn lse");
  }
}

// fast within `blocks` times the rule of test::expect_close: each of the blocks a gradient sums
// over rounds its contribution to bf16 once, as base rounds the whole once.
void expect_close_blocks(const std::vector<double>& fast, const std::vector<double>& r64,
                         const std::vector<double>& base, int64_t blocks, const std::string& what) {
  ASSERT_EQ(fast.size(), r64.size()) << what;
  const double err = test::max_abs_diff(fast, r64), base_err = test::max_abs_diff(base, r64);
  EXPECT_LE(err, 2 * double(blocks) * base_err + 4 * test::kEps32 * test::max_abs(r64))
      << what << ": fast " << err << ", bf16-stored baseline " << base_err << ", " << blocks
      << " blocks";
}

// The accumulate-mode forward on cuDNN, as one block and cut into blocks of 256 (a workspace too
// small for larger ones), from the initial state and finalised: within the rule against the
// bf16-stored baseline, the bound scaled by the partials a row takes (each stored in bf16 once).
TEST(CudaAttnCudnn, AccumulateModeRunsOnCudnnInBlocksWithinRule) {
  UPIPE_REQUIRE_GPU();
  if (!cuda::cudnn_attention_built())
    GTEST_SKIP() << "built without cudnn-frontend (UPIPE_CUDNN_SDPA off or its fetch failed)";
  for (const Case& c : {Case{512, 512, 8, 2, 64, 0, 0, true, B, {}, "", true},
                        Case{384, 640, 4, 4, 128, 256, 0, true, B, {}, "", true},
                        Case{300, 700, 2, 1, 64, 1000, 0, true, B, {}, "", true}})
    for (bool small : {false, true}) {
      const int64_t budget = small ? attn::sdpa_fwd_layout(512, c.hq, c.d).end - 1
                                   : attn::sdpa_fwd_workspace_bytes(c.hq, c.d);
      const int64_t side = attn::sdpa_fwd_first_side(c.sq, c.sk, c.hq, c.d, budget);
      const std::string what = case_name(c) + " side " + std::to_string(side);
      if (small) {
        ASSERT_EQ(side, 256) << what;
      }
      const Inputs in(c);
      const DevInputs di(in);
      Outs f(c);
      const int64_t qc = int64_t(c.hq) * c.d;
      HostMat acc(DType::kF32, c.sq, qc, 8), m(DType::kF32, c.hq, c.sq), l(DType::kF32, c.hq, c.sq);
      DevMat o(f.o), lse(f.lse), dacc(acc), dm(m), dl(l);
      cuda::attention_accumulate_init(dacc.dview(), dm.dview(), dl.dview(), 0);
      void* ws = nullptr;
      cuda_ok(cudaMalloc(&ws, size_t(budget)));
      const bool ran = cuda::cudnn_attention_forward_accumulate(di.p, dacc.dview(), dm.dview(),
                                                                dl.dview(), ws, budget, 0);
      cuda::attention_finalize(dacc.dview(), dm.dview(), dl.dview(), c.d, o.dview(), lse.dview(),
                               0);
      cuda_ok(cudaDeviceSynchronize());
      cudaFree(ws);
      ASSERT_TRUE(ran) << what << ": cuDNN rejected a block or needs a workspace";
      o.read_into(f.o);
      lse.read_into(f.lse);
      const Refs r = refs_of(in);
      const int64_t nk = (c.sk + side - 1) / side;
      expect_close_blocks(dense(f.o.m), r.o64, r.o32, nk + 1, what + " o");
      test::expect_close(dense(f.lse.m), r.lse64, r.lse32, what + " lse");
    }
}

// The backward on cuDNN, as one block and cut into blocks of 256 (a workspace too small for
// larger ones): within the rule against a baseline whose gradients are stored in bf16 (cuDNN's
// outputs), the bound scaled by the blocks each gradient sums over. Calls it cannot take return
// false and leave the gradients as they were.
TEST(CudaAttnCudnn, BackwardRunsOnCudnnInBlocksWithinRule) {
  UPIPE_REQUIRE_GPU();
  if (!cuda::cudnn_attention_built())
    GTEST_SKIP() << "built without cudnn-frontend (UPIPE_CUDNN_SDPA off or its fetch failed)";
  const cuda::DView none{};
  for (const Case& c : {Case{512, 512, 8, 2, 64, 0, 0, true, B, {}, "", true},
                        Case{1024, 1024, 4, 4, 128, 0, 0, true, B, {}, "", true},
                        Case{384, 640, 4, 4, 128, 256, 0, true, B, {}, "", true},
                        Case{300, 700, 2, 1, 64, 1000, 0, true, B, {}, "", true}})
    for (bool small : {false, true}) {
      const int64_t budget = small ? attn::sdpa_bwd_layout(512, c.hq, c.hk, c.d).cudnn +
                                         attn::sdpa_bwd_cudnn_guess(512, c.hq, c.hk, c.d) - 1
                                   : attn::sdpa_bwd_workspace_bytes(c.hq, c.hk, c.d);
      const int64_t side = attn::sdpa_bwd_first_side(c.sq, c.sk, c.hq, c.hk, c.d, budget);
      const std::string what = case_name(c) + " side " + std::to_string(side);
      if (small) {
        ASSERT_EQ(side, 256) << what;
      }
      const Inputs in(c);
      const DevInputs di(in);
      Outs f(c);
      DevMat o(f.o), lse(f.lse), dq(f.dq), dk(f.dk), dv(f.dv);
      cuda::attention_forward(di.p, o.dview(), lse.dview(), none, none, none, false, nullptr, 0);
      void* ws = nullptr;
      cuda_ok(cudaMalloc(&ws, size_t(budget)));
      const bool ran =
          cuda::cudnn_attention_backward(di.p, o.dview(), di.dout.dview(), lse.dview(), dq.dview(),
                                         dk.dview(), dv.dview(), ws, budget, 0);
      cuda_ok(cudaDeviceSynchronize());
      cudaFree(ws);
      ASSERT_TRUE(ran) << what << ": cuDNN rejected a block or asked for more workspace";
      dq.read_into(f.dq);
      dk.read_into(f.dk);
      dv.read_into(f.dv);
      const Refs r = refs_of(in);
      const int64_t nq = (c.sq + side - 1) / side, nk = (c.sk + side - 1) / side;
      expect_close_blocks(dense(f.dq.m), r.dq64, test::rounded(r.dq32, B), nk, what + " dq");
      expect_close_blocks(dense(f.dk.m), r.dk64, test::rounded(r.dk32, B), nq, what + " dk");
      expect_close_blocks(dense(f.dv.m), r.dv64, test::rounded(r.dv32, B), nq, what + " dv");
    }
  // Refused: no o, and a causal offset no block side maps (shift 100 at sides 512 and 256).
  for (const bool with_o : {false, true}) {
    const Case c{512, 512, 4, 2, 64, with_o ? 100 : 0, 0, true, B, {}, "", true};
    const Inputs in(c);
    const DevInputs di(in);
    Outs f(c);
    DevMat o(f.o), lse(f.lse), dq(f.dq);
    void* ws = nullptr;
    const int64_t bytes = attn::sdpa_bwd_workspace_bytes(c.hq, c.hk, c.d);
    cuda_ok(cudaMalloc(&ws, size_t(bytes)));
    EXPECT_FALSE(cuda::cudnn_attention_backward(di.p, with_o ? o.dview() : none, di.dout.dview(),
                                                lse.dview(), dq.dview(), dq.dview(), dq.dview(), ws,
                                                bytes, 0))
        << case_name(c);
    cuda_ok(cudaDeviceSynchronize());
    cudaFree(ws);
    dq.read_into(f.dq);
    for (double x : dense(f.dq.m)) ASSERT_EQ(x, 0.0) << case_name(c) << ": a refused call wrote";
  }
}

#else

TEST(CudaAttnKernel, NeedsTheCudaBuild) {
  GTEST_SKIP() << "built without CUDA (UPIPE_CUDA=OFF): the kernels are not compiled";
}

#endif  // UPIPE_HAVE_CUDA

}  // namespace
}  // namespace upipe
