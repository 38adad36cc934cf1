// What `upipe train` reports: one StepMetrics per optimizer step, written as one JSONL object
// (flushed every step, so a crash loses nothing written) and shown as a log line, under a live
// progress bar when stdout is a terminal; and the start-up table. Formatting takes plain values
// so it is testable without a model, and the training loop owns the measuring.
#pragma once

#include <cstdint>
#include <cstdio>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace upipe {

struct StepMetrics {
  int64_t step = 0;                            // 1-based number of the step just finished
  std::string run_id;                          // the run's identity (its checkpoints'); "": none
  double loss = 0;                             // mean next-token loss of the step's global batch
  std::optional<double> copy_loss;             // copy task: mean loss over the copied half
  std::optional<double> val_loss;              // the held-out loss, on validation steps
  std::optional<double> val_s;                 // validation's wall time, on validation steps
  std::optional<int64_t> documents;            // packed data: documents in the global batch
  double grad_norm = 0;                        // global gradient norm before clipping
  double lr = 0;                               // learning rate the step used
  double tokens_per_s = 0;                     // training tokens per second, per rank
  double mfu = 0;                              // achieved FLOP/s / measured GEMM FLOP/s, in [0, 1]
  int64_t peak_bytes = 0;                      // device arena peak of the step (max over ranks)
  std::map<std::string, int64_t> peak_by_tag;  // tag name -> bytes live at that peak
  int64_t host_peak_bytes = 0;                 // host arena peak of the step (max over ranks)
  std::map<std::string, int64_t> host_peak_by_tag;  // tag name -> bytes live at that peak
  int64_t budget_bytes = 0;                         // device arena budget per rank
  double step_s = 0;                                // wall time of the step
  double eta_s = 0;                                 // estimated seconds to the last step
};

// One JSON object, no newline; keys in this order: step, run (when run_id is set), loss,
// copy_loss, val_loss, val_s and documents (only when set),
// grad_norm, lr, tokens_per_s, mfu, peak_bytes, peak_by_tag, host_peak_bytes, host_peak_by_tag,
// budget_bytes, step_s, eta_s.
// A non-finite number is written as null.
std::string metrics_json(const StepMetrics& m);

// Refuses (ConfigError, naming metrics.path) a metrics file the run may not replace: a symlink
// or not a regular file; on a fresh run an existing non-empty file unless `overwrite` (the
// user's --overwrite); on a resumed run a file with a line that is not a step's metrics, or is
// another run's than `run_id` (not this run's file). An absent file is fine.
void check_metrics_file(const std::string& path, bool resume, bool overwrite,
                        const std::string& run_id = "");

// Rank 0, before a run starts: the metrics file the path names, locked (flock; created empty when
// there is none) so that a second run naming it is refused at its start, on every rank alike
// (ConfigError naming the holder). Handed to the MetricsWriter, which keeps the file it writes
// locked in turn. A file this lock created and nothing wrote is removed when the lock goes
// unused (the run failed before it wrote its metrics).
class MetricsLock {
 public:
  MetricsLock() = default;
  explicit MetricsLock(const std::string& path);
  ~MetricsLock();
  MetricsLock(MetricsLock&& o) noexcept;
  MetricsLock& operator=(MetricsLock&& o) noexcept;
  bool held() const { return fd_ >= 0; }
  void adopted() { created_.clear(); }  // its file is the writer's now: kept, empty or not

 private:
  int fd_ = -1;
  std::string created_;  // the path, when this lock created the file
};

