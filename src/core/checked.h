// Checked 64-bit size arithmetic. Byte counts are products of user-given dimensions; a wrapped
// product would become a tiny or negative allocation (or a pointer past the address space), so
// every size the engine computes goes through these. Overflow throws SizeError; the CLI
// validates its inputs first so that users see a message naming the flag instead.
#pragma once

#include <fmt/format.h>

#include <cstdint>
#include <initializer_list>

#include "core/errors.h"

namespace upipe {

// a * b, or SizeError naming `what` (e.g. "tensor bytes") when the product leaves int64.
inline int64_t checked_mul(int64_t a, int64_t b, const char* what = "size") {
  int64_t r = 0;
  if (__builtin_mul_overflow(a, b, &r)) [[unlikely]]
    throw SizeError(fmt::format("{} overflows 64 bits: {} x {}", what, a, b));
  return r;
}

inline int64_t checked_add(int64_t a, int64_t b, const char* what = "size") {
  int64_t r = 0;
  if (__builtin_add_overflow(a, b, &r)) [[unlikely]]
    throw SizeError(fmt::format("{} overflows 64 bits: {} + {}", what, a, b));
  return r;
}

// a * b * c ... without overflow, else false (for validation that wants its own message).
inline bool mul_fits(int64_t& out, std::initializer_list<int64_t> factors) {
  int64_t r = 1;
  for (int64_t f : factors)
    if (__builtin_mul_overflow(r, f, &r)) return false;
  out = r;
  return true;
}

}  // namespace upipe
