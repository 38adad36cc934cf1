// Training checkpoints: every rank's ZeRO-3 shards (fp32 master weights and AdamW moments) plus
// the step, written atomically with checksums and the run's identity, so that a crash at any
// moment leaves the newest complete checkpoint loadable, corrupt bytes are never loaded, and two
// runs never mix in one directory.
//
// Layout (docs/training.md): DIR/step_00000100/ (8 digits or more: step_123456789 after 10^8)
//   rank_00000.safetensors ...  one per rank: tensors "unit<u>.master", "unit<u>.exp_avg",
//                               "unit<u>.exp_avg_sq" (F32, 1-D, the rank's s_u elements); its
//                               __metadata__ names rank, world, step and run id
//   meta.json                   format, run id, step, world, cp size, per-unit element counts,
//                               the model's config.json, the run file, and per rank file its
//                               size, the XXH3-64 of its header and of every piece of
//                               kCheckpointPiece elements of every tensor
//   run_id                      the run's identity, written first (also marks the temporary)
//   DONE                        written last, holds the step and the XXH3-64 of meta.json: a
//                               directory without it is incomplete and ignored
// Writing goes to step_XXXXXXXX.tmp (marked with the run id first), every file is fsynced,
// rank 0 renames the directory and writes DONE, then deletes this run's checkpoints beyond the
// newest `keep`, this run's stale temporaries and, when the run was allowed to overwrite another
// run's, that run's. Reading verifies the chain: DONE -> meta.json -> each rank file's size and
// header -> each piece as it is read, and every value read one a run continues from (finite; a
// second moment not negative); any mismatch is a ConfigError naming the file.
//
// Everything the run's future depends on is in it: data and randomness are pure functions of
// (seed, step, micro-step, DP rank), and the learning-rate schedule of the step, so a resumed
// run continues with bitwise the same weights as an uninterrupted one on the same ranks. On a
// different number of ranks the shards are re-cut on load (resharding); the run continues
// exactly in value, with reductions in another order.
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>

#include "comm/communicator.h"
#include "train/zero.h"

namespace upipe {

// Elements of fp32 per checksum piece (4 MiB); a reader verifies every piece it touches.
inline constexpr int64_t kCheckpointPiece = int64_t(1) << 20;

struct CheckpointInfo {
  std::string path;    // the step directory
  std::string run_id;  // the run that wrote it
  int64_t step = 0;    // steps completed when it was written
  int world = 0, cp_size = 0;
  std::string model_json;  // the model's config.json text
  std::string run_toml;    // the run file's effective text
  std::string written_by;  // build_id() of the upipe that wrote it; "" if it does not say
  std::string data;        // the training data's fingerprint (DataSource); "" if it does not say
};

// The checkpoints one run writes: where, its identity, how many it keeps, and whether it may
// replace checkpoints of another run there (and deletes them after its first complete one).
struct CheckpointRun {
  std::string dir;     // "" = no checkpoints
  std::string run_id;  // written into every checkpoint; a resumed run keeps its checkpoint's
  int keep = 0;        // complete checkpoints kept, newest first; <= 0 keeps all
  bool overwrite_others = false;
  std::string data{};  // the training data's fingerprint, recorded in every checkpoint ("": none)
};

// Where a run starts, decided on every rank alike.
struct CheckpointStart {
  CheckpointRun run;
  std::optional<std::string> resume_from;  // the checkpoint to load; none for a fresh run
};

// Collective over `world`. resume: the newest complete checkpoint in dir and its run's identity
// (ConfigError without dir or checkpoint, or when dir holds checkpoints of several runs). Fresh:
// a new run identity from rank 0; ConfigError when dir holds any checkpoint (complete or not) of
// another run, unless overwrite.
// writes_step (resume): whether the resumed run will write a checkpoint at that step (a newer
// step directory it cannot read is refused at the start only then); null: every step.
CheckpointStart open_checkpoint_run(Communicator& world, const std::string& dir, bool resume,
                                    bool overwrite, int keep,
                                    const std::function<bool(int64_t)>& writes_step = nullptr);

// Collective: every rank sees the checkpoint directory `dir` (existing) as rank 0 does, one
// directory on a file system every host mounts (each rank writes its own file of each checkpoint
// there): rank 0 writes a probe file, every rank reads it. ConfigError on every rank naming the
// first rank that does not, and its host; nothing to check on one rank.
void check_one_checkpoint_dir(Communicator& world, const std::string& dir);

// Collective, for --resume: the newest complete checkpoint under `dir`, the same on every rank
// (check_one_checkpoint_dir, then every rank's own listing against rank 0's). ConfigError on every
// rank when there is none, a step_N entry is odd (refuse_odd_step_entries), or a rank finds
// another newest step than rank 0 (naming both and their hosts).
std::string newest_checkpoint_everywhere(Communicator& world, const std::string& dir);

// Whether `name` is a checkpoint's directory name in checkpoint.dir: step_<1 to 18 digits>, or
// the same with .tmp (being written); a run prunes and replaces such directories.
bool is_step_dir_name(const std::string& name);
// Whether `dir` is such a directory that some run wrote (it holds a run id or a meta.json).
bool is_checkpoint_step_dir(const std::filesystem::path& dir);

// ConfigError when an entry of the checkpoint directory `dir` named step_N is a symbolic link or
// no directory (resume and export would otherwise skip it for an older checkpoint).
void refuse_odd_step_entries(const std::string& dir);

// Collective: ConfigError on every rank when the checkpoint directory `dir` (existing) is on a
// read-only file system or has less room than `bytes`, one checkpoint's size: a run that could
// never checkpoint is refused at start, not after its steps (a full disk trained 120 steps and
// lost them all).
void check_checkpoint_room(Communicator& world, const std::string& dir, int64_t bytes);

// Collective over z.world(): writes the checkpoint of `step` under run.dir (created if needed)
// and prunes (see above). Returns its path. ConfigError when a directory of that step exists and
// belongs to another run that run.overwrite_others does not allow to replace.
std::string save_checkpoint(const CheckpointRun& run, int64_t step, Zero3& z, int cp_size,
                            const std::string& run_toml);

// The newest complete checkpoint under dir (the largest step with DONE), if any.
std::optional<std::string> latest_checkpoint(const std::string& dir);

// Reads meta.json of a checkpoint directory, verified against DONE; ConfigError naming the file
// when it is missing, incomplete (no DONE), corrupt or malformed.
CheckpointInfo read_checkpoint_info(const std::string& path);

// Collective: fills z's master shards and moments from the checkpoint at `path` (any world size)
// and returns its info. ConfigError when it was written for another model (naming the first
// field of config.json that differs), a file is missing, truncated or corrupt, or a value read is
// not finite or a negative second moment, naming the file.
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
  struct Impl;  // the verified rank files, with the last piece read
  CheckpointInfo info_;
  ModelConfig m_;
  std::unique_ptr<Impl> impl_;
};

}  // namespace upipe
