#include "train/metrics.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>

#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <sstream>
#include <utility>

#include "core/arena.h"
#include "core/check.h"
#include "core/checked.h"
#include "core/errors.h"
#include "core/fault_inject.h"
#include "core/safe_fs.h"
#include "core/setting_ref.h"
#include "core/strict_json.h"

namespace upipe {
namespace {

nlohmann::ordered_json number(double v) {
  return std::isfinite(v) ? nlohmann::ordered_json(v) : nlohmann::ordered_json(nullptr);
}

// "1.23 M" style parameter counts.
std::string format_si(int64_t n) {
  const double v = double(n);
  if (v >= 1e12) return fmt::format("{:.2f} T", v / 1e12);
  if (v >= 1e9) return fmt::format("{:.2f} B", v / 1e9);
  if (v >= 1e6) return fmt::format("{:.2f} M", v / 1e6);
  if (v >= 1e3) return fmt::format("{:.2f} K", v / 1e3);
  return fmt::format("{}", n);
}

}  // namespace

std::string metrics_json(const StepMetrics& m) {
  nlohmann::ordered_json j;
  j["step"] = m.step;
  if (!m.run_id.empty()) j["run"] = m.run_id;
  j["loss"] = number(m.loss);
  if (m.copy_loss) j["copy_loss"] = number(*m.copy_loss);
  if (m.val_loss) j["val_loss"] = number(*m.val_loss);
  if (m.val_s) j["val_s"] = number(*m.val_s);
  if (m.documents) j["documents"] = *m.documents;
  j["grad_norm"] = number(m.grad_norm);
  j["lr"] = number(m.lr);
  j["tokens_per_s"] = number(m.tokens_per_s);
  j["mfu"] = number(m.mfu);
  j["peak_bytes"] = m.peak_bytes;
  j["peak_by_tag"] = nlohmann::ordered_json::object();
  for (const auto& [tag, bytes] : m.peak_by_tag) j["peak_by_tag"][tag] = bytes;
  j["host_peak_bytes"] = m.host_peak_bytes;
  j["host_peak_by_tag"] = nlohmann::ordered_json::object();
  for (const auto& [tag, bytes] : m.host_peak_by_tag) j["host_peak_by_tag"][tag] = bytes;
  j["budget_bytes"] = m.budget_bytes;
  j["step_s"] = number(m.step_s);
  j["eta_s"] = number(m.eta_s);
  return j.dump();
}

namespace {

// A metrics line is well under this (a step's numbers and its tags).
constexpr int64_t kMaxMetricsLine = int64_t(1) << 16;

// The line as one step's metrics (metrics_json's object), or null when it is not one (parsed
// strictly: a line nested deeper than any metrics line is not one).
nlohmann::json step_object(const std::string& l) {
  try {
    nlohmann::json j = parse_json_strict(l, "metrics line");
    // A step is a whole number from 1 (2^64 - 1 read as int64 was step -1, kept on resume).
    if (j.is_object() && j.contains("step") && j["step"].is_number_unsigned() &&
        j["step"].get<uint64_t>() >= 1 &&
        j["step"].get<uint64_t>() <= uint64_t(std::numeric_limits<int64_t>::max()))
      return j;
  } catch (const ConfigError&) {
  }
  return nullptr;
}
bool is_torn_step_line(const std::string& l) {
  return l.empty() || l.rfind("{\"step\":", 0) == 0;
}

// The lines of `path` (a regular file) whose step is at most `step`. A torn last line (a crash
// mid-write: no newline, the start of a step's object) is dropped; any other line that is not a
// step's metrics means the file is not this run's metrics file (ConfigError: it is not replaced).
// The lines of `path` up to `step`; `dropped` (when given) counts the step lines after it and
// `last` is the highest step the file held. A line of another run than `run_id` (its "run"
// differs; lines without one, as older upipe wrote, are taken as this run's) is a ConfigError too.
std::string lines_up_to(const std::string& path, int64_t step, int64_t* dropped = nullptr,
                        int64_t* last = nullptr, const std::string& run_id = "") {
  const ReadFile f(path, "metrics file");
  std::string kept, line, chunk(size_t(1) << 16, '\0');
  int64_t number = 0;
  auto keep = [&](const std::string& l, bool terminated) {
    ++number;
    if (const nlohmann::json j = step_object(l); !j.is_null()) {
      const int64_t s = j["step"].get<int64_t>();
      if (!run_id.empty() && j.contains("run") && j["run"] != run_id)
        throw ConfigError(fmt::format(
            "{} '{}': line {} (step {}) is of another run ({}) than the one resumed ({}), so the "
            "file is left as it is; choose another {}, or remove the file",
            setting_ref("metrics.path"), path, number, s,
            j["run"].is_string() ? excerpt(j["run"].get<std::string>()) : json_excerpt(j["run"]),
            run_id, setting_ref("metrics.path")));
      if (last) *last = std::max(*last, s);
      if (s <= step)
        kept += l + "\n";
      else if (dropped)
        ++*dropped;
    } else if (terminated || !is_torn_step_line(l)) {
      throw ConfigError(fmt::format(
          "{} '{}': line {} is not a step's metrics (a JSON object with \"step\"), so the file is "
          "not this run's metrics file and is left as it is; choose another {}",
          setting_ref("metrics.path"), path, number, setting_ref("metrics.path")));
    }
  };
  for (int64_t at = 0; at < f.size();) {
    const int64_t n = std::min(int64_t(chunk.size()), f.size() - at);
    f.read_at(chunk.data(), n, at);
    at += n;
    for (int64_t i = 0; i < n; ++i) {
      if (chunk[size_t(i)] != '\n') {
        line += chunk[size_t(i)];
        continue;
      }
      keep(line, true);
      line.clear();
    }
  }
  if (!line.empty()) keep(line, false);
  return kept;
}

}  // namespace

void check_metrics_file(const std::string& path, bool resume, bool overwrite,
                        const std::string& run_id) {
  if (path == "/dev/null")
    throw ConfigError(fmt::format(
        "{} /dev/null: the metrics file is made as a temporary file renamed over its path, which "
        "would replace /dev/null; for no metrics file give an empty {}=",
        setting_ref("metrics.path"), setting_ref("metrics.path")));
  check_replaceable(path, "metrics file");
  std::error_code ec;
  if (!std::filesystem::exists(path, ec)) return;
  if (resume) {
    lines_up_to(path, 0, nullptr, nullptr, run_id);  // every line a step's metrics, the run's
    return;
  }
  const auto bytes = std::filesystem::file_size(path, ec);
  if (!ec && bytes > 0 && overwrite) {
    // --overwrite replaces a metrics file, never a file of something else that metrics.path names
    // by mistake (a token file, notes): its first line must be a step's metrics (read up to
    // kMaxMetricsLine bytes, whatever the file holds).
    const ReadFile f(path, "metrics file");
    std::string first(size_t(std::min(f.size(), kMaxMetricsLine)), '\0');
    f.read_at(first.data(), int64_t(first.size()), 0);
    // A line without its newline is the whole file: a step's line, complete or torn by a crash
    // mid-write (as a resume takes it); a first line longer than kMaxMetricsLine is none.
    const size_t nl = first.find('\n');
    const bool last = nl == std::string::npos;
    const std::string line = first.substr(0, nl);
    if ((last && int64_t(first.size()) != f.size()) ||
        (step_object(line).is_null() && !(last && is_torn_step_line(line))))
      throw ConfigError(fmt::format(
          "{} '{}': its first line is not a step's metrics (a JSON object with \"step\"), so the "
          "file is not a metrics file and is left as it is (--overwrite replaces only a metrics "
          "file); choose another {}",
          setting_ref("metrics.path"), path, setting_ref("metrics.path")));
  }
  if (!ec && bytes > 0 && !overwrite)
    throw ConfigError(fmt::format(
        "{} '{}' already exists ({} bytes) and a fresh run would replace it; choose another {}, "
        "remove the file, continue its run with --resume, or pass --overwrite to replace it",
        setting_ref("metrics.path"), path, bytes, setting_ref("metrics.path")));
}

namespace {

// flock(fd) without waiting. Returns false when another open file holds the lock; a file system
// without locks (errno other than EWOULDBLOCK) is said once and taken as locked.
bool lock_now(int fd, const std::string& path) {
  if (::flock(fd, LOCK_EX | LOCK_NB) == 0) return true;
  if (errno == EWOULDBLOCK) return false;
  static bool said = false;
  if (!std::exchange(said, true))
    std::fprintf(stderr,
                 "upipe: warning: metrics file %s cannot be locked (%s): a second run writing it "
                 "at the same time would not be refused\n",
                 path.c_str(), std::strerror(errno));
  return true;
}

// The process of this host that holds a flock on the file `st` describes, as /proc/locks says it
// ("1: FLOCK  ADVISORY  WRITE 4242 08:01:1234 0 EOF"): "pid 4242 (upipe) on HOST", or "" where
// it cannot be told (another host holds it over NFS, no /proc).
std::string flock_holder(const struct stat& st) {
  std::ifstream locks("/proc/locks");
  std::string line;
  for (int lines = 0; lines < 100000 && std::getline(locks, line); ++lines) {
    char kind[16] = {}, access[16] = {};
    long pid = 0;
    unsigned maj = 0, min = 0;
    unsigned long long ino = 0;
    if (std::sscanf(line.c_str(), "%*d: %15s %*s %15s %ld %x:%x:%llu", kind, access, &pid, &maj,
                    &min, &ino) != 6)
      continue;
    if (std::string_view(kind) != "FLOCK" || ino != st.st_ino || maj != major(st.st_dev) ||
        min != minor(st.st_dev) || pid <= 0)
      continue;
    std::string comm;
    std::getline(std::ifstream(fmt::format("/proc/{}/comm", pid)), comm);
    return fmt::format("pid {}{} on {}", pid, comm.empty() ? "" : " (" + excerpt(comm) + ")",
                       host_name());
  }
  return "";
}

[[noreturn]] void metrics_file_in_use(const std::string& path, const std::string& holder) {
  throw ConfigError(fmt::format(
      "{} '{}' is being written by another upipe run{}: two runs writing one metrics file would "
      "mix their lines; wait for it to end, or choose another {}",
      setting_ref("metrics.path"), path, holder.empty() ? "" : " (" + holder + ")",
      setting_ref("metrics.path")));
}

}  // namespace

// The lock on the file the path names now (created empty when there is none: with O_EXCL first,
// so a file that was there is never taken as this one's), checked to be still the path's after
// it is taken (a run that renamed its own file over it in between holds that one). Opened for
// writing: NFS and CIFS emulate flock with a POSIX lock, whose exclusive form needs it.
MetricsLock::MetricsLock(const std::string& path) {
  for (int attempt = 0; attempt < 3; ++attempt) {
    bool created = true;
    int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0666);
    if (fd < 0 && errno == EEXIST) {
      created = false;
      fd = ::open(path.c_str(), O_RDWR | O_NOFOLLOW | O_CLOEXEC);
    }
    if (fd < 0)
      throw ConfigError(
          fmt::format("cannot create metrics file {}: {}", path, std::strerror(errno)));
    if (!lock_now(fd, path)) {
      struct stat st {};
      const std::string holder = ::fstat(fd, &st) == 0 ? flock_holder(st) : "";
      ::close(fd);
      metrics_file_in_use(path, holder);
    }
    struct stat held {
    }, now{};
    if (::fstat(fd, &held) == 0 && ::lstat(path.c_str(), &now) == 0 && held.st_dev == now.st_dev &&
        held.st_ino == now.st_ino) {
      fd_ = fd;
      if (created) created_ = path;
      return;
    }
    ::close(fd);  // replaced meanwhile: lock what the path names now
  }
  metrics_file_in_use(path, "");
}

