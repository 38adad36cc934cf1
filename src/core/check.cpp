#include "core/check.h"

#include <unistd.h>

#include <cstdio>
#include <cstdlib>

namespace upipe {
namespace {
int g_rank = -1;
FatalHandler g_handler = nullptr;
}  // namespace

void set_log_rank(int rank) {
  g_rank = rank;
}
int log_rank() {
  return g_rank;
}
const std::string& host_name() {
  static const std::string name = [] {
    char h[256] = {};
    return ::gethostname(h, sizeof h - 1) == 0 && h[0] != '\0' ? std::string(h)
                                                               : std::string("unknown host");
  }();
  return name;
}
void set_fatal_handler(FatalHandler h) {
  g_handler = h;
}

void fatal(const char* file, int line, const std::string& msg) {
  std::fprintf(stderr, "[rank %d] %s:%d: %s\n", g_rank, file, line, msg.c_str());
  std::fflush(stderr);
  if (g_handler) g_handler(1);
  std::abort();
}

namespace detail {
void check_failed(const char* file, int line, const char* cond, const std::string& hint) {
  std::string msg = std::string("CHECK failed: ") + cond;
  if (!hint.empty()) msg += " — " + hint;
  fatal(file, line, msg);
}
}  // namespace detail

}  // namespace upipe
