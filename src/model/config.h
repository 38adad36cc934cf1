// The decoder's shape as Hugging Face describes it: a ModelConfig read from a `config.json` of
// model_type "llama" or "qwen3" (or a built-in preset), validated once at the boundary, and
// mapped to the attention block's AttentionConfig. Everything the engine cannot run exactly as
// transformers does (biases, other activations, other RoPE types, sliding windows) is refused
// here with a one-line ConfigError naming the file and the field.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "attention/config.h"
#include "backend/backend.h"

namespace upipe {

enum class ModelFamily { kLlama, kQwen3 };
const char* model_family_name(ModelFamily f);  // "llama" / "qwen3", as in model_type

// The most decoder layers a config may have (the largest models have about 130).
inline constexpr int kMaxLayers = 1 << 16;

struct ModelConfig {
  ModelFamily family = ModelFamily::kLlama;
  int64_t hidden_size = 0;              // D
  int64_t intermediate_size = 0;        // F: SwiGLU width
  int num_hidden_layers = 0;            // L
  int num_attention_heads = 0;          // H
  int num_key_value_heads = 0;          // K
  int head_dim = 0;                     // d (Qwen3-32B: 128 while D/H = 80)
  int64_t vocab_size = 0;               // V
  double rms_norm_eps = 1e-6;           // of every RMSNorm (layer norms, final norm, QK-norm)
  bool tie_word_embeddings = false;     // lm_head shares model.embed_tokens.weight
  bool qk_norm = false;                 // Qwen3: RMSNorm over d of each q and k head
  int64_t max_position_embeddings = 0;  // the context the checkpoint was trained for (informative)
  RopeParams rope;                      // theta and optional llama3 scaling
  std::string torch_dtype;  // "float32" / "bfloat16" / "float16" of the checkpoint, "" if unstated
  // config.json's bos_token_id, eos_token_id and pad_token_id where given (key -> the value's
  // JSON: an id, a list of ids or null), carried to an export so generation stops where the
  // tokenizer's model did; not architecture (first_model_difference ignores them).
  std::map<std::string, std::string> token_ids;
  std::string source;  // the config.json path or "preset NAME", for messages

  int64_t q_dim() const { return int64_t(num_attention_heads) * head_dim; }   // H*d
  int64_t kv_dim() const { return int64_t(num_key_value_heads) * head_dim; }  // K*d
  // Throws ConfigError naming the source and field when a value cannot form a decoder.
  void validate() const;
};

// Parses the text of a config.json; `source` names it in every error message.
ModelConfig parse_model_config(const std::string& json_text, const std::string& source);

// The Hugging Face config.json text of m (hub form: rope_theta + rope_scaling), which
// parse_model_config reads back to m and transformers loads; torch_dtype as given.
std::string model_config_json(const ModelConfig& m, const std::string& torch_dtype);

// The first field in which two models' architectures differ, as "field 'num_attention_heads':
// A_NAME has 32, B_NAME has 16"; "" when they are the same model (every field of config.json that
// the engine reads, compared one by one in the alphabetical order of their keys).
std::string first_model_difference(const ModelConfig& a, const std::string& a_name,
                                   const ModelConfig& b, const std::string& b_name);

// A directory holding config.json, a path to a config.json, or a preset name.
ModelConfig load_model_config(const std::string& path_or_preset);

// Built-in presets: llama3-8b, llama3.1-8b, llama3-70b, qwen3-8b, qwen3-32b, tiny, tiny-qwen3.
const std::vector<std::string>& model_preset_names();
bool is_model_preset(const std::string& name);
ModelConfig model_preset(const std::string& name);  // throws ConfigError listing the presets

// The attention block's shape (heads, kv_heads, head_dim, hidden, qk_norm, norm_eps, rope).
// Sequence length, dtype and the strategy knobs stay at their defaults for the caller to set.
AttentionConfig to_attention_config(const ModelConfig& m);

// Parameters of the whole model (embedding, layers, final norm, and lm_head unless tied).
int64_t parameter_count(const ModelConfig& m);
// Parameters of one decoder layer (attention, MLP, both norms, QK-norm weights).
int64_t layer_parameter_count(const ModelConfig& m);

}  // namespace upipe
