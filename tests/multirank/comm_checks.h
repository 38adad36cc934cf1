// The collective checks every communicator must pass, shared by the MPI, staged and NCCL tests:
// inputs built so every result is exactly predictable, run through any Communicator on host
// buffers (a test of a device communicator reaches device memory through a staging wrapper).
#pragma once

#include <string>

#include "comm/communicator.h"

namespace upipe::test {

// Every blocking and non-blocking op once or more (fp32 and bf16, sum and max), the non-blocking
// ones against their blocking forms, then a barrier. Checks results only when `check` (the fake
// backend moves no data); the call sequence, hence the counters, is the same either way.
void exercise(Communicator& c, bool check);
// Two collectives in flight at once: both are started before either is waited for, and they
// are waited for in the opposite order. Blocks of 64K elements exceed MPI's eager limit, so
// the transfers really overlap.
void exercise_overlap(Communicator& c);
// Splits `w` into groups of u consecutive ranks and the orthogonal groups (u = 2 from 4 ranks,
// else 1), checks their places and runs exercise() on both.
void exercise_grid_split(Communicator& w);
// got's counters equal want's, op by op.
void expect_same_stats(const CommStats& got, const CommStats& want, const std::string& what);

}  // namespace upipe::test
