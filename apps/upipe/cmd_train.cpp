// `upipe train [RUN.toml] [--flag=value ...] [--resume]`: parse the settings, run the training
// loop (src/train/loop.h) and render it. The run file (train/run_config.h) is printed back in full
// at start with a table of the run; every step gives one log line (a live bar on a terminal) and
// one JSONL metrics object; SIGINT/SIGTERM/SIGUSR1 finish the current step, write a checkpoint
// and exit 0; a stuck rank ends the job after comm.timeout (core/watchdog.h). docs/training.md is
// the user's guide.
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <unordered_map>

#include "apps/upipe/commands.h"
#include "apps/upipe/model_run.h"
#include "apps/upipe/settings_cli.h"
#include "attention/device_comm.h"
#include "attention/methods.h"
#include "backend/cpu/cpu_isa.h"
#include "core/allocator.h"
#include "core/errors.h"
#include "core/setting_ref.h"
#include "core/stop_signal.h"
#include "core/watchdog.h"
#include "model/weights.h"
#include "plan/host_memory.h"
#include "plan/planner.h"
#include "train/checkpoint.h"
#include "train/export.h"
#include "train/loop.h"
#include "train/metrics.h"
#include "train/resume.h"
#include "train/run_config.h"
#include "train/run_options.h"

namespace upipe::app {
namespace {

struct Options {
  std::string run_file;
  bool resume = false;
  bool accept_changes = false;
  bool overwrite = false;  // --overwrite (--overwrite-checkpoints, its older name)
  bool print_config = false;
};

// --resume: the run the newest checkpoint of checkpoint.dir records (its info in *recorded), with
// what was typed on top; the changes are checked (train/resume.h) and their report is *report
// (printed by rank 0 once the checkpoint has loaded: above a corrupt checkpoint's error it read
// as if the run had continued).
Settings resumed_settings(const Process& proc, const Options& opt, const SettingArgs& sa,
                          const CLI::App& cmd, const RunConfig& typed, CheckpointInfo* recorded,
                          std::vector<std::string>* report) {
  if (typed.checkpoint.dir.empty())
    throw ConfigError(fmt::format("--resume needs {} (the run's checkpoint directory)",
                                  setting_ref("checkpoint.dir")));
  // Every rank reads the one checkpoint rank 0 does (hosts that see other directories would
  // each continue their own).
  const std::optional<std::string> ckpt =
      newest_checkpoint_everywhere(proc.world, typed.checkpoint.dir);
  const CheckpointInfo& info = *recorded = read_checkpoint_info(*ckpt);
  SettingSources ignored;  // older spellings in an older checkpoint are not the user's
  RecordedRun rec{parse_run_toml(info.run_toml, *ckpt + "/meta.json", &ignored),
                  info.step,
                  info.world,
                  info.cp_size,
                  *ckpt,
                  info.data};
  // An older checkpoint recorded its paths as typed, relative to where that run started: taken
  // from here (as that build did), so they compare with what is typed now.
  make_paths_absolute(rec.config, [](std::string_view) { return true; });
  for (const std::string& n : drop_unread_paths(rec.config))
    if (proc.root()) std::fprintf(stderr, "upipe: note: %s\n", n.c_str());
  Settings now = resolve_settings(proc, sa, cmd, opt.run_file, {}, &rec.config);
  make_paths_absolute(now.config, [&](std::string_view k) {
    return now.sources.spelled.count(std::string(k)) != 0;  // typed now: as the fresh run did
  });
  try {
    *report = check_resume(rec, now.config, proc.world.size(), opt.accept_changes);
  } catch (const ConfigError& e) {
    // --print-config shows the run file a resume would continue even where the resume itself
    // would be refused (a finished run, a change it does not accept): said, not run.
    if (!opt.print_config) throw;
    if (proc.root())
      std::fprintf(stderr, "note: as given, --resume would be refused: %s\n", e.what());
  }
  return now;
}

// Rank 0's rendering of the loop: the metrics file and the progress display.
class Render final : public TrainingObserver {
 public:
  Render(const RunConfig& c, const RunStart& start, bool overwrite, MetricsLock lock)
      : display_(stdout, c.train.steps, c.metrics.log_interval,
                 parse_progress_mode(c.metrics.progress, stdout_is_terminal())) {
    if (!c.metrics.path.empty()) {
      metrics_ = std::make_unique<MetricsWriter>(c.metrics.path, start.resumed ? start.step : -1,
                                                 overwrite, start.run_id, std::move(lock));
      // Lines past the checkpoint are the steps run again: said, never dropped silently.
      if (metrics_->dropped_lines() > 0)
        std::printf(
            "metrics: %s held steps up to %lld; its %lld line(s) after step %lld are "
            "dropped (the run continues from its checkpoint)\n",
            c.metrics.path.c_str(), (long long)metrics_->last_step_held(),
            (long long)metrics_->dropped_lines(), (long long)start.step);
    }
  }
  void on_step(const StepMetrics& m) override {
    if (metrics_) metrics_->write(m);
    display_.update(m);
    if (!std::isfinite(m.tokens_per_s) || !std::isfinite(m.mfu)) return;  // a diverged step
    ++steps_;
    train_s_ += m.step_s;
    tokens_ += m.tokens_per_s * m.step_s;
    mfu_s_ += m.mfu * m.step_s;
    peak_ = std::max(peak_, m.peak_bytes);
  }
  // The steps this process ran, over all of them (a log line's tokens/s is its step's): "" when
  // none ran.
  std::string summary() const {
    if (steps_ == 0 || !(train_s_ > 0)) return "";
    return fmt::format("{} step{} in {}: {} tok/s/rank and MFU {:.1f}% over them, device peak {}",
                       format_count(steps_), steps_ == 1 ? "" : "s", format_duration(train_s_),
                       format_rate(tokens_ / train_s_), 100 * mfu_s_ / train_s_,
                       format_bytes(peak_));
  }
  void on_checkpoint(int64_t, const std::string& path) override {
    display_.print("checkpoint written: " + path);
  }
  void finish() { display_.finish(); }

