#include "core/fault_inject.h"

#include <fmt/format.h>

#include <cstdlib>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "core/check.h"
#include "core/errors.h"

namespace upipe {
namespace {

// The (phase, rank) pairs of UPIPE_INJECT_FAULT; ConfigError for a malformed entry.
std::vector<std::pair<std::string, int>> parse_faults(const char* spec) {
  std::vector<std::pair<std::string, int>> v;
  std::stringstream ss(spec);
  std::string item;
  while (std::getline(ss, item, ',')) {
    const size_t at = item.find('@');
    char* end = nullptr;
    const long rank = at == std::string::npos ? -1 : std::strtol(item.c_str() + at + 1, &end, 10);
    if (at == std::string::npos || at == 0 || end == nullptr || *end != '\0' || rank < 0)
      throw ConfigError(
          fmt::format("UPIPE_INJECT_FAULT: '{}' is not PHASE@RANK (e.g. checkpoint@1)", item));
    v.emplace_back(item.substr(0, at), int(rank));
  }
  return v;
}

}  // namespace

void fault_point(const char* phase) {
  static const char* spec = std::getenv("UPIPE_INJECT_FAULT");
  if (spec == nullptr || *spec == '\0') return;
  static const std::vector<std::pair<std::string, int>> faults = parse_faults(spec);
  for (const auto& [p, rank] : faults)
    if (p == phase && rank == log_rank())
      throw Error(
          fmt::format("injected fault in phase '{}' on rank {} (UPIPE_INJECT_FAULT)", phase, rank));
}

}  // namespace upipe
