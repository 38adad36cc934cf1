// The settings of a run, declared once: every setting has one key (`[section] name` in a TOML run
// file), one flag, a type, a default, a one-line doc and the commands that take it. The run file,
// every command's flags, `--print-config`, the help texts, docs/training.md's table and the error
// messages all come from this one table (settings()).
//
// Spelling: a flag is `--` and the key's name with `_` written `-` (train.seq_len -> --seq-len);
// where the name alone does not say what it is, the section leads (checkpoint.dir ->
// --checkpoint-dir, data.kind -> --data-kind, metrics.path -> --metrics-path), and model.name is
// --model. Older spellings (e.g. --head-chunk, --memory-budget, --train.seq_len=...,
// [train] checkpoint_dtype) still work as aliases and print a one-line note naming the new one.
//
// Values are read at the boundary: defaults, then the run file, then the command line (the last
// wins), then validate() once. Every refusal is a one-line ConfigError that names the setting as
// the user wrote it (core/setting_ref.h; setting_speller below).
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <set>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "attention/config.h"
#include "core/setting_ref.h"
#include "model/memory_policy.h"

namespace upipe {

// The commands that take a setting (a bit set).
enum SettingScope : uint32_t {
  kScopeTrain = 1,    // upipe train, upipe demo
  kScopeModel = 2,    // upipe eval, upipe bench model: a model on one sequence
  kScopePlan = 4,     // upipe plan
  kScopeBlock = 8,    // upipe check, upipe bench attention: one attention block
  kScopeKernel = 16,  // upipe bench kernel: the kernels on one shape
  kScopeComm = 32,    // upipe bench comm
  kScopeDemo = 64,    // upipe demo attention
};

// The commands of a scope set, as `upipe settings` lists them: "train, demo, plan".
std::string commands_of(uint32_t scopes);

inline constexpr int64_t kMaxSeqLen = int64_t(1) << 40;
inline constexpr int64_t kMaxMemoryBytes = int64_t(1) << 60;  // 1 EiB
inline constexpr double kMinTimeoutS = 0.1;  // comm.timeout: 0 (off) or at least this

struct RunConfig {
  struct Model {
    std::string name = "tiny";    // preset name or Hugging Face directory (config.json)
    std::string init_from;        // Hugging Face directory whose weights start the run; "" = random
    bool random_weights = false;  // eval / bench: a directory's config with random weights
    bool operator==(const Model&) const = default;
  } model;
  struct Parallel {
    int cp_size = 0;    // ranks per context-parallel group; 0 = all ranks (DP = 1)
    MethodKnobs knobs;  // method and its knobs (attention/methods.h)
    bool operator==(const Parallel&) const = default;
  } parallel;
  struct Train {
    int64_t steps = 100;
    int64_t seq_len = 1024;     // tokens per sequence S (split over the CP group)
    int micro_steps = 1;        // gradient accumulation: sequences per DP rank per step
    double lr = 3e-4;           // peak learning rate, reached after warmup
    double min_lr_ratio = 0.1;  // end of the cosine decay, as a fraction of lr
    int64_t warmup_steps = 10;  // linear warmup from 0
    double weight_decay = 0.1;  // AdamW decoupled weight decay
    double beta1 = 0.9, beta2 = 0.95, eps = 1e-8;
    double grad_clip = 1.0;  // global gradient norm limit; 0 = no clipping
    int64_t seed = 1;        // weights (random init) and data
    // The job's wall-clock limit in seconds, from the process's start: the run stops cleanly
    // before a step and its checkpoint would end past it; 0 = none.
    int64_t time_limit_s = 0;
    bool operator==(const Train&) const = default;
  } train;
  struct Memory {
    MemoryPolicy policy;                      // dtypes, recompute, stash, tiles
    int64_t device_bytes = int64_t(1) << 40;  // device arena budget per rank
    int64_t host_bytes = int64_t(256) << 30;  // host arena budget per rank
    bool operator==(const Memory&) const = default;
  } memory;
  struct Data {
    std::string kind = "copy";       // files | random | copy
    std::string path;                // files: a token file, a directory of them, or a glob
    std::string val_path;            // held-out token files for the validation loss ("" = none)
    std::string documents = "none";  // none | eos:ID | index (train/data.h)
    bool operator==(const Data&) const = default;
  } data;
  struct Checkpoint {
    std::string dir;       // "" = no checkpoints
    int64_t interval = 0;  // steps between checkpoints; 0 = only at the end
    int keep = 3;          // complete checkpoints kept (older ones deleted)
    bool operator==(const Checkpoint&) const = default;
  } checkpoint;
  struct Metrics {
    std::string path;               // JSONL file, one object per step; "" = none
    int64_t log_interval = 1;       // steps between log lines
    std::string progress = "auto";  // auto (bar on a terminal) | bar | lines
    int64_t val_interval = 0;       // steps between validation losses; 0 = none
    int64_t val_sequences = 8;      // held-out sequences of S tokens per validation
    double peak_flops = 0;          // MFU's denominator per rank; 0 = the GEMM rate measured
    bool operator==(const Metrics&) const = default;
  } metrics;
  struct DeviceSection {
    std::string backend = "cpu";  // cpu or cuda: what every rank computes on
    bool operator==(const DeviceSection&) const = default;
  } device;
  struct Comm {
    double timeout = 600;  // seconds a collective or step may make no progress; 0 = never
    bool operator==(const Comm&) const = default;
  } comm;
  bool operator==(const RunConfig&) const = default;

