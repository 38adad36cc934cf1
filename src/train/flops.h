// Model FLOPs of a training step and this machine's measured GEMM rate: the two halves of MFU
// (model FLOPs utilisation). Model FLOPs count what the model needs, not what the engine spends:
// activation recomputation and the strategies' extra passes are not in them.
#pragma once

#include <cstdint>

#include "backend/device.h"
#include "comm/communicator.h"
#include "model/config.h"

namespace upipe {

// FLOPs of forward + backward for one sequence of S tokens: 6 FLOPs per matrix parameter per
// token (every projection, the MLP and the LM head; not the embedding lookup or the norms), plus
// causal attention's 6 * S * H * d per token per layer (QK^T and PV at 2 FLOPs per multiply-add
// over S/2 keys on average: 2 S H d forward, twice that backward).
double training_flops_per_sequence(const ModelConfig& m, int64_t seq_len);

// The best of a few timed (n, n) x (n, n) GEMMs in `dtype` on dev, FLOP/s. Allocates from the
// device arena (tag workspace) and gives it back; where the operands do not fit the arena's
// budget, n is halved until they do (at least 64; below, the OutOfMemoryError), and the n timed
// is stored in *measured_n. 0 on a device that does not compute.
double measure_gemm_flops(Device& dev, DType dtype, int64_t n = 1024, int reps = 5,
                          int64_t* measured_n = nullptr);

// The job's reference rate: measure_gemm_flops on every rank at once (as they run in a step),
// best of `reps`, the fastest rank's rate; n is the smallest side any rank timed (below n_wanted
// where the operands did not fit beside the run).
struct GemmRate {
  double flops_per_s = 0;
  int64_t n = 0;
};
GemmRate measure_job_gemm_rate(Communicator& world, Device& dev, DType dtype, int64_t n_wanted,
                               int reps);

}  // namespace upipe
