#include "attention/layout.h"

#include "core/check.h"

namespace upipe {

int64_t SeqLayout::divisor() const {
  switch (kind) {
    case LayoutKind::kContiguous: return ranks;
    case LayoutKind::kZigzag: return 2 * int64_t(ranks);
    case LayoutKind::kChunked: return int64_t(chunks) * ranks;
  }
  return ranks;
}

const char* SeqLayout::name() const {
  switch (kind) {
    case LayoutKind::kContiguous: return "contiguous";
    case LayoutKind::kZigzag: return "zigzag";
    case LayoutKind::kChunked: return "chunked";
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
  }
  return p;
}

}  // namespace upipe
