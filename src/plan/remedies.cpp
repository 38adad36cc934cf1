#include "plan/remedies.h"

#include <algorithm>
#include <numeric>
#include <optional>
#include <utility>

#include "attention/methods.h"
#include "core/errors.h"
#include "core/join.h"
#include "train/run_options.h"

namespace upipe {
namespace {

struct Step {
  const char* name;
  const char* costs;
  bool knobs;  // it changes the method's knobs (said as the planner chose them)
  // Applies the change to c for the method `mi`; false where it changes nothing (already so).
  bool (*apply)(RunConfig& c, const MethodInfo& mi);
  // Whether a run with the change (its settings `after`) computes the same bits as without it.
  bool (*exact)(const RunConfig& after);
};

bool never(const RunConfig&) {
  return false;
}
bool always(const RunConfig&) {
  return true;
}

// Cheapest first: those that cost time, then those that round.
const Step kSteps[] = {
    // Other stages or chunks group the method's sums otherwise (U = 2 and 4 differ in the last
    // digits of the loss).
    {"the knobs auto", "the knobs the planner picks to fit", true,
     [](RunConfig& c, const MethodInfo& mi) {
       MethodKnobs& k = c.parallel.knobs;
       bool changed = false;
       for (auto [takes, knob] :
            {std::pair{mi.takes_stage_heads, &k.stage_heads}, std::pair{mi.takes_chunks, &k.chunks},
             std::pair{mi.takes_ulysses_degree, &k.ulysses_degree}})
         if (takes && *knob != kKnobAuto) {
           *knob = kKnobAuto;
           changed = true;
         }
       return changed;
     },
     never},
    {"no overlap", "the stages no longer overlap", false,
     [](RunConfig& c, const MethodInfo&) { return std::exchange(c.parallel.knobs.overlap, false); },
     always},
    // Per layer, backward recomputes xm from the stash entry: a bf16 stash of an fp32 residual
    // rounds it (docs/model.md).
    {"layer recompute", "backward recomputes each layer", false,
     [](RunConfig& c, const MethodInfo&) {
       return std::exchange(c.memory.policy.recompute, Recompute::kLayer) != Recompute::kLayer;
     },
     [](const RunConfig& a) {
       return a.memory.policy.stash_dtype == a.memory.policy.residual_dtype;
     }},
    {"the stash offloaded", "the stash in host memory", false,
     [](RunConfig& c, const MethodInfo&) {
       return !std::exchange(c.memory.policy.offload_stash, true);
     },
     always},
    {"smaller tiles", "MLP and LM-head tiles of a quarter the rows: their sums group otherwise",
     false,
     [](RunConfig& c, const MethodInfo&) {
       int64_t& t = c.memory.policy.tile_tokens;
       const int64_t smaller = std::max<int64_t>(std::min<int64_t>(t, 64), t / 4);
       return std::exchange(t, smaller) != smaller;
     },
     never},
    {"a bf16 stash", "a bf16 stash: gradients move by about one bf16 rounding", false,
     [](RunConfig& c, const MethodInfo&) {
       return std::exchange(c.memory.policy.stash_dtype, DType::kBF16) != DType::kBF16;
     },
     never},
    {"bf16 compute", "bf16 compute, fp32 master weights", false,
     [](RunConfig& c, const MethodInfo&) {
       return std::exchange(c.memory.policy.dtype, DType::kBF16) != DType::kBF16;
     },
     never},
};

// The remedies of one plan: the steps that change something for its settings, each step's or
// several steps' settings planned by `plan` (plan_auto at the plan's S, or max_seq_len).
class Search {
 public:
  using Planner = Plan (*)(const ModelConfig&, const PlanRequest&);

  Search(const ModelConfig& m, const RunConfig& c, const PlanRequest& base, const Plan& of,
         Planner plan)
      : m_(m), mi_(method_info(of.request.decoder.knobs.method)), base_(base), plan_(plan) {
    // The row's settings: its method, the knobs as given (auto stays auto).
    before_ = c;
    before_.parallel.knobs = knobs_for(c.parallel.knobs, mi_);
    for (const Step& st : kSteps) {
      RunConfig changed = before_;
      if (st.apply(changed, mi_)) steps_.push_back(&st);
    }
  }

  size_t steps() const { return steps_.size(); }

