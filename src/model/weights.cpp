#include "model/weights.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <set>
#include <vector>

#include "backend/tensor_ops.h"
#include "core/checked.h"
#include "core/errors.h"
#include "core/rng.h"
#include "core/setting_ref.h"
#include "model/hf_names.h"
#include "model/safetensors.h"

namespace upipe {

bool has_checkpoint(const std::string& dir) {
  namespace fs = std::filesystem;
  std::error_code ec;
  // A name that is there, a symlink loop included (its reader names the loop); a dangling link
  // is not (weights_dir says what it points at).
  auto there = [&ec](const fs::path& p) {
    return fs::exists(p, ec) || ec == std::errc::too_many_symbolic_link_levels;
  };
  return !dir.empty() && fs::is_directory(dir, ec) &&
         (there(fs::path(dir) / "model.safetensors") ||
          there(fs::path(dir) / "model.safetensors.index.json"));
}

namespace {

// Why `dir` has no weights upipe reads, and what to do (`otherwise`: the way on without them).
std::string no_weights(const std::string& dir, const std::string& otherwise) {
  namespace fs = std::filesystem;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    const std::string n = e.path().filename().string();
    if (n.starts_with("pytorch_model") && n.ends_with(".bin"))
      return fmt::format(
          "{} holds PyTorch weights ({}), which upipe does not read (pickle files can run code); "
          "convert them to safetensors, e.g. in Python: AutoModelForCausalLM.from_pretrained(DIR)"
          ".save_pretrained(OUT) (transformers writes safetensors)",
          dir, n);
  }
  return fmt::format("{} holds no weights (model.safetensors or model.safetensors.index.json){}",
                     dir, otherwise);
}

}  // namespace

void check_init_weights(const std::string& dir, const ModelConfig& m) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (!fs::is_directory(dir, ec))
    throw ConfigError(
        fmt::format("{} is not a directory (a Hugging Face model: config.json + safetensors)",
                    setting_value("model.init_from", dir)));
  const ModelConfig init = load_model_config(dir);
  const std::string diff =
      first_model_difference(init, dir, m, "this run's model (" + m.source + ")");
  if (!diff.empty())
    throw ConfigError(
        fmt::format("{} is another model than this run's: {}; train that model with --model={}",
                    setting_value("model.init_from", dir), diff, dir));
  if (!has_checkpoint(dir)) throw ConfigError(no_weights(dir, ""));
}

SafetensorsReader open_init_weights(const std::string& dir, const ModelConfig& m) {
  check_init_weights(dir, m);
  return SafetensorsReader(dir);
}

std::string weights_dir(const std::string& model, bool random_weights) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (random_weights) return "";
  if (!fs::exists(model, ec) && is_model_preset(model)) return "";
  fs::path dir = fs::is_directory(model, ec) ? fs::path(model) : fs::path(model).parent_path();
  if (dir.empty()) dir = ".";
  if (has_checkpoint(dir.string())) return dir.string();
  for (const char* f : {"model.safetensors", "model.safetensors.index.json"})
    if (fs::is_symlink(dir / f, ec) && !fs::exists(dir / f, ec))
      throw ConfigError(fmt::format(
          "{}: {} is a dangling symlink (its target {} is missing); fetch the weights, or pass "
          "--random-weights to use random ones",
          dir.string(), f, fs::read_symlink(dir / f, ec).string()));
  throw ConfigError(no_weights(dir.string(), "; pass --random-weights to use random ones"));
}

TagBytes full_model_floor(const ModelConfig& m, DType dtype, int64_t rows, DType residual) {
  const int64_t p = parameter_count(m);
  TagBytes need;
  need.v[size_t(Tag::kParams)] = checked_mul(p, dtype_size(dtype), "parameter bytes");
  need.v[size_t(Tag::kGrads)] = checked_mul(p, 4, "gradient bytes");
  need.v[size_t(Tag::kAct)] = checked_mul(checked_mul(rows, m.hidden_size, "residual elements"),
                                          dtype_size(residual), "residual bytes");
  return need;
}

