// The planner property: a strategy run on the meta device (no data, fake communicator playing
// one rank of C) allocates exactly what the documented formula says and makes exactly the
// documented collective calls, for every configuration of the multi-rank table, C = 1..8 —
// so the formulas hold at sizes no test can run for real.
#include <gtest/gtest.h>

#include <algorithm>

#include "attention/harness.h"
#include "attention/methods.h"
#include "comm/fake/fake_comm.h"
#include "multirank/strategy_cases.h"

namespace upipe {
namespace {

void check_meta(const test::StrategyCase& sc, int c, int64_t seq_len) {
  AttentionConfig cfg = sc.cfg;
  cfg.seq_len = seq_len;
  for (int rank : {0, c - 1}) {
    Device dev({BackendKind::kMeta, int64_t(1) << 50, int64_t(1) << 50});
    FakeCommunicator comm(rank, c);
    auto s = make_strategy({dev, comm, cfg});
    BlockTensors t = make_block_tensors(dev, cfg, s->layout().positions(rank), 1);
    const BlockRun r = run_block(*s, dev, t);
    EXPECT_EQ(r.attn_peak_bytes, s->attn_formula_bytes())
        << sc.name << " C=" << c << " rank " << rank;
    ASSERT_TRUE(s->comm_expected().has_value());
    for (int op = 0; op < kNumCommOps; ++op) {
      EXPECT_EQ(comm.stats().calls[size_t(op)], s->comm_expected()->calls[size_t(op)]) << sc.name;
      EXPECT_EQ(comm.stats().bytes_sent[size_t(op)], s->comm_expected()->bytes_sent[size_t(op)])
          << sc.name;
    }
    // The keeping variant: its forward and backward peaks (a strategy that cannot keep keeps
    // nothing and recomputes: its usual peak), and nothing left once it is done.
    const int64_t before = dev.mem().current();
    const BlockRun k = run_block(*s, dev, t, false, true);
    const StashedAttentionBytes kb = s->stash_formula_bytes();
    EXPECT_EQ(k.attn_peak_bytes,
              s->can_stash() ? std::max(kb.forward, kb.backward) : s->attn_formula_bytes())
        << sc.name << " keep";
    EXPECT_EQ(kb.kept > 0, s->can_stash()) << sc.name;
    if (s->can_stash()) {  // forward_stash and backward_stashed each peak at their own formula
      int watch = dev.mem().start_watch(kAttnIntermediateTags);
      std::unique_ptr<AttentionStash> kept = s->forward_stash(t.x, t.weights(), t.y, 0.0f);
      EXPECT_EQ(dev.mem().watch_peak(watch), kb.forward) << sc.name << " forward_keep";
      EXPECT_EQ(dev.mem().current(), before + kb.kept) << sc.name << " kept";
      dev.mem().stop_watch(watch);
      watch = dev.mem().start_watch(kAttnIntermediateTags);
      s->backward_stashed(std::move(kept), t.x, t.dy, t.weights(), t.dx, t.grads(), 0.0f, 0.0f);
      EXPECT_EQ(dev.mem().watch_peak(watch), kb.backward) << sc.name << " backward_kept";
      EXPECT_EQ(dev.mem().current(), before) << sc.name << " backward_kept";
      dev.mem().stop_watch(watch);
    }
    EXPECT_EQ(dev.mem().current(), before) << sc.name << " keep";
  }
}

TEST(Meta, FormulasAndCommunicationHoldOnTheMetaDevice) {
  for (int c : {1, 2, 3, 4, 8})
    for (const test::StrategyCase& sc : test::strategy_cases(c)) check_meta(sc, c, sc.cfg.seq_len);
}

TEST(Meta, MillionTokenUpipeLlama8bShape) {
  // Llama-3-8B attention (H=32, K=8, d=128), 1M tokens, 8 ranks, bf16: nothing is backed, so
  // this runs in milliseconds and still checks the formula at full scale.
  test::StrategyCase sc{{}, "llama8b_1M"};
  sc.cfg.knobs = {"upipe"};
  sc.cfg.heads = 32;
  sc.cfg.kv_heads = 8;
  sc.cfg.head_dim = 128;
  sc.cfg.dtype = DType::kBF16;
  check_meta(sc, 8, int64_t(1) << 20);
  sc.cfg.knobs = {"ulysses"};
  check_meta(sc, 8, int64_t(1) << 20);
  sc.cfg.knobs = {"ring"};
  check_meta(sc, 8, int64_t(1) << 20);
  sc.cfg.knobs = {"usp", 0, 4};
  check_meta(sc, 8, int64_t(1) << 20);
  sc.cfg.knobs = {"upipe-ring", 4, 4};
  check_meta(sc, 8, int64_t(1) << 20);
}

}  // namespace
}  // namespace upipe
