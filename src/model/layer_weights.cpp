#include "model/layer_weights.h"

#include "core/check.h"
#include "model/hf_names.h"

namespace upipe {
namespace {

Mat find(const ParamViews& unit, const std::string& name) {
  const auto it = unit.find(name);
  UPIPE_CHECK(it != unit.end(), "parameter {} is missing", name);
  return it->second;
}

// The layer's tensors in LayerWeight order; QK-norm weights are empty views without qk_norm.
struct LayerViews {
  Mat input_norm, q, k, v, o, q_norm, k_norm, post_attn_norm, gate, up, down;
};

LayerViews layer_views(const ModelConfig& m, int layer, const ParamViews& unit) {
  auto get = [&](LayerWeight w) { return find(unit, hf_layer_tensor(m, layer, w).name); };
  LayerViews v{get(LayerWeight::kInputNorm),
               get(LayerWeight::kQ),
               get(LayerWeight::kK),
               get(LayerWeight::kV),
               get(LayerWeight::kO),
               {},
               {},
               get(LayerWeight::kPostAttnNorm),
               get(LayerWeight::kGate),
               get(LayerWeight::kUp),
               get(LayerWeight::kDown)};
  if (m.qk_norm) {
    v.q_norm = get(LayerWeight::kQNorm);
    v.k_norm = get(LayerWeight::kKNorm);
  }
  return v;
}

}  // namespace

LayerWeights layer_weights(const ModelConfig& m, int layer, const ParamViews& unit) {
  const LayerViews v = layer_views(m, layer, unit);
  return {v.input_norm,
          v.post_attn_norm,
          {v.q, v.k, v.v, v.o, v.q_norm, v.k_norm},
          {v.gate, v.up, v.down}};
}

LayerGrads layer_grads(const ModelConfig& m, int layer, const ParamViews& unit) {
  const LayerViews v = layer_views(m, layer, unit);
  return {v.input_norm,
          v.post_attn_norm,
          {v.q, v.k, v.v, v.o, v.q_norm, v.k_norm},
          {v.gate, v.up, v.down}};
}

Mat embedding(const ModelConfig& m, const ParamViews& embed) {
  return find(embed, hf_model_tensor(m, ModelWeight::kEmbed).name);
}

HeadParams head_params(const ModelConfig& m, const ParamViews& head, const ParamViews* embed) {
  const Mat final_norm = find(head, hf_model_tensor(m, ModelWeight::kFinalNorm).name);
  if (m.tie_word_embeddings) {
    UPIPE_CHECK(embed != nullptr, "a tied LM head needs the embedding's unit");
    return {final_norm, embedding(m, *embed)};
  }
  return {final_norm, find(head, hf_model_tensor(m, ModelWeight::kLmHead).name)};
}

}  // namespace upipe
