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

// The strategy's output fence for one forward, cleared however the forward ends (the stash it
// names does not outlive the step).
class OutputFence {
 public:
  OutputFence(AttentionStrategy& s, WriteFence* fence) : s_(s) { s_.set_output_fence(fence); }
  ~OutputFence() { s_.set_output_fence(nullptr); }
  OutputFence(const OutputFence&) = delete;
  OutputFence& operator=(const OutputFence&) = delete;

 private:
  AttentionStrategy& s_;
};

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

// Calls f(r, p) for each row r of `rows` in order, p its global position (no list of positions
// is made: a plan at a huge S would hold one of R int64s).
template <class F>
void for_each_row(const RowPositions& rows, F&& f) {
  size_t r = 0;
  for (const RowPositions::Run& run : rows.runs)
    for (int64_t t = 0; t < run.rows; ++t) f(r++, run.pos + t);
}

// Row r's token: the token at its global position (the embedding's row of row r).
std::vector<int32_t> row_tokens(std::span<const int32_t> tokens, const RowPositions& rows) {
  std::vector<int32_t> ids(size_t(rows.total_rows()));
  for_each_row(rows, [&](size_t r, int64_t at) { ids[r] = tokens[size_t(at)]; });
  return ids;
}

// Row r's label: the token at the next global position (-1 past the sequence's end, or past its
// document's last token); and, with a group, whether that prediction belongs to it.
void next_token_labels(std::vector<int32_t>& labels, std::vector<uint8_t>& group,
                       std::span<const int32_t> tokens, const RowPositions& rows,
                       const LossSpec& spec) {
  const int64_t s = int64_t(tokens.size());
  const size_t n = size_t(rows.total_rows());
  labels.assign(n, -1);
  group.assign(spec.group.empty() ? 0 : n, 0);
  const Documents* docs = spec.documents.get();
  for_each_row(rows, [&](size_t r, int64_t at) {
    const bool predicts = at + 1 < s && !(docs && docs->last_of_document(at));
    labels[r] = predicts ? tokens[size_t(at + 1)] : -1;
    if (!group.empty()) group[r] = spec.group[size_t(at)];
  });
}

// The loss scale: spec's, or 1 / (next-token predictions inside the documents); 0 when there are
// none (every document of length 1: the loss and its gradients are 0).
double loss_scale(const LossSpec& spec, int64_t seq_len) {
  if (spec.scale != 0) return spec.scale;
  const int64_t n = spec.documents ? spec.documents->predictions() : seq_len - 1;
  return n > 0 ? 1.0 / double(n) : 0.0;
}

// The ranks' partial losses, summed in rank order in fp64 (the same on every rank).
StepLoss sum_over_ranks(Communicator& cp, const StepLoss& mine) {
  const double part[2] = {mine.loss, mine.group_sum};
  std::vector<double> parts(2 * static_cast<size_t>(cp.size()));
  cp.all_gather(part, parts.data(), sizeof(part));
  StepLoss out;
  for (size_t i = 0; i < parts.size(); i += 2) {
    out.loss += parts[i];
    out.group_sum += parts[i + 1];
  }
  return out;
}

}  // namespace

Decoder::Decoder(Device& dev, Communicator& cp, const ModelConfig& m, const DecoderOptions& opt)
    : dev_(dev), cp_(cp), m_(m) {
  m_.validate();
  const MemoryPolicy& mp = opt.memory;
  mp.validate();
  const AttentionConfig ac = block_config(m_, opt);
  const DType t = ac.dtype, rt = mp.residual_dtype;
  cfg_.seq_len = ac.seq_len;
  cfg_.compute = t;
  cfg_.residual = rt;
  cfg_.eps = float(m_.rms_norm_eps);
  cfg_.mlp = {m_.hidden_size, m_.intermediate_size, mp.tile_tokens, t, rt == DType::kF32};
  cfg_.loss = {m_.hidden_size, m_.vocab_size, mp.tile_tokens, t, rt};
  cfg_.stash = {mp.recompute, mp.stash_dtype, mp.offload_stash};
  strat_ = make_strategy({dev, cp, ac});
}

