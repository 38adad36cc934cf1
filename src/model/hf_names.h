// The Hugging Face parameter names and shapes of a Llama / Qwen3 checkpoint, as a function of
// ModelConfig: what the safetensors importer reads and the exporter writes. Shapes are
// PyTorch's (out_features, in_features) for projections, i.e. y = x·Wᵀ.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "model/config.h"

namespace upipe {

struct HfTensorSpec {
  std::string name;            // e.g. "model.layers.3.self_attn.q_proj.weight"
  std::vector<int64_t> shape;  // row-major, outermost first
  int64_t numel() const;
};

// The weights of one decoder layer, in the order transformers registers them.
enum class LayerWeight {
  kInputNorm,     // input_layernorm (D)
  kQ,             // self_attn.q_proj (H*d, D)
  kK,             // self_attn.k_proj (K*d, D)
  kV,             // self_attn.v_proj (K*d, D)
  kO,             // self_attn.o_proj (D, H*d)
  kQNorm,         // self_attn.q_norm (d), Qwen3 only
  kKNorm,         // self_attn.k_norm (d), Qwen3 only
  kPostAttnNorm,  // post_attention_layernorm (D)
  kGate,          // mlp.gate_proj (F, D)
  kUp,            // mlp.up_proj (F, D)
  kDown,          // mlp.down_proj (D, F)
};

// Weights outside the layers.
enum class ModelWeight {
  kEmbed,      // model.embed_tokens (V, D)
  kFinalNorm,  // model.norm (D)
  kLmHead,     // lm_head (V, D); absent from checkpoints with tie_word_embeddings
};

// Whether the model has this weight (QK-norm only in Qwen3; lm_head only when untied).
bool has_layer_weight(const ModelConfig& m, LayerWeight w);
bool has_model_weight(const ModelConfig& m, ModelWeight w);

// Name and shape; throws ConfigError for a weight the model does not have or a bad layer.
HfTensorSpec hf_layer_tensor(const ModelConfig& m, int layer, LayerWeight w);
HfTensorSpec hf_model_tensor(const ModelConfig& m, ModelWeight w);

// Every tensor of one layer / of the whole checkpoint: embed_tokens, layers 0..L-1, norm,
// lm_head (unless tied). The element counts sum to parameter_count(m).
std::vector<HfTensorSpec> hf_layer_tensors(const ModelConfig& m, int layer);
std::vector<HfTensorSpec> hf_tensors(const ModelConfig& m);

// The parameters grouped into the units the decoder uses as one piece, in forward's order of
// use: unit 0 the embedding, unit 1 + l layer l, the last unit the head (final norm, and lm_head
// when untied; a tied head reads unit 0). ZeRO-3 gathers and reduce-scatters a unit at a time.
// Concatenated, the units list hf_tensors(m) in its order.
int num_param_units(const ModelConfig& m);
inline int embed_unit() {
  return 0;
}
inline int layer_unit(int layer) {
  return 1 + layer;
}
inline int head_unit(const ModelConfig& m) {
  return 1 + m.num_hidden_layers;
}
std::vector<HfTensorSpec> unit_tensors(const ModelConfig& m, int unit);
// "embed", "layer 3", "head": for messages.
std::string unit_name(const ModelConfig& m, int unit);

}  // namespace upipe
