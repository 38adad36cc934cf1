// JSON from files users give (config.json, safetensors headers, index files, checkpoint
// metadata) parsed strictly: a key given twice in one object is an error, where nlohmann::json
// (like most parsers) would silently keep the last one, so two readers of the same file could
// disagree about what it says.
#pragma once

#include <nlohmann/json.hpp>
#include <cstdint>
#include <string>
#include <string_view>

namespace upipe {

// Arrays and objects nested deeper than this are refused: nlohmann::json's dump() recurses, so a
// 200 KB file of brackets quoted in an error message overflowed the stack (a segfault, no error).
// Every file upipe reads nests at most 4 deep.
inline constexpr int kMaxJsonDepth = 64;

// Values (numbers, strings, arrays, objects) in one file past this are refused as they are read:
// a parsed value costs nlohmann::json about 16 bytes and more in its arrays (a 90 MB
// safetensors header of one 45-million-dimension shape would take 1.7 GB before any check). A real file holds far fewer (a safetensors header about ten a tensor).
inline constexpr int64_t kMaxJsonValues = int64_t(1) << 23;

// Parses `text`; ConfigError "SOURCE: duplicate key 'K' in one JSON object" for a repeated key,
// "SOURCE: nested more than 64 deep" past kMaxJsonDepth, "SOURCE: more than N values" past
// `max_values`, "SOURCE: not valid JSON: ..." for
// anything else nlohmann::json refuses: a syntax error, and also a number outside a double
// (1e999), which it throws as out_of_range rather than parse_error. Its text is quoted as an
// excerpt (a 50 MB token stays out of the message).
nlohmann::json parse_json_strict(std::string_view text, const std::string& source,
                                 int64_t max_values = kMaxJsonValues);

// nlohmann::json's exception text without its id ("[json.exception.type_error.302] "), which
// says nothing to a user.
std::string json_error_text(const std::exception& e);

// A value of a parsed file for an error message: its JSON text, at most `max` bytes of it.
std::string json_excerpt(const nlohmann::json& v, size_t max = 80);

}  // namespace upipe
