// JSON pieces every `upipe` command reports the same way: the block configuration, per-tag bytes
// and communication counters, and the printing of a command's JSON object.
#pragma once

#include <nlohmann/json.hpp>

#include "attention/config.h"
#include "comm/communicator.h"
#include "core/arena.h"

namespace upipe::app {

// The knobs cfg runs with on `ranks` ranks, defaults resolved (resolved_knobs): {"stage_heads",
// "ulysses_degree", "chunks", "overlap"}, 0 for a knob the method does not take.
nlohmann::json resolved_knobs_json(const AttentionConfig& cfg, int ranks);
// method, seq_len, heads, kv_heads, head_dim, dtype and the method's knobs.
// The block's shape and knobs as given, "resolved_knobs" and "knobs_text" as it runs on `ranks`
// ranks (defaults resolved: "U=4 N=2").
nlohmann::json config_json(const AttentionConfig& cfg, int ranks);
// {tag: bytes} of the non-zero tags.
nlohmann::json tags_json(const TagBytes& b);
// {op: {calls, bytes}} of the ops that were called.
nlohmann::json comm_json(const CommStats& s);
// Prints a command's JSON object on one line, with "isa": the CPU kernels' path (cpu_isa.h), and
// "env": the UPIPE_* environment variables that are set (they switch kernels and copy modes:
// UPIPE_CUDNN_SDPA, UPIPE_CUDA_COPIES, UPIPE_CPU_ISA, ...), when any is.
void print_json(nlohmann::json j);

}  // namespace upipe::app
