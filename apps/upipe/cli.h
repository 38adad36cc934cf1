// Shared command-line pieces of the `upipe` subcommands: the attention shape options, checked
// numeric options, and the process context (the MPI world).
#pragma once

#include <CLI/CLI.hpp>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "attention/config.h"
#include "comm/communicator.h"
#include "train/run_config.h"

namespace upipe::app {

// Bounds of the commands' own flags.
inline constexpr int kMaxIters = 1000000;  // --iters

// The attention block's shape, for the commands that run one block without a model (check,
// bench attention, bench kernel, demo attention). S, dtype, method and knobs are settings.
struct ShapeOptions {
  int heads = 8, kv_heads = 2, head_dim = 64;
  double rope_theta = 10000.0;
  std::string rope_scaling;            // "llama3:FACTOR:LOW:HIGH:ORIG" or empty
  std::optional<int64_t> hidden_size;  // unset: H*d
  bool qk_norm = false;
  // --model (full commands): the block of a preset or Hugging Face config, in place of the shape
  // flags (refused beside it; `shape_flags` are theirs, to tell).
  std::string model;
  std::vector<const CLI::Option*> shape_flags;
  // The block's configuration: this shape with the settings' S, dtype, residual dtype and
  // method; validates the shape (ConfigError).
  AttentionConfig config(const RunConfig& c) const;
};

// --heads --kv-heads --head-dim --rope-theta; full (the commands that run the whole block) adds
// --hidden-size --qk-norm --rope-scaling, and --model for a model's block. Every numeric flag is
// range-checked at parse time.
void add_shape_options(CLI::App& cmd, ShapeOptions& o, bool full);

// "llama3:8:1:4:8192" -> the llama3 rule with factor 8, low/high frequency factors 1 and 4 and
// an original context of 8192; "" or "none" -> no scaling. Throws ConfigError.
RopeScaling parse_rope_scaling(const std::string& s);

// A validator accepting only a whole integer (no sign for unsigned T) in [lo, hi]; its message
// names the range. Empty strings, fractions, "nan" and overflowing values are refused.
template <class T>
CLI::Validator integer_in(T lo, T hi);
// A validator accepting only a finite decimal number in [lo, hi].
CLI::Validator number_in(double lo, double hi);
// The truth values a switch takes in --switch=value or --switch value, in any case: true, false,
// 1, 0, yes, no, on, off (as CLI11 converts them).
bool is_truth_value(std::string_view word);
// Every switch (an option that takes no value: a bool setting, --json, --resume) of `app` and its
// commands refuses any other value at parse, naming the switch (CLI11 read "2" as true, "-1" as
// false and threw std::stoll's error, exit 1, at "maybe").
void check_switch_values(CLI::App& app);
// v with its messages naming `name`: for a hidden option (an older spelling), whose errors CLI11
// names "" (": '-1' is not ...").
CLI::Validator named(CLI::Validator v, const std::string& name);

// --doc-lens (packed documents: lengths a,b,c or a .npy/.bin file of them) with the command's
// own help; an empty value is refused at parse time (it would read as no documents).
CLI::Option* add_doc_lens_option(CLI::App& cmd, std::string& spec, const std::string& help);

// Per-process state every command gets.
struct Process {
  Communicator& world;
  int rank() const { return world.rank(); }
  bool root() const { return world.rank() == 0; }
};

}  // namespace upipe::app