MetricsLock::~MetricsLock() {
  if (fd_ < 0) return;
  struct stat st {};
  if (!created_.empty() && ::fstat(fd_, &st) == 0 && st.st_size == 0) {
    struct stat now {};
    if (::lstat(created_.c_str(), &now) == 0 && now.st_dev == st.st_dev && now.st_ino == st.st_ino)
      ::unlink(created_.c_str());
  }
  ::close(fd_);
}

MetricsLock::MetricsLock(MetricsLock&& o) noexcept
    : fd_(std::exchange(o.fd_, -1)), created_(std::move(o.created_)) {}

MetricsLock& MetricsLock::operator=(MetricsLock&& o) noexcept {
  if (this != &o) {
    MetricsLock gone(std::move(*this));
    fd_ = std::exchange(o.fd_, -1);
    created_ = std::move(o.created_);
  }
  return *this;
}

// The file is locked (flock) for as long as the writer lives, so a second run naming it is
// refused instead of writing between this run's lines: the lock is taken on the file the path
// names before it is read (at the run's start: MetricsLock), and on the replacement before it
// is renamed over the path.
MetricsWriter::MetricsWriter(const std::string& path, int64_t resume_step, bool overwrite,
                             const std::string& run_id, MetricsLock lock)
    : path_(path) {
  // A resumed run's file is checked line by line as its steps are kept (lines_up_to).
  if (resume_step < 0)
    check_metrics_file(path, false, overwrite);
  else
    check_replaceable(path, "metrics file");
  if (!lock.held()) lock = MetricsLock(path);
  try {
    // Again under the lock: the file may have grown between the check and the lock.
    if (resume_step < 0) check_metrics_file(path, false, overwrite);
    const std::string kept =
        resume_step >= 0 ? lines_up_to(path, resume_step, &dropped_, &last_, run_id) : "";
    AtomicFile f(path, "metrics file");
    f.write(kept);
    fd_ = ::open(f.temp_path().c_str(), O_WRONLY | O_APPEND | O_NOFOLLOW | O_CLOEXEC);
    if (fd_ < 0)
      throw ConfigError(
          fmt::format("metrics.path: cannot open {}: {}", f.temp_path(), std::strerror(errno)));
    lock_now(fd_, path);  // a fresh file no one else has opened
    f.commit();
    lock.adopted();  // replaced by the writer's file: nothing of it to remove
  } catch (...) {
    if (fd_ >= 0) ::close(std::exchange(fd_, -1));
    throw;
  }
}

