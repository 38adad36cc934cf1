// Rotary position embedding (Llama rotate-half form), applied in place on q or k at global token
// positions; backward is the inverse rotation, also in place. Frequencies come from RopeParams
// (backend.h: theta, optional Llama-3.1 "llama3" scaling). The CPU backend evaluates angles in
// fp64 (exact sincos every 64 positions, fp64 rotation steps between), so positions in the
// millions stay accurate and a position's rotation never depends on how the sequence was
// sharded.
#pragma once

#include "backend/device.h"

namespace upipe {

// x: (rows, heads*d), any dtype; rows covered by `pos`.
void rope_forward(Device& dev, const Mat& x, int d, const RowPositions& pos, const RopeParams& rp);
void rope_backward(Device& dev, const Mat& x, int d, const RowPositions& pos, const RopeParams& rp);

}  // namespace upipe
