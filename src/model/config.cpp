#include "model/config.h"

#include <fmt/format.h>

#include <algorithm>
#include <climits>
#include <cmath>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "core/checked.h"
#include "core/errors.h"
#include "core/safe_fs.h"
#include "core/strict_json.h"

namespace upipe {

namespace {

using nlohmann::json;

// A config.json is a few KB; anything beyond this is not one (refused before reading it).
constexpr int64_t kMaxConfigBytes = int64_t(16) << 20;

// Field readers over one JSON object; every error names the source file and the field path.
class Fields {
 public:
  Fields(const json& obj, const std::string& source, std::string prefix = "")
      : obj_(obj), source_(source), prefix_(std::move(prefix)) {}

  bool has(const char* key) const { return obj_.contains(key) && !obj_.at(key).is_null(); }
  bool present(const char* key) const { return obj_.contains(key); }  // null included
  const json& at(const char* key) const { return obj_.at(key); }
  std::string path(const char* key) const { return prefix_ + key; }

  [[noreturn]] void fail(const char* key, const std::string& problem) const {
    throw ConfigError(fmt::format("{}: field '{}' {}", source_, path(key), problem));
  }

  int64_t integer(const char* key) const {
    if (!has(key)) fail(key, "is missing");
    const json& v = at(key);
    // A whole number written as a float (64.0, as some tools write every number) is that
    // integer, as transformers takes it.
    if (v.is_number_float()) {
      const double d = v.get<double>();
      if (!std::isfinite(d) || d != std::floor(d) || std::fabs(d) > 9.0e15)
        fail(key, fmt::format("must be an integer (got {})", json_excerpt(v)));
      const int64_t x = int64_t(d);
      if (x <= 0) fail(key, fmt::format("must be positive (got {})", json_excerpt(v)));
      return x;
    }
    if (!v.is_number_integer())
      fail(key, fmt::format("must be an integer (got {})", json_excerpt(v)));
    // Above 2^63 - 1 it would read as negative (2^64 - 1 said "got -1").
    if (v.is_number_unsigned() && v.get<uint64_t>() > uint64_t(INT64_MAX))
      fail(key, fmt::format("is too large (got {})", v.get<uint64_t>()));
    int64_t x = v.get<int64_t>();
    if (x <= 0) fail(key, fmt::format("must be positive (got {})", x));
    return x;
  }
  int64_t integer(const char* key, int64_t dflt) const { return has(key) ? integer(key) : dflt; }
  int int32(const char* key) const {
    int64_t x = integer(key);
    if (x > 1 << 30) fail(key, fmt::format("is too large (got {})", x));
    return int(x);
  }
  int int32(const char* key, int dflt) const { return has(key) ? int32(key) : dflt; }

  double number(const char* key) const {
    if (!has(key)) fail(key, "is missing");
    const json& v = at(key);
    if (!v.is_number()) fail(key, fmt::format("must be a number (got {})", json_excerpt(v)));
    double x = v.get<double>();
    if (!(x > 0) || !std::isfinite(x))
      fail(key, fmt::format("must be positive and finite (got {})", json_excerpt(v)));
    return x;
  }
  double number(const char* key, double dflt) const { return has(key) ? number(key) : dflt; }

  bool boolean(const char* key, bool dflt) const {
    if (!has(key)) return dflt;
    const json& v = at(key);
    if (!v.is_boolean()) fail(key, fmt::format("must be true or false (got {})", json_excerpt(v)));
    return v.get<bool>();
  }

  std::string string(const char* key, const std::string& dflt) const {
    if (!has(key)) return dflt;
    const json& v = at(key);
    if (!v.is_string()) fail(key, fmt::format("must be a string (got {})", json_excerpt(v)));
    return v.get<std::string>();
  }

