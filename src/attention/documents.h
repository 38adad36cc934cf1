// Packed sequences: the documents one sequence of S tokens holds (lengths summing to S, a length
// of 1 allowed). Token i attends to token j iff both lie in the same document and j <= i; RoPE
// positions restart at 0 in every document; a document's last token predicts nothing. A sequence
// of one document is the plain causal sequence (every consumer takes `packed(docs)` false for it
// and runs exactly the one-document code).
//
// Rows are named by their index in the packed sequence (the "global rows" of layout.h); a
// document's rows are consecutive there, so every layout that keeps a rank's rows in ascending
// global order also keeps them sorted by (document, position), which the kernels' DocRows need.
//
// Also here: the ring layouts' placement of documents over ring members (place_documents,
// docs/documents.md, "The ring balancing rule") and the mask metadata a strategy builds once per
// layer (DocMask: span lists in the device arena, tag docs).
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "backend/device.h"
#include "core/arena.h"

namespace upipe {

class Documents {
 public:
  // lengths: each >= 1, summing to seq_len; otherwise a ConfigError naming `what` (the setting
  // or file the lengths came from).
  Documents(std::span<const int64_t> lengths, int64_t seq_len,
            const std::string& what = "the document lengths");

  int64_t count() const { return int64_t(starts_.size()) - 1; }
  int64_t seq_len() const { return starts_.back(); }
  int64_t start(int64_t i) const { return starts_[size_t(i)]; }
  int64_t length(int64_t i) const { return starts_[size_t(i) + 1] - starts_[size_t(i)]; }
  std::vector<int64_t> lengths() const;
  // The document holding global row `row`.
  int64_t doc_of(int64_t row) const;
  // Whether `row` is its document's last token (its prediction is outside the document).
  bool last_of_document(int64_t row) const;
  // Next-token predictions inside documents: S minus the number of documents.
  int64_t predictions() const { return seq_len() - count(); }
  // The causal work sum over documents of L (L + 1) / 2 (query-key pairs), in fp64.
  double causal_work() const;

  // Positions inside their documents of the rows `rows` (global rows, as runs): the runs split
  // at document starts, RoPE's positions.
  RowPositions positions_in_documents(const RowPositions& rows) const;
  // The document spans of a view whose rows are `rows` (global rows, ascending): one span per
  // piece of a document, rows numbered from 0 in view order.
  std::vector<DocSpan> spans(const RowPositions& rows) const;
  // The same spans appended to `out`, and their number alone (no list built).
  void append_spans(const RowPositions& rows, std::vector<DocSpan>& out) const;
  int64_t span_count(const RowPositions& rows) const;

 private:
  std::vector<int64_t> starts_;  // count() + 1 prefix sums of the lengths
};

// Whether docs describes more than one document; none or one is the plain causal sequence.
inline bool packed(const Documents* d) {
  return d != nullptr && d->count() > 1;
}
inline bool packed(const std::shared_ptr<const Documents>& d) {
  return packed(d.get());
}

// The ring layouts' placement (ring, usp, upipe-ring) of the documents over `members` ring
// members of S / members rows each, balancing the causal work (docs/documents.md):
//   1. items: a long document (work L (L + 1) / 2 above W / (2 members), W the total work) is cut
//      as zigzag cuts one sequence, into 2 members chunks whose boundaries round k L / (2
//      members) down, and chunks k and 2 members - 1 - k form item k; every other document is
//      one item, kept whole.
//   2. items in decreasing work (ties: in sequence order) go to the member with the least work
//      so far among those with room for all of the item's rows (ties: the lowest member);
//   3. an item no member has room for is cut, head first, into pieces that fill the members with
//      room, least work first.
// Each member's rows are returned as ascending runs of global rows. One document whose length
// 2 members divides gives exactly the zigzag layout.
std::vector<RowPositions> place_documents(const Documents& d, int members);

// The causal work (query-key pairs inside documents) of the global rows `rows`.
double causal_work(const Documents& d, const RowPositions& rows);

// The mask metadata of one forward or backward: one DocSpan list per view (the rows of each as
// global rows), in the device arena under tag docs, shared by every stage, chunk and ring step.
// On a device that does not compute it is allocated (counted) and not written.
class DocMask {
 public:
  DocMask() = default;
  DocMask(Device& dev, const Documents& d, std::span<const RowPositions> views);
  DocRows list(size_t i) const;
  // Whether some query row of view qi sees some key row of view ki: a document in both, with a
  // key at a position at most a query's (a ring step with nothing to compute is skipped).
  bool any_visible(size_t qi, size_t ki) const;
  // The bytes it allocates for these views.
  static int64_t bytes(const Documents& d, std::span<const RowPositions> views);

 private:
  Buffer buf_;
  std::vector<DocSpan> host_;           // the lists, for decisions made on the host
  std::vector<int64_t> first_, count_;  // per view: its list's first span and span count
};

}  // namespace upipe