MetricsWriter::~MetricsWriter() {
  if (fd_ >= 0) ::close(fd_);
}

void MetricsWriter::write(const StepMetrics& m) {
  fault_point("metrics");
  const std::string line = metrics_json(m) + "\n";
  for (size_t done = 0; done < line.size();) {
    const ssize_t w = ::write(fd_, line.data() + done, line.size() - done);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0)
      throw Error(fmt::format("cannot write metrics to {}: {}", path_,
                              w < 0 ? std::strerror(errno) : "no bytes written"));
    done += size_t(w);
  }
}

std::string format_rate(double per_s) {
  // llround of a NaN or of more than int64 holds is undefined: a diverged step has no speed.
  if (!std::isfinite(per_s) || per_s < 0 || per_s >= 9e18) return "--";
  return format_count(int64_t(std::llround(per_s)));
}

std::string format_duration(double seconds) {
  if (!std::isfinite(seconds) || seconds < 0) return "--:--:--";
  const int64_t s = int64_t(std::llround(seconds));
  return fmt::format("{}:{:02}:{:02}", s / 3600, s / 60 % 60, s % 60);
}

std::string format_count(int64_t n) {
  std::string digits = fmt::format("{}", n < 0 ? -n : n), out;
  for (size_t i = 0; i < digits.size(); ++i) {
    if (i > 0 && (digits.size() - i) % 3 == 0) out += ',';
    out += digits[i];
  }
  return n < 0 ? "-" + out : out;
}

