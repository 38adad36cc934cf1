#include "train/export.h"

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <stdlib.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <functional>
#include <string_view>
#include <utility>

#include "core/checked.h"
#include "core/errors.h"
#include "core/join.h"
#include "core/safe_fs.h"
#include "core/strict_json.h"
#include "model/config.h"
#include "model/hf_names.h"
#include "model/safetensors.h"
#include "train/run_config.h"
#include "train/tokenizer.h"

namespace upipe {
namespace fs = std::filesystem;

namespace {

constexpr const char* kGenerationConfig = "generation_config.json";

// Where export writes before anything in OUT changes; an entry of this name in OUT is an
// interrupted export's leftover.
constexpr std::string_view kStagingPrefix = ".upipe-export.";

bool is_tokenizer_file(const std::string& n) {
  const std::vector<std::string>& t = hf_tokenizer_files();
  return std::find(t.begin(), t.end(), n) != t.end();
}

// What a Hugging Face loader reads of a folder as its model: the config, the generation config,
// weights it could prefer to or mix with a new model.safetensors (model*.safetensors and their
// index, pytorch_model*.bin and its index, tf_model.h5, flax_model.msgpack) and the tokenizer.
// Other files (an adapter, a README, the user's own) are not the model's.
bool is_model_file(const std::string& n) {
  const bool model_weights = n.starts_with("model") && (n.ends_with(".safetensors") ||
                                                        n.ends_with(".safetensors.index.json"));
  const bool torch_weights =
      n.starts_with("pytorch_model") && (n.ends_with(".bin") || n.ends_with(".bin.index.json"));
  return model_weights || torch_weights || n == "tf_model.h5" || n == "flax_model.msgpack" ||
         n == "config.json" || n == kGenerationConfig || is_tokenizer_file(n);
}

// `p` absolute, symlinks of its existing part resolved, without a trailing separator. Where the
// symlinks cannot be read (a parent without search permission), `p` absolute and normalised: an
// empty path here would lie "within" every directory.
fs::path resolved(const fs::path& p) {
  std::error_code ec;
  fs::path a = fs::weakly_canonical(fs::absolute(p), ec);
  if (ec || a.empty()) a = fs::absolute(p, ec);
  a = a.lexically_normal();
  while (!a.has_filename() && a.has_relative_path()) a = a.parent_path();
  return a;
}

// Whether path `inner` is `outer` or lies inside it.
bool within(const fs::path& inner, const fs::path& outer) {
  const fs::path a = resolved(inner), b = resolved(outer);
  return std::mismatch(b.begin(), b.end(), a.begin(), a.end()).first == b.end();
}

// The run's Hugging Face directories, from the run file the checkpoint records: init_from first,
// each with the setting it came from (whether they still exist or not).
std::vector<std::pair<std::string, std::string>> run_directories(const CheckpointReader& reader);

// Everything export checks of `out` before it writes a byte (ConfigError, nothing changed): a
// directory or absent; not the checkpoint, its checkpoint directory or one of the run's own
// Hugging Face directories; empty unless force, and forced, the model files it holds all
// removable (regular files or symlinks). Returns those model files.
std::vector<std::string> check_out(const CheckpointReader& reader, const std::string& out,
                                   bool force) {
  if (out.empty()) throw ConfigError("export: the output directory is empty (\"\")");
  const fs::path step = resolved(reader.info().path);  // ck/step_4/ is ck/step_4
  const fs::path out_path = resolved(out);
  if (within(out, step))
    throw ConfigError(fmt::format(
        "export: {} is the checkpoint being exported or inside it; choose another directory", out));
  if (out_path == step.parent_path())
    throw ConfigError(fmt::format(
        "export: {} is the run's checkpoint directory (it holds {}); choose another directory", out,
        step.filename().string()));
  // Inside a step directory of this checkpoint directory (another checkpoint, one being written,
  // or a step to come) or inside any other checkpoint: a run's pruning removes it with that
  // checkpoint, the exported model with it (or a run refuses to write that step over it).
  for (fs::path a = out_path; a.has_relative_path(); a = a.parent_path())
    if (is_checkpoint_step_dir(a) ||
        (a.parent_path() == step.parent_path() && is_step_dir_name(a.filename().string())))
      throw ConfigError(fmt::format(
          "export: {} is inside {}, a checkpoint's directory, which a run prunes and replaces; "
          "choose a directory outside the step_* directories",
          out, a.string()));
  for (const auto& [dir, setting] : run_directories(reader))
    if (out_path == resolved(dir))
      throw ConfigError(fmt::format(
          "export: {} is the run's {} directory, which the run reads; choose another directory",
          out, setting));
  std::error_code ec;
  const fs::file_status st = fs::status(out, ec);
  if (fs::exists(st) && !fs::is_directory(st))
    throw ConfigError(fmt::format(
        "export: {} exists and is not a directory; give a directory (new or empty) to write into",
        out));
  std::vector<std::string> names, model_files;
  if (fs::is_directory(st))
    for (const auto& e : fs::directory_iterator(out, ec)) {
      const std::string n = e.path().filename();
      if (!n.starts_with(kStagingPrefix)) names.push_back(n);  // removed after this export
    }
  std::sort(names.begin(), names.end());
  if (!names.empty() && !force)
    throw ConfigError(fmt::format(
        "export: {} is not empty ({} entries, e.g. {}); choose an empty or new directory, or "
        "pass --force to write into it (its model files are replaced: {}; other files stay)",
        out, names.size(), names.front(), hf_model_files_text()));
  for (const std::string& n : names) {
    if (!is_model_file(n)) continue;
    const fs::path p = fs::path(out) / n;
    const fs::file_status ls = fs::symlink_status(p, ec);
    if (!fs::is_regular_file(ls) && !fs::is_symlink(ls))
      throw ConfigError(fmt::format(
          "export: {} is not a regular file (a directory, FIFO or device); remove it first",
          p.string()));
    model_files.push_back(n);
  }
  return model_files;
}

// A hidden directory inside `out` where export writes its files before they replace anything;
// removed (with whatever it holds, all export's) when destroyed.
class StagingDir {
 public:
  explicit StagingDir(const std::string& out) {
    std::string templ = (fs::path(out) / (std::string(kStagingPrefix) + "XXXXXX")).string();
    if (::mkdtemp(templ.data()) == nullptr)
      throw ConfigError(
          fmt::format("export: cannot create a directory in {}: {}", out, std::strerror(errno)));
    path_ = templ;
  }
  ~StagingDir() {
    std::error_code ec;
    fs::remove_all(path_, ec);
  }
  StagingDir(const StagingDir&) = delete;
  StagingDir& operator=(const StagingDir&) = delete;
  std::string file(const std::string& name) const { return (fs::path(path_) / name).string(); }

