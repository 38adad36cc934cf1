// The decoder step's closed-form bytes (unit/step_memory.h, docs/model.md) equal what the step
// allocates: a meta-device step (the same code as a real run, test_model_meta) as rank 0 and the
// last rank of C = 1, 2, 4 peaks at exactly the formula's bytes, and its checkpoint and
// activation tags peak at the formula's ckpt and act, for fp32 and bf16 (with an fp32 or a bf16
// residual stream), fp32 or bf16 checkpoints, with and without
// offloaded checkpoints, Llama (untied) and Qwen3 (QK-norm, tied) shapes, T not dividing S/C
// and T = S (the MLP's or the LM head's tile sets the peak), so the loss, attention and MLP
// phases of the formula each bind somewhere (the forward's last MLP, the last layer's start, the
// input norm's backward and the loss's second moment are real moments that no configuration here
// makes the largest).
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

TEST(StepMemory, MetaStepPeaksAtTheClosedForm) {
  const int64_t s = 384;
  std::vector<int32_t> tokens(static_cast<size_t>(s));
  int checked = 0;
  // A vocabulary of 4096 makes the LM head's (T, V) tile the peak when T is large.
  for (const char* preset : {"tiny", "tiny-qwen3", "tiny V=4096"}) {
    ModelConfig m = load_model_config(std::string(preset).substr(0, std::string(preset).find(' ')));
    if (std::string(preset).find("V=") != std::string::npos) m.vocab_size = 4096;
    for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = int32_t((i * 37 + 11) % m.vocab_size);
    for (int c : {1, 2, 4})
      for (int rank : {0, c - 1})
        for (const std::string& method : methods(c))
          for (DType t : {DType::kF32, DType::kBF16})
            for (int64_t tile : {40, 384})
              for (bool offload : {false, true})
                for (DType ct : {DType::kF32, DType::kBF16})
                  for (DType rt : {DType::kF32, DType::kBF16})
                    for (Recompute cg :
                         {Recompute::kLayer, Recompute::kBlock,
                          Recompute::kNone}) {
                if (rt != DType::kF32 && rt != t) continue;  // fp32 or the compute dtype
                DecoderOptions opt;
                opt.recompute = cg;
                opt.residual_dtype = rt;
                opt.stash_dtype = ct;
                opt.method = method;
                opt.attn.seq_len = s;
                opt.attn.dtype = t;
                opt.tile_tokens = tile;
                opt.offload_stash = offload;
                Device dev({BackendKind::kMeta, int64_t(1) << 40, int64_t(1) << 40});
                FakeCommunicator comm(rank, c);
                Decoder dec(dev, comm, m, opt);
                const ParamMap w = allocate_params(dev, m, t, Tag::kParams);
                const ParamMap g = allocate_params(dev, m, DType::kF32, Tag::kGrads);
                dev.mem().reset_peak();
                dev.host().reset_peak();
                dec.loss_and_grads(tokens, w, g);
                const DecoderStepBytes want = decoder_step_bytes(
                    dev.backend(), m, opt, s / c, dec.strategy());
                const std::string what = std::string(preset) + " " + method + " " + dtype_name(t) +
                                         (offload ? " offload" : "") + " ckpt " +
                                         dtype_name(ct) + " residual " + dtype_name(rt) + " per " +
                                         recompute_name(cg) + " rank " +
                                         std::to_string(rank) + " of " + std::to_string(c);
                EXPECT_EQ(dev.mem().peak(), want.peak) << what;
                EXPECT_EQ(dev.mem().peak_by_tag().v[size_t(Tag::kStash)], want.stash) << what;
                EXPECT_EQ(dev.mem().peak_by_tag().v[size_t(Tag::kAct)], want.act) << what;
                EXPECT_EQ(dev.host().peak_by_tag().v[size_t(Tag::kStash)], want.stash_host) << what;
                EXPECT_EQ(dev.mem().peak_by_tag().v[size_t(Tag::kParams)], want.params) << what;
                EXPECT_EQ(dev.mem().peak_by_tag().v[size_t(Tag::kGrads)], want.grads) << what;
                ++checked;
              }
  }
  // residual: fp32, or bf16 with bf16 compute; checkpoints per layer, per block or none.
  EXPECT_EQ(checked, 3 * (2 * 3 + 2 * 2 * 6) * 16 * 3 / 2 * 3);
}

}  // namespace
}  // namespace upipe
