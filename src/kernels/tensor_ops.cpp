#include "kernels/tensor_ops.h"

#include <algorithm>
#include <cstring>
#include <vector>

namespace upipe {

void zero(Device& dev, const Mat& x) {
  if (dev.is_meta()) return;
  if (x.contiguous()) {
    std::memset(x.data, 0, size_t(x.bytes()));
    return;
  }
  for (int64_t r = 0; r < x.rows; ++r)
    std::memset(x.at(r, 0), 0, size_t(x.cols * dtype_size(x.dtype)));
}

void copy(Device& dev, const Mat& dst, const Mat& src) {
  UPIPE_CHECK(dst.rows == src.rows && dst.cols == src.cols, "copy of {}x{} into {}x{}", src.rows,
              src.cols, dst.rows, dst.cols);
  if (dev.is_meta()) return;
  if (dst.dtype == src.dtype) {
    for (int64_t r = 0; r < src.rows; ++r)
      std::memcpy(dst.at(r, 0), src.at(r, 0), size_t(src.cols * dtype_size(src.dtype)));
    return;
  }
  float row[1024];
  for (int64_t r = 0; r < src.rows; ++r)
    for (int64_t c0 = 0; c0 < src.cols; c0 += 1024) {
      const int64_t n = std::min<int64_t>(1024, src.cols - c0);
      to_f32(src.at(r, c0), src.dtype, row, n);
      from_f32(row, dst.at(r, c0), dst.dtype, n);
    }
}

void add_into(Device& dev, const Mat& dst, const Mat& src) {
  UPIPE_CHECK(dst.dtype == DType::kF32 && src.dtype == DType::kF32 && dst.rows == src.rows &&
                  dst.cols == src.cols,
              "add_into needs equal fp32 shapes");
  if (dev.is_meta()) return;
  for (int64_t r = 0; r < src.rows; ++r) {
    float* d = static_cast<float*>(dst.at(r, 0));
    const float* s = static_cast<const float*>(src.at(r, 0));
    for (int64_t c = 0; c < src.cols; ++c) d[c] += s[c];
  }
}

void add_transposed(Device& dev, const Mat& dst, const Mat& src, float beta) {
  UPIPE_CHECK(dst.dtype == DType::kF32 && src.dtype == DType::kF32 && dst.rows == src.cols &&
                  dst.cols == src.rows,
              "add_transposed: dst {}x{}, src {}x{}", dst.rows, dst.cols, src.rows, src.cols);
  if (dev.is_meta()) return;
  // Blocks of 32 x 32 keep both sides in cache.
  for (int64_t r0 = 0; r0 < dst.rows; r0 += 32)
    for (int64_t c0 = 0; c0 < dst.cols; c0 += 32)
      for (int64_t r = r0; r < std::min(dst.rows, r0 + 32); ++r) {
        float* d = static_cast<float*>(dst.at(r, 0));
        for (int64_t c = c0; c < std::min(dst.cols, c0 + 32); ++c) {
          const float v = *static_cast<const float*>(src.at(c, r));
          d[c] = beta == 0.0f ? v : beta * d[c] + v;
        }
      }
}

}  // namespace upipe
