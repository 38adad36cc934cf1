// Sequence layouts: every layout's rank shards partition the sequence, zigzag gives rank r
// chunks r and 2C-1-r, and the zigzag grid of USP concatenates, within each group of u ranks,
// to exactly the group's zigzag shard over r = C/u groups (what the group's all-to-all
// assembles), reducing to zigzag at u = 1 and to contiguous at u = C.
#include <gtest/gtest.h>

#include <vector>

#include "attention/layout.h"

namespace upipe {
namespace {

std::vector<int64_t> rows_of(const SeqLayout& l, int rank) {
  return l.positions(rank).expand();
}

void expect_partition(const SeqLayout& l) {
  std::vector<int> seen(size_t(l.seq_len), 0);
  for (int r = 0; r < l.ranks; ++r) {
    const std::vector<int64_t> p = rows_of(l, r);
    EXPECT_EQ(int64_t(p.size()), l.local_rows()) << l.name() << " rank " << r;
    for (int64_t x : p) ++seen[size_t(x)];
  }
  for (int64_t i = 0; i < l.seq_len; ++i)
    EXPECT_EQ(seen[size_t(i)], 1) << l.name() << " position " << i;
}

TEST(Layout, ZigzagHoldsChunksRAnd2CMinus1MinusR) {
  const SeqLayout l{LayoutKind::kZigzag, 60, 3, 1};
  expect_partition(l);
  const RowPositions p = l.positions(1);
  ASSERT_EQ(p.runs.size(), 2u);
  EXPECT_EQ(p.runs[0].pos, 10);
  EXPECT_EQ(p.runs[1].pos, 40);
}

TEST(Layout, ZigzagGridGroupsAssembleTheirZigzagShard) {
  for (int c : {1, 2, 3, 4, 6, 8}) {
    for (int u = 1; u <= c; ++u) {
      if (c % u != 0) continue;
      const int r = c / u;
      const SeqLayout grid{LayoutKind::kZigzagGrid, 0, c, 1, u};
      const int64_t s = 5 * grid.divisor();
      const SeqLayout l{LayoutKind::kZigzagGrid, s, c, 1, u};
      expect_partition(l);
      const SeqLayout groups{LayoutKind::kZigzag, s, r, 1};
      for (int g = 0; g < r; ++g) {
        std::vector<int64_t> cat;
        for (int j = 0; j < u; ++j) {
          const std::vector<int64_t> p = rows_of(l, g * u + j);
          cat.insert(cat.end(), p.begin(), p.end());
        }
        EXPECT_EQ(cat, rows_of(groups, g)) << "C=" << c << " u=" << u << " group " << g;
      }
      const SeqLayout same = u == 1 ? SeqLayout{LayoutKind::kZigzag, s, c, 1}
                                    : SeqLayout{LayoutKind::kContiguous, s, c, 1};
      if (u == 1 || u == c) {
        for (int rank = 0; rank < c; ++rank) EXPECT_EQ(rows_of(l, rank), rows_of(same, rank));
      }
    }
  }
}

}  // namespace
}  // namespace upipe
