// The device's count of executed arithmetic (backend/work_count.h): the visible pairs against a
// brute-force count, the GEMM front end's 2 m n k, and a whole decoder step on the meta device
// (the same code as a real run) against closed forms: with nothing recomputed, one rank executes
// the model FLOPs' matrix products (6 per matrix parameter per token; QK-norm adds its two
// products' recompute) and one flash forward and backward per layer; per-layer recompute adds the
// layer's rebuild; every strategy's ranks together execute that plus their block's own recompute,
// nothing more.
#include <gtest/gtest.h>

#include "backend/gemm.h"
#include "backend/tensor_ops.h"
#include "comm/fake/fake_comm.h"
#include "model/decoder.h"

namespace upipe {
namespace {

TEST(WorkCount, VisiblePairsEqualABruteForceCount) {
  int checked = 0;
  for (int64_t sq = 0; sq <= 7; ++sq)
    for (int64_t sk = 0; sk <= 7; ++sk)
      for (int64_t qp = 0; qp <= 12; ++qp)
        for (int64_t kp = 0; kp <= 12; ++kp)
          for (bool causal : {true, false}) {
            int64_t want = 0;
            for (int64_t i = 0; i < sq; ++i)
              for (int64_t j = 0; j < sk; ++j) want += !causal || kp + j <= qp + i;
            ASSERT_EQ(visible_pairs(sq, sk, qp, kp, causal), want)
                << sq << "x" << sk << " at " << qp << ", " << kp << (causal ? " causal" : "");
            ++checked;
          }
  EXPECT_EQ(checked, 8 * 8 * 13 * 13 * 2);
  // One causal sequence of S: S (S + 1) / 2, at lengths where S * S is far above 2^31.
  EXPECT_EQ(visible_pairs(int64_t(1) << 22, int64_t(1) << 22, 0, 0, true),
            (int64_t(1) << 21) * ((int64_t(1) << 22) + 1));
}

TEST(WorkCount, GemmCountsTwoMnk) {
  Device dev;
  Tensor a(dev.mem(), Tag::kWorkspace, DType::kF32, 6, 4),
      b(dev.mem(), Tag::kWorkspace, DType::kF32, 5, 4),
      c(dev.mem(), Tag::kWorkspace, DType::kF32, 6, 5),
      d(dev.mem(), Tag::kWorkspace, DType::kF32, 4, 5);
  fill(dev, a, 1.0f);
  fill(dev, b, 1.0f);
  gemm(dev, a, false, b, true, c);  // (6, 4) x (4, 5)
  EXPECT_EQ(dev.work().gemm_flops, 2.0 * 6 * 5 * 4);
  gemm(dev, a, true, c, false, d);  // (4, 6) x (6, 5)
  EXPECT_EQ(dev.work().gemm_flops, 2.0 * 6 * 5 * 4 + 2.0 * 4 * 5 * 6);
  EXPECT_EQ(dev.work().attention_flops, 0);
}

// One rank's decoder step on the meta device: what it executed.
WorkCount meta_step(const ModelConfig& m, const std::string& method, Recompute r, int rank, int c,
                    int64_t s) {
  std::vector<int32_t> tokens(static_cast<size_t>(s));
  for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = int32_t((i * 37 + 11) % m.vocab_size);
  DecoderOptions opt;
  opt.knobs.method = method;
  opt.seq_len = s;
  opt.memory.recompute = r;
  opt.memory.tile_tokens = 40;  // tiles that do not divide the rows
  Device dev({BackendKind::kMeta, int64_t(1) << 40, int64_t(1) << 40});
  FakeCommunicator comm(rank, c);
  Decoder dec(dev, comm, m, opt);
  const ParamMap w = allocate_params(dev, m, opt.memory.dtype, Tag::kParams);
  const ParamMap g = allocate_params(dev, m, DType::kF32, Tag::kGrads);
  dec.loss_and_grads(tokens, w, g);
  return dev.work();
}

// Per token, the multiply-adds of: one layer's projections and MLP; the LM head; q, k and v's
// projections; QK-norm's recompute of q and k before the norm in backward (seq_block.cpp keeps
// neither, so every strategy runs those two products again; 0 without QK-norm).
double layer_matrix_params(const ModelConfig& m) {
  return double(m.hidden_size) * double(2 * m.q_dim() + 2 * m.kv_dim() + 3 * m.intermediate_size);
}
double head_matrix_params(const ModelConfig& m) {
  return double(m.vocab_size) * double(m.hidden_size);
}
double qkv_params(const ModelConfig& m) {
  return double(m.hidden_size) * double(m.q_dim() + 2 * m.kv_dim());
}
double qk_norm_params(const ModelConfig& m) {
  return m.qk_norm ? double(m.hidden_size) * double(m.q_dim() + m.kv_dim()) : 0.0;
}

// What one rank executes alone (local) per step, from the closed forms.
struct LocalStep {
  double gemm_none, gemm_layer, attn_fwd, attn_bwd;
};
LocalStep local_step(const ModelConfig& m, int64_t s) {
  const double layers = double(m.num_hidden_layers), tokens = double(s);
  const double pairs = double(s) * double(s + 1) / 2;
  LocalStep w;
  w.attn_fwd = layers * kAttentionForwardFlopsPerPairDim * double(m.q_dim()) * pairs;
  w.attn_bwd = layers * kAttentionBackwardFlopsPerPairDim * double(m.q_dim()) * pairs;
  // The model FLOPs' matrix products, and QK-norm's two products once more in backward.
  w.gemm_none = 6 * tokens * (layers * layer_matrix_params(m) + head_matrix_params(m)) +
                2 * tokens * layers * qk_norm_params(m);
  // Per layer, backward first rebuilds the layer up to the MLP's hidden state: q, k, v, the
  // output projection and the MLP's gate and up products (not its down product).
  const double rebuilt =
      double(m.hidden_size) * double(2 * m.q_dim() + 2 * m.kv_dim() + 2 * m.intermediate_size);
  w.gemm_layer = w.gemm_none + 2 * tokens * layers * rebuilt;
  return w;
}

const char* const kPresets[] = {"tiny", "tiny-qwen3"};

TEST(WorkCount, OneRankStepExecutesTheClosedForm) {
  const int64_t s = 96;
  for (const char* preset : kPresets) {
    const ModelConfig m = load_model_config(preset);
    const LocalStep want = local_step(m, s);
    const WorkCount none = meta_step(m, "local", Recompute::kNone, 0, 1, s);
    EXPECT_EQ(none.gemm_flops, want.gemm_none) << preset;
    EXPECT_EQ(none.attention_flops, want.attn_fwd + want.attn_bwd) << preset;
    EXPECT_EQ(none.attention_uncounted, 0);
    // local keeps the layer recompute's attention intermediates for the block's backward, so its
    // attention forward runs twice per layer, not three times.
    const WorkCount layer = meta_step(m, "local", Recompute::kLayer, 0, 1, s);
    EXPECT_EQ(layer.gemm_flops, want.gemm_layer) << preset;
    EXPECT_EQ(layer.attention_flops, 2 * want.attn_fwd + want.attn_bwd) << preset;
  }
}

// The multi-rank strategies keep nothing between a block's forward and backward (strategy.h):
// with nothing else recomputed, their ranks together execute local's step plus exactly one more
// q, k, v projection and one more attention forward per layer, and nothing else twice.
TEST(WorkCount, StrategiesSplitTheWorkAndRecomputeOnlyTheirBlock) {
  const int64_t s = 96;
  int checked = 0;
  for (const char* preset : kPresets) {
    const ModelConfig m = load_model_config(preset);
    const LocalStep one = local_step(m, s);
    const double layers = double(m.num_hidden_layers);
    const double want_gemm = one.gemm_none + 2 * double(s) * layers * qkv_params(m);
    const double want_attn = 2 * one.attn_fwd + one.attn_bwd;
    for (int c : {2, 4})
      for (const char* method : {"ulysses", "upipe", "ring", "usp", "fpdt", "upipe-fpdt"}) {
        WorkCount all;
        for (int rank = 0; rank < c; ++rank) {
          const WorkCount w = meta_step(m, method, Recompute::kNone, rank, c, s);
          all.gemm_flops += w.gemm_flops;
          all.attention_flops += w.attention_flops;
          all.attention_uncounted += w.attention_uncounted;
        }
        const std::string what =
            std::string(preset) + " " + method + " on " + std::to_string(c) + " ranks";
        EXPECT_EQ(all.gemm_flops, want_gemm) << what;
        EXPECT_EQ(all.attention_flops, want_attn) << what;
        EXPECT_EQ(all.attention_uncounted, 0) << what;
        ++checked;
      }
  }
  EXPECT_EQ(checked, 2 * 2 * 6);
}

}  // namespace
}  // namespace upipe
