#include "model/lm_loss.h"

#include <algorithm>
#include <array>

#include "backend/gemm.h"
#include "backend/loss.h"
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

// The tiles' loss; with gradients (dh non-null) also dh and dW from each tile.
double tiled_loss(Device& dev, const LmLossConfig& c, const Mat& h, const Mat& w,
                  std::span<const int32_t> labels, float scale, const Mat* dh, const Mat* dw,
                  float dw_beta, std::span<const uint8_t> group, double* group_sum) {
  check_config(c);
  const int64_t rows = h.rows, d = c.hidden, v = c.vocab;
  UPIPE_CHECK(h.cols == d && h.dtype == c.dtype, "lm_loss h is ({}, {}) {}, expected (rows, {}) {}",
              h.rows, h.cols, dtype_name(h.dtype), d, dtype_name(c.dtype));
  UPIPE_CHECK(w.rows == v && w.cols == d && w.dtype == c.dtype,
              "lm_loss W is ({}, {}) {}, expected ({}, {}) {}", w.rows, w.cols, dtype_name(w.dtype),
              v, d, dtype_name(c.dtype));
  if (dh) {
    UPIPE_CHECK(dh->rows == rows && dh->cols == d && dh->dtype == c.grad_dtype,
                "lm_loss dh is ({}, {}) {}, expected ({}, {}) {}", dh->rows, dh->cols,
                dtype_name(dh->dtype), rows, d, dtype_name(c.grad_dtype));
    UPIPE_CHECK(dw->rows == v && dw->cols == d && dw->dtype == DType::kF32,
                "lm_loss dW is ({}, {}) {}, expected ({}, {}) f32", dw->rows, dw->cols,
                dtype_name(dw->dtype), v, d);
  }
  UPIPE_CHECK(int64_t(labels.size()) == rows, "lm_loss has {} labels for {} rows", labels.size(),
              rows);
  for (size_t i = 0; i < labels.size(); ++i)
    UPIPE_CHECK(labels[i] >= -1 && labels[i] < v,
                "lm_loss label {} of row {} is outside [0, {}) and not -1 (no prediction)",
                labels[i], i, v);
  UPIPE_CHECK(group.empty() || (int64_t(group.size()) == rows && group_sum != nullptr),
              "lm_loss has {} group flags for {} rows", group.size(), rows);
  if (group_sum != nullptr) *group_sum = 0;
  UPIPE_CHECK(dw_beta == 0.0f || dw_beta == 1.0f, "lm_loss dw_beta must be 0 or 1, got {}",
              dw_beta);
  // The first tile's product overwrites dW when dw_beta is 0 (no separate pass over the (V, D)
  // gradient); with no rows there is no tile, so dW is zeroed here.
  if (dw && dw_beta == 0.0f && rows == 0) zero(dev, *dw);
  double loss = 0;
  for (int64_t r0 = 0; r0 < rows; r0 += c.tile_rows) {
    const int64_t t = std::min(c.tile_rows, rows - r0);
    const Mat ht = h.rows_of(r0, t);                            // (T, D)
    Tensor logits(dev.mem(), Tag::kLogits, DType::kF32, t, v);  // (T, V)
    gemm(dev, ht, false, w, true, logits);                      // h W^T
    // G, one cross-entropy call per run of rows with equal group flags.
    for (int64_t a = 0; a < t;) {
      int64_t b = a + 1;
      while (!group.empty() && b < t && group[size_t(r0 + b)] == group[size_t(r0 + a)]) ++b;
      if (group.empty()) b = t;
      const double part = cross_entropy(dev, logits.mat().rows_of(a, b - a),
                                        labels.subspan(size_t(r0 + a), size_t(b - a)), scale);
      loss += part;
      if (!group.empty() && group[size_t(r0 + a)] != 0) *group_sum += part;
      a = b;
    }
    if (!dh) continue;
    gemm(dev, logits, false, w, false, dh->rows_of(r0, t));                   // dh = G W
    gemm(dev, logits, true, ht, false, *dw, 1.0f, r0 == 0 ? dw_beta : 1.0f);  // dW += G^T h
  }
  return double(scale) * loss;
}

}  // namespace

double lm_loss(Device& dev, const LmLossConfig& c, const Mat& h, const Mat& w,
               std::span<const int32_t> labels, float scale, const Mat& dh, const Mat& dw,
               float dw_beta, std::span<const uint8_t> group, double* group_sum) {
  return tiled_loss(dev, c, h, w, labels, scale, &dh, &dw, dw_beta, group, group_sum);
}

double lm_loss_value(Device& dev, const LmLossConfig& c, const Mat& h, const Mat& w,
                     std::span<const int32_t> labels, float scale, std::span<const uint8_t> group,
                     double* group_sum) {
  return tiled_loss(dev, c, h, w, labels, scale, nullptr, nullptr, 0.0f, group, group_sum);
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

}  // namespace upipe
