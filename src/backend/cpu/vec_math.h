// Scalar math of the CPU kernels: an exp with no libm call and no branch on data (the vector
// twin, exp_v, is in vec_math-inl.h).
#pragma once

#include <cstdint>
#include <cstring>

namespace upipe::cpu {

// exp(x) for x <= 0 up to ~88 in magnitude (Cephes polynomial, ~1 ulp); inputs below -87.3
// are clamped, so exp(-inf) here is ~1e-38, never used: callers zero masked entries.
inline float exp_fast(float x) {
  x = x < -87.3f ? -87.3f : (x > 88.3f ? 88.3f : x);
  const float fx = __builtin_floorf(x * 1.44269504088896341f + 0.5f);
  float r = x - fx * 0.693359375f;
  r = r - fx * -2.12194440e-4f;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * r * r + r + 1.0f;
  const int32_t e = (static_cast<int32_t>(fx) + 127) << 23;
  float s;
  std::memcpy(&s, &e, 4);
  return p * s;
}

}  // namespace upipe::cpu
