// Spelling hints for names a user typed ("did you mean ...?"): one edit distance for settings,
// run-file keys and command names alike.
#pragma once

#include <span>
#include <string>
#include <string_view>

namespace upipe {

// Levenshtein distance: insertions, deletions and substitutions of one character each cost 1.
size_t edit_distance(std::string_view a, std::string_view b);

// The candidate nearest to `name` by edit distance (the first of equals); "" when there is none.
std::string closest_name(std::string_view name, std::span<const std::string> candidates);

}  // namespace upipe
