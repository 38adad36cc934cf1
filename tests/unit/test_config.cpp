// Input validation at the library boundary: the shape bounds of AttentionConfig, and the
// strategies' ConfigError messages at extreme sizes — refused quickly, naming the flag, and never
// suggesting a negative or overflowed value.
#include <gtest/gtest.h>

#include <chrono>
#include <regex>

#include "attention/headwise.h"
#include "attention/methods.h"
#include "backend/device.h"
#include "comm/fake/fake_comm.h"
#include "core/errors.h"
#include "core/setting_ref.h"

namespace upipe {
namespace {

AttentionConfig base() {
  AttentionConfig c;
  c.seq_len = 1024;
  c.heads = 8;
  c.kv_heads = 2;
  c.head_dim = 64;
  return c;
}

std::string error_of(const AttentionConfig& c) {
  try {
    c.validate_shape();
  } catch (const ConfigError& e) {
    return e.what();
  }
  return "";
}

std::string knob_error_of(const MethodKnobs& k) {
  try {
    validate_knobs(k);
  } catch (const ConfigError& e) {
    return e.what();
  }
  return "";
}

// The knobs' ranges, and a knob given to a method that does not take it.
TEST(Config, KnobBoundsNameTheFlag) {
  EXPECT_EQ(knob_error_of({"upipe", 4}), "");
  EXPECT_NE(knob_error_of({"upipe", -1}).find("--stage-heads"), std::string::npos);
  EXPECT_NE(knob_error_of({"usp", 0, -1}).find("--ulysses-degree"), std::string::npos);
  EXPECT_NE(knob_error_of({"fpdt", 0, 0, kMaxChunks + 1}).find("--chunks"), std::string::npos);
  EXPECT_NE(knob_error_of({"ring", 4}).find("--stage-heads is a knob of upipe, upipe-ring"),
            std::string::npos);
  EXPECT_NE(knob_error_of({"zigzag"}).find("unknown method 'zigzag'"), std::string::npos);
  EXPECT_EQ(knob_error_of({"upipe", kKnobAuto}).find("or auto"), std::string::npos);
}

TEST(Config, ShapeBoundsNameTheFlag) {
  EXPECT_EQ(error_of(base()), "");
  auto with = [](auto set) {
    AttentionConfig c = base();
    set(c);
    return error_of(c);
  };
  EXPECT_NE(with([](auto& c) { c.seq_len = 0; }).find("--seq-len"), std::string::npos);
  EXPECT_NE(with([](auto& c) { c.heads = kMaxHeads + 1; }).find("--heads"), std::string::npos);
  EXPECT_NE(with([](auto& c) { c.kv_heads = 16; }).find("--kv-heads"), std::string::npos);
  EXPECT_NE(with([](auto& c) { c.head_dim = 7; }).find("--head-dim"), std::string::npos);
  EXPECT_NE(with([](auto& c) { c.rope.theta = std::nan(""); }).find("--rope-theta"),
            std::string::npos);
  EXPECT_NE(with([](auto& c) { c.rope.theta = -1; }).find("--rope-theta"), std::string::npos);
  EXPECT_NE(with([](auto& c) { c.rope.theta = INFINITY; }).find("--rope-theta"), std::string::npos);
  // S x H x d beyond 2^50 elements (or int64 itself) is refused with a --seq-len that fits.
  for (int64_t s : {int64_t(1) << 44, int64_t(1) << 62, INT64_MAX}) {
    const std::string e = with([s](auto& c) { c.seq_len = s; });
    EXPECT_NE(e.find("try --seq-len 2199023255552 or less"), std::string::npos) << e;
  }
  EXPECT_EQ(with([](auto& c) { c.seq_len = int64_t(1) << 41; }), "");
}

// Every method at extreme (valid) shapes and rank counts: a refusal suggests no negative number,
// and a huge --chunks is refused at once.
TEST(Config, StrategyMessagesNeverSuggestNegativeValues) {
  const std::regex negative("--[a-z-]+ -[0-9]");
  const auto t0 = std::chrono::steady_clock::now();
  for (const char* method : {"ulysses", "upipe", "ring", "usp", "upipe-ring", "fpdt", "upipe-fpdt"})
    for (int ranks : {3, 8, 65536})
      for (int64_t s : {int64_t(1) << 41, (int64_t(1) << 41) - 1, int64_t(3), int64_t(1)})
        for (int chunks : {0, 3, 2147483647}) {
          AttentionConfig c = base();
          c.seq_len = s;
          c.knobs = knobs_for({method, 0, ranks == 8 ? 4 : 0, int(std::min<int64_t>(chunks, s))},
                              method_info(method));
          Device dev({BackendKind::kMeta, int64_t(1) << 40, int64_t(1) << 40});
          FakeCommunicator comm(0, ranks);
          try {
            make_strategy({dev, comm, c});
          } catch (const ConfigError& e) {
            EXPECT_FALSE(std::regex_search(e.what(), negative)) << method << ": " << e.what();
          }
        }
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), 10.0);
}

TEST(Config, FpdtChunksAreFoundQuicklyAtAnySize) {
  AttentionConfig c = base();
  c.seq_len = int64_t(1) << 40;
  c.knobs.chunks = 1000000;
  try {
    fpdt_chunks(c, 8);
    FAIL() << "expected ConfigError";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("try --chunks 524288"), std::string::npos) << e.what();
  }
  c.knobs.chunks = 0;
  EXPECT_EQ(fpdt_chunks(c, 8), 4);
  c.seq_len = 8 * 3;
  EXPECT_EQ(fpdt_chunks(c, 8), 3);
}

