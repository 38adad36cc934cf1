#include "model/hf_names.h"

#include <fmt/format.h>

#include "core/check.h"
#include "core/errors.h"

namespace upipe {

namespace {

const LayerWeight kLayerOrder[] = {
    LayerWeight::kInputNorm, LayerWeight::kQ,     LayerWeight::kK,     LayerWeight::kV,
    LayerWeight::kO,         LayerWeight::kQNorm, LayerWeight::kKNorm, LayerWeight::kPostAttnNorm,
    LayerWeight::kGate,      LayerWeight::kUp,    LayerWeight::kDown,
};

const char* layer_suffix(LayerWeight w) {
  switch (w) {
    case LayerWeight::kInputNorm:
      return "input_layernorm";
    case LayerWeight::kQ:
      return "self_attn.q_proj";
    case LayerWeight::kK:
      return "self_attn.k_proj";
    case LayerWeight::kV:
      return "self_attn.v_proj";
    case LayerWeight::kO:
      return "self_attn.o_proj";
    case LayerWeight::kQNorm:
      return "self_attn.q_norm";
    case LayerWeight::kKNorm:
      return "self_attn.k_norm";
    case LayerWeight::kPostAttnNorm:
      return "post_attention_layernorm";
    case LayerWeight::kGate:
      return "mlp.gate_proj";
    case LayerWeight::kUp:
      return "mlp.up_proj";
    case LayerWeight::kDown:
      return "mlp.down_proj";
  }
  return "";
}

}  // namespace

int64_t HfTensorSpec::numel() const {
  int64_t n = 1;
  for (int64_t s : shape) n *= s;
  return n;
}

bool has_layer_weight(const ModelConfig& m, LayerWeight w) {
  if (w == LayerWeight::kQNorm || w == LayerWeight::kKNorm) return m.qk_norm;
  return true;
}

bool has_model_weight(const ModelConfig& m, ModelWeight w) {
  return w != ModelWeight::kLmHead || !m.tie_word_embeddings;
}

HfTensorSpec hf_layer_tensor(const ModelConfig& m, int layer, LayerWeight w) {
  if (layer < 0 || layer >= m.num_hidden_layers)
    throw ConfigError(
        fmt::format("{}: layer {} out of range [0, {})", m.source, layer, m.num_hidden_layers));
  if (!has_layer_weight(m, w))
    throw ConfigError(fmt::format("{}: a {} model has no {} weight", m.source,
                                  model_family_name(m.family), layer_suffix(w)));
  const int64_t dm = m.hidden_size, f = m.intermediate_size, d = m.head_dim;
  std::vector<int64_t> shape;
  switch (w) {
    case LayerWeight::kInputNorm:
    case LayerWeight::kPostAttnNorm:
      shape = {dm};
      break;
    case LayerWeight::kQ:
      shape = {m.q_dim(), dm};
      break;
    case LayerWeight::kK:
    case LayerWeight::kV:
      shape = {m.kv_dim(), dm};
      break;
    case LayerWeight::kO:
      shape = {dm, m.q_dim()};
      break;
    case LayerWeight::kQNorm:
    case LayerWeight::kKNorm:
      shape = {d};
      break;
    case LayerWeight::kGate:
    case LayerWeight::kUp:
      shape = {f, dm};
      break;
    case LayerWeight::kDown:
      shape = {dm, f};
      break;
  }
  return {fmt::format("model.layers.{}.{}.weight", layer, layer_suffix(w)), std::move(shape)};
}

HfTensorSpec hf_model_tensor(const ModelConfig& m, ModelWeight w) {
  switch (w) {
    case ModelWeight::kEmbed:
      return {"model.embed_tokens.weight", {m.vocab_size, m.hidden_size}};
    case ModelWeight::kFinalNorm:
      return {"model.norm.weight", {m.hidden_size}};
    case ModelWeight::kLmHead:
      if (m.tie_word_embeddings)
        throw ConfigError(
            fmt::format("{}: tie_word_embeddings is true, so there is no lm_head.weight (it is "
                        "model.embed_tokens.weight)",
                        m.source));
      return {"lm_head.weight", {m.vocab_size, m.hidden_size}};
  }
  return {};
}

std::vector<HfTensorSpec> hf_layer_tensors(const ModelConfig& m, int layer) {
  std::vector<HfTensorSpec> v;
  for (LayerWeight w : kLayerOrder)
    if (has_layer_weight(m, w)) v.push_back(hf_layer_tensor(m, layer, w));
  return v;
}

std::vector<HfTensorSpec> hf_tensors(const ModelConfig& m) {
  std::vector<HfTensorSpec> v;
  for (int u = 0; u < num_param_units(m); ++u)
    for (HfTensorSpec& t : unit_tensors(m, u)) v.push_back(std::move(t));
  return v;
}

int num_param_units(const ModelConfig& m) {
  return m.num_hidden_layers + 2;
}

std::vector<HfTensorSpec> unit_tensors(const ModelConfig& m, int unit) {
  UPIPE_CHECK(unit >= 0 && unit < num_param_units(m), "parameter unit {} of {}", unit,
              num_param_units(m));
  if (unit == embed_unit()) return {hf_model_tensor(m, ModelWeight::kEmbed)};
  if (unit != head_unit(m)) return hf_layer_tensors(m, unit - 1);
  std::vector<HfTensorSpec> v{hf_model_tensor(m, ModelWeight::kFinalNorm)};
  if (has_model_weight(m, ModelWeight::kLmHead))
    v.push_back(hf_model_tensor(m, ModelWeight::kLmHead));
  return v;
}

std::string unit_name(const ModelConfig& m, int unit) {
  if (unit == embed_unit()) return "embed";
  if (unit == head_unit(m)) return "head";
  return fmt::format("layer {}", unit - 1);
}

}  // namespace upipe
