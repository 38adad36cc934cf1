// The CPU backend's kernels other than attention and GEMM (internal to backend/cpu): RoPE,
// RMSNorm, SwiGLU and the elementwise data-movement ops. Shapes are checked by the front-ends.
#pragma once

#include "backend/backend.h"

namespace upipe::cpu {

void rope(const Mat& x, int d, const RowPositions& pos, const RopeParams& rp, int sign);
// ws: 3 * group floats.
void rmsnorm_forward(const Mat& x, const Mat& w, int64_t group, float eps, const Mat& y, float* ws);
void rmsnorm_backward(const Mat& x, const Mat& w, int64_t group, float eps, const Mat& dy,
                      const Mat& dx, const Mat& dw, float* ws);
double cross_entropy(const Mat& logits, std::span<const int32_t> labels, float scale);
// ws: 3 * cols floats.
void swiglu_forward(const Mat& a, const Mat& b, const Mat& h, float* ws);
void swiglu_backward(const Mat& a, const Mat& b, const Mat& dh, const Mat& da, const Mat& db,
                     float* ws);
void fill(const Mat& x, float value);
void convert(const Mat& dst, const Mat& src);
void add_into(const Mat& dst, const Mat& src);
void add_transposed(const Mat& dst, const Mat& src, float beta);
double sum_squares(const Mat& x);
void adamw(const Mat& w, const Mat& g, const Mat& m, const Mat& v, const AdamWArgs& a);

}  // namespace upipe::cpu
