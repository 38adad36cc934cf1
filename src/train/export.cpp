#include "train/export.h"

#include <fmt/format.h>

#include <algorithm>
#include <filesystem>

#include "core/errors.h"
#include "core/safe_fs.h"
#include "model/hf_names.h"
#include "model/safetensors.h"

namespace upipe {
namespace fs = std::filesystem;

namespace {

bool ends_with(const std::string& s, const std::string& tail) {
  return s.size() >= tail.size() && s.compare(s.size() - tail.size(), tail.size(), tail) == 0;
}

bool is_weight_file(const std::string& n) {
  return ends_with(n, ".safetensors") || ends_with(n, ".safetensors.index.json") ||
         (n.rfind("pytorch_model", 0) == 0 &&
          (ends_with(n, ".bin") || ends_with(n, ".bin.index.json"))) ||
         n == "tf_model.h5" || n == "flax_model.msgpack" || n == "config.json";
}

// ConfigError unless `out` is absent or an empty directory (or force); creates it.
void prepare_out(const std::string& out, bool force) {
  std::error_code ec;
  const fs::file_status st = fs::status(out, ec);
  if (fs::exists(st) && !fs::is_directory(st))
    throw ConfigError(fmt::format("export: {} exists and is not a directory", out));
  if (fs::is_directory(st) && !force) {
    std::vector<std::string> names;
    for (const auto& e : fs::directory_iterator(out, ec)) names.push_back(e.path().filename());
    if (!names.empty()) {
      std::sort(names.begin(), names.end());
      throw ConfigError(fmt::format(
          "export: {} is not empty ({} entries, e.g. {}); choose an empty or new directory, or "
          "pass --force to write into it (its weight files and config.json are replaced, "
          "tokenizer files kept)",
          out, names.size(), names.front()));
    }
  }
  fs::create_directories(out);
  if (force)
    for (const std::string& n : hf_weight_files(out)) {
      const fs::path p = fs::path(out) / n;
      if (fs::is_directory(fs::symlink_status(p)))
        throw ConfigError(fmt::format("export: {} is a directory; remove it first", p.string()));
      fs::remove(p);  // a symlink itself, never its target
    }
}

}  // namespace

std::vector<std::string> hf_weight_files(const std::string& out) {
  std::vector<std::string> v;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(out, ec)) {
    const std::string n = e.path().filename().string();
    if (is_weight_file(n)) v.push_back(n);
  }
  std::sort(v.begin(), v.end());
  return v;
}

void export_hf(const CheckpointReader& reader, const std::string& out, DType dtype, bool force) {
  prepare_out(out, force);
  const ModelConfig& m = reader.model();
  const std::vector<HfTensorSpec> specs = hf_tensors(m);
  std::vector<SafetensorsWriteItem> items;
  std::vector<float> f32;  // one piece, at most kSafetensorsWriteChunk elements
  for (size_t i = 0; i < specs.size(); ++i)
    items.push_back({specs[i].name, dtype, specs[i].shape, nullptr,
                     [&reader, &f32, i, dtype](int64_t first, int64_t count, void* dst) {
                       f32.resize(size_t(count));
                       reader.read_range(int(i), first, count, f32.data());
                       from_f32(f32.data(), dst, dtype, count);
                     }});
  write_safetensors((fs::path(out) / "model.safetensors").string(), items, {{"format", "pt"}});
  write_file_atomic((fs::path(out) / "config.json").string(),
                    model_config_json(m, dtype == DType::kBF16 ? "bfloat16" : "float32"),
                    "config.json");
}

}  // namespace upipe