  // The plan with steps[taken...]; nullopt where the settings are refused (a knob no value fits).
  std::optional<Remedy> with(const std::vector<size_t>& taken) const {
    Remedy out;
    out.config = before_;
    std::vector<std::string> costs;
    bool knobs = false;
    for (size_t i : taken) {
      steps_[i]->apply(out.config, mi_);
      costs.emplace_back(steps_[i]->costs);
      knobs = knobs || steps_[i]->knobs;
    }
    for (size_t i : taken) out.exact = out.exact && steps_[i]->exact(out.config);
    out.costs = join(costs, "; ");
    PlanRequest r = base_;
    r.decoder = decoder_options(out.config, base_.decoder.seq_len);
    r.decoder.knobs = knobs_for(out.config.parallel.knobs, mi_);
    try {
      out.plan = plan_(m_, r);
    } catch (const ConfigError&) {
      return std::nullopt;
    }
    // The flags: what changes, the knobs as chosen where the change is theirs (typed after the
    // row's own flags, the chosen values win; an auto knob left alone chooses alike again).
    RunConfig said = out.config;
    if (knobs) said.parallel.knobs = out.plan.request.decoder.knobs;
    out.flags = to_flags(said, kScopeTrain, before_);
    return out;
  }

 private:
  const ModelConfig& m_;
  const MethodInfo& mi_;
  const PlanRequest& base_;
  Planner plan_;
  RunConfig before_;
  std::vector<const Step*> steps_;  // those that change something here
};

}  // namespace

std::vector<std::string> remedy_step_names() {
  std::vector<std::string> names;
  for (const Step& s : kSteps) names.emplace_back(s.name);
  return names;
}

std::vector<Remedy> remedies(const ModelConfig& m, const RunConfig& c, const PlanRequest& base,
                             const Plan& failed) {
  const Search search(m, c, base, failed, &plan_auto);
  std::vector<Remedy> alone;
  for (size_t i = 0; i < search.steps(); ++i)
    if (std::optional<Remedy> r = search.with({i}); r && r->plan.fits) alone.push_back(*r);
  if (!alone.empty() || search.steps() < 2) return alone;
  // Together: none where all of them do not fit; else the shortest run of steps in order that
  // fits, then without each earlier one it does not need.
  std::vector<size_t> every(search.steps());
  std::iota(every.begin(), every.end(), size_t(0));
  if (std::optional<Remedy> r = search.with(every); !r || !r->plan.fits) return {};
  std::vector<size_t> taken;
  for (size_t i = 0; i < search.steps(); ++i) {
    taken.push_back(i);
    std::optional<Remedy> r = search.with(taken);
    if (!r || !r->plan.fits) continue;
    for (size_t j = 0; j + 1 < taken.size();) {
      std::vector<size_t> fewer;
      for (size_t k = 0; k < taken.size(); ++k)
        if (k != j) fewer.push_back(taken[k]);
      if (std::optional<Remedy> f = search.with(fewer); f && f->plan.fits) {
        taken = fewer;
        r = f;
      } else {
        ++j;
      }
    }
    return {*r};
  }
  return {};
}

std::vector<Remedy> longer(const ModelConfig& m, const RunConfig& c, const PlanRequest& base,
                           const Plan& longest) {
  // Past the longest S train takes nothing goes further.
  if (longest.fits && longest.limit_arena == kSeqLenRangeLimit) return {};
  const Search search(m, c, base, longest, &max_seq_len);
  const int64_t s0 = longest.fits ? longest.request.decoder.seq_len : 0;
  auto s_of = [](const Remedy& r) { return r.plan.request.decoder.seq_len; };
  std::vector<Remedy> out;
  std::vector<size_t> exact;  // the exact steps that go further alone
  int64_t s_alone = s0;       // the longest S of those
  for (size_t i = 0; i < search.steps(); ++i) {
    std::optional<Remedy> r = search.with({i});
    if (!r || !r->plan.fits || s_of(*r) <= s0) continue;
    if (r->exact) {
      exact.push_back(i);
      s_alone = std::max(s_alone, s_of(*r));
    }
    out.push_back(std::move(*r));
  }
  if (exact.size() >= 2)
    if (std::optional<Remedy> r = search.with(exact);
        r && r->plan.fits && r->exact && s_of(*r) > s_alone)
      out.push_back(std::move(*r));
  return out;
}

}  // namespace upipe
