// The planner's search on the meta device (one process, fake ranks): the peak grows with S, the
// maximum S is a multiple of the stated granularity that fits while one granule more does not,
// `auto` picks the fewest stages (then the largest Ulysses degree) that fit, inputs that cannot
// fit are refused in one line, and planning one rank per rank class gives exactly the plan of
// every rank (every method and knob, 8 and 16 ranks, CP x DP splits, K < C, ZeRO-3 padding, usp
// grids whose ranks hold different runs); documents the data decides are planned at their worst.
#include <gtest/gtest.h>
#include <cstdlib>

#include <fmt/format.h>

#include <algorithm>
#include <iterator>
#include <string>
#include <utility>
#include <vector>

#include "attention/methods.h"
#include "core/errors.h"
#include "plan/host_memory.h"
#include "plan/planner.h"
#include "plan/remedies.h"
#include "train/run_config.h"
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

// The ranks of one host share its memory: their planned peaks together against the host's (cpu:
// both arenas; cuda: the host arena), per host; a budget per rank that holds beside the host
// arena; a plan stopped at its budget counts every rank at the worst peaks.
TEST(Planner, TheRanksOfAHostShareItsMemory) {
  constexpr int64_t G = int64_t(1) << 30;
  Plan p;
  p.device_peak = 3 * G;
  p.host_peak = G / 2;
  for (int r = 0; r < 4; ++r) {
    RankPlan rp;
    rp.rank = r;
    rp.device_peak = r == 0 ? 3 * G : 2 * G;
    rp.host_peak = G / 2;
    p.ranks.push_back(rp);
  }
  const std::vector<std::string> hosts = {"b", "b", "b", "a"};  // 3 ranks on b, 1 on a
  const std::vector<int64_t> memory = {8 * G, 8 * G, 8 * G, 4 * G};
  // b: 3 + 2 + 2 + 3 x 0.5 = 8.5 GiB over 8; a: 2.5 over 4.
  std::optional<HostOverMemory> o = host_over_memory(p, true, hosts, memory);
  ASSERT_TRUE(o);
  EXPECT_EQ(o->host, "b");
  EXPECT_EQ(o->ranks, 3);
  EXPECT_EQ(o->need, 8 * G + G / 2);
  EXPECT_EQ(o->most, 3 * G + G / 2);
  EXPECT_EQ(o->have, 8 * G);
  EXPECT_EQ(o->device_share, 2 * G) << "8/3 GiB a rank, less the 0.5 GiB host arena, whole GiB";
  // cuda: only the host arenas are the host's memory.
  EXPECT_FALSE(host_over_memory(p, false, hosts, memory));
  o = host_over_memory(p, false, hosts, {G, G, G, 4 * G});  // b: 1.5 GiB over 1
  ASSERT_TRUE(o);
  EXPECT_EQ(o->host, "b");
  EXPECT_EQ(o->host_share, 0) << "a third of 1 GiB is no whole GiB";
  // Every rank on a host of its own: each holds.
  EXPECT_FALSE(host_over_memory(p, true, {"a", "b", "c", "d"}, {4 * G, 4 * G, 4 * G, 4 * G}));
  // Without its ranks (stopped at the budget): the worst peaks, 4 x 3.5 GiB over 12.
  p.ranks.clear();
  o = host_over_memory(p, true, {"a", "a", "a", "a"}, {12 * G, 12 * G, 12 * G, 12 * G});
  ASSERT_TRUE(o);
  EXPECT_EQ(o->need, 14 * G);
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

// A run whose data decides its documents is planned at their worst: exactly the plan of every
// token its own document, and at least the plan of any documents (only the mask, tag docs,
// depends on them), at a given S and in the search for the longest S.
TEST(Planner, DocumentsOfTheDataArePlannedAtTheirWorst) {
  const ModelConfig m = load_model_config("tiny");
  const int64_t s = 4096;
  for (const char* method : {"upipe", "ring", "usp", "fpdt"}) {
    PlanRequest r = tiny_request(method, int64_t(1) << 40);
    r.decoder.seq_len = s;
    PlanRequest worst = r;
    worst.worst_case_documents = true;
    PlanRequest ones = r;
    ones.doc_lens.assign(size_t(s), 1);
    PlanRequest some = r;
    some.doc_lens = {1000, 24, 3000, 72};
    const Plan pw = plan_step(m, worst), po = plan_step(m, ones), ps = plan_step(m, some),
               pn = plan_step(m, r);
    EXPECT_EQ(pw.device_peak, po.device_peak) << method;
    EXPECT_EQ(pw.device_at_peak.v, po.device_at_peak.v) << method;
    // (fpdt's peak comes where the mask is not live: equal peaks there.)
    EXPECT_GE(pw.device_at_peak[Tag::kDocs], ps.device_at_peak[Tag::kDocs]) << method;
    EXPECT_GE(pw.device_peak, ps.device_peak) << method;
    EXPECT_GE(ps.device_peak, pn.device_peak) << method;
    EXPECT_EQ(pn.device_at_peak[Tag::kDocs], 0) << method;
    if (std::string(method) != "ring") continue;  // the search is the same for every method
    // The search takes the worst case at every S it tries: with the budget of the worst case at
    // 4 granules its answer is 4 granules, and no longer than the search without documents.
    const int64_t g = seq_granularity(m, r);
    PlanRequest at4 = worst;
    at4.decoder.seq_len = 4 * g;
    PlanRequest search = worst, plain = r;
    search.device_bytes = plain.device_bytes = plan_step(m, at4).device_peak;
    const Plan bw = max_seq_len(m, search), bn = max_seq_len(m, plain);
    ASSERT_TRUE(bw.fits && bn.fits) << method;
    EXPECT_EQ(bw.request.decoder.seq_len, 4 * g) << method;
    EXPECT_GT(bw.device_at_peak[Tag::kDocs], 0) << method;
    EXPECT_GE(bn.request.decoder.seq_len, bw.request.decoder.seq_len) << method;
  }
}

// What makes a plan that does not fit fit: each remedy's plan fits, is the plan of its settings
// as a run gives them (plan_request), and says whether it computes the same bits; a knob given
// as auto stays auto; nothing where not even every step together fits.
TEST(Planner, RemediesFitAsTheirSettingsPlan) {
  const ModelConfig m = load_model_config("tiny");
  RunConfig c;
  c.train.seq_len = 65536;
  c.memory.device_bytes = int64_t(72) << 20;  // 78.29 MiB planned; offloaded: 70.29 MiB
  c.memory.host_bytes = int64_t(1) << 30;
  for (const bool auto_u : {false, true}) {
    c.parallel.knobs.stage_heads = auto_u ? kKnobAuto : 0;
    PlanRequest base = plan_request(c, 2);
    base.reserve_bytes = 0;
    const Plan failed = plan_auto(m, base);
    ASSERT_FALSE(failed.fits);
    const std::vector<Remedy> rs = remedies(m, c, base, failed);
    ASSERT_FALSE(rs.empty());
    bool offload = false;
    for (const Remedy& f : rs) {
      SCOPED_TRACE(f.flags);
      EXPECT_TRUE(f.plan.fits);
      PlanRequest again = plan_request(f.config, 2);
      again.reserve_bytes = 0;
      const Plan p = plan_auto(m, again);
      EXPECT_TRUE(p.fits);
      EXPECT_EQ(p.device_peak, f.plan.device_peak);
      EXPECT_EQ(p.host_peak, f.plan.host_peak);
      if (auto_u) {
        EXPECT_EQ(f.config.parallel.knobs.stage_heads, kKnobAuto);
      }
      if (f.flags == "--offload-stash=true") {
        offload = true;
        EXPECT_TRUE(f.exact);
      }
      if (f.flags.find("--stash-dtype=bf16") != std::string::npos) {
        EXPECT_FALSE(f.exact);
      }
    }
    EXPECT_TRUE(offload) << "the offloaded stash fits alone";
  }
  c.parallel.knobs.stage_heads = 0;
  c.memory.device_bytes = int64_t(3) << 20;  // below the ZeRO-3 state and one residual
  PlanRequest base = plan_request(c, 2);
  base.reserve_bytes = 0;
  EXPECT_TRUE(remedies(m, c, base, plan_auto(m, base)).empty());
}

// What goes past the longest S: each setting's longest S is longer, and is the longest S of its
// settings as a run gives them; with a budget where nothing fits, what does fit.
TEST(Planner, LongerGoesAsFarAsItsSettingsPlan) {
  const ModelConfig m = load_model_config("tiny");
  struct Case {
    int64_t device_kib;
    bool overlap_no_recompute;
    const char* flags;  // a setting that goes further alone
    bool exact;         // whether it computes the same bits
  };
  // The longest S 65536 (layer recompute: 131072); nothing fits (smaller tiles: 1024).
  for (const Case& k : {Case{200 << 10, true, "--recompute=layer", true},
                        Case{4 << 10, false, "--tile-tokens=256", false}}) {
    SCOPED_TRACE(k.flags);
    RunConfig c;
    c.memory.host_bytes = int64_t(1) << 30;
    c.memory.device_bytes = k.device_kib << 10;
    if (k.overlap_no_recompute) {
      c.parallel.knobs.overlap = true;
      c.memory.policy.recompute = Recompute::kNone;
    }
    PlanRequest base = plan_request(c, 2);
    base.reserve_bytes = 0;
    const Plan longest = max_seq_len(m, base);
    ASSERT_EQ(longest.fits, k.overlap_no_recompute);
    const int64_t s0 = longest.fits ? longest.request.decoder.seq_len : 0;
    const std::vector<Remedy> rs = longer(m, c, base, longest);
    bool found = false;
    for (const Remedy& f : rs) {
      SCOPED_TRACE(f.flags);
      EXPECT_TRUE(f.plan.fits);
      EXPECT_GT(f.plan.request.decoder.seq_len, s0);
      PlanRequest again = plan_request(f.config, 2);
      again.reserve_bytes = 0;
      const Plan p = max_seq_len(m, again);
      EXPECT_TRUE(p.fits);
      EXPECT_EQ(p.request.decoder.seq_len, f.plan.request.decoder.seq_len);
      EXPECT_EQ(p.device_peak, f.plan.device_peak);
      EXPECT_EQ(p.host_peak, f.plan.host_peak);
      if (f.flags == k.flags) {
        found = true;
        EXPECT_EQ(f.exact, k.exact);
      }
    }
    EXPECT_TRUE(found) << "goes further alone";
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

// Where not even one granule fits, the longest S below it, to kSeqQuantumBelow tokens; its limit is
// the budget, not the longest S train takes.
TEST(Planner, MaxSeqLenBelowOneGranule) {
  const ModelConfig m = load_model_config("tiny");
  for (const char* method : {"ulysses", "upipe", "ring", "fpdt"}) {
    PlanRequest r = tiny_request(method, int64_t(1) << 40);
    const int64_t g = seq_granularity(m, r, kSeqQuantumBelow);
    ASSERT_LT(g, seq_granularity(m, r)) << method;
    // A budget between the peaks at 10 and 11 fine granules: the answer is 10 of them.
    r.decoder.seq_len = 10 * g;
    const Plan at10 = plan_step(m, r);
    r.decoder.seq_len = 11 * g;
    const Plan at11 = plan_step(m, r);
    ASSERT_LT(at10.device_peak, at11.device_peak) << method;
    r.device_bytes = (at10.device_peak + at11.device_peak) / 2;
    const Plan best = max_seq_len(m, with_auto(r, false, false, false));
    EXPECT_TRUE(best.fits) << method;
    EXPECT_EQ(best.request.decoder.seq_len, 10 * g) << method;
    EXPECT_EQ(best.limit_arena, "device") << method;
    // Below even one fine granule: fits = false at the smallest S.
    r.decoder.seq_len = g;
    r.device_bytes = plan_step(m, r).device_peak - 1;
    const Plan none = max_seq_len(m, with_auto(r, false, false, false));
    EXPECT_FALSE(none.fits) << method;
    EXPECT_EQ(none.request.decoder.seq_len, g) << method;
  }
}

// Below one granule the frugal knobs stop on the host (fpdt's K/V chunks: 16 MiB at 65536 with
// N >= 2) where the knobs auto picks (N = 1, no host bytes) fit the whole granule: the search
// goes on above it with those (it stopped at 64512).
TEST(Planner, MaxSeqLenBelowOneGranuleGoesOnWithTheKnobsAutoPicks) {
  const ModelConfig m = load_model_config("tiny");
  RunConfig c;
  c.parallel.knobs.method = "fpdt";
  c.parallel.knobs.chunks = kKnobAuto;
  c.memory.device_bytes = int64_t(120) << 20;
  c.memory.host_bytes = int64_t(8) << 20;
  PlanRequest r = plan_request(c, 2);
  r.reserve_bytes = 0;
  const Plan p = max_seq_len(m, r);
  ASSERT_TRUE(p.fits);
  EXPECT_EQ(p.request.decoder.knobs.chunks, 1);
  EXPECT_GE(p.request.decoder.seq_len, kSeqQuantum);
  EXPECT_EQ(p.request.decoder.seq_len % kSeqQuantum, 0);
  EXPECT_EQ(p.limit_arena, "device");
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

TEST(Planner, AutoUlyssesDegreeKeepsTheAllToAllsWithinAHost) {
  // tiny (H = 4, K = 2) on C = 4 ranks, 2 to a host: u = 4 spans both hosts, so auto tries
  // u in {2, 1}; with every rank on one host (0) or 4 to a host, u = 4 comes first again.
  const ModelConfig m = load_model_config("tiny");
  PlanRequest r = tiny_request("usp", int64_t(1) << 40);
  r.decoder.seq_len = 16 * kSeqQuantum;
  auto degrees = [&](int per_host) {
    PlanRequest q = with_auto(r, false, false, true);
    q.ranks_per_host = per_host;
    std::vector<int> out;
    for (const PlanRequest& c : knob_candidates(m, q))
      out.push_back(c.decoder.knobs.ulysses_degree);
    return out;
  };
  EXPECT_EQ(degrees(2), (std::vector<int>{2, 1}));
  EXPECT_EQ(degrees(1), (std::vector<int>{1}));
  EXPECT_EQ(degrees(0), (std::vector<int>{4, 2, 1}));
  EXPECT_EQ(degrees(4), (std::vector<int>{4, 2, 1}));
  // 3 to a host: no u > 1 stays within a host (groups of 2 cut at rank 3), u = 1 does.
  EXPECT_EQ(degrees(3), (std::vector<int>{1}));
  // The hosts say where the plan runs, not what it holds: the same peak as on one host.
  PlanRequest q = r;
  q.decoder.knobs.ulysses_degree = 2;
  const Plan one = plan_step(m, q);
  q.ranks_per_host = 2;
  EXPECT_EQ(plan_step(m, q).device_peak, one.device_peak);
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
  // Past the meta device's range (16 TiB a rank): refused as such, never a plan of 0 bytes; a
  // search stopped by its budget is still an answer (no fit), not this error.
  r.decoder.knobs.method = "upipe";
  r.decoder.seq_len = int64_t(1) << 28;
  expect_config_error(
      [&] { plan_step(m, r); },
      {"--seq-len 268435456 needs more than 16384.00 GiB on rank 0", "plan a shorter --seq-len"});
  EXPECT_FALSE(plan_step(m, r, /*stop_at_budget=*/true).fits);
  // A model whose state alone is past the range: no shorter S helps, more ranks do (it said
  // "plan a shorter --seq-len").
  ModelConfig big = m;
  big.vocab_size = (int64_t(1) << 31) - 1;
  big.hidden_size = 65536;
  big.tie_word_embeddings = false;
  r.ranks = 1;
  r.decoder.seq_len = 4096;
  r.device_bytes = int64_t(1) << 60;  // 1 EiB: check_model_fits passes
  const std::string state = format_bytes(model_state_bytes(big, r));
  expect_config_error([&] { plan_step(big, r); },
                      {"does not fit any device on 1 ranks: its fp32 weights, gradients and AdamW "
                       "moments alone take " +
                       state +
                       " per rank (ZeRO-3 over 1 ranks), past the 16384.00 GiB the "
                       "planner counts per rank; plan more ranks or a smaller model"});
}

// A model whose shapes can split rank classes: K = 4 KV heads (replicated on 8 and 16 ranks), 16
// query heads, D = 60 and V = 1001, so no ZeRO-3 unit divides by the world and the last ranks'
// shards hold padding.
ModelConfig odd_model(bool qwen) {
  ModelConfig m = load_model_config(qwen ? "tiny-qwen3" : "tiny");
  m.hidden_size = 60;
  m.intermediate_size = 100;
  m.num_attention_heads = 16;
  m.num_key_value_heads = 4;
  m.head_dim = 8;
  m.vocab_size = 1001;
  return m;
}

void expect_same_rank(const RankPlan& a, const RankPlan& b, const std::string& what) {
  EXPECT_EQ(a.rank, b.rank) << what;
  EXPECT_EQ(a.device_peak, b.device_peak) << what << " rank " << b.rank;
  EXPECT_EQ(a.host_peak, b.host_peak) << what << " rank " << b.rank;
  EXPECT_EQ(a.device_at_peak.v, b.device_at_peak.v) << what << " rank " << b.rank;
  EXPECT_EQ(a.host_at_peak.v, b.host_at_peak.v) << what << " rank " << b.rank;
}

// Every field of the plan of one rank per class equals the plan of every rank.
void expect_same_plan(const Plan& fast, const Plan& every, const std::string& what) {
  EXPECT_EQ(fast.complete, every.complete) << what;
  EXPECT_EQ(fast.fits, every.fits) << what;
  EXPECT_EQ(fast.failure, every.failure) << what;
  EXPECT_EQ(fast.worst_rank, every.worst_rank) << what;
  EXPECT_EQ(fast.worst_host_rank, every.worst_host_rank) << what;
  EXPECT_EQ(fast.device_peak, every.device_peak) << what;
  EXPECT_EQ(fast.host_peak, every.host_peak) << what;
  EXPECT_EQ(fast.device_at_peak.v, every.device_at_peak.v) << what;
  EXPECT_EQ(fast.host_at_peak.v, every.host_at_peak.v) << what;
  EXPECT_EQ(fast.largest_device_tag, every.largest_device_tag) << what;
  EXPECT_EQ(fast.limit_arena, every.limit_arena) << what;
  EXPECT_EQ(fast.limit_tag, every.limit_tag) << what;
  ASSERT_EQ(fast.ranks.size(), every.ranks.size()) << what;
  for (size_t i = 0; i < fast.ranks.size(); ++i)
    expect_same_rank(fast.ranks[i], every.ranks[i], what);
  EXPECT_EQ(every.rank_classes, every.request.ranks) << what;
}

// Plans r with one rank per class and with every rank, unbudgeted and with budgets just below and
// at the worst rank's peaks (the verdicts and the failing rank); returns the number of classes,
// 0 when the method refuses r.
int compare_classes_with_every_rank(const ModelConfig& m, const PlanRequest& r,
                                    const std::string& what) {
  Plan every;
  try {
    every = plan_step(m, r, false, RankCoverage::kEveryRank);
  } catch (const ConfigError& e) {
    expect_config_error([&] { plan_step(m, r); }, {e.what()});
    return 0;
  }
  const Plan fast = plan_step(m, r);
  expect_same_plan(fast, every, what);
  for (const int64_t less : {int64_t(1), int64_t(0)}) {
    PlanRequest q = r;
    q.device_bytes = every.device_peak + q.reserve_bytes - less;
    q.host_bytes = std::max<int64_t>(1, every.host_peak - less);
    const std::string w = fmt::format("{}, budgets at the peaks - {}", what, less);
    expect_same_plan(plan_step(m, q, true), plan_step(m, q, true, RankCoverage::kEveryRank), w);
  }
  return fast.rank_classes;
}

TEST(Planner, RankClassesPlanExactlyLikeEveryRank) {
  struct Shape {
    int ranks, cp;
  };
  // CP = all ranks (K < C: replicated KV heads), CP x DP with K >= C and with K < C.
  const Shape shapes[] = {{8, 8}, {16, 16}, {16, 4}, {8, 2}, {16, 8}};
  const Recompute modes[] = {Recompute::kLayer, Recompute::kBlock, Recompute::kNone};
  int compared = 0;
  for (bool qwen : {false, true}) {
    const ModelConfig m = odd_model(qwen);
    for (size_t i = 0; i < std::size(shapes); ++i)
      for (const MethodInfo& mi : methods()) {
        const Shape& sh = shapes[i];
        if (mi.one_rank) continue;
        PlanRequest r = tiny_request(std::string(mi.name), int64_t(1) << 40);
        r.ranks = sh.ranks;
        r.cp_size = sh.cp;
        r.decoder.seq_len = 2048;  // divisible by 2C, N C (N <= 32) and the usp grids
        r.decoder.memory.tile_tokens = 48;
        r.decoder.memory.offload_stash = qwen;
        r.decoder.memory.stash_dtype = qwen ? DType::kBF16 : DType::kF32;
        r.decoder.memory.residual_dtype = qwen ? DType::kBF16 : DType::kF32;
        r.decoder.memory.recompute = modes[(i + (qwen ? 1 : 0)) % std::size(modes)];
        // Packed documents at their worst (every token a document), as train's plan has them.
        r.worst_case_documents = i % 2 == 1;
        // Every value of every knob the method takes (every U, u and N the planner tries).
        for (const PlanRequest& q : knob_candidates(m, with_auto(r, true, true, true))) {
          const MethodKnobs& k = q.decoder.knobs;
          const std::string what =
              fmt::format("{} {} on {} ranks (CP {}) U={} u={} N={} recompute {}{}", m.source,
                          mi.name, sh.ranks, sh.cp, k.stage_heads, k.ulysses_degree, k.chunks,
                          recompute_name(r.decoder.memory.recompute),
                          r.worst_case_documents ? ", worst-case documents" : "");
          const int classes = compare_classes_with_every_rank(m, q, what);
          if (classes == 0) continue;
          ++compared;
          EXPECT_EQ(classes, 1) << what << ": every rank's rows have the same run lengths";
        }
      }
  }
  RecordProperty("compared", compared);
  EXPECT_GT(compared, 200);
}

// Given document lengths: one class per CP rank, its DP replicas in it (they play the same
// documents), each class's plan the every-rank plan, budgets at and just below the peaks too.
TEST(Planner, DocLensClassesAreTheCpRanks) {
  const ModelConfig m = odd_model(false);
  int methods_compared = 0, multi_rank = 0;
  for (const MethodInfo& mi : methods()) {
    if (mi.one_rank) continue;
    ++multi_rank;
    PlanRequest r = tiny_request(std::string(mi.name), int64_t(1) << 40);
    r.ranks = 8;
    r.cp_size = 4;
    r.decoder.seq_len = 2048;
    r.decoder.memory.tile_tokens = 48;
    r.doc_lens = {700, 24, 1000, 300, 24};  // boundaries inside different ranks' rows
    // The first knob values the method takes (every U, u and N alike: the DP replicas of a CP
    // rank see the same rows whatever they are).
    for (const PlanRequest& q : knob_candidates(m, with_auto(r, true, true, true))) {
      const MethodKnobs& k = q.decoder.knobs;
      const std::string what = fmt::format("{} U={} u={} N={} on CP 4 x DP 2 with --doc-lens",
                                           mi.name, k.stage_heads, k.ulysses_degree, k.chunks);
      const int classes = compare_classes_with_every_rank(m, q, what);
      if (classes == 0) continue;  // refused: the next knob values
      EXPECT_EQ(classes, 4) << what;
      const std::vector<RankClass> c = rank_classes(m, q);
      ASSERT_EQ(c.size(), 4u) << what;
      for (int cp = 0; cp < 4; ++cp) {
        EXPECT_EQ(c[size_t(cp)].first, cp) << what;
        EXPECT_EQ(c[size_t(cp)].ranks, (std::vector<int>{cp, cp + 4})) << what;
      }
      ++methods_compared;
      break;
    }
  }
  RecordProperty("methods", methods_compared);
  EXPECT_GE(multi_rank, 7);  // ulysses, ring, usp, fpdt, upipe, upipe-ring, upipe-fpdt at least
  EXPECT_EQ(methods_compared, multi_rank) << "every multi-rank method plans these documents";
}

TEST(Planner, RankClassesSplitWhereRunsDiffer) {
  // usp with an odd Ulysses degree: C = 6 ranks in r = 2 groups of u = 3; each group's zigzag
  // shard is chunks g and 3-g of S/4 tokens, cut into three slices of S/6, so the middle member
  // holds the end of one chunk and the start of the other (two runs), the others one run each.
  // The classes split there whether or not an allocation depends on it; the plans are the
  // every-rank plans either way.
  ModelConfig m = odd_model(false);
  m.num_attention_heads = 12;
  m.num_key_value_heads = 3;
  for (const int dp : {1, 2, -1}) {  // -1: DP 1 with worst-case documents
    PlanRequest r = tiny_request("usp", int64_t(1) << 40);
    r.worst_case_documents = dp < 0;
    r.ranks = 6 * std::abs(dp);
    r.cp_size = 6;
    r.decoder.knobs.ulysses_degree = 3;
    r.decoder.seq_len = 1152;
    r.decoder.memory.tile_tokens = 48;
    const std::string what = fmt::format("usp u=3 on CP 6 x DP {}{}", std::abs(dp),
                                         dp < 0 ? ", worst-case documents" : "");
    EXPECT_EQ(compare_classes_with_every_rank(m, r, what), 2) << what;
    std::vector<int> ends, middles;
    for (int w = 0; w < r.ranks; ++w) (w % 3 == 1 ? middles : ends).push_back(w);
    const std::vector<RankClass> c = rank_classes(m, r);
    ASSERT_EQ(c.size(), 2u) << what;
    EXPECT_EQ(c[0].first, 0) << what;
    EXPECT_EQ(c[0].ranks, ends) << what;
    EXPECT_EQ(c[1].first, 1) << what;
    EXPECT_EQ(c[1].ranks, middles) << what;
  }
}

}  // namespace
}  // namespace upipe
