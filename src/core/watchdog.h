// The job's hang detector, like PyTorch's collective timeout: a collective (every call of the
// MPI communicator, blocking or a Work::wait) or a training step that makes no progress for
// timeout_s seconds ends this process with kWatchdogExitCode and a message naming the rank, the
// operation and the context (step, phase). Ending one rank is enough: mpirun then kills the
// others, a stopped one included (docs/training-signals.md), and where mpirun cannot (a host
// unreachable) the rank's launcher guard ends mpirun (core/launcher.h). A rank waiting in a
// collective for a stopped or stuck peer makes no progress, so the waiting ranks detect a peer
// that cannot.
//
// The watchdog is armed only while an operation (WatchdogOp) or a context (WatchdogContext) is
// open, so a rank idling between commands, or one with no watchdog started, never times out.
// Progress is a process-wide counter: entering or leaving a scope and watchdog_beat() bump it.
// A background thread samples the counter every min(1 s, timeout/4). Scopes and beats come from
// the one thread that communicates (MPI_THREAD_FUNNELED), so they are plain relaxed loads and
// stores, no locked read-modify-writes: a few nanoseconds per collective.
#pragma once

#include <atomic>
#include <cstdint>
#include <string>

namespace upipe {

inline constexpr double kDefaultWatchdogTimeoutS = 600;  // comm.timeout (--timeout)
inline constexpr int kWatchdogExitCode = 4;              // status of a rank the watchdog ends

// Called on the watchdog thread with the full message when the timeout expires. The default
// writes the message to stderr and calls _exit(kWatchdogExitCode): it works even while the main
// thread is blocked inside MPI, which MPI_Abort from another thread would not
// (MPI_THREAD_FUNNELED).
using WatchdogAction = void (*)(const std::string& message);

class Watchdog {
 public:
  // Starts the process-wide watchdog thread, or restarts it with a new timeout. timeout_s <= 0
  // stops it (no timeout). on_timeout == nullptr: the default action above.
  static void start(double timeout_s, WatchdogAction on_timeout = nullptr);
  static void stop();
  // The running timeout in seconds; 0 when stopped.
  static double timeout_s();
  // The message the watchdog prints after `idle_s` seconds without progress, naming this rank
  // (log_rank()), the open operation and the contexts.
  static std::string message(double idle_s);
};

namespace detail {
extern std::atomic<uint64_t> g_watchdog_progress;
}  // namespace detail

// Progress: call from long loops that make progress without communicating.
inline void watchdog_beat() {
  auto& p = detail::g_watchdog_progress;
  p.store(p.load(std::memory_order_relaxed) + 1, std::memory_order_relaxed);
}

// Names the operation in progress ("all_to_all"; a string literal or other static string) and
// arms the watchdog while it lives. Nested operations restore the outer name on exit.
class WatchdogOp {
 public:
  explicit WatchdogOp(const char* op);
  ~WatchdogOp();
  WatchdogOp(const WatchdogOp&) = delete;
  WatchdogOp& operator=(const WatchdogOp&) = delete;

 private:
  const char* prev_;
};

// A context label shown after the operation ("step 12", "attention forward"); contexts nest and
// are listed outermost first. Arms the watchdog while it lives, so a step that hangs outside any
// collective is caught too. Costs a mutex and a string: open it per step or phase, not per call.
class WatchdogContext {
 public:
  explicit WatchdogContext(std::string label);
  ~WatchdogContext();
  WatchdogContext(const WatchdogContext&) = delete;
  WatchdogContext& operator=(const WatchdogContext&) = delete;
};

}  // namespace upipe
