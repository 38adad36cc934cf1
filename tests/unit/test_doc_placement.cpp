// Packed documents' metadata (attention/documents.h): lengths validated at the boundary, RoPE
// positions and span lists against a row-by-row expansion, the ring layouts' placement (every row
// placed once, S / M rows per member in ascending runs, one document placed exactly as zigzag,
// equal documents balanced exactly, mixed lengths within the greedy bound of the rule) and the
// mask's ring-step skip decision against a brute-force search.
#include <gtest/gtest.h>

#include <algorithm>
#include <numeric>
#include <random>

#include "attention/documents.h"
#include "attention/layout.h"
#include "core/errors.h"

namespace upipe {
namespace {

Documents docs_of(const std::vector<int64_t>& lens) {
  return Documents(lens, std::accumulate(lens.begin(), lens.end(), int64_t(0)));
}

TEST(Documents, LengthsAreValidated) {
  const std::vector<int64_t> zero{3, 0, 5}, short_sum{3, 4}, long_sum{3, 9}, none{};
  EXPECT_THROW(Documents(zero, 8), ConfigError);
  EXPECT_THROW(Documents(short_sum, 8), ConfigError);
  EXPECT_THROW(Documents(long_sum, 8), ConfigError);
  EXPECT_THROW(Documents(none, 8), ConfigError);
  try {
    Documents(short_sum, 8, "--doc-lens");
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("--doc-lens"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("sum to 7"), std::string::npos) << e.what();
  }
  const Documents d = docs_of({1, 4, 1, 2});
  EXPECT_EQ(d.count(), 4);
  EXPECT_EQ(d.predictions(), 4);
  EXPECT_EQ(d.doc_of(0), 0);
  EXPECT_EQ(d.doc_of(4), 1);
  EXPECT_EQ(d.doc_of(5), 2);
  EXPECT_TRUE(d.last_of_document(0));
  EXPECT_FALSE(d.last_of_document(1));
  EXPECT_TRUE(d.last_of_document(7));
  const Documents one = docs_of({8});
  EXPECT_FALSE(packed(&one));
  EXPECT_TRUE(packed(&d));
}

// Row-by-row: the document and position of every global row.
struct Expanded {
  std::vector<int64_t> doc, pos;
};
Expanded expand(const Documents& d) {
  Expanded e;
  for (int64_t i = 0; i < d.count(); ++i)
    for (int64_t p = 0; p < d.length(i); ++p) {
      e.doc.push_back(i);
      e.pos.push_back(p);
    }
  return e;
}

TEST(Documents, PositionsAndSpansFollowTheRows) {
  const Documents d = docs_of({5, 1, 9, 3, 6});
  const Expanded e = expand(d);
  const RowPositions view{{{4, 2}, {7, 10}, {3, 20}}};  // rows 2..5, 10..16, 20..22
  const std::vector<int64_t> rows = view.expand();
  const std::vector<int64_t> rope = d.positions_in_documents(view).expand();
  ASSERT_EQ(rope.size(), rows.size());
  for (size_t r = 0; r < rows.size(); ++r) EXPECT_EQ(rope[r], e.pos[size_t(rows[r])]) << r;
  int64_t covered = 0;
  for (const DocSpan& s : d.spans(view)) {
    EXPECT_EQ(s.row, covered);
    for (int64_t i = 0; i < s.rows; ++i) {
      EXPECT_EQ(e.doc[size_t(rows[size_t(s.row + i)])], s.doc);
      EXPECT_EQ(e.pos[size_t(rows[size_t(s.row + i)])], s.pos + i);
    }
    covered += s.rows;
  }
  EXPECT_EQ(covered, int64_t(rows.size()));
}

// The members' rows are a partition of the sequence into S / M rows each, ascending runs.
void expect_partition(const std::vector<RowPositions>& placed, int64_t s) {
  std::vector<int> seen(size_t(s), 0);
  for (const RowPositions& m : placed) {
    EXPECT_EQ(m.total_rows(), s / int64_t(placed.size()));
    int64_t last = -1;
    for (const RowPositions::Run& r : m.runs) {
      EXPECT_GT(r.rows, 0);
      EXPECT_GT(r.pos, last) << "runs ascend and do not touch";
      last = r.pos + r.rows;
      for (int64_t i = 0; i < r.rows; ++i) ++seen[size_t(r.pos + i)];
    }
  }
  for (int64_t i = 0; i < s; ++i) ASSERT_EQ(seen[size_t(i)], 1) << "row " << i;
}

TEST(Placement, OneDocumentIsTheZigzagLayout) {
  for (int m : {1, 2, 3, 4, 8}) {
    const int64_t s = 48 * m;
    const Documents d = docs_of({s});
    const std::vector<RowPositions> placed = place_documents(d, m);
    expect_partition(placed, s);
    const SeqLayout zigzag{LayoutKind::kZigzag, s, m, 1};
    for (int r = 0; r < m; ++r)
      EXPECT_EQ(placed[size_t(r)].expand(), zigzag.positions(r).expand()) << m << " members";
  }
}

TEST(Placement, EqualDocumentsAreBalancedExactly) {
  std::vector<int64_t> lens(64, 256);
  const Documents d = docs_of(lens);
  for (int m : {2, 4, 8}) {
    const std::vector<RowPositions> placed = place_documents(d, m);
    expect_partition(placed, d.seq_len());
    for (const RowPositions& p : placed)
      EXPECT_EQ(causal_work(d, p), d.causal_work() / m) << m << " members";
  }
}

// Mixed lengths (a long document, medium and tiny ones): every member's work is at most the
// average plus the largest item the rule forms (greedy assignment of items in decreasing work),
// and far below contiguous sharding's worst member.
TEST(Placement, MixedLengthsStayWithinTheGreedyBound) {
  std::mt19937_64 rng(7);
  for (int m : {2, 3, 4, 8}) {
    std::vector<int64_t> lens = {3000};
    for (int i = 0; i < 40; ++i) lens.push_back(int64_t(rng() % 400) + 1);
    for (int i = 0; i < 200; ++i) lens.push_back(int64_t(rng() % 8) + 1);
    int64_t s = std::accumulate(lens.begin(), lens.end(), int64_t(0));
    lens.push_back(2 * m - s % (2 * m) + 2 * m);  // S divisible by 2M
    s += lens.back();
    const Documents d = docs_of(lens);
    const std::vector<RowPositions> placed = place_documents(d, m);
    expect_partition(placed, s);
    const double total = d.causal_work();
    // The largest item: a whole short document, or a zigzag pair of chunks of a long one.
    double item = 0;
    for (int64_t i = 0; i < d.count(); ++i) {
      const double w = double(d.length(i)) * double(d.length(i) + 1) / 2;
      if (w * 2 * m <= total) {
        item = std::max(item, w);
        continue;
      }
      const int64_t c2 = 2 * m, st = d.start(i), l = d.length(i);
      auto bound = [&](int64_t k) { return st + k * l / c2; };
      for (int64_t k = 0; k < m; ++k) {
        const RowPositions pair{{{bound(k + 1) - bound(k), bound(k)},
                                 {bound(c2 - k) - bound(c2 - 1 - k), bound(c2 - 1 - k)}}};
        item = std::max(item, causal_work(d, pair));
      }
    }
    double worst = 0, worst_contiguous = 0;
    for (int r = 0; r < m; ++r) {
      worst = std::max(worst, causal_work(d, placed[size_t(r)]));
      worst_contiguous =
          std::max(worst_contiguous, causal_work(d, RowPositions::contiguous(s / m, r * (s / m))));
    }
    EXPECT_LE(worst, total / m + item) << m << " members";
    if (m > 1) {
      EXPECT_LT(worst, worst_contiguous) << m << " members";
    }
  }
}

// any_visible against every (query row, key row) pair of placements and of random views.
TEST(DocMaskSkip, AnyVisibleMatchesBruteForce) {
  std::mt19937_64 rng(3);
  Device dev;
  for (int trial = 0; trial < 40; ++trial) {
    const int m = int(rng() % 4) + 2;
    std::vector<int64_t> lens;
    int64_t s = 0;
    const int64_t target = 16 * m * (int64_t(rng() % 4) + 1);
    while (s < target) {
      lens.push_back(std::min<int64_t>(target - s, int64_t(rng() % (trial % 4 < 2 ? 6 : 40)) + 1));
      s += lens.back();
    }
    const Documents d = docs_of(lens);
    const Expanded e = expand(d);
    // The placement's views; each row in a random view (any interleaving); random windows of the
    // sequence (overlapping views).
    std::vector<RowPositions> views;
    if (trial % 3 == 0) {
      views = place_documents(d, m);
    } else if (trial % 3 == 1) {
      for (int v = 0; v < m; ++v) {
        const int64_t a = int64_t(rng() % uint64_t(s)), n = int64_t(rng() % uint64_t(s - a)) + 1;
        views.push_back(RowPositions::contiguous(n, a));
      }
    } else {
      views.resize(size_t(m));
      for (int64_t i = 0; i < s; ++i) {
        std::vector<RowPositions::Run>& runs = views[size_t(rng() % uint64_t(m))].runs;
        if (!runs.empty() && runs.back().pos + runs.back().rows == i)
          ++runs.back().rows;
        else
          runs.push_back({1, i});
      }
    }
    const DocMask mask(dev, d, views);
    for (int qi = 0; qi < m; ++qi)
      for (int ki = 0; ki < m; ++ki) {
        bool want = false;
        for (int64_t i : views[size_t(qi)].expand())
          for (int64_t j : views[size_t(ki)].expand())
            want = want || (e.doc[size_t(i)] == e.doc[size_t(j)] && j <= i);
        EXPECT_EQ(mask.any_visible(size_t(qi), size_t(ki)), want)
            << "trial " << trial << " views " << qi << ", " << ki;
      }
  }
}

}  // namespace
}  // namespace upipe
