// ZeRO-3 over every rank of the world (DP x CP): each rank stores 1/W of the fp32 master weights
// (tag params), of the fp32 gradients (tag grads) and of the AdamW moments (tag optim), and the
// decoder sees whole weights only one parameter unit at a time (model/param_source.h):
//   prefetch(u)    converts the master shard to the compute dtype and starts the unit's
//                  non-blocking all-gather into a (1, W * shard) buffer (tag gathered);
//   acquire(u)     waits for it and hands out views of the unit's tensors;
//   release(u)     frees the gathered copy;
//   grads(u)       a (1, W * shard) fp32 buffer for the unit's whole gradient (tag grads);
//   grads_done(u)  starts its non-blocking reduce-scatter; when it completes (at the next
//                  grads_done or at finish_grads) this rank's shard of the sum is added into the
//                  gradient shard, so micro-steps accumulate. At most two units' whole
//                  gradients exist at once, plus a tied embedding's (held from the LM head to the
//                  embedding backward).
// Layout: unit u's tensors are concatenated in hf_tensors order into n_u elements, padded to a
// multiple of W; rank r owns elements [r * s_u, (r + 1) * s_u), s_u = ceil(n_u / W). The padding
// stays exactly zero (zero gradient -> zero update).
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "backend/device.h"
#include "comm/communicator.h"
#include "model/hf_names.h"
#include "model/param_source.h"

namespace upipe {

class SafetensorsReader;

// One unit's place in the flat layout.
struct ZeroUnitLayout {
  std::vector<HfTensorSpec> tensors;
  std::vector<int64_t> offsets;  // each tensor's first element in the unit
  std::vector<int> index;        // each tensor's index in hf_tensors(m)
  int64_t numel = 0;             // n_u
  int64_t shard = 0;             // s_u = ceil(n_u / W)
};
std::vector<ZeroUnitLayout> zero_layout(const ModelConfig& m, int world);
// sum_u s_u, in closed form (nothing proportional to the layers is built): the elements of each
// of a rank's four shards.
int64_t zero_shard_elements(const ModelConfig& m, int world);

struct OptimizerSpec {
  double beta1 = 0.9, beta2 = 0.95, eps = 1e-8, weight_decay = 0.1;  // decay on matrices only
};

class Zero3 final : public ParamSource {
 public:
  // compute: the dtype the gathered weights have (the decoder's compute dtype).
  Zero3(Device& dev, Communicator& world, const ModelConfig& m, DType compute);
  ~Zero3() override;

  // Master weights: this rank's shard of the checkpoint read by `reader`, or (null) the
  // deterministic random initialisation of `seed` (the values load_params gives). Moments and
  // gradients are zeroed.
  void init(const SafetensorsReader* reader, uint64_t seed);

  // ParamSource.
  void prefetch(int unit) override;
  const ParamViews& acquire(int unit) override;
  void release(int unit) override;
  const ParamViews& grads(int unit) override;
  void grads_done(int unit) override;

  // Completes every reduce-scatter in flight (before reading the gradient shards).
  void finish_grads();
  // Gradient shards = 0 (the start of a step's accumulation).
  void zero_grads();
  // Global L2 norm of the gradient over all ranks (the same value on every rank).
  double grad_norm();
  // One AdamW step on this rank's shards; weight decay applies to matrices, not norms.
  void step(const OptimizerSpec& o, double lr, double grad_scale, int64_t t);

  // For checkpoints and tests.
  const ModelConfig& model() const { return m_; }
  int num_units() const { return int(layout_.size()); }
  const ZeroUnitLayout& layout(int unit) const { return layout_[size_t(unit)]; }
  int64_t shard_first(int unit) const { return int64_t(world_.rank()) * layout(unit).shard; }
  Mat master(int unit) const { return units_[size_t(unit)].master.mat(); }
  Mat grad(int unit) const { return units_[size_t(unit)].grad.mat(); }
  Mat exp_avg(int unit) const { return units_[size_t(unit)].m.mat(); }
  Mat exp_avg_sq(int unit) const { return units_[size_t(unit)].v.mat(); }
  Communicator& world() { return world_; }
  Device& device() { return dev_; }

 private:
  struct Unit {
    Tensor master, grad, m, v;  // (1, s_u) fp32 shards
    Tensor gathered, send;      // (1, W s_u) compute dtype; the converted shard while in flight
    std::unique_ptr<Work> gather;
    ParamViews weights;
    Tensor full_grad, recv;  // (1, W s_u) fp32; (1, s_u) fp32 while reducing
    std::unique_ptr<Work> reduce;
    ParamViews grad_views;
  };
  ParamViews views(int unit, const Tensor& flat) const;
  void complete_reduce(int unit);

  Device& dev_;
  Communicator& world_;
  ModelConfig m_;
  DType compute_;
  std::vector<ZeroUnitLayout> layout_;
  std::vector<Unit> units_;
  std::vector<int> reducing_;  // units whose reduce-scatter is in flight, oldest first
};

}  // namespace upipe
