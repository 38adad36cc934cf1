// Element types of stored tensors. Storage is fp32 or bf16; all math accumulates in fp32.
#pragma once

#include <cstdint>
#include <cstring>
#include <string>

namespace upipe {

enum class DType : uint8_t { kF32, kBF16 };

inline int64_t dtype_size(DType t) {
  return t == DType::kF32 ? 4 : 2;
}
inline const char* dtype_name(DType t) {
  return t == DType::kF32 ? "fp32" : "bf16";
}
// Parses "fp32" / "bf16"; throws ConfigError otherwise.
DType parse_dtype(const std::string& s);

inline float bf16_to_f32(uint16_t h) {
  uint32_t u = uint32_t(h) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// Round to nearest even; NaN stays NaN.
inline uint16_t f32_to_bf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return uint16_t((u >> 16) | 0x40);
  u += 0x7fffu + ((u >> 16) & 1u);
  return uint16_t(u >> 16);
}

// Bulk conversions between a typed buffer and fp32 (n elements, contiguous).
void to_f32(const void* src, DType t, float* dst, int64_t n);
void from_f32(const float* src, void* dst, DType t, int64_t n);

}  // namespace upipe
