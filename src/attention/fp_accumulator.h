// An output that several GEMMs accumulate into (a strategy's y over stages, dx over the q, k and
// v returns): an fp32 output is the target itself, so a block accumulating into an fp32 residual
// stream needs no buffer of its own; a bf16 output gets an fp32 accumulator from the arena
// (loaded with the output when beta = 1) and is rounded into it once by finish(), as local's
// single GEMM rounds once.
#pragma once

#include "backend/device.h"

namespace upipe {

class FpAccumulator {
 public:
  // out (rows, cols) in any dtype; beta 0 (overwrite) or 1 (add to what out holds).
  FpAccumulator(Device& dev, const Mat& out, float beta, Tag tag);
  const Mat& out() const { return out_; }        // what finish() leaves the result in
  const Mat& target() const { return target_; }  // fp32: where the GEMMs accumulate
  float beta() const { return beta_; }           // the first GEMM's beta on target()
  void finish();                                 // writes a staged accumulator into out
  // Bytes the accumulator takes for an output of (rows, cols) in dtype t.
  static int64_t bytes(int64_t rows, int64_t cols, DType t);

 private:
  Device& dev_;
  Mat out_, target_;
  Tensor acc_;  // (rows, cols) fp32, when out is not fp32
  float beta_;
};

}  // namespace upipe