 private:
  const json& obj_;
  const std::string& source_;
  std::string prefix_;
};

// The llama3 frequency rule's four fields; transformers requires all of them.
RopeScaling parse_llama3_scaling(const Fields& f) {
  RopeScaling s;
  s.enabled = true;
  s.factor = f.number("factor");
  s.low_freq_factor = f.number("low_freq_factor");
  s.high_freq_factor = f.number("high_freq_factor");
  s.original_max_position = f.integer("original_max_position_embeddings");
  if (s.factor < 1) f.fail("factor", fmt::format("must be >= 1 (got {})", s.factor));
  if (!(s.high_freq_factor > s.low_freq_factor))
    f.fail("high_freq_factor", fmt::format("must exceed low_freq_factor ({} <= {})",
                                           s.high_freq_factor, s.low_freq_factor));
  return s;
}

// The RoPE type of a rope_scaling / rope_parameters object: "default" (or absent) means plain
// RoPE, "llama3" the Llama-3.1 rule; anything else changes the math and is refused.
RopeScaling parse_rope_type(const Fields& f) {
  const char* key = f.has("rope_type") ? "rope_type" : "type";
  std::string type = f.string(key, "default");
  if (type == "default") return RopeScaling{};
  if (type == "llama3") return parse_llama3_scaling(f);
  f.fail(key, fmt::format("= \"{}\" is not supported; upipe runs \"default\" or \"llama3\"",
                          excerpt(type)));
}

// The rope_scaling object of config.json (present and not null).
RopeScaling rope_scaling(const Fields& top, const std::string& source) {
  const json& rs = top.at("rope_scaling");
  if (!rs.is_object())
    top.fail("rope_scaling", fmt::format("must be an object or null (got {})", json_excerpt(rs)));
  return parse_rope_type(Fields(rs, source, "rope_scaling."));
}

// Both forms found in the wild: rope_theta + rope_scaling (hub files, transformers 4) and
// rope_parameters (written by transformers 5).
RopeParams parse_rope(const Fields& top, const std::string& source) {
  RopeParams rope;
  if (top.has("rope_parameters")) {
    const json& rp = top.at("rope_parameters");
    if (!rp.is_object())
      top.fail("rope_parameters", fmt::format("must be an object (got {})", json_excerpt(rp)));
    Fields f(rp, source, "rope_parameters.");
    // Without its own rope_theta, the top-level one or transformers' default (as it reads it).
    rope.theta = f.number("rope_theta", top.number("rope_theta", 10000.0));
    rope.scaling = parse_rope_type(f);
    if (top.has("rope_theta") && top.number("rope_theta") != rope.theta)
      top.fail("rope_theta", fmt::format("({}) contradicts rope_parameters.rope_theta ({})",
                                         top.number("rope_theta"), rope.theta));
    // A rope_scaling beside it (a hand-edited file, or one tool writing the older form over the
    // newer) must say the same, or which one the model was trained with is unknown.
    if (top.has("rope_scaling") && rope_scaling(top, source) != rope.scaling)
      top.fail("rope_scaling",
               fmt::format("({}) contradicts rope_parameters ({}); keep one of them",
                           json_excerpt(top.at("rope_scaling")), json_excerpt(rp)));
    return rope;
  }
  rope.theta = top.number("rope_theta", 10000.0);  // transformers' default for both families
  if (top.has("rope_scaling")) rope.scaling = rope_scaling(top, source);
  return rope;
}

// The special token ids config.json may carry (ModelConfig::token_ids).
constexpr const char* kTokenIdFields[] = {"bos_token_id", "eos_token_id", "pad_token_id"};

ModelConfig parse_json(const json& j, const std::string& source) {
  if (!j.is_object()) throw ConfigError(fmt::format("{}: expected a JSON object", source));
  Fields f(j, source);
  ModelConfig m;
  m.source = source;
  std::string type = f.string("model_type", "");
  if (type == "llama")
    m.family = ModelFamily::kLlama;
  else if (type == "qwen3")
    m.family = ModelFamily::kQwen3;
  else if (type.empty())
    f.fail("model_type", "is missing; upipe reads \"llama\" or \"qwen3\"");
  else
    f.fail("model_type",
           fmt::format("= \"{}\" is not supported; upipe reads \"llama\" or \"qwen3\"",
                       excerpt(type)));

  m.hidden_size = f.integer("hidden_size");
  m.intermediate_size = f.integer("intermediate_size");
  m.num_hidden_layers = f.int32("num_hidden_layers");
  m.num_attention_heads = f.int32("num_attention_heads");
  m.num_key_value_heads = f.int32("num_key_value_heads", m.num_attention_heads);
  m.vocab_size = f.integer("vocab_size");
  // transformers' defaults: Qwen3Config has head_dim = 128; LlamaConfig uses hidden / heads.
  // (In 64 bits: hidden_size 2^32 over one head narrowed to a head_dim of 0, named as a field the
  // file did not have.)
  const int64_t derived = m.hidden_size / std::max(1, m.num_attention_heads);
  if (m.family != ModelFamily::kQwen3 && !f.has("head_dim") && m.hidden_size > 0 &&
      m.num_attention_heads > 0 && (derived < 2 || derived > kMaxHeadDim || derived % 2 != 0))
    f.fail("head_dim",
           fmt::format("is absent, and hidden_size / num_attention_heads ({} / {} = {}) is not an "
                       "even head dimension in [2, {}]; give head_dim",
                       m.hidden_size, m.num_attention_heads, derived, kMaxHeadDim));
  m.head_dim = f.int32("head_dim", m.family == ModelFamily::kQwen3 ? 128 : int(derived));
  m.rms_norm_eps = f.number("rms_norm_eps", 1e-6);
  // The kernels take it as a float: it must stay positive and finite there (1e-300 became 0).
  if (!(float(m.rms_norm_eps) > 0) || !std::isfinite(float(m.rms_norm_eps)))
    f.fail("rms_norm_eps",
           fmt::format("= {:g} is outside what a float holds (positive, finite)", m.rms_norm_eps));
  m.tie_word_embeddings = f.boolean("tie_word_embeddings", false);
  m.qk_norm = m.family == ModelFamily::kQwen3;
  m.max_position_embeddings =
      f.integer("max_position_embeddings", m.family == ModelFamily::kQwen3 ? 32768 : 2048);
  m.rope = parse_rope(f, source);
  // Said as the file's field (the range check of the attention block names the flag).
  if (m.rope.theta < kMinRopeTheta || m.rope.theta > kMaxRopeTheta)
    f.fail(
        f.has("rope_parameters") ? "rope_parameters.rope_theta" : "rope_theta",
        fmt::format("= {:g} is outside [{:g}, {:g}]", m.rope.theta, kMinRopeTheta, kMaxRopeTheta));

  if (f.boolean("attention_bias", false))
    f.fail("attention_bias", "= true is not supported; upipe's projections have no bias");
  if (f.boolean("mlp_bias", false))
    f.fail("mlp_bias", "= true is not supported; upipe's MLP has no bias");
  if (f.boolean("use_sliding_window", false))
    f.fail("use_sliding_window", "= true is not supported; upipe runs full causal attention");
  // transformers 5 may list each layer's attention type; only full causal attention runs here.
  if (f.has("layer_types")) {
    const json& lt = f.at("layer_types");
    if (!lt.is_array())
      f.fail("layer_types", fmt::format("must be an array (got {})", json_excerpt(lt)));
    for (size_t i = 0; i < lt.size(); ++i)
      if (lt[i] != "full_attention")
        f.fail("layer_types",
               fmt::format("[{}] = {} is not supported; upipe runs \"full_attention\"", i,
                           json_excerpt(lt[i])));
  }
  std::string act = f.string("hidden_act", "silu");
  if (act != "silu" && act != "swish")  // transformers' ACT2FN: swish is SiLU
    f.fail("hidden_act", fmt::format("= \"{}\" is not supported; upipe's MLP is SwiGLU (\"silu\")",
                                     excerpt(act)));
  // torch_dtype (transformers 4) was renamed dtype (transformers 5).
  const char* dtype_key = f.has("dtype") ? "dtype" : "torch_dtype";
  m.torch_dtype = f.string(dtype_key, "");
  if (!m.torch_dtype.empty() && m.torch_dtype != "float32" && m.torch_dtype != "bfloat16" &&
      m.torch_dtype != "float16")
    f.fail(dtype_key, fmt::format("= \"{}\" is not supported; upipe reads float32, bfloat16 or "
                                  "float16 checkpoints",
                                  excerpt(m.torch_dtype)));
  // Special token ids: an integer, a list of integers (Llama 3.1's several eos ids) or null.
  for (const char* key : kTokenIdFields) {
    if (!f.present(key)) continue;
    const json& v = f.at(key);
    bool ok = v.is_null() || v.is_number_integer();
    if (v.is_array()) {
      if (v.size() > 256) f.fail(key, fmt::format("lists {} ids; at most 256 are read", v.size()));
      ok = true;
      for (const json& x : v) ok = ok && x.is_number_integer();
    }
    if (!ok)
      f.fail(key,
             fmt::format("= {} is not a token id, a list of them or null", json_excerpt(v, 60)));
    // A bos / eos id past the embedding would be copied into every export, where generation
    // starts or stops on it (negative ids, which some configs use for "none", pass; a pad id is
    // never generated, and some published configs set it to vocab_size).
    if (std::string_view(key) != "pad_token_id" && m.vocab_size >= 1)
      for (const json& x : v.is_array() ? v : json::array({v}))
        if (x.is_number_unsigned() && x.get<uint64_t>() >= uint64_t(m.vocab_size))
          f.fail(key, fmt::format("= {} names token {}, past the vocabulary (vocab_size {})",
                                  json_excerpt(v, 60), x.get<uint64_t>(), m.vocab_size));
    m.token_ids[key] = v.dump();
  }
  m.validate();
  return m;
}

// Sources: the config.json files of the Hugging Face hub repositories named beside each preset
// (meta-llama/Meta-Llama-3-8B, meta-llama/Llama-3.1-8B, meta-llama/Meta-Llama-3-70B,
// Qwen/Qwen3-8B, Qwen/Qwen3-32B), reduced to the fields upipe reads. They go through the same
// parser as user files.
struct Preset {
  const char* name;
  const char* json;
};
const Preset kPresets[] = {
    {"llama3-8b",  // meta-llama/Meta-Llama-3-8B
     R"({"model_type": "llama", "hidden_size": 4096, "intermediate_size": 14336,
         "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8,
         "vocab_size": 128256, "max_position_embeddings": 8192, "rms_norm_eps": 1e-05,
         "rope_theta": 500000.0, "rope_scaling": null, "tie_word_embeddings": false,
         "hidden_act": "silu", "attention_bias": false, "torch_dtype": "bfloat16"})"},
    {"llama3.1-8b",  // meta-llama/Llama-3.1-8B
     R"({"model_type": "llama", "hidden_size": 4096, "intermediate_size": 14336,
         "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8,
         "vocab_size": 128256, "max_position_embeddings": 131072, "rms_norm_eps": 1e-05,
         "rope_theta": 500000.0,
         "rope_scaling": {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                          "original_max_position_embeddings": 8192, "rope_type": "llama3"},
         "tie_word_embeddings": false, "hidden_act": "silu", "attention_bias": false,
         "mlp_bias": false, "torch_dtype": "bfloat16"})"},
    {"llama3-70b",  // meta-llama/Meta-Llama-3-70B
     R"({"model_type": "llama", "hidden_size": 8192, "intermediate_size": 28672,
         "num_hidden_layers": 80, "num_attention_heads": 64, "num_key_value_heads": 8,
         "vocab_size": 128256, "max_position_embeddings": 8192, "rms_norm_eps": 1e-05,
         "rope_theta": 500000.0, "rope_scaling": null, "tie_word_embeddings": false,
         "hidden_act": "silu", "attention_bias": false, "torch_dtype": "bfloat16"})"},
    {"qwen3-8b",  // Qwen/Qwen3-8B
     R"({"model_type": "qwen3", "hidden_size": 4096, "intermediate_size": 12288,
         "num_hidden_layers": 36, "num_attention_heads": 32, "num_key_value_heads": 8,
         "head_dim": 128, "vocab_size": 151936, "max_position_embeddings": 40960,
         "rms_norm_eps": 1e-06, "rope_theta": 1000000, "rope_scaling": null,
         "tie_word_embeddings": false, "hidden_act": "silu", "attention_bias": false,
         "use_sliding_window": false, "torch_dtype": "bfloat16"})"},
    {"qwen3-32b",  // Qwen/Qwen3-32B
     R"({"model_type": "qwen3", "hidden_size": 5120, "intermediate_size": 25600,
         "num_hidden_layers": 64, "num_attention_heads": 64, "num_key_value_heads": 8,
         "head_dim": 128, "vocab_size": 151936, "max_position_embeddings": 40960,
         "rms_norm_eps": 1e-06, "rope_theta": 1000000, "rope_scaling": null,
         "tie_word_embeddings": false, "hidden_act": "silu", "attention_bias": false,
         "use_sliding_window": false, "torch_dtype": "bfloat16"})"},
    // Small shapes for tests; tiny-qwen3 has d != D/H, QK-norm and tied embeddings.
    {"tiny",
     R"({"model_type": "llama", "hidden_size": 64, "intermediate_size": 160,
         "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
         "vocab_size": 256, "max_position_embeddings": 4096, "rms_norm_eps": 1e-05,
         "rope_theta": 10000.0, "tie_word_embeddings": false, "torch_dtype": "float32"})"},
    {"tiny-qwen3",
     R"({"model_type": "qwen3", "hidden_size": 64, "intermediate_size": 160,
         "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
         "head_dim": 32, "vocab_size": 256, "max_position_embeddings": 4096,
         "rms_norm_eps": 1e-06, "rope_theta": 1000000, "tie_word_embeddings": true,
         "torch_dtype": "float32"})"},
};

