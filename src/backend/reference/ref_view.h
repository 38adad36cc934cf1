// Plain strided views for the naive reference kernels (oracles for tests and for `upipe check`).
// The references are templated on the math type: float for a same-precision baseline, double
// for the fp64 reference that tolerances are measured against.
#pragma once

#include <cstdint>

namespace upipe::ref {

template <class T>
struct View {
  T* data = nullptr;
  int64_t rows = 0, cols = 0, ld = 0;
  T& operator()(int64_t r, int64_t c) const { return data[r * ld + c]; }
};

}  // namespace upipe::ref