std::string format_step_line(const StepMetrics& m, int64_t total_steps, int64_t mean_of) {
  const int w = int(fmt::format("{}", total_steps).size());
  std::string s = fmt::format("step {:>{}}/{} | loss {:.4f}", m.step, w, total_steps, m.loss);
  if (mean_of > 1) s += fmt::format(" (mean of {} steps)", mean_of);
  if (m.copy_loss) s += fmt::format(" | copy {:.4f}", *m.copy_loss);
  if (m.val_loss) s += fmt::format(" | val {:.4f}", *m.val_loss);
  if (m.documents) s += fmt::format(" | {} docs", *m.documents);
  s += fmt::format(" | gnorm {:.2e} | lr {:.2e} | {} tok/s/rank | MFU {}", m.grad_norm, m.lr,
                   format_rate(m.tokens_per_s),
                   std::isfinite(m.mfu) ? fmt::format("{:.1f}%", 100 * m.mfu) : "--");
  s += fmt::format(" | peak {}", format_bytes(m.peak_bytes));
  if (m.budget_bytes > 0)
    s += fmt::format(" ({:.0f}% of {})", 100.0 * double(m.peak_bytes) / double(m.budget_bytes),
                     format_bytes(m.budget_bytes));
  s += fmt::format(" | {:.2f} s/step | ETA {}", m.step_s, format_duration(m.eta_s));
  return s;
}

std::string format_progress_bar(int64_t step, int64_t total, int width) {
  const double f = total > 0 ? std::clamp(double(step) / double(total), 0.0, 1.0) : 0.0;
  const int full = int(f * width);
  const int w = int(fmt::format("{}", total).size());
  return fmt::format("[{}{}] {:>{}}/{} {:3.0f}%", std::string(size_t(full), '#'),
                     std::string(size_t(width - full), '-'), step, w, total, 100 * f);
}

bool stdout_is_terminal() {
  if (isatty(STDOUT_FILENO) != 1) return false;
  // OpenMPI gives its ranks a pseudo-terminal for stdout whatever mpirun's own stdout is, so a
  // rank's isatty says nothing about the user's screen. Under mpirun, ask mpirun's stdout (the
  // rank's parent on the launching node); when it cannot be read, plain lines are the safe choice.
  if (std::getenv("OMPI_COMM_WORLD_SIZE") == nullptr) return true;
  const std::string parent_stdout = fmt::format("/proc/{}/fd/1", int(getppid()));
  const int fd = ::open(parent_stdout.c_str(), O_WRONLY | O_NOCTTY);
  if (fd < 0) return false;
  const bool tty = isatty(fd) == 1;
  ::close(fd);
  return tty;
}

