#include "core/strict_json.h"

#include <fmt/format.h>

#include <cctype>
#include <unordered_set>
#include <vector>

#include "core/errors.h"

namespace upipe {
namespace {

// Python's words where JSON has none: json.dump writes a float NaN or infinity as NaN / Infinity,
// and a Python literal pasted in (None, True, False) is no JSON either. Said when the parser
// stopped inside one (the word at the error's byte).
std::string python_word_hint(std::string_view text, const std::exception& e) {
  const auto* pe = dynamic_cast<const nlohmann::json::parse_error*>(&e);
  if (pe == nullptr || pe->byte == 0 || pe->byte > text.size()) return "";
  size_t start = pe->byte - 1;
  auto wordy = [](char c) { return std::isalpha(static_cast<unsigned char>(c)) || c == '-'; };
  while (start > 0 && wordy(text[start - 1])) --start;
  const std::string_view at = text.substr(start);
  for (const char* w : {"NaN", "Infinity", "-Infinity"})
    if (at.starts_with(w))
      return " (NaN and Infinity, which Python's json writes for such floats, are not JSON: write "
             "a number or null there)";
  for (const char* w : {"None", "True", "False"})
    if (at.starts_with(w))
      return " (None, True and False are Python's: JSON writes null, true and false)";
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
        // The key quoted as an excerpt: a key can be as long as the file.
        if (!open.back().insert(parsed.get<std::string>()).second)
          throw ConfigError(fmt::format("{}: duplicate key '{}' in one JSON object", source,
                                        excerpt(parsed.get<std::string>())));
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
                                  excerpt(json_error_text(e), 300), python_word_hint(text, e)));
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
