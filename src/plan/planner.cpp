// The planner (planner.h): a training step on the meta device for one rank of each rank class,
// the worst rank's peaks, the longest S that fits and the auto knobs.
#include "plan/planner.h"

#include <fmt/format.h>
#include <sys/mman.h>

#include <algorithm>
#include <map>
#include <numeric>

#include "attention/headwise.h"
#include "attention/methods.h"
#include "backend/device.h"
#include "comm/fake/fake_comm.h"
#include "core/check.h"
#include "core/checked.h"
#include "core/errors.h"
#include "train/run_config.h"
#include "train/run_options.h"
#include "train/trainer.h"

namespace upipe {

PlanRequest plan_request(const RunConfig& c, int ranks) {
  PlanRequest r;
  r.ranks = ranks;
  r.cp_size = c.parallel.cp_size;
  r.decoder = decoder_options(c, c.train.seq_len);
  r.micro_steps = c.train.micro_steps;
  r.device_bytes = c.memory.device_bytes;
  r.host_bytes = c.memory.host_bytes;
  r.backend = parse_backend_kind(c.device.backend);
  r.worst_case_documents = c.data.documents != "none";
  return r;
}

TrainOptions train_options(const PlanRequest& r) {
  TrainOptions o;
  o.cp_size = r.cp_size;
  o.decoder = r.decoder;
  o.micro_steps = std::min(r.micro_steps, 2);  // see PlanRequest::micro_steps
  o.packed = !r.doc_lens.empty() || r.worst_case_documents;
  return o;
}

namespace {

int cp_of(const PlanRequest& r) {
  return r.cp_size == 0 ? r.ranks : r.cp_size;
}

void check_request(const PlanRequest& r) {
  if (r.ranks < 1)
    throw ConfigError(fmt::format("{} must be >= 1 (got {})", setting_ref("plan.ranks"), r.ranks));
  if (r.micro_steps < 1)
    throw ConfigError(
        fmt::format("{} must be >= 1 (got {})", setting_ref("train.micro_steps"), r.micro_steps));
  if (r.ranks_per_host < 0)
    throw ConfigError(fmt::format("{} must be >= 0 (got {})", setting_ref("plan.ranks_per_host"),
                                  r.ranks_per_host));
  if (r.cp_size < 0 || (r.cp_size > 0 && r.ranks % r.cp_size != 0))
    throw ConfigError(fmt::format("{} ({}) must divide {} ({})", setting_ref("parallel.cp_size"),
                                  r.cp_size, setting_ref("plan.ranks"), r.ranks));
  if (r.reserve_bytes < 0 || r.reserve_bytes >= r.device_bytes)
    throw ConfigError(fmt::format("{} ({}) must be less than {} ({})", setting_ref("plan.reserve"),
                                  format_bytes(r.reserve_bytes),
                                  setting_ref("memory.device_memory"),
                                  format_bytes(r.device_bytes)));
  UPIPE_CHECK(r.doc_lens.empty() || !r.worst_case_documents,
              "a plan of given documents (doc_lens) and of the worst case at once");
}

Tag largest_tag(const TagBytes& b) {
  int best = 0;
  for (int t = 1; t < kNumTags; ++t)
    if (b.v[size_t(t)] > b.v[size_t(best)]) best = t;
  return Tag(best);
}

// The block's shape of m with r's method and knobs (for the method table's rules).
AttentionConfig block_shape(const ModelConfig& m, const PlanRequest& r) {
  AttentionConfig c = to_attention_config(m);
  c.seq_len = r.decoder.seq_len;
  c.knobs = r.decoder.knobs;
  return c;
}

// A meta device with the given budgets (0 = the whole reserved range), planning for target.
DeviceOptions meta_device(int64_t budget_device, int64_t budget_host, BackendKind target) {
  const int64_t unlimited = MetaAllocator::reserved_bytes();
  return {BackendKind::kMeta, budget_device > 0 ? budget_device : unlimited,
          budget_host > 0 ? budget_host : unlimited, target};
}

// What a rank's allocations can depend on of its rank (rank_classes): the lengths of the runs of
// its CP rank's rows in the layout, in order.
std::vector<int64_t> run_lengths(const SeqLayout& layout, int cp_rank) {
  std::vector<int64_t> out;
  for (const RowPositions::Run& run : layout.positions(cp_rank).runs) out.push_back(run.rows);
  return out;
}

// S token ids, all zero (valid ids; on the meta device their values do not matter), that cost no
// memory whatever S: a private read-only anonymous mapping, whose pages all read as the
// kernel's zero page. A step reads only its own rows' ids.
class ZeroTokens {
 public:
  explicit ZeroTokens(int64_t n) : bytes_(size_t(checked_mul(n, int64_t(sizeof(int32_t))))) {
    void* p = mmap(nullptr, std::max<size_t>(bytes_, 1), PROT_READ,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    UPIPE_CHECK(p != MAP_FAILED, "could not map {} of zero token ids for the planner",
                format_bytes(int64_t(bytes_)));
    data_ = static_cast<const int32_t*>(p);
  }
  ZeroTokens(const ZeroTokens&) = delete;
  ZeroTokens& operator=(const ZeroTokens&) = delete;
  ~ZeroTokens() { munmap(const_cast<int32_t*>(data_), std::max<size_t>(bytes_, 1)); }
  std::span<const int32_t> ids() const { return {data_, bytes_ / sizeof(int32_t)}; }

 private:
  size_t bytes_;
  const int32_t* data_ = nullptr;
};

std::vector<RankClass> every_rank(int ranks) {
  std::vector<RankClass> out;
  for (int w = 0; w < ranks; ++w) out.push_back({w, {w}});
  return out;
}

}  // namespace

std::vector<RankClass> rank_classes(const ModelConfig& m, const PlanRequest& r) {
  check_request(r);
  // The layout the trainer's strategy shards the sequence with: the same on every rank.
  Device dev(meta_device(0, 0, r.backend));
  FakeCommunicator world(0, r.ranks);
  const Trainer tr(dev, world, m, train_options(r));
  const SeqLayout layout = tr.decoder().strategy().layout();
  // With documents of given lengths each CP rank's mask and placement are its own: no two CP
  // ranks are assumed alike, but the DP replicas of one CP rank play the same documents (the plan
  // gives every replica the same sequence). The worst case (every token a document of its own)
  // cuts every rank's rows alike, so its classes are the layout's. Both tested against every rank.
  const bool own_documents = !r.doc_lens.empty();
  std::map<std::vector<int64_t>, size_t> index;  // run lengths, or the CP rank -> class
  std::vector<RankClass> out;
  for (int w = 0; w < r.ranks; ++w) {
    const int c = w % tr.cp_size();
    const auto [it, fresh] =
        index.emplace(own_documents ? std::vector<int64_t>{c} : run_lengths(layout, c), out.size());
    if (fresh) out.push_back({w, {}});
    out[it->second].ranks.push_back(w);
  }
  return out;
}

RankPlan plan_rank(const ModelConfig& m, const PlanRequest& r, int rank, int64_t budget_device,
                   int64_t budget_host) {
  check_request(r);
  Device dev(meta_device(budget_device, budget_host, r.backend));
  FakeCommunicator world(rank, r.ranks);
  Trainer tr(dev, world, m, train_options(r));
  tr.zero().init(nullptr, 0);
  dev.mem().reset_peak();
  dev.host().reset_peak();
  const ZeroTokens tokens(r.decoder.seq_len);
  SequenceView seq{tokens.ids(), {}};
  if (!r.doc_lens.empty())
    seq.documents = std::make_shared<const Documents>(r.doc_lens, r.decoder.seq_len, "--doc-lens");
  else if (r.worst_case_documents)
    seq.documents = std::make_shared<const Documents>(
        std::vector<int64_t>(size_t(r.decoder.seq_len), 1), r.decoder.seq_len, "data.documents");
  dev.work() = {};
  world.reset_stats();
  tr.step_views(0, [&](int64_t, int, int) { return seq; });
  return {rank,
          dev.mem().peak(),
          dev.host().peak(),
          dev.mem().at_peak_by_tag(),
          dev.host().at_peak_by_tag(),
          dev.work(),
          world.stats()};
}

Plan plan_step(const ModelConfig& m, const PlanRequest& r, bool stop_at_budget,
               RankCoverage coverage) {
  check_request(r);
  Plan p;
  p.request = r;
  // A step stopped by the budget does not fit. One that fills the meta device's whole range (no
  // budget of its own) is past what any device holds: said as such, never a plan of 0 bytes.
  auto stopped = [&](int rank, const OutOfMemoryError& e) {
    // The model's state alone past the range: no shorter sequence fits, more ranks (ZeRO-3
    // shards it over all) do.
    const int64_t state = model_state_bytes(m, r);
    if (!stop_at_budget && state >= MetaAllocator::reserved_bytes())
      throw ConfigError(fmt::format(
          "{} does not fit any device on {} ranks: its fp32 weights, gradients and AdamW moments "
          "alone take {} per rank (ZeRO-3 over {} ranks), past the {} the planner counts per "
          "rank; plan more ranks or a smaller model",
          m.source, r.ranks, format_bytes(state), r.ranks,
          format_bytes(MetaAllocator::reserved_bytes())));
    if (!stop_at_budget)
      throw ConfigError(fmt::format(
          "{} needs more than {} on rank {}, the most the planner counts per rank; no device "
          "holds that: plan a shorter {}",
          setting_value("train.seq_len", r.decoder.seq_len),
          format_bytes(MetaAllocator::reserved_bytes()), rank, setting_ref("train.seq_len")));
    p.complete = false;
    p.fits = false;
    p.ranks.clear();
    p.failure = fmt::format("rank {}: {}", rank, e.what());
    // Within the budget but past the meta device's range: the planner's limit, said as such.
    p.limit_arena = e.backing ? std::string(kPlannerRangeLimit) : e.arena;
    p.limit_tag = e.tag;
    p.limit_rank = rank;
    p.limit_request = e.request;
    p.limit_breakdown = e.breakdown;
    return p;
  };
  std::vector<RankClass> classes;
  try {
    classes = coverage == RankCoverage::kEveryRank ? every_rank(r.ranks) : rank_classes(m, r);
  } catch (const OutOfMemoryError& e) {
    return stopped(0, e);
  }
  p.rank_classes = int(classes.size());
  p.ranks.resize(size_t(r.ranks));
  // In order of the classes' first ranks: the first class that fails holds the lowest rank that
  // fails, the one planning every rank in order would name.
  for (const RankClass& c : classes) {
    RankPlan rp;
    try {
      rp = stop_at_budget ? plan_rank(m, r, c.first, r.device_bytes - r.reserve_bytes, r.host_bytes)
                          : plan_rank(m, r, c.first);
    } catch (const OutOfMemoryError& e) {
      return stopped(c.first, e);
    }
    for (int w : c.ranks) {
      p.ranks[size_t(w)] = rp;
      p.ranks[size_t(w)].rank = w;
    }
  }
  for (const RankPlan& rp : p.ranks) {
    if (rp.device_peak > p.device_peak || rp.rank == 0) {
      p.device_peak = rp.device_peak;
      p.device_at_peak = rp.device_at_peak;
      p.worst_rank = rp.rank;
    }
    if (rp.host_peak > p.host_peak || rp.rank == 0) {
      p.host_peak = rp.host_peak;
      p.host_at_peak = rp.host_at_peak;
      p.worst_host_rank = rp.rank;
    }
  }
  p.largest_device_tag = largest_tag(p.device_at_peak);
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
        "{}",
        m.source, r.ranks, format_bytes(r.device_bytes), format_bytes(state), r.ranks,
        format_bytes(r.reserve_bytes), setting_ref("memory.device_memory")));
}

