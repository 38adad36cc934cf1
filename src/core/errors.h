// Typed errors. ConfigError: bad user input, detected identically on every rank before any
// communication, so every rank can exit cleanly and rank 0 reports it. OutOfMemoryError: an
// arena budget was exceeded (or the system could not back an allocation) on one rank; the app
// ends the whole job from that rank. SizeError: a size computation overflowed 64 bits on one
// rank (input validation should have refused it first); the app ends the job from that rank.
#pragma once

#include <cstdint>
#include <stdexcept>
#include <string>
#include <string_view>

#include "core/setting_ref.h"

namespace upipe {

class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// `text` on one line: control bytes (a newline in a damaged file's header, a tab in a path)
// become C escapes (\n, \t, \xNN), so an error quoting untrusted bytes stays one line a log can
// hold and a terminal prints as it is.
inline std::string one_line(std::string_view text) {
  static const char kHex[] = "0123456789abcdef";
  std::string out;
  out.reserve(text.size());
  for (const char c : text) {
    const auto u = static_cast<unsigned char>(c);
    if (u >= 0x20 && u != 0x7f) {
      out += c;
    } else if (c == '\n') {
      out += "\\n";
    } else if (c == '\t') {
      out += "\\t";
    } else if (c == '\r') {
      out += "\\r";
    } else {
      out += "\\x";
      out += kHex[u >> 4];
      out += kHex[u & 15];
    }
  }
  return out;
}

// At most `max` bytes of an untrusted file's text for an error message, then how many more
// there were: a damaged header quoted in full could be gigabytes.
inline std::string excerpt(std::string_view text, size_t max = 80) {
  if (text.size() <= max) return std::string(text);
  return std::string(text.substr(0, max)) + "... (" + std::to_string(text.size() - max) +
         " more bytes)";
}

// Its message may name settings through setting_ref / setting_value (core/setting_ref.h); they
// are rendered, in the spelling the user gave, when the error is built. The message is one line
// (one_line): users' files and paths are quoted in it.
class ConfigError : public Error {
 public:
  explicit ConfigError(const std::string& what) : Error(one_line(render_setting_refs(what))) {}
};

class SizeError : public Error {
 public:
  using Error::Error;
};

class OutOfMemoryError : public Error {
 public:
  OutOfMemoryError(const std::string& what, std::string arena, std::string tag, int64_t request,
                   std::string breakdown)
      : Error(what),
        arena(std::move(arena)),
        tag(std::move(tag)),
        request(request),
        breakdown(std::move(breakdown)) {}
  std::string arena;
  std::string tag;
  int64_t request;
  std::string breakdown;  // "tag=bytes, ..." of live allocations at the failure
  bool backing = false;   // within the budget, but the memory behind the arena ran out
};

}  // namespace upipe
