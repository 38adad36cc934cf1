// Which keys each query row of an attention problem sees, for the CPU kernels' tile decisions:
// always one contiguous range [lo, hi) of key rows (causal: [0, i + q_pos0 - k_pos0 + 1) clipped;
// not causal: every key; document-causal: the keys of the row's document at positions up to its
// own, found in the problem's DocRows by document id and position). Over the query rows both
// bounds never decrease, so a key tile is skipped, taken whole or masked per row from them.
#pragma once

#include <cstdint>

#include "backend/backend.h"

namespace upipe::cpu {

// lo[r], hi[r] for the query rows i0 + r, r in [0, n): the key rows row i0 + r sees.
void key_ranges(const AttnProblem& p, int64_t i0, int64_t n, int64_t* lo, int64_t* hi);

// The query rows [first, end) among which every row that sees a key of [j0, j0 + n) lies (rows
// inside may see none of them).
struct RowRange {
  int64_t first = 0, end = 0;
};
RowRange query_rows(const AttnProblem& p, int64_t j0, int64_t n);

// The key rows [first, end) some row of lo, hi (n rows) sees; first = end when none sees any.
RowRange keys_seen(const int64_t* lo, const int64_t* hi, int64_t n);

}  // namespace upipe::cpu
