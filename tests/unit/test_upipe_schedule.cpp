// The UPipe GQA schedule over many (H, K, C, U): the head-pairing invariant (every query head a
// rank processes reads a KV head resident on that rank in that stage), every query head
// processed exactly once, each KV set crossing the network once, KV heads in stage order, and
// U = H reducing to Ulysses' head assignment.
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
  // Each rank holds a KV head in exactly one set; K >= C: every KV head on exactly one rank;
  // K < C: on exactly C/K ranks.
  std::vector<int> holders(size_t(k), 0);
  for (const auto& p : kv_sent) ++holders[size_t(p.second)];
  for (int a = 0; a < k; ++a) EXPECT_EQ(holders[size_t(a)], k >= c ? 1 : c / k) << "KV head " << a;
}

TEST(UpipeSchedule, PairingInvariantAndCoverage) {
  int n = 0;
  for (int c : {1, 2, 3, 4, 8})
    for (int h : {4, 8, 12, 16, 24, 32, 64})
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
