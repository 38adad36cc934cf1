// Rotary position embedding (Llama rotate-half form), applied in place on q or k at global token
// positions; backward is the inverse rotation, also in place. Angles pos * base^(-2i/d) are
// evaluated in fp64 (exact sincos every 64 positions, fp64 rotation steps between), so positions
// in the millions stay accurate and a position's rotation never depends on how the sequence was
// sharded.
#pragma once

#include <cstdint>
#include <vector>

#include "core/device.h"
#include "core/tensor.h"

namespace upipe {

// Maps the local rows of a shard to global positions as runs: rows [start, start+len) hold
// positions [pos, pos+len). Contiguous shards have one run, zigzag shards two.
struct RowPositions {
  struct Run {
    int64_t rows, pos;
  };
  std::vector<Run> runs;
  static RowPositions contiguous(int64_t rows, int64_t pos0) { return {{{rows, pos0}}}; }
  int64_t total_rows() const;
  // Positions of each local row, expanded (tests and references).
  std::vector<int64_t> expand() const;
};

// x: (rows, heads*d), any dtype; rows covered by `pos`.
void rope_forward(Device& dev, const Mat& x, int d, const RowPositions& pos, double theta);
void rope_backward(Device& dev, const Mat& x, int d, const RowPositions& pos, double theta);

}  // namespace upipe
