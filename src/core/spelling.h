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

// The most edits a suggestion for what was typed may be away: max(2, a third of its length)
// (`--froce` is a misspelt `--force`; `--json` is no misspelt `--lr`).
size_t near_limit(std::string_view typed);
// Whether `candidate` is within near_limit(typed) edits of what was typed.
bool near_enough(std::string_view typed, std::string_view candidate);

// The name a user most likely meant by `typed` among `names` (command names): one it begins
// (`att` for attention), else one it abbreviates (its letters in order, the first alike: `attn`
// for attention, not the nearer `comm`), else the nearest within near_limit; of several, the
// nearest by edit distance (the first of equals). "" when none is likely.
std::string likely_name(std::string_view typed, std::span<const std::string> names);

}  // namespace upipe