double Decoder::loss_and_grads(std::span<const int32_t> tokens, const ParamMap& w,
                               const ParamMap& g) {
  FullParams p(m_, w, g);
  return run(tokens, p).loss;
}

// The step, and the order in which its device buffers live. The closed form (the tests' oracle
// tests/unit/step_memory.h, docs/model.md "Memory") counts exactly this order, and the unit and
// multi-rank tests (test_step_memory, test_model_meta, test_plan) require every tag's peak to
// match it; R = this rank's rows, (R, D) buffers are tag act:
//   embed           x (R, D) residual dtype: the residual stream, until head_backward.
//   (run)           h (R, D) compute dtype: each norm's output, until head_loss is done.
//   layer_forward   the stash saves the layer's input before its attention, per block and none
//                   also the MLP's input after it (offloaded in another dtype: through an (R, D)
//                   staging copy, freed at once), and with none the attention's intermediates
//                   and the MLP's two (R, F) products (tag mlp).
//   head_loss       dh (R, D) residual dtype: d loss / dh, with the LM head's (T, V) tile.
//   (run)           h freed, then dx (R, D) residual dtype: d loss / d residual, to the end.
//   head_backward   x and dh freed after the final norm's backward.
//   layer_backward  (the last layer's offloaded stash fetched before the first) h (R, D), the
//                   attention's input; xm (R, D), the MLP's input (per block copied from the
//                   stash, which drops it; per layer the attention forward run again, keeping
//                   its intermediates when the strategy can); the MLP's (T, D) tiles
//                   (mlp_backward_tiled); xm freed and the MLP's products dropped; dh (R, D)
//                   through the attention's backward; h freed; the layer below's offloaded stash
//                   fetched; the input norm's backward; dh freed and the layer's input dropped.
//   embed_backward  nothing new; dx is freed when run returns.
// Each part acquires its unit and prefetches the next in order of use, and takes a unit's
// gradient buffers (ZeRO-3 allocates them) just before it first writes them.
StepLoss Decoder::run(std::span<const int32_t> tokens, ParamSource& p, const LossSpec& spec) {
  const int64_t s = cfg_.seq_len, d = m_.hidden_size;
  UPIPE_CHECK(int64_t(tokens.size()) == s, "{} tokens for a sequence of {}", tokens.size(), s);
  UPIPE_CHECK(spec.group.empty() || int64_t(spec.group.size()) == s,
              "{} group flags for a sequence of {}", spec.group.size(), s);
  strat_->set_documents(spec.documents);
  const RowPositions pos = strat_->layout().positions(cp_.rank());
  const int64_t rows = pos.total_rows();
  const int nl = m_.num_hidden_layers;
  Arena& mem = dev_.mem();

  const double t0 = now();
  Tensor x(mem, Tag::kAct, cfg_.residual, rows, d);  // (R, D) the residual stream
  embed(x, tokens, pos, p);
  Stash stash(dev_, cfg_.stash,
              {nl, rows, d, m_.intermediate_size, cfg_.compute, cfg_.mlp.tile_tokens});
  Tensor h(mem, Tag::kAct, cfg_.compute, rows, d);  // (R, D) a norm's output, the blocks' input
  for (int l = 0; l < nl; ++l) layer_forward(x, h, &stash, l, p);
  stash.wait_saves();  // the writes after each save waited on its copies: none should be left
  HeadLoss head = head_loss(h, x, tokens, pos, spec, p);
  const double t1 = now();
  fwd_s_ = t1 - t0;

  h.reset();
  Tensor dx(mem, Tag::kAct, cfg_.residual, rows, d);  // (R, D) d loss / d residual stream
  head_backward(dx, x, head, p);
  stash.fetch(nl - 1);  // offloaded: the last layer's stash into device slots
  for (int l = nl - 1; l >= 0; --l) layer_backward(dx, stash, l, p);
  embed_backward(dx, head, tokens, pos, p);
  dev_.backend().sync(Stream{});  // a GPU queues the work: time it finished
  bwd_s_ = now() - t1;
  return sum_over_ranks(cp_, head.loss);
}

