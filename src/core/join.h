// A list of names in one message: "a, b, c".
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace upipe {

inline std::string join(const std::vector<std::string>& parts, std::string_view sep = ", ") {
  std::string s;
  for (const std::string& p : parts) {
    if (!s.empty()) s += sep;
    s += p;
  }
  return s;
}

}  // namespace upipe
