// Plain views the CUDA kernels take: the fields of Mat (core/tensor.h) and DocSpan
// (backend/backend.h) without their headers, so .cu files include nothing but CUDA and this
// directory. cuda_backend.cpp converts (dview(), static_asserts on DocSpan's layout).
#pragma once

#include <cstdint>

namespace upipe::cuda {

enum class DT : uint8_t { kF32 = 0, kBF16 = 1 };  // DType's values

struct DView {
  void* data = nullptr;
  DT dtype = DT::kF32;
  int64_t rows = 0, cols = 0, ld = 0;  // row-major, unit column stride, row stride ld
};

// backend.h's DocSpan: rows [row, row + rows) of a span list hold positions [pos, pos + rows) of
// document doc. Lists live in device memory.
struct DSpan {
  int64_t row = 0, rows = 0, doc = 0, pos = 0;
};
struct DDocs {
  const DSpan* spans = nullptr;  // device memory
  int64_t count = 0;
  int64_t row0 = 0;  // list row of the view's row 0
};

}  // namespace upipe::cuda
