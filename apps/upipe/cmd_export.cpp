// `upipe export CKPT OUTDIR [--dtype bf16|fp32] [--tokenizer auto|none|bytes|DIR] [--force]`: a
// training checkpoint (a step directory, or a checkpoint.dir whose newest complete checkpoint is
// taken) as a consolidated Hugging Face folder, with its tokenizer, that transformers loads
// (train/export.h). Runs on one process; under mpirun rank 0 does the
// work. A non-empty OUTDIR is refused unless --force.
#include <chrono>
#include <filesystem>
#include <thread>

#include "apps/upipe/commands.h"
#include "core/arena.h"
#include "core/errors.h"
#include "model/hf_names.h"
#include "train/checkpoint.h"
#include "train/export.h"
#include "train/run_config.h"

namespace upipe::app {
namespace {

struct Options {
  std::string checkpoint, out;
  std::string dtype = "bf16";
  std::string tokenizer = "auto";
  std::string max_shard_size = "5G";
  bool force = false;
};

int export_one(Process& proc, const Options& opt, const std::string& path, DType dt,
               const TokenizerChoice& tc, int64_t max_shard);

// Whether the directory `path` is gone, or goes within a second.
bool gone_soon(const std::string& path) {
  for (int i = 0; i < 20; ++i) {
    std::error_code ec;
    if (!std::filesystem::exists(path, ec)) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  return false;
}

int run(Process& proc, const Options& opt) {
  namespace fs = std::filesystem;
  const DType dt = parse_dtype(opt.dtype);
  const int64_t max_shard = parse_bytes(opt.max_shard_size, "--max-shard-size", true);
  const TokenizerChoice tc = parse_tokenizer_choice(opt.tokenizer);
  std::error_code ec;  // a meta.json that is there in any form (a link loop): a checkpoint
  const bool newest = !fs::exists(fs::symlink_status(fs::path(opt.checkpoint) / "meta.json", ec));
  // The newest checkpoint of a directory a training run still writes may be pruned as it is read
  // (--checkpoint-keep): then the newest is taken again (the output is staged, so a failed try
  // leaves it as it was).
  for (int attempt = 1;; ++attempt) {
    std::string path = opt.checkpoint;
    if (newest) {
      refuse_odd_step_entries(path);
      const auto latest = latest_checkpoint(path);
      if (!latest)
        throw ConfigError(
            fmt::format("{} is neither a checkpoint (step_*/ with meta.json and DONE) "
                        "nor a directory holding a complete one",
                        path));
      path = *latest;
    }
    try {
      return export_one(proc, opt, path, dt, tc, max_shard);
    } catch (const Error& e) {
      // Pruned while read: a newer checkpoint is complete and this one is removed whole within
      // moments (the training removes it after its newer one). Any other error is the error.
      if (!newest || !gone_soon(path)) throw;
      if (attempt == 3)
        throw ConfigError(fmt::format(
            "the newest checkpoint of {} was removed while it was read, {} times (the last: {}): "
            "a training run writing it prunes its checkpoints (--checkpoint-keep); export a "
            "checkpoint it keeps by its path, or export after the run ends",
            opt.checkpoint, attempt, e.what()));
    }
  }
}

int export_one(Process& proc, const Options& opt, const std::string& path, DType dt,
               const TokenizerChoice& tc, int64_t max_shard) {
  const CheckpointReader reader(path);  // every rank validates: errors are the same everywhere
  const TokenizerPlan tok = plan_tokenizer(reader, tc);
  if (!proc.root()) return 0;
  const int shards = export_hf(reader, opt.out, dt, opt.force, tok, max_shard);
  std::printf("exported %s (step %lld, %zu tensors, %s%s) to %s\n", path.c_str(),
              (long long)reader.info().step, hf_tensors(reader.model()).size(), opt.dtype.c_str(),
              shards > 1
                  ? fmt::format(", {} shards, bound {}", shards, format_bytes(max_shard)).c_str()
                  : "",
              opt.out.c_str());
  std::printf("%s\n", tok.note.c_str());
  return 0;
}

}  // namespace

Runner add_export(CLI::App& cmd) {
  auto opt = std::make_shared<Options>();
  cmd.add_option("checkpoint", opt->checkpoint,
                 "a checkpoint directory (step_NNNNNNNN) or checkpoint.dir (its newest)")
      ->required();
  cmd.add_option("out", opt->out, "output directory (config.json + model.safetensors)")->required();
  cmd.add_option("--dtype", opt->dtype, "stored dtype: bf16 or fp32")
      ->capture_default_str()
      ->check(CLI::IsMember({"bf16", "fp32"}));
  cmd.add_option(
         "--tokenizer", opt->tokenizer,
         "auto (the run's Hugging Face directory's tokenizer, else the byte tokenizer for a "
         "256-id vocabulary), none, bytes, or a directory to copy tokenizer files from")
      ->capture_default_str();
  cmd.add_option("--max-shard-size", opt->max_shard_size,
                 "weights larger than this (binary units: 5G = 5 GiB) are written as shards with "
                 "an index, as transformers' save_pretrained cuts them (a tensor larger than it "
                 "alone in its shard; the Hugging Face Hub takes files up to 50 GB = 46.5 GiB); 0 = "
                 "one model.safetensors whatever its size")
      ->capture_default_str();
  cmd.add_flag("--force", opt->force,
               std::string("write into a non-empty directory: once the new files are written, "
                           "its model files (") +
                   hf_model_files_text() + ") are replaced; other files stay");
  return [opt](Process& p) { return run(p, *opt); };
}

}  // namespace upipe::app
