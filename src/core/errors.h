// Typed errors. ConfigError: bad user input, detected identically on every rank before any
// communication, so every rank can exit cleanly and rank 0 reports it. OutOfMemoryError: an
// arena budget was exceeded (or the system could not back an allocation) on one rank; the app
// ends the whole job from that rank. SizeError: a size computation overflowed 64 bits on one
// rank (input validation should have refused it first); the app ends the job from that rank.
#pragma once

#include <cstdint>
#include <stdexcept>
#include <string>

#include "core/setting_ref.h"

namespace upipe {

class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// Its message may name settings through setting_ref / setting_value (core/setting_ref.h); they
// are rendered, in the spelling the user gave, when the error is built.
class ConfigError : public Error {
 public:
  explicit ConfigError(const std::string& what) : Error(render_setting_refs(what)) {}
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
};

}  // namespace upipe
