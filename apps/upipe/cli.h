// Shared command-line pieces of the `upipe` subcommands: the attention shape options, checked
// numeric options, byte-size parsing, and the process context (MPI world, this rank's device).
#pragma once

#include <CLI/CLI.hpp>
#include <cstdint>
#include <optional>
#include <string>

#include "attention/config.h"
#include "comm/communicator.h"

namespace upipe::app {

// Bounds of the flags that are not part of the attention shape (AttentionConfig has those).
inline constexpr int kMaxMetaRanks = 65536;              // --meta-ranks
inline constexpr int kMaxIters = 1000000;                // --iters
inline constexpr int64_t kMaxBudget = int64_t(1) << 60;  // --memory-budget: 1 EiB
inline constexpr const char* kMaxBudgetText = "1048576T";

struct ShapeOptions {
  int64_t seq_len = 4096;
  int heads = 8, kv_heads = 2, head_dim = 64;
  std::string dtype = "fp32";
  double rope_theta = 10000.0;
  std::string rope_scaling;            // "llama3:FACTOR:LOW:HIGH:ORIG" or empty
  std::optional<int64_t> hidden_size;  // unset: H*d
  bool qk_norm = false;
  std::string residual_dtype;  // y, dy, dx: "fp32", or empty/the dtype
  int head_chunk = 0, ulysses_degree = 0, chunks = 0;
  AttentionConfig config() const;  // validates the shape (ConfigError)
};

// --seq-len --heads --kv-heads --head-dim --dtype --rope-theta; with_strategy (the commands that
// run the whole block) adds --hidden-size --residual-dtype --qk-norm --rope-scaling and the
// strategy knobs --head-chunk --ulysses-degree --chunks. Every numeric flag is range-checked at
// parse time.
void add_shape_options(CLI::App& cmd, ShapeOptions& o, bool with_strategy);

// "llama3:8:1:4:8192" -> the llama3 rule with factor 8, low/high frequency factors 1 and 4 and
// an original context of 8192; "" or "none" -> no scaling. Throws ConfigError.
RopeScaling parse_rope_scaling(const std::string& s);

// A validator accepting only a whole integer (no sign for unsigned T) in [lo, hi]; its message
// names the range. Empty strings, fractions, "nan" and overflowing values are refused.
template <class T>
CLI::Validator integer_in(T lo, T hi);
// A validator accepting only a finite decimal number in [lo, hi].
CLI::Validator number_in(double lo, double hi);

// "80G", "512MiB", "1.5g", "4096" -> bytes in [1, kMaxBudget]; throws ConfigError naming `flag`.
int64_t parse_bytes(const std::string& s, const char* flag = "--memory-budget");

// --timeout S on a command that communicates: the watchdog's timeout in seconds (0 = none;
// default kDefaultWatchdogTimeoutS, core/watchdog.h). main() starts the watchdog with it.
void add_timeout_option(CLI::App& cmd, double& timeout_s);

// Per-process state every command gets.
struct Process {
  Communicator& world;
  int rank() const { return world.rank(); }
  bool root() const { return world.rank() == 0; }
};

}  // namespace upipe::app
