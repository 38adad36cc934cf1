// Tensor views and owning tensors. Activations are matrices in shard notation: a (S/C, H, d)
// tensor is a row-major (S/C, H*d) matrix whose head h occupies columns [h*d, (h+1)*d); a
// leading dimension `ld` lets head-sharded and sequence-sharded slices be views, not copies.
#pragma once

#include <cstdint>

#include "core/arena.h"
#include "core/check.h"
#include "core/checked.h"
#include "core/dtype.h"

namespace upipe {

// Byte size of a (rows, cols) matrix of dtype t: the one size function allocation and
// formulas share. Checked: SizeError when the product leaves int64.
inline int64_t mat_bytes(int64_t rows, int64_t cols, DType t) {
  if (rows < 0 || cols < 0) [[unlikely]]
    throw SizeError(fmt::format("negative matrix shape ({}, {})", rows, cols));
  return checked_mul(checked_mul(rows, cols, "matrix elements"), dtype_size(t), "matrix bytes");
}

// A row-major matrix view: element (r, c) lives at data + (r * ld + c) * dtype_size(dtype).
struct Mat {
  void* data = nullptr;
  DType dtype = DType::kF32;
  int64_t rows = 0, cols = 0, ld = 0;

  int64_t numel() const { return rows * cols; }
  bool contiguous() const { return ld == cols || rows <= 1; }
  int64_t bytes() const { return mat_bytes(rows, cols, dtype); }
  // Address of element (r, c); arithmetic only. Meta tensors have real, never-dereferenced
  // addresses (MetaAllocator), so this is defined behaviour on every device.
  void* at(int64_t r, int64_t c) const {
    return static_cast<char*>(data) + (r * ld + c) * dtype_size(dtype);
  }
  Mat block(int64_t r0, int64_t nr, int64_t c0, int64_t nc) const {
    UPIPE_DCHECK(r0 >= 0 && c0 >= 0 && r0 + nr <= rows && c0 + nc <= cols);
    return Mat{at(r0, c0), dtype, nr, nc, ld};
  }
  Mat rows_of(int64_t r0, int64_t nr) const { return block(r0, nr, 0, cols); }
  Mat cols_of(int64_t c0, int64_t nc) const { return block(0, rows, c0, nc); }
  float* f32() const {
    UPIPE_DCHECK(dtype == DType::kF32);
    return static_cast<float*>(data);
  }
};

// An arena-owned, contiguous matrix.
class Tensor {
 public:
  Tensor() = default;
  Tensor(Arena& arena, Tag tag, DType dtype, int64_t rows, int64_t cols)
      : buf_(arena, mat_bytes(rows, cols, dtype), tag),
        mat_{buf_.data(), dtype, rows, cols, cols} {}
  const Mat& mat() const { return mat_; }
  operator const Mat&() const { return mat_; }
  void* data() const { return mat_.data; }
  float* f32() const { return mat_.f32(); }
  int64_t rows() const { return mat_.rows; }
  int64_t cols() const { return mat_.cols; }
  int64_t bytes() const { return buf_.bytes(); }
  DType dtype() const { return mat_.dtype; }
  void reset() {
    buf_.reset();
    mat_ = Mat{};
  }

 private:
  Buffer buf_;
  Mat mat_;
};

}  // namespace upipe