  double min_lr() const { return train.lr * train.min_lr_ratio; }
};

// What a setting that differs from the recorded run means when a run resumes (train/resume.h).
enum class ResumeRule {
  kBreaks,      // what the remaining steps compute on: the model, the data, the sequence, the batch
  kSchedule,    // the learning-rate schedule and the optimizer, from the next step on
  kArithmetic,  // the same computation in other arithmetic (method, dtypes, tiles): not bitwise
  kFree,        // how the run goes about it, not what it computes (memory, logging, checkpoints)
  kData,        // where the data lies: free when the data read there is the checkpoint's (its
                // fingerprint, checked as the run reads it); refused like kBreaks otherwise
  kModel,       // where the model lies: free when the model there is the checkpoint's (its
                // config, checked as the run loads it); another model is refused whatever
};

// One setting of the table.
struct SettingInfo {
  std::string key;            // "train.seq_len"
  std::string flag;           // "--seq-len"
  std::string short_flag;     // "-S", or ""
  std::string type;           // int, float, bool, string, dtype, recompute, bytes, knob
  std::string default_value;  // as the run file writes it: 3e-4, "upipe", false, "1T"
  std::string doc;            // one line
  uint32_t scopes = 0;        // SettingScope bits
  ResumeRule resume = ResumeRule::kFree;
  std::vector<std::string> aliases;  // older keys and flags, e.g. "train.dtype", "--head-chunk"
};
const std::vector<SettingInfo>& settings();
// The setting a key, flag or alias names; nullptr if none.
const SettingInfo* find_setting(std::string_view name);

// How each setting that was given was written, for messages (setting_speller) and for notes on
// older spellings.
struct SettingSources {
  std::map<std::string, std::string> spelled;  // key -> "--head-chunk" or "seq_len in run.toml"
  std::vector<std::string> notes;              // "--head-chunk is now --stage-heads", once each
  // The command's scopes (0: unknown): a setting it does not take is named with the commands
  // that do ("--cp-size (of upipe train, demo, plan)"), so no message offers a flag it refuses.
  uint32_t scopes = 0;
  std::set<std::string> own_flags;  // the command's own options ("--documents" of eval): its own
};

// TOML text into a config (no validation); `source` names the text in messages. Unknown
// sections or keys and values of the wrong type are ConfigErrors naming source and key.
RunConfig parse_run_toml(std::string_view text, const std::string& source,
                         SettingSources* sources = nullptr);

// The run file at `path`, parsed (no validation); ConfigError when it cannot be read.
RunConfig read_run_file(const std::string& path, SettingSources* sources = nullptr);

// Command-line settings: "--flag=value", "--flag value", "-S value", and every alias (the dotted
// run-file form "--section.key=value" too). A bool flag alone means true; it takes the next
// argument only when that is true, false, 1 or 0. Values are read as the setting's type; an
// unknown flag (with the closest setting, or of `own_flags`, the command's other flags,
// suggested) or one outside `scopes` is a ConfigError.
void apply_overrides(RunConfig& c, std::span<const std::string> args, uint32_t scopes = kScopeTrain,
                     SettingSources* sources = nullptr,
                     std::span<const std::string> own_flags = {});
// Sets one setting by key, flag or alias from its text.
void apply_override(RunConfig& c, const std::string& name, const std::string& value);

// The settings naming files or directories (model.name when it names one that exists,
// model.init_from, data.path, data.val_path, checkpoint.dir, metrics.path) for which `which(key)`
// holds, made absolute against the working directory: a run records them so, and its checkpoint
// resumes and exports from any directory.
void make_paths_absolute(RunConfig& c, const std::function<bool(std::string_view key)>& which);

// Range and consistency checks for the commands of `scopes`; the ConfigError names the setting
// and what to change. kScopePlan admits what only the planner takes (the knob value auto, the
// method "all"); the training data's rules (the copy task's even S) bind only with kScopeTrain
// (which upipe plan validates with too).
void validate(const RunConfig& c, uint32_t scopes = kScopeTrain);

// The run file at `path` ("" = all defaults) with `overrides` applied, then validated.
RunConfig load_run_config(const std::string& path, std::span<const std::string> overrides = {},
                          uint32_t scopes = kScopeTrain, SettingSources* sources = nullptr);

// The full effective config as a TOML document, every setting with a comment, in the order of
// settings(); parse_run_toml(to_toml(c)) == c.
std::string to_toml(const RunConfig& c);
// The settings of `scopes` that differ from `base` (the defaults, or a run file's settings), as
// flags ("--seq-len=4096 ...").
std::string to_flags(const RunConfig& c, uint32_t scopes, const RunConfig& base = RunConfig{});

// Every setting's value in c, as its flag takes it ("fp32", "80G", "auto"), in the table's order.
std::vector<std::pair<std::string, std::string>> setting_values(const RunConfig& c);

// The known key nearest to `name` (for "did you mean" hints): a synonym's, a key of another
// table by its name, else the nearest by edit distance; "" where none is near (core/spelling.h).
std::string closest_run_key(const std::string& name);

// A speller (core/setting_ref.h) that names each setting the way `sources` says it was given,
// and the others by their flag.
SettingSpeller setting_speller(const SettingSources& sources);

// "80G", "512MiB", "1.5g", "4096" -> bytes in [1, kMaxMemoryBytes] (or 0, "0G", with allow_zero);
// ConfigError naming `key`.
int64_t parse_bytes(const std::string& s, std::string_view key, bool allow_zero = false);
// A memory budget (memory.device_memory, memory.host_memory) written as a number alone is
// refused below this, "did you mean 80G?": "--device-memory 80" is a unit left out, not 80 B.
// "80B" says bytes.
inline constexpr int64_t kMinUnitlessBudget = int64_t(1) << 20;
// The shortest exact text parse_bytes reads back, and a memory budget too: "80G", "1536M",
// "1048577", "4097B" (a unit below kMinUnitlessBudget).
std::string bytes_text(int64_t bytes);
// A duration in whole seconds: "0" (none), units ("3h50m", "90m", "45s", "1d12h") or SLURM's
// --time / squeue %L forms ("MM:SS", "H:MM:SS", "D-H", "D-H:MM", "D-H:MM:SS"). A bare number
// other than 0 is refused (SLURM reads it as minutes, a timeout as seconds). ConfigError naming
// `key`.
int64_t parse_duration(const std::string& s, std::string_view key);
// The text parse_duration reads back: "0", "3h50m", "1d2h3m4s".
std::string duration_text(int64_t seconds);

}  // namespace upipe