// The JSONL metrics file. A new run starts it empty (check_metrics_file first); a resumed run
// (resume_step >= 0) keeps the lines of steps <= resume_step (a run that died after logging steps
// its last checkpoint does not hold would otherwise log them twice), drops the rest, and
// appends; a line of another run than `run_id` (its "run" differs) is a ConfigError, the file
// left as it is. The file is replaced atomically at open.
class MetricsWriter {
 public:
  // `lock`: the file locked at the run's start (taken here when not held).
  explicit MetricsWriter(const std::string& path, int64_t resume_step = -1, bool overwrite = false,
                         const std::string& run_id = "", MetricsLock lock = {});
  ~MetricsWriter();
  MetricsWriter(const MetricsWriter&) = delete;
  MetricsWriter& operator=(const MetricsWriter&) = delete;
  void write(const StepMetrics& m);  // one line, one write(); Error when it fails
  const std::string& path() const { return path_; }
  // Resumed: the step lines past the checkpoint's step the file held, now dropped (steps run
  // again), and the highest step it held (0 when none).
  int64_t dropped_lines() const { return dropped_; }
  int64_t last_step_held() const { return last_; }

 private:
  std::string path_;
  int fd_ = -1;  // opened for appending
  int64_t dropped_ = 0, last_ = 0;
};

// "1:02:03" (hours unbounded); "--:--:--" for a negative or non-finite time.
std::string format_duration(double seconds);
// A count per second, whole, with thousands separators; "--" when it is none (NaN, negative).
std::string format_rate(double per_s);
// "12,345,678".
std::string format_count(int64_t n);
// "step  12/100 | loss 5.1234 | copy 3.2100 | gnorm 1.23e+00 | lr 3.00e-04 |
//  12,345 tok/s/rank | MFU 12.3% | peak 1.23 GiB (45% of 2.00 GiB) | 0.52 s/step | ETA 0:01:23"
// (one line; copy only when set; the budget part only with a budget). mean_of > 1: the losses
// are the mean of that many steps, and the line says so ("loss 5.1234 (mean of 10 steps)").
std::string format_step_line(const StepMetrics& m, int64_t total_steps, int64_t mean_of = 1);
// "[#######-------------]  12/100  12%": `width` cells between the brackets.
std::string format_progress_bar(int64_t step, int64_t total, int width = 30);

enum class ProgressMode { kBar, kLines };
bool stdout_is_terminal();
// metrics.progress: "auto" -> a bar when `terminal`, else lines; "bar"; "lines".
ProgressMode parse_progress_mode(const std::string& s, bool terminal);

// Shows the steps on `out`. Lines mode: the step line every `log_interval` steps and at the
// last step, its loss (and copy loss) the mean over the steps since the previous line, the rest
// the step's own. Bar mode: the same lines, and below them one bar line redrawn in place (\r) after
// every step.
class ProgressDisplay {
 public:
  ProgressDisplay(std::FILE* out, int64_t total_steps, int64_t log_interval, ProgressMode mode);
  void update(const StepMetrics& m);
  // A message (checkpoint written, ...) printed above the bar.
  void print(const std::string& line);
  // Ends the bar line; call once after the last step.
  void finish();

 private:
  std::FILE* out_;
  int64_t total_, interval_;
  ProgressMode mode_;
  std::string bar_;                     // the bar line currently shown ("" = none)
  double loss_sum_ = 0, copy_sum_ = 0;  // over the steps since the last logged line
  int64_t steps_ = 0;
  std::optional<StepMetrics> last_;  // the last step shown to update()

  // The step line of m with the mean losses of the steps since the last one; starts a new mean.
  std::string logged_line(const StepMetrics& m);
};

// The start-up table's values.
struct StartupInfo {
  std::string model;  // "tiny (preset)" or the directory
  int64_t parameters = 0;
  int dp = 1, cp = 1;  // ranks = dp * cp
  std::string method;
  std::vector<std::pair<std::string, std::string>>
      knobs;  // {"stage_heads", "4"}, or {"U=4 overlap", ""}
  std::string dtype;
  int64_t budget_bytes = 0;  // per rank
  int64_t seq_len = 0;
  int micro_steps = 1;
  int64_t steps = 0;
  std::string data;  // "copy", "files: DIR (N tokens in K files)", ...
  std::string isa;   // the CPU kernels' path ("avx512bf16"; cpu_isa.h)
};
// An aligned two-column table, one row per field, ending in a newline.
std::string format_startup_table(const StartupInfo& s);

}  // namespace upipe
