// Verification of a strategy against the single-rank `local` oracle (`upipe check` and the
// multi-rank tests): runs the strategy forward + backward on this rank's shard of deterministic
// inputs, gathers y and dx, sums the weight gradients over the group, runs `local` on the whole
// sequence on rank 0 and compares, with tolerances from a stated rule:
//   data movement (ulysses, upipe): |err| <= 16 eps_fp32 max|local| for fp32 tensors (the
//       weight gradients always) and 2 eps_bf16 max|local| for bf16-stored y, dx: only the order
//       of a few sums differs (stage slices of Wo, the group's sum of gradient shards), so a
//       handful of ulp of the largest value, or one rounding flip in bf16;
//   merge (ring, usp, fpdt): |err| <= 4 |local - fp64| + the above, with |local - fp64| the
//       oracle's own error against the naive fp64 block: merging partial results changes the
//       arithmetic, so the bound is relative to what the kernel's precision allows;
//   replica sums (ulysses, upipe with K < C: KV heads replicated over ranks): the merge bound
//       for dx, dWk, dWv, dWkn, which depend on the replicas' dK/dV partial sums, and the data
//       movement bound for the others;
//   the QK-norm weight gradients dWqn, dWkn always take the merge bound: each is a (1, d) sum
//   of S x heads terms, added in an order that follows the sharding;
//   bf16 on a backend without native bf16 GEMMs (Backend::native_bf16_gemm: a CPU without
//   AVX512-BF16, whose bf16 products are staged through fp32 blocks): every tensor takes the
//   merge bound, since an intermediate's fp32 sum, and so its bf16 rounding, follows how its
//   GEMM is cut (rows per rank, heads per stage).
// Packed documents (CheckOptions::doc_lens): the oracle is each document run alone through
// `local` (its rows of y and dx; the weight gradients summed over the documents, in fp64), and
// every tensor takes the merge rule with |local - fp64| measured per document the same way: a
// document's keys start at another key tile of the packed sequence than of the document alone,
// so the online softmax rescales at other keys. A single document is the plain sequence.
// CheckResult::rule states the rule applied.
// Tensors: y, dx, dwq, dwk, dwv, dwo, and dwqn, dwkn with QK-norm.
// Every rank returns the same result. Rank 0 computes the oracle (local, and the fp64 block for
// merge strategies) once per process for each shape and seed, and reuses it.
#pragma once

#include <map>
#include <optional>
#include <string>
#include <vector>

#include "attention/strategy.h"

namespace upipe {

struct CheckOptions {
  uint64_t seed = 1;
  int64_t device_budget = int64_t(1) << 40;
  BackendKind backend = BackendKind::kCpu;  // the device the strategy and local run on
  std::vector<int64_t> doc_lens = {};       // the documents' lengths (sum S); empty: one document
};

struct CheckResult {
  std::string method;
  int ranks = 1;
  bool passed = false;
  std::string rule;
  std::map<std::string, double> max_abs_err, tolerance;  // y, dx, dwq, ... (check.h)
  std::string communicator;     // what the strategy talked through: mpi, staged(mpi), nccl
  int64_t peak_bytes = 0;       // max over ranks
  TagBytes peak_by_tag;         // of rank 0, at its peak
  int64_t attn_peak_bytes = 0;  // max over ranks
  int64_t attn_formula_bytes = 0;
  int64_t host_peak_bytes = 0;  // max over ranks: the host arena (fpdt's offloaded K/V chunks)
  int64_t host_formula_bytes = 0;
  CommStats comm;  // rank 0, one forward + backward
  std::optional<CommStats> comm_expected;
  double fwd_s = 0, bwd_s = 0;
};

CheckResult check_strategy(const AttentionConfig& cfg, Communicator& world,
                           const CheckOptions& opt = {});

}  // namespace upipe
