#include "train/zero.h"

#include <algorithm>
#include <cmath>

#include "backend/optim.h"
#include "backend/tensor_ops.h"
#include "core/checked.h"
#include "core/fault_inject.h"
#include "model/safetensors.h"
#include "model/weights.h"

namespace upipe {

std::vector<ZeroUnitLayout> zero_layout(const ModelConfig& m, int world) {
  UPIPE_CHECK(world >= 1, "ZeRO-3 over {} ranks", world);
  std::vector<ZeroUnitLayout> units;
  int index = 0;
  for (int u = 0; u < num_param_units(m); ++u) {
    ZeroUnitLayout l;
    l.tensors = unit_tensors(m, u);
    for (const HfTensorSpec& s : l.tensors) {
      l.offsets.push_back(l.numel);
      l.index.push_back(index++);
      l.numel = checked_add(l.numel, s.numel(), "parameter unit elements");
    }
    l.shard = (l.numel + world - 1) / world;
    units.push_back(std::move(l));
  }
  return units;
}

int64_t zero_shard_elements(const ModelConfig& m, int world) {
  auto shard = [&](int unit) {
    int64_t n = 0;
    for (const HfTensorSpec& s : unit_tensors(m, unit))
      n = checked_add(n, s.numel(), "unit elements");
    return (n + world - 1) / world;
  };
  // Unit 0 the embedding, units 1 .. L the layers (all alike), the last the head.
  const int units = num_param_units(m);
  const int64_t layers = checked_mul(units - 2, shard(1), "shard elements");
  return checked_add(checked_add(shard(0), layers, "shard elements"), shard(units - 1),
                     "shard elements");
}

Zero3::Zero3(Device& dev, Communicator& world, const ModelConfig& m, DType compute)
    : dev_(dev), world_(world), m_(m), compute_(compute), layout_(zero_layout(m, world.size())) {
  Arena& mem = dev_.mem();
  units_.resize(layout_.size());
  for (size_t u = 0; u < layout_.size(); ++u) {
    const int64_t s = layout_[u].shard;
    Unit& x = units_[u];
    x.master = Tensor(mem, Tag::kParams, DType::kF32, 1, s);
    x.grad = Tensor(mem, Tag::kGrads, DType::kF32, 1, s);
    x.m = Tensor(mem, Tag::kOptim, DType::kF32, 1, s);
    x.v = Tensor(mem, Tag::kOptim, DType::kF32, 1, s);
  }
}

Zero3::~Zero3() {
  // Collectives in flight must complete before their buffers go.
  for (Unit& x : units_) {
    if (x.gather) x.gather->wait();
    if (x.reduce) x.reduce->wait();
  }
}

void Zero3::init(const SafetensorsReader* reader, uint64_t seed) {
  // Every tensor's name and shape first, on every rank: a rank reads only its shard's ranges, and
  // a bad checkpoint must fail on all ranks alike, not leave the others waiting. (A value that is
  // not finite is seen by the rank reading it only: that rank's error ends the job.)
  if (reader != nullptr) {
    std::vector<HfTensorSpec> specs;
    for (const ZeroUnitLayout& l : layout_)
      specs.insert(specs.end(), l.tensors.begin(), l.tensors.end());
    check_weights(*reader, specs, m_.tie_word_embeddings);
  }
  if (reader != nullptr) fault_point("init");
  constexpr int64_t kChunk = int64_t(1) << 20;  // host staging, elements
  std::vector<float> host;
  for (int u = 0; u < num_units(); ++u) {
    const ZeroUnitLayout& l = layout(u);
    Unit& x = units_[size_t(u)];
    for (const Tensor* t : {&x.master, &x.grad, &x.m, &x.v}) zero(dev_, *t);
    if (!dev_.backend().computes()) continue;
    const int64_t lo = shard_first(u), hi = std::min(lo + l.shard, l.numel);
    for (size_t i = 0; i < l.tensors.size(); ++i) {
      const int64_t a = std::max(lo, l.offsets[i]),
                    b = std::min(hi, l.offsets[i] + l.tensors[i].numel());
      for (int64_t c = a; c < b; c += kChunk) {
        const int64_t n = std::min(kChunk, b - c);
        host.resize(size_t(n));
        param_values(l.tensors[i], l.index[i], reader, seed, c - l.offsets[i], n, host.data());
        upload(dev_, host.data(), x.master.mat().block(0, 1, c - lo, n));
      }
    }
  }
}

ParamViews Zero3::views(int unit, const Tensor& flat) const {
  const ZeroUnitLayout& l = layout(unit);
  ParamViews v;
  for (size_t i = 0; i < l.tensors.size(); ++i) {
    const HfTensorSpec& s = l.tensors[i];
    const int64_t rows = s.shape.size() == 1 ? 1 : s.shape[0], cols = s.shape.back();
    v.emplace(s.name, Mat{flat.mat().at(0, l.offsets[i]), flat.dtype(), rows, cols, cols});
  }
  return v;
}

void Zero3::prefetch(int unit) {
  Unit& x = units_.at(size_t(unit));
  if (x.gathered.data() != nullptr) return;  // in flight or held
  const int64_t s = layout(unit).shard;
  x.gathered = Tensor(dev_.mem(), Tag::kGathered, compute_, 1, s * world_.size());
  const void* src = x.master.data();
  if (compute_ != DType::kF32) {
    x.send = Tensor(dev_.mem(), Tag::kGathered, compute_, 1, s);
    copy(dev_, x.send, x.master);
    src = x.send.data();
  }
  x.gather = world_.iall_gather(src, x.gathered.data(), mat_bytes(1, s, compute_));
}

const ParamViews& Zero3::acquire(int unit) {
  prefetch(unit);
  Unit& x = units_[size_t(unit)];
  if (x.gather) {
    x.gather->wait();
    x.gather.reset();
    x.send.reset();
    x.weights = views(unit, x.gathered);
  }
  return x.weights;
}

void Zero3::release(int unit) {
  Unit& x = units_.at(size_t(unit));
  UPIPE_CHECK(!x.gather, "release of {} while its all-gather is in flight", unit_name(m_, unit));
  x.weights.clear();
  x.gathered.reset();
}

const ParamViews& Zero3::grads(int unit) {
  Unit& x = units_.at(size_t(unit));
  // The unit's gradient of the previous micro-step still being reduce-scattered (a tied head
  // takes the embedding's gradient at the next micro-step's head, before any grads_done): that
  // reduction completes first, and the unit's gradient starts again.
  if (x.reduce) {
    complete_reduce(unit);
    std::erase(reducing_, unit);
  }
  if (x.full_grad.data() == nullptr) {
    const ZeroUnitLayout& l = layout(unit);
    x.full_grad = Tensor(dev_.mem(), Tag::kGrads, DType::kF32, 1, l.shard * world_.size());
    // The padding is reduced with the rest and must stay zero.
    zero(dev_, x.full_grad.mat().block(0, 1, l.numel, x.full_grad.cols() - l.numel));
    x.grad_views = views(unit, x.full_grad);
  }
  return x.grad_views;
}

void Zero3::grads_done(int unit) {
  Unit& x = units_.at(size_t(unit));
  UPIPE_CHECK(x.full_grad.data() != nullptr && !x.reduce, "grads_done({}) without grads()",
              unit_name(m_, unit));
  const int64_t s = layout(unit).shard;
  x.grad_views.clear();
  x.recv = Tensor(dev_.mem(), Tag::kGrads, DType::kF32, 1, s);
  x.reduce =
      world_.ireduce_scatter(x.full_grad.data(), x.recv.data(), s, DType::kF32, ReduceOp::kSum);
  // At most two units' whole gradients exist at once: the one just started and the one the
  // decoder writes next; the older reduce-scatters complete now.
  while (!reducing_.empty()) {
    complete_reduce(reducing_.front());
    reducing_.erase(reducing_.begin());
  }
  reducing_.push_back(unit);
}

void Zero3::complete_reduce(int unit) {
  Unit& x = units_[size_t(unit)];
  x.reduce->wait();
  x.reduce.reset();
  x.full_grad.reset();
  add_into(dev_, x.grad, x.recv);
  x.recv.reset();
}

void Zero3::finish_grads() {
  for (int u : reducing_) complete_reduce(u);
  reducing_.clear();
}

void Zero3::zero_grads() {
  UPIPE_CHECK(reducing_.empty(), "zero_grads with reduce-scatters in flight");
  for (Unit& x : units_) zero(dev_, x.grad);
}

double Zero3::grad_norm() {
  UPIPE_CHECK(reducing_.empty(), "grad_norm with reduce-scatters in flight");
  double mine = 0;
  for (const Unit& x : units_) mine += sum_squares(dev_, x.grad);
  // Summed in rank order in fp64: the same bits on every rank.
  std::vector<double> parts(static_cast<size_t>(world_.size()));
  world_.all_gather(&mine, parts.data(), sizeof(double));
  double total = 0;
  for (double p : parts) total += p;
  return std::sqrt(total);
}

void Zero3::step(const OptimizerSpec& o, double lr, double grad_scale, int64_t t) {
  UPIPE_CHECK(reducing_.empty(), "optimizer step with reduce-scatters in flight");
  for (int u = 0; u < num_units(); ++u) {
    const ZeroUnitLayout& l = layout(u);
    const Unit& x = units_[size_t(u)];
    const int64_t lo = shard_first(u), hi = lo + l.shard;
    // Each tensor's part of the shard, with its own weight decay; the padding tail gets none
    // (its zero gradient leaves it zero).
    int64_t done = lo;
    for (size_t i = 0; i <= l.tensors.size(); ++i) {
      const bool pad = i == l.tensors.size();
      const int64_t a = std::max(lo, pad ? l.numel : l.offsets[i]),
                    b = std::min(hi, pad ? hi : l.offsets[i] + l.tensors[i].numel());
      if (a >= b) continue;
      UPIPE_CHECK(a == done, "ZeRO-3 shard walk out of order");
      done = b;
      const double wd = !pad && l.tensors[i].shape.size() == 2 ? o.weight_decay : 0.0;
      const AdamWArgs args{lr, o.beta1, o.beta2, o.eps, wd, grad_scale, t};
      auto part = [&](const Tensor& s) { return s.mat().block(0, 1, a - lo, b - a); };
      adamw(dev_, part(x.master), part(x.grad), part(x.m), part(x.v), args);
    }
  }
}

}  // namespace upipe
