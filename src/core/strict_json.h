// JSON from files users give (config.json, safetensors headers, index files, checkpoint
// metadata) parsed strictly: a key given twice in one object is an error, where nlohmann::json
// (like most parsers) would silently keep the last one, so two readers of the same file could
// disagree about what it says.
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <string_view>

namespace upipe {

// Parses `text`; ConfigError "SOURCE: duplicate key 'K' in one JSON object" for a repeated key,
// "SOURCE: not valid JSON: ..." for anything else nlohmann::json refuses: a syntax error, and also
// a number outside a double (1e999), which it throws as out_of_range rather than parse_error.
nlohmann::json parse_json_strict(std::string_view text, const std::string& source);

}  // namespace upipe
