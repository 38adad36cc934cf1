// The UPipe GQA schedule: which query heads each rank processes in each stage and which KV
// heads stay resident on it, as pure functions (the engine, the planner, the tests and the
// docs all use these).
//
// C ranks, H query heads, K KV heads, G = H/K, U = m C query heads per stage (m per rank).
//   K >= C: rank j owns KV heads [j K/C, (j+1) K/C). They are visited in KV sets of
//           R = m / gcd(m, G) heads per rank; a set lasts G / gcd(m, G) stages, in which the
//           rank walks, m at a time, through the R G query heads reading its R resident KV
//           heads, in increasing head order. Each KV set crosses the network once.
//   K <  C: KV head a is replicated on the C/K ranks j with j / (C/K) = a; rank j processes
//           query heads [j H/C, (j+1) H/C) (all read head a), m per stage; one KV set.
// U = H gives one stage per set and every rank's heads at once: Ulysses.
// Head-pairing invariant (tested): every query head a rank processes reads a KV head resident
// on that rank in that stage, and every query head is processed exactly once.
#pragma once

#include <string>
#include <vector>

#include "attention/config.h"

namespace upipe {

struct UpipeSchedule {
  int ranks = 1;            // C (the all-to-all group)
  int heads = 1;            // H
  int kv_heads = 1;         // K
  int heads_per_stage = 1;  // U
  int m = 1;                // U / C: query heads per rank per stage
  int gqa_group = 1;        // G = H / K
  int kv_per_rank = 1;      // R: resident KV heads per rank per set
  int stages_per_set = 1;
  int sets = 1;

  int stages() const { return sets * stages_per_set; }  // = H / U
  bool replicated() const { return kv_heads < ranks; }
  int set_of(int stage) const { return stage / stages_per_set; }
  bool starts_set(int stage) const { return stage % stages_per_set == 0; }
  // First of the m consecutive query heads rank j processes in `stage`.
  int q_head(int stage, int rank) const;
  // First of the R consecutive KV heads resident on rank j during `set`.
  int kv_head(int set, int rank) const;
};

// A run of a stage's query heads on one rank that read the same resident KV heads evenly: one
// attention call of the engine. Indices are local to the rank (its m query heads, its R
// resident KV heads).
struct HeadRun {
  int q0, nh;  // query heads [q0, q0+nh)
  int k0, nk;  // resident KV heads [k0, k0+nk) they read, nh / nk each
};
// The runs of `stage`, in head order (the same on every rank).
std::vector<HeadRun> head_runs(const UpipeSchedule& s, int stage);

// Throws ConfigError with what to change when U (0 = C) does not fit H, K and C.
UpipeSchedule make_upipe_schedule(const AttentionConfig& cfg, int ranks, int stage_heads);

}  // namespace upipe
