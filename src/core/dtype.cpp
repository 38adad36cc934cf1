#include "core/dtype.h"

#include "core/errors.h"

namespace upipe {

DType parse_dtype(const std::string& s) {
  if (s == "fp32" || s == "f32" || s == "float32") return DType::kF32;
  if (s == "bf16" || s == "bfloat16") return DType::kBF16;
  throw ConfigError("unknown dtype '" + s + "'; use fp32 or bf16");
}

void to_f32(const void* src, DType t, float* dst, int64_t n) {
  if (n <= 0) return;  // an empty view may have null pointers, which memcpy must not see
  if (t == DType::kF32) {
    std::memcpy(dst, src, size_t(n) * 4);
    return;
  }
  const uint16_t* s = static_cast<const uint16_t*>(src);
  for (int64_t i = 0; i < n; ++i) dst[i] = bf16_to_f32(s[i]);
}

void from_f32(const float* src, void* dst, DType t, int64_t n) {
  if (n <= 0) return;
  if (t == DType::kF32) {
    std::memcpy(dst, src, size_t(n) * 4);
    return;
  }
  uint16_t* d = static_cast<uint16_t*>(dst);
  for (int64_t i = 0; i < n; ++i) d[i] = f32_to_bf16(src[i]);
}

}  // namespace upipe
