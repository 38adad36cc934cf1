#include "attention/fp_accumulator.h"

#include "backend/tensor_ops.h"

namespace upipe {

FpAccumulator::FpAccumulator(Device& dev, const Mat& out, float beta, Tag tag)
    : dev_(dev), out_(out), target_(out), beta_(beta) {
  UPIPE_CHECK(beta == 0.0f || beta == 1.0f, "accumulation beta must be 0 or 1, got {}", beta);
  if (out.dtype == DType::kF32) return;
  acc_ = Tensor(dev.mem(), tag, DType::kF32, out.rows, out.cols);
  target_ = acc_.mat();
  if (beta != 0.0f) copy(dev, target_, out);
}

void FpAccumulator::finish() {
  if (!acc_.data()) return;
  copy(dev_, out_, acc_);
  acc_.reset();
  target_ = out_;
}

int64_t FpAccumulator::bytes(int64_t rows, int64_t cols, DType t) {
  return t == DType::kF32 ? 0 : mat_bytes(rows, cols, DType::kF32);
}

}  // namespace upipe
