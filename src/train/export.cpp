#include "train/export.h"

#include <fmt/format.h>

#include <algorithm>
#include <filesystem>

#include "core/errors.h"
#include "core/safe_fs.h"
#include "model/hf_names.h"
#include "model/safetensors.h"
#include "train/run_config.h"
#include "train/tokenizer.h"

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
          "pass --force to write into it (its weight files and config.json are replaced, and "
          "the tokenizer files this export writes replace their namesakes; other files stay)",
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

constexpr int64_t kMaxTokenizerFileBytes = int64_t(256) << 20;

// The tokenizer files `dir` holds (regular files, or symlinks to them as a Hugging Face cache has).
std::vector<std::string> tokenizer_files_in(const std::string& dir) {
  std::vector<std::string> v;
  std::error_code ec;
  for (const std::string& n : hf_tokenizer_files())
    if (fs::is_regular_file(fs::path(dir) / n, ec)) v.push_back(n);
  return v;
}

std::string joined(const std::vector<std::string>& v) {
  std::string s;
  for (const std::string& x : v) s += (s.empty() ? "" : ", ") + x;
  return s;
}

TokenizerPlan copy_plan(const std::string& dir, const std::string& why) {
  TokenizerPlan p;
  p.dir = dir;
  p.files = tokenizer_files_in(dir);
  p.note = fmt::format("tokenizer: copied from {} ({}): {}", dir, why, joined(p.files));
  return p;
}

TokenizerPlan bytes_plan(const std::string& why) {
  TokenizerPlan p;
  p.bytes = true;
  p.note = "tokenizer: the byte tokenizer of upipe tokenize (" + why + ")";
  return p;
}

// The run's Hugging Face directories, from the run file the checkpoint records: init_from first.
std::vector<std::string> run_directories(const CheckpointReader& reader) {
  std::vector<std::string> dirs;
  try {
    const RunConfig c = parse_run_toml(reader.info().run_toml, reader.info().path + "/meta.json");
    std::error_code ec;
    for (const std::string& d : {c.model.init_from, c.model.name})
      if (!d.empty() && fs::is_directory(d, ec)) dirs.push_back(d);
  } catch (const ConfigError&) {  // a run file of another version: no directories to look in
  }
  return dirs;
}

}  // namespace

const std::vector<std::string>& hf_tokenizer_files() {
  static const std::vector<std::string> names = {"tokenizer.json",
                                                 "tokenizer_config.json",
                                                 "special_tokens_map.json",
                                                 "tokenizer.model",
                                                 "vocab.json",
                                                 "merges.txt",
                                                 "added_tokens.json",
                                                 "chat_template.jinja"};
  return names;
}

TokenizerChoice parse_tokenizer_choice(const std::string& s) {
  using K = TokenizerChoice::Kind;
  if (s == "auto") return {K::kAuto, ""};
  if (s == "none") return {K::kNone, ""};
  if (s == "bytes") return {K::kBytes, ""};
  if (s.empty()) throw ConfigError("--tokenizer is empty; give auto, none, bytes or a directory");
  return {K::kDir, s};
}

TokenizerPlan plan_tokenizer(const CheckpointReader& reader, const TokenizerChoice& choice) {
  using K = TokenizerChoice::Kind;
  const int64_t vocab = reader.model().vocab_size;
  switch (choice.kind) {
    case K::kNone:
      return {false, "", {}, "tokenizer: none (--tokenizer none)"};
    case K::kBytes:
      if (vocab < kByteVocab)
        throw ConfigError(fmt::format(
            "--tokenizer bytes needs a vocabulary of at least {} ids; this model has {}",
            kByteVocab, vocab));
      return bytes_plan("--tokenizer bytes");
    case K::kDir: {
      std::error_code ec;
      if (!fs::is_directory(choice.dir, ec))
        throw ConfigError(fmt::format("--tokenizer {} is not a directory", choice.dir));
      TokenizerPlan p = copy_plan(choice.dir, "--tokenizer");
      if (p.files.empty())
        throw ConfigError(fmt::format("--tokenizer {} holds no tokenizer files ({})", choice.dir,
                                      joined(hf_tokenizer_files())));
      return p;
    }
    case K::kAuto:
      break;
  }
  for (const std::string& d : run_directories(reader)) {
    TokenizerPlan p = copy_plan(d, "the run's model directory");
    if (!p.files.empty()) return p;
  }
  if (vocab == kByteVocab) return bytes_plan("the model's vocabulary is the 256 byte ids");
  return {false,
          "",
          {},
          "tokenizer: none (the run names no directory with one and the "
          "vocabulary is not bytes); pass --tokenizer DIR to copy one"};
}

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

void export_hf(const CheckpointReader& reader, const std::string& out, DType dtype, bool force,
               const TokenizerPlan& tok) {
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
  const fs::path o(out);
  if (tok.bytes) {
    write_file_atomic((o / "tokenizer.json").string(), byte_tokenizer_json(), "tokenizer.json");
    write_file_atomic((o / "tokenizer_config.json").string(),
                      byte_tokenizer_config_json(m.max_position_embeddings),
                      "tokenizer_config.json");
  }
  for (const std::string& n : tok.files) {
    const std::string from = (fs::path(tok.dir) / n).string();
    write_file_atomic((o / n).string(),
                      read_small_file(from, "tokenizer file", kMaxTokenizerFileBytes),
                      "tokenizer file");
  }
}

}  // namespace upipe