std::string preset_list() {
  std::string s;
  for (const std::string& n : model_preset_names()) s += (s.empty() ? "" : ", ") + n;
  return s;
}

}  // namespace

const char* model_family_name(ModelFamily f) {
  return f == ModelFamily::kLlama ? "llama" : "qwen3";
}

void ModelConfig::validate() const {
  auto fail = [&](const char* field, const std::string& problem) {
    throw ConfigError(fmt::format("{}: field '{}' {}", source, field, problem));
  };
  if (hidden_size <= 0) fail("hidden_size", "must be positive");
  if (intermediate_size <= 0) fail("intermediate_size", "must be positive");
  if (num_hidden_layers <= 0 || num_hidden_layers > kMaxLayers)
    fail("num_hidden_layers",
         fmt::format("must be in [1, {}] (got {})", kMaxLayers, num_hidden_layers));
  if (num_attention_heads <= 0) fail("num_attention_heads", "must be positive");
  if (num_key_value_heads <= 0) fail("num_key_value_heads", "must be positive");
  // Token ids are int32 everywhere (files, kernels, the loss).
  if (vocab_size <= 0 || vocab_size > INT32_MAX)
    fail("vocab_size", fmt::format("must be in [1, {}] (got {})", INT32_MAX, vocab_size));
  if (num_attention_heads % num_key_value_heads != 0)
    fail("num_key_value_heads", fmt::format("({}) must divide num_attention_heads ({})",
                                            num_key_value_heads, num_attention_heads));
  if (head_dim <= 0 || head_dim % 2 != 0 || head_dim > kMaxHeadDim)
    fail("head_dim", fmt::format("must be even and in [2, {}] (got {})", kMaxHeadDim, head_dim));
  if (!(rms_norm_eps > 0) || !std::isfinite(rms_norm_eps))
    fail("rms_norm_eps", fmt::format("must be positive and finite (got {})", rms_norm_eps));
  if (!(rope.theta > 0) || !std::isfinite(rope.theta))
    fail("rope_theta", fmt::format("must be positive and finite (got {})", rope.theta));
  try {
    parameter_count(*this);
  } catch (const SizeError&) {
    fail("hidden_size",
         fmt::format("x intermediate_size x vocab_size x num_hidden_layers ({} x {} x {} x {}): "
                     "the parameter count overflows 64 bits",
                     hidden_size, intermediate_size, vocab_size, num_hidden_layers));
  }
}

