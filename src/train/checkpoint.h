// Training checkpoints: every rank's ZeRO-3 shards (fp32 master weights and AdamW moments) plus
// the step, written atomically so that a crash at any moment leaves the newest complete
// checkpoint loadable.
//
// Layout (docs/training.md): DIR/step_00000100/
//   rank_00000.safetensors ...  one per rank: tensors "unit<u>.master", "unit<u>.exp_avg",
//                               "unit<u>.exp_avg_sq" (F32, 1-D, the rank's s_u elements)
//   meta.json                   format, step, world size, cp size, per-unit element counts, the
//                               model's config.json and the run file the run was started with
//   DONE                        written last: a directory without it is incomplete and ignored
// Writing goes to step_XXXXXXXX.tmp, every file is fsynced, rank 0 renames the directory and
// writes DONE, then deletes all but the newest `keep` complete checkpoints.
//
// Everything the run's future depends on is in it: data and randomness are pure functions of
// (seed, step, micro-step, DP rank), and the learning-rate schedule of the step, so a resumed
// run continues with bitwise the same weights as an uninterrupted one on the same ranks. On a
// different number of ranks the shards are re-cut on load (resharding); the run continues
// exactly in value, with reductions in another order.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <utility>

#include "train/zero.h"

namespace upipe {

struct CheckpointInfo {
  std::string path;  // the step directory
  int64_t step = 0;  // steps completed when it was written
  int world = 0, cp_size = 0;
  std::string model_json;  // the model's config.json text
  std::string run_toml;    // the run file's effective text
};

// Collective over z.world(): writes the checkpoint of `step` under dir (created if needed) and
// prunes to the newest `keep` (keep <= 0 keeps all). Returns its path.
std::string save_checkpoint(const std::string& dir, int64_t step, Zero3& z, int cp_size,
                            const std::string& run_toml, int keep);

// The newest complete checkpoint under dir (the largest step with DONE), if any.
std::optional<std::string> latest_checkpoint(const std::string& dir);

// Reads meta.json of a checkpoint directory; ConfigError naming the file when it is missing,
// incomplete (no DONE) or malformed.
CheckpointInfo read_checkpoint_info(const std::string& path);

// Collective: fills z's master shards and moments from the checkpoint at `path` (any world size)
// and returns its info. ConfigError when it was written for another model (a unit's element count
// differs) or a file is missing, truncated or corrupt, naming the file.
CheckpointInfo load_checkpoint(const std::string& path, Zero3& z);

// Reads tensor `name` of the whole model (fp32) from a checkpoint into dst (numel elements),
// consolidating the ranks' shards: `upipe export`. Single process.
class CheckpointReader {
 public:
  explicit CheckpointReader(const std::string& path);
  ~CheckpointReader();
  const CheckpointInfo& info() const { return info_; }
  const ModelConfig& model() const { return m_; }
  void read(int tensor_index, float* dst) const;  // the index'th of hf_tensors(model())
  // Its elements [first, first + count) (row-major).
  void read_range(int tensor_index, int64_t first, int64_t count, float* dst) const;

 private:
  std::pair<size_t, size_t> locate(int tensor_index) const;  // (unit, tensor in the unit)
  struct Impl;
  CheckpointInfo info_;
  ModelConfig m_;
  std::unique_ptr<Impl> impl_;
};

}  // namespace upipe
