// Helpers shared by the tests: fill tensors from the counter RNG, read them as fp64, compare.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "backend/device.h"
#include "backend/reference/ref_view.h"
#include "core/rng.h"
#include "core/tensor.h"

namespace upipe::test {

inline void fill_normal(const Mat& m, uint64_t seed, double stddev = 1.0) {
  std::vector<float> row(size_t(m.cols));
  for (int64_t r = 0; r < m.rows; ++r) {
    for (int64_t c = 0; c < m.cols; ++c)
      row[size_t(c)] = float(stddev * normal_at(seed, uint64_t(r * m.cols + c)));
    from_f32(row.data(), m.at(r, 0), m.dtype, m.cols);
  }
}

inline void fill_value(const Mat& m, float v) {
  std::vector<float> row(size_t(m.cols), v);
  for (int64_t r = 0; r < m.rows; ++r) from_f32(row.data(), m.at(r, 0), m.dtype, m.cols);
}

// Row-major (rows, cols) copy as T.
template <class T = double>
std::vector<T> read(const Mat& m) {
  std::vector<T> out(size_t(m.rows * m.cols));
  std::vector<float> row(size_t(m.cols));
  for (int64_t r = 0; r < m.rows; ++r) {
    to_f32(m.at(r, 0), m.dtype, row.data(), m.cols);
    for (int64_t c = 0; c < m.cols; ++c) out[size_t(r * m.cols + c)] = T(row[size_t(c)]);
  }
  return out;
}

template <class T>
ref::View<T> view(std::vector<T>& v, int64_t rows, int64_t cols) {
  return {v.data(), rows, cols, cols};
}
template <class T>
ref::View<const T> cview(const std::vector<T>& v, int64_t rows, int64_t cols) {
  return {v.data(), rows, cols, cols};
}

template <class A, class B>
double max_abs_diff(const std::vector<A>& a, const std::vector<B>& b) {
  double m = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    const double x = double(a[i]), y = double(b[i]);
    if (std::isinf(x) && std::isinf(y) && x == y) continue;
    if (std::isnan(x - y)) return x - y;  // std::max would drop it and hide a NaN output
    m = std::max(m, std::abs(x - y));
  }
  return m;
}

// The largest finite |x|, the scale of a tolerance: infinities are skipped (a reference may hold
// -inf, e.g. the lse of a row that sees no key; max_abs_diff compares those exactly), a NaN is
// returned, so a tolerance built on it fails.
template <class A>
double max_abs(const std::vector<A>& a) {
  double m = 0;
  for (const A& x : a) {
    const double v = std::abs(double(x));
    if (std::isnan(v)) return v;
    if (std::isfinite(v)) m = std::max(m, v);
  }
  return m;
}

// Whether every element is exactly zero (a NaN or an infinity is not).
template <class A>
bool all_zero(const std::vector<A>& a) {
  return std::all_of(a.begin(), a.end(), [](const A& x) { return double(x) == 0.0; });
}

template <class T, class U>
std::vector<T> cast(const std::vector<U>& v) {
  return std::vector<T>(v.begin(), v.end());
}

// Values rounded through a storage dtype (what a bf16 tensor actually holds).
inline std::vector<double> rounded(const std::vector<double>& v, DType t) {
  std::vector<double> out(v.size());
  for (size_t i = 0; i < v.size(); ++i)
    out[i] = t == DType::kF32 ? double(float(v[i])) : double(bf16_to_f32(f32_to_bf16(float(v[i]))));
  return out;
}

inline constexpr double kEps32 = std::numeric_limits<float>::epsilon();

// The tolerance rule of a fast kernel against its fp64 reference: its error within 2x the error
// of a naive same-precision baseline, plus a floor of 4 fp32 ulp of the largest value.
inline void expect_close(const std::vector<double>& fast, const std::vector<double>& r64,
                         const std::vector<double>& base, const std::string& what) {
  ASSERT_EQ(fast.size(), r64.size()) << what;
  const double err = max_abs_diff(fast, r64), base_err = max_abs_diff(base, r64);
  EXPECT_LE(err, 2 * base_err + 4 * kEps32 * max_abs(r64))
      << what << ": fast " << err << ", same-precision baseline " << base_err;
}

}  // namespace upipe::test
