// Seeded random damage to a file's bytes, for the tests that hold a reader of untrusted files to
// its contract: every damaged file is either refused with a ConfigError or read into values that
// pass the reader's own checks (and, where the format carries checksums, equal the original's).
// The damage is what disks, transfers and hand edits do, biased toward the headers where the
// sizes and offsets live: a flipped bit, a byte set to a value parsers trip on, a truncation, a
// byte inserted or deleted, eight bytes set to an extreme integer, a run of bytes duplicated.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

namespace upipe::test {

struct Mutant {
  std::string bytes;
  std::string what;  // how it was damaged, for the failure message
};

// How many times the tests' counts of damaged copies to make: UPIPE_MUTATIONS_SCALE (default 1;
// e.g. 100 to fuzz for longer by hand). The first copies of a seed are the same at any scale.
inline int mutation_scale() {
  const char* v = std::getenv("UPIPE_MUTATIONS_SCALE");
  const int n = v != nullptr ? std::atoi(v) : 1;
  return n >= 1 ? n : 1;
}

// Damaged copies of `original`, one at a time (seeded: the same every run). Half of the edits
// fall in bytes [0, hot) when hot > 0 (the header), the rest anywhere.
class Mutator {
 public:
  Mutator(const std::string& original, uint64_t seed, size_t hot = 0)
      : original_(original), rng_(seed), hot_(hot) {}

  Mutant next() {
    static const unsigned char kSpecial[] = {0x00, 0xff, 0x7f, 0x80, '0', '9', '-', '.',  'e',
                                             '"',  '{',  '}',  '[',  ']', ',', ':', '\\', '\n'};
    static const int64_t kExtreme[] = {
        0, -1, INT64_MAX, INT64_MIN, int64_t(1) << 62, int64_t(1) << 32, int64_t(1) << 31, 255};
    for (;;) {
      std::string b = original_;
      std::string what;
      const size_t at = where();
      switch (rng_() % 7) {
        case 0: {
          const int bit = int(rng_() % 8);
          if (b.empty()) continue;
          b[at] = char(uint8_t(b[at]) ^ (1u << bit));
          what = "bit " + std::to_string(bit) + " of byte " + std::to_string(at) + " flipped";
          break;
        }
        case 1: {
          if (b.empty()) continue;
          const unsigned char v = kSpecial[below(sizeof kSpecial)];
          if (uint8_t(b[at]) == v) continue;
          b[at] = char(v);
          what = "byte " + std::to_string(at) + " set to " + std::to_string(int(v));
          break;
        }
        case 2:
          b.resize(at);
          what = "truncated to " + std::to_string(at) + " bytes";
          break;
        case 3:
          b.insert(b.begin() + std::ptrdiff_t(at), char(kSpecial[below(sizeof kSpecial)]));
          what = "a byte inserted at " + std::to_string(at);
          break;
        case 4:
          if (b.empty()) continue;
          b.erase(b.begin() + std::ptrdiff_t(at));
          what = "byte " + std::to_string(at) + " deleted";
          break;
        case 5: {
          const size_t p = at & ~size_t(7);
          if (p + 8 > b.size()) continue;
          const int64_t v = kExtreme[below(std::size(kExtreme))];
          std::memcpy(b.data() + p, &v, 8);
          if (b == original_) continue;
          what = "bytes [" + std::to_string(p) + ", +8) set to " + std::to_string(v);
          break;
        }
        default: {
          const size_t len = 1 + below(16);
          if (at + len > b.size()) continue;
          b.insert(at, b.substr(at, len));
          what = std::to_string(len) + " bytes at " + std::to_string(at) + " duplicated";
          break;
        }
      }
      return {std::move(b), std::move(what)};
    }
  }

 private:
  size_t below(size_t n) { return n == 0 ? size_t(0) : size_t(rng_() % n); }
  size_t where() {
    const size_t n = original_.size();
    return (hot_ > 0 && rng_() % 2 == 0) ? below(std::min(hot_, n)) : below(n);
  }

  const std::string& original_;
  std::mt19937_64 rng_;
  size_t hot_;
};

// `count` x mutation_scale() damaged copies of `original`, the first of Mutator(original, seed,
// hot), given to fn one at a time (only one is held: a large scale needs no more memory).
template <class Fn>
void for_each_mutant(const std::string& original, uint64_t seed, int count, size_t hot, Fn&& fn) {
  Mutator m(original, seed, hot);
  const int64_t n = int64_t(count) * mutation_scale();
  for (int64_t i = 0; i < n; ++i) fn(m.next());
}

// The same copies as a vector.
inline std::vector<Mutant> mutants(const std::string& original, uint64_t seed, int count,
                                   size_t hot = 0) {
  std::vector<Mutant> out;
  for_each_mutant(original, seed, count, hot, [&](Mutant m) { out.push_back(std::move(m)); });
  return out;
}

}  // namespace upipe::test