ModelConfig parse_model_config(const std::string& json_text, const std::string& source) {
  return parse_json(parse_json_strict(json_text, source), source);
}

std::string model_config_json(const ModelConfig& m, const std::string& torch_dtype) {
  const bool qwen = m.family == ModelFamily::kQwen3;
  json j = {{"architectures", {qwen ? "Qwen3ForCausalLM" : "LlamaForCausalLM"}},
            {"model_type", model_family_name(m.family)},
            {"hidden_size", m.hidden_size},
            {"intermediate_size", m.intermediate_size},
            {"num_hidden_layers", m.num_hidden_layers},
            {"num_attention_heads", m.num_attention_heads},
            {"num_key_value_heads", m.num_key_value_heads},
            {"head_dim", m.head_dim},
            {"vocab_size", m.vocab_size},
            {"rms_norm_eps", m.rms_norm_eps},
            {"tie_word_embeddings", m.tie_word_embeddings},
            {"max_position_embeddings", m.max_position_embeddings},
            {"hidden_act", "silu"},
            {"attention_bias", false},
            {"rope_theta", m.rope.theta},
            {"torch_dtype", torch_dtype}};
  if (!qwen) j["mlp_bias"] = false;
  if (m.rope.scaling.enabled) {
    const RopeScaling& r = m.rope.scaling;
    j["rope_scaling"] = {{"rope_type", "llama3"},
                         {"factor", r.factor},
                         {"low_freq_factor", r.low_freq_factor},
                         {"high_freq_factor", r.high_freq_factor},
                         {"original_max_position_embeddings", r.original_max_position}};
  } else {
    j["rope_scaling"] = nullptr;
  }
  for (const auto& [key, value] : m.token_ids) j[key] = json::parse(value);
  return j.dump(2) + "\n";
}

