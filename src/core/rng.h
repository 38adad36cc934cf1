// Counter-based random numbers: value i of stream `seed` is a pure function of (seed, i), so a
// rank can fill exactly its shard of a global tensor and get the same numbers the single-rank
// oracle sees, whatever the sharding.
#pragma once

#include <cmath>
#include <cstdint>

namespace upipe {

inline uint64_t splitmix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

// Uniform in (0, 1).
inline double uniform_at(uint64_t seed, uint64_t i) {
  const uint64_t h = splitmix64(splitmix64(seed) ^ (i * 0xd1342543de82ef95ull));
  return (double(h >> 11) + 0.5) * (1.0 / 9007199254740992.0);
}

// Standard normal (Box-Muller on two independent uniforms).
inline double normal_at(uint64_t seed, uint64_t i) {
  const double u1 = uniform_at(seed, 2 * i), u2 = uniform_at(seed, 2 * i + 1);
  return std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2);
}

}  // namespace upipe
