#include "model/stash.h"

#include <algorithm>

#include "backend/tensor_ops.h"
#include "core/check.h"

namespace upipe {

Stash::Stash(Device& dev, const StashPolicy& policy, const StashShape& shape)
    : dev_(dev), policy_(policy), shape_(shape), layers_(static_cast<size_t>(shape.layers)) {}

Stash::Layer& Stash::at(int layer) {
  UPIPE_CHECK(layer >= 0 && layer < shape_.layers, "stash layer {} of {}", layer, shape_.layers);
  return layers_[size_t(layer)];
}

const Stash::Layer& Stash::at(int layer) const {
  UPIPE_CHECK(layer >= 0 && layer < shape_.layers, "stash layer {} of {}", layer, shape_.layers);
  return layers_[size_t(layer)];
}

void Stash::save(Residual& r, const Mat& x) {
  Arena& mem = policy_.offload ? dev_.host() : dev_.mem();
  r.saved = Tensor(mem, Tag::kStash, policy_.dtype, shape_.rows, shape_.hidden);
  if (!policy_.offload) {
    copy(dev_, r.saved, x);  // converts to the stash dtype
  } else if (policy_.dtype == x.dtype) {
    UPIPE_CHECK(x.contiguous(), "the stash saves a contiguous residual stream");
    // In chunks of rows: an op writing some rows of x waits only for their chunks' copies.
    const int64_t step = shape_.chunk_rows > 0 ? shape_.chunk_rows : std::max<int64_t>(x.rows, 1);
    for (int64_t r0 = 0; r0 < x.rows; r0 += step) {
      const Mat from = x.rows_of(r0, std::min(step, x.rows - r0));
      const auto begin = reinterpret_cast<uintptr_t>(from.data);
      r.pending = dev_.copy_async(r.saved.mat().at(r0, 0), from.data, from.bytes(),
                                  CopyKind::kDeviceToHost);
      saves_.push_back({begin, begin + uintptr_t(from.bytes()), r.pending});
    }
  } else {  // converted on the device, then copied to the host
    Tensor staging(dev_.mem(), Tag::kStash, policy_.dtype, shape_.rows, shape_.hidden);
    copy(dev_, staging, x);
    // Waited on at once: the staging block is freed (and reused by the next op) on return.
    dev_.wait(
        dev_.copy_async(r.saved.data(), staging.data(), staging.bytes(), CopyKind::kDeviceToHost));
  }
}

void Stash::before_write(const Mat& rows) {
  if (saves_.empty() || rows.rows == 0 || rows.cols == 0) return;
  // Addresses as integers: the rows and a copy's source need not be one object.
  const auto begin = reinterpret_cast<uintptr_t>(rows.data);
  const auto end = reinterpret_cast<uintptr_t>(rows.at(rows.rows - 1, rows.cols - 1)) +
                   uintptr_t(dtype_size(rows.dtype));
  // The newest copy reading any of these bytes; waiting on it waits on every copy before it.
  size_t n = 0;
  for (size_t i = 0; i < saves_.size(); ++i)
    if (saves_[i].begin < end && begin < saves_[i].end) n = i + 1;
  if (n == 0) return;
  dev_.wait(saves_[n - 1].ticket);
  saves_.erase(saves_.begin(), saves_.begin() + std::ptrdiff_t(n));
}

void Stash::wait_saves() {
  if (saves_.empty()) return;
  dev_.wait(saves_.back().ticket);
  saves_.clear();
}

void Stash::save_input(int layer, const Mat& x) {
  save(at(layer).input, x);
}

void Stash::save_mlp_input(int layer, const Mat& x) {
  UPIPE_CHECK(keeps_mlp_input(), "the stash keeps no MLP input per layer");
  save(at(layer).mlp_input, x);
}

void Stash::keep_attention(int layer, std::unique_ptr<AttentionStash> kept) {
  at(layer).attn = std::move(kept);
}

const MlpStash* Stash::keep_mlp(int layer) {
  if (!keeps_intermediates()) return nullptr;
  Layer& s = at(layer);
  s.a = Tensor(dev_.mem(), Tag::kMlp, shape_.compute, shape_.rows, shape_.intermediate);
  s.b = Tensor(dev_.mem(), Tag::kMlp, shape_.compute, shape_.rows, shape_.intermediate);
  s.mlp = MlpStash{s.a.mat(), s.b.mat()};
  s.mlp_kept = true;
  return &s.mlp;
}

void Stash::fetch(Residual& r) {
  r.slot = Tensor(dev_.mem(), Tag::kStash, policy_.dtype, shape_.rows, shape_.hidden);
  r.pending =
      dev_.copy_async(r.slot.data(), r.saved.data(), r.slot.bytes(), CopyKind::kHostToDevice);
}

void Stash::fetch(int layer) {
  if (!policy_.offload) return;
  Layer& s = at(layer);
  fetch(s.input);
  if (keeps_mlp_input()) fetch(s.mlp_input);
}

Mat Stash::device_view(Residual& r) {
  dev_.wait(r.pending);
  r.pending = CopyTicket{};
  const Tensor& t = policy_.offload ? r.slot : r.saved;
  UPIPE_CHECK(t.rows() == shape_.rows && t.cols() == shape_.hidden,
              "stash entry read before it was saved or fetched");
  return t.mat();
}

Mat Stash::input(int layer) {
  return device_view(at(layer).input);
}

Mat Stash::mlp_input(int layer) {
  return device_view(at(layer).mlp_input);
}

std::unique_ptr<AttentionStash> Stash::take_attention(int layer) {
  return std::move(at(layer).attn);
}

const MlpStash* Stash::mlp(int layer) const {
  const Layer& s = at(layer);
  return s.mlp_kept ? &s.mlp : nullptr;
}

void Stash::drop(Residual& r) {
  dev_.wait(r.pending);  // a residual dropped unread: its copy is done before its memory is reused
  r.pending = CopyTicket{};
  r.slot.reset();
  r.saved.reset();
}

void Stash::drop_input(int layer) {
  drop(at(layer).input);
}

void Stash::drop_mlp_input(int layer) {
  drop(at(layer).mlp_input);
}

void Stash::drop_mlp(int layer) {
  Layer& s = at(layer);
  s.a.reset();
  s.b.reset();
  s.mlp = MlpStash{};
  s.mlp_kept = false;
}

}  // namespace upipe
