#include "core/watchdog.h"

#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <thread>
#include <vector>

#include "core/check.h"
#include "core/launcher.h"
#include "core/setting_ref.h"

namespace upipe {

namespace detail {
std::atomic<uint64_t> g_watchdog_progress{0};
}  // namespace detail

namespace {

using Clock = std::chrono::steady_clock;

std::atomic<const char*> g_op{nullptr};
std::atomic<int> g_armed{0};  // open WatchdogOp + WatchdogContext scopes

std::mutex g_context_mu;
std::vector<std::string> g_contexts;  // guarded by g_context_mu

void default_action(const std::string& message) {
  const std::string line = message + "\n";
  size_t done = 0;
  while (done < line.size()) {
    const ssize_t n = ::write(STDERR_FILENO, line.data() + done, line.size() - done);
    if (n <= 0) break;
    done += size_t(n);
  }
  guard_launcher();
  ::_exit(kWatchdogExitCode);
}

// The thread and its settings; the destructor stops the thread at normal process exit.
struct Monitor {
  std::mutex mu;
  std::condition_variable cv;
  bool quit = false;  // guarded by mu
  std::thread thread;
  double timeout_s = 0;

  ~Monitor() { stop(); }

  void stop() {
    if (!thread.joinable()) return;
    {
      std::lock_guard lock(mu);
      quit = true;
    }
    cv.notify_all();
    thread.join();
    timeout_s = 0;
  }

  void start(double timeout, WatchdogAction action) {
    stop();
    quit = false;
    timeout_s = timeout;
    thread = std::thread([this, timeout, action] { run(timeout, action); });
  }

  void run(double timeout, WatchdogAction action) {
    const auto limit = std::chrono::duration<double>(timeout);
    const auto poll = std::min<Clock::duration>(
        std::chrono::seconds(1), std::chrono::duration_cast<Clock::duration>(limit / 4));
    uint64_t seen = detail::g_watchdog_progress.load(std::memory_order_relaxed);
    Clock::time_point since = Clock::now();
    std::unique_lock lock(mu);
    while (!cv.wait_for(lock, poll, [this] { return quit; })) {
      const uint64_t now_seen = detail::g_watchdog_progress.load(std::memory_order_relaxed);
      const Clock::time_point now = Clock::now();
      if (g_armed.load(std::memory_order_relaxed) == 0 || now_seen != seen) {
        seen = now_seen;
        since = now;
        continue;
      }
      const double idle = std::chrono::duration<double>(now - since).count();
      if (idle >= timeout) {
        action(Watchdog::message(timeout));
        since = now;  // a test's action returns; the default never does
      }
    }
  }
};

Monitor& monitor() {
  static Monitor m;
  return m;
}

}  // namespace

void Watchdog::start(double timeout_s, WatchdogAction on_timeout) {
  if (timeout_s <= 0) {
    stop();
    return;
  }
  monitor().start(timeout_s, on_timeout != nullptr ? on_timeout : default_action);
}

void Watchdog::stop() {
  monitor().stop();
}

double Watchdog::timeout_s() {
  return monitor().timeout_s;
}

std::string Watchdog::message(double idle_s) {
  std::string context;
  {
    std::lock_guard lock(g_context_mu);
    for (const std::string& c : g_contexts) context += (context.empty() ? "" : ", ") + c;
  }
  const char* op = g_op.load(std::memory_order_relaxed);
  std::string where;
  if (op != nullptr)
    where = context.empty() ? std::string(op) : fmt::format("{} ({})", op, context);
  else
    where = context.empty() ? std::string("an operation") : context;
  return fmt::format(
      "upipe: rank {} (host {}): no progress for {:g} s in {} — a rank is stuck, dead or "
      "unreachable (a link or step that slow needs a larger {}); ending the job",
      log_rank(), host_name(), idle_s, where, render_setting_refs(setting_ref("comm.timeout")));
}

namespace {
void arm(int delta) {
  g_armed.store(g_armed.load(std::memory_order_relaxed) + delta, std::memory_order_relaxed);
  watchdog_beat();
}
}  // namespace

WatchdogOp::WatchdogOp(const char* op) : prev_(g_op.load(std::memory_order_relaxed)) {
  g_op.store(op, std::memory_order_relaxed);
  arm(+1);
}

WatchdogOp::~WatchdogOp() {
  g_op.store(prev_, std::memory_order_relaxed);
  arm(-1);
}

WatchdogContext::WatchdogContext(std::string label) {
  {
    std::lock_guard lock(g_context_mu);
    g_contexts.push_back(std::move(label));
  }
  arm(+1);
}

WatchdogContext::~WatchdogContext() {
  {
    std::lock_guard lock(g_context_mu);
    g_contexts.pop_back();
  }
  arm(-1);
}

}  // namespace upipe
