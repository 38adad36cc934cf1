// The stash: everything the decoder's forward keeps for its backward, in one owner, addressed by
// layer and by what it is. What it keeps is the recompute granularity's choice (Recompute):
//   every layer's input residual, (R, D) in the stash dtype (tag stash), from which the backward
//   recomputes the layer;
//   per block and none, also the residual between the layer's attention and its MLP (the MLP's
//   input), so the backward runs no attention forward again;
//   none, also the MLP's gate and up products, two (R, F) in the compute dtype (tag mlp), and
//   the attention strategy's intermediates when it can keep them (AttentionStash).
// The residuals are converted to the stash dtype when saved. Offloaded, they live in the host
// arena and the backward fetches a layer's into device slots before it uses them. Both copies
// are asynchronous (Device::copy_async): a save is copied in chunks of rows, each running beside
// the ops after it until an op is about to write its rows of the residual stream (the stash is
// the stream's WriteFence: the attention's output projection and each MLP tile call it), a fetch
// until the residual is first read. A residual whose dtype differs from the stash dtype is
// converted in a device staging buffer first and its copy waited on at once (the staging buffer
// is freed on return). Every entry is freed by its drop, after its last use.
#pragma once

#include <cstdint>
#include <deque>
#include <memory>
#include <string>
#include <vector>

#include "attention/strategy.h"
#include "backend/device.h"
#include "backend/write_fence.h"
#include "model/memory_policy.h"
#include "model/mlp.h"

namespace upipe {

struct StashPolicy {
  Recompute recompute = Recompute::kLayer;
  DType dtype = DType::kF32;  // the kept residuals' storage dtype
  bool offload = false;       // the kept residuals in the host arena
};

// The shapes of what is kept.
struct StashShape {
  int layers = 0;               // L
  int64_t rows = 0;             // R: this rank's tokens
  int64_t hidden = 0;           // D
  int64_t intermediate = 0;     // F
  DType compute = DType::kF32;  // the MLP products' dtype
  int64_t chunk_rows = 0;       // rows per copy of an offloaded save (0: one copy)
};

class Stash final : public WriteFence {
 public:
  // Allocates nothing until the forward saves.
  Stash(Device& dev, const StashPolicy& policy, const StashShape& shape);

  // Whether the MLP's input residual is kept (per block and none).
  bool keeps_mlp_input() const { return policy_.recompute != Recompute::kLayer; }
  // Whether the MLP's products and the attention's intermediates are kept (none).
  bool keeps_intermediates() const { return policy_.recompute == Recompute::kNone; }

  // Forward, layer by layer. x: (R, D) the residual stream.
  void save_input(int layer, const Mat& x);
  void save_mlp_input(int layer, const Mat& x);  // keeps_mlp_input() only
  // Offloaded: what is queued after this call is ordered after the saves' copies still reading
  // these rows of the residual stream (rows of the x saved); call it before an op writes them.
  void before_write(const Mat& rows) override;
  // ... after every save's copies.
  void wait_saves();
  // What AttentionStrategy::forward_stash returned (null when the strategy keeps nothing).
  void keep_attention(int layer, std::unique_ptr<AttentionStash> kept);
  // keeps_intermediates(): allocates the layer's (R, F) gate and up products for mlp_forward to
  // write; else null (the MLP keeps nothing).
  const MlpStash* keep_mlp(int layer);

  // Backward, layer by layer from the last. fetch: offloaded, allocates the layer's device slots
  // and starts copying its residuals into them (else nothing).
  void fetch(int layer);
  // (R, D) stash dtype, on the device: the layer's input / the MLP's input residual (after its
  // fetch's copy).
  Mat input(int layer);
  Mat mlp_input(int layer);
  // The attention's kept intermediates (null when none were kept); the stash lets go of them.
  std::unique_ptr<AttentionStash> take_attention(int layer);
  // The MLP's kept products (null when none are kept).
  const MlpStash* mlp(int layer) const;
  void drop_input(int layer);
  void drop_mlp_input(int layer);
  void drop_mlp(int layer);

 private:
  // One kept residual: `saved` in the device arena, or in the host arena with its device `slot`.
  struct Residual {
    Tensor saved;        // (R, D) stash dtype
    Tensor slot;         // (R, D) stash dtype, offloaded only, between fetch and drop
    CopyTicket pending;  // offloaded: the save's or the fetch's copy, until waited on
  };
  struct Layer {
    Residual input;      // the layer's input
    Residual mlp_input;  // the residual between attention and MLP
    Tensor a, b;         // (R, F) compute dtype: the MLP's gate and up products
    MlpStash mlp;        // views of a and b
    bool mlp_kept = false;
    std::unique_ptr<AttentionStash> attn;
  };
  Layer& at(int layer);
  const Layer& at(int layer) const;
  void save(Residual& r, const Mat& x);
  void fetch(Residual& r);
  Mat device_view(Residual& r);
  void drop(Residual& r);

  Device& dev_;
  StashPolicy policy_;
  StashShape shape_;
  std::vector<Layer> layers_;
  // An offloaded save's copy of the residual stream's bytes [begin, end), not yet waited on.
  struct SaveCopy {
    uintptr_t begin, end;
    CopyTicket ticket;
  };
  std::deque<SaveCopy> saves_;  // in issue order
};

}  // namespace upipe
