// fpdt / upipe-fpdt memory properties on the meta device (one process plays one rank of C): the
// host (offload) arena holds exactly the documented bytes, and the device-side attention
// intermediates scale with the chunk length S/N and with U, not with S or H — checked at
// Llama-3-8B scale, where no test could run for real. Correctness against `local` is in the
// multi-rank strategy table.
#include <gtest/gtest.h>

#include "attention/harness.h"
#include "attention/methods.h"
#include "comm/fake/fake_comm.h"
#include "multirank/strategy_cases.h"

namespace upipe {
namespace {

struct Measured {
  int64_t attn = 0, attn_formula = 0;  // device attention intermediates
  int64_t host = 0, host_formula = 0;  // host arena (offloaded K/V, dK/dV)
};

Measured run_meta(const AttentionConfig& cfg, int c, int rank) {
  Device dev({BackendKind::kMeta, int64_t(1) << 50, int64_t(1) << 50});
  FakeCommunicator comm(rank, c);
  auto s = make_strategy({dev, comm, cfg});
  BlockTensors t = make_block_tensors(dev, cfg, s->layout().positions(rank), 1);
  dev.host().reset_peak();
  const BlockRun r = run_block(*s, dev, t);
  return {r.attn_peak_bytes, s->attn_formula_bytes(), dev.host().peak(), s->host_formula_bytes()};
}

// Llama-3-8B attention: H = 32, K = 8, d = 128, bf16.
AttentionConfig llama8b(const std::string& method, int64_t seq_len, int chunks, int stage_heads) {
  AttentionConfig cfg;
  cfg.seq_len = seq_len;
  cfg.heads = 32;
  cfg.kv_heads = 8;
  cfg.head_dim = 128;
  cfg.dtype = DType::kBF16;
  cfg.knobs = {method, stage_heads, 0, chunks};
  return cfg;
}

TEST(Fpdt, HostBytesMatchTheFormula) {
  int cases = 0;
  for (int c : {1, 2, 4, 8})
    for (const test::StrategyCase& sc : test::strategy_cases(c)) {
      if (sc.method() != "fpdt" && sc.method() != "upipe-fpdt") continue;
      for (int rank : {0, c - 1}) {
        const Measured m = run_meta(sc.cfg, c, rank);
        EXPECT_EQ(m.host, m.host_formula) << sc.name << " C=" << c << " rank " << rank;
        ++cases;
      }
    }
  EXPECT_GT(cases, 0);
}

TEST(Fpdt, DeviceBytesScaleWithTheChunkNotTheSequence) {
  const int c = 8;
  const int64_t s = int64_t(1) << 20;
  for (const auto& [method, u] : {std::pair<std::string, int>{"fpdt", 0}, {"upipe-fpdt", 8}}) {
    const Measured base = run_meta(llama8b(method, s, 16, u), c, 0);
    const Measured twice = run_meta(llama8b(method, 2 * s, 32, u), c, 0);
    const Measured finer = run_meta(llama8b(method, s, 32, u), c, 0);
    for (const Measured& m : {base, twice, finer}) {
      EXPECT_EQ(m.attn, m.attn_formula) << method;
      EXPECT_EQ(m.host, m.host_formula) << method;
    }
    EXPECT_EQ(twice.attn, base.attn) << method << ": same S/N, same device bytes";
    EXPECT_EQ(twice.host, 2 * base.host) << method << ": the offloaded K/V grow with S";
    EXPECT_LT(finer.attn, base.attn) << method << ": more chunks, fewer device bytes";
    EXPECT_EQ(finer.host, base.host) << method;
  }
}

TEST(Fpdt, UpipeFpdtDeviceBytesGrowWithU) {
  // C = 8, H = 32: U = 8, 16, 32 (= fpdt) give 1, 2, 4 query heads per rank per stage.
  const int64_t s = int64_t(1) << 20;
  const Measured u8 = run_meta(llama8b("upipe-fpdt", s, 16, 8), 8, 0);
  const Measured u16 = run_meta(llama8b("upipe-fpdt", s, 16, 16), 8, 0);
  const Measured fpdt = run_meta(llama8b("fpdt", s, 16, 0), 8, 0);
  EXPECT_EQ(u8.attn, u8.attn_formula);
  EXPECT_EQ(u16.attn, u16.attn_formula);
  EXPECT_LT(u8.attn, u16.attn);
  EXPECT_LT(u16.attn, fpdt.attn);
  EXPECT_EQ(u8.host, fpdt.host) << "the host holds every KV head of the rank either way";
}

}  // namespace
}  // namespace upipe
