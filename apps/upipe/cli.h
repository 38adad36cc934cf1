// Shared command-line pieces of the `upipe` subcommands: the attention shape options, byte-size
// parsing, and the process context (MPI world, this rank's device).
#pragma once

#include <CLI/CLI.hpp>
#include <cstdint>
#include <optional>
#include <string>

#include "attention/config.h"
#include "comm/communicator.h"

namespace upipe::app {

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
// strategy knobs --head-chunk --ulysses-degree --chunks.
void add_shape_options(CLI::App& cmd, ShapeOptions& o, bool with_strategy);

// "llama3:8:1:4:8192" -> the llama3 rule with factor 8, low/high frequency factors 1 and 4 and
// an original context of 8192; "" or "none" -> no scaling. Throws ConfigError.
RopeScaling parse_rope_scaling(const std::string& s);

// "80G", "512MiB", "1.5g", "4096" -> bytes; throws ConfigError.
int64_t parse_bytes(const std::string& s);

// Per-process state every command gets.
struct Process {
  Communicator& world;
  int rank() const { return world.rank(); }
  bool root() const { return world.rank() == 0; }
};

}  // namespace upipe::app
