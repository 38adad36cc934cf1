// The embedding's scatter-add on the GPU (elementwise_cuda.cu scatter_add_rows) without atomics:
// the host groups a chunk of rows by the table row they add into, and the kernel gives each group
// to one thread per column, which adds the group's rows in ascending order. So every element of
// the table takes its additions in row order, as the CPU's one add_into per row does: the same
// bits, whatever the launch. Host code only (tests/unit/test_cuda_math.cpp checks it on the CPU).
#pragma once

#include <algorithm>
#include <cstdint>
#include <numeric>

namespace upipe::cuda {

// What one chunk of rows occupies in the parameter block (int32 words): order (n), then the
// groups' ids (u) and starts (u + 1); at most 3n + 1 words.
struct RowGroups {
  int64_t groups = 0;                 // u
  int64_t ids_at = 0, starts_at = 0;  // word offsets of the ids and the starts
};

// Rows a chunk may hold in a block of `words` int32 words, and the ids one gather launch takes.
constexpr int64_t scatter_chunk_rows(int64_t words) {
  return (words - 1) / 3;
}
constexpr int64_t gather_chunk_rows(int64_t words) {
  return words;
}

// Groups rows [0, n) of ids (ids[r] the table row of row r) into out (at least 3n + 1 words):
// out[0, n) the rows sorted by (id, row); group g's id at out[ids_at + g], its rows at
// out[starts[g], starts[g + 1]) of that order, starts at out[starts_at + ...].
inline RowGroups group_rows(const int32_t* ids, int64_t n, int32_t* out) {
  RowGroups g;
  int32_t* order = out;
  std::iota(order, order + n, int32_t(0));
  std::stable_sort(order, order + n, [&](int32_t a, int32_t b) { return ids[a] < ids[b]; });
  for (int64_t k = 0; k < n; ++k)
    if (k == 0 || ids[order[k]] != ids[order[k - 1]]) ++g.groups;
  g.ids_at = n;
  g.starts_at = n + g.groups;
  int64_t at = 0;
  for (int64_t k = 0; k < n; ++k)
    if (k == 0 || ids[order[k]] != ids[order[k - 1]]) {
      out[g.ids_at + at] = ids[order[k]];
      out[g.starts_at + at] = int32_t(k);
      ++at;
    }
  out[g.starts_at + g.groups] = int32_t(n);
  return g;
}

}  // namespace upipe::cuda
