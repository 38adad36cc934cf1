// The training step on real ranks: DP x CP splits of the same global batch give the same
// weights, and pure DP without clipping the same as one rank; the optimizer step equals AdamW
// (clipping, bias correction, decay) recomputed in fp64; a run interrupted by a checkpoint and
// resumed (same ranks) ends bitwise equal to an uninterrupted one; a checkpoint written on fewer
// ranks loads resharded; corrupt, incomplete and mismatched checkpoints are refused with
// ConfigError.
#include <gtest/gtest.h>
#include <stdlib.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>

#include "backend/tensor_ops.h"
#include "core/errors.h"
#include "core/rng.h"
#include "model/safetensors.h"
#include "multirank/mpi_test_main.h"
#include "multirank/shared_dir.h"
#include "train/checkpoint.h"
#include "train/trainer.h"

namespace upipe {
namespace {
namespace fs = std::filesystem;

using test::SharedDir;

// Sequence `index` of the global batch of `step`: random ids, a pure function of both; packed:
// two or three documents, by the index (so the sequences' prediction counts differ).
Sequence global_sequence(int64_t step, int64_t index, int64_t s, int64_t vocab,
                         bool packed = false) {
  Sequence q;
  for (int64_t i = 0; i < s; ++i)
    q.tokens.push_back(int32_t(uniform_at(uint64_t(step * 1000 + index), uint64_t(i)) * vocab));
  if (packed) {
    const int64_t a = 1 + (step + index) % 5;
    const std::vector<int64_t> lens = (step + index) % 2 == 0
                                          ? std::vector<int64_t>{a, s - a}
                                          : std::vector<int64_t>{a, 20, s - 20 - a};
    q.documents = std::make_shared<const Documents>(lens, s);
  }
  return q;
}

TrainOptions options(int cp, int micro, int64_t s, bool packed = false) {
  TrainOptions o;
  o.cp_size = cp;
  o.micro_steps = micro;
  o.packed = packed;
  o.decoder.knobs.method = cp == 1 ? "local" : "upipe";
  o.decoder.seq_len = s;
  o.decoder.memory.dtype = DType::kF32;
  o.decoder.memory.tile_tokens = 32;
  o.schedule = {1e-2, 1e-3, 1, 4};
  o.grad_clip = 1.0;
  // eps well above the gradients' rounding noise: AdamW's m / sqrt(v) is then a smooth function
  // of the gradient, so splits that sum in another order stay within the bound below.
  o.optimizer.eps = 1e-3;
  return o;
}

std::vector<std::vector<float>> state(Device& dev, Zero3& z) {
  std::vector<std::vector<float>> v;
  for (int u = 0; u < z.num_units(); ++u) {
    v.push_back(download(dev, z.master(u)));
    v.push_back(download(dev, z.exp_avg(u)));
    v.push_back(download(dev, z.exp_avg_sq(u)));
  }
  return v;
}

// Runs steps [from, to) with the batch of `dp * micro` sequences per step.
std::vector<StepResult> run(Trainer& tr, int64_t from, int64_t to, const ModelConfig& m) {
  const int64_t s = tr.options().decoder.seq_len;
  const int dp = tr.dp_size();
  SequenceFn data = [&](int64_t step, int micro, int dp_rank) {
    return global_sequence(step, int64_t(micro) * dp + dp_rank, s, m.vocab_size,
                           tr.options().packed);
  };
  std::vector<StepResult> r;
  for (int64_t t = from; t < to; ++t) r.push_back(tr.step(t, data));
  return r;
}

// packed: every sequence three documents of lengths that differ between sequences, so the loss's
// mean over the global batch's predictions needs every DP group's count.
void expect_splits_agree(bool packed) {
  Communicator& world = test::world();
  const int w = world.size();
  const ModelConfig m = load_model_config("tiny");
  const int64_t s = 64;
  // Every (cp, micro) with cp * dp = w and dp * micro = 2: the same two sequences per step.
  std::vector<std::pair<int, int>> splits;
  for (int cp = w; cp >= 1; cp /= 2)
    if (w % cp == 0 && (w / cp == 1 || w / cp == 2)) splits.push_back({cp, 2 / (w / cp)});
  ASSERT_FALSE(splits.empty());
  std::vector<std::vector<float>> ref;
  std::vector<StepResult> ref_r;
  for (auto [cp, micro] : splits) {
    Device dev;
    Trainer tr(dev, world, m, options(cp, micro, s, packed));
    tr.zero().init(nullptr, 7);
    const std::vector<StepResult> r = run(tr, 0, 3, m);
    const auto st = state(dev, tr.zero());
    const std::string what = fmt::format("cp {} x dp {} (micro {}) on {} ranks{}", cp, w / cp,
                                         micro, w, packed ? ", packed" : "");
    EXPECT_EQ(r[0].documents, packed ? 5 : 2) << what;  // packed: sequences of 2 and 3
    EXPECT_GT(r[0].loss, 5.0) << what;                  // ~log 256 at the start
    if (ref.empty()) {
      ref = st;
      ref_r = r;
      continue;
    }
    for (size_t i = 0; i < r.size(); ++i) {
      EXPECT_NEAR(r[i].loss, ref_r[i].loss, 1e-6 * ref_r[i].loss) << what << " step " << i;
      EXPECT_NEAR(r[i].grad_norm, ref_r[i].grad_norm, 1e-4 * ref_r[i].grad_norm) << what;
    }
    for (size_t k = 0; k < st.size(); ++k)
      for (size_t i = 0; i < st[k].size(); ++i)
        ASSERT_NEAR(st[k][i], ref[k][i], 1e-5 * (1 + std::abs(ref[k][i])))
            << what << " state " << k << " element " << i;
  }
}

TEST(Train, DpTimesCpSplitsGiveTheSameWeights) {
  expect_splits_agree(false);
}

TEST(Train, PackedDpTimesCpSplitsGiveTheSameWeights) {
  expect_splits_agree(true);
}

// The index in l.tensors of the tensor that holds element e of the unit (the padding: size()).
size_t tensor_of(const ZeroUnitLayout& l, int64_t e) {
  if (e >= l.numel) return l.tensors.size();
  size_t i = 0;
  while (i + 1 < l.tensors.size() && l.offsets[i + 1] <= e) ++i;
  return i;
}

// Pure data parallelism against one rank: W ranks with one sequence each (cp 1, dp W) against a
// single-rank run over the same W sequences as micro-steps, without clipping (clipping to a
// fixed norm would hide a gradient off by a constant factor, and AdamW's m / sqrt(v) nearly
// would: eps = 1e-3 is not small against these gradients). Masters and moments equal the
// single-rank run's within the bound of DpTimesCpSplitsGiveTheSameWeights.
TEST(Train, DataParallelWeightsEqualOneRankAfterAdamW) {
  Communicator& world = test::world();
  const int w = world.size();
  if (w == 1) GTEST_SKIP() << "data parallelism needs two ranks or more";
  const ModelConfig m = load_model_config("tiny");
  const int64_t s = 64;
  TrainOptions dp = options(1, 1, s);
  dp.grad_clip = 0;
  TrainOptions one = options(1, w, s);
  one.grad_clip = 0;
  auto solo = world.split([](int r) { return SplitKey{r, 0}; });
  Device dev_one;
  Trainer ref(dev_one, *solo, m, one);
  ref.zero().init(nullptr, 9);
  const std::vector<StepResult> want = run(ref, 0, 3, m);
  Device dev;
  Trainer tr(dev, world, m, dp);
  ASSERT_EQ(tr.dp_size(), w);
  tr.zero().init(nullptr, 9);
  const std::vector<StepResult> got = run(tr, 0, 3, m);
  for (size_t i = 0; i < got.size(); ++i)
    EXPECT_NEAR(got[i].loss, want[i].loss, 1e-6 * want[i].loss) << "step " << i;
  const auto mine = state(dev, tr.zero()), whole = state(dev_one, ref.zero());
  ASSERT_EQ(mine.size(), whole.size());
  for (size_t k = 0; k < mine.size(); ++k) {
    const int64_t first = tr.zero().shard_first(int(k / 3)),
                  numel = tr.zero().layout(int(k / 3)).numel;
    for (int64_t e = first; e < std::min(first + int64_t(mine[k].size()), numel); ++e) {
      const float r = whole[k][size_t(e)];
      ASSERT_NEAR(mine[k][size_t(e - first)], r, 1e-5 * (1 + std::abs(r)))
          << "state " << k << " (master, exp_avg, exp_avg_sq of unit " << k / 3 << ") element " << e
          << " on rank " << world.rank() << " of " << w;
    }
  }
}

// The optimizer step of a training step, recomputed in fp64 from the state before it, the
// gradient shard it used, the step's reported norm and learning rate: clipping by
// min(1, clip / (norm + 1e-6)), AdamW with bias correction for t + 1, weight decay on matrices
// only. Each new value within 8 fp32 ulp of the magnitudes it sums (fp32 arithmetic, a few
// roundings per term), the weight also within what m's bound moves the update by. Three steps
// (the bias correction's step count changes the update by tens of percent there), with a clip
// the initial norms exceed and one they do not. Mismatches are counted, not asserted, so every
// rank finishes the steps' collectives.

// The elements of this rank's shards whose step t (`before` -> `after`) differs from AdamW;
// `what` gets the first.
int64_t adamw_mismatches(Device& dev, Zero3& z, const OptimizerSpec& a, double lr, double gs,
                         int64_t t, const std::vector<std::vector<float>>& before,
                         const std::vector<std::vector<float>>& after, std::string& what) {
  const double eps32 = std::numeric_limits<float>::epsilon();
  const double bc1 = 1 - std::pow(a.beta1, double(t + 1)),
               bc2 = 1 - std::pow(a.beta2, double(t + 1));
  int64_t bad = 0;
  for (int u = 0; u < z.num_units(); ++u) {
    const ZeroUnitLayout& l = z.layout(u);
    const std::vector<float> g = download(dev, z.grad(u));
    const size_t k = size_t(3 * u);
    for (size_t i = 0; i < g.size(); ++i) {
      const size_t ti = tensor_of(l, z.shard_first(u) + int64_t(i));
      const bool matrix = ti < l.tensors.size() && l.tensors[ti].shape.size() == 2;
      const double w0 = before[k][i], m0 = before[k + 1][i], v0 = before[k + 2][i];
      const double gr = gs * g[i];
      const double m1 = a.beta1 * m0 + (1 - a.beta1) * gr;
      const double v1 = a.beta2 * v0 + (1 - a.beta2) * gr * gr;
      const double step = lr / bc1 * m1 / (std::sqrt(v1 / bc2) + a.eps);
      const double w1 = w0 * (1 - lr * (matrix ? a.weight_decay : 0.0)) - step;
      const double tol_m = 8 * eps32 * (std::abs(m0) + std::abs(gr));
      // The update's own roundings, and m's (m may be a small difference of its terms).
      const double tol_w = 8 * eps32 * (std::abs(w0) + std::abs(step)) +
                           lr / bc1 * tol_m / (std::sqrt(v1 / bc2) + a.eps);
      const bool ok = std::abs(after[k + 1][i] - m1) <= tol_m &&
                      std::abs(after[k + 2][i] - v1) <= 8 * eps32 * (v0 + gr * gr) &&
                      std::abs(after[k][i] - w1) <= tol_w;
      if (!ok && bad++ == 0)
        what = fmt::format("step {} unit {} element {}: w {} m {} v {}, want {} {} {}", t, u, i,
                           after[k][i], after[k + 1][i], after[k + 2][i], w1, m1, v1);
    }
  }
  return bad;
}

TEST(Train, OptimizerStepEqualsAdamWInFp64) {
  Communicator& world = test::world();
  const ModelConfig m = load_model_config("tiny");
  int clipped = 0, unclipped = 0;
  for (double clip : {1.0, 1e3}) {
    TrainOptions o = options(0, 1, 64);
    o.grad_clip = clip;
    Device dev;
    Trainer tr(dev, world, m, o);
    tr.zero().init(nullptr, 13);
    for (int64_t t = 0; t < 3; ++t) {
      const auto before = state(dev, tr.zero());
      const StepResult r = run(tr, t, t + 1, m)[0];
      const auto after = state(dev, tr.zero());
      const double gs = r.grad_norm > clip ? clip / (r.grad_norm + 1e-6) : 1.0;
      ++(gs < 1.0 ? clipped : unclipped);
      std::string what;
      EXPECT_EQ(adamw_mismatches(dev, tr.zero(), o.optimizer, r.lr, gs, t, before, after, what), 0)
          << "clip " << clip << ", rank " << world.rank() << ": " << what;
    }
  }
  EXPECT_GT(clipped, 0) << "no step was clipped: the clipping factor went unchecked";
  EXPECT_GT(unclipped, 0) << "every step was clipped: the unclipped path went unchecked";
}

TEST(Train, ResumeIsBitwiseIdentical) {
  Communicator& world = test::world();
  const ModelConfig m = load_model_config("tiny-qwen3");
  const int64_t s = 64;
  SharedDir dir(world);
  const TrainOptions o = options(0, 1, s);
  std::vector<std::vector<float>> straight;
  {
    Device dev;
    Trainer tr(dev, world, m, o);
    tr.zero().init(nullptr, 11);
    run(tr, 0, 4, m);
    straight = state(dev, tr.zero());
  }
  {
    Device dev;
    Trainer tr(dev, world, m, o);
    tr.zero().init(nullptr, 11);
    run(tr, 0, 2, m);
    save_checkpoint({dir.path(), "run-a", 2}, 2, tr.zero(), tr.cp_size(), "[train]\nsteps = 4\n");
  }
  const auto latest = latest_checkpoint(dir.path());
  ASSERT_TRUE(latest.has_value());
  Device dev;
  Trainer tr(dev, world, m, o);
  const CheckpointInfo info = load_checkpoint(*latest, tr.zero());
  EXPECT_EQ(info.step, 2);
  EXPECT_EQ(info.world, world.size());
  EXPECT_EQ(info.run_toml, "[train]\nsteps = 4\n");
  run(tr, info.step, 4, m);
  const auto resumed = state(dev, tr.zero());
  ASSERT_EQ(resumed.size(), straight.size());
  for (size_t k = 0; k < resumed.size(); ++k)
    ASSERT_EQ(std::memcmp(resumed[k].data(), straight[k].data(), resumed[k].size() * 4), 0)
        << "state tensor " << k << " differs after resume";
}

// A shard longer than one write piece (kSafetensorsWriteChunk elements; the tiny models' are far
// shorter): the writer streams it from the device piece by piece and loading gives every
// element back bitwise. A vocabulary of 2^16 on 1 or 2 ranks (the 8-rank run would need 4x it).
TEST(Train, CheckpointOfShardsLongerThanAWritePiece) {
  Communicator& world = test::world();
  if (world.size() > 2) GTEST_SKIP() << "sized for 1 or 2 ranks";
  ModelConfig m = load_model_config("tiny-qwen3");
  m.vocab_size = 65536;  // the tied embedding: 4 Mi elements, 2 Mi per rank on 2 ranks
  SharedDir dir(world);
  const TrainOptions o = options(0, 1, 64);
  std::vector<std::vector<float>> saved;
  {
    Device dev;
    Trainer tr(dev, world, m, o);
    tr.zero().init(nullptr, 5);
    run(tr, 0, 1, m);
    saved = state(dev, tr.zero());
    save_checkpoint({dir.path(), "run-a", 0}, 1, tr.zero(), tr.cp_size(), "");
  }
  ASSERT_GT(saved[0].size(), size_t(kSafetensorsWriteChunk));
  Device dev;
  Trainer tr(dev, world, m, o);
  load_checkpoint(dir.path() + "/step_00000001", tr.zero());
  const auto loaded = state(dev, tr.zero());
  ASSERT_EQ(loaded.size(), saved.size());
  for (size_t k = 0; k < loaded.size(); ++k)
    ASSERT_EQ(std::memcmp(loaded[k].data(), saved[k].data(), loaded[k].size() * 4), 0)
        << "state tensor " << k << " differs after the round trip";
}

TEST(Train, CheckpointReshardsAndRefusesBadOnes) {
  Communicator& world = test::world();
  const ModelConfig m = load_model_config("tiny");
  SharedDir dir(world);
  // Written by the first half of the ranks (or the only one).
  const int writers = std::max(1, world.size() / 2);
  auto half = world.split([writers](int r) { return SplitKey{r < writers ? 0 : 1, r}; });
  std::vector<std::vector<float>> whole;  // every tensor, consolidated from the writers
  if (world.rank() < writers) {
    Device dev;
    Trainer tr(dev, *half, m, options(0, 1, 64));
    tr.zero().init(nullptr, 3);
    run(tr, 0, 1, m);
    save_checkpoint({dir.path(), "run-a", 0}, 1, tr.zero(), tr.cp_size(), "");
  }
  world.barrier();
  const std::string ck = dir.path() + "/step_00000001";
  const CheckpointReader reader(ck);
  EXPECT_EQ(reader.info().world, writers);
  const std::vector<HfTensorSpec> specs = hf_tensors(m);
  for (size_t i = 0; i < specs.size(); ++i) {
    whole.emplace_back(size_t(specs[i].numel()));
    reader.read(int(i), whole.back().data());
  }
  // Element ranges (what `upipe export` streams): pieces of 997, which straddle the writers'
  // shards, equal the whole tensor's elements.
  for (size_t i = 0; i < specs.size(); ++i) {
    const int64_t n = specs[i].numel();
    std::vector<float> piece;
    for (int64_t a = 0; a < n; a += 997) {
      piece.resize(size_t(std::min<int64_t>(997, n - a)));
      reader.read_range(int(i), a, int64_t(piece.size()), piece.data());
      ASSERT_TRUE(std::equal(piece.begin(), piece.end(), whole[i].begin() + a))
          << specs[i].name << " from " << a;
    }
  }
  // Loaded on all ranks: each rank's shard is its slice of the consolidated tensors.
  Device dev;
  Zero3 z(dev, world, m, DType::kF32);
  load_checkpoint(ck, z);
  int checked = 0;
  for (int u = 0; u < z.num_units(); ++u) {
    const ZeroUnitLayout& l = z.layout(u);
    const std::vector<float> got = download(dev, z.master(u));
    for (int64_t e = z.shard_first(u); e < std::min(z.shard_first(u) + l.shard, l.numel); ++e) {
      size_t i = 0;
      while (i + 1 < l.tensors.size() && l.offsets[i + 1] <= e) ++i;
      ASSERT_EQ(got[size_t(e - z.shard_first(u))],
                whole[size_t(l.index[i])][size_t(e - l.offsets[i])]);
      ++checked;
    }
  }
  EXPECT_GT(checked, 0);
  world.barrier();
  // Another model: refused, naming the unit.
  {
    Zero3 other(dev, world, load_model_config("tiny-qwen3"), DType::kF32);
    try {
      load_checkpoint(ck, other);
      ADD_FAILURE() << "a checkpoint of another model loaded";
    } catch (const ConfigError& e) {
      EXPECT_NE(std::string(e.what()).find("another model"), std::string::npos) << e.what();
    }
  }
  world.barrier();
  // Truncated rank file, then no DONE marker.
  if (world.rank() == 0) fs::resize_file(ck + "/rank_00000.safetensors", 100);
  world.barrier();
  EXPECT_THROW(load_checkpoint(ck, z), ConfigError);
  world.barrier();
  if (world.rank() == 0) fs::remove(ck + "/DONE");
  world.barrier();
  EXPECT_FALSE(latest_checkpoint(dir.path()).has_value());
  try {
    load_checkpoint(ck, z);
    ADD_FAILURE() << "an incomplete checkpoint loaded";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("incomplete"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace upipe
