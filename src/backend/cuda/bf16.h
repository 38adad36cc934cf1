// bf16 <-> fp32 for the CUDA kernels and their host tests: core/dtype.h's bf16_to_f32 /
// f32_to_bf16, bit for bit (test_cuda_math checks all 65536 values and the rounding ties).
#pragma once

#include <cstdint>
#include <cstring>

#include "backend/cuda/hd.h"

namespace upipe::cuda {

UPIPE_HD uint32_t f32_bits(float f) {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(f);
#else
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
#endif
}
UPIPE_HD float bits_f32(uint32_t u) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(u);
#else
  float f;
  std::memcpy(&f, &u, 4);
  return f;
#endif
}
UPIPE_HD float bf16_to_f32(uint16_t h) {
  return bits_f32(uint32_t(h) << 16);
}
// Round to nearest even; a NaN stays a NaN (quiet bit set, sign and high payload kept).
UPIPE_HD uint16_t f32_to_bf16(float f) {
  uint32_t u = f32_bits(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return uint16_t((u >> 16) | 0x40);
  u += 0x7fffu + ((u >> 16) & 1u);
  return uint16_t(u >> 16);
}
}  // namespace upipe::cuda
