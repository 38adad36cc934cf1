#include "model/lm_loss.h"

#include <algorithm>
#include <array>
#include <cmath>

#include "backend/gemm.h"
#include "backend/tensor_ops.h"

namespace upipe {
namespace {

void check_config(const LmLossConfig& c) {
  UPIPE_CHECK(c.hidden > 0 && c.vocab > 0, "lm_loss hidden ({}) and vocab ({}) must be > 0",
              c.hidden, c.vocab);
  UPIPE_CHECK(c.tile_rows > 0, "lm_loss tile_rows must be > 0, got {}", c.tile_rows);
}

// The full tile's rows and the last tile's (equal when T divides rows).
std::array<int64_t, 2> tile_rows(const LmLossConfig& c, int64_t rows) {
  const int64_t t = std::min(c.tile_rows, rows);
  return {t, rows % c.tile_rows == 0 ? t : rows % c.tile_rows};
}

// In place on a (t, V) fp32 tile of logits: each labelled row becomes scale * (softmax - onehot),
// an unlabelled row 0. Returns the tile's sum of -log softmax[label] (unscaled).
double cross_entropy_rows(float* logits, int64_t t, int64_t v, const int32_t* labels, float scale) {
  double loss = 0;
  for (int64_t r = 0; r < t; ++r) {
    float* row = logits + r * v;
    if (labels[r] < 0) {
      std::fill_n(row, v, 0.0f);
      continue;
    }
    const float m = *std::max_element(row, row + v);
    const float target = row[labels[r]];
    double sum = 0;
    for (int64_t j = 0; j < v; ++j) {
      row[j] = std::exp(row[j] - m);
      sum += row[j];
    }
    loss += double(m) + std::log(sum) - double(target);
    const float p = float(double(scale) / sum);
    for (int64_t j = 0; j < v; ++j) row[j] *= p;
    row[labels[r]] -= scale;
  }
  return loss;
}

}  // namespace

double lm_loss(Device& dev, const LmLossConfig& c, const Mat& h, const Mat& w,
               std::span<const int32_t> labels, float scale, const Mat& dh, const Mat& dw,
               float dw_beta) {
  check_config(c);
  const int64_t rows = h.rows, d = c.hidden, v = c.vocab;
  UPIPE_CHECK(h.cols == d && h.dtype == c.dtype, "lm_loss h is ({}, {}) {}, expected (rows, {}) {}",
              h.rows, h.cols, dtype_name(h.dtype), d, dtype_name(c.dtype));
  UPIPE_CHECK(w.rows == v && w.cols == d && w.dtype == c.dtype,
              "lm_loss W is ({}, {}) {}, expected ({}, {}) {}", w.rows, w.cols, dtype_name(w.dtype),
              v, d, dtype_name(c.dtype));
  UPIPE_CHECK(dh.rows == rows && dh.cols == d && dh.dtype == c.grad_dtype,
              "lm_loss dh is ({}, {}) {}, expected ({}, {}) {}", dh.rows, dh.cols,
              dtype_name(dh.dtype), rows, d, dtype_name(c.grad_dtype));
  UPIPE_CHECK(dw.rows == v && dw.cols == d && dw.dtype == DType::kF32,
              "lm_loss dW is ({}, {}) {}, expected ({}, {}) f32", dw.rows, dw.cols,
              dtype_name(dw.dtype), v, d);
  UPIPE_CHECK(int64_t(labels.size()) == rows, "lm_loss has {} labels for {} rows", labels.size(),
              rows);
  for (size_t i = 0; i < labels.size(); ++i)
    UPIPE_CHECK(labels[i] >= -1 && labels[i] < v,
                "lm_loss label {} of row {} is outside [0, {}) and not -1 (no prediction)",
                labels[i], i, v);
  UPIPE_CHECK(dw_beta == 0.0f || dw_beta == 1.0f, "lm_loss dw_beta must be 0 or 1, got {}",
              dw_beta);
  // Zeroed up front rather than by the first tile's beta, so rows = 0 still gives dW = 0.
  if (dw_beta == 0.0f) zero(dev, dw);
  const bool computes = dev.backend().computes();
  double loss = 0;
  for (int64_t r0 = 0; r0 < rows; r0 += c.tile_rows) {
    const int64_t t = std::min(c.tile_rows, rows - r0);
    const Mat ht = h.rows_of(r0, t);                            // (T, D)
    Tensor logits(dev.mem(), Tag::kLogits, DType::kF32, t, v);  // (T, V)
    gemm(dev, ht, false, w, true, logits);                      // h W^T
    {
      Tensor host(dev.host(), Tag::kLogits, DType::kF32, t, v);  // (T, V)
      dev.copy(host.data(), logits.data(), logits.bytes(), CopyKind::kDeviceToHost);
      if (computes) loss += cross_entropy_rows(host.f32(), t, v, labels.data() + r0, scale);
      dev.copy(logits.data(), host.data(), logits.bytes(), CopyKind::kHostToDevice);
    }
    gemm(dev, logits, false, w, false, dh.rows_of(r0, t));  // dh = G W
    gemm(dev, logits, true, ht, false, dw, 1.0f, 1.0f);     // dW += G^T h
  }
  return double(scale) * loss;
}

int64_t lm_loss_peak_bytes(const Backend& be, const LmLossConfig& c, int64_t rows) {
  check_config(c);
  if (rows == 0) return 0;
  const int64_t d = c.hidden, v = c.vocab;
  const DType t = c.dtype, f32 = DType::kF32;
  int64_t peak = 0;
  for (int64_t n : tile_rows(c, rows))
    peak = std::max(peak, mat_bytes(n, v, f32) +
                              std::max({gemm_workspace_bytes(be, n, v, d, t, t, f32),
                                        gemm_workspace_bytes(be, n, d, v, f32, t, c.grad_dtype),
                                        gemm_workspace_bytes(be, v, d, n, f32, t, f32)}));
  return peak;
}

int64_t lm_loss_host_peak_bytes(const LmLossConfig& c, int64_t rows) {
  check_config(c);
  return mat_bytes(std::min(c.tile_rows, rows), c.vocab, DType::kF32);
}

}  // namespace upipe