// The knobs a method runs with, defaults resolved (plan's and bench's "resolved_knobs"), and
// knobs_text saying the same.
TEST(Config, ResolvedKnobsAreWhatRuns) {
  AttentionConfig c = base();  // H = 8, S = 1024
  auto resolved = [&](const std::string& method, int u, int n, int stage, int ranks) {
    c.knobs = MethodKnobs{};
    c.knobs.method = method;
    c.knobs.ulysses_degree = u;
    c.knobs.chunks = n;
    c.knobs.stage_heads = stage;
    const MethodKnobs k = resolved_knobs(c, ranks);
    return std::vector<int>{k.stage_heads, k.ulysses_degree, k.chunks};
  };
  EXPECT_EQ(resolved("local", 0, 0, 0, 1), (std::vector<int>{0, 0, 0}));
  EXPECT_EQ(resolved("upipe", 0, 0, 0, 4), (std::vector<int>{4, 0, 0}));  // U = the group
  EXPECT_EQ(knobs_text(c, 4), "U=4");
  EXPECT_EQ(resolved("upipe", 0, 0, 8, 4), (std::vector<int>{8, 0, 0}));
  EXPECT_EQ(resolved("usp", 0, 0, 0, 4), (std::vector<int>{0, 4, 0}));  // u = all ranks
  EXPECT_EQ(knobs_text(c, 4), "-");
  EXPECT_EQ(resolved("upipe-ring", 2, 0, 0, 4), (std::vector<int>{2, 2, 0}));  // U = u
  EXPECT_EQ(knobs_text(c, 4), "U=2 u=2");
  EXPECT_EQ(resolved("fpdt", 0, 0, 0, 4), (std::vector<int>{0, 0, fpdt_chunks(c, 4)}));
  EXPECT_EQ(knobs_text(c, 4), "N=" + std::to_string(fpdt_chunks(c, 4)));
  EXPECT_EQ(resolved("upipe-fpdt", 0, 2, 0, 4), (std::vector<int>{4, 0, 2}));
  EXPECT_EQ(knobs_text(c, 4), "U=4 N=2");
}

// Where a method's all-to-alls run: its stage groups of consecutive ranks inside CP groups of
// consecutive ranks, against the hosts the ranks run on.
TEST(Config, AllToAllHostsFollowTheStageGroups) {
  AttentionConfig c = base();  // H = 8, K = 2
  auto hosts = [](const MethodKnobs& k, int cp, const std::vector<int>& host_of) {
    return all_to_all_hosts(method_info(k.method), k, cp, host_of);
  };
  MethodKnobs k;
  k.method = "upipe";
  EXPECT_EQ(hosts_in_order(6, 4), (std::vector<int>{0, 0, 0, 0, 1, 1}));
  EXPECT_EQ(hosts_in_order(3, 0), (std::vector<int>{0, 0, 0}));
  EXPECT_EQ(hosts(k, 8, hosts_in_order(8, 4)), 2);  // the CP group spans both hosts
  EXPECT_EQ(hosts(k, 4, hosts_in_order(8, 4)), 1);  // DP 2 x CP 4: a CP group a host
  EXPECT_EQ(hosts(k, 8, hosts_in_order(8, 2)), 4);
  EXPECT_EQ(hosts(k, 8, std::vector<int>{5, 5, 5, 5, 5, 5, 5, 9}), 2);  // any host ids
  k.method = "usp";
  k.ulysses_degree = 4;
  EXPECT_EQ(hosts(k, 8, hosts_in_order(8, 4)), 1);
  EXPECT_EQ(hosts(k, 8, hosts_in_order(8, 2)), 2);
  EXPECT_EQ(hosts(k, 8, std::vector<int>{0, 0, 0, 1, 1, 1, 1, 1}), 2);  // 3 + 5: cut at rank 3
  k.ulysses_degree = 0;                                                 // all ranks
  EXPECT_EQ(hosts(k, 8, hosts_in_order(8, 4)), 2);
  k = MethodKnobs{};
  k.method = "ring";  // send/recv only
  EXPECT_EQ(hosts(k, 8, hosts_in_order(8, 1)), 0);
  // The note: how many hosts, the group, and the largest u that keeps them within a host.
  c.knobs.method = "ulysses";
  EXPECT_EQ(across_hosts_note(c, 8, hosts_in_order(8, 8)), "");
  const std::string note = render_setting_refs(across_hosts_note(c, 8, hosts_in_order(8, 4)));
  EXPECT_EQ(note,
            "ulysses's all-to-alls span 2 hosts (8 ranks a group): every layer's all-to-alls "
            "cross the network; --method upipe-ring --ulysses-degree 4 keeps them within a host");
  // One rank a host: no u > 1 stays within one, so none is suggested.
  EXPECT_EQ(render_setting_refs(across_hosts_note(c, 2, hosts_in_order(2, 1))),
            "ulysses's all-to-alls span 2 hosts (2 ranks a group): every layer's all-to-alls "
            "cross the network");
}

}  // namespace
}  // namespace upipe
