// What every harness of tools/fuzz shares: a scratch directory of its own (the readers take
// paths), the input written there, and the reader's contract on a refusal: a ConfigError of one
// line under 2000 characters. Any other exception escapes LLVMFuzzerTestOneInput and aborts, as
// does a crash, an ASan/UBSan report or an allocation past -malloc_limit_mb: each a finding.
#pragma once

#include <stdlib.h>

#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <string_view>

#include "core/errors.h"

namespace upipe::fuzz {

// A directory under $TMPDIR (or /tmp) for this process, upipe_fuzz_XXXXXX. It stays after the
// run: libFuzzer ends every run with _Exit, past any atexit handler.
inline const std::filesystem::path& scratch() {
  static const std::filesystem::path dir = [] {
    std::string tmpl = (std::filesystem::temp_directory_path() / "upipe_fuzz_XXXXXX").string();
    if (!mkdtemp(tmpl.data())) std::abort();
    return std::filesystem::path(tmpl);
  }();
  return dir;
}

// Writes `bytes` to `name` in the scratch directory (replacing it) and returns its path.
inline std::string write_file(const std::string& name, std::string_view bytes) {
  const std::string p = (scratch() / name).string();
  std::ofstream out(p, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), std::streamsize(bytes.size()));
  if (!out) std::abort();
  return p;
}

inline std::string_view as_text(const uint8_t* data, size_t size) {
  return {reinterpret_cast<const char*>(data), size};
}

// The refusal's contract; aborts (a finding) on a message of several lines or 2000 characters.
inline void check_refusal(const ConfigError& e) {
  const std::string_view msg = e.what();
  if (msg.find('\n') != std::string_view::npos || msg.size() >= 2000) {
    std::fprintf(stderr, "ConfigError breaks its contract (%zu chars): %.600s\n", msg.size(),
                 e.what());
    std::abort();
  }
}

// The reader's own contract on what it read; aborts (a finding) when `ok` is false.
inline void require(bool ok, const char* what) {
  if (!ok) {
    std::fprintf(stderr, "read, but breaks its contract: %s\n", what);
    std::abort();
  }
}

// Runs `read`; a ConfigError is a refusal, checked; anything else propagates. With
// UPIPE_FUZZ_SAY set in the environment, says which (running a harness on one input).
template <class F>
void refused_or_read(F&& read) {
  static const bool say = std::getenv("UPIPE_FUZZ_SAY") != nullptr;
  try {
    read();
    if (say) std::fprintf(stderr, "read\n");
  } catch (const ConfigError& e) {
    check_refusal(e);
    if (say) std::fprintf(stderr, "refused: %s\n", e.what());
  }
}

}  // namespace upipe::fuzz
