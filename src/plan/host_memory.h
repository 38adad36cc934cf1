// The ranks of one host share its memory, while an arena checks only its own process's (two ranks
// planned at 114 GiB each on a 23.5 GiB machine started, and the kernel killed one mid-step).
// Given a plan and where each rank runs, the first host whose ranks' planned peaks together exceed
// its memory, with a budget per rank that would hold. On cpu both arenas are the host's memory;
// on cuda the host arena (pinned) is. A function of its arguments: every rank that calls it with
// the same plan, host names and memories reaches the same verdict.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "plan/planner.h"

namespace upipe {

struct HostOverMemory {
  std::string host;
  int ranks = 0;          // of this host
  int64_t need = 0;       // their planned peaks together
  int64_t most = 0;       // the largest of one rank
  int64_t have = 0;       // the host's memory
  int64_t device_share = 0;  // cpu: a device budget per rank that holds (0: none does)
  int64_t host_share = 0;    // cuda: a host budget per rank that holds
};

// hosts[r], memory[r]: rank r's host name and that host's memory (bytes). A plan without every
// rank (stopped at its budget) counts each rank at the worst rank's peaks.
std::optional<HostOverMemory> host_over_memory(const Plan& p, bool cpu,
                                               const std::vector<std::string>& hosts,
                                               const std::vector<int64_t>& memory);

}  // namespace upipe
