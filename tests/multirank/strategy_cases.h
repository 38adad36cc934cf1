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
// Three groups of cases on top, for every method the rules admit on C ranks:
//   block options: H = 8, K = 4, d = 32, S = 256 (252 on 3 ranks) with hidden size D != H d,
//                   Qwen3 QK-norm and llama3 RoPE scaling (factor 8, frequency factors 1 and 4,
//                   original context 256, so the rescaled band lies inside these positions):
//                   one fp32 case (D = 200) and one bf16 case with an fp32 residual (D = 320).
//                   Every method uses the same shape, so rank 0 computes the oracle once.
//                   U = C (upipe, upipe-fpdt), u = the largest proper divisor of C (usp,
//                   upipe-ring; 1 when C is prime) with U = 2u when that divides H, N = 2.
//   GQA runs across KV heads (upipe, upipe-fpdt, upipe-ring), off the tile grid: H = 6C,
//                   K = 2C, d = 16 and m = 2 query heads per rank per stage (U = 2C; 2u for
//                   upipe-ring, u as above), so m and G = 3 are co-prime and a rank's heads in a
//                   stage read two KV heads; and K < C (C > 1: H = 3C, K = max(1, C/2), U = C,
//                   three query heads per rank). S = 296 rounded up to a multiple of 2C (300 on
//                   3 ranks, 304 on 8): every call's keys end in a partial kernel key tile.
//   stage overlap:  upipe on MHA (a KV set per stage) and GQA (H = 16, K = 2), upipe-fpdt
//                   (N = 2) on the GQA shape, K < C and upipe-ring across KV heads (C > 1),
//                   and the bf16 block options, all with MethodKnobs::overlap, where U < H.
//   long shards (C = 2 only): S = 2048, so each rank holds 1024 rows, more than the largest
//                   kernel tile (768 forward query rows): H = 4, K = 1, d = 16 (small: the
//                   rank-0 fp64 oracle is shared by all and is the slow part), U = 2, N = 2
//                   (fpdt chunks of 1024 rows), usp and upipe-ring with u = 1.
#pragma once

#include <algorithm>
#include <ostream>
#include <set>
#include <string>
#include <vector>

#include "attention/config.h"

