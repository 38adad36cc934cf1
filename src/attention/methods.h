// The attention methods, one row each: the name, what it is, which knobs it takes, what the
// sequence length must be divisible by, the knob values the planner may try, and the factory.
// Everything that depends on which method runs reads this table (the registry, the planner, the
// run-file schema, help texts and error messages); a method's name is written here only.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "attention/methods.h"
#include "attention/strategy.h"

namespace upipe {

struct MethodInfo {
  std::string_view name;
  std::string_view summary;           // one line, for help and docs
  bool takes_stage_heads = false;     // U (MethodKnobs::stage_heads)
  bool takes_overlap = false;         // MethodKnobs::overlap (methods with head stages)
  bool takes_ulysses_degree = false;  // u
  bool takes_chunks = false;          // N
  bool one_rank = false;              // runs on one rank only (local)
  bool all_to_all = false;            // its attention runs all-to-alls over the stage group
  // What the sequence length must be divisible by on `ranks` ranks with cfg's knobs.
  int64_t (*seq_divisor)(const AttentionConfig& cfg, int ranks) = nullptr;
  // Validates cfg on ctx.comm.size() ranks (ConfigError saying what to change) and builds it.
  std::unique_ptr<AttentionStrategy> (*make)(const StrategyContext& ctx) = nullptr;
};

// What `upipe plan` takes for "every method" (never a method itself).
inline constexpr std::string_view kAllMethods = "all";

// Every method, in the order help texts list them.
const std::vector<MethodInfo>& methods();
// The row of `name`; ConfigError naming the methods when there is none.
const MethodInfo& method_info(std::string_view name);
// "local, ulysses, upipe, ring, usp, upipe-ring, fpdt, upipe-fpdt"
std::string method_names();
// The methods `upipe plan --method` names: one, "all" (every method; one-rank ones only where a
// CP group is one rank), or a comma-separated list ("upipe,ring"), in the order given.
// ConfigError for an unknown or repeated name.
std::vector<std::string> planned_methods(std::string_view method, int cp);
// Whether `method` names more than one method (all, or a list).
bool names_many_methods(std::string_view method);

// Range checks of the knobs that do not depend on the rank count (ConfigError naming the
// setting): a known method, knobs in [0, their bound] (or kKnobAuto where allow_auto), and no
// knob set that the method does not take.
void validate_knobs(const MethodKnobs& k, bool allow_auto = false);
// k without the knobs its method does not take (a request for every method keeps the rest).
MethodKnobs knobs_for(const MethodKnobs& k, const MethodInfo& m);

// The Ulysses degrees u that `method` (usp / upipe-ring) can run on `ranks` ranks with cfg's
// heads: u divides the ranks, H is divisible by u, K and u divide one another; usp with u = 1 is
// plain ring attention and takes any heads. Ascending.
bool ulysses_degree_fits(const MethodInfo& m, const AttentionConfig& cfg, int ranks, int u);
std::vector<int> ulysses_degrees(const MethodInfo& m, const AttentionConfig& cfg, int ranks);
// The rank group whose all-to-all the head stages span: u for methods with a Ulysses degree
// (u = 0 meaning all ranks), else all ranks. U must be a multiple of it.
int stage_group(const MethodInfo& m, const MethodKnobs& k, int ranks);
// The most hosts one all-to-all group of the method spans (1: every all-to-all stays within a
// host; 0: the method runs none). The world's ranks form CP groups of `cp` consecutive ranks (the
// trainer's split), each cut into stage groups of consecutive ranks (stage_group); host_of[r] is
// rank r's host, any id.
int all_to_all_hosts(const MethodInfo& m, const MethodKnobs& k, int cp,
                     const std::vector<int>& host_of);
// Said where cfg's method runs all-to-alls across hosts on the CP groups of `cp` ranks ("" where
// they stay within a host): how many hosts, and the largest Ulysses degree (upipe-ring, else usp)
// that keeps them within one. Setting references unrendered (setting_ref.h).
std::string across_hosts_note(const AttentionConfig& cfg, int cp, const std::vector<int>& host_of);
// The host ids of `ranks` ranks placed `per_host` to a host in rank order (mpirun --npernode, or
// a hostfile's slots filled in order); per_host = 0: one host.
std::vector<int> hosts_in_order(int ranks, int per_host);
// The stage sizes U a group of `group` ranks can run: multiples of it dividing H, largest first.
std::vector<int> stage_head_choices(const AttentionConfig& cfg, int group);
// The sequence chunk counts N the planner tries for fpdt methods.
std::vector<int> chunk_choices();

// Query heads per stage the method runs with: H without a stage knob, U (0: the group) with.
int effective_stage_heads(const MethodInfo& m, const AttentionConfig& cfg, int ranks);
// The knobs cfg runs with on `ranks` ranks, defaults resolved: U (H without a stage knob: 0), u
// (the all-to-all group; 0 without the knob), N (fpdt's choice; 0 without chunks; as given where
// the shape cannot take it), overlap as given.
MethodKnobs resolved_knobs(const AttentionConfig& cfg, int ranks);
// The same as plan, check and bench show them:
// "U=4 N=2 overlap" (U = 0 is the group's size, N = 0 fpdt's choice); "-" for a method without
// knobs. A chunk count the shape cannot take is said as given.
std::string knobs_text(const AttentionConfig& cfg, int ranks);
// Attention stages per layer: (H / U) x N (N: 1 without chunks, the default for 0).
int64_t stages_per_layer(const MethodInfo& m, const AttentionConfig& cfg, int ranks);

// Validates cfg for cfg.knobs.method on ctx.comm.size() ranks (ConfigError with what to change)
// and builds the strategy.
std::unique_ptr<AttentionStrategy> make_strategy(const StrategyContext& ctx);

}  // namespace upipe
