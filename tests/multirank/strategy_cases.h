// The table of strategy configurations the multi-rank suite and the meta-device test run: every
// strategy x MHA / GQA (G = 2, 4, 8) / K < C x several U, for a given rank count C. Only
// configurations a strategy documents as valid are generated (explicit rules, not by catching
// errors, so a wrongly rejected configuration fails instead of vanishing).
#pragma once

#include <algorithm>
#include <set>
#include <string>
#include <vector>

#include "attention/config.h"

namespace upipe::test {

struct StrategyCase {
  std::string method;
  AttentionConfig cfg;
  std::string name;
};

inline std::vector<StrategyCase> strategy_cases(int c) {
  struct Shape {
    int h, k;
  };
  const Shape shapes[] = {{8, 8}, {8, 4}, {16, 4}, {16, 2}, {8, 1}};
  std::vector<StrategyCase> out;
  auto add = [&](const std::string& method, Shape sh, int u, DType t, int n = 0) {
    AttentionConfig cfg;
    cfg.seq_len = 512;
    cfg.heads = sh.h;
    cfg.kv_heads = sh.k;
    cfg.head_dim = 32;
    cfg.dtype = t;
    cfg.head_chunk = u;
    cfg.chunks = n;
    std::string name = method + "_H" + std::to_string(sh.h) + "K" + std::to_string(sh.k);
    if (u) name += "_U" + std::to_string(u);
    if (n) name += "_N" + std::to_string(n);
    if (t != DType::kF32) name += "_bf16";
    std::replace(name.begin(), name.end(), '-', '_');  // test names allow [A-Za-z0-9_] only
    out.push_back({method, cfg, name});
  };
  for (const Shape& sh : shapes) {
    const bool heads_ok = sh.h % c == 0 && (sh.k % c == 0 || c % sh.k == 0);
    if (c == 1) add("local", sh, 0, DType::kF32);
    if (!heads_ok) continue;
    add("ulysses", sh, 0, DType::kF32);
    // U = C (the most stages), 2C, and H (one stage: Ulysses).
    for (int u : std::set<int>{c, 2 * c, sh.h})
      if (sh.h % u == 0) add("upipe", sh, u, DType::kF32);
  }
  if (16 % c == 0) add("upipe", {16, 4}, c, DType::kBF16);
  // fpdt (U = H) and upipe-fpdt under the same head rules, N = 2 or 4 sequence chunks, at S = 256
  // (S / (N C) >= 8 rows per sub-chunk): merge strategies are checked against the fp64 oracle,
  // the slowest part of the suite.
  auto add_chunked = [&](const std::string& method, Shape sh, int u, DType t, int n) {
    if (sh.h % c != 0 || (sh.k % c != 0 && c % sh.k != 0)) return;
    add(method, sh, u, t, n);
    out.back().cfg.seq_len = 256;
  };
  for (const Shape& sh : shapes)
    add_chunked("fpdt", sh, 0, DType::kF32, sh.k == 4 && sh.h == 16 ? 2 : 4);
  add_chunked("upipe-fpdt", {8, 8}, c, DType::kF32, 2);
  add_chunked("upipe-fpdt", {16, 4}, c, DType::kF32, 4);
  add_chunked("upipe-fpdt", {16, 2}, 2 * c, DType::kF32, 2);
  add_chunked("upipe-fpdt", {8, 1}, c, DType::kF32, 2);
  add_chunked("fpdt", {8, 4}, 0, DType::kBF16, 4);
  add_chunked("upipe-fpdt", {8, 4}, c, DType::kBF16, 2);
  return out;
}

}  // namespace upipe::test
