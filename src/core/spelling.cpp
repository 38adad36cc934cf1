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

namespace {

// Whether `typed` is `name` with letters left out, beginning as it does ("attn", "bnch").
bool abbreviates(std::string_view typed, std::string_view name) {
  if (typed.size() < 2 || typed.front() != name.front()) return false;
  size_t at = 0;
  for (const char ch : name)
    if (at < typed.size() && typed[at] == ch) ++at;
  return at == typed.size();
}

}  // namespace

std::string likely_name(std::string_view typed, std::span<const std::string> names) {
  std::vector<std::string> begun, abbreviated;
  for (const std::string& n : names) {
    if (!typed.empty() && n.starts_with(typed)) begun.push_back(n);
    if (abbreviates(typed, n)) abbreviated.push_back(n);
  }
  if (!begun.empty()) return closest_name(typed, begun);
  if (!abbreviated.empty()) return closest_name(typed, abbreviated);
  const std::string near = closest_name(typed, names);
  return !near.empty() && near_enough(typed, near) ? near : "";
}

}  // namespace upipe
