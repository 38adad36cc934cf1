// `upipe train [RUN.toml] [--section.key=value ...] [--resume] [--init-from DIR]
// [--overwrite-checkpoints]`: the training loop. The run file (train/run_config.h) is printed back
// in full at start with a table of the run; every step gives one log line (a live bar on a
// terminal) and one JSONL metrics object; checkpoints are written every checkpoint.interval steps
// and at the end; SIGINT/SIGTERM/SIGUSR1 finish the current step, write a checkpoint and exit 0; a
// stuck rank ends the job after comm.timeout_s (core/watchdog.h). docs/training.md is the user's
// guide.
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <cmath>

#include "apps/upipe/commands.h"
#include "core/errors.h"
#include "core/stop_signal.h"
#include "core/watchdog.h"
#include "model/safetensors.h"
#include "model/weights.h"
#include "train/checkpoint.h"
#include "train/data.h"
#include "train/flops.h"
#include "train/metrics.h"
#include "train/run_config.h"
#include "train/trainer.h"

namespace upipe::app {
namespace {

struct Options {
  std::string run_file;
  std::string init_from;
  bool resume = false;
  bool overwrite_checkpoints = false;
  bool print_config = false;
};

double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

TrainOptions train_options(const RunConfig& c) {
  TrainOptions o;
  o.cp_size = c.parallel.cp_size;
  o.micro_steps = c.train.micro_steps;
  o.decoder.method = c.parallel.method;
  o.decoder.attn.seq_len = c.train.seq_len;
  o.decoder.attn.dtype = parse_dtype(c.train.dtype);
  o.decoder.attn.head_chunk = c.parallel.head_chunk;
  o.decoder.attn.ulysses_degree = c.parallel.ulysses_degree;
  o.decoder.attn.chunks = c.parallel.chunks;
  o.decoder.tile_tokens = c.train.tile_tokens;
  o.decoder.offload_checkpoints = c.train.offload_checkpoints;
  o.decoder.checkpoint_dtype = parse_dtype(c.train.checkpoint_dtype);
  o.decoder.residual_dtype = parse_dtype(c.train.residual_dtype);
  o.decoder.checkpoint_granularity = parse_checkpoint_granularity(c.train.checkpoint_granularity);
  o.schedule = {c.train.lr, c.min_lr(), c.train.warmup_steps, c.train.steps};
  o.optimizer = {c.train.beta1, c.train.beta2, c.train.eps, c.train.weight_decay};
  o.grad_clip = c.train.grad_clip;
  return o;
}

std::vector<std::pair<std::string, std::string>> knobs(const RunConfig& c) {
  std::vector<std::pair<std::string, std::string>> k;
  if (c.parallel.head_chunk) k.push_back({"head_chunk", std::to_string(c.parallel.head_chunk)});
  if (c.parallel.ulysses_degree)
    k.push_back({"ulysses_degree", std::to_string(c.parallel.ulysses_degree)});
  if (c.parallel.chunks) k.push_back({"chunks", std::to_string(c.parallel.chunks)});
  return k;
}

// `upipe demo`: the copy task on the tiny model with upipe, tuned so that the copied half's loss
// falls from log V to near 0 within the run (in about 400 steps) on 2 ranks. Command-line
// overrides apply after these.
const std::vector<std::string> kDemoOverrides = {
    "--model.name=tiny",       "--parallel.method=upipe",  "--data.kind=copy",
    "--train.seq_len=128",     "--train.micro_steps=8",    "--train.steps=1000",
    "--train.lr=3e-3",         "--train.warmup_steps=50",  "--train.weight_decay=0",
    "--train.tile_tokens=128", "--metrics.log_interval=50"};

int run(Process& proc, const Options& opt, std::vector<std::string> overrides) {
  if (!opt.init_from.empty()) overrides.push_back("--model.init_from=" + opt.init_from);
  const RunConfig cfg = load_run_config(opt.run_file, overrides);
  const std::string toml = to_toml(cfg);
  if (opt.print_config) {
    if (proc.root()) std::printf("%s", toml.c_str());
    return 0;
  }
  Watchdog::start(cfg.comm.timeout_s);
  install_stop_handlers();
  Communicator& world = proc.world;
  const ModelConfig m = load_model_config(cfg.model.name);
  const TrainOptions topt = train_options(cfg);
  const int64_t budget = cfg.budget_bytes();
  Device dev({BackendKind::kCpu, budget, budget});
  Trainer tr(dev, world, m, topt);
  DataOptions dopt;
  dopt.kind = parse_data_kind(cfg.data.kind);
  dopt.path = cfg.data.path;
  dopt.seq_len = cfg.train.seq_len;
  dopt.vocab = m.vocab_size;
  dopt.seed = uint64_t(cfg.train.seed);
  dopt.dp_size = tr.dp_size();
  dopt.micro_steps = cfg.train.micro_steps;
  const DataSource data(dopt);
  const bool copy_task = dopt.kind == DataKind::kCopy;
  const SequenceFn sequences = [&](int64_t step, int micro, int dp_rank) {
    Sequence q{data.sample(step, micro, dp_rank), {}};
    if (copy_task)
      for (int64_t p = 0; p < cfg.train.seq_len; ++p)
        q.group.push_back(copy_loss_counts(p, cfg.train.seq_len) ? 1 : 0);
    return q;
  };

  // Start: the newest complete checkpoint (--resume), Hugging Face weights, or random.
  int64_t start = 0;
  std::string origin = "random init (seed " + std::to_string(cfg.train.seed) + ")";
  const CheckpointStart cs = open_checkpoint_run(world, cfg.checkpoint.dir, opt.resume,
                                                 opt.overwrite_checkpoints, cfg.checkpoint.keep);
  const std::optional<std::string>& ckpt = cs.resume_from;
  if (ckpt) {
    const CheckpointInfo info = load_checkpoint(*ckpt, tr.zero());
    start = info.step;
    origin = fmt::format("{} (step {}, written on {} ranks{})", *ckpt, info.step, info.world,
                         info.world == world.size() ? "" : ", resharded");
  } else if (!cfg.model.init_from.empty()) {
    const SafetensorsReader reader = open_init_weights(cfg.model.init_from, m);
    tr.zero().init(&reader, uint64_t(cfg.train.seed));
    origin = "Hugging Face weights from " + cfg.model.init_from;
  } else {
    tr.zero().init(nullptr, uint64_t(cfg.train.seed));
  }
  if (start >= cfg.train.steps && proc.root())
    std::printf("upipe train: the checkpoint is at step %lld of train.steps = %lld; nothing to do\n",
                (long long)start, (long long)cfg.train.steps);

  // MFU's denominator: this machine's GEMM rate in the compute dtype, measured now.
  // Measured on every rank at once (as they run in training), best of 10; the ranks' best is the
  // one reference, so every rank reports the same MFU scale.
  world.barrier();
  float gemm_rate = float(measure_gemm_flops(dev, topt.decoder.attn.dtype, 1024, 10));
  world.all_reduce(&gemm_rate, 1, DType::kF32, ReduceOp::kMax);
  const double gemm_flops = gemm_rate;
  const double step_flops_per_rank = training_flops_per_sequence(m, cfg.train.seq_len) *
                                     double(tr.dp_size()) * cfg.train.micro_steps /
                                     double(world.size());
  std::unique_ptr<MetricsWriter> metrics;
  std::unique_ptr<ProgressDisplay> display;
  if (proc.root()) {
    std::printf("# upipe train: effective run file\n%s\n", toml.c_str());
    StartupInfo si;
    si.model = m.source;
    si.parameters = parameter_count(m);
    si.dp = tr.dp_size();
    si.cp = tr.cp_size();
    si.method = cfg.parallel.method;
    si.knobs = knobs(cfg);
    si.dtype = cfg.train.dtype;
    si.budget_bytes = budget;
    si.seq_len = cfg.train.seq_len;
    si.micro_steps = cfg.train.micro_steps;
    si.steps = cfg.train.steps;
    si.data = cfg.data.kind + (cfg.data.path.empty() ? "" : ": " + cfg.data.path);
    std::printf("%s", format_startup_table(si).c_str());
    std::printf("start: %s; GEMM rate %.1f GFLOP/s per rank (MFU's reference)\n", origin.c_str(),
                gemm_flops / 1e9);
    // Under mpirun (one node) rank 0's parent is mpirun, which forwards SIGUSR1 to every rank.
    std::printf("stop cleanly (finish the step, checkpoint, exit 0): kill -USR1 %d\n",
                std::getenv("OMPI_COMM_WORLD_SIZE") != nullptr ? int(getppid()) : int(getpid()));
    std::fflush(stdout);
    if (!cfg.metrics.path.empty())
      metrics = std::make_unique<MetricsWriter>(cfg.metrics.path, ckpt ? start : -1);
    display = std::make_unique<ProgressDisplay>(
        stdout, cfg.train.steps, cfg.metrics.log_interval,
        parse_progress_mode(cfg.metrics.progress, stdout_is_terminal()));
  }

  auto checkpoint = [&](int64_t step) {
    if (cfg.checkpoint.dir.empty()) return;
    WatchdogContext ctx(fmt::format("checkpoint of step {}", step));
    const std::string path = save_checkpoint(cs.run, step, tr.zero(), tr.cp_size(), toml);
    if (display) display->print("checkpoint written: " + path);
  };
  double run_s = 0;
  int64_t timed = 0;
  double first_copy = 0, last_copy = 0;
  int64_t step = start;
  bool stopped = false;
  while (step < cfg.train.steps) {
    WatchdogContext ctx(fmt::format("step {}", step + 1));
    dev.mem().reset_peak();
    const double t0 = now_s();
    const StepResult r = tr.step(step, sequences);
    const double dt = now_s() - t0;
    ++step;
    // A stop request on any rank stops every rank after this step.
    float stop = stop_requested() ? 1.0f : 0.0f;
    world.all_reduce(&stop, 1, DType::kF32, ReduceOp::kMax);
    // Peak over the ranks, with that rank's breakdown.
    const int64_t peak = dev.mem().peak();
    std::vector<int64_t> peaks(static_cast<size_t>(world.size()));
    world.all_gather(&peak, peaks.data(), sizeof(int64_t));
    const int worst = int(std::max_element(peaks.begin(), peaks.end()) - peaks.begin());
    TagBytes at_peak = dev.mem().at_peak_by_tag();
    world.broadcast(at_peak.v.data(), sizeof(at_peak.v), worst);
    if (step > start + 1 || cfg.train.steps - start == 1) {  // the first step warms up
      run_s += dt;
      ++timed;
    }
    if (step == start + 1) first_copy = r.group_loss;
    last_copy = r.group_loss;
    if (proc.root()) {
      StepMetrics sm;
      sm.step = step;
      sm.loss = r.loss;
      if (copy_task) sm.copy_loss = r.group_loss;
      sm.grad_norm = r.grad_norm;
      sm.lr = r.lr;
      sm.tokens_per_s = double(tr.tokens_per_rank_per_step()) / dt;
      sm.mfu = gemm_flops > 0 ? step_flops_per_rank / dt / gemm_flops : 0;
      sm.peak_bytes = peaks[size_t(worst)];
      for (int t = 0; t < kNumTags; ++t)
        if (at_peak.v[size_t(t)] != 0) sm.peak_by_tag[tag_name(Tag(t))] = at_peak.v[size_t(t)];
      sm.budget_bytes = budget;
      sm.step_s = dt;
      sm.eta_s = double(cfg.train.steps - step) * (timed > 0 ? run_s / double(timed) : dt);
      if (metrics) metrics->write(sm);
      display->update(sm);
    }
    const bool last = step == cfg.train.steps;
    if (stop != 0.0f && !last) {
      stopped = true;
      break;
    }
    if (!last && cfg.checkpoint.interval > 0 && step % cfg.checkpoint.interval == 0)
      checkpoint(step);
  }
  if (step > start) checkpoint(step);
  if (display) {
    display->finish();
    if (stopped)
      std::printf("upipe train: stopped by signal %d after step %lld; %s\n", stop_signal(),
                  (long long)step,
                  cfg.checkpoint.dir.empty()
                      ? "no checkpoint.dir was set, so nothing was saved"
                      : "checkpoint written; continue with --resume");
    else
      std::printf("upipe train: done, %lld steps\n", (long long)step);
    if (copy_task && step > start)
      std::printf("copy task: the loss of the copied half went from %.4f (step %lld) to %.4f "
                  "(step %lld); guessing gives log V = %.4f, so %s\n",
                  first_copy, (long long)start + 1, last_copy, (long long)step,
                  std::log(double(m.vocab_size)),
                  last_copy < 0.5 * std::log(double(m.vocab_size))
                      ? "attention learned to copy across the ranks' boundaries"
                      : "it has not learned to copy yet (more steps, or a higher train.lr)");
  }
  Watchdog::stop();
  return 0;
}

}  // namespace

Runner add_demo_train(CLI::App& cmd) {
  auto opt = std::make_shared<Options>();
  cmd.allow_extras();
  CLI::App* c = &cmd;
  return [opt, c](Process& p) {
    std::vector<std::string> o = kDemoOverrides;
    for (const std::string& a : c->remaining()) o.push_back(a);
    return run(p, *opt, o);
  };
}

Runner add_train(CLI::App& cmd) {
  auto opt = std::make_shared<Options>();
  cmd.add_option("run_file", opt->run_file,
                 "TOML run file (docs/training.md); every key has a default, so it is optional");
  cmd.add_flag("--resume", opt->resume,
               "continue from the newest complete checkpoint in checkpoint.dir");
  cmd.add_option("--init-from", opt->init_from,
                 "start from this Hugging Face directory's weights (= --model.init_from=DIR)");
  cmd.add_flag("--overwrite-checkpoints", opt->overwrite_checkpoints,
               "a fresh run may replace another run's checkpoints in checkpoint.dir (deleted "
               "after this run's first complete checkpoint)");
  cmd.add_flag("--print-config", opt->print_config, "print the effective run file and exit");
  cmd.allow_extras();
  cmd.footer(
      "Any run-file key can be set on the command line as --section.key=value, e.g.\n"
      "  upipe train --model.name=tiny --train.steps=50 --parallel.method=upipe");
  CLI::App* c = &cmd;
  return [opt, c](Process& p) { return run(p, *opt, c->remaining()); };
}

}  // namespace upipe::app