// x (R, D) residual dtype = the embedding's rows of this rank's tokens.
void Decoder::embed(const Mat& x, std::span<const int32_t> tokens, const RowPositions& pos,
                    ParamSource& p) {
  const Mat e = embedding(m_, p.acquire(embed_unit()));  // (V, D)
  p.prefetch(layer_unit(0));
  gather_rows(dev_, x, e, row_tokens(tokens, pos));
  p.release(embed_unit());
}

// x (R, D) residual dtype += attention(norm(x)), then += MLP(norm(x)); h (R, D) compute dtype:
// each norm's output. The stash saves what the granularity keeps.
void Decoder::layer_forward(const Mat& x, const Mat& h, Stash* stash, int l, ParamSource& p) {
  const LayerWeights w = layer_weights(m_, l, p.acquire(layer_unit(l)));
  p.prefetch(l + 1 < m_.num_hidden_layers ? layer_unit(l + 1) : head_unit(m_));
  if (stash) stash->save_input(l, x);
  rmsnorm_forward(dev_, x, w.input_norm, cfg_.eps, h);
  // The attention's output projection and the MLP's tiles add into x: each waits for the stash's
  // copies of the rows it writes (offloaded), so the copies run beside the work before them.
  {
    const OutputFence fenced(*strat_, stash);
    if (stash && stash->keeps_intermediates())
      stash->keep_attention(l, strat_->forward_stash(h, w.attn, x, 1.0f));
    else
      strat_->forward(h, w.attn, x, 1.0f);
  }
  if (stash && stash->keeps_mlp_input()) stash->save_mlp_input(l, x);
  rmsnorm_forward(dev_, x, w.post_attn_norm, cfg_.eps, h);
  mlp_forward(dev_, cfg_.mlp, h, w.mlp, x, 1.0f, stash ? stash->keep_mlp(l) : nullptr, stash);
  p.release(layer_unit(l));
}

StepLoss Decoder::loss(std::span<const int32_t> tokens, ParamSource& p, const LossSpec& spec) {
  const int64_t s = cfg_.seq_len, d = m_.hidden_size;
  UPIPE_CHECK(int64_t(tokens.size()) == s, "{} tokens for a sequence of {}", tokens.size(), s);
  UPIPE_CHECK(spec.group.empty() || int64_t(spec.group.size()) == s,
              "{} group flags for a sequence of {}", spec.group.size(), s);
  strat_->set_documents(spec.documents);
  const RowPositions pos = strat_->layout().positions(cp_.rank());
  const int64_t rows = pos.total_rows();
  const double t0 = now();
  Tensor x(dev_.mem(), Tag::kAct, cfg_.residual, rows, d);  // (R, D) the residual stream
  embed(x, tokens, pos, p);
  Tensor h(dev_.mem(), Tag::kAct, cfg_.compute, rows, d);  // (R, D) a norm's output
  for (int l = 0; l < m_.num_hidden_layers; ++l) layer_forward(x, h, nullptr, l, p);
  // The head: the final norm and the loss, nothing kept for a backward.
  const bool tied = m_.tie_word_embeddings;
  const int ue = embed_unit(), uh = head_unit(m_);
  const ParamViews& wh = p.acquire(uh);
  if (tied) p.prefetch(ue);
  const HeadParams w = head_params(m_, wh, tied ? &p.acquire(ue) : nullptr);
  rmsnorm_forward(dev_, x, w.final_norm, cfg_.eps, h);
  std::vector<int32_t> labels;  // (R) on the host
  std::vector<uint8_t> group;   // (R) on the host, with a group
  next_token_labels(labels, group, tokens, pos, spec);
  const double scale = loss_scale(spec, cfg_.seq_len);
  StepLoss out;
  out.loss = lm_loss_value(dev_, cfg_.loss, h, w.lm_head, labels, float(scale), group,
                           group.empty() ? nullptr : &out.group_sum);
  if (tied) p.release(ue);
  p.release(uh);
  fwd_s_ = now() - t0;
  bwd_s_ = 0;
  return sum_over_ranks(cp_, out);
}

