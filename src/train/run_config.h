// The run file of `upipe train`: one TOML file of [section] tables, then `--section.key=value`
// overrides from the command line, validated once at the boundary (every error a one-line
// ConfigError naming the file or flag and the key), and printed back in full at start so a log
// records exactly what ran. Every key has a default, so a run needs no file at all.
// docs/training.md ("Run file") lists the keys; run_config_keys() is the same list in code.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace upipe {

struct RunConfig {
  struct Model {
    std::string name = "tiny";  // preset name or Hugging Face directory (config.json)
    std::string init_from;      // Hugging Face directory whose weights start the run; "" = random
    bool operator==(const Model&) const = default;
  } model;
  struct Parallel {
    int cp_size = 0;  // ranks per context-parallel group; 0 = all ranks (DP = 1)
    std::string method = "upipe";
    int head_chunk = 0;      // upipe: query heads per stage U; 0 = C
    int ulysses_degree = 0;  // usp / upipe-ring: ranks per Ulysses group; 0 = default
    int chunks = 0;          // fpdt: sequence chunks N; 0 = default
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
    double grad_clip = 1.0;            // global gradient norm limit; 0 = no clipping
    int64_t seed = 1;                  // weights (random init) and data
    std::string dtype = "fp32";        // compute dtype: fp32 | bf16 (master weights stay fp32)
    int64_t tile_tokens = 1024;        // rows per MLP / LM-head tile T
    bool offload_stash = false;  // layer checkpoints in the host arena
    std::string stash_dtype = "fp32";  // layer checkpoints' storage: fp32 | bf16
    std::string residual_dtype = "fp32";    // residual stream and its gradient: fp32 | bf16
    std::string recompute = "layer";  // checkpoints per layer | block | none
    bool operator==(const Train&) const = default;
  } train;
  struct Data {
    std::string kind = "copy";  // files | random | copy
    std::string path;           // files: a token file, a directory of them, or a glob
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
    bool operator==(const Metrics&) const = default;
  } metrics;
  struct Memory {
    double budget_gib = 1024;  // device arena budget per rank, GiB
    bool operator==(const Memory&) const = default;
  } memory;
  struct Comm {
    double timeout_s = 600;  // a collective or step without progress this long ends the job
    bool operator==(const Comm&) const = default;
  } comm;
  bool operator==(const RunConfig&) const = default;

  int64_t budget_bytes() const;  // memory.budget_gib in bytes
  double min_lr() const { return train.lr * train.min_lr_ratio; }
};

// One key of the run file, for docs, help and tests.
struct RunKeyInfo {
  std::string name;           // "train.lr"
  std::string type;           // "int", "float", "bool" or "string"
  std::string default_value;  // as TOML writes it: 3e-4, "upipe", false
  std::string doc;            // one line
};
const std::vector<RunKeyInfo>& run_config_keys();

// The run file at `path` ("" = all defaults) with `overrides` applied, then validated.
RunConfig load_run_config(const std::string& path, std::span<const std::string> overrides = {});

// TOML text into a config (no validation); `source` names the text in messages. Unknown
// sections or keys and values of the wrong type are ConfigErrors naming source and key.
RunConfig parse_run_toml(std::string_view text, const std::string& source);

// Command-line overrides: "--section.key=value", or "--section.key" followed by the value as
// the next argument. Values are read as their key's type (bool: true/false/1/0); "abc" for an
// int key, or an unknown key (with the closest known key suggested), is a ConfigError.
void apply_overrides(RunConfig& c, std::span<const std::string> args);
void apply_override(RunConfig& c, const std::string& key, const std::string& value);

// Range and consistency checks; the ConfigError names the key and what to change.
void validate(const RunConfig& c);

// The full effective config as a TOML document, every key with a comment, in the order of
// run_config_keys(); parse_run_toml(to_toml(c)) == c.
std::string to_toml(const RunConfig& c);

// The known key nearest to `key` by edit distance (for "did you mean" hints).
std::string closest_run_key(const std::string& key);

}  // namespace upipe