int64_t seq_granularity(const ModelConfig& m, const PlanRequest& r, int64_t quantum) {
  const AttentionConfig c = block_shape(m, r);
  return std::lcm(quantum, method_info(c.knobs.method).seq_divisor(c, cp_of(r)));
}

std::vector<PlanRequest> knob_candidates(const ModelConfig& m, const PlanRequest& r) {
  const AttentionConfig shape = block_shape(m, r);
  const MethodInfo& info = method_info(r.decoder.knobs.method);
  const MethodKnobs k = knobs_for(r.decoder.knobs, info);  // auto only where the method has it
  const int cp = cp_of(r);
  auto or_default = [](std::vector<int> v) { return v.empty() ? std::vector<int>{0} : v; };
  // An empty list leaves 0: the strategy then refuses the request with its own message.
  std::vector<int> ds{k.ulysses_degree};
  if (k.ulysses_degree == kKnobAuto) {
    ds = ulysses_degrees(info, shape, cp);
    std::reverse(ds.begin(), ds.end());  // largest first: more all-to-all, less ring
    // An all-to-all across hosts runs at the network's speed: a u within a host first.
    const std::vector<int> hosts = hosts_in_order(r.ranks, r.ranks_per_host);
    std::vector<int> within;
    for (int d : ds) {
      MethodKnobs kd = k;
      kd.ulysses_degree = d;
      if (all_to_all_hosts(info, kd, cp, hosts) <= 1) within.push_back(d);
    }
    if (!within.empty()) ds = within;
    ds = or_default(ds);
  }
  const std::vector<int> ns = k.chunks == kKnobAuto ? chunk_choices() : std::vector<int>{k.chunks};
  std::vector<PlanRequest> out;
  for (int n : ns)
    for (int d : ds) {
      MethodKnobs c = k;
      c.ulysses_degree = d;
      c.chunks = n;
      std::vector<int> us{k.stage_heads};
      if (k.stage_heads == kKnobAuto)
        us = or_default(stage_head_choices(shape, stage_group(info, c, cp)));
      for (int u : us) {
        PlanRequest q = r;
        q.decoder.knobs = c;
        q.decoder.knobs.stage_heads = u;
        out.push_back(q);
      }
    }
  // Fastest first: fewest stages in all, then the larger u (the order above); the last is then
  // the most memory-frugal.
  auto stages = [&](const PlanRequest& q) { return stages_per_layer(info, block_shape(m, q), cp); };
  std::stable_sort(out.begin(), out.end(), [&](const PlanRequest& x, const PlanRequest& y) {
    return stages(x) < stages(y);
  });
  return out;
}