// h (R, D) compute dtype = the final norm of x (R, D); the fused LM head and loss, whose labels
// are the next global position's tokens. Returns this rank's loss and dh; the head's unit stays
// acquired (and a tied embedding's gradient held) for head_backward and embed_backward.
Decoder::HeadLoss Decoder::head_loss(const Mat& h, const Mat& x, std::span<const int32_t> tokens,
                                     const RowPositions& pos, const LossSpec& spec,
                                     ParamSource& p) {
  const bool tied = m_.tie_word_embeddings;
  const int ue = embed_unit(), uh = head_unit(m_);
  HeadLoss out;
  const ParamViews& wh = p.acquire(uh);
  if (tied) p.prefetch(ue);
  out.w = head_params(m_, wh, tied ? &p.acquire(ue) : nullptr);
  p.prefetch(layer_unit(m_.num_hidden_layers - 1));  // the backward's first unit
  rmsnorm_forward(dev_, x, out.w.final_norm, cfg_.eps, h);
  std::vector<int32_t> labels;  // (R) on the host
  std::vector<uint8_t> group;   // (R) on the host, with a group
  next_token_labels(labels, group, tokens, pos, spec);
  out.dh = Tensor(dev_.mem(), Tag::kAct, cfg_.residual, x.rows, x.cols);
  const ParamViews& gh = p.grads(uh);
  // A tied head's gradient and the embedding's rows both add into the embedding's gradient.
  out.g = head_params(m_, gh, tied ? &p.grads(ue) : nullptr);
  if (tied) zero(dev_, out.g.lm_head);
  const double scale = loss_scale(spec, cfg_.seq_len);
  out.loss.loss =
      lm_loss(dev_, cfg_.loss, h, out.w.lm_head, labels, float(scale), out.dh, out.g.lm_head,
              tied ? 1.0f : 0.0f, group, group.empty() ? nullptr : &out.loss.group_sum);
  if (tied) p.release(ue);
  return out;
}

// dx (R, D) residual dtype = the final norm's backward of head.dh; frees x (the backward rebuilds
// each layer's residual from the stash) and dh, and hands the head's unit back.
void Decoder::head_backward(const Mat& dx, Tensor& x, HeadLoss& head, ParamSource& p) {
  zero(dev_, head.g.final_norm);
  rmsnorm_backward(dev_, x, head.w.final_norm, cfg_.eps, head.dh, dx, head.g.final_norm);
  x.reset();
  head.dh.reset();
  p.release(head_unit(m_));
  p.grads_done(head_unit(m_));
}

// dx (R, D) residual dtype: d loss / d (the layer's output) in, d loss / d (its input) out. The
// layer is recomputed from the stash; each (R, D) buffer lives only while it is needed, so the
// attention phases hold three (dx, h, and xm in the forward recompute or dh in the backward)
// besides the stash, and the MLP phase runs in (T, D) tiles. The layer below's offloaded stash is
// fetched once this layer's attention backward is done, so one slot is held through it (on a
// device with asynchronous copies the fetch overlaps the input norm's backward).
void Decoder::layer_backward(const Mat& dx, Stash& stash, int l, ParamSource& p) {
  const LayerWeights w = layer_weights(m_, l, p.acquire(layer_unit(l)));
  if (l > 0) p.prefetch(layer_unit(l - 1));
  const Mat x = stash.input(l);  // (R, D) stash dtype: the layer's input
  Arena& mem = dev_.mem();
  Tensor h(mem, Tag::kAct, cfg_.compute, x.rows, x.cols);  // (R, D) the attention's input
  rmsnorm_forward(dev_, x, w.input_norm, cfg_.eps, h);
  Tensor xm(mem, Tag::kAct, cfg_.residual, x.rows, x.cols);  // (R, D) the MLP's input residual
  std::unique_ptr<AttentionStash> attn = rebuild_mlp_input(xm, h, x, w.attn, stash, l);
  const LayerGrads g = layer_grads(m_, l, p.grads(layer_unit(l)));
  zero(dev_, g.post_attn_norm);
  zero(dev_, g.input_norm);
  mlp_backward_tiled(dx, xm, w, g, stash.mlp(l));
  xm.reset();
  stash.drop_mlp(l);
  Tensor dh(mem, Tag::kAct, cfg_.residual, x.rows, x.cols);  // (R, D) d loss / dh
  if (attn)
    strat_->backward_stashed(std::move(attn), h, dx, w.attn, dh, g.attn, 0.0f, 0.0f);
  else
    strat_->backward(h, dx, w.attn, dh, g.attn, 0.0f, 0.0f);
  h.reset();
  if (l > 0) stash.fetch(l - 1);
  rmsnorm_backward(dev_, x, w.input_norm, cfg_.eps, dh, dh, g.input_norm);
  add_into(dev_, dx, dh);
  dh.reset();
  stash.drop_input(l);
  p.release(layer_unit(l));
  p.grads_done(layer_unit(l));
}

