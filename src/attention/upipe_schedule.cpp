#include "attention/upipe_schedule.h"

#include <fmt/format.h>

#include <algorithm>
#include <numeric>

#include "core/errors.h"

namespace upipe {

int UpipeSchedule::q_head(int stage, int rank) const {
  if (replicated()) return rank * (heads / ranks) + stage * m;
  const int t = stage / stages_per_set, sigma = stage % stages_per_set;
  return kv_head(t, rank) * gqa_group + sigma * m;
}

int UpipeSchedule::kv_head(int set, int rank) const {
  if (replicated()) return rank / (ranks / kv_heads);
  return rank * (kv_heads / ranks) + set * kv_per_rank;
}

std::vector<HeadRun> head_runs(const UpipeSchedule& s, int stage) {
  const int m = s.m, g = s.gqa_group;
  if (s.replicated()) return {{0, m, 0, 1}};
  const int base = (stage % s.stages_per_set) * m;  // offset within the rank's set heads
  if (m % g == 0) return {{0, m, base / g, m / g}};
  std::vector<HeadRun> r;
  for (int i = 0; i < m;) {
    const int kv = (base + i) / g;
    const int end = std::min(m, (kv + 1) * g - base);
    r.push_back({i, end - i, kv, 1});
    i = end;
  }
  return r;
}

namespace {

std::string divisors_multiple_of(int h, int c) {
  std::string s;
  for (int u = c; u <= h; u += c)
    if (h % u == 0) s += (s.empty() ? "" : ", ") + std::to_string(u);
  return s.empty() ? "none" : s;
}

}  // namespace

UpipeSchedule make_upipe_schedule(const AttentionConfig& cfg, int c, int stage_heads) {
  const int h = cfg.heads, k = cfg.kv_heads;
  // A pretrained model's heads are not the user's to change: the group's size comes first.
  if (h % c != 0)
    throw ConfigError(fmt::format(
        "{} ({}) must be divisible by the number of ranks in the all-to-all group ({}); run on a "
        "group of {} ranks (fewer ranks, or {} for a CP group of them), or {} (any rank count), "
        "or change {}",
        setting_ref("attention.heads"), h, c, divisors_multiple_of(h, 1),
        setting_ref("parallel.cp_size"), setting_value("parallel.method", "ring"),
        setting_ref("attention.heads")));
  if (k >= c && k % c != 0)
    throw ConfigError(fmt::format(
        "{} ({}) must be divisible by the all-to-all group size ({}) when it is larger, "
        "or divide it when smaller; change {} or the rank count",
        setting_ref("attention.kv_heads"), k, c, setting_ref("attention.kv_heads")));
  if (k < c && c % k != 0)
    throw ConfigError(
        fmt::format("the all-to-all group size ({}) must be divisible by {} ({}) to replicate KV "
                    "heads; change {} or the rank count",
                    c, setting_ref("attention.kv_heads"), k, setting_ref("attention.kv_heads")));
  const int u = stage_heads == 0 ? c : stage_heads;
  if (u <= 0 || u % c != 0 || h % u != 0)
    throw ConfigError(fmt::format(
        "{} must be a multiple of the all-to-all group size ({}) dividing {} ({}); valid "
        "values: {}",
        setting_value("parallel.stage_heads", u), c, setting_ref("attention.heads"), h,
        divisors_multiple_of(h, c)));
  UpipeSchedule s;
  s.ranks = c;
  s.heads = h;
  s.kv_heads = k;
  s.heads_per_stage = u;
  s.m = u / c;
  s.gqa_group = h / k;
  if (s.replicated()) {
    s.kv_per_rank = 1;
    s.sets = 1;
    s.stages_per_set = h / u;
  } else {
    const int g = std::gcd(s.m, s.gqa_group);
    s.kv_per_rank = s.m / g;
    s.stages_per_set = s.gqa_group / g;
    s.sets = (k / c) / s.kv_per_rank;
  }
  return s;
}

}  // namespace upipe
