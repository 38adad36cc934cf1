// The planner property for the whole model: a rank's decoder step on the meta device (nothing
// backed, a fake communicator playing that rank) allocates exactly what the real run on that
// rank allocates: the same peak and the same bytes per tag at the peak, and the same per-tag
// peaks, and the same host-arena peak, for every strategy valid on this rank count, with and
// without offloaded checkpoints, fp32 and bf16 compute, fp32 and bf16 residual stream (tiny Qwen3
// preset: QK-norm, tied).
#include <gtest/gtest.h>

#include "comm/fake/fake_comm.h"
#include "model/decoder.h"
#include "model/weights.h"
#include "multirank/mpi_test_main.h"

namespace upipe {
namespace {

struct Peaks {
  int64_t peak = 0, host_peak = 0;
  TagBytes at_peak, tag_peaks;
};

Peaks step(Device& dev, Communicator& comm, const ModelConfig& m, const DecoderOptions& opt,
           const std::vector<int32_t>& tokens) {
  Decoder dec(dev, comm, m, opt);
  const ParamMap w = load_params(dev, m, "", opt.memory.dtype, 3);
  const ParamMap g = allocate_params(dev, m, DType::kF32, Tag::kGrads);
  dev.mem().reset_peak();
  dev.host().reset_peak();
  dec.loss_and_grads(tokens, w, g);
  return {dev.mem().peak(), dev.host().peak(), dev.mem().at_peak_by_tag(), dev.mem().peak_by_tag()};
}

TEST(ModelMeta, MetaPlanEqualsRealRunPerTag) {
  Communicator& comm = test::world();
  const int c = comm.size();
  const ModelConfig m = load_model_config("tiny-qwen3");
  const int64_t s = 384;
  std::vector<int32_t> tokens(static_cast<size_t>(s));
  for (int64_t i = 0; i < s; ++i) tokens[size_t(i)] = int32_t((i * 37 + 11) % m.vocab_size);
  std::vector<std::string> methods = {"ring"};
  if (c == 1) methods = {"local", "upipe", "fpdt"};
  if (c == 2 || c == 4) methods = {"ulysses", "upipe", "ring", "usp", "fpdt", "upipe-fpdt"};
  const std::pair<DType, DType> dtypes[] = {// compute, residual
                                            {DType::kF32, DType::kF32},
                                            {DType::kBF16, DType::kF32},
                                            {DType::kBF16, DType::kBF16}};
  for (const auto& [t, rt] : dtypes)
    for (const std::string& method : methods)
      for (bool offload : {false, true}) {
        DecoderOptions opt;
        opt.memory.offload_stash = offload;
        opt.knobs.method = method;
        opt.seq_len = s;
        opt.memory.dtype = t;
        opt.memory.residual_dtype = rt;
        opt.memory.tile_tokens = 40;
        Device real;
        const Peaks r = step(real, comm, m, opt, tokens);
        Device meta({BackendKind::kMeta, int64_t(1) << 40, int64_t(1) << 40});
        FakeCommunicator fake(comm.rank(), c);
        const Peaks p = step(meta, fake, m, opt, tokens);
        const std::string what = method + (offload ? " offload " : " ") + dtype_name(t) +
                                 " residual " + dtype_name(rt) + " rank " +
                                 std::to_string(comm.rank()) + " of " + std::to_string(c);
        EXPECT_EQ(p.peak, r.peak) << what;
        EXPECT_EQ(p.host_peak, r.host_peak) << what;
        if (offload) {
          EXPECT_GT(r.host_peak, 0) << what;
        }
        for (int tag = 0; tag < kNumTags; ++tag) {
          EXPECT_EQ(p.at_peak.v[size_t(tag)], r.at_peak.v[size_t(tag)])
              << what << " at the peak, tag " << tag_name(Tag(tag));
          EXPECT_EQ(p.tag_peaks.v[size_t(tag)], r.tag_peaks.v[size_t(tag)])
              << what << " peak of tag " << tag_name(Tag(tag));
        }
      }
}

}  // namespace
}  // namespace upipe
