#include "core/strict_json.h"

#include <fmt/format.h>

#include <unordered_set>
#include <vector>

#include "core/errors.h"

namespace upipe {
namespace {

// Python's json module writes a float NaN or infinity as NaN / Infinity, which are no JSON: said
// so when the parser stopped on one (its "last read" ends in the start of such a literal).
std::string non_json_number_hint(const std::exception& e) {
  const std::string what = e.what();
  const size_t at = what.rfind("last read: '");
  if ((what.find("invalid literal") == std::string::npos &&
       what.find("invalid number") == std::string::npos) ||
      at == std::string::npos)
    return "";
  std::string last = what.substr(at + 12);
  if (!last.empty() && last.back() == '\'') last.pop_back();
  const size_t start = last.find_last_of(":,[ \t\n");
  const std::string token = start == std::string::npos ? last : last.substr(start + 1);
  if (token.starts_with("N") || token.starts_with("I") || token.starts_with("-I"))
    return " (NaN and Infinity, which Python's json writes for such floats, are not JSON: write a "
           "number or null there)";
  return "";
}

}  // namespace

nlohmann::json parse_json_strict(std::string_view text, const std::string& source,
                                 int64_t max_values) {
  using json = nlohmann::json;
  std::vector<std::unordered_set<std::string>> open;  // the keys of each object being parsed
  int64_t values = 0;
  const json::parser_callback_t check = [&](int depth, json::parse_event_t event, json& parsed) {
    if ((event == json::parse_event_t::value || event == json::parse_event_t::object_start ||
         event == json::parse_event_t::array_start) &&
        ++values > max_values)
      throw ConfigError(fmt::format(
          "{}: more than {} values (numbers, strings, arrays, objects); no file upipe reads holds "
          "so many",
          source, max_values));
    // `depth` counts the containers already open, so a new one is the depth + 1st.
    if ((event == json::parse_event_t::object_start || event == json::parse_event_t::array_start) &&
        depth >= kMaxJsonDepth)
      throw ConfigError(
          fmt::format("{}: nested more than {} deep (arrays or objects within each "
                      "other); no file upipe reads nests so",
                      source, kMaxJsonDepth));
    switch (event) {
      case json::parse_event_t::object_start:
        open.emplace_back();
        break;
      case json::parse_event_t::key:
        if (!open.back().insert(parsed.get<std::string>()).second)
          throw ConfigError(fmt::format("{}: duplicate key '{}' in one JSON object", source,
                                        parsed.get<std::string>()));
        break;
      case json::parse_event_t::object_end:
        open.pop_back();
        break;
      default:
        break;
    }
    return true;
  };
  try {
    return json::parse(text, check);
  } catch (const json::exception& e) {
    throw ConfigError(fmt::format("{}: not valid JSON: {}{}", source,
                                  excerpt(json_error_text(e), 300), non_json_number_hint(e)));
  }
}

std::string json_error_text(const std::exception& e) {
  std::string what = e.what();
  if (!what.empty() && what.front() == '[' && what.find("] ") != std::string::npos)
    what.erase(0, what.find("] ") + 2);
  return what;
}

std::string json_excerpt(const nlohmann::json& v, size_t max) {
  return excerpt(v.dump(), max);
}

}  // namespace upipe
