// Typed errors. ConfigError: bad user input, detected identically on every rank before any
// communication, so every rank can report it and exit cleanly. OutOfMemoryError: an arena
// budget was exceeded on one rank; the app ends the whole job from that rank.
#pragma once

#include <cstdint>
#include <stdexcept>
#include <string>

namespace upipe {

class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

class ConfigError : public Error {
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
