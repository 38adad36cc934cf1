// Shared command-line pieces of the `upipe` subcommands: the attention shape options, byte-size
// parsing, and the process context (MPI world, this rank's device).
#pragma once

#include <CLI/CLI.hpp>
#include <cstdint>
#include <string>

#include "attention/config.h"
#include "comm/communicator.h"

namespace upipe::app {

struct ShapeOptions {
  int64_t seq_len = 4096;
  int heads = 8, kv_heads = 2, head_dim = 64;
  std::string dtype = "fp32";
  double rope_theta = 10000.0;
  int head_chunk = 0, ulysses_degree = 0, chunks = 0;
  AttentionConfig config() const;  // validates the shape (ConfigError)
};

// --seq-len --heads --kv-heads --head-dim --dtype --rope-theta; with_strategy adds
// --head-chunk --ulysses-degree --chunks.
void add_shape_options(CLI::App& cmd, ShapeOptions& o, bool with_strategy);

// "80G", "512MiB", "1.5g", "4096" -> bytes; throws ConfigError.
int64_t parse_bytes(const std::string& s);

// Per-process state every command gets.
struct Process {
  Communicator& world;
  int rank() const { return world.rank(); }
  bool root() const { return world.rank() == 0; }
};

}  // namespace upipe::app