namespace upipe::test {

struct StrategyCase {
  AttentionConfig cfg;  // the shape and the method with its knobs (cfg.knobs)
  std::string name;
  const std::string& method() const { return cfg.knobs.method; }
};

// gtest prints a case by its name.
inline void PrintTo(const StrategyCase& c, std::ostream* os) {
  *os << c.name;
}

// Whether usp / upipe-ring with Ulysses degree u fits H and K.
inline bool usp_heads_ok(int h, int k, int u) {
  return h % u == 0 && (k % u == 0 || u % k == 0);
}

// What the option groups of the table set beyond the shape and the method's knobs.
struct BlockOptions {
  int64_t seq_len = 0;  // 0: the table's default for the method
  int head_dim = 32;
  int64_t hidden = 0;
  bool qk_norm = false, llama3 = false, fp32_residual = false;
  bool overlap = false;  // MethodKnobs::overlap
};

inline std::vector<StrategyCase> strategy_cases(int c) {
  struct Shape {
    int h, k;
  };
  const Shape shapes[] = {{8, 8}, {8, 4}, {16, 4}, {16, 2}, {8, 1}};
  std::vector<StrategyCase> out;
  // deg: Ulysses degree (usp, upipe-ring); n: sequence chunks (fpdt, upipe-fpdt).
  auto add_case = [&](const std::string& method, Shape sh, int u, int deg, DType t, int n = 0,
                      const BlockOptions& opt = {}) {
    AttentionConfig cfg;
    const bool ring = method == "ring" || deg > 0;
    const bool merge = ring || n > 0;
    const int64_t grain = ring ? 2 * c : c;  // zigzag needs 2C | S
    // Merge strategies run at S = 256: the rank-0 fp64 oracle is the slowest part of the suite.
    cfg.seq_len = opt.seq_len > 0 ? opt.seq_len : (merge ? 256 : 512) / grain * grain;
    cfg.heads = sh.h;
    cfg.kv_heads = sh.k;
    cfg.head_dim = opt.head_dim;
    cfg.hidden = opt.hidden;
    cfg.qk_norm = opt.qk_norm;
    cfg.fp32_residual = opt.fp32_residual;
    if (opt.llama3) cfg.rope.scaling = {true, 8.0, 1.0, 4.0, 256};
    cfg.dtype = t;
    cfg.knobs = {method, u, deg, n, opt.overlap};
    std::string name = method;
    if (deg) name += "_u" + std::to_string(deg);
    name += "_H" + std::to_string(sh.h) + "K" + std::to_string(sh.k);
    if (u) name += "_U" + std::to_string(u);
    if (n) name += "_N" + std::to_string(n);
    if (opt.seq_len > 0) name += "_S" + std::to_string(opt.seq_len);
    if (opt.head_dim != 32) name += "_d" + std::to_string(opt.head_dim);
    if (opt.hidden > 0) name += "_D" + std::to_string(opt.hidden);
    if (opt.qk_norm) name += "_qknorm";
    if (opt.llama3) name += "_llama3";
    if (t != DType::kF32) name += "_bf16";
    if (opt.fp32_residual) name += "_f32res";
    if (opt.overlap) name += "_overlap";
    std::replace(name.begin(), name.end(), '-', '_');  // test names allow [A-Za-z0-9_] only
    out.push_back({cfg, name});
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

  // Block options: every method on one shape (one oracle), fp32 and bf16 with an fp32 residual.
  const Shape opt_shape{8, 4};
  const bool opt_heads_ok = opt_shape.h % c == 0 && (opt_shape.k % c == 0 || c % opt_shape.k == 0);
  int opt_deg = 1;  // largest proper divisor of C
  for (int deg = 2; deg < c; ++deg)
    if (c % deg == 0 && usp_heads_ok(opt_shape.h, opt_shape.k, deg)) opt_deg = deg;
  const int opt_u = opt_shape.h % (2 * opt_deg) == 0 ? 2 * opt_deg : opt_deg;
  for (DType t : {DType::kF32, DType::kBF16}) {
    BlockOptions opt;
    opt.seq_len = 256 / (2 * c) * (2 * c);
    opt.hidden = t == DType::kF32 ? 200 : 320;
    opt.qk_norm = opt.llama3 = true;
    opt.fp32_residual = t != DType::kF32;
    if (c == 1) add_case("local", opt_shape, 0, 0, t, 0, opt);
    if (opt_heads_ok) {
      add_case("ulysses", opt_shape, 0, 0, t, 0, opt);
      add_case("upipe", opt_shape, c, 0, t, 0, opt);
      add_case("fpdt", opt_shape, 0, 0, t, 2, opt);
      add_case("upipe-fpdt", opt_shape, c, 0, t, 2, opt);
    }
    add_case("ring", opt_shape, 0, 0, t, 0, opt);
    add_case("usp", opt_shape, 0, opt_deg, t, 0, opt);
    if (c > 1) add_case("upipe-ring", opt_shape, opt_u, opt_deg, t, 0, opt);
  }

  // GQA runs across KV heads, off the tile grid. Keys per call: S (upipe), S / 2 (an fpdt
  // chunk), zigzag halves of S u / C (upipe-ring): partial key tiles, mostly off the 16-key
  // panels too.
  {
    BlockOptions opt;
    opt.seq_len = (296 + 2 * c - 1) / (2 * c) * (2 * c);
    opt.head_dim = 16;
    const Shape cross{6 * c, 2 * c};
    add_case("upipe", cross, 2 * c, 0, DType::kF32, 0, opt);
    add_case("upipe-fpdt", cross, 2 * c, 0, DType::kF32, 2, opt);
    if (c > 1) add_case("upipe-ring", cross, 2 * opt_deg, opt_deg, DType::kF32, 0, opt);
    if (c > 1) {
      const Shape replicated{3 * c, std::max(1, c / 2)};
      add_case("upipe", replicated, c, 0, DType::kF32, 0, opt);
      add_case("upipe-fpdt", replicated, c, 0, DType::kF32, 2, opt);
    }
  }

  // Stage overlap: every method with head stages, on a new KV set each stage (MHA), stages
  // within a set (GQA, and across KV heads off the tile grid), K < C, fpdt chunks, a ring core,
  // and the block options in bf16.
  {
    BlockOptions opt;
    opt.overlap = true;
    const Shape mha{8, 8}, gqa{16, 2};
    // Only where there is more than one stage (8 ranks: U = 8 = H is one stage).
    if (8 % c == 0 && c < 8) {
      add_case("upipe", mha, c, 0, DType::kF32, 0, opt);
      add_case("upipe-fpdt", mha, c, 0, DType::kF32, 2, opt);  // the next set per chunk
    }
    if (16 % c == 0 && (2 % c == 0 || c % 2 == 0)) {
      add_case("upipe", gqa, c, 0, DType::kF32, 0, opt);
      add_case("upipe-fpdt", gqa, c, 0, DType::kF32, 2, opt);
    }
    if (c > 1) {
      const Shape replicated{3 * c, std::max(1, c / 2)};
      BlockOptions off = opt;
      off.seq_len = (296 + 2 * c - 1) / (2 * c) * (2 * c);
      off.head_dim = 16;
      add_case("upipe", replicated, c, 0, DType::kF32, 0, off);
      add_case("upipe-ring", {6 * c, 2 * c}, 2 * opt_deg, opt_deg, DType::kF32, 0, off);
    }
    BlockOptions bf = opt;
    bf.seq_len = 256 / (2 * c) * (2 * c);
    bf.hidden = 320;
    bf.qk_norm = bf.llama3 = bf.fp32_residual = true;
    if (opt_heads_ok && c < opt_shape.h) add_case("upipe", opt_shape, c, 0, DType::kBF16, 0, bf);
  }

  // Long shards: more rows per rank than the largest kernel tile, on 2 ranks.
  if (c == 2) {
    BlockOptions opt;
    opt.seq_len = 2048;
    opt.head_dim = 16;
    const Shape sh{4, 1};
    add_case("ulysses", sh, 0, 0, DType::kF32, 0, opt);
    add_case("upipe", sh, 2, 0, DType::kF32, 0, opt);
    add_case("ring", sh, 0, 0, DType::kF32, 0, opt);
    add_case("usp", sh, 0, 1, DType::kF32, 0, opt);
    add_case("upipe-ring", sh, 2, 1, DType::kF32, 0, opt);
    add_case("fpdt", sh, 0, 0, DType::kF32, 2, opt);
    add_case("upipe-fpdt", sh, 2, 0, DType::kF32, 2, opt);
  }
  return out;
}

}  // namespace upipe::test
