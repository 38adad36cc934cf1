// Where the decoder gets its weights and puts its gradients, one parameter unit at a time
// (hf_names.h: embedding, layers, head). The decoder calls, in order of use:
//   prefetch(u)    the unit it will need next (ZeRO-3 starts that unit's all-gather);
//   acquire(u)     the unit's weights in the compute dtype, valid until release(u);
//   grads(u)       the unit's fp32 gradient buffers, valid until grads_done(u);
//   grads_done(u)  this rank's contribution to the unit's gradient is written (ZeRO-3 starts the
//                  reduce-scatter).
// FullParams (below) is the replicated case: every rank holds the whole model and its whole
// gradient. train/zero.h is the sharded one.
#pragma once

#include <map>
#include <string>

#include "core/check.h"
#include "core/tensor.h"
#include "model/config.h"

namespace upipe {

// Parameters by Hugging Face name (hf_names.h): owning tensors (a model's weights in the compute
// dtype, tag params; or their fp32 gradients, tag grads). A tied model has no "lm_head.weight".
using ParamMap = std::map<std::string, Tensor>;
// The same names as views (a unit's slice of a gathered flat buffer, or of a ParamMap).
using ParamViews = std::map<std::string, Mat>;

class ParamSource {
 public:
  virtual ~ParamSource() = default;
  virtual void prefetch(int unit) = 0;
  virtual const ParamViews& acquire(int unit) = 0;
  virtual void release(int unit) = 0;
  // The gradient buffers' contents are undefined: the decoder overwrites them (or zeroes those it
  // accumulates into).
  virtual const ParamViews& grads(int unit) = 0;
  virtual void grads_done(int unit) = 0;
};

// Every parameter and its gradient held whole on this rank (evaluation, single-rank references).
// With no gradients (g empty) it serves a forward alone (Decoder::loss); grads() is then an error.
class FullParams final : public ParamSource {
 public:
  FullParams(const ModelConfig& m, const ParamMap& w, const ParamMap& g);
  void prefetch(int) override {}
  const ParamViews& acquire(int unit) override { return w_.at(size_t(unit)); }
  void release(int) override {}
  const ParamViews& grads(int unit) override {
    UPIPE_CHECK(!g_.empty(), "FullParams without gradients: grads({}) of a forward alone", unit);
    return g_.at(size_t(unit));
  }
  void grads_done(int) override {}

 private:
  std::vector<ParamViews> w_, g_;  // per unit
};

}  // namespace upipe
