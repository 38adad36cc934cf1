#include "plan/planner.h"

#include <fmt/format.h>

#include <algorithm>
#include <numeric>

#include "attention/headwise.h"
#include "backend/device.h"
#include "comm/fake/fake_comm.h"
#include "core/checked.h"
#include "core/errors.h"
#include "train/trainer.h"

namespace upipe {

TrainOptions train_options(const PlanRequest& r) {
  TrainOptions o;
  o.cp_size = r.cp_size;
  o.decoder.method = r.method;
  o.decoder.attn.seq_len = r.seq_len;
  o.decoder.attn.dtype = r.dtype;
  o.decoder.attn.head_chunk = r.head_chunk;
  o.decoder.attn.ulysses_degree = r.ulysses_degree;
  o.decoder.attn.chunks = r.chunks;
  o.decoder.tile_tokens = r.tile_tokens;
  o.decoder.offload_stash = r.offload_stash;
  o.decoder.stash_dtype = r.stash_dtype;
  o.decoder.residual_dtype = r.residual_dtype;
  o.decoder.recompute = r.recompute;
  return o;
}

namespace {

int cp_of(const PlanRequest& r) {
  return r.cp_size == 0 ? r.ranks : r.cp_size;
}

void check_request(const PlanRequest& r) {
  if (r.ranks < 1) throw ConfigError(fmt::format("--ranks must be >= 1 (got {})", r.ranks));
  if (r.cp_size < 0 || (r.cp_size > 0 && r.ranks % r.cp_size != 0))
    throw ConfigError(fmt::format("--cp-size ({}) must divide --ranks ({})", r.cp_size, r.ranks));
  if (r.reserve_bytes < 0 || r.reserve_bytes >= r.device_bytes)
    throw ConfigError(fmt::format("--reserve-gib ({}) must be less than --device-gib ({})",
                                  format_bytes(r.reserve_bytes), format_bytes(r.device_bytes)));
}

Tag largest_tag(const TagBytes& b) {
  int best = 0;
  for (int t = 1; t < kNumTags; ++t)
    if (b.v[size_t(t)] > b.v[size_t(best)]) best = t;
  return Tag(best);
}

bool has_head_chunk(const std::string& m) {
  return m == "upipe" || m == "upipe-ring" || m == "upipe-fpdt";
}
bool has_chunks(const std::string& m) {
  return m == "fpdt" || m == "upipe-fpdt";
}
bool has_ulysses_degree(const std::string& m) {
  return m == "usp" || m == "upipe-ring";
}

}  // namespace

RankPlan plan_rank(const ModelConfig& m, const PlanRequest& r, int rank, int64_t budget_device,
                   int64_t budget_host) {
  check_request(r);
  const int64_t unlimited = MetaAllocator::reserved_bytes();
  Device dev({BackendKind::kMeta, budget_device > 0 ? budget_device : unlimited,
              budget_host > 0 ? budget_host : unlimited});
  FakeCommunicator world(rank, r.ranks);
  Trainer tr(dev, world, m, train_options(r));
  tr.zero().init(nullptr, 0);
  dev.mem().reset_peak();
  dev.host().reset_peak();
  // Token ids do not matter on the meta device (nothing reads them); zeros are valid ids.
  const Sequence seq{std::vector<int32_t>(size_t(r.seq_len), 0), {}};
  tr.step(0, [&](int64_t, int, int) { return seq; });
  return {rank, dev.mem().peak(), dev.host().peak(), dev.mem().at_peak_by_tag(),
          dev.host().at_peak_by_tag()};
}

Plan plan_step(const ModelConfig& m, const PlanRequest& r, bool stop_at_budget) {
  check_request(r);
  Plan p;
  p.request = r;
  const int64_t dev_budget = r.device_bytes - r.reserve_bytes;
  for (int rank = 0; rank < r.ranks; ++rank) {
    RankPlan rp;
    try {
      rp = stop_at_budget ? plan_rank(m, r, rank, dev_budget, r.host_bytes) : plan_rank(m, r, rank);
    } catch (const OutOfMemoryError& e) {
      p.complete = false;
      p.fits = false;
      p.failure = fmt::format("rank {}: {}", rank, e.what());
      return p;
    }
    if (rp.device_peak > p.device_peak || rank == 0) {
      p.device_peak = rp.device_peak;
      p.device_at_peak = rp.device_at_peak;
      p.worst_rank = rank;
    }
    if (rp.host_peak > p.host_peak || rank == 0) {
      p.host_peak = rp.host_peak;
      p.host_at_peak = rp.host_at_peak;
      p.worst_host_rank = rank;
    }
    p.ranks.push_back(std::move(rp));
  }
  p.limiting_tag = largest_tag(p.device_at_peak);
  p.fits =
      checked_add(p.device_peak, r.reserve_bytes) <= r.device_bytes && p.host_peak <= r.host_bytes;
  return p;
}

int64_t model_state_bytes(const ModelConfig& m, const PlanRequest& r) {
  check_request(r);
  int64_t worst = 0;
  for (const ZeroUnitLayout& l : zero_layout(m, r.ranks))  // the same shard on every rank
    worst = checked_add(worst, checked_mul(4 * int64_t(sizeof(float)), l.shard));
  return worst;
}

void check_model_fits(const ModelConfig& m, const PlanRequest& r) {
  check_request(r);
  const int64_t state = model_state_bytes(m, r);
  if (checked_add(state, r.reserve_bytes) > r.device_bytes)
    throw ConfigError(fmt::format(
        "{} does not fit {} ranks of {}: its fp32 weights, gradients and AdamW moments alone take "
        "{} per rank (ZeRO-3 over {} ranks), plus the reserve {}; use more ranks or a larger "
        "--device-gib",
        m.source, r.ranks, format_bytes(r.device_bytes), format_bytes(state), r.ranks,
        format_bytes(r.reserve_bytes)));
}

int64_t seq_granularity(const ModelConfig& m, const PlanRequest& r) {
  const int64_t c = cp_of(r);
  int64_t n = 1;
  if (has_chunks(r.method)) n = r.chunks > 0 ? r.chunks : kFpdtDefaultChunks;
  // 2 C covers ring's zigzag (2C chunks) and the usp grids; N C the fpdt chunks.
  return std::lcm(kSeqQuantum, checked_mul(2 * c, n));
}

std::vector<PlanRequest> knob_candidates(const ModelConfig& m, const PlanRequest& r,
                                         const AutoKnobs& a) {
  const int h = m.num_attention_heads, kv = m.num_key_value_heads, cp = cp_of(r);
  // u: the Ulysses degrees that divide C and fit the heads (H divisible by u, K and u dividing
  // one another; usp's u = 1 is plain ring and takes any heads), largest first: more of the
  // sequence moves by all-to-all, less around the ring.
  std::vector<int> ds{r.ulysses_degree};
  if (a.ulysses_degree && has_ulysses_degree(r.method)) {
    ds.clear();
    for (int u = cp; u >= 1; --u)
      if (cp % u == 0 &&
          ((h % u == 0 && (kv % u == 0 || u % kv == 0)) || (u == 1 && r.method == "usp")))
        ds.push_back(u);
    if (ds.empty()) ds.push_back(0);  // the strategy refuses it with its own message
  }
  std::vector<int> ns{r.chunks};
  if (a.chunks && has_chunks(r.method)) ns = {1, 2, 4, 8, 16, 32};
  std::vector<PlanRequest> out;
  for (int n : ns)
    for (int d : ds) {
      std::vector<int> us{r.head_chunk};
      if (a.head_chunk && has_head_chunk(r.method)) {
        // U: multiples of the all-to-all group (C, or u for upipe-ring) dividing H, largest
        // first.
        const int g = r.method == "upipe-ring" && d > 0 ? d : cp;
        us.clear();
        for (int u = h; u >= g; --u)
          if (u % g == 0 && h % u == 0) us.push_back(u);
        if (us.empty()) us.push_back(0);  // the strategy refuses it with its own message
      }
      for (int u : us) {
        PlanRequest c = r;
        c.ulysses_degree = d;
        c.head_chunk = u;
        c.chunks = n;
        out.push_back(c);
      }
    }
  // Fastest first: fewest stages in all, (H/U) x N (usp runs one stage), then the larger u (the
  // order above); the last is then the most memory-frugal.
  auto stages = [&](const PlanRequest& c) {
    const int64_t per_layer =
        has_head_chunk(c.method) ? h / std::max(1, c.head_chunk > 0 ? c.head_chunk : cp) : 1;
    return per_layer * std::max(1, c.chunks);
  };
  std::stable_sort(out.begin(), out.end(), [&](const PlanRequest& x, const PlanRequest& y) {
    return stages(x) < stages(y);
  });
  return out;
}

Plan plan_auto(const ModelConfig& m, const PlanRequest& r, const AutoKnobs& a) {
  const std::vector<PlanRequest> cands = knob_candidates(m, r, a);
  std::string refused;
  for (const PlanRequest& c : cands) {
    try {
      if (!plan_step(m, c, true).fits) continue;
    } catch (const ConfigError& e) {
      refused = e.what();  // e.g. S not divisible by this N x C
      continue;
    }
    return plan_step(m, c);
  }
  // None fits: the full plan of the most frugal candidate the strategy accepts.
  for (auto it = cands.rbegin(); it != cands.rend(); ++it) {
    try {
      return plan_step(m, *it);
    } catch (const ConfigError& e) {
      refused = e.what();
    }
  }
  throw ConfigError(refused);
}

Plan max_seq_len(const ModelConfig& m, const PlanRequest& r, const AutoKnobs& a) {
  const PlanRequest frugal = knob_candidates(m, r, a).back();
  const int64_t g = seq_granularity(m, frugal);
  auto at = [&](int64_t k) {
    PlanRequest q = frugal;
    q.seq_len = checked_mul(k, g, "seq-len");
    return q;
  };
  // A first guess: the peaks grow about linearly with S (every activation is (S/C, .)), so two
  // complete plans at k1 < k2 granules give the line to extrapolate both budgets from. The guess
  // only saves plans; the answer is the bracket below, decided by plans alone.
  const int64_t k1 = 4, k2 = 8;
  const Plan p1 = plan_step(m, at(k1)), p2 = plan_step(m, at(k2));
  int64_t guess = 1;
  if (p1.complete && p2.complete) {
    auto solve = [&](int64_t y1, int64_t y2, int64_t budget) {
      const double slope = double(y2 - y1) / double(k2 - k1);
      if (slope <= 0) return 1e18;
      return double(k1) + double(budget - y1) / slope;
    };
    const double k =
        std::min(solve(p1.device_peak, p2.device_peak, r.device_bytes - r.reserve_bytes),
                 solve(p1.host_peak, p2.host_peak, r.host_bytes));
    guess = int64_t(std::clamp(k, 1.0, 1e12));
  }
  // The largest k whose plan with knobs q fits: bracket lo (fits, or 0) < hi (does not) around
  // the guess by growing steps, then bisect.
  auto largest = [&](const PlanRequest& q, int64_t guess) {
    auto ok = [&](int64_t k) {
      PlanRequest x = q;
      x.seq_len = at(k).seq_len;
      return plan_step(m, x, true).fits;
    };
    int64_t lo = 0, hi = 0;
    if (ok(guess)) {
      lo = guess;
      for (int64_t step = 1;; step = checked_mul(step, 2)) {
        const int64_t k = checked_add(lo, step);
        if (!ok(k)) {
          hi = k;
          break;
        }
        lo = k;
      }
    } else {
      hi = guess;
      for (int64_t step = 1; lo == 0 && hi > 1; step = checked_mul(step, 2)) {
        const int64_t k = std::max<int64_t>(1, hi - step);
        (ok(k) ? lo : hi) = k;
      }
    }
    while (hi - lo > 1) {
      const int64_t mid = lo + (hi - lo) / 2;
      (ok(mid) ? lo : hi) = mid;
    }
    return lo;
  };
  int64_t k = largest(frugal, guess);
  if (k == 0) return plan_step(m, at(1));  // fits = false: even one granule does not fit
  // The frugal knobs spend the least device memory but not always the least host memory (fpdt
  // offloads K/V chunks): the knobs auto picks at k may go further. Repeat until they do not.
  for (;;) {
    PlanRequest best = r;
    best.seq_len = at(k).seq_len;
    Plan p = plan_auto(m, best, a);
    const int64_t further = largest(p.request, k);
    if (further <= k) return p;
    k = further;
  }
}

}  // namespace upipe