ProgressMode parse_progress_mode(const std::string& s, bool terminal) {
  if (s == "auto") return terminal ? ProgressMode::kBar : ProgressMode::kLines;
  if (s == "bar") return ProgressMode::kBar;
  if (s == "lines") return ProgressMode::kLines;
  throw ConfigError(fmt::format("{} is unknown; choose auto, bar or lines",
                                setting_value("metrics.progress", s)));
}

ProgressDisplay::ProgressDisplay(std::FILE* out, int64_t total_steps, int64_t log_interval,
                                 ProgressMode mode)
    : out_(out), total_(total_steps), interval_(std::max<int64_t>(1, log_interval)), mode_(mode) {}

std::string ProgressDisplay::logged_line(const StepMetrics& m) {
  StepMetrics mean = m;
  mean.loss = loss_sum_ / double(steps_);
  if (m.copy_loss) mean.copy_loss = copy_sum_ / double(steps_);
  const std::string line = format_step_line(mean, total_, steps_);
  loss_sum_ = copy_sum_ = 0;
  steps_ = 0;
  return line;
}

void ProgressDisplay::update(const StepMetrics& m) {
  // A validation's loss is shown when it is measured, whatever the interval.
  // A diverged step is shown whatever the interval (the run ends after it).
  const bool log = m.step % interval_ == 0 || m.step == total_ || m.val_loss.has_value() ||
                   !std::isfinite(m.loss) || !std::isfinite(m.grad_norm);
  last_ = m;
  loss_sum_ += m.loss;
  copy_sum_ += m.copy_loss.value_or(0.0);
  ++steps_;
  if (mode_ == ProgressMode::kBar) {
    std::fputs("\r\x1b[2K", out_);  // clear the old bar
    if (log) std::fprintf(out_, "%s\n", logged_line(m).c_str());
    bar_ = fmt::format(
        "{} loss {:.4f} | {} tok/s/rank | ETA {}", format_progress_bar(m.step, total_), m.loss,
        format_rate(m.tokens_per_s), format_duration(m.eta_s));
    std::fputs(bar_.c_str(), out_);
  } else if (log) {
    std::fprintf(out_, "%s\n", logged_line(m).c_str());
  }
  std::fflush(out_);
}

void ProgressDisplay::print(const std::string& line) {
  if (mode_ == ProgressMode::kBar && !bar_.empty())
    std::fprintf(out_, "\r\x1b[2K%s\n%s", line.c_str(), bar_.c_str());
  else
    std::fprintf(out_, "%s\n", line.c_str());
  std::fflush(out_);
}

void ProgressDisplay::finish() {
  // Steps since the last line (a run stopped between lines): their line, so the last step shows.
  if (steps_ > 0 && last_) print(logged_line(*last_));
  if (mode_ == ProgressMode::kBar && !bar_.empty()) std::fputs("\n", out_);
  bar_.clear();
  std::fflush(out_);
}

std::string format_startup_table(const StartupInfo& s) {
  std::string method = s.method;
  if (!s.knobs.empty()) {
    method += " (";
    for (size_t i = 0; i < s.knobs.size(); ++i)
      method += fmt::format("{}{}{}{}", i ? ", " : "", s.knobs[i].first,
                            s.knobs[i].second.empty() ? "" : " ", s.knobs[i].second);
    method += ")";
  }
  int64_t per_step = 0;
  const bool fits = mul_fits(per_step, {s.seq_len, s.micro_steps, s.dp});
  const std::vector<std::pair<std::string, std::string>> rows = {
      {"model", s.model},
      {"parameters", fmt::format("{} ({})", format_si(s.parameters), format_count(s.parameters))},
      {"ranks", fmt::format("{} = {} DP x {} CP", int64_t(s.dp) * s.cp, s.dp, s.cp)},
      {"method", method},
      {"dtype", s.dtype},
      {"cpu kernels", s.isa},
      {"sequence",
       fmt::format("{} tokens, {} micro-step(s), {} tokens per step", format_count(s.seq_len),
                   s.micro_steps, fits ? format_count(per_step) : "?")},
      {"steps", format_count(s.steps)},
      {"data", s.data},
      {"memory budget", fmt::format("{} per rank", format_bytes(s.budget_bytes))},
  };
  size_t w = 0;
  for (const auto& r : rows) w = std::max(w, r.first.size());
  std::string out;
  for (const auto& [k, v] : rows) out += fmt::format("  {:<{}}  {}\n", k, w, v);
  return out;
}

}  // namespace upipe
