// Input validation at the library boundary: the shape bounds of AttentionConfig, and the
// strategies' ConfigError messages at extreme sizes — refused quickly, naming the flag, and never
// suggesting a negative or overflowed value.
#include <gtest/gtest.h>

#include <chrono>
#include <regex>

#include "attention/headwise.h"
#include "attention/strategy.h"
#include "comm/fake/fake_comm.h"
#include "backend/device.h"
#include "core/errors.h"

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
  EXPECT_NE(with([](auto& c) { c.head_chunk = -1; }).find("--head-chunk"), std::string::npos);
  EXPECT_NE(with([](auto& c) { c.ulysses_degree = -1; }).find("--ulysses-degree"),
            std::string::npos);
  EXPECT_NE(with([](auto& c) { c.chunks = 2000; }).find("--chunks"), std::string::npos);
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
          c.chunks = int(std::min<int64_t>(chunks, s));
          c.ulysses_degree = ranks == 8 ? 4 : 0;
          Device dev({BackendKind::kMeta, int64_t(1) << 40, int64_t(1) << 40});
          FakeCommunicator comm(0, ranks);
          try {
            make_strategy(method, {dev, comm, c});
          } catch (const ConfigError& e) {
            EXPECT_FALSE(std::regex_search(e.what(), negative)) << method << ": " << e.what();
          }
        }
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), 10.0);
}

TEST(Config, FpdtChunksAreFoundQuicklyAtAnySize) {
  AttentionConfig c = base();
  c.seq_len = int64_t(1) << 40;
  c.chunks = 1000000;
  try {
    fpdt_chunks(c, 8);
    FAIL() << "expected ConfigError";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("try --chunks 524288"), std::string::npos) << e.what();
  }
  c.chunks = 0;
  EXPECT_EQ(fpdt_chunks(c, 8), 4);
  c.seq_len = 8 * 3;
  EXPECT_EQ(fpdt_chunks(c, 8), 3);
}

}  // namespace
}  // namespace upipe
