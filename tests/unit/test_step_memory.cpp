// The decoder step's closed-form bytes (unit/step_memory.h, docs/model.md) equal what the step
// allocates: a meta-device step (the same code as a real run, test_model_meta) peaks at exactly
// the formula's bytes, and its checkpoint, activation, parameter and gradient tags peak at the
// formula's, in two sets of configurations:
//   - a grid: rank 0 and the last rank of C = 1, 2, 4, fp32 and bf16 (with an fp32 or a bf16
//     residual stream), fp32 or bf16 checkpoints, with and without offloaded checkpoints, per
//     layer, per block and none, Llama (untied) and Qwen3 (QK-norm, tied) shapes, T not
//     dividing S/C and T = S, a vocabulary of 4096;
//   - one configuration per moment of the formula that makes that moment the largest, strictly
//     (so a moment dropped from the formula, or a term dropped from it, changes the peak there):
//     the test fails if a moment has no such configuration. The shapes that do it are extreme:
//     a hidden size far above H d (the norms' (1, D) workspaces and the (S/C, D) buffers against
//     small attention intermediates), a handful of rows per rank (the kernels' fixed tile
//     workspaces against the (S/C, D) buffers), one-row tiles, a wide head (d = 128: local's
//     forward workspace above its backward's).
// The GEMM workspaces (oneDNN's scratchpads) grow with the thread count, so which moment is the
// largest depends on it: the rows are for one thread per rank, as ctest runs them (they also
// hold with two). One moment never binds: the forward's last MLP. Its norm term is the last layer's
// start's with fewer (or as many) checkpoints, and its MLP term is below the MLP backward's on this
// backend (the backward's tiles include the forward's, plus the fp32 da, db); the test checks in
// every configuration that it is at most the largest of those moments and of the LM head's.
#include <gtest/gtest.h>

#include "comm/fake/fake_comm.h"
#include "model/decoder.h"
#include "unit/step_memory.h"

