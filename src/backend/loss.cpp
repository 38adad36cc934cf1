#include "backend/loss.h"

namespace upipe {

double cross_entropy(Device& dev, const Mat& logits, std::span<const int32_t> labels, float scale) {
  UPIPE_CHECK(logits.dtype == DType::kF32, "cross_entropy needs fp32 logits");
  UPIPE_CHECK(int64_t(labels.size()) == logits.rows, "cross_entropy: {} labels for {} rows",
              labels.size(), logits.rows);
  for (size_t i = 0; i < labels.size(); ++i)
    UPIPE_CHECK(labels[i] >= -1 && labels[i] < logits.cols,
                "cross_entropy label {} of row {} is outside [0, {}) and not -1", labels[i], i,
                logits.cols);
  return dev.backend().cross_entropy(logits, labels, scale);
}

}  // namespace upipe
