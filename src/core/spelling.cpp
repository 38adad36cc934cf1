#include "core/spelling.h"

#include <algorithm>
#include <limits>
#include <vector>

namespace upipe {

size_t edit_distance(std::string_view a, std::string_view b) {
  std::vector<size_t> row(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    size_t diag = row[0];
    row[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      const size_t up = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diag + (a[i - 1] == b[j - 1] ? 0 : 1)});
      diag = up;
    }
  }
  return row[b.size()];
}

std::string closest_name(std::string_view name, std::span<const std::string> candidates) {
  std::string best;
  size_t best_d = std::numeric_limits<size_t>::max();
  for (const std::string& c : candidates)
    if (const size_t d = edit_distance(name, c); d < best_d) best_d = d, best = c;
  return best;
}

size_t near_limit(std::string_view typed) {
  return std::max<size_t>(2, typed.size() / 3);
}

bool near_enough(std::string_view typed, std::string_view candidate) {
  return edit_distance(typed, candidate) <= near_limit(typed);
}

}  // namespace upipe
