// The table of strategy configurations the multi-rank suite and the meta-device test run: every
// strategy x MHA / GQA (G = 2, 4, 8) / K < C x several U, for a given rank count C (1, 2, 3, 4,
// 8). Only configurations a strategy documents as valid are generated (explicit rules, not by
// catching errors, so a wrongly rejected configuration fails instead of vanishing):
//   ulysses, upipe: H % C = 0, K % C = 0 or C % K = 0, U a multiple of C dividing H; S % C = 0.
//   ring:           any heads; S % 2C = 0 (S = 256, or 252 when 2C does not divide 256).
//   usp(u), upipe-ring(u, U): u | C, H % u = 0, K % u = 0 or u % K = 0, U a multiple of u
//                   dividing H; S divisible by lcm(C, 2C/u). The table takes the Ulysses
//                   degrees strictly between 1 and C (ring across groups and all-to-all inside
//                   them), u = 1 for upipe-ring (UPipe stages of plain ring passes), and usp's
//                   two degenerate degrees once each (u = 1 is ring, u = C is Ulysses).
//   fpdt(N), upipe-fpdt(N, U): the ulysses/upipe head rules; S divisible by N C (S = 256).
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

// Whether usp / upipe-ring with Ulysses degree u fits H and K.
inline bool usp_heads_ok(int h, int k, int u) {
  return h % u == 0 && (k % u == 0 || u % k == 0);
}

inline std::vector<StrategyCase> strategy_cases(int c) {
  struct Shape {
    int h, k;
  };
  const Shape shapes[] = {{8, 8}, {8, 4}, {16, 4}, {16, 2}, {8, 1}};
  std::vector<StrategyCase> out;
  // deg: Ulysses degree (usp, upipe-ring); n: sequence chunks (fpdt, upipe-fpdt).
  auto add_case = [&](const std::string& method, Shape sh, int u, int deg, DType t, int n = 0) {
    AttentionConfig cfg;
    const bool ring = method == "ring" || deg > 0;
    const bool merge = ring || n > 0;
    const int64_t grain = ring ? 2 * c : c;  // zigzag needs 2C | S
    // Merge strategies run at S = 256: the rank-0 fp64 oracle is the slowest part of the suite.
    cfg.seq_len = (merge ? 256 : 512) / grain * grain;
    cfg.heads = sh.h;
    cfg.kv_heads = sh.k;
    cfg.head_dim = 32;
    cfg.dtype = t;
    cfg.head_chunk = u;
    cfg.ulysses_degree = deg;
    cfg.chunks = n;
    std::string name = method;
    if (deg) name += "_u" + std::to_string(deg);
    name += "_H" + std::to_string(sh.h) + "K" + std::to_string(sh.k);
    if (u) name += "_U" + std::to_string(u);
    if (n) name += "_N" + std::to_string(n);
    if (t != DType::kF32) name += "_bf16";
    std::replace(name.begin(), name.end(), '-', '_');  // test names allow [A-Za-z0-9_] only
    out.push_back({method, cfg, name});
  };
  auto add = [&](const std::string& method, Shape sh, int u, DType t) {
    add_case(method, sh, u, 0, t);
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

  // Ring-based strategies on MHA, GQA (G = 2, 8) and K = 1 (K < u).
  const Shape merge_shapes[] = {{8, 8}, {8, 4}, {16, 2}, {8, 1}};
  for (const Shape& sh : merge_shapes) add("ring", sh, 0, DType::kF32);
  add("ring", {16, 4}, 0, DType::kBF16);
  add_case("usp", {8, 4}, 0, 1, DType::kF32);                                      // = ring
  if (c > 1 && usp_heads_ok(8, 4, c)) add_case("usp", {8, 4}, 0, c, DType::kF32);  // = ulysses
  for (int deg = 2; deg < c; ++deg) {
    if (c % deg != 0) continue;
    for (const Shape& sh : merge_shapes) {
      if (!usp_heads_ok(sh.h, sh.k, deg)) continue;
      add_case("usp", sh, 0, deg, DType::kF32);
      for (int u : std::set<int>{deg, 2 * deg})
        if (sh.h % u == 0) add_case("upipe-ring", sh, u, deg, DType::kF32);
    }
    add_case("usp", {16, 4}, 0, deg, DType::kBF16);
    add_case("upipe-ring", {16, 4}, deg, deg, DType::kBF16);
  }
  if (c > 1) {  // UPipe stages of plain ring passes (u = 1): MHA, one query head per stage, GQA
    add_case("upipe-ring", {8, 8}, 2, 1, DType::kF32);
    add_case("upipe-ring", {8, 4}, 1, 1, DType::kF32);
    add_case("upipe-ring", {16, 2}, 4, 1, DType::kF32);
  }

  // fpdt (U = H) and upipe-fpdt under the ulysses head rules, N = 2 or 4 sequence chunks.
  auto add_chunked = [&](const std::string& method, Shape sh, int u, DType t, int n) {
    if (sh.h % c != 0 || (sh.k % c != 0 && c % sh.k != 0)) return;
    add_case(method, sh, u, 0, t, n);
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
