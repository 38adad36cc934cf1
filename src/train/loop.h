// The training loop of `upipe train`, on every rank: the run's start (the newest checkpoint, a
// Hugging Face model's weights, or a random init), then optimizer steps until train.steps or a
// stop request, each measured (loss, gradient norm, learning rate, the worst rank's device and
// host peaks with their tags, time, tokens/s, MFU) and handed to an observer; checkpoints at the
// configured interval and after the last step.
//
// With metrics.val_interval, every that many steps and after the last, the mean loss of the
// held-out sequences (data.val_path's first non-overlapping windows of S tokens, or sequences of
// the copy / random task from another seed), forward only, is reported with the step.
//
// A stop request (core/stop_signal.h) on any rank stops every rank after the same step: the
// request is all-reduced each step. So does train.time_limit: the run stops after the step past
// which another step (the longest so far), the validation a stop runs and the checkpoint (the
// longest written so far; before the first, 1 s and the rank's 3 fp32 shards at 200 MB/s) would
// end past the limit, counted from the process's start; where it has passed before the first
// step, no step runs. The first step is not timed (it warms up) unless it is the
// only one. The command renders what the observer sees (train/metrics.h); the loop decides
// nothing about output.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "model/config.h"
#include "train/checkpoint.h"
#include "train/data.h"
#include "train/metrics.h"
#include "train/run_config.h"
#include "train/time_limit.h"
#include "train/trainer.h"

namespace upipe {

// Where the run starts.
struct RunStart {
  int64_t step = 0;  // steps already done (a checkpoint's), 0 for a new run
  bool resumed = false;
  std::string origin;  // "random init (seed 1)", "Hugging Face weights from DIR", a checkpoint
  std::string run_id;  // the run's identity (a resumed run's is its checkpoint's)
};

// What the loop reports. Every rank gets every call (rank 0 renders).
class TrainingObserver {
 public:
  virtual ~TrainingObserver() = default;
  // After each step: its metrics (the same on every rank).
  virtual void on_step(const StepMetrics& m) {}
  // After a checkpoint of `step` was written at `path`.
  virtual void on_checkpoint(int64_t step, const std::string& path) {}
};

struct LoopEnd {
  int64_t last_step = 0;        // steps done when the loop ended
  bool stopped = false;         // a stop request ended it before train.steps
  int stop_signal = 0;          // the signal that asked for it, on whichever rank (0: unknown)
  bool time_limit = false;      // train.time_limit ended it (with stopped)
  double first_group_loss = 0;  // the copy task's copied-half loss at the first and last step
  double last_group_loss = 0;   // run (0 for other data)
};

class TrainingLoop {
 public:
  // Builds the trainer (world = DP x CP) and the data, then the start: with `resume` the newest
  // complete checkpoint of checkpoint.dir (ConfigError when there is none), else model.init_from's
  // weights, else a random init from train.seed. A fresh run refuses a checkpoint.dir holding
  // another run's checkpoints unless overwrite_checkpoints (train/checkpoint.h). A resumed run
  // whose training data is not the checkpoint's (DataSource::fingerprint) is refused unless
  // accept_changes. Measures the GEMM rate MFU is relative to. `before_load` (when given) runs
  // once every input has been checked (the settings, the --init-from folder, the data, the
  // checkpoint directory and the checkpoint resumed from) and the trainer built, before any
  // weight is read (upipe train plans its step there).
  TrainingLoop(Device& dev, Communicator& world, const ModelConfig& m, const RunConfig& c,
               bool resume, bool overwrite_checkpoints = false, bool accept_changes = false,
               const std::function<void()>& before_load = {});
  ~TrainingLoop();

  Trainer& trainer() { return *trainer_; }
  const Trainer& trainer() const { return *trainer_; }
  const DataSource& data() const { return *data_; }
  const RunStart& start() const { return start_; }
  bool copy_task() const { return data_->options().kind == DataKind::kCopy; }
  // MFU's denominator per rank: metrics.peak_flops, or the GEMM rate measured (the ranks' best).
  double gemm_flops() const { return gemm_flops_; }
  // The side of the square GEMM MFU's measured rate was timed on (kGemmReferenceN unless that did
  // not fit in the budget); 0 when a peak was stated or the device does not compute.
  int64_t gemm_reference_n() const { return gemm_reference_n_; }
  // The held-out sequences each validation runs: metrics.val_sequences, or fewer where the
  // held-out file holds fewer windows of S tokens (0 without validation).
  int64_t val_sequences() const { return val_n_; }
  static constexpr int64_t kGemmReferenceN = 1024;

  // Runs the steps from start().step to train.steps; returns how it ended.
  LoopEnd run(TrainingObserver& obs);

 private:
  Sequence sequence(int64_t step, int micro, int dp_rank) const;
  // The held-out loss after `step` (forward only).
  double validate(int64_t step);
  void checkpoint(int64_t step, TrainingObserver& obs);
  // A checkpoint is due after `step` (checkpoint.interval; the last step's is the run's end).
  bool checkpoint_due(int64_t step) const;
  // train.time_limit's view of the run's costs after a step (time_limit.h).
  TimeLimitCosts time_costs(double dt, int64_t timed, double longest_step, int64_t validations,
                            double val_mean) const;
  // The step's peaks over the ranks, with the worst rank's per-tag bytes, into m.
  void gather_peaks(StepMetrics& m);
  // Collective (gather_peaks): the metrics of `step` (1-based) from its result and time; the
  // speed, validation and ETA are the caller's.
  StepMetrics step_metrics(int64_t step, const StepResult& r, double seconds);

  Device& dev_;
  Communicator& world_;
  ModelConfig m_;
  RunConfig cfg_;
  std::string toml_;  // the run file recorded in every checkpoint
  std::unique_ptr<Trainer> trainer_;
  std::unique_ptr<DataSource> data_;
  std::unique_ptr<DataSource> val_;  // held-out data (metrics.val_interval > 0)
  int64_t val_n_ = 0;                // sequences per validation
  RunStart start_;
  CheckpointRun ckpt_run_;  // where and as which run the checkpoints are written
  double gemm_flops_ = 0;
  int64_t gemm_reference_n_ = 0;
  double checkpoint_s_ = 0;  // the longest checkpoint write of this run so far (train.time_limit)
};

// What a run's data holds, opened as the loop opens it but without reading every token: the
// token files with their headers and indexes, and the held-out data of validation. ConfigError
// as the loop's (a missing file, a Megatron .bin without its .idx, an end-of-text id outside the
// vocabulary, fewer tokens than train.seq_len). For the planner, so the run it prints starts.
// Without open_files (data not on this machine) only what needs no file (check_data_options).
struct RunDataSize {
  int64_t tokens = -1, val_tokens = -1;  // of the files; -1: a task's (unbounded) or none
};
RunDataSize check_run_data(const RunConfig& c, const ModelConfig& m, int dp_size,
                           bool open_files = true);

}  // namespace upipe
