#include "train/loop.h"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <limits>

#include "core/build_info.h"
#include "core/checked.h"
#include "core/errors.h"
#include "core/stop_signal.h"
#include "core/watchdog.h"
#include "model/safetensors.h"
#include "model/weights.h"
#include "train/checkpoint.h"
#include "train/flops.h"
#include "train/run_options.h"
#include "train/zero.h"

namespace upipe {
namespace {

// The copy / random task's held-out sequences: the training seed plus this (a seed the training
// never draws from).
constexpr uint64_t kHeldOutSeed = 0x5eed0f1e1d;

double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// A stop by train.time_limit, all-reduced (max) with the signals' numbers, above every signal.
constexpr float kTimeLimitStop = 1000.0f;
// Bytes per second a checkpoint is assumed to be written at until one is measured (a slow shared
// file system's; stopping a little early loses less than a checkpoint cut by the scheduler).
constexpr double kGuessedWriteRate = 200e6;

DataOptions data_options(const RunConfig& c, const ModelConfig& m, int dp_size) {
  DataOptions o;
  o.kind = parse_data_kind(c.data.kind);
  o.path = c.data.path;
  o.seq_len = c.train.seq_len;
  o.vocab = m.vocab_size;
  o.seed = uint64_t(c.train.seed);
  o.dp_size = dp_size;
  o.micro_steps = c.train.micro_steps;
  o.documents = parse_documents_mode(c.data.documents);
  return o;
}

// The held-out data of validation: data.val_path's files, or the run's task from another seed.
DataOptions val_options(const RunConfig& c, const ModelConfig& m, int dp_size) {
  DataOptions v = data_options(c, m, dp_size);
  if (!c.data.val_path.empty()) {
    v.kind = DataKind::kFiles;
    v.path = c.data.val_path;
    v.path_key = "data.val_path";
  } else {
    v.seed += kHeldOutSeed;  // the same task, sequences the training never sees
  }
  return v;
}

// The documents `lens` of a sequence of s tokens (empty: one).
std::shared_ptr<const Documents> documents_of(const std::vector<int64_t>& lens, int64_t s) {
  return lens.empty() ? nullptr : std::make_shared<const Documents>(lens, s);
}

// Collective: every rank read the same data (hosts with their own copies of data.path or
// data.val_path could differ); ConfigError on every rank naming the first that did not. `what`:
// "training" or "validation"; `key`: the setting that names the files.
void check_same_data(Communicator& world, const DataSource& data, const char* what,
                     const char* key) {
  std::vector<uint64_t> all(static_cast<size_t>(world.size()));
  const uint64_t mine = data.content_hash();
  world.all_gather(&mine, all.data(), sizeof mine);
  for (size_t r = 1; r < all.size(); ++r)
    if (all[r] != all[0]) {
      const std::vector<std::string> hosts = host_names(world);
      throw ConfigError(fmt::format(
          "rank {} (host {}) read other {} data than rank 0 (host {}; xxh3 {:016x}, rank 0's "
          "{:016x}): every host must see the same files under {}",
          r, hosts[r], what, hosts[0], all[r], all[0], setting_ref(key)));
    }
}

// The start of the run: the newest checkpoint (resume), Hugging Face weights, or random; and the
// identity of the checkpoints this run writes (a resumed run keeps its checkpoint's).
RunStart initialize(Communicator& world, const RunConfig& c, const ModelConfig& m, Trainer& tr,
                    const DataSource& data, bool resume, bool overwrite, bool accept_changes,
                    CheckpointRun& run, const std::function<void()>& before_load) {
  RunStart s;
  if (resume) {
    if (c.checkpoint.dir.empty())
      throw ConfigError(fmt::format("--resume needs {} (the run's checkpoint directory)",
                                    setting_ref("checkpoint.dir")));
  }
  const CheckpointStart cs = open_checkpoint_run(
      world, c.checkpoint.dir, resume, overwrite, c.checkpoint.keep,
      [&](int64_t step) {  // the steps the loop checkpoints
        return step == c.train.steps || (c.checkpoint.interval > 0 && step < c.train.steps &&
                                         step % c.checkpoint.interval == 0);
      });
  run = cs.run;
  run.data = data.fingerprint();
  bool data_changed = false;
  if (cs.resume_from) {
    const std::string& ckpt = *cs.resume_from;
    // The data the run read: the same stream, or the remaining steps read other sequences than
    // the uninterrupted run's (a corpus edited in place, a file added to its directory, a stale
    // .idx), which only --accept-changes allows. Checkpoints of older builds do not say.
    const CheckpointInfo recorded = read_checkpoint_info(ckpt);
    data_changed = !recorded.data.empty() && !run.data.empty() && recorded.data != run.data;
    if (data_changed && !accept_changes)
      throw ConfigError(fmt::format(
          "--resume: the training data in {3} is not the data the run read when {0} was "
          "written (then: {1}; now: {2}), so the remaining steps would read other sequences than "
          "the run's; restore the run's data (or give where it lies now as {4}), or add "
          "--accept-changes",
          ckpt, one_line(recorded.data), run.data, setting_value("data.path", c.data.path),
          setting_ref("data.path")));
  }
  if (before_load) before_load();  // every input checked, no weight read yet
  if (cs.resume_from) {
    const std::string& ckpt = *cs.resume_from;
    const CheckpointInfo info = load_checkpoint(ckpt, tr.zero());
    s.step = info.step;
    s.resumed = true;
    // Another build wrote it: say which (the checkpoint is read all the same).
    const std::string by = info.written_by.empty() || info.written_by == build_id()
                               ? ""
                               : fmt::format(", by upipe {}", info.written_by);
    // meta.json's text (its writer's version) is a file's: one line, control bytes escaped.
    s.origin = one_line(fmt::format("{} (step {}, written on {} rank{}{}{}{})", ckpt, info.step,
                                    info.world, info.world == 1 ? "" : "s",
                                    info.world == world.size() ? "" : ", resharded", by,
                                    data_changed ? "; its data changed, accepted" : ""));
  } else if (!c.model.init_from.empty()) {
    const SafetensorsReader reader = open_init_weights(c.model.init_from, m);
    tr.zero().init(&reader, uint64_t(c.train.seed));
    s.origin = "Hugging Face weights from " + c.model.init_from;
  } else {
    tr.zero().init(nullptr, uint64_t(c.train.seed));
    s.origin = fmt::format("random init (seed {})", c.train.seed);
  }
  return s;
}

}  // namespace

TrainingLoop::TrainingLoop(Device& dev, Communicator& world, const ModelConfig& m,
                           const RunConfig& c, bool resume, bool overwrite_checkpoints,
                           bool accept_changes, const std::function<void()>& before_load)
    : dev_(dev), world_(world), m_(m), cfg_(c), toml_(to_toml(c)) {
  // A wrong --init-from is said before the trainer reserves memory (an 8B run over a small
  // model's folder said out-of-memory first).
  if (!resume && !c.model.init_from.empty()) check_init_weights(c.model.init_from, m);
  trainer_ = std::make_unique<Trainer>(dev, world, m, train_options(c));
  data_ = std::make_unique<DataSource>(data_options(c, m, trainer_->dp_size()));
  if (c.metrics.val_interval > 0) {
    const DataOptions v = val_options(c, m, trainer_->dp_size());
    val_ = std::make_unique<DataSource>(v);
    val_n_ = v.kind == DataKind::kFiles
                 ? std::min(c.metrics.val_sequences, val_->total_tokens() / c.train.seq_len)
                 : c.metrics.val_sequences;
  }
  check_same_data(world, *data_, "training", "data.path");
  if (val_) check_same_data(world, *val_, "validation", "data.val_path");
  start_ = initialize(world, c, m, *trainer_, *data_, resume, overwrite_checkpoints, accept_changes,
                      ckpt_run_, before_load);
  start_.run_id = ckpt_run_.run_id;
  // One checkpoint: fp32 weights and two moments of every parameter (sharded; headers aside).
  if (!c.checkpoint.dir.empty())
    check_checkpoint_room(world, c.checkpoint.dir,
                          checked_mul(parameter_count(m), int64_t(12), "checkpoint bytes"));
  // MFU's denominator: the stated peak, or this machine's GEMM rate in the compute dtype,
  // measured now on every rank at once (as they run in training), best of 10; the ranks' best is
  // the one reference.
  if (c.metrics.peak_flops > 0) {
    gemm_flops_ = c.metrics.peak_flops;
    return;
  }
  // Where 1024 x 1024 operands do not fit beside the run, smaller ones were timed (a lower rate,
  // so MFU reads higher): the start line says so.
  const GemmRate g = measure_job_gemm_rate(world, dev, c.memory.policy.dtype, kGemmReferenceN, 10);
  gemm_flops_ = g.flops_per_s;
  gemm_reference_n_ = g.n;
}

TrainingLoop::~TrainingLoop() = default;

Sequence TrainingLoop::sequence(int64_t step, int micro, int dp_rank) const {
  Sequence q{data_->sample(step, micro, dp_rank), {}};
  if (data_->packed())
    q.documents =
        documents_of(data_->sequence_documents(data_->global_index(step, micro, dp_rank), q.tokens),
                     cfg_.train.seq_len);
  if (copy_task())
    for (int64_t p = 0; p < cfg_.train.seq_len; ++p)
      q.group.push_back(copy_loss_counts(p, cfg_.train.seq_len) ? 1 : 0);
  return q;
}

double TrainingLoop::validate(int64_t step) {
  WatchdogContext ctx(fmt::format("validation after step {}", step));
  const int64_t s = cfg_.train.seq_len;
  const bool files = val_->options().kind == DataKind::kFiles;
  return trainer_->evaluate(
      [&](int64_t i) {
        Sequence q{files ? val_->window(i * s) : val_->sequence(i), {}};
        if (val_->packed()) q.documents = documents_of(val_->window_documents(i * s, q.tokens), s);
        return q;
      },
      val_n_);
}

void TrainingLoop::checkpoint(int64_t step, TrainingObserver& obs) {
  if (cfg_.checkpoint.dir.empty()) return;
  WatchdogContext ctx(fmt::format("checkpoint of step {}", step));
  const double t0 = now_s();
  const std::string path =
      save_checkpoint(ckpt_run_, step, trainer_->zero(), trainer_->cp_size(), toml_);
  checkpoint_s_ = std::max(checkpoint_s_, now_s() - t0);
  obs.on_checkpoint(step, path);
}

void TrainingLoop::gather_peaks(StepMetrics& m) {
  // Per arena: the peak over the ranks, and that rank's per-tag bytes at its peak.
  auto worst = [&](Arena& a, int64_t& peak, std::map<std::string, int64_t>& by_tag) {
    const int64_t mine = a.peak();
    std::vector<int64_t> peaks(static_cast<size_t>(world_.size()));
    world_.all_gather(&mine, peaks.data(), sizeof(int64_t));
    const int rank = int(std::max_element(peaks.begin(), peaks.end()) - peaks.begin());
    TagBytes at = a.at_peak_by_tag();
    world_.broadcast(at.v.data(), sizeof(at.v), rank);
    peak = peaks[size_t(rank)];
    for (int t = 0; t < kNumTags; ++t)
      if (at.v[size_t(t)] != 0) by_tag[tag_name(Tag(t))] = at.v[size_t(t)];
  };
  worst(dev_.mem(), m.peak_bytes, m.peak_by_tag);
  worst(dev_.host(), m.host_peak_bytes, m.host_peak_by_tag);
}

StepMetrics TrainingLoop::step_metrics(int64_t step, const StepResult& r, double seconds) {
  StepMetrics sm;
  sm.step = step;
  sm.run_id = start_.run_id;
  sm.loss = r.loss;
  if (copy_task()) sm.copy_loss = r.group_loss;
  if (data_->packed()) sm.documents = r.documents;
  sm.grad_norm = r.grad_norm;
  sm.lr = r.lr;
  gather_peaks(sm);
  sm.budget_bytes = cfg_.memory.device_bytes;
  sm.step_s = seconds;
  return sm;
}

bool TrainingLoop::checkpoint_due(int64_t step) const {
  return !cfg_.checkpoint.dir.empty() && cfg_.checkpoint.interval > 0 &&
         step % cfg_.checkpoint.interval == 0;
}

TimeLimitCosts TrainingLoop::time_costs(double dt, int64_t timed, double longest_step,
                                        int64_t validations, double val_mean) const {
  TimeLimitCosts c;
  c.next_step = timed > 0 ? longest_step : dt;
  // A validation's guess comes from timed steps (the warm-up step's, 15x a step's here, stopped a
  // run after its first step with most of its time left).
  c.validation = val_ && (validations > 0 || timed > 0) ? val_mean : 0;
  // Before a checkpoint is written, 1 s and a rank's master weights and moments (3 fp32 shards)
  // at kGuessedWriteRate.
  c.checkpoint = cfg_.checkpoint.dir.empty() ? 0
                 : checkpoint_s_ > 0         ? checkpoint_s_
                                     : 1.0 + 12.0 * double(zero_shard_elements(m_, world_.size())) /
                                                 kGuessedWriteRate;
  return c;
}

LoopEnd TrainingLoop::run(TrainingObserver& obs) {
  const int64_t steps = cfg_.train.steps, start = start_.step;
  const double step_flops_per_rank = training_flops_per_sequence(m_, cfg_.train.seq_len) *
                                     double(trainer_->dp_size()) * cfg_.train.micro_steps /
                                     double(world_.size());
  const SequenceFn data = [this](int64_t s, int micro, int dp) { return sequence(s, micro, dp); };
  LoopEnd end;
  double run_s = 0, val_total_s = 0;
  int64_t timed = 0, validations = 0, step = start;
  // The validations from step `s` (done) to the end: every val_interval-th step, and the last.
  const int64_t every = val_ ? cfg_.metrics.val_interval : 0;
  auto validations_after = [&](int64_t s) {
    return every > 0 ? steps / every - s / every + (steps % every != 0 && s < steps ? 1 : 0) : 0;
  };
  // train.time_limit on this rank's clock (every rank stops as the first to reach it: the stop
  // is all-reduced).
  const TimeLimit limit(cfg_.train.time_limit_s, now_s(), process_age_s());
  double longest_step = 0;
  if (limit.set() && step < steps) {
    float over = limit.passed(now_s()) ? kTimeLimitStop : 0.0f;
    world_.all_reduce(&over, 1, DType::kF32, ReduceOp::kMax);
    if (over != 0.0f) {
      end.stopped = end.time_limit = true;
      end.last_step = step;
      return end;
    }
  }
  while (step < steps) {
    WatchdogContext ctx(fmt::format("step {}", step + 1));
    dev_.mem().reset_peak();
    dev_.host().reset_peak();
    const double t0 = now_s();
    StepResult r;
    try {
      r = trainer_->step(step, data);
    } catch (const StepDiverged& e) {
      // The step that diverged has its metrics line (its non-finite numbers, and the speed and
      // ETA it has none of, written as null), so a plot shows where the run went; then the run
      // ends with the error.
      constexpr double kNone = std::numeric_limits<double>::quiet_NaN();
      StepMetrics sm = step_metrics(step + 1, e.result, now_s() - t0);
      sm.tokens_per_s = sm.mfu = sm.eta_s = kNone;
      obs.on_step(sm);
      throw;
    }
    const double dt = now_s() - t0;
    ++step;
    if (step > start + 1 || steps - start == 1) {  // the first step warms up
      run_s += dt;
      ++timed;
      longest_step = std::max(longest_step, dt);
    }
    // The validation a stop runs: the mean of those run; before the first, a forward of each
    // held-out sequence a DP replica runs at a third of a training step's time per sequence
    // (forward + backward, about three forwards).
    const double step_mean = timed > 0 ? run_s / double(timed) : dt;
    const double val_mean =
        validations > 0 ? val_total_s / double(validations)
                        : step_mean / (3.0 * double(cfg_.train.micro_steps)) *
                              double((val_n_ + trainer_->dp_size() - 1) / trainer_->dp_size());
    const bool last = step == steps;
    // The signal's number travels with the request (the largest, should several ranks get one),
    // so rank 0 can say which ended the run when another rank received it; a time limit above it.
    float stop = stop_requested() ? float(std::max(1, stop_signal()))
                 : !last && limit.stop_after_step(
                                now_s(), time_costs(dt, timed, longest_step, validations, val_mean),
                                val_ && step % cfg_.metrics.val_interval == 0, checkpoint_due(step))
                     ? kTimeLimitStop
                     : 0.0f;
    world_.all_reduce(&stop, 1, DType::kF32, ReduceOp::kMax);
    if (step == start + 1) end.first_group_loss = r.group_loss;
    end.last_group_loss = r.group_loss;
    StepMetrics sm = step_metrics(step, r, dt);
    sm.tokens_per_s = double(trainer_->tokens_per_rank_per_step()) / dt;
    sm.mfu = gemm_flops_ > 0 ? step_flops_per_rank / dt / gemm_flops_ : 0;
    if (val_ && (step % cfg_.metrics.val_interval == 0 || last || stop != 0.0f)) {
      const double v0 = now_s();
      sm.val_loss = validate(step);
      sm.val_s = now_s() - v0;
      val_total_s += *sm.val_s;
      ++validations;
    }
    // The validations to come at the mean so far (val_mean: before this step's).
    const double val_each = validations > 0 ? val_total_s / double(validations) : val_mean;
    sm.eta_s = double(steps - step) * step_mean + double(validations_after(step)) * val_each;
    obs.on_step(sm);
    if (stop != 0.0f && !last) {
      end.stopped = true;
      end.time_limit = stop == kTimeLimitStop;
      end.stop_signal = end.time_limit ? 0 : int(stop);
      break;
    }
    if (!last && checkpoint_due(step)) checkpoint(step, obs);
  }
  if (step > start) checkpoint(step, obs);
  end.last_step = step;
  return end;
}

RunDataSize check_run_data(const RunConfig& c, const ModelConfig& m, int dp_size, bool open_files) {
  RunDataSize out;
  DataOptions d = data_options(c, m, dp_size);
  d.check_vocab = false;
  if (!open_files) {
    check_data_options(d);
    return out;
  }
  const DataSource data(d);
  if (d.kind == DataKind::kFiles) out.tokens = data.total_tokens();
  if (c.metrics.val_interval > 0) {
    DataOptions v = val_options(c, m, dp_size);
    v.check_vocab = false;
    const DataSource val(v);
    if (v.kind == DataKind::kFiles) out.val_tokens = val.total_tokens();
  }
  return out;
}

}  // namespace upipe
