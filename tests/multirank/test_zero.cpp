// ZeRO-3 against the replicated reference on every rank count: the decoder's gradient through
// Zero3 (all-gathered weights, reduce-scattered gradient shards) equals the replicated model's
// gradient summed over the ranks, its global norm is the same, and one AdamW step on the shards
// equals AdamW on the whole parameters. Both models (tiny Llama: untied; tiny Qwen3: tied, so the
// embedding unit is used twice), fp32 and bf16 compute; each rank checks its own shard.
#include <gtest/gtest.h>

#include <cmath>

#include "backend/optim.h"
#include "backend/tensor_ops.h"
#include "model/decoder.h"
#include "model/weights.h"
#include "multirank/mpi_test_main.h"
#include "train/zero.h"

namespace upipe {
namespace {

// |a - b| <= tol * max|b| over the range (a reduction order may differ: allreduce vs
// reduce-scatter).
void expect_close(const std::vector<float>& a, const std::vector<float>& b, double tol,
                  const std::string& what) {
  ASSERT_EQ(a.size(), b.size()) << what;
  double scale = 0, err = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    ASSERT_TRUE(std::isfinite(a[i]) && std::isfinite(b[i])) << what << " at " << i;
    scale = std::max(scale, double(std::abs(b[i])));
    err = std::max(err, double(std::abs(a[i] - b[i])));
  }
  EXPECT_GT(scale, 0.0) << what << ": an all-zero reference proves nothing";
  EXPECT_LE(err, tol * scale) << what;
}

TEST(Zero3, GradientsNormAndAdamWEqualReplicated) {
  Communicator& comm = test::world();
  const int w = comm.size();
  const int64_t s = 96;
  const uint64_t seed = 5;
  const OptimizerSpec opt{0.9, 0.95, 1e-8, 0.1};
  const double lr = 1e-2, clip_scale = 0.5;
  for (const char* model : {"tiny", "tiny-qwen3"})
    for (DType t : {DType::kF32, DType::kBF16}) {
      const std::string what = std::string(model) + " " + dtype_name(t) + " on " +
                               std::to_string(w) + " ranks, rank " + std::to_string(comm.rank());
      const ModelConfig m = load_model_config(model);
      std::vector<int32_t> tokens(static_cast<size_t>(s));
      for (int64_t i = 0; i < s; ++i) tokens[size_t(i)] = int32_t((i * 53 + 7) % m.vocab_size);
      DecoderOptions dopt;
      dopt.knobs.method = w == 1 ? "local" : "upipe";
      dopt.seq_len = s;
      dopt.memory.dtype = t;
      dopt.memory.tile_tokens = 32;
      Device dev;
      Decoder dec(dev, comm, m, dopt);

      // Replicated: whole weights (the fp32 values rounded to t) and gradient, summed over ranks.
      const ParamMap master = load_params(dev, m, "", DType::kF32, seed);
      const ParamMap wt = load_params(dev, m, "", t, seed);
      const ParamMap g = allocate_params(dev, m, DType::kF32, Tag::kGrads);
      const double ref_loss = dec.loss_and_grads(tokens, wt, g);
      double ref_sq = 0;
      for (const auto& [name, gt] : g) {
        comm.all_reduce(gt.data(), gt.rows() * gt.cols(), DType::kF32, ReduceOp::kSum);
        ref_sq += sum_squares(dev, gt);
      }

      // ZeRO-3.
      Zero3 z(dev, comm, m, t);
      z.init(nullptr, seed);
      z.zero_grads();
      const StepLoss loss = dec.run(tokens, z);
      z.finish_grads();
      EXPECT_EQ(loss.loss, ref_loss) << what;
      EXPECT_NEAR(z.grad_norm(), std::sqrt(ref_sq), 1e-6 * std::sqrt(ref_sq)) << what;

      // The reference AdamW step on whole tensors (moments start at zero).
      std::map<std::string, std::vector<float>> want_w;
      for (const auto& [name, mt] : master) {
        const Tensor& gt = g.at(name);
        Tensor mom(dev.mem(), Tag::kOptim, DType::kF32, 1, mt.rows() * mt.cols());
        Tensor mom2(dev.mem(), Tag::kOptim, DType::kF32, 1, mt.rows() * mt.cols());
        zero(dev, mom);
        zero(dev, mom2);
        const Mat flat_w{mt.data(), DType::kF32, 1, mom.cols(), mom.cols()};
        const Mat flat_g{gt.data(), DType::kF32, 1, mom.cols(), mom.cols()};
        const double wd = mt.rows() > 1 ? opt.weight_decay : 0.0;
        adamw(dev, flat_w, flat_g, mom, mom2,
              AdamWArgs{lr, opt.beta1, opt.beta2, opt.eps, wd, clip_scale, 1});
        want_w[name] = download(dev, flat_w);
      }
      // Each rank's shards against the reference's slices, before and after the step.
      std::map<std::string, std::vector<float>> grads_full;
      for (const auto& [name, gt] : g) grads_full[name] = download(dev, gt);
      std::vector<std::vector<float>> shard_g;
      for (int u = 0; u < z.num_units(); ++u) shard_g.push_back(download(dev, z.grad(u)));
      z.step(opt, lr, clip_scale, 1);
      for (int u = 0; u < z.num_units(); ++u) {
        const ZeroUnitLayout& l = z.layout(u);
        const std::vector<float> sw = download(dev, z.master(u));
        const int64_t lo = z.shard_first(u);
        std::vector<float> got_g, ref_g, got_w, ref_w;
        for (int64_t e = lo; e < lo + l.shard; ++e) {
          if (e >= l.numel) {  // padding stays zero
            EXPECT_EQ(shard_g[size_t(u)][size_t(e - lo)], 0.0f) << what;
            EXPECT_EQ(sw[size_t(e - lo)], 0.0f) << what;
            continue;
          }
          size_t i = 0;
          while (i + 1 < l.tensors.size() && l.offsets[i + 1] <= e) ++i;
          const std::string& name = l.tensors[i].name;
          got_g.push_back(shard_g[size_t(u)][size_t(e - lo)]);
          ref_g.push_back(grads_full[name][size_t(e - l.offsets[i])]);
          got_w.push_back(sw[size_t(e - lo)]);
          ref_w.push_back(want_w[name][size_t(e - l.offsets[i])]);
        }
        if (got_g.empty()) continue;
        expect_close(got_g, ref_g, 1e-6, what + " gradient of " + unit_name(m, u));
        expect_close(got_w, ref_w, 1e-6, what + " AdamW weights of " + unit_name(m, u));
      }
    }
}

// Gathered weights exist only between acquire and release, and a unit's whole gradient only until
// its reduce-scatter completes: after a step, ZeRO-3 holds exactly its shards.
TEST(Zero3, HoldsOnlyShardsBetweenSteps) {
  Communicator& comm = test::world();
  const ModelConfig m = load_model_config("tiny");
  DecoderOptions dopt;
  dopt.knobs.method = comm.size() == 1 ? "local" : "ulysses";
  dopt.seq_len = 64;
  dopt.memory.dtype = DType::kBF16;
  Device dev;
  Decoder dec(dev, comm, m, dopt);
  Zero3 z(dev, comm, m, DType::kBF16);
  z.init(nullptr, 1);
  const int64_t held = dev.mem().current();
  int64_t shards = 0;
  for (const ZeroUnitLayout& l : zero_layout(m, comm.size())) shards += 4 * 4 * l.shard;
  EXPECT_EQ(held, shards);
  EXPECT_EQ(dev.mem().current_by_tag()[Tag::kOptim], shards / 2);
  std::vector<int32_t> tokens(64, 3);
  dev.mem().reset_peak();
  dec.run(tokens, z);
  z.finish_grads();
  EXPECT_EQ(dev.mem().current(), held);
  EXPECT_GT(dev.mem().peak_by_tag()[Tag::kGathered], 0);
  EXPECT_EQ(dev.mem().current_by_tag()[Tag::kGathered], 0);
}

}  // namespace
}  // namespace upipe
