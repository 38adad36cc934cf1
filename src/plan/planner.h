// The planner: what one whole training step (ZeRO-3 gathers and reduce-scatters, forward,
// backward, gradient norm, AdamW) costs in device and host memory on every rank, found by running
// the real Trainer::step on the meta device (nothing backed, nothing computed) with a fake
// communicator playing a rank. Nothing here is a formula of its own: the bytes are the ones the
// engine allocates, so a real run of the same configuration peaks at exactly the same bytes per
// tag (tests/multirank/test_plan.cpp). The ranks fall into classes whose steps allocate the same
// bytes in the same order (rank_classes); one rank of each class is played. On top: the longest
// sequence that fits a budget (max_seq_len) and the `auto` strategy knobs (fewest UPipe stages,
// fewest FPDT chunks that fit). docs/planner.md explains the rank classes, the reserve, the
// search and its granularity.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "backend/work_count.h"
#include "comm/communicator.h"
#include "core/arena.h"
#include "model/config.h"
#include "train/run_config.h"
#include "train/trainer.h"

namespace upipe {

// The reserve every plan adds to the device peak when none is given: the CUDA context, NCCL's
// buffers and the caching allocator's slack, which the engine's arenas do not see.
inline constexpr int64_t kDefaultReserveBytes = int64_t(2) << 30;
// --max-seq-len finds S to a multiple of this (and of what the method requires, see
// seq_granularity); where not even that fits, to a multiple of kSeqQuantumBelow below it (a small
// device or a long model: 40960 fits where 65536 does not).
inline constexpr int64_t kSeqQuantum = 65536;
inline constexpr int64_t kSeqQuantumBelow = 1024;

struct PlanRequest {
  int ranks = 1;    // the world: DP x CP
  int cp_size = 0;  // C, ranks per sequence (0 = all ranks)
  int cp() const { return cp_size == 0 ? ranks : cp_size; }  // C, the default resolved
  // Ranks on each host, placed in rank order (0: every rank on one host): an auto Ulysses degree
  // keeps the all-to-alls within a host where some u does (knob_candidates).
  int ranks_per_host = 0;
  // S, the method and its knobs (kKnobAuto: the planner picks, see knob_candidates) and the
  // memory policy: what the trainer would run.
  DecoderOptions decoder;
  // Sequences per DP rank per step (train.micro_steps). From the second on, a micro-step starts
  // with the previous one's last gradient reduce-scatter in flight; every later one is the
  // second's allocations again, so at most two are played.
  int micro_steps = 1;
  int64_t device_bytes = int64_t(80) << 30;  // per rank
  int64_t host_bytes = int64_t(256) << 30;   // per rank
  int64_t reserve_bytes = kDefaultReserveBytes;
  // The backend the run computes on: its workspace queries size every op's workspace (a cuda
  // plan needs no GPU).
  BackendKind backend = BackendKind::kCpu;
  // Packed documents: the lengths of every sequence's documents (summing to S); empty: one
  // document per sequence. Only the documents' mask (tag docs) depends on them.
  std::vector<int64_t> doc_lens;
  // Packed documents that the data decides (a run's data.documents, with no doc_lens): planned at
  // their worst, every token its own document, the largest mask a sequence of the planned S can
  // have. Not with doc_lens.
  bool worst_case_documents = false;
};

// The request of a training run's settings on `ranks` ranks: its method, knobs, S, memory policy,
// micro-steps, budgets and backend; a run that packs its data's documents (data.documents) is
// planned at their worst. The reserve is the default (upipe plan's); upipe train plans with none,
// its budget being all its arena has.
PlanRequest plan_request(const RunConfig& c, int ranks);

// The trainer's options of a request (what plan_step builds its Trainer with).
TrainOptions train_options(const PlanRequest& r);

// One rank's step: peaks since the start of the step (the ZeRO-3 shards allocated before it are
// counted, they are live throughout) and the per-tag bytes at each arena's peak.
struct RankPlan {
  int rank = 0;
  int64_t device_peak = 0, host_peak = 0;
  TagBytes device_at_peak, host_at_peak;
  // What the rank's step executes (GEMM and attention FLOPs, as the meta device counts them) and
  // sends (per collective, bytes to other ranks): the step's work, for its time at a given rate.
  WorkCount work;
  CommStats comm;
};

// Plan::limit_arena of a step stopped by the meta device's address range (16 TiB a rank, less
// under `ulimit -v`) rather than a budget: the planner's limit, not the machine's.
inline constexpr const char* kPlannerRangeLimit = "the planner's range";
// Plan::limit_arena of a longest S that fits with room to spare: one granule more is past the
// longest train.seq_len upipe takes (kMaxSeqLen); no arena, no tag.
inline constexpr const char* kSeqLenRangeLimit = "seq_len";

struct Plan {
  PlanRequest request;
  // false when the step stopped at the budget (plan_step with stop_at_budget): the plan then
  // holds only the verdict (fits = false) and the failure.
  bool complete = true;
  bool fits = false;        // device_peak + reserve <= device_bytes and host_peak <= host_bytes
  int worst_rank = 0;       // of the device peak (the lowest such rank)
  int worst_host_rank = 0;  // of the host peak
  int64_t device_peak = 0, host_peak = 0;
  TagBytes device_at_peak, host_at_peak;  // of the worst ranks
  Tag largest_device_tag = Tag::kParams;  // the largest tag at the worst device peak
  std::vector<RankPlan> ranks;            // every rank (complete plans only)
  std::string failure;                    // what did not fit, when !complete
  // What stops this plan, or (max_seq_len) one granule more: the arena whose budget it exceeds
  // ("device" or "host") and the tag of the request that did not fit; empty when nothing does.
  std::string limit_arena, limit_tag;  // "device", "host", kPlannerRangeLimit, kSeqLenRangeLimit
  // A step stopped by a budget: the rank, its request's bytes and the live bytes per tag then.
  int limit_rank = 0;
  int64_t limit_request = 0;
  std::string limit_breakdown;
  int rank_classes = 0;                // the ranks played: one per class (or every rank)
};

// Ranks whose steps make the same allocations (sizes, tags, order; at most a kernel's workspace
// taken and given back a different number of times in a row, which moves no peak), so they reach
// the same device and host peaks with the same bytes per tag, and one of them (the lowest,
// `first`) is planned for all. Of everything a step reads of its rank, only the run lengths of
// its CP rank's rows in the strategy's sequence layout (SeqLayout::positions) could size or count
// an allocation; the rest (positions, head indices, shard offsets, peers, the DP rank) only
// selects views, values and peers. docs/planner.md ("Rank classes") goes through each place.
// Ranks with the same run lengths form a class; with documents (doc_lens) each CP rank is a class
// with its DP replicas (every replica plays the same documents). Classes come in order of their
// first rank, ranks ascend within one.
struct RankClass {
  int first = 0;
  std::vector<int> ranks;
};
std::vector<RankClass> rank_classes(const ModelConfig& m, const PlanRequest& r);

// Which ranks plan_step plays: one per rank class, or every rank (the reference the tests compare
// the classes with).
enum class RankCoverage { kOnePerClass, kEveryRank };

// One rank's step on the meta device. Throws ConfigError when the request is not a valid
// configuration (method, knobs, S), OutOfMemoryError when budget_device / budget_host (per arena;
// 0 = unlimited) are exceeded.
RankPlan plan_rank(const ModelConfig& m, const PlanRequest& r, int rank, int64_t budget_device = 0,
                   int64_t budget_host = 0);

// Every rank's step (each rank's RankPlan is its class's); the worst rank's peaks. With
// stop_at_budget the meta arenas get the request's budgets (device minus reserve, host) and the
// first rank that exceeds one ends the plan (fits = false, complete = false, the failure naming
// that rank): the search only needs the verdict. A plan that completes within the budgets is the
// plan without them (budgets only stop a step), and it fits.
Plan plan_step(const ModelConfig& m, const PlanRequest& r, bool stop_at_budget = false,
               RankCoverage coverage = RankCoverage::kOnePerClass);

// The bytes each rank holds before any step: the ZeRO-3 fp32 master, gradient and AdamW shards.
int64_t model_state_bytes(const ModelConfig& m, const PlanRequest& r);

// The multiple of which S must be for the request's method and knobs on C ranks (the method
// table's seq_divisor) and of `quantum`: their least common multiple.
int64_t seq_granularity(const ModelConfig& m, const PlanRequest& r, int64_t quantum = kSeqQuantum);

// The requests to try for r's `auto` knobs (kKnobAuto), fastest first: fewest attention stages
// per layer (H/U x N: the largest U, the fewest FPDT chunks), then the largest Ulysses degree u of
// usp / upipe-ring, of those whose all-to-alls stay within a host when r.ranks_per_host says the
// hosts (all of them when none does). The values are the method table's (attention/methods.h). A
// request without auto knobs is its own only candidate.
std::vector<PlanRequest> knob_candidates(const ModelConfig& m, const PlanRequest& r);

// The fastest candidate (knob_candidates order) that fits at r.seq_len, as a complete plan; or,
// if none fits, the complete plan of the most memory-frugal candidate (fits = false).
Plan plan_auto(const ModelConfig& m, const PlanRequest& r);

// The largest S (a multiple of seq_granularity, at least one granule) whose plan fits, with auto
// knobs picked at that S; searched with the most memory-frugal candidate, by doubling from a first
// guess then bisection (the peak grows with S). Where not even one granule fits, the largest S
// below it, a multiple of seq_granularity(m, r, kSeqQuantumBelow). Returns the complete plan at
// that S, or std::nullopt-like: fits = false with the plan at the smallest S when even that does
// not fit.
Plan max_seq_len(const ModelConfig& m, const PlanRequest& r);

// Throws ConfigError with one line when the model state alone (plus the reserve) exceeds the
// device budget, naming what to change.
void check_model_fits(const ModelConfig& m, const PlanRequest& r);

}  // namespace upipe