std::string first_model_difference(const ModelConfig& a, const std::string& a_name,
                                   const ModelConfig& b, const std::string& b_name) {
  json ja = json::parse(model_config_json(a, "float32"));
  json jb = json::parse(model_config_json(b, "float32"));
  for (const char* key : kTokenIdFields) {  // the tokenizer's, not the architecture
    ja.erase(key);
    jb.erase(key);
  }
  for (const auto& [key, va] : ja.items()) {
    const json vb = jb.contains(key) ? jb[key] : json();
    if (va != vb)
      return fmt::format("field '{}': {} has {}, {} has {}", key, a_name, json_excerpt(va), b_name,
                         json_excerpt(vb));
  }
  for (const auto& [key, vb] : jb.items())
    if (!ja.contains(key))
      return fmt::format("field '{}': {} has none, {} has {}", key, a_name, b_name,
                         json_excerpt(vb));
  return "";
}

const std::vector<std::string>& model_preset_names() {
  static const std::vector<std::string> names = [] {
    std::vector<std::string> v;
    for (const Preset& p : kPresets) v.push_back(p.name);
    return v;
  }();
  return names;
}

bool is_model_preset(const std::string& name) {
  const auto& v = model_preset_names();
  return std::find(v.begin(), v.end(), name) != v.end();
}

