// Key ranges of query rows from causal positions or from the documents' spans (attention_mask.h).
#include "backend/cpu/attention_mask.h"

#include <algorithm>

namespace upipe::cpu {
namespace {

// The span of list `l` holding list row r (spans cover their rows in order).
int64_t span_of(const DocRows& l, int64_t r) {
  const DocSpan* end = l.spans + l.count;
  const DocSpan* s =
      std::upper_bound(l.spans, end, r, [](int64_t x, const DocSpan& t) { return x < t.row; });
  return int64_t(s - l.spans) - 1;
}

// Document-causal: the key rows of document `doc` at positions <= pos, as [lo, hi) in the list's
// rows (lo = hi when there are none).
RowRange doc_keys(const DocRows& k, int64_t doc, int64_t pos) {
  const DocSpan* b = k.spans;
  const DocSpan* e = b + k.count;
  const DocSpan* first =
      std::lower_bound(b, e, doc, [](const DocSpan& s, int64_t d) { return s.doc < d; });
  const DocSpan* past = std::upper_bound(first, e, pos, [doc](int64_t p, const DocSpan& s) {
    return s.doc > doc || (s.doc == doc && s.pos > p);
  });
  if (past > first) {
    const DocSpan& s = past[-1];
    return {first->row, s.row + std::min(s.rows, pos - s.pos + 1)};
  }
  const int64_t at = first < e ? first->row : e[-1].row + e[-1].rows;
  return {at, at};
}

void doc_ranges(const AttnProblem& p, int64_t i0, int64_t n, int64_t* lo, int64_t* hi) {
  const DocRows& q = p.q_docs;
  const int64_t sk = p.sk();
  int64_t si = span_of(q, i0 + q.row0);
  for (int64_t r = 0; r < n; ++r) {
    const int64_t row = i0 + r + q.row0;
    while (row >= q.spans[si].row + q.spans[si].rows) ++si;
    const DocSpan& s = q.spans[si];
    const RowRange kr = doc_keys(p.k_docs, s.doc, s.pos + (row - s.row));
    lo[r] = std::clamp<int64_t>(kr.first - p.k_docs.row0, 0, sk);
    hi[r] = std::clamp<int64_t>(kr.end - p.k_docs.row0, lo[r], sk);
  }
}

}  // namespace

void key_ranges(const AttnProblem& p, int64_t i0, int64_t n, int64_t* lo, int64_t* hi) {
  if (p.documents()) return doc_ranges(p, i0, n, lo, hi);
  const int64_t sk = p.sk();
  for (int64_t r = 0; r < n; ++r) {
    lo[r] = 0;
    hi[r] = p.causal ? std::clamp<int64_t>(p.q_pos0 + i0 + r - p.k_pos0 + 1, 0, sk) : sk;
  }
}

RowRange query_rows(const AttnProblem& p, int64_t j0, int64_t n) {
  const int64_t sq = p.sq();
  if (!p.causal) return {0, sq};
  if (!p.documents()) return {std::clamp<int64_t>(p.k_pos0 + j0 - p.q_pos0, 0, sq), sq};
  // Both bounds grow with the row: the first row whose range ends past j0, the first whose
  // range starts at or past j0 + n.
  auto bound = [&](auto past) {
    int64_t a = 0, b = sq;
    while (a < b) {
      const int64_t mid = a + (b - a) / 2;
      int64_t lo = 0, hi = 0;
      doc_ranges(p, mid, 1, &lo, &hi);
      if (past(lo, hi))
        b = mid;
      else
        a = mid + 1;
    }
    return a;
  };
  const int64_t first = bound([&](int64_t, int64_t hi) { return hi > j0; });
  const int64_t end = bound([&](int64_t lo, int64_t) { return lo >= j0 + n; });
  return {first, std::max(first, end)};
}

RowRange keys_seen(const int64_t* lo, const int64_t* hi, int64_t n) {
  RowRange r{0, 0};
  bool any = false;
  for (int64_t i = 0; i < n; ++i) {
    if (lo[i] >= hi[i]) continue;
    r.first = any ? std::min(r.first, lo[i]) : lo[i];
    r.end = std::max(r.end, hi[i]);
    any = true;
  }
  if (!any) return {0, 0};
  return r;
}

}  // namespace upipe::cpu