namespace {

// A tied model's file that also stores lm_head.weight (some tools save both): the same values
// are the tied model; other values are another model, which transformers loads untied (the
// stored head, with a warning) and which the tied model would silently replace.
void check_stored_head(const SafetensorsReader& reader) {
  const std::string head = "lm_head.weight", embed = "model.embed_tokens.weight";
  reader.check_shape(head, reader.tensor(embed).shape);
  const int64_t n = reader.tensor(embed).numel;
  constexpr int64_t kChunk = int64_t(1) << 20;  // elements
  std::vector<float> a, b;                      // host staging, one chunk each
  for (int64_t c = 0; c < n; c += kChunk) {
    const int64_t k = std::min(kChunk, n - c);
    a.resize(size_t(k));
    b.resize(size_t(k));
    reader.read_range(head, c, k, DType::kF32, a.data());
    reader.read_range(embed, c, k, DType::kF32, b.data());
    for (int64_t i = 0; i < k; ++i)
      if (std::memcmp(&a[size_t(i)], &b[size_t(i)], sizeof(float)) != 0)
        throw ConfigError(fmt::format(
            "{}: config.json ties the output head to the embedding (tie_word_embeddings), but "
            "the file also holds an lm_head.weight that differs from {} (element {}: {} vs {}): "
            "transformers loads such a model untied, with the stored head; set "
            "\"tie_word_embeddings\": false in config.json to load it as that model",
            reader.path(), embed, c + i, a[size_t(i)], b[size_t(i)]));
  }
}

}  // namespace

void check_weights(const SafetensorsReader& reader, const std::vector<HfTensorSpec>& specs,
                   bool tied) {
  std::set<std::string> used;
  for (const HfTensorSpec& s : specs) {
    reader.check_shape(s.name, s.shape);
    used.insert(s.name);
  }
  auto allowed = [&](const std::string& n) {
    return n.ends_with("rotary_emb.inv_freq") || (tied && n == "lm_head.weight");
  };
  std::vector<std::string> unused;
  for (const std::string& n : reader.names())
    if (!used.count(n) && !allowed(n)) unused.push_back(n);
  if (unused.empty()) {
    if (tied && reader.contains("lm_head.weight")) check_stored_head(reader);
    return;
  }
  std::string some;
  for (size_t i = 0; i < std::min<size_t>(3, unused.size()); ++i)
    some += (i ? ", " : "") + unused[i];
  throw ConfigError(fmt::format(
      "{} holds {} tensor(s) the model of its config.json does not use ({}{}): the config does "
      "not describe these weights (model_type, num_hidden_layers, tie_word_embeddings?)",
      reader.path(), unused.size(), some, unused.size() > 3 ? ", ..." : ""));
}

void param_values(const HfTensorSpec& s, int index, const SafetensorsReader* reader, uint64_t seed,
                  int64_t first, int64_t count, float* dst) {
  UPIPE_CHECK(first >= 0 && count >= 0 && first <= s.numel() && count <= s.numel() - first,
              "elements [{}, {}) of {} with {}", first, first + count, s.name, s.numel());
  if (reader != nullptr) {
    reader->read_range(s.name, first, count, DType::kF32, dst);
    for (int64_t i = 0; i < count; ++i)
      if (!std::isfinite(dst[i]))
        throw ConfigError(fmt::format(
            "{}: tensor {} holds {} at element {}: the weights are damaged or diverged; use "
            "other weights",
            reader->path(), s.name, dst[i], first + i));
  } else if (s.shape.size() == 1) {
    std::fill(dst, dst + count, 1.0f);  // RMSNorm weights
  } else {
    const uint64_t stream = seed * 1000003 + uint64_t(index) + 1;
    for (int64_t i = 0; i < count; ++i)
      dst[i] = float(0.02 * normal_at(stream, uint64_t(first + i)));
  }
}

ParamMap load_params(Device& dev, const ModelConfig& m, const std::string& dir, DType dtype,
                     uint64_t seed) {
  ParamMap p = allocate_params(dev, m, dtype, Tag::kParams);
  if (!dev.backend().computes()) return p;
  const bool from_file = has_checkpoint(dir);
  std::unique_ptr<SafetensorsReader> reader;
  if (from_file) reader = std::make_unique<SafetensorsReader>(dir);
  const std::vector<HfTensorSpec> specs = hf_tensors(m);
  if (from_file) check_weights(*reader, specs, m.tie_word_embeddings);  // before any data
  // Through one bounded host staging buffer, a piece of a tensor at a time.
  constexpr int64_t kChunk = int64_t(1) << 20;  // elements
  std::vector<float> host;
  for (size_t i = 0; i < specs.size(); ++i) {
    const HfTensorSpec& s = specs[i];
    const Mat t = p.at(s.name).mat();
    const Mat flat{t.data, t.dtype, 1, t.numel(), t.numel()};  // parameters are contiguous
    for (int64_t c = 0; c < s.numel(); c += kChunk) {
      const int64_t n = std::min(kChunk, s.numel() - c);
      host.resize(size_t(n));
      param_values(s, int(i), reader.get(), seed, c, n, host.data());
      upload(dev, host.data(), flat.block(0, 1, c, n));
    }
  }
  return p;
}

}  // namespace upipe