ModelConfig model_preset(const std::string& name) {
  for (const Preset& p : kPresets)
    if (name == p.name) return parse_model_config(p.json, "preset " + name);
  throw ConfigError(fmt::format("unknown model preset '{}'; presets: {}", name, preset_list()));
}

ModelConfig load_model_config(const std::string& path_or_preset) {
  namespace fs = std::filesystem;
  std::error_code ec;
  fs::path path = path_or_preset;
  if (fs::is_directory(path, ec)) {
    path /= "config.json";
    if (!fs::is_regular_file(path, ec))
      throw ConfigError(fmt::format("{}: directory holds no config.json", path_or_preset));
  } else if (!fs::exists(path, ec)) {
    if (is_model_preset(path_or_preset)) return model_preset(path_or_preset);
    throw ConfigError(
        fmt::format("'{}' is neither a config.json, a directory holding one, nor a preset ({})",
                    path_or_preset, preset_list()));
  }
  return parse_model_config(read_small_file(path.string(), "config.json", kMaxConfigBytes),
                            path.string());
}

AttentionConfig to_attention_config(const ModelConfig& m) {
  AttentionConfig a;
  a.heads = m.num_attention_heads;
  a.kv_heads = m.num_key_value_heads;
  a.head_dim = m.head_dim;
  a.hidden = m.hidden_size;
  a.qk_norm = m.qk_norm;
  a.norm_eps = float(m.rms_norm_eps);
  a.rope = m.rope;
  return a;
}

int64_t layer_parameter_count(const ModelConfig& m) {
  const int64_t d = m.hidden_size;
  const char* what = "parameter count";
  const int64_t attn = checked_mul(checked_add(checked_mul(d, m.q_dim(), what),  // q, o; k, v
                                               checked_mul(d, m.kv_dim(), what), what),
                                   2, what);
  const int64_t mlp = checked_mul(checked_mul(d, m.intermediate_size, what), 3, what);
  const int64_t norms = 2 * d + (m.qk_norm ? 2 * int64_t(m.head_dim) : 0);
  return checked_add(checked_add(attn, mlp, what), norms, what);
}

int64_t parameter_count(const ModelConfig& m) {
  const char* what = "parameter count";
  const int64_t embed = checked_mul(m.vocab_size, m.hidden_size, what);
  const int64_t layers = checked_mul(m.num_hidden_layers, layer_parameter_count(m), what);
  int64_t n = checked_add(checked_add(embed, layers, what), m.hidden_size, what);
  return m.tie_word_embeddings ? n : checked_add(n, embed, what);
}

}  // namespace upipe
