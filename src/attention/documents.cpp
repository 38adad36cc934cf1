#include "attention/documents.h"

#include <fmt/format.h>

#include <algorithm>
#include <numeric>

#include "core/checked.h"
#include "core/errors.h"

namespace upipe {

Documents::Documents(std::span<const int64_t> lengths, int64_t seq_len, const std::string& what) {
  if (lengths.empty()) throw ConfigError(fmt::format("{}: no documents given", what));
  starts_.reserve(lengths.size() + 1);
  starts_.push_back(0);
  for (size_t i = 0; i < lengths.size(); ++i) {
    if (lengths[i] < 1)
      throw ConfigError(fmt::format("{}: document {} has length {}; every length must be >= 1",
                                    what, i, lengths[i]));
    if (lengths[i] > seq_len - starts_.back())
      throw ConfigError(fmt::format(
          "{}: the lengths sum past the sequence length {} (at document {}); they must sum to "
          "exactly {}",
          what, seq_len, i, seq_len));
    starts_.push_back(starts_.back() + lengths[i]);
  }
  if (starts_.back() != seq_len)
    throw ConfigError(fmt::format("{}: the {} lengths sum to {}, not the sequence length {}", what,
                                  lengths.size(), starts_.back(), seq_len));
}

std::vector<int64_t> Documents::lengths() const {
  std::vector<int64_t> out(static_cast<size_t>(count()));
  for (int64_t i = 0; i < count(); ++i) out[size_t(i)] = length(i);
  return out;
}

int64_t Documents::doc_of(int64_t row) const {
  UPIPE_CHECK(row >= 0 && row < seq_len(), "row {} outside the sequence of {}", row, seq_len());
  return int64_t(std::upper_bound(starts_.begin(), starts_.end(), row) - starts_.begin()) - 1;
}

bool Documents::last_of_document(int64_t row) const {
  return row + 1 == starts_[size_t(doc_of(row)) + 1];
}

namespace {

// Query-key pairs of n rows at positions [p, p + n) of one document: sum of (q + 1).
double run_work(int64_t p, int64_t n) {
  return double(n) * double(p + 1) + double(n) * double(n - 1) / 2;
}

// Calls fn(row, rows, doc, pos) for each piece of `rows` inside one document, in view order.
template <class Fn>
void for_each_piece(const Documents& d, const RowPositions& rows, Fn&& fn) {
  int64_t r = 0;
  for (const RowPositions::Run& run : rows.runs) {
    if (run.rows <= 0) continue;
    int64_t g = run.pos, left = run.rows;
    // One search per run; its next piece starts the next document (the planner's worst case,
    // a document per token, searched once per row before: 40% of a plan's time).
    for (int64_t doc = d.doc_of(g); left > 0; ++doc) {
      UPIPE_CHECK(doc < d.count(), "rows past the sequence of {} (a run at {} of {} rows)",
                  d.seq_len(), run.pos, run.rows);
      const int64_t n = std::min(left, d.start(doc) + d.length(doc) - g);
      fn(r, n, doc, g - d.start(doc));
      r += n, g += n, left -= n;
    }
  }
}

}  // namespace

double Documents::causal_work() const {
  double w = 0;
  for (int64_t i = 0; i < count(); ++i) w += run_work(0, length(i));
  return w;
}

double causal_work(const Documents& d, const RowPositions& rows) {
  double w = 0;
  for_each_piece(d, rows, [&](int64_t, int64_t n, int64_t, int64_t pos) { w += run_work(pos, n); });
  return w;
}

RowPositions Documents::positions_in_documents(const RowPositions& rows) const {
  RowPositions out;
  for_each_piece(*this, rows, [&](int64_t, int64_t n, int64_t, int64_t pos) {
    out.runs.push_back({n, pos});
  });
  return out;
}

std::vector<DocSpan> Documents::spans(const RowPositions& rows) const {
  std::vector<DocSpan> out;
  out.reserve(size_t(span_count(rows)));
  append_spans(rows, out);
  return out;
}

void Documents::append_spans(const RowPositions& rows, std::vector<DocSpan>& out) const {
  for_each_piece(*this, rows, [&](int64_t r, int64_t n, int64_t doc, int64_t pos) {
    out.push_back({r, n, doc, pos});
  });
}

int64_t Documents::span_count(const RowPositions& rows) const {
  int64_t n = 0;
  for_each_piece(*this, rows, [&](int64_t, int64_t, int64_t, int64_t) { ++n; });
  return n;
}

namespace {

// A unit of the placement: a whole document, or one zigzag pair of chunks of a long one.
struct Item {
  double work = 0;
  int64_t order = 0;  // sequence order, for ties
  std::vector<RowPositions::Run> runs;
  int64_t rows = 0;
};

struct Member {
  double work = 0;
  int64_t room = 0;
  std::vector<RowPositions::Run> runs;
};

void add_run(const Documents& d, Item& it, int64_t g, int64_t n) {
  if (n <= 0) return;
  it.runs.push_back({n, g});
  it.rows += n;
  it.work += run_work(g - d.start(d.doc_of(g)), n);
}

std::vector<Item> placement_items(const Documents& d, int members) {
  const double total = d.causal_work();
  const int64_t c2 = 2 * int64_t(members);
  std::vector<Item> items;
  for (int64_t i = 0; i < d.count(); ++i) {
    const int64_t s = d.start(i), len = d.length(i);
    if (members > 1 && run_work(0, len) * double(c2) > total) {
      auto bound = [&](int64_t k) { return s + k * len / c2; };  // k L / 2M rounded down
      for (int64_t k = 0; k < members; ++k) {
        Item it;
        it.order = int64_t(items.size());
        add_run(d, it, bound(k), bound(k + 1) - bound(k));
        add_run(d, it, bound(c2 - 1 - k), bound(c2 - k) - bound(c2 - 1 - k));
        items.push_back(std::move(it));
      }
      continue;
    }
    Item it;
    it.order = int64_t(items.size());
    add_run(d, it, s, len);
    items.push_back(std::move(it));
  }
  std::stable_sort(items.begin(), items.end(),
                   [](const Item& a, const Item& b) { return a.work > b.work; });
  return items;
}

// Step 3: an item that fits nowhere whole fills the members with room, least work first.
void cut_item(const Documents& d, const Item& it, std::vector<Member>& ms) {
  std::vector<size_t> order(ms.size());
  std::iota(order.begin(), order.end(), size_t(0));
  std::stable_sort(order.begin(), order.end(),
                   [&](size_t a, size_t b) { return ms[a].work < ms[b].work; });
  size_t at = 0;
  for (RowPositions::Run run : it.runs) {
    while (run.rows > 0) {
      while (ms[order[at]].room == 0) ++at;
      Member& m = ms[order[at]];
      const int64_t n = std::min(run.rows, m.room);
      m.runs.push_back({n, run.pos});
      m.room -= n;
      m.work += run_work(run.pos - d.start(d.doc_of(run.pos)), n);
      run.pos += n, run.rows -= n;
    }
  }
}

}  // namespace

std::vector<RowPositions> place_documents(const Documents& d, int members) {
  UPIPE_CHECK(members >= 1 && d.seq_len() % members == 0,
              "cannot place {} rows over {} ring members", d.seq_len(), members);
  std::vector<Member> ms(static_cast<size_t>(members));
  for (Member& m : ms) m.room = d.seq_len() / members;
  for (const Item& it : placement_items(d, members)) {
    Member* best = nullptr;
    for (Member& m : ms)
      if (m.room >= it.rows && (best == nullptr || m.work < best->work)) best = &m;
    if (best == nullptr) {
      cut_item(d, it, ms);
      continue;
    }
    best->runs.insert(best->runs.end(), it.runs.begin(), it.runs.end());
    best->room -= it.rows;
    best->work += it.work;
  }
  std::vector<RowPositions> out(static_cast<size_t>(members));
  for (size_t i = 0; i < ms.size(); ++i) {
    std::vector<RowPositions::Run>& runs = ms[i].runs;
    std::sort(runs.begin(), runs.end(), [](const auto& a, const auto& b) { return a.pos < b.pos; });
    for (const RowPositions::Run& r : runs) {
      std::vector<RowPositions::Run>& o = out[i].runs;
      if (!o.empty() && o.back().pos + o.back().rows == r.pos)
        o.back().rows += r.rows;
      else
        o.push_back(r);
    }
  }
  return out;
}

DocMask::DocMask(Device& dev, const Documents& d, std::span<const RowPositions> views) {
  int64_t total = 0;
  for (const RowPositions& v : views) total = checked_add(total, d.span_count(v), "mask spans");
  host_.reserve(size_t(total));
  for (const RowPositions& v : views) {
    first_.push_back(int64_t(host_.size()));
    d.append_spans(v, host_);
    count_.push_back(int64_t(host_.size()) - first_.back());
  }
  const int64_t bytes = checked_mul(int64_t(host_.size()), int64_t(sizeof(DocSpan)), "mask bytes");
  buf_ = Buffer(dev.mem(), bytes, Tag::kDocs);
  if (dev.backend().computes()) dev.copy(buf_.data(), host_.data(), bytes, CopyKind::kHostToDevice);
}

bool DocMask::any_visible(size_t qi, size_t ki) const {
  UPIPE_CHECK(qi < first_.size() && ki < first_.size(), "mask views {}, {} of {}", qi, ki,
              first_.size());
  // Both lists are sorted by (document, position): walk them by document; a document in both
  // has a visible pair iff its first key position is at most its last query position.
  const DocSpan *q = host_.data() + first_[qi], *qe = q + count_[qi];
  const DocSpan *k = host_.data() + first_[ki], *ke = k + count_[ki];
  while (q < qe && k < ke) {
    if (q->doc < k->doc) {
      ++q;
    } else if (k->doc < q->doc) {
      ++k;
    } else {
      const int64_t doc = q->doc, first_key = k->pos;
      while (q + 1 < qe && q[1].doc == doc) ++q;
      if (first_key <= q->pos + q->rows - 1) return true;
      ++q;
      while (k < ke && k->doc == doc) ++k;
    }
  }
  return false;
}

DocRows DocMask::list(size_t i) const {
  UPIPE_CHECK(i < first_.size(), "mask list {} of {}", i, first_.size());
  return {static_cast<const DocSpan*>(buf_.data()) + first_[i], count_[i], 0};
}

int64_t DocMask::bytes(const Documents& d, std::span<const RowPositions> views) {
  int64_t n = 0;
  for (const RowPositions& v : views) n = checked_add(n, d.span_count(v), "mask spans");
  return checked_mul(n, int64_t(sizeof(DocSpan)), "mask bytes");
}

}  // namespace upipe
