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

// `text` on one line: control bytes (a newline in a damaged file's header, a tab in a path) and
// bytes that are no valid UTF-8 (a damaged .npy header's) become C escapes (\n, \t, \xNN), so an
// error quoting untrusted bytes stays one line of text a log can hold and a terminal prints as
// it is. Valid UTF-8 stays (a path in any language), except the controls below.
inline std::string one_line(std::string_view text) {
  static const char kHex[] = "0123456789abcdef";
  std::string out;
  out.reserve(text.size());
  auto escape = [&](unsigned char u) {
    out += "\\x";
    out += kHex[u >> 4];
    out += kHex[u & 15];
  };
  for (size_t i = 0; i < text.size();) {
    const auto u = static_cast<unsigned char>(text[i]);
    if (u >= 0x80) {
      // The length of the UTF-8 sequence this byte leads, and the least code point it may encode
      // (shorter forms are overlong); 0 where it leads none.
      const size_t n = u >= 0xc2 && u <= 0xdf ? 2 : u >= 0xe0 && u <= 0xef ? 3
                       : u >= 0xf0 && u <= 0xf4 ? 4 : 0;
      bool ok = n > 0 && i + n <= text.size();
      uint32_t cp = n == 2 ? u & 0x1f : n == 3 ? u & 0x0f : u & 0x07;
      for (size_t k = 1; ok && k < n; ++k) {
        const auto c = static_cast<unsigned char>(text[i + k]);
        ok = (c & 0xc0) == 0x80;
        cp = (cp << 6) | (c & 0x3f);
      }
      const uint32_t least = n == 2 ? 0x80 : n == 3 ? 0x800 : 0x10000;
      // Valid, and not a control a line or a terminal acts on: C1 (U+0080..U+009F), the line and
      // paragraph separators (U+2028, U+2029: splitlines() breaks there), the bidirectional
      // embeddings, overrides and isolates (U+202A..U+202E, U+2066..U+2069: they reorder what a
      // terminal shows).
      ok = ok && cp >= least && cp <= 0x10ffff && !(cp >= 0xd800 && cp <= 0xdfff) &&
           !(cp >= 0x80 && cp <= 0x9f) && !(cp >= 0x2028 && cp <= 0x202e) &&
           !(cp >= 0x2066 && cp <= 0x2069);
      if (ok) {
        out.append(text.substr(i, n));
        i += n;
      } else {
        escape(u);
        ++i;
      }
      continue;
    }
    if (u >= 0x20 && u != 0x7f) {
      out += char(u);
    } else if (u == '\n') {
      out += "\\n";
    } else if (u == '\t') {
      out += "\\t";
    } else if (u == '\r') {
      out += "\\r";
    } else {
      escape(u);
    }
    ++i;
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
      : Error(render_setting_refs(what)),  // the budget's setting as the user gave it
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