// xm (R, D) residual dtype = the residual between the layer's attention and its MLP: the stash's
// copy (per block and none; the stash drops it), or x plus the attention forward of h (R, D) run
// again (per layer). Returns the attention's intermediates for its backward when kept: the
// forward's (none), or the recompute's when the strategy can keep them, so its backward does
// not recompute them a second time.
std::unique_ptr<AttentionStash> Decoder::rebuild_mlp_input(const Mat& xm, const Mat& h,
                                                           const Mat& x, const AttentionWeights& w,
                                                           Stash& stash, int l) {
  if (stash.keeps_mlp_input()) {
    copy(dev_, xm, stash.mlp_input(l));
    stash.drop_mlp_input(l);
    return stash.take_attention(l);
  }
  copy(dev_, xm, x);
  return strat_->forward_stash(h, w, xm, 1.0f);
}

// dx (R, D) residual dtype += the MLP block's backward through the post-attention norm, T rows of
// xm (R, D) at a time: h2 (n, D) the norm of the tile's rows, g2 (n, D) its gradient (tag mlp).
// g's MLP and post-attention norm gradients sum over the tiles. kept: the MLP's stashed products.
void Decoder::mlp_backward_tiled(const Mat& dx, const Mat& xm, const LayerWeights& w,
                                 const LayerGrads& g, const MlpStash* kept) {
  const int64_t rows = xm.rows, d = xm.cols, tile = std::min(cfg_.mlp.tile_tokens, rows);
  for (int64_t r0 = 0; r0 < rows; r0 += tile) {
    const int64_t n = std::min(tile, rows - r0);
    const Mat xt = xm.rows_of(r0, n), dxt = dx.rows_of(r0, n);
    Tensor g2(dev_.mem(), Tag::kMlp, cfg_.residual, n, d);  // (n, D) d loss / d h2, then / d xt
    {
      Tensor h2(dev_.mem(), Tag::kMlp, cfg_.compute, n, d);  // (n, D) the norm of xt
      rmsnorm_forward(dev_, xt, w.post_attn_norm, cfg_.eps, h2);
      const MlpStash kt = kept ? kept->rows_of(r0, n) : MlpStash{};
      mlp_backward(dev_, cfg_.mlp, h2, dxt, w.mlp, g2, g.mlp, 0.0f, r0 == 0 ? 0.0f : 1.0f,
                   kept ? &kt : nullptr);
    }
    rmsnorm_backward(dev_, xt, w.post_attn_norm, cfg_.eps, g2, g2, g.post_attn_norm);
    add_into(dev_, dxt, g2);
  }
}

// The embedding's gradient += each row of dx (R, D) at its token's row: a tied model's is the LM
// head's, already held by head_loss; else the embedding unit's is taken here.
void Decoder::embed_backward(const Mat& dx, const HeadLoss& head, std::span<const int32_t> tokens,
                             const RowPositions& pos, ParamSource& p) {
  Mat g = head.g.lm_head;  // (V, D) fp32
  if (!m_.tie_word_embeddings) {
    g = embedding(m_, p.grads(embed_unit()));
    zero(dev_, g);
  }
  scatter_add_rows(dev_, g, dx, row_tokens(tokens, pos));
  p.grads_done(embed_unit());
}

}  // namespace upipe
