#include "core/stop_signal.h"

#include <atomic>
#include <csignal>
#include <cstring>

namespace upipe {
namespace {

// Lock-free, hence async-signal-safe to store from the handler.
std::atomic<int> g_signal{0};
static_assert(std::atomic<int>::is_always_lock_free);

constexpr int kStopSignals[] = {SIGINT, SIGTERM, SIGUSR1, SIGUSR2};

void on_stop_signal(int sig) {
  g_signal.store(sig, std::memory_order_relaxed);
}

}  // namespace

void install_stop_handlers() {
  struct sigaction sa;
  std::memset(&sa, 0, sizeof sa);
  sa.sa_handler = on_stop_signal;
  sigemptyset(&sa.sa_mask);
  // SA_RESTART: a signal arriving inside a system call (file I/O, MPI's progress loop) must not
  // make that call fail. SA_RESETHAND: the second signal of a kind gets the default action.
  sa.sa_flags = SA_RESTART | SA_RESETHAND;
  for (int sig : kStopSignals) sigaction(sig, &sa, nullptr);
}

bool stop_requested() {
  return g_signal.load(std::memory_order_relaxed) != 0;
}

int stop_signal() {
  return g_signal.load(std::memory_order_relaxed);
}

void clear_stop_request() {
  g_signal.store(0, std::memory_order_relaxed);
}

}  // namespace upipe