Plan plan_auto(const ModelConfig& m, const PlanRequest& r) {
  const std::vector<PlanRequest> cands = knob_candidates(m, r);
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

Plan max_seq_len(const ModelConfig& m, const PlanRequest& r) {
  const PlanRequest frugal = knob_candidates(m, r).back();
  int64_t g = seq_granularity(m, frugal);
  int64_t k_max = kMaxSeqLen / g;  // the longest S train takes: the search stops there
  auto at = [&](int64_t k) {
    PlanRequest q = frugal;
    q.decoder.seq_len = checked_mul(k, g, "seq-len");
    return q;
  };
  // A first guess: the peaks grow about linearly with S (every activation is (S/C, .)), so two
  // complete plans at k1 < k2 granules give the line to extrapolate both budgets from. The guess
  // only saves plans; the answer is the bracket below, decided by plans alone.
  const int64_t k1 = 4, k2 = 8;
  // A probe past what the meta device counts (a model of 1000 layers) is no line: the search
  // starts from one granule instead (it threw, naming an S the user never gave).
  auto probe = [&](int64_t k) {
    try {
      return plan_step(m, at(k));
    } catch (const ConfigError&) {
      Plan none;
      none.complete = false;
      return none;
    }
  };
  const Plan p1 = probe(k1), p2 = probe(k2);
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
    guess = int64_t(std::clamp(k, 1.0, double(std::max<int64_t>(k_max, 1))));
  }
  // The largest k whose plan with knobs q fits: bracket lo (fits, or 0) < hi (does not) around
  // the guess by growing steps, then bisect.
  auto largest = [&](const PlanRequest& q, int64_t guess) {
    auto ok = [&](int64_t k) {
      if (k > k_max) return false;
      PlanRequest x = q;
      x.decoder.seq_len = at(k).decoder.seq_len;
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
  bool below_one = false;  // searching below one granule (k_max is then no range of train's)
  const int64_t granule = g;
  if (k == 0) {
    // Not one granule: the longest S below it, to a finer one (from one up: a few plans).
    const int64_t below = seq_granularity(m, frugal, kSeqQuantumBelow);
    if (below < g) {
      below_one = true;
      k_max = (g - 1) / below;
      g = below;
      k = largest(frugal, 1);
    }
  }
  if (k == 0) return plan_step(m, at(1));  // fits = false: even one granule does not fit
  // The frugal knobs spend the least device memory but not always the least host memory (fpdt
  // offloads K/V chunks): the knobs auto picks at k may go further. Repeat until they do not.
  for (;;) {
    PlanRequest best = r;
    best.decoder.seq_len = at(k).decoder.seq_len;
    Plan p = plan_auto(m, best);
    const int64_t further = largest(p.request, k);
    if (further <= k) {
      if (k == k_max && !below_one) {  // one granule more is past what train takes
        p.limit_arena = kSeqLenRangeLimit;
        p.limit_tag.clear();
        return p;
      }
      // What one granule more would exceed.
      PlanRequest next = p.request;
      next.decoder.seq_len = at(k + 1).decoder.seq_len;
      const Plan n = plan_step(m, next, true);
      // Below one granule, the knobs auto picked near it may fit the whole granule where the
      // frugal ones did not (fpdt's host bytes): the search above it, with those knobs.
      if (below_one && n.fits && next.decoder.seq_len % granule == 0) {
        PlanRequest with = r;
        with.decoder.knobs = p.request.decoder.knobs;
        return max_seq_len(m, with);
      }
      p.limit_arena = n.limit_arena;
      p.limit_tag = n.limit_tag;
      return p;
    }
    k = further;
  }
}

}  // namespace upipe
