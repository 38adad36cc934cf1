// Typed views of the decoder's parameters and gradients: a unit's ParamViews (param_source.h,
// keyed by Hugging Face name) resolved once, when the unit is acquired, into the structs the
// blocks take, so that the decoder's loops name weights by what they are and never by string.
// Shapes are PyTorch's (out_features, in_features); a norm weight is one row.
#pragma once

#include "attention/strategy.h"
#include "model/config.h"
#include "model/mlp.h"
#include "model/param_source.h"

namespace upipe {

// One decoder layer's weights, in the compute dtype (unit layer_unit(l)).
struct LayerWeights {
  Mat input_norm;      // (1, D)
  Mat post_attn_norm;  // (1, D)
  AttentionWeights attn;
  MlpWeights mlp;
};

// The same layer's gradient buffers, fp32, same shapes.
struct LayerGrads {
  Mat input_norm;      // (1, D)
  Mat post_attn_norm;  // (1, D)
  AttentionGrads attn;
  MlpGrads mlp;
};

// The head: the final norm (unit head_unit(m)) and the LM head, which a tied model reads from
// the embedding's unit (unit embed_unit()). Weights in the compute dtype, or their fp32
// gradients.
struct HeadParams {
  Mat final_norm;  // (1, D)
  Mat lm_head;     // (V, D)
};

// `unit`: the views of layer `layer`'s unit (weights, or gradients for layer_grads). A missing
// tensor is an internal error (the ParamSource hands out whole units).
LayerWeights layer_weights(const ModelConfig& m, int layer, const ParamViews& unit);
LayerGrads layer_grads(const ModelConfig& m, int layer, const ParamViews& unit);
// The embedding (V, D) of the embedding unit's views.
Mat embedding(const ModelConfig& m, const ParamViews& embed);
// `head`: the head unit's views; `embed`: the embedding unit's, read only when the model is tied.
HeadParams head_params(const ModelConfig& m, const ParamViews& head, const ParamViews* embed);

}  // namespace upipe