 private:
  std::unique_ptr<MetricsWriter> metrics_;
  ProgressDisplay display_;
  int64_t steps_ = 0, peak_ = 0;
  double train_s_ = 0, tokens_ = 0, mfu_s_ = 0;  // seconds, tokens per rank, MFU x seconds
};

// The plan of this very run (`upipe plan` with its world and the settings that change memory; no
// reserve: its budget is all its arena has), which says what fits where the run does not.
std::string plan_command(const RunConfig& cfg, int world) {
  RunConfig budget_given;
  budget_given.memory.device_bytes = cfg.memory.device_bytes + 1;  // the budget always written
  return fmt::format("upipe plan --ranks {} {} --reserve 0", world,
                     to_flags(cfg, kScopePlan, budget_given));
}

// The ranks of one host share its memory (plan/host_memory.h): every rank gathers the host names
// and memories and checks every host alike, so every rank refuses alike.
void check_hosts_memory(const Plan& p, const RunConfig& cfg, Communicator& world) {
  const std::vector<std::string> hosts = host_names(world);
  std::vector<int64_t> memory(hosts.size());
  const int64_t mine = physical_memory_bytes();
  world.all_gather(&mine, memory.data(), sizeof(int64_t));
  const bool cpu = parse_backend_kind(cfg.device.backend) == BackendKind::kCpu;
  const std::optional<HostOverMemory> o = host_over_memory(p, cpu, hosts, memory);
  if (!o) return;
  const int64_t share = cpu ? o->device_share : o->host_share;
  const std::string budget =
      share > 0 ? fmt::format("; or plan with {} (what the host holds a rank{})",
                              setting_value(cpu ? "memory.device_memory" : "memory.host_memory",
                                            bytes_text(share)),
                              cpu ? " beside its host arena" : "")
                : "";
  throw OutOfMemoryError(
      render_setting_refs(fmt::format(
          "out of memory on host {}, found before anything is loaded (the run's step played on "
          "the meta device): its {} rank(s) plan {} together (at most {} a rank: {}), over the {} "
          "of memory the host has; fewer ranks on a host{}: `upipe plan` says what fits",
          o->host, o->ranks, format_bytes(o->need), format_bytes(o->most),
          cpu ? "its device and host arenas' peaks" : "its host arena's peak",
          format_bytes(o->have), budget)),
      cpu ? "device" : "host", "planned", o->need, "");
}

// The run's step, planned before any weight or checkpoint is read (src/plan: the engine's own
// step on the meta device, so the very bytes each rank's step allocates): a run that does not
// fit its budget ends now, with the out-of-memory error its first step would end in after the
// weights had loaded (on cuda, and for packed documents at their worst, it may only be said:
// below). Every rank plans alike (the plan is a function of the settings), so every rank ends
// alike.
Plan plan_run(const RunConfig& cfg, const ModelConfig& m, int world, bool root,
              const std::string& plan_cmd) {
  PlanRequest r = plan_request(cfg, world);
  r.reserve_bytes = 0;  // the budget is all the arena has
  const Plan p = plan_step(m, r, /*stop_at_budget=*/true);
  if (p.fits || (p.limit_arena != "device" && p.limit_arena != "host")) return p;
  // Where it stops: the request, the live bytes, the budget, and what to change.
  auto over = [&](const Plan& q) {
    const bool device = q.limit_arena == "device";
    return fmt::format(
        "rank {}'s step requests {} ({} B) for tag '{}' with {} in use, over {}; raise {} or "
        "choose a configuration with a smaller peak: `{}` says what fits",
        q.limit_rank, format_bytes(q.limit_request), q.limit_request, q.limit_tag,
        q.limit_breakdown,
        setting_value(device ? "memory.device_memory" : "memory.host_memory",
                      bytes_text(device ? r.device_bytes : r.host_bytes)),
        setting_ref(device ? "memory.device_memory" : "memory.host_memory"), plan_cmd);
  };
  auto refuse = [&](const Plan& q, const char* which) {
    throw OutOfMemoryError(
        fmt::format("out of memory in {} arena, found before anything is loaded (the run's step "
                    "played on the meta device{}): {}",
                    q.limit_arena, which, over(q)),
        q.limit_arena, q.limit_tag, q.limit_request, q.limit_breakdown);
  };
  // On cuda the plan takes cuDNN's and cuBLASLt's workspaces from their host-side queries, which
  // no GPU run has been checked against yet (issue 19): said, the run decides.
  if (r.backend == BackendKind::kCuda) {
    if (root)
      std::fprintf(
          stderr, "%s\n",
          render_setting_refs(fmt::format("upipe: warning: this run's step, planned on the meta "
                                          "device, does not fit: {} (the cuda plan's workspaces "
                                          "are not yet checked against a GPU run: it goes on)",
                                          over(p)))
              .c_str());
    return p;
  }
  if (!r.worst_case_documents) refuse(p, "");
  // Packed documents at their worst (a document per token) are a bound the data may stay far
  // below: with one document a sequence, the least its mask takes, the run must fit; between the
  // two it is said, and the run goes on.
  PlanRequest one = r;
  one.worst_case_documents = false;
  one.doc_lens = {r.decoder.seq_len};
  const Plan least = plan_step(m, one, /*stop_at_budget=*/true);
  if (!least.fits && (least.limit_arena == "device" || least.limit_arena == "host"))
    refuse(least, ", one document a sequence");
  if (root)
    std::fprintf(stderr, "%s\n",
                 render_setting_refs(
                     fmt::format("upipe: warning: with its packed documents at their worst (a "
                                 "document per token), this run's step does not fit its {} arena "
                                 "(the step played on the meta device): {}; a sequence of that "
                                 "many documents would end the run out of memory",
                                 p.limit_arena, over(p)))
                     .c_str());
  return p;
}

// The folder whose tokenizer an export of the run would copy (its --init-from, else its model
// directory) when it holds one; "" otherwise.
std::string tokenizer_dir(const RunConfig& cfg) {
  for (const std::string& d : {cfg.model.init_from, cfg.model.name}) {
    std::error_code ec;
    if (d.empty() || !std::filesystem::is_directory(d, ec)) continue;
    for (const std::string& f : hf_tokenizer_files())
      if (std::filesystem::is_regular_file(std::filesystem::path(d) / f, ec)) return d;
  }
  return "";
}

// A run that trains the user's data or weights and has no checkpoint.dir: its result is lost.
bool saves_nothing(const RunConfig& cfg) {
  return cfg.checkpoint.dir.empty() && (cfg.data.kind == "files" || !cfg.model.init_from.empty());
}

void print_startup(const RunConfig& cfg, const ModelConfig& m, TrainingLoop& loop,
                   const std::string& toml, const Plan& planned) {
  std::printf("# upipe train: effective run file\n%s\n", toml.c_str());
  StartupInfo si;
  si.model = m.source;
  si.parameters = parameter_count(m);
  si.dp = loop.trainer().dp_size();
  si.cp = loop.trainer().cp_size();
  si.method = cfg.parallel.knobs.method;
  // The knobs it runs with, defaults resolved ("U=4 overlap"), as plan and check show them.
  AttentionConfig ac = to_attention_config(m);
  ac.knobs = cfg.parallel.knobs;
  ac.seq_len = cfg.train.seq_len;
  if (const std::string t = knobs_text(ac, si.cp); t != "-") si.knobs.push_back({t, ""});
  si.dtype = dtype_name(cfg.memory.policy.dtype);
  si.budget_bytes = cfg.memory.device_bytes;
  si.seq_len = cfg.train.seq_len;
  si.micro_steps = cfg.train.micro_steps;
  si.steps = cfg.train.steps;
  si.data = cfg.data.kind + (cfg.data.path.empty() ? "" : ": " + cfg.data.path);
  si.isa = cpu_isa_name(cpu_isa());
  std::printf("%s", format_startup_table(si).c_str());
  const std::string peak = render_setting_refs(setting_ref("metrics.peak_flops"));
  if (cfg.metrics.peak_flops > 0)
    std::printf("start: %s; MFU relative to %s = %.1f TFLOP/s per rank\n",
                loop.start().origin.c_str(), peak.c_str(), loop.gemm_flops() / 1e12);
  else {
    const int64_t n = loop.gemm_reference_n(), full = TrainingLoop::kGemmReferenceN;
    const std::string smaller =
        n > 0 && n < full
            ? fmt::format(
                  " on {0} x {0} operands ({1} x {1} do not fit beside the run; smaller "
                  "GEMMs run slower, so MFU reads higher)",
                  n, full)
            : std::string();
    std::printf(
        "start: %s; MFU relative to the GEMM rate measured now%s, %.1f GFLOP/s per rank "
        "(a busy machine lowers it; %s states a peak)\n",
        loop.start().origin.c_str(), smaller.c_str(), loop.gemm_flops() / 1e9, peak.c_str());
  }
  if (planned.fits)
    std::printf(
        "plan: a step peaks at %s (%lld B) of device memory per rank (rank %d; budget %s) and "
        "%s%s; "
        "the step lines' peak is measured\n",
        format_bytes(planned.device_peak).c_str(), (long long)planned.device_peak,
        planned.worst_rank, format_bytes(cfg.memory.device_bytes).c_str(),
        planned.host_peak == 0
            ? "no host memory"
            : fmt::format("{} ({} B) of host memory (budget {})", format_bytes(planned.host_peak),
                          planned.host_peak, format_bytes(cfg.memory.host_bytes))
                  .c_str(),
        planned.request.worst_case_documents
            ? ", at most (the documents planned at their worst, one per token)"
            : "");
  for (const std::string& w : run_warnings(cfg, m))
    std::printf("warning: %s\n", render_setting_refs(w).c_str());
  // A model directory's weights are the architecture's source only; starting from them is
  // --init-from. A run that may have meant to fine-tune hears so.
  if (!loop.start().resumed && cfg.model.init_from.empty() && has_checkpoint(cfg.model.name))
    std::printf(
        "warning: %s\n",
        render_setting_refs(
            fmt::format("{} holds weights, which this run does not load: it starts from random "
                        "weights; to start from them, add {}={}",
                        setting_value("model.name", cfg.model.name), setting_ref("model.init_from"),
                        cfg.model.name))
            .c_str());
  if (cfg.metrics.val_interval > 0 && loop.val_sequences() < cfg.metrics.val_sequences)
    std::printf("warning: %s\n",
                render_setting_refs(
                    fmt::format("{} holds {} sequence(s) of {} tokens, fewer than {}: each "
                                "validation uses {}",
                                setting_value("data.val_path", cfg.data.val_path),
                                loop.val_sequences(), cfg.train.seq_len,
                                setting_value("metrics.val_sequences", cfg.metrics.val_sequences),
                                loop.val_sequences()))
                    .c_str());
  // Byte ids (upipe tokenize's) fed to a pretrained model whose own tokenizer maps other text to
  // them: the fine-tune learns another code than its tokenizer's, and the export carries that
  // tokenizer. Said, not refused (a model may be taught bytes on purpose).
  if (const std::string dir = tokenizer_dir(cfg);
      cfg.data.kind == "files" && loop.data().max_id() >= 0 && loop.data().max_id() < 256 &&
      m.vocab_size > 256 && !dir.empty())
    std::printf("warning: %s\n",
                render_setting_refs(
                    fmt::format("every id of {} is below 256 (byte ids, as upipe tokenize writes "
                                "them), but the model's vocabulary is {} and {} holds its own "
                                "tokenizer, which reads other text as those ids (and an export "
                                "carries it): tokenize with that tokenizer (docs/training.md, \"A "
                                "pretrained model's own tokenizer\"), or export with --tokenizer "
                                "bytes",
                                setting_ref("data.path"), m.vocab_size, dir))
                    .c_str());
  // Training the user's data or weights with nowhere to save them: said now, not at the end.
  if (saves_nothing(cfg))
    std::printf("warning: %s\n",
                render_setting_refs(
                    fmt::format("no {} is set: the trained weights are not saved (nothing to "
                                "resume or export at the end); give {} to keep them",
                                setting_ref("checkpoint.dir"),
                                setting_value("checkpoint.dir", "DIR")))
                    .c_str());
  // Under mpirun (one node) rank 0's parent is mpirun, which forwards SIGUSR1 to every rank.
  std::printf("stop cleanly (finish the step, %sexit 0): kill -USR1 %d\n",
              cfg.checkpoint.dir.empty() ? "" : "checkpoint, ",
              std::getenv("OMPI_COMM_WORLD_SIZE") != nullptr ? int(getppid()) : int(getpid()));
  std::fflush(stdout);
}

// Said where the method's all-to-alls cross hosts (the ranks' host names, by rank), with the
// Ulysses degree that keeps them within one; "" where they stay within a host.
std::string across_hosts_note(const RunConfig& cfg, const ModelConfig& m, TrainingLoop& loop,
                              const std::vector<std::string>& hosts) {
  std::unordered_map<std::string, int> id;  // hosts numbered as met (linear in the ranks)
  std::vector<int> host_of;
  for (const std::string& h : hosts) host_of.push_back(id.emplace(h, int(id.size())).first->second);
  AttentionConfig ac = to_attention_config(m);
  ac.knobs = cfg.parallel.knobs;
  ac.seq_len = cfg.train.seq_len;
  const std::string note = upipe::across_hosts_note(ac, loop.trainer().cp_size(), host_of);
  return note.empty() ? note
                      : render_setting_refs(note + " (upipe plan --ranks-per-host plans it)");
}

void print_end(const RunConfig& cfg, const ModelConfig& m, const TrainingLoop& loop,
               const LoopEnd& end) {
  if (end.stopped && end.time_limit && end.last_step == loop.start().step)
    std::printf(
        "upipe train: %s had passed before the first step (the launch and loading took it); no "
        "step ran and no checkpoint was written\n",
        render_setting_refs(
            setting_value("train.time_limit", duration_text(cfg.train.time_limit_s)))
            .c_str());
  else if (end.stopped)
    std::printf(
        "upipe train: stopped by %s after step %lld%s; %s\n",
        end.time_limit ? render_setting_refs(setting_value("train.time_limit",
                                                           duration_text(cfg.train.time_limit_s)))
                             .c_str()
        : end.stop_signal > 0 ? fmt::format("signal {}", end.stop_signal).c_str()
                              : "a stop request",
        (long long)end.last_step,
        end.time_limit ? " (another step, with its validation and checkpoint, would end past it)"
                       : "",
        cfg.checkpoint.dir.empty() ? "no checkpoint.dir was set, so nothing was saved"
                                   : "checkpoint written; continue with --resume");
  else
    std::printf("upipe train: done, %lld steps%s\n", (long long)end.last_step,
                saves_nothing(cfg) ? "; no checkpoint.dir was set, so nothing was saved" : "");
  if (!loop.copy_task()) return;
  const double log_v = std::log(double(m.vocab_size));
  std::printf(
      "copy task: the loss of the copied half went from %.4f (step %lld) to %.4f (step %lld); "
      "guessing gives log V = %.4f, so %s\n",
      end.first_group_loss, (long long)loop.start().step + 1, end.last_group_loss,
      (long long)end.last_step, log_v,
      end.last_group_loss < 0.5 * log_v
          ? (loop.trainer().cp_size() > 1 ? "attention learned to copy across the ranks' boundaries"
                                          : "attention learned to copy (on one rank per sequence: "
                                            "no boundary between ranks to cross)")
          : "it has not learned to copy yet (more steps, or a higher train.lr)");
}

// `upipe demo`: the copy task on the tiny model with upipe, tuned so that the copied half's loss
// falls from log V to near 0 within the run (in about 400 steps) on 2 ranks. Command-line
// overrides apply after these.
const std::vector<std::string> kDemoSettings = {
    "--model=tiny",     "--method=upipe",    "--data-kind=copy", "--seq-len=128",
    "--micro-steps=8",  "--steps=1000",      "--lr=3e-3",        "--warmup-steps=50",
    "--weight-decay=0", "--tile-tokens=128", "--log-interval=50"};

// The run's model. A folder that is not there said as what the user gave (it only said that the
// path was neither a config.json, a directory nor a preset): --init-from's folder, or a resumed
// run's recorded one (moved, another machine) with the checkpoint that recorded it and the way
// on, --model where it is now.
ModelConfig load_run_model(const RunConfig& cfg, const Settings& set, bool resume,
                           const CheckpointInfo& recorded) {
  try {
    return load_model_config(cfg.model.name);
  } catch (const ConfigError& e) {
    if (set.given("model.name") || is_model_preset(cfg.model.name)) throw;
    std::error_code ec;
    if (!resume && cfg.model.name == cfg.model.init_from &&
        !std::filesystem::exists(cfg.model.init_from, ec))
      throw ConfigError(fmt::format(
          "{} is not there: give a Hugging Face model folder (config.json and its *.safetensors)",
          setting_value("model.init_from", cfg.model.init_from)));
    if (!resume || std::filesystem::exists(cfg.model.name, ec)) throw;  // there, but unreadable
    throw ConfigError(fmt::format(
        "{}: the run in {} was recorded with {}; give {} where that model's folder is now (its "
        "config must be the run's)",
        e.what(), recorded.path, setting_value("model.name", cfg.model.name),
        setting_value("model.name", "DIR")));
  }
}

int run(Process& proc, const Options& opt, const SettingArgs& sa, const CLI::App& cmd,
        const std::vector<std::string>& preset) {
  if (opt.resume && opt.overwrite)
    throw ConfigError(
        "--overwrite is for a fresh run; --resume continues the run in checkpoint.dir and its "
        "metrics file");
  // With --resume what was typed completes the checkpoint's run and is validated on top of it
  // (--documents=eos:0 alone is no run: it needs the run's data.kind = "files").
  Settings set = resolve_settings(proc, sa, cmd, opt.run_file, preset, nullptr, !opt.resume);
  if (opt.accept_changes && !opt.resume)
    throw ConfigError(
        "--accept-changes is for --resume (it lets a resumed run change what its remaining steps "
        "compute); a fresh run has nothing recorded to change");
  CheckpointInfo recorded;                 // a resumed run's newest checkpoint
  std::vector<std::string> resume_report;  // what the resume continues and changes
  if (opt.resume)
    set = resumed_settings(proc, opt, sa, cmd, set.config, &recorded, &resume_report);
  // A time limit is a job's, not the run's: a resumed run (a later job, its own allocation) has
  // only the one given to it (a recorded one stopped the next job at the first job's remaining
  // time, or before its first step).
  if (opt.resume && !set.given("train.time_limit"))
    set.config.train.time_limit_s = 0;
  else
    make_paths_absolute(set.config, [](std::string_view) { return true; });
  const RunConfig& cfg = set.config;
  const std::string toml = to_toml(cfg);
  if (opt.print_config) {
    if (proc.root()) std::printf("%s", toml.c_str());
    return 0;
  }
  // A metrics file the run may not replace is refused before anything starts (rank 0 writes it).
  // (Resumed: its lines must be the run's, whose id the newest checkpoint carries.)
  // Every rank raises what rank 0 finds, so the job ends cleanly with one line.
  // Its lock too: a second run writing it (another checkpoint.dir, or none) is refused now, on
  // every rank, not when rank 0 opens the file after the start.
  MetricsLock metrics_lock;
  if (!cfg.metrics.path.empty())
    on_rank0_everywhere(proc.world, [&] {
      check_metrics_file(cfg.metrics.path, opt.resume, opt.overwrite, recorded.run_id);
      metrics_lock = MetricsLock(cfg.metrics.path);
    });
  Watchdog::start(cfg.comm.timeout);
  install_stop_handlers();
  if (!opt.resume) {
    refuse_training_checkpoint(cfg.model.init_from, "--init-from");  // --model too when alone
    refuse_training_checkpoint(cfg.model.name, "--model");
  }
  ModelConfig m = load_run_model(cfg, set, opt.resume, recorded);
  // A preset names no special tokens; the --init-from folder's config.json does: they go into
  // the checkpoints, so an export stops generation where the source model did. A resumed run
  // keeps its checkpoint's (the folder may be gone by then).
  if (m.token_ids.empty() && opt.resume) {
    m.token_ids = parse_model_config(recorded.model_json, recorded.path + "/meta.json (model)")
                      .token_ids;
  } else if (m.token_ids.empty() && !cfg.model.init_from.empty()) {
    try {
      m.token_ids = load_model_config(cfg.model.init_from).token_ids;
    } catch (const ConfigError&) {  // said by the weights' check, naming the folder
    }
  }
  spell_model_fields(set, m);  // the heads are the model's fields, not settings of train
  Device dev(device_options(cfg));
  const std::string plan_cmd = plan_command(cfg, proc.world.size());
  dev.mem().set_advice(fmt::format(
      "a shorter sequence, more ranks, bf16, --offload-stash; `{}` says what fits", plan_cmd));
  DeviceComm comm(dev, proc.world);
  // Planned once the inputs are checked (bad input is said first) and the trainer built (the
  // bytes every step needs at least, checked against the budget and the machine: the planner's
  // host lists grow with S), before any weight loads.
  Plan planned;
  TrainingLoop loop(dev, comm, m, cfg, opt.resume, opt.overwrite, opt.accept_changes, [&] {
    planned = plan_run(cfg, m, proc.world.size(), proc.root(), plan_cmd);
    check_hosts_memory(planned, cfg, proc.world);
  });
  const std::string hosts_note = across_hosts_note(cfg, m, loop, host_names(proc.world));
  std::unique_ptr<Render> render;
  if (proc.root()) {
    for (const std::string& l : resume_report) std::printf("%s\n", l.c_str());
    print_startup(cfg, m, loop, toml, planned);
    if (!hosts_note.empty()) std::printf("warning: %s\n", hosts_note.c_str());
    render = std::make_unique<Render>(cfg, loop.start(), opt.overwrite, std::move(metrics_lock));
  }
  TrainingObserver quiet;
  const LoopEnd end = loop.run(render ? *render : quiet);
  if (render) {
    render->finish();
    print_end(cfg, m, loop, end);
    if (const std::string sum = render->summary(); !sum.empty())
      std::printf("this run: %s\n", sum.c_str());
  }
  return 0;  // the watchdog stays: MPI_Finalize runs under it (a host gone after the work)
}

// The switches of train and demo (a demo run is a training run: stopped, it continues with
// --resume as any run does).
void add_run_switches(CLI::App& cmd, Options& opt) {
  cmd.add_flag("--resume", opt.resume,
               "continue the run the newest complete checkpoint in checkpoint.dir records (its "
               "settings, overridden by what is given here)");
  cmd.add_flag("--accept-changes", opt.accept_changes,
               "with --resume: allow settings that change what the remaining steps compute on "
               "(data, sequence length, batch; another model is refused whatever, a moved model "
               "folder needs nothing)");
  cmd.add_flag("--overwrite,--overwrite-checkpoints", opt.overwrite,
               "a fresh run may replace what another run left: its checkpoints in checkpoint.dir "
               "(deleted after this run's first complete checkpoint) and an existing "
               "metrics.path file (emptied at the start)");
  cmd.add_flag("--print-config", opt.print_config, "print the effective run file and exit");
}

}  // namespace

const std::vector<std::string>& demo_settings() {
  return kDemoSettings;
}

Runner add_demo_train(CLI::App& cmd) {
  auto opt = std::make_shared<Options>();
  add_run_switches(cmd, *opt);
  auto sa = add_settings(cmd, kScopeTrain, 0, kDemoSettings);  // its help shows the demo's values
  CLI::App* c = &cmd;
  return [opt, sa, c](Process& p) { return run(p, *opt, *sa, *c, kDemoSettings); };
}

Runner add_train(CLI::App& cmd) {
  auto opt = std::make_shared<Options>();
  cmd.add_option(
      "run_file", opt->run_file,
      "TOML run file (docs/training.md); every setting has a default, so it is optional");
  add_run_switches(cmd, *opt);
  cmd.footer("e.g. upipe train --model=tiny --steps=50 --method=upipe");
  auto sa = add_settings(cmd, kScopeTrain);
  CLI::App* c = &cmd;
  return [opt, sa, c](Process& p) { return run(p, *opt, *sa, *c, {}); };
}

}  // namespace upipe::app
