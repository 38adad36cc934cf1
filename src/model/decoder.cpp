#include "model/decoder.h"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <memory>
#include <vector>

#include "attention/methods.h"
#include "backend/rmsnorm.h"
#include "backend/tensor_ops.h"
#include "core/errors.h"
#include "model/hf_names.h"
#include "model/lm_loss.h"
#include "model/mlp.h"

namespace upipe {

ParamMap allocate_params(Device& dev, const ModelConfig& m, DType dtype, Tag tag) {
  ParamMap p;
  for (const HfTensorSpec& s : hf_tensors(m)) {
    const int64_t rows = s.shape.size() == 1 ? 1 : s.shape[0];
    const int64_t cols = s.shape.back();
    p.emplace(s.name, Tensor(dev.mem(), tag, dtype, rows, cols));
  }
  return p;
}

namespace {

double now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

AttentionConfig block_config(const ModelConfig& m, const DecoderOptions& opt) {
  AttentionConfig c = to_attention_config(m);
  c.seq_len = opt.seq_len;
  c.dtype = opt.memory.dtype;
  c.fp32_residual = opt.memory.residual_dtype == DType::kF32;
  c.knobs = opt.knobs;
  return c;
}

std::string layer_name(const ModelConfig& m, int l, LayerWeight w) {
  return hf_layer_tensor(m, l, w).name;
}

}  // namespace

Decoder::Decoder(Device& dev, Communicator& cp, const ModelConfig& m, const DecoderOptions& opt)
    : dev_(dev), cp_(cp), m_(m), opt_(opt) {
  m_.validate();
  opt.memory.validate();
  attn_ = block_config(m, opt);
  strat_ = make_strategy({dev, cp, attn_});
}

namespace {

const Mat& param(const ParamViews& p, const std::string& name) {
  const auto it = p.find(name);
  UPIPE_CHECK(it != p.end(), "parameter {} is missing", name);
  return it->second;
}

}  // namespace

AttentionWeights Decoder::attn_weights(const ParamViews& p, int l) const {
  AttentionWeights w{param(p, layer_name(m_, l, LayerWeight::kQ)),
                     param(p, layer_name(m_, l, LayerWeight::kK)),
                     param(p, layer_name(m_, l, LayerWeight::kV)),
                     param(p, layer_name(m_, l, LayerWeight::kO)),
                     {},
                     {}};
  if (m_.qk_norm) {
    w.wqn = param(p, layer_name(m_, l, LayerWeight::kQNorm));
    w.wkn = param(p, layer_name(m_, l, LayerWeight::kKNorm));
  }
  return w;
}

AttentionGrads Decoder::attn_grads(const ParamViews& p, int l) const {
  const AttentionWeights w = attn_weights(p, l);
  return {w.wq, w.wk, w.wv, w.wo, w.wqn, w.wkn};
}

double Decoder::loss_and_grads(std::span<const int32_t> tokens, const ParamMap& w,
                               const ParamMap& g) {
  FullParams p(m_, w, g);
  return run(tokens, p).loss;
}

StepLoss Decoder::run(std::span<const int32_t> tokens, ParamSource& p, const LossSpec& spec) {
  const AttentionConfig& c = attn_;
  const int64_t s = c.seq_len, d = m_.hidden_size;
  UPIPE_CHECK(int64_t(tokens.size()) == s, "{} tokens for a sequence of {}", tokens.size(), s);
  UPIPE_CHECK(spec.group.empty() || int64_t(spec.group.size()) == s,
              "{} group flags for a sequence of {}", spec.group.size(), s);
  // t: the compute dtype (weights, norm outputs); rt: the residual stream's and its gradient's.
  const DType t = c.dtype, rt = opt_.memory.residual_dtype;
  const float eps = float(m_.rms_norm_eps);
  Arena& mem = dev_.mem();
  const std::vector<int64_t> pos = strat_->layout().positions(cp_.rank()).expand();
  const int64_t rows = int64_t(pos.size());
  const int nl = m_.num_hidden_layers, ue = embed_unit(), uh = head_unit(m_);
  const bool tied = m_.tie_word_embeddings;
  const MlpConfig mc{d, m_.intermediate_size, opt_.memory.tile_tokens, t, rt == DType::kF32};
  auto mlp_w = [&](const ParamViews& pv, int l) {
    return MlpWeights{param(pv, layer_name(m_, l, LayerWeight::kGate)),
                      param(pv, layer_name(m_, l, LayerWeight::kUp)),
                      param(pv, layer_name(m_, l, LayerWeight::kDown))};
  };
  auto norm_w = [&](const ParamViews& pv, int l, LayerWeight which) -> const Mat& {
    return param(pv, layer_name(m_, l, which));
  };
  const std::string embed_name = hf_model_tensor(m_, ModelWeight::kEmbed).name;
  const std::string head_name =
      hf_model_tensor(m_, tied ? ModelWeight::kEmbed : ModelWeight::kLmHead).name;
  const std::string final_name = hf_model_tensor(m_, ModelWeight::kFinalNorm).name;

  const double t0 = now();
  // Embedding: the residual stream x (rows, D) gets the rows of this rank's tokens.
  Tensor x(mem, Tag::kAct, rt, rows, d);
  {
    const Mat& embed = param(p.acquire(ue), embed_name);
    p.prefetch(nl > 0 ? layer_unit(0) : uh);
    for (int64_t r = 0; r < rows; ++r)
      copy(dev_, x.mat().rows_of(r, 1), embed.rows_of(tokens[size_t(pos[size_t(r)])], 1));
    p.release(ue);
  }
  // Forward: keep each layer's input (the checkpoint; per block, also the MLP's input residual),
  // accumulate both blocks into x. Checkpoints: in the device arena, or (offload) in the host
  // arena, fetched back into device slots by the backward (a device with asynchronous copies
  // overlaps the fetch with the layer above's work; on the CPU the copy is a memcpy).
  const bool offload = opt_.memory.offload_stash;
  const bool per_block = opt_.memory.recompute != Recompute::kLayer;
  const bool keep_mlp = opt_.memory.recompute == Recompute::kNone;
  std::vector<Tensor> kept;  // keep_mlp: layer l's gate and up products, kept[2l], kept[2l + 1]
  // keep_mlp: each layer's attention intermediates too, when the strategy can keep them (else
  // forward_stash keeps nothing and returns null), so that the backward recomputes nothing.
  std::vector<std::unique_ptr<AttentionStash>> kept_attn(static_cast<size_t>(nl));
  auto kept_of = [&](int l) {
    return MlpStash{kept[2 * size_t(l)].mat(), kept[2 * size_t(l) + 1].mat()};
  };
  const size_t per_layer = per_block ? 2 : 1;  // checkpoint i = per_layer * l (+ 1: xm)
  const DType ct = opt_.memory.stash_dtype;
  std::vector<Tensor> ckpt;
  auto save = [&] {
    ckpt.emplace_back(offload ? dev_.host() : mem, Tag::kStash, ct, rows, d);
    if (!offload) {
      copy(dev_, ckpt.back(), x);  // converts to the checkpoint dtype
    } else if (ct == rt) {
      dev_.copy(ckpt.back().data(), x.data(), x.bytes(), CopyKind::kDeviceToHost);
    } else {  // converted on the device, then copied to the host
      Tensor staging(mem, Tag::kStash, ct, rows, d);
      copy(dev_, staging, x);
      dev_.copy(ckpt.back().data(), staging.data(), staging.bytes(), CopyKind::kDeviceToHost);
    }
  };
  Tensor h(mem, Tag::kAct, t, rows, d);  // a norm's output, the blocks' input
  for (int l = 0; l < nl; ++l) {
    const ParamViews& w = p.acquire(layer_unit(l));
    p.prefetch(l + 1 < nl ? layer_unit(l + 1) : uh);
    save();
    rmsnorm_forward(dev_, x, norm_w(w, l, LayerWeight::kInputNorm), eps, h);
    if (keep_mlp)
      kept_attn[size_t(l)] = strat_->forward_stash(h, attn_weights(w, l), x, 1.0f);
    else
      strat_->forward(h, attn_weights(w, l), x, 1.0f);
    if (per_block) save();
    rmsnorm_forward(dev_, x, norm_w(w, l, LayerWeight::kPostAttnNorm), eps, h);
    MlpStash k;
    if (keep_mlp) {
      for (int i = 0; i < 2; ++i) kept.emplace_back(mem, Tag::kMlp, t, rows, m_.intermediate_size);
      k = kept_of(l);
    }
    mlp_forward(dev_, mc, h, mlp_w(w, l), x, 1.0f, keep_mlp ? &k : nullptr);
    p.release(layer_unit(l));
  }
  // Final norm and the fused LM head + loss: labels are the next global position's token.
  const ParamViews& wh = p.acquire(uh);
  if (tied) p.prefetch(ue);
  const Mat& head = param(tied ? p.acquire(ue) : wh, head_name);
  if (nl > 0) p.prefetch(layer_unit(nl - 1));  // the backward's first unit
  rmsnorm_forward(dev_, x, param(wh, final_name), eps, h);
  std::vector<int32_t> labels(static_cast<size_t>(rows));
  std::vector<uint8_t> group(spec.group.empty() ? 0 : static_cast<size_t>(rows));
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t at = pos[size_t(r)];
    labels[size_t(r)] = at + 1 < s ? tokens[size_t(at + 1)] : -1;
    if (!group.empty()) group[size_t(r)] = spec.group[size_t(at)];
  }
  const LmLossConfig lc{d, m_.vocab_size, opt_.memory.tile_tokens, t, rt};
  // The loss phase holds x, h and dh = d loss / dh, then x, dh and dx = d loss / d residual.
  Tensor dh(mem, Tag::kAct, rt, rows, d);
  const ParamViews& gh = p.grads(uh);
  // A tied head's gradient and the embedding's rows both add into the embedding's gradient.
  const ParamViews* ge = tied ? &p.grads(ue) : nullptr;
  if (tied) zero(dev_, param(*ge, embed_name));
  const double scale = spec.scale != 0 ? spec.scale : 1.0 / double(s - 1);
  StepLoss out;
  out.loss = lm_loss(dev_, lc, h, head, labels, float(scale), dh, param(tied ? *ge : gh, head_name),
                     tied ? 1.0f : 0.0f, group, group.empty() ? nullptr : &out.group_sum);
  if (tied) p.release(ue);
  const double t1 = now();
  fwd_s_ = t1 - t0;
  h.reset();
  Tensor dx(mem, Tag::kAct, rt, rows, d);  // d loss / d residual stream
  const Mat gfinal = param(gh, final_name);
  zero(dev_, gfinal);
  rmsnorm_backward(dev_, x, param(wh, final_name), eps, dh, dx, gfinal);
  x.reset();  // backward rebuilds each layer's residual from its checkpoint
  dh.reset();
  p.release(uh);
  p.grads_done(uh);
  // Backward, layer by layer from the last: recompute the layer from its checkpoint (per block:
  // take the MLP's input from its own checkpoint instead of recomputing the attention). Each
  // (S/C, D) buffer lives only while it is needed, so the attention phases hold three of them
  // (dx, h, and xm in the forward recompute or dh in the backward) besides the checkpoints, and
  // the MLP phase runs in row tiles of T (only (T, D) of its norm output and gradient exist).
  // Offloaded checkpoints come back into device slots (`fetched`), the layer's own ones first.
  std::vector<Tensor> fetched(ckpt.size());
  auto fetch_layer = [&](int l) {
    for (size_t i = per_layer * size_t(l); i < per_layer * size_t(l + 1); ++i) {
      fetched[i] = Tensor(mem, Tag::kStash, ct, rows, d);
      dev_.copy(fetched[i].data(), ckpt[i].data(), fetched[i].bytes(), CopyKind::kHostToDevice);
    }
  };
  // Frees checkpoint i (and its device slot) after its last use.
  auto drop = [&](size_t i) {
    fetched[i].reset();
    ckpt[i].reset();
  };
  if (offload && nl > 0) fetch_layer(nl - 1);
  const int64_t tile = std::min(opt_.memory.tile_tokens, rows);
  for (int l = nl - 1; l >= 0; --l) {
    const ParamViews& w = p.acquire(layer_unit(l));
    if (l > 0) p.prefetch(layer_unit(l - 1));
    const size_t il = per_layer * size_t(l);
    const Mat xl = offload ? fetched[il].mat() : ckpt[il].mat();
    Tensor hl(mem, Tag::kAct, t, rows, d);  // the attention's input, kept for its backward
    rmsnorm_forward(dev_, xl, norm_w(w, l, LayerWeight::kInputNorm), eps, hl);
    Tensor xm(mem, Tag::kAct, rt, rows, d);  // the residual between attention and MLP
    if (per_block) {
      copy(dev_, xm, offload ? fetched[il + 1].mat() : ckpt[il + 1].mat());
      drop(il + 1);
    } else {
      // The layer's recompute keeps the attention's intermediates for its backward below when
      // the strategy can (local), so the block does not recompute them a second time.
      copy(dev_, xm, xl);
      kept_attn[size_t(l)] = strat_->forward_stash(hl, attn_weights(w, l), xm, 1.0f);
    }
    const ParamViews& g = p.grads(layer_unit(l));
    const Mat gpost = norm_w(g, l, LayerWeight::kPostAttnNorm),
              gin = norm_w(g, l, LayerWeight::kInputNorm);
    zero(dev_, gpost);
    zero(dev_, gin);
    // MLP, T rows at a time: h2 = the post-attention norm of xm's rows, the MLP's gradient into
    // g2, through the norm, added into dx. The weight gradients sum over the tiles.
    const MlpWeights gm = mlp_w(g, l);
    for (int64_t r0 = 0; r0 < rows; r0 += tile) {
      const int64_t n = std::min(tile, rows - r0);
      const Mat xt = xm.mat().rows_of(r0, n), dxt = dx.mat().rows_of(r0, n);
      Tensor g2(mem, Tag::kMlp, rt, n, d);
      {
        Tensor h2(mem, Tag::kMlp, t, n, d);
        rmsnorm_forward(dev_, xt, norm_w(w, l, LayerWeight::kPostAttnNorm), eps, h2);
        const MlpStash k = keep_mlp ? kept_of(l).rows_of(r0, n) : MlpStash{};
        mlp_backward(dev_, mc, h2, dxt, mlp_w(w, l), g2, MlpGrads{gm.gate, gm.up, gm.down}, 0.0f,
                     r0 == 0 ? 0.0f : 1.0f, keep_mlp ? &k : nullptr);
      }
      rmsnorm_backward(dev_, xt, norm_w(w, l, LayerWeight::kPostAttnNorm), eps, g2, g2, gpost);
      add_into(dev_, dxt, g2);
    }
    xm.reset();
    if (keep_mlp)
      for (int i = 0; i < 2; ++i) kept[2 * size_t(l) + size_t(i)].reset();
    // Attention: d/dh, then through the input norm. The next layer's checkpoints are fetched once
    // the attention's backward is done, so only one slot is held through it (the copy overlaps
    // the norm's backward; at long S it is a small fraction of a layer's attention time).
    Tensor dhl(mem, Tag::kAct, rt, rows, d);
    if (kept_attn[size_t(l)])
      strat_->backward_stashed(std::move(kept_attn[size_t(l)]), hl, dx, attn_weights(w, l), dhl,
                               attn_grads(g, l), 0.0f, 0.0f);
    else
      strat_->backward(hl, dx, attn_weights(w, l), dhl, attn_grads(g, l), 0.0f, 0.0f);
    hl.reset();
    if (offload && l > 0) fetch_layer(l - 1);
    rmsnorm_backward(dev_, xl, norm_w(w, l, LayerWeight::kInputNorm), eps, dhl, dhl, gin);
    add_into(dev_, dx, dhl);
    dhl.reset();
    drop(il);
    p.release(layer_unit(l));
    p.grads_done(layer_unit(l));
  }
  // Embedding backward: every row's gradient adds into its token's row.
  if (!tied) {
    ge = &p.grads(ue);
    zero(dev_, param(*ge, embed_name));
  }
  const Mat& gembed = param(*ge, embed_name);
  for (int64_t r = 0; r < rows; ++r)
    add_into(dev_, gembed.rows_of(tokens[size_t(pos[size_t(r)])], 1), dx.mat().rows_of(r, 1));
  p.grads_done(ue);
  bwd_s_ = now() - t1;
  // The ranks' partial losses, summed in rank order in fp64 (the same on every rank).
  const double mine[2] = {out.loss, out.group_sum};
  std::vector<double> parts(2 * static_cast<size_t>(cp_.size()));
  cp_.all_gather(mine, parts.data(), sizeof(mine));
  out = StepLoss{};
  for (size_t i = 0; i < parts.size(); i += 2) {
    out.loss += parts[i];
    out.group_sum += parts[i + 1];
  }
  return out;
}

}  // namespace upipe
