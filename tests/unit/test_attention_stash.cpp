// The keeping variant of an attention block (forward_stash / backward_stashed, used by the model's
// --checkpoint-granularity none): for `local` it computes the same bits as the self-checkpointing
// forward + backward (it only skips the recompute), overwriting and accumulating, fp32 and bf16,
// with QK-norm and llama3 RoPE. The byte counts, and the fallback of a strategy that cannot keep
// (it keeps nothing and recomputes), are checked on the meta device (test_meta).
#include <gtest/gtest.h>

#include <cstring>

#include "attention/harness.h"
#include "attention/methods.h"
#include "comm/fake/fake_comm.h"
#include "multirank/strategy_cases.h"

namespace upipe {
namespace {

// Empty tensors (the QK-norm gradients without QK-norm) have no data to compare.
bool same_bits(const Tensor& a, const Tensor& b) {
  if (a.bytes() != b.bytes()) return false;
  return a.bytes() == 0 || std::memcmp(a.data(), b.data(), size_t(a.bytes())) == 0;
}

void expect_same(const BlockTensors& a, const BlockTensors& b, const std::string& what) {
  EXPECT_TRUE(same_bits(a.y, b.y)) << what << ": y";
  EXPECT_TRUE(same_bits(a.dx, b.dx)) << what << ": dx";
  const Tensor* ga[] = {&a.gq, &a.gk, &a.gv, &a.go, &a.gqn, &a.gkn};
  const Tensor* gb[] = {&b.gq, &b.gk, &b.gv, &b.go, &b.gqn, &b.gkn};
  for (size_t i = 0; i < 6; ++i) EXPECT_TRUE(same_bits(*ga[i], *gb[i])) << what << ": grad " << i;
}

// Every case of the 1-rank table whose strategy keeps, on the CPU: keep and recompute give the
// same bits; a second, accumulating run too.
TEST(AttentionKeep, SameBitsAsRecomputing) {
  int kept = 0;
  for (const test::StrategyCase& sc : test::strategy_cases(1)) {
    if (sc.method() != "local") continue;
    Device dev({BackendKind::kCpu, int64_t(1) << 28, int64_t(1) << 26});
    FakeCommunicator comm(0, 1);
    auto s = make_strategy({dev, comm, sc.cfg});
    const RowPositions rows = s->layout().positions(0);
    BlockTensors a = make_block_tensors(dev, sc.cfg, rows, 3);
    BlockTensors b = make_block_tensors(dev, sc.cfg, rows, 3);
    for (bool accumulate : {false, true}) {
      run_block(*s, dev, a, accumulate, false);
      const int64_t before = dev.mem().current();
      run_block(*s, dev, b, accumulate, true);
      EXPECT_EQ(dev.mem().current(), before) << sc.name << ": the kept intermediates are freed";
      expect_same(a, b, sc.name + (accumulate ? " accumulate" : ""));
    }
    ASSERT_TRUE(s->can_stash()) << sc.name;
    ++kept;
  }
  EXPECT_GT(kept, 2);  // MHA and GQA shapes, QK-norm, bf16
}

}  // namespace
}  // namespace upipe
