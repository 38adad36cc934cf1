// `upipe export CKPT OUTDIR [--dtype bf16|fp32]`: a training checkpoint (a step directory, or a
// checkpoint.dir whose newest complete checkpoint is taken) as a consolidated Hugging Face folder
// that transformers loads: config.json and model.safetensors with every tensor under its Hugging
// Face name (a tied embedding once). Runs on one process; under mpirun rank 0 does the work.
#include <filesystem>
#include <fstream>

#include "apps/upipe/commands.h"
#include "core/errors.h"
#include "model/safetensors.h"
#include "train/checkpoint.h"

namespace upipe::app {
namespace {

struct Options {
  std::string checkpoint, out;
  std::string dtype = "bf16";
};

int run(Process& proc, const Options& opt) {
  namespace fs = std::filesystem;
  const DType dt = parse_dtype(opt.dtype);
  std::string path = opt.checkpoint;
  if (!fs::exists(fs::path(path) / "meta.json")) {
    const auto latest = latest_checkpoint(path);
    if (!latest)
      throw ConfigError(fmt::format("{} is neither a checkpoint (step_*/ with meta.json and DONE) "
                                    "nor a directory holding a complete one",
                                    path));
    path = *latest;
  }
  const CheckpointReader reader(path);  // every rank validates: errors are the same everywhere
  if (!proc.root()) return 0;
  const ModelConfig& m = reader.model();
  fs::create_directories(opt.out);
  const std::vector<HfTensorSpec> specs = hf_tensors(m);
  // Streamed: each piece is read from the shards and converted as the writer asks for it, so
  // no tensor (let alone the model) is held whole in memory.
  std::vector<SafetensorsWriteItem> items;
  std::vector<float> f32;  // one piece, at most kSafetensorsWriteChunk elements
  for (size_t i = 0; i < specs.size(); ++i)
    items.push_back({specs[i].name, dt, specs[i].shape, nullptr,
                     [&reader, &f32, i, dt](int64_t first, int64_t count, void* dst) {
                       f32.resize(size_t(count));
                       reader.read_range(int(i), first, count, f32.data());
                       from_f32(f32.data(), dst, dt, count);
                     }});
  write_safetensors((fs::path(opt.out) / "model.safetensors").string(), items,
                    {{"format", "pt"}});
  const std::string torch_dtype = dt == DType::kBF16 ? "bfloat16" : "float32";
  std::ofstream(fs::path(opt.out) / "config.json") << model_config_json(m, torch_dtype);
  std::printf("exported %s (step %lld, %zu tensors, %s) to %s\n", path.c_str(),
              (long long)reader.info().step, items.size(), opt.dtype.c_str(), opt.out.c_str());
  return 0;
}

}  // namespace

Runner add_export(CLI::App& cmd) {
  auto opt = std::make_shared<Options>();
  cmd.add_option("checkpoint", opt->checkpoint,
                 "a checkpoint directory (step_NNNNNNNN) or checkpoint.dir (its newest)")
      ->required();
  cmd.add_option("out", opt->out, "output directory (config.json + model.safetensors)")
      ->required();
  cmd.add_option("--dtype", opt->dtype, "stored dtype: bf16 or fp32")->capture_default_str();
  return [opt](Process& p) { return run(p, *opt); };
}

}  // namespace upipe::app