namespace upipe {
namespace {

std::vector<std::string> methods(int c) {
  if (c == 1) return {"local", "upipe", "fpdt"};
  return {"ulysses", "upipe", "ring", "usp", "fpdt", "upipe-fpdt"};
}

// The meta step of `opt` as rank `rank` of `c` against the formula; returns the formula.
DecoderStepBytes check_meta_step(const ModelConfig& m, const DecoderOptions& opt, int rank, int c,
                                 const std::string& what) {
  const int64_t s = opt.seq_len;
  std::vector<int32_t> tokens(static_cast<size_t>(s));
  for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = int32_t((i * 37 + 11) % m.vocab_size);
  Device dev({BackendKind::kMeta, int64_t(1) << 40, int64_t(1) << 40});
  FakeCommunicator comm(rank, c);
  Decoder dec(dev, comm, m, opt);
  const ParamMap w = allocate_params(dev, m, opt.memory.dtype, Tag::kParams);
  const ParamMap g = allocate_params(dev, m, DType::kF32, Tag::kGrads);
  dev.mem().reset_peak();
  dev.host().reset_peak();
  dec.loss_and_grads(tokens, w, g);
  const DecoderStepBytes want = decoder_step_bytes(dev.backend(), m, opt, s / c, dec.strategy());
  EXPECT_EQ(dev.mem().peak(), want.peak) << what;
  EXPECT_EQ(dev.mem().peak_by_tag().v[size_t(Tag::kStash)], want.stash) << what;
  EXPECT_EQ(dev.mem().peak_by_tag().v[size_t(Tag::kAct)], want.act) << what;
  EXPECT_EQ(dev.host().peak_by_tag().v[size_t(Tag::kStash)], want.stash_host) << what;
  EXPECT_EQ(dev.mem().peak_by_tag().v[size_t(Tag::kParams)], want.params) << what;
  EXPECT_EQ(dev.mem().peak_by_tag().v[size_t(Tag::kGrads)], want.grads) << what;
  const auto& mo = want.moments;
  auto at = [&](StepMoment x) { return mo[size_t(x)]; };
  EXPECT_LE(
      at(StepMoment::kForwardLastMlp),
      std::max({at(StepMoment::kLossHead), at(StepMoment::kLayerStartNorm), at(StepMoment::kMlp)}))
      << what << ": the forward's last MLP binds; give it a row in kMomentCases";
  return want;
}

// The moment that is strictly the largest, or -1 on a tie.
int binding_moment(const DecoderStepBytes& b) {
  int best = 0, ties = 0;
  for (int i = 1; i < kNumStepMoments; ++i) {
    if (b.moments[size_t(i)] > b.moments[size_t(best)]) {
      best = i;
      ties = 0;
    } else if (b.moments[size_t(i)] == b.moments[size_t(best)]) {
      ++ties;
    }
  }
  return ties ? -1 : best;
}

TEST(StepMemory, MetaStepPeaksAtTheClosedForm) {
  const int64_t s = 384;
  int checked = 0;
  // A vocabulary of 4096 makes the LM head's (T, V) tile the peak when T is large.
  for (const char* preset : {"tiny", "tiny-qwen3", "tiny V=4096"}) {
    ModelConfig m = load_model_config(std::string(preset).substr(0, std::string(preset).find(' ')));
    if (std::string(preset).find("V=") != std::string::npos) m.vocab_size = 4096;
    for (int c : {1, 2, 4})
      for (int rank : {0, c - 1})
        for (const std::string& method : methods(c))
          for (DType t : {DType::kF32, DType::kBF16})
            for (int64_t tile : {40, 384})
              for (bool offload : {false, true})
                for (DType ct : {DType::kF32, DType::kBF16})
                  for (DType rt : {DType::kF32, DType::kBF16})
                    for (Recompute cg : {Recompute::kLayer, Recompute::kBlock, Recompute::kNone}) {
                      if (rt != DType::kF32 && rt != t) continue;  // fp32 or the compute dtype
                      DecoderOptions opt;
                      opt.memory.recompute = cg;
                      opt.memory.residual_dtype = rt;
                      opt.memory.stash_dtype = ct;
                      opt.knobs.method = method;
                      opt.seq_len = s;
                      opt.memory.dtype = t;
                      opt.memory.tile_tokens = tile;
                      opt.memory.offload_stash = offload;
                      const std::string what =
                          std::string(preset) + " " + method + " " + dtype_name(t) +
                          (offload ? " offload" : "") + " stash " + dtype_name(ct) + " residual " +
                          dtype_name(rt) + " per " + recompute_name(cg) + " rank " +
                          std::to_string(rank) + " of " + std::to_string(c);
                      check_meta_step(m, opt, rank, c, what);
                      ++checked;
                    }
  }
  // residual: fp32, or bf16 with bf16 compute; checkpoints per layer, per block or none.
  EXPECT_EQ(checked, 3 * (2 * 3 + 2 * 2 * 6) * 16 * 3 / 2 * 3);
}

// A configuration and the moment it makes the largest.
struct MomentCase {
  StepMoment binds;
  int64_t hidden, intermediate, vocab;
  int layers, head_dim;
  int64_t seq_len;
  int ranks;
  const char* method;
  DType dtype;
  int64_t tile;
  bool offload;
  DType ckpt, residual;
  Recompute granularity;
};

constexpr DType F32 = DType::kF32, BF16 = DType::kBF16;
constexpr auto kLayer = Recompute::kLayer, kBlock = Recompute::kBlock, kNone = Recompute::kNone;

// On the tiny Llama (H = 4, K = 2) with the hidden size D, the MLP width F, the vocabulary V,
// the layers L and the head dim d as listed.
const MomentCase kMomentCases[] = {
    // The (T, V) logits tile of V = 65536 against 2 rows of D = 64 per rank.
    {StepMoment::kLossHead, 64, 16, 65536, 1, 16, 4, 2, "upipe", F32, 2, false, F32, F32, kLayer},
    // D = 1024 >> H d = 64, bf16 compute with the fp32 residual: x, dh, dx (three fp32 (R, D))
    // outweigh two and a bf16 h anywhere else; per block with fp32 checkpoints on the device.
    {StepMoment::kLossNormBackward, 1024, 16, 256, 1, 16, 768, 2, "upipe", BF16, 1, false, F32, F32,
     kBlock},
    // D = 32768 on 2 rows per rank: the norm's 12 D-byte workspace exceeds a bf16 (R, D) buffer
    // (the xm moment's), and the offloaded layer's two fp32 checkpoint slots are on the device.
    {StepMoment::kLayerStartNorm, 32768, 16, 256, 1, 16, 4, 2, "ring", BF16, 1, true, F32, BF16,
     kBlock},
    // D = 1024 >> H d, offloaded per block: the start holds the layer's two fp32 checkpoint
    // slots beside dx, h and xm, the loss none.
    {StepMoment::kLayerStartXm, 1024, 16, 256, 1, 16, 384, 2, "upipe", BF16, 1, true, F32, F32,
     kBlock},
    // 2 rows per rank of D = 64: the attention kernels' tile workspaces dominate.
    {StepMoment::kAttention, 64, 16, 256, 1, 16, 4, 2, "upipe", F32, 1, false, F32, F32, kLayer},
    // F = 16384: the MLP's (T, F) tiles.
    {StepMoment::kMlp, 64, 16384, 256, 1, 16, 4, 2, "upipe", F32, 2, false, F32, F32, kLayer},
    // local per layer keeps the recompute's intermediates; d = 128 makes its forward workspace
    // (768 x 512 tiles) larger than its backward's (96 x 256).
    {StepMoment::kRecomputeAttention, 64, 16, 256, 1, 128, 4, 1, "local", F32, 1, false, F32, F32,
     kLayer},
    // D = 1024 >> H d, two layers offloaded per block: after the last layer's attention backward
    // the next layer's two fp32 slots arrive beside dx, dh and the norm's workspace.
    {StepMoment::kInputNormBackward, 1024, 16, 256, 2, 16, 384, 2, "upipe", BF16, 1, true, F32, F32,
     kBlock},
    // local with none keeps every layer's intermediates from the forward; d = 128 as above.
    {StepMoment::kKeptForwardAttention, 64, 16, 256, 1, 128, 4, 1, "local", F32, 1, false, F32, F32,
     kNone},
};

TEST(StepMemory, EveryMomentBindsSomewhere) {
  std::vector<int> rows(kNumStepMoments, 0);
  for (const MomentCase& mc : kMomentCases) {
    ModelConfig m = load_model_config("tiny");
    m.hidden_size = mc.hidden;
    m.intermediate_size = mc.intermediate;
    m.vocab_size = mc.vocab;
    m.num_hidden_layers = mc.layers;
    m.head_dim = mc.head_dim;
    DecoderOptions opt;
    opt.knobs.method = mc.method;
    opt.seq_len = mc.seq_len;
    opt.memory.dtype = mc.dtype;
    opt.memory.tile_tokens = mc.tile;
    opt.memory.offload_stash = mc.offload;
    opt.memory.stash_dtype = mc.ckpt;
    opt.memory.residual_dtype = mc.residual;
    opt.memory.recompute = mc.granularity;
    for (int rank : {0, mc.ranks - 1}) {
      const std::string what =
          fmt::format("row for {}, rank {} of {}", step_moment_name(mc.binds), rank, mc.ranks);
      const DecoderStepBytes b = check_meta_step(m, opt, rank, mc.ranks, what);
      const int got = binding_moment(b);
      EXPECT_EQ(got, int(mc.binds))
          << what << ": the largest is " << (got < 0 ? "a tie" : step_moment_name(StepMoment(got)));
    }
    ++rows[size_t(mc.binds)];
  }
  for (int i = 0; i < kNumStepMoments; ++i)
    if (StepMoment(i) != StepMoment::kForwardLastMlp) {
      EXPECT_GT(rows[size_t(i)], 0)
          << "no configuration makes " << step_moment_name(StepMoment(i)) << " the largest";
    }
}

}  // namespace
}  // namespace upipe
