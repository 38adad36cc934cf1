// How a global sequence of S tokens is sharded over the C ranks of a CP group, and the helpers
// that cut a global tensor into a rank's shard and put shards back together (tests, `upipe
// check`, and the training data path).
//   contiguous: rank r holds tokens [r S/C, (r+1) S/C).
//   zigzag:     the sequence is cut into 2C chunks; rank r holds chunks r and 2C-1-r (ring
//               attention's causal load balance).
//   chunked:    the sequence is cut into N chunks; rank r holds sub-chunk r (of S/(N C)
//               tokens) of every chunk, so the all-to-all of local chunk i yields global
//               chunk i (FPDT).
//   zigzag grid (USP): the C ranks form r = C/u groups of u consecutive ranks. The sequence
//               is zigzag-sharded over the r groups (group g owns chunks g and 2r-1-g of S/(2r)
//               tokens, in that order), and member j of a group holds the j-th of u equal
//               contiguous slices of its group's token list, so the group's all-to-all, which
//               concatenates the members' rows, assembles exactly the group's zigzag shard.
//               u = 1 is zigzag, u = C contiguous.
// With packed documents (documents.h) the zigzag kinds place the documents instead
// (place_documents: whole short documents, long ones cut as zigzag cuts one sequence, balancing
// the causal work): rank r of zigzag, and group g of the grid, holds member r's (g's) rows of
// that placement, the grid's members consecutive slices of it as above. Contiguous and chunked
// layouts do not depend on the documents. Every layout keeps a rank's rows in ascending global
// order.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "backend/rope.h"
#include "core/tensor.h"

namespace upipe {

class Documents;

enum class LayoutKind { kContiguous, kZigzag, kChunked, kZigzagGrid };

struct SeqLayout {
  LayoutKind kind = LayoutKind::kContiguous;
  int64_t seq_len = 0;     // S
  int ranks = 1;           // C
  int chunks = 1;          // N (chunked only)
  int ulysses_degree = 1;  // u: ranks per Ulysses group (zigzag grid only)
  // Packed documents (null: one document) and, for the zigzag kinds, their placement over the
  // ring members (with_documents sets both).
  std::shared_ptr<const Documents> docs = nullptr;
  std::shared_ptr<const std::vector<RowPositions>> placed = nullptr;

  int64_t local_rows() const { return seq_len / ranks; }
  // Global positions of rank r's rows, as runs.
  RowPositions positions(int rank) const;
  // Granularity S must be divisible by.
  int64_t divisor() const;
  const char* name() const;
  // Ring members of the zigzag kinds (C, or C/u groups of the grid); 1 for the others.
  int ring_members() const;
};

// `l` for a sequence of documents `docs` (null or one document: l unchanged, no documents).
SeqLayout with_documents(SeqLayout l, std::shared_ptr<const Documents> docs);

// Rows [lo, hi) of the rows `rows` lists (in list order), as runs.
RowPositions slice_rows(const RowPositions& rows, int64_t lo, int64_t hi);

class Communicator;
class Device;

// Copies rank `rank`'s rows of a global (S, cols) tensor into its (S/C, cols) shard.
void shard_rows(Device& dev, const SeqLayout& layout, int rank, const Mat& global,
                const Mat& local);
// Every rank receives the whole (S, cols) tensor in global row order from the ranks' shards
// (an all-gather, then rows placed by the layout); staging comes from dev's device arena.
void gather_rows(Device& dev, Communicator& comm, const SeqLayout& layout, const Mat& local,
                 const Mat& global);

}  // namespace upipe
