#include "attention/layout.h"

#include <algorithm>
#include <numeric>

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
      return std::lcm(int64_t(ranks), 2 * int64_t(ranks / group));
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

RowPositions SeqLayout::positions(int rank) const {
  UPIPE_CHECK(seq_len % divisor() == 0, "seq_len {} not divisible by {}", seq_len, divisor());
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
      // Slice [j n, (j+1) n) of the group's list [chunk g, chunk 2r-1-g], n = S/C.
      UPIPE_CHECK(group >= 1 && ranks % group == 0, "group {} does not divide {} ranks", group,
                  ranks);
      const int r = ranks / group, g = rank / group, j = rank % group;
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
