// The planner's search on the meta device (one process, fake ranks): the peak grows with S, the
// maximum S is a multiple of the stated granularity that fits while one granule more does not,
// `auto` picks the fewest stages (then the largest Ulysses degree) that fit, and inputs that
// cannot fit are refused in one line.
#include <gtest/gtest.h>

#include <algorithm>
#include <utility>
#include <vector>

#include "core/errors.h"
#include "plan/planner.h"
#include "unit/expect_config_error.h"

namespace upipe {
namespace {

// r with the chosen knobs set to auto.
PlanRequest with_auto(PlanRequest r, bool stage_heads, bool chunks, bool ulysses_degree) {
  MethodKnobs& k = r.decoder.knobs;
  if (stage_heads) k.stage_heads = kKnobAuto;
  if (chunks) k.chunks = kKnobAuto;
  if (ulysses_degree) k.ulysses_degree = kKnobAuto;
  return r;
}

PlanRequest tiny_request(const std::string& method, int64_t device_bytes) {
  PlanRequest r;
  r.ranks = 4;
  r.decoder.knobs.method = method;
  r.decoder.memory.dtype = DType::kBF16;
  r.decoder.memory.tile_tokens = 256;
  r.device_bytes = device_bytes;
  r.host_bytes = int64_t(1) << 30;
  r.reserve_bytes = 0;
  return r;
}

TEST(Planner, PeakGrowsWithSequenceLength) {
  const ModelConfig m = load_model_config("tiny");
  for (const char* method : {"ulysses", "upipe", "ring", "fpdt"}) {
    PlanRequest r = tiny_request(method, int64_t(1) << 40);
    int64_t last = 0;
    for (int64_t s : {1024, 4096, 16384, 65536, 262144}) {
      r.decoder.seq_len = s;
      const Plan p = plan_step(m, r);
      ASSERT_TRUE(p.complete);
      EXPECT_GT(p.device_peak, last) << method << " S=" << s;
      EXPECT_TRUE(p.fits);
      last = p.device_peak;
    }
  }
}

TEST(Planner, MaxSeqLenIsTheLargestGranuleThatFits) {
  const ModelConfig m = load_model_config("tiny");
  for (const char* method : {"ulysses", "upipe", "ring", "usp", "fpdt", "upipe-fpdt"}) {
    PlanRequest r = tiny_request(method, int64_t(1) << 40);
    r.decoder.seq_len = 10 * kSeqQuantum;
    // A budget between the peaks at 10 and 11 granules: the answer is 10.
    const Plan at10 = plan_step(m, r);
    r.decoder.seq_len = 11 * kSeqQuantum;
    const Plan at11 = plan_step(m, r);
    ASSERT_LT(at10.device_peak, at11.device_peak) << method;
    r.device_bytes = (at10.device_peak + at11.device_peak) / 2;
    const Plan best = max_seq_len(m, with_auto(r, false, false, false));
    const int64_t g = seq_granularity(m, r);
    EXPECT_EQ(g % kSeqQuantum, 0) << method;
    EXPECT_EQ(best.request.decoder.seq_len % g, 0) << method;
    EXPECT_EQ(best.request.decoder.seq_len, 10 * kSeqQuantum) << method;
    EXPECT_TRUE(best.fits) << method;
    EXPECT_TRUE(best.complete) << method;
    PlanRequest more = best.request;
    more.decoder.seq_len += g;
    EXPECT_FALSE(plan_step(m, more).fits) << method;
    EXPECT_FALSE(plan_step(m, more, true).fits) << method;
  }
}

TEST(Planner, ReserveAndHostBudgetCount) {
  // 8 layers: offloading keeps two device slots of checkpoints instead of L.
  ModelConfig m = load_model_config("tiny");
  m.num_hidden_layers = 8;
  PlanRequest r = tiny_request("upipe", int64_t(1) << 40);
  r.decoder.seq_len = 8 * kSeqQuantum;
  r.decoder.memory.offload_stash = true;
  const Plan p = plan_step(m, r);
  ASSERT_GT(p.host_peak, 0);
  r.device_bytes = p.device_peak;
  EXPECT_TRUE(plan_step(m, r).fits);
  r.reserve_bytes = 1;
  EXPECT_FALSE(plan_step(m, r).fits);  // peak + reserve > budget
  r.reserve_bytes = 0;
  r.host_bytes = p.host_peak - 1;
  EXPECT_FALSE(plan_step(m, r).fits);
  EXPECT_FALSE(plan_step(m, r, true).fits);
  // Offloading moves the checkpoints from the device to the host: the same S needs less device.
  r.host_bytes = int64_t(1) << 40;
  r.decoder.memory.offload_stash = false;
  const Plan on_device = plan_step(m, r);
  EXPECT_GT(on_device.device_peak, p.device_peak);
  EXPECT_EQ(on_device.host_peak, 0);
  EXPECT_GT(on_device.device_at_peak[Tag::kStash], p.device_at_peak[Tag::kStash]);
}

TEST(Planner, AutoPicksTheFewestStagesThatFit) {
  // tiny has H = 4 on C = 2: U in {4, 2} (one or two stages per layer).
  const ModelConfig m = load_model_config("tiny");
  PlanRequest r = tiny_request("upipe", int64_t(1) << 40);
  r.ranks = 2;
  r.decoder.seq_len = 16 * kSeqQuantum;
  const std::vector<PlanRequest> c = knob_candidates(m, with_auto(r, true, false, false));
  ASSERT_EQ(c.size(), 2u);
  EXPECT_EQ(c[0].decoder.knobs.stage_heads, 4);
  EXPECT_EQ(c[1].decoder.knobs.stage_heads, 2);
  PlanRequest q = r;
  q.decoder.knobs.stage_heads = 4;
  const Plan one = plan_step(m, q);
  q.decoder.knobs.stage_heads = 2;
  const Plan two = plan_step(m, q);
  ASSERT_GT(one.device_peak, two.device_peak);
  r.device_bytes = one.device_peak;  // both fit: the faster
  EXPECT_EQ(plan_auto(m, with_auto(r, true, false, false)).request.decoder.knobs.stage_heads, 4);
  r.device_bytes = one.device_peak - 1;  // only U = 2 fits
  const Plan a = plan_auto(m, with_auto(r, true, false, false));
  EXPECT_EQ(a.request.decoder.knobs.stage_heads, 2);
  EXPECT_TRUE(a.fits);
  r.device_bytes = two.device_peak - 1;  // none: the frugal one's plan, not fitting
  const Plan none = plan_auto(m, with_auto(r, true, false, false));
  EXPECT_FALSE(none.fits);
  EXPECT_EQ(none.request.decoder.knobs.stage_heads, 2);
  // fpdt chunks: fewest first.
  r.decoder.knobs.method = "fpdt";
  const std::vector<PlanRequest> n = knob_candidates(m, with_auto(r, false, true, false));
  ASSERT_GT(n.size(), 2u);
  for (size_t i = 1; i < n.size(); ++i)
    EXPECT_LT(n[i - 1].decoder.knobs.chunks, n[i].decoder.knobs.chunks);
}

TEST(Planner, AutoUlyssesDegree) {
  // tiny (H = 4, K = 2) on C = 4: u in {4, 2, 1} (K and u divide one another), largest first;
  // usp runs one stage whatever u. upipe-ring: U is a multiple of u dividing H, and the
  // candidates come fewest stages first, then the larger u.
  const ModelConfig m = load_model_config("tiny");
  PlanRequest r = tiny_request("usp", int64_t(1) << 40);
  r.decoder.seq_len = 16 * kSeqQuantum;
  const std::vector<PlanRequest> c = knob_candidates(m, with_auto(r, true, true, true));
  ASSERT_EQ(c.size(), 3u);
  for (size_t i = 0; i < c.size(); ++i) EXPECT_EQ(c[i].decoder.knobs.ulysses_degree, 4 >> i);
  // Plans for each; auto takes the first that fits, or the last (most frugal) when none does.
  std::vector<int64_t> peak;
  for (const PlanRequest& q : c) peak.push_back(plan_step(m, q).device_peak);
  for (size_t i = 0; i < c.size(); ++i) {
    r.device_bytes = peak[i];
    const Plan p = plan_auto(m, with_auto(r, false, false, true));
    ASSERT_TRUE(p.fits) << i;
    const int u = p.request.decoder.knobs.ulysses_degree;
    for (size_t j = 0; j < c.size() && c[j].decoder.knobs.ulysses_degree != u; ++j)
      EXPECT_GT(peak[j], peak[i]) << "a faster u = " << c[j].decoder.knobs.ulysses_degree
                                  << " fits too";
  }
  r.device_bytes = *std::min_element(peak.begin(), peak.end()) - 1;
  const Plan none = plan_auto(m, with_auto(r, false, false, true));
  EXPECT_FALSE(none.fits);
  EXPECT_EQ(none.request.decoder.knobs.ulysses_degree, 1);
  // upipe-ring: (u, U) pairs with u | U | H, fewest stages H/U first.
  r.decoder.knobs.method = "upipe-ring";
  const std::vector<PlanRequest> ur = knob_candidates(m, with_auto(r, true, false, true));
  const std::vector<std::pair<int, int>> want = {{4, 4}, {2, 4}, {1, 4}, {2, 2}, {1, 2}, {1, 1}};
  ASSERT_EQ(ur.size(), want.size());
  for (size_t i = 0; i < ur.size(); ++i) {
    EXPECT_EQ(ur[i].decoder.knobs.ulysses_degree, want[i].first) << i;
    EXPECT_EQ(ur[i].decoder.knobs.stage_heads, want[i].second) << i;
  }
  // A fixed degree is one candidate; other methods ignore the knob.
  r.decoder.knobs.ulysses_degree = 2;
  EXPECT_EQ(knob_candidates(m, with_auto(r, false, false, false)).size(), 1u);
  r.decoder.knobs.method = "ring";
  r.decoder.knobs.ulysses_degree = 0;
  EXPECT_EQ(knob_candidates(m, with_auto(r, true, true, true)).size(), 1u);
}

TEST(Planner, ImpossibleInputsAreOneLine) {
  const ModelConfig m = load_model_config("llama3-8b");
  PlanRequest r;
  r.ranks = 8;
  r.decoder.seq_len = 1 << 20;
  r.device_bytes = int64_t(10) << 30;  // 8B params x 16 B / 8 ranks = 14.9 GiB of state
  expect_config_error([&] { check_model_fits(m, r); },
                      {"does not fit 8 ranks of 10.00 GiB", "AdamW", "more ranks"});
  r.device_bytes = int64_t(80) << 30;
  check_model_fits(m, r);
  r.reserve_bytes = r.device_bytes;
  expect_config_error([&] { plan_step(m, r); }, {"--reserve"});
  r.reserve_bytes = 0;
  r.cp_size = 3;
  expect_config_error([&] { plan_step(m, r); }, {"--cp-size (3) must divide --ranks (8)"});
  r.cp_size = 0;
  r.decoder.knobs.method = "ring";
  r.decoder.seq_len = 1000;
  expect_config_error([&] { plan_step(m, r); }, {"--seq-len (1000) must be divisible by 16"});
}

}  // namespace
}  // namespace upipe
