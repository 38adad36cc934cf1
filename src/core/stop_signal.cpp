#include "core/stop_signal.h"

#include <atomic>
#include <cerrno>
#include <csignal>
#include <cstring>

#include <fcntl.h>
#include <pthread.h>

#include "core/launcher.h"

namespace upipe {
namespace {

// Lock-free, hence async-signal-safe to store from the handler.
std::atomic<int> g_signal{0};
static_assert(std::atomic<int>::is_always_lock_free);

constexpr int kStopSignals[] = {SIGINT, SIGTERM, SIGUSR1, SIGUSR2};

// Whether this rank's stdout and stderr are its OpenMPI launcher's (set before any handler runs).
std::atomic<bool> g_launcher_output{false};
static_assert(std::atomic<bool>::is_always_lock_free);

void on_stop_signal(int sig) {
  g_signal.store(sig, std::memory_order_relaxed);
  // SIGINT/SIGTERM from mpirun are its abort: it stops reading the ranks' output (a pty) and
  // kills them odls_base_sigkill_timeout later. A rank writing its progress would block on the
  // full pty and never reach its checkpoint, so its output stops blocking: a line that does not
  // fit is dropped (a write interrupted here returns instead of waiting). fcntl is
  // async-signal-safe; the descriptors are the launcher's, shared with no shell.
  if ((sig == SIGINT || sig == SIGTERM) && g_launcher_output.load(std::memory_order_relaxed)) {
    const int saved = errno;  // the interrupted code may be about to read it
    for (int fd : {1, 2}) {
      const int fl = fcntl(fd, F_GETFL);
      if (fl >= 0) fcntl(fd, F_SETFL, fl | O_NONBLOCK);
    }
    errno = saved;
  }
}

}  // namespace

namespace {
void mask_stop_signals(int how) {
  sigset_t set;
  sigemptyset(&set);
  for (int sig : kStopSignals) sigaddset(&set, sig);
  pthread_sigmask(how, &set, nullptr);
}
}  // namespace

void hold_stop_signals() {
  mask_stop_signals(SIG_BLOCK);
}

void release_stop_signals() {
  mask_stop_signals(SIG_UNBLOCK);
}

void install_stop_handlers() {
  struct sigaction sa;
  std::memset(&sa, 0, sizeof sa);
  sa.sa_handler = on_stop_signal;
  sigemptyset(&sa.sa_mask);
  // SA_RESTART: a signal arriving inside a system call (file I/O, MPI's progress loop) must not
  // make that call fail. SA_RESETHAND: the second signal of a kind gets the default action.
  sa.sa_flags = SA_RESTART | SA_RESETHAND;
  g_launcher_output.store(started_by_launcher());
  for (int sig : kStopSignals) sigaction(sig, &sa, nullptr);
  // Output whose reader went away (a launcher's closed pipe) must not end a rank finishing its
  // step and checkpoint (SIGPIPE): the write fails instead.
  signal(SIGPIPE, SIG_IGN);
  release_stop_signals();  // one that came while they were held is handled now
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
