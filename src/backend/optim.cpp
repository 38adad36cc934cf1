#include "backend/optim.h"

namespace upipe {

double sum_squares(Device& dev, const Mat& x) {
  UPIPE_CHECK(x.dtype == DType::kF32, "sum_squares needs fp32");
  return dev.backend().sum_squares(x);
}

void adamw(Device& dev, const Mat& w, const Mat& g, const Mat& m, const Mat& v,
           const AdamWArgs& a) {
  for (const Mat* t : {&g, &m, &v})
    UPIPE_CHECK(t->rows == w.rows && t->cols == w.cols && t->dtype == DType::kF32,
                "adamw: a {}x{} operand for {}x{} weights", t->rows, t->cols, w.rows, w.cols);
  UPIPE_CHECK(w.dtype == DType::kF32 && a.step >= 1, "adamw needs fp32 weights and step >= 1");
  dev.backend().adamw(w, g, m, v, a);
}

}  // namespace upipe
