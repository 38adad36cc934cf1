// The UPipe GQA schedule over many (H, K, C, U): the head-pairing invariant (every query head a
// rank processes reads a KV head resident on that rank in that stage), every query head
// processed exactly once, each KV set crossing the network once, KV heads in stage order, the
// attention calls of every stage and rank (head_runs) pairing each query head with its own KV
// head (including runs that cross a KV boundary: m and G co-prime, G = 3, 5, 6, 7 as in real
// models), and U = H reducing to Ulysses' head assignment.
#include <gtest/gtest.h>

#include <set>

#include "attention/upipe_schedule.h"
#include "core/errors.h"

namespace upipe {
namespace {

AttentionConfig shape(int h, int k) {
  AttentionConfig c;
  c.seq_len = 1024;
  c.heads = h;
  c.kv_heads = k;
  c.head_dim = 16;
  return c;
}

// The engine's attention calls of `stage` on rank j (head_runs): consecutive runs covering the
// rank's m query heads in order, each reading nk resident KV heads with nh / nk query heads
// apiece; every query head must read the KV head its GQA group names (q / G), resident there.
void check_head_runs(const UpipeSchedule& s, int stage, int j) {
  SCOPED_TRACE(testing::Message() << "stage " << stage << " rank " << j);
  const std::vector<HeadRun> runs = head_runs(s, stage);
  const int q_first = s.q_head(stage, j), kv_first = s.kv_head(s.set_of(stage), j);
  int next = 0;
  for (const HeadRun& r : runs) {
    ASSERT_EQ(r.q0, next) << "runs must tile the rank's query heads in order";
    ASSERT_GT(r.nh, 0);
    ASSERT_GT(r.nk, 0);
    ASSERT_EQ(r.nh % r.nk, 0) << "each KV head of a run is read by nh / nk query heads";
    ASSERT_GE(r.k0, 0);
    ASSERT_LE(r.k0 + r.nk, s.kv_per_rank) << "a run reads a KV head not resident on the rank";
    for (int i = 0; i < r.nh; ++i) {
      const int q = q_first + r.q0 + i, kv = kv_first + r.k0 + i / (r.nh / r.nk);
      EXPECT_EQ(kv, q / s.gqa_group) << "query head " << q << " (run " << r.q0 << "+" << i << ")";
    }
    next = r.q0 + r.nh;
  }
  EXPECT_EQ(next, s.m) << "runs must cover the rank's m query heads";
}

void check_schedule(int h, int k, int c, int u) {
  SCOPED_TRACE(testing::Message() << "H=" << h << " K=" << k << " C=" << c << " U=" << u);
  const UpipeSchedule s = make_upipe_schedule(shape(h, k), c, u);
  ASSERT_EQ(s.stages(), h / u);
  std::vector<int> seen(size_t(h), 0);
  std::set<std::pair<int, int>> kv_sent;  // (rank, kv head) pairs fetched
  for (int st = 0; st < s.stages(); ++st) {
    const int set = s.set_of(st);
    for (int j = 0; j < c; ++j) {
      if (s.starts_set(st)) {
        for (int r = 0; r < s.kv_per_rank; ++r)
          EXPECT_TRUE(kv_sent.insert({j, s.kv_head(set, j) + r}).second) << "KV head sent twice";
      }
      const int kv0 = s.kv_head(set, j);
      for (int i = 0; i < s.m; ++i) {
        const int q = s.q_head(st, j) + i;
        ASSERT_GE(q, 0);
        ASSERT_LT(q, h);
        ++seen[size_t(q)];
        const int kv = q / s.gqa_group;
        EXPECT_GE(kv, kv0) << "query head " << q << " reads a KV head not resident on rank " << j;
        EXPECT_LT(kv, kv0 + s.kv_per_rank) << "query head " << q << " on rank " << j;
      }
    }
  }
  for (int q = 0; q < h; ++q) EXPECT_EQ(seen[size_t(q)], 1) << "query head " << q;
  for (int st = 0; st < s.stages(); ++st)
    for (int j = 0; j < c; ++j) check_head_runs(s, st, j);
  // Each rank holds a KV head in exactly one set; K >= C: every KV head on exactly one rank;
  // K < C: on exactly C/K ranks.
  std::vector<int> holders(size_t(k), 0);
  for (const auto& p : kv_sent) ++holders[size_t(p.second)];
  for (int a = 0; a < k; ++a) EXPECT_EQ(holders[size_t(a)], k >= c ? 1 : c / k) << "KV head " << a;
}

TEST(UpipeSchedule, PairingInvariantAndCoverage) {
  int n = 0;
  for (int c : {1, 2, 3, 4, 8})
    for (int h : {4, 8, 12, 16, 20, 24, 28, 32, 40, 48, 56, 64})
      for (int k = 1; k <= h; ++k) {
        if (h % k || h % c) continue;
        if (k >= c ? k % c : c % k) continue;
        for (int u = c; u <= h; u += c)
          if (h % u == 0) {
            check_schedule(h, k, c, u);
            ++n;
          }
      }
  EXPECT_GT(n, 300);
}

TEST(UpipeSchedule, UEqualsHIsUlyssesAssignment) {
  for (auto [h, k, c] : {std::tuple{32, 8, 4}, {16, 2, 8}, {8, 8, 2}, {24, 3, 3}}) {
    const UpipeSchedule s = make_upipe_schedule(shape(h, k), c, h);
    EXPECT_EQ(s.stages(), 1);
    for (int j = 0; j < c; ++j) EXPECT_EQ(s.q_head(0, j), j * h / c);
  }
}

TEST(UpipeSchedule, GqaSetsLastGStagesWhenUEqualsC) {
  // SPEC: with U = C each rank holds one query head per stage and one KV head per set; a set
  // lasts G stages.
  const UpipeSchedule s = make_upipe_schedule(shape(32, 8), 4, 4);
  EXPECT_EQ(s.m, 1);
  EXPECT_EQ(s.kv_per_rank, 1);
  EXPECT_EQ(s.stages_per_set, 4);
  EXPECT_EQ(s.sets, 2);
}

TEST(UpipeSchedule, InvalidUIsRejectedWithValidChoices) {
  try {
    make_upipe_schedule(shape(32, 8), 4, 6);
    FAIL();
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("valid values: 4, 8, 16, 32"), std::string::npos)
        << e.what();
  }
  EXPECT_THROW(make_upipe_schedule(shape(24, 6), 4, 0), ConfigError);  // K=6 vs C=4
}

}  // namespace
}  // namespace upipe
