#include "backend/work_count.h"

#include <algorithm>

#include "core/checked.h"

namespace upipe {

int64_t visible_pairs(int64_t sq, int64_t sk, int64_t q_pos0, int64_t k_pos0, bool causal) {
  if (sq <= 0 || sk <= 0) return 0;
  if (!causal) return checked_mul(sq, sk, "attention pairs");
  // Row i sees clamp(a + i, 0, sk) keys, a = q_pos0 - k_pos0 + 1: none, then a ramp, then all.
  const int64_t a =
      checked_add(checked_add(q_pos0, -k_pos0, "attention positions"), 1, "attention positions");
  const int64_t ramp0 = std::clamp<int64_t>(1 - a, 0, sq);         // first row that sees a key
  const int64_t full0 = std::clamp<int64_t>(sk - a, 0, sq);        // first row that sees all sk
  int64_t pairs = checked_mul(sq - full0, sk, "attention pairs");  // full0 >= ramp0: sk >= 1
  if (full0 > ramp0) {
    // Rows ramp0 .. full0 - 1 see a + i keys each: an arithmetic series of n terms.
    const int64_t n = full0 - ramp0, first = a + ramp0, last = a + full0 - 1;
    const int64_t sum = (first + last) % 2 == 0
                            ? checked_mul((first + last) / 2, n, "attention pairs")
                            : checked_mul(first + last, n / 2, "attention pairs");
    pairs = checked_add(pairs, sum, "attention pairs");
  }
  return pairs;
}

}  // namespace upipe
