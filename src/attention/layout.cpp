#include "attention/layout.h"

#include <algorithm>
#include <numeric>

#include "attention/documents.h"
#include "backend/device.h"
#include "backend/tensor_ops.h"
#include "comm/communicator.h"
#include "core/check.h"

namespace upipe {

int64_t SeqLayout::divisor() const {
  switch (kind) {
    case LayoutKind::kContiguous:
      return ranks;
    case LayoutKind::kZigzag:
      return 2 * int64_t(ranks);
    case LayoutKind::kChunked:
      return int64_t(chunks) * ranks;
    case LayoutKind::kZigzagGrid:
      return std::lcm(int64_t(ranks), 2 * int64_t(ranks / ulysses_degree));
  }
  return ranks;
}

const char* SeqLayout::name() const {
  switch (kind) {
    case LayoutKind::kContiguous:
      return "contiguous";
    case LayoutKind::kZigzag:
      return "zigzag";
    case LayoutKind::kChunked:
      return "chunked";
    case LayoutKind::kZigzagGrid:
      return "zigzag-grid";
  }
  return "?";
}

int SeqLayout::ring_members() const {
  if (kind == LayoutKind::kZigzag) return ranks;
  if (kind == LayoutKind::kZigzagGrid) return ranks / ulysses_degree;
  return 1;
}

SeqLayout with_documents(SeqLayout l, std::shared_ptr<const Documents> docs) {
  l.docs = packed(docs) ? std::move(docs) : nullptr;
  l.placed = nullptr;
  const bool zigzag = l.kind == LayoutKind::kZigzag || l.kind == LayoutKind::kZigzagGrid;
  if (l.docs && zigzag) {
    UPIPE_CHECK(l.docs->seq_len() == l.seq_len, "documents of {} rows for a sequence of {}",
                l.docs->seq_len(), l.seq_len);
    l.placed = std::make_shared<const std::vector<RowPositions>>(
        place_documents(*l.docs, l.ring_members()));
  }
  return l;
}

RowPositions slice_rows(const RowPositions& rows, int64_t lo, int64_t hi) {
  RowPositions out;
  int64_t r = 0;
  for (const RowPositions::Run& run : rows.runs) {
    const int64_t a = std::max(lo, r), b = std::min(hi, r + run.rows);
    if (a < b) out.runs.push_back({b - a, run.pos + a - r});
    r += run.rows;
  }
  return out;
}

RowPositions SeqLayout::positions(int rank) const {
  UPIPE_CHECK(seq_len % divisor() == 0, "seq_len {} not divisible by {}", seq_len, divisor());
  if (placed && kind == LayoutKind::kZigzag) return (*placed)[size_t(rank)];
  if (placed && kind == LayoutKind::kZigzagGrid) {
    const int64_t n = seq_len / ranks, j = rank % ulysses_degree;
    return slice_rows((*placed)[size_t(rank / ulysses_degree)], j * n, (j + 1) * n);
  }
  RowPositions p;
  switch (kind) {
    case LayoutKind::kContiguous:
      p.runs.push_back({seq_len / ranks, rank * (seq_len / ranks)});
      break;
    case LayoutKind::kZigzag: {
      const int64_t c = seq_len / (2 * ranks);
      p.runs.push_back({c, rank * c});
      p.runs.push_back({c, (2 * int64_t(ranks) - 1 - rank) * c});
      break;
    }
    case LayoutKind::kChunked: {
      const int64_t chunk = seq_len / chunks, sub = chunk / ranks;
      for (int i = 0; i < chunks; ++i) p.runs.push_back({sub, i * chunk + rank * sub});
      break;
    }
    case LayoutKind::kZigzagGrid: {
      // Slice [j n, (j+1) n) of group g's list [chunk g, chunk 2r-1-g], n = S/C.
      UPIPE_CHECK(ulysses_degree >= 1 && ranks % ulysses_degree == 0,
                  "ulysses_degree {} does not divide {} ranks", ulysses_degree, ranks);
      const int r = ranks / ulysses_degree, g = rank / ulysses_degree, j = rank % ulysses_degree;
      const int64_t c = seq_len / (2 * int64_t(r)), n = seq_len / ranks;
      const int64_t lo = j * n, hi = lo + n;
      const RowPositions::Run chunk[2] = {{c, g * c}, {c, (2 * int64_t(r) - 1 - g) * c}};
      for (int i = 0; i < 2; ++i) {
        const int64_t a = std::max(lo, i * c), b = std::min(hi, (i + 1) * c);
        if (a < b) p.runs.push_back({b - a, chunk[i].pos + a - i * c});
      }
      break;
    }
  }
  return p;
}

}  // namespace upipe

namespace upipe {

void shard_rows(Device& dev, const SeqLayout& layout, int rank, const Mat& global,
                const Mat& local) {
  UPIPE_CHECK(global.rows == layout.seq_len && local.rows == layout.local_rows() &&
                  global.cols == local.cols,
              "shard_rows: global {}x{}, local {}x{}, layout S={} C={}", global.rows, global.cols,
              local.rows, local.cols, layout.seq_len, layout.ranks);
  int64_t r = 0;
  for (const RowPositions::Run& run : layout.positions(rank).runs) {
    copy(dev, local.rows_of(r, run.rows), global.rows_of(run.pos, run.rows));
    r += run.rows;
  }
}

void gather_rows(Device& dev, Communicator& comm, const SeqLayout& layout, const Mat& local,
                 const Mat& global) {
  UPIPE_CHECK(comm.size() == layout.ranks && local.rows == layout.local_rows() &&
                  global.rows == layout.seq_len && local.cols == global.cols &&
                  local.dtype == global.dtype && local.contiguous(),
              "gather_rows: local {}x{} global {}x{} on {} ranks", local.rows, local.cols,
              global.rows, global.cols, comm.size());
  Tensor all(dev.mem(), Tag::kOther, local.dtype, local.rows * comm.size(), local.cols);
  comm.all_gather(local.data, all.data(), local.bytes());
  for (int j = 0; j < comm.size(); ++j) {
    int64_t r = 0;
    for (const RowPositions::Run& run : layout.positions(j).runs) {
      copy(dev, global.rows_of(run.pos, run.rows), all.mat().rows_of(j * local.rows + r, run.rows));
      r += run.rows;
    }
  }
}

}  // namespace upipe