 private:
  std::string path_;
};

constexpr int64_t kMaxTokenizerFileBytes = int64_t(256) << 20;

// The tokenizer files `dir` holds (regular files, or symlinks to them as a Hugging Face cache has).
std::vector<std::string> tokenizer_files_in(const std::string& dir) {
  std::vector<std::string> v;
  std::error_code ec;
  for (const std::string& n : hf_tokenizer_files())
    if (fs::is_regular_file(fs::path(dir) / n, ec)) v.push_back(n);
  return v;
}

// The tokenizer files of dir, and beside them its generation_config.json (the sampling defaults
// and stop ids that go with that tokenizer); nothing when dir holds no tokenizer file.
// A tokenizer.json whose ids reach past the model's vocabulary: text with those tokens would
// index past the embedding (transformers' forward raises an IndexError there). Its ids are the
// model's vocab (an object of token -> id, or Unigram's list of [token, score]), the added
// tokens' and those its post-processor adds.
void check_tokenizer_ids(const std::string& dir, int64_t vocab) {
  const std::string path = (fs::path(dir) / "tokenizer.json").string();
  std::error_code ec;
  if (!fs::is_regular_file(path, ec)) return;
  constexpr int64_t kMaxTokenizerJson = int64_t(512) << 20;
  const nlohmann::json j =
      parse_json_strict(read_small_file(path, "tokenizer file", kMaxTokenizerJson), path);
  uint64_t largest = 0;  // the largest id
  auto id_of = [&](const nlohmann::json& v) {
    // Ids are whole numbers in [0, vocab): a negative, fractional or non-number id is as unusable
    // (transformers indexes the embedding with it) as one past the vocabulary.
    if (v.is_number_unsigned()) {
      largest = std::max(largest, v.get<uint64_t>());
      return;
    }
    throw ConfigError(fmt::format(
        "{} has the token id {}, which is no id (a whole number from 0 to the vocabulary's {}); "
        "pass --tokenizer DIR with the model's tokenizer, or --tokenizer none",
        path, excerpt(v.dump()), vocab - 1));
  };
  if (j.is_object() && j.contains("model") && j["model"].is_object() &&
      j["model"].contains("vocab")) {
    const nlohmann::json& v = j["model"]["vocab"];
    if (v.is_object())
      for (const auto& [token, id] : v.items()) id_of(id);
    else if (v.is_array())
      largest = std::max(largest, uint64_t(v.size()) - (v.empty() ? 0 : 1));
  }
  if (j.is_object() && j.contains("added_tokens") && j["added_tokens"].is_array())
    for (const nlohmann::json& t : j["added_tokens"])
      if (t.is_object() && t.contains("id")) id_of(t["id"]);
  // The ids the post-processor adds to every text (TemplateProcessing's special tokens, Bert's and
  // Roberta's [token, id] pairs, each processor of a Sequence): tokenizers inserts them as given.
  const std::function<void(const nlohmann::json&)> post_ids = [&](const nlohmann::json& p) {
    if (!p.is_object()) return;
    if (p.contains("special_tokens") && p["special_tokens"].is_object())
      for (const auto& [name, t] : p["special_tokens"].items())
        if (t.is_object() && t.contains("ids") && t["ids"].is_array())
          for (const nlohmann::json& id : t["ids"]) id_of(id);
    for (const char* k : {"sep", "cls"})
      if (p.contains(k) && p[k].is_array() && p[k].size() == 2) id_of(p[k][1]);
    if (p.contains("processors") && p["processors"].is_array())
      for (const nlohmann::json& q : p["processors"]) post_ids(q);
  };
  if (j.is_object() && j.contains("post_processor")) post_ids(j["post_processor"]);
  if (largest >= uint64_t(vocab))
    throw ConfigError(fmt::format(
        "{} has token ids up to {}, past the model's vocabulary of {} (vocab_size): text with "
        "those tokens would index past its embedding; pass --tokenizer DIR with the model's "
        "tokenizer, or --tokenizer none",
        path, largest, vocab));
}

TokenizerPlan copy_plan(const std::string& dir, const std::string& why, int64_t vocab) {
  check_tokenizer_ids(dir, vocab);
  TokenizerPlan p;
  p.dir = dir;
  p.files = tokenizer_files_in(dir);
  std::error_code ec;
  if (!p.files.empty() && fs::is_regular_file(fs::path(dir) / kGenerationConfig, ec))
    p.files.emplace_back(kGenerationConfig);
  p.note = fmt::format("tokenizer: copied from {} ({}): {}", dir, why, join(p.files));
  return p;
}

TokenizerPlan bytes_plan(const std::string& why) {
  TokenizerPlan p;
  p.bytes = true;
  p.note = "tokenizer: the byte tokenizer of upipe tokenize (" + why + ")";
  return p;
}

std::vector<std::pair<std::string, std::string>> run_directories(const CheckpointReader& reader) {
  std::vector<std::pair<std::string, std::string>> dirs;
  try {
    const RunConfig c = parse_run_toml(reader.info().run_toml, reader.info().path + "/meta.json");
    // A preset's name is a name, not a directory here. Paths are absolute since runs record them
    // so; an older checkpoint's relative ones are taken from the working directory.
    const std::string model = is_model_preset(c.model.name) ? "" : c.model.name;
    for (const auto& [d, setting] :
         {std::pair{c.model.init_from, "--init-from"}, std::pair{model, "--model"}})
      if (!d.empty()) dirs.emplace_back(d, setting);
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
      TokenizerPlan p = copy_plan(choice.dir, "--tokenizer", vocab);
      if (p.files.empty())
        throw ConfigError(fmt::format("--tokenizer {} holds no tokenizer files ({})", choice.dir,
                                      join(hf_tokenizer_files())));
      return p;
    }
    case K::kAuto:
      break;
  }
  for (const auto& [d, setting] : run_directories(reader)) {
    // Gone (moved, another machine): its tokenizer is unknown here, and guessing another (the
    // byte tokenizer, none) would export a model that reads other text than it was trained on.
    std::error_code ec;
    if (!fs::is_directory(d, ec))
      throw ConfigError(fmt::format(
          "export: the run's {} directory {} is not there any more, and its tokenizer files "
          "would be copied from it; pass --tokenizer DIR (a directory with them), or --tokenizer "
          "none or bytes",
          setting, d));
    TokenizerPlan p = copy_plan(d, "the run's " + std::string(setting) + " directory", vocab);
    if (!p.files.empty()) return p;
  }
  if (vocab == kByteVocab) return bytes_plan("the model's vocabulary is the 256 byte ids");
  return {false,
          "",
          {},
          "tokenizer: none (the run names no directory with one and the "
          "vocabulary is not bytes); pass --tokenizer DIR to copy one"};
}

const char* hf_model_files_text() {
  return "config.json, generation_config.json, model*.safetensors and their index, "
         "pytorch_model*.bin and its index, tf_model.h5, flax_model.msgpack, tokenizer files";
}

int64_t tensor_bytes(const SafetensorsWriteItem& t) {
  int64_t n = int64_t(dtype_size(t.dtype));
  for (int64_t d : t.shape) n = checked_mul(n, d, "tensor bytes");
  return n;
}

std::vector<std::vector<size_t>> shard_tensors(const std::vector<SafetensorsWriteItem>& items,
                                               int64_t max_shard_bytes) {
  std::vector<std::vector<size_t>> shards(1);
  int64_t in_shard = 0;
  for (size_t i = 0; i < items.size(); ++i) {
    const int64_t b = tensor_bytes(items[i]);
    if (max_shard_bytes > 0 && !shards.back().empty() && in_shard + b > max_shard_bytes) {
      shards.emplace_back();
      in_shard = 0;
    }
    shards.back().push_back(i);
    in_shard += b;
  }
  return shards;
}

int export_hf(const CheckpointReader& reader, const std::string& out, DType dtype, bool force,
              const TokenizerPlan& tok, int64_t max_shard_bytes) {
  const std::vector<std::string> replaced = check_out(reader, out, force);
  std::error_code ec;
  const bool created = !fs::exists(out, ec);
  int weight_files = 0;
  if (fs::create_directories(out, ec); ec)
    throw ConfigError(fmt::format("export: cannot create the directory {}: {}", out, ec.message()));
  try {
    std::vector<std::string> written;  // names, in the order they are put in place
    {
      const StagingDir stage(out);
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
      // Every piece is checked against its checksum as it is read: a damaged checkpoint stops
      // here, before anything in `out` is touched. Shards as transformers' save_pretrained cuts
      // them (tensors in order, a new shard where the next tensor would pass the bound, a
      // larger tensor alone), with model.safetensors.index.json; one shard is model.safetensors.
      const std::vector<std::vector<size_t>> shards = shard_tensors(items, max_shard_bytes);
      weight_files = int(shards.size());
      if (shards.size() == 1) {
        write_safetensors(stage.file("model.safetensors"), items, {{"format", "pt"}});
        written.push_back("model.safetensors");
      } else {
        nlohmann::ordered_json weight_map = nlohmann::ordered_json::object();
        int64_t total = 0;
        for (size_t k = 0; k < shards.size(); ++k) {
          const std::string name =
              fmt::format("model-{:05d}-of-{:05d}.safetensors", k + 1, shards.size());
          std::vector<SafetensorsWriteItem> part;
          for (size_t i : shards[k]) {
            part.push_back(items[i]);
            weight_map[items[i].name] = name;
            total += tensor_bytes(items[i]);
          }
          write_safetensors(stage.file(name), part, {{"format", "pt"}});
          written.push_back(name);
        }
        const nlohmann::ordered_json index = {{"metadata", {{"total_size", total}}},
                                              {"weight_map", weight_map}};
        write_file_atomic(stage.file("model.safetensors.index.json"), index.dump(2) + "\n",
                          "model.safetensors.index.json");
        written.push_back("model.safetensors.index.json");
      }
      write_file_atomic(stage.file("config.json"),
                        model_config_json(m, dtype == DType::kBF16 ? "bfloat16" : "float32"),
                        "config.json");
      written.push_back("config.json");
      if (tok.bytes) {
        write_file_atomic(stage.file("tokenizer.json"), byte_tokenizer_json(), "tokenizer.json");
        write_file_atomic(stage.file("tokenizer_config.json"),
                          byte_tokenizer_config_json(m.max_position_embeddings),
                          "tokenizer_config.json");
        written.insert(written.end(), {"tokenizer.json", "tokenizer_config.json"});
      }
      for (const std::string& n : tok.files) {
        const std::string from = (fs::path(tok.dir) / n).string();
        write_file_atomic(stage.file(n),
                          read_small_file(from, "tokenizer file", kMaxTokenizerFileBytes),
                          "tokenizer file");
        written.push_back(n);
      }
      // All written: each new file replaces its namesake in one rename (a symlink there is
      // replaced itself, never its target), so the folder always holds a whole model file of
      // each name; then the old model files no new one replaced go, and an interrupted
      // export's leftovers.
      for (const std::string& n : written) fs::rename(stage.file(n), fs::path(out) / n);
      for (const std::string& n : replaced)
        if (std::find(written.begin(), written.end(), n) == written.end())
          fs::remove(fs::path(out) / n);
    }
    for (const auto& e : fs::directory_iterator(out, ec))
      if (e.path().filename().string().starts_with(kStagingPrefix)) fs::remove_all(e.path(), ec);
    fsync_directory(out);
  } catch (...) {
    if (created) fs::remove(out, ec);  // only when empty again: a directory export made
    throw;
  }
  return weight_files;
}

}  // namespace upipe
