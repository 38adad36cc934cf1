// Always-on CHECK and debug-only DCHECK. A failed check is a bug or an unrecoverable fault:
// it prints rank, file:line, the condition and a hint, then ends the whole job through the
// fatal handler (the MPI backend installs one that calls MPI_Abort, so no rank hangs).
#pragma once

#include <fmt/format.h>

#include <string>

namespace upipe {

// Rank shown in fatal messages and logs; -1 until a communicator sets it.
void set_log_rank(int rank);
int log_rank();
// This machine's host name (gethostname, read once), for messages that name where a rank runs.
const std::string& host_name();

// Called by fatal(); must not return. Default: std::abort().
using FatalHandler = void (*)(int exit_code);
void set_fatal_handler(FatalHandler h);

[[noreturn]] void fatal(const char* file, int line, const std::string& msg);

namespace detail {
inline std::string check_msg() {
  return {};
}
template <class... A>
std::string check_msg(fmt::format_string<A...> f, A&&... a) {
  return fmt::format(f, std::forward<A>(a)...);
}
[[noreturn]] void check_failed(const char* file, int line, const char* cond,
                               const std::string& hint);
}  // namespace detail

}  // namespace upipe

#define UPIPE_CHECK(cond, ...)                                                \
  do {                                                                        \
    if (!(cond)) [[unlikely]]                                                 \
      ::upipe::detail::check_failed(__FILE__, __LINE__, #cond,                \
                                    ::upipe::detail::check_msg(__VA_ARGS__)); \
  } while (0)

#ifdef NDEBUG
#define UPIPE_DCHECK(cond, ...) \
  do {                          \
  } while (0)
#else
#define UPIPE_DCHECK(cond, ...) UPIPE_CHECK(cond, __VA_ARGS__)
#endif
