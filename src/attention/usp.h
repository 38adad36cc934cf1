// USP (Unified Sequence Parallelism) and UPipe+ring: the C ranks form r = C/u groups of u
// consecutive ranks. The headwise engine (headwise.h) runs its all-to-all inside each group
// (Ulysses for usp, UPipe stages of U query heads for upipe-ring) and a ring core (ring_core.h)
// rotates K/V between the r groups; the zigzag grid layout (layout.h) makes each group's
// all-to-all assemble its zigzag shard. u = C leaves no ring (ulysses / upipe); usp with u = 1
// is plain ring attention (ring.h). docs/strategies-ring.md has the formulas.
#pragma once

#include <memory>
#include <string>

#include "attention/strategy.h"

namespace upipe {

// The Ulysses degree u cfg selects on C ranks (parallel.ulysses_degree, 0 = all).
int usp_degree(const AttentionConfig& cfg, int ranks);

// The rows layout cfg's method (usp or upipe-ring) and degree select on C ranks.
SeqLayout usp_layout(const AttentionConfig& cfg, int ranks);

// Throws ConfigError saying what to change when cfg's method (usp or upipe-ring) cannot run cfg
// on C ranks. A pure function of its arguments, so every rank throws the same error.
void validate_usp(const AttentionConfig& cfg, int ranks);

// Validates, splits ctx.comm into the Ulysses groups and the ring, and builds the strategy.
std::unique_ptr<AttentionStrategy> make_usp(const StrategyContext& ctx);

}  // namespace upipe
