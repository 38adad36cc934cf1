// The CUDA backend's elementwise kernels without a GPU: every function of
// backend/cuda/elementwise_math.h against the naive references of backend/reference/ (and the
// CPU backend), and host emulations of the kernels (the same math in the same reduction order:
// lanes, trees, dw's block partition, sum_squares' fixed grid) against the fp64 references under
// the tolerance rule of test_backend_ops.cpp (within 2x a same-precision naive baseline plus 4
// fp32 ulp). This file is compiled with -ffp-contract=off and the kernels with -fmad=false, so
// an emulation built from + - * / sqrt and fma is the kernel's arithmetic bit for bit.
//
// CudaKernels.*: each launch function of backend/cuda/elementwise_cuda.h on device buffers, against
// the CPU backend (data movement: bytes equal), the fp64 references (the rule) and the emulations
// (bitwise where the math is exact IEEE arithmetic); skipped without a CUDA build or device.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "backend/cuda/dev_view.h"
#include "backend/cuda/elementwise_math.h"
#include "backend/cuda/param_block.h"
#include "backend/cuda/row_groups.h"
#include "backend/reference/elementwise_ref.h"
#include "common/test_util.h"
#include "core/dtype.h"
#include "core/rng.h"

#if defined(UPIPE_HAVE_CUDA)
#include <cuda_runtime_api.h>

#include "backend/cuda/cuda_memory.h"
#include "backend/cuda/elementwise_cuda.h"
#include "unit/scoped_env.h"
#endif

namespace upipe {
namespace {

using cuda::DT;
using cuda::DView;
using test::cast;
using test::cview;
using test::expect_close;
using test::kEps32;
using test::view;

constexpr float kInf = std::numeric_limits<float>::infinity();

// ---- host matrices that both the emulations (as DView) and the CPU backend (as Mat) read ----

// A (rows, cols) view at column pad of a (rows, cols + pad) buffer; the padding holds NaN so a
// write outside the view shows in a byte comparison and a read of it in the values.
struct HostMat {
  DT dt;
  int64_t rows, cols, ld;
  std::vector<unsigned char> bytes;

  HostMat(DT t, int64_t r, int64_t c, int64_t pad = 0)
      : dt(t), rows(r), cols(c), ld(c + pad), bytes(size_t(r * (c + pad) * esize())) {
    for (int64_t i = 0; i < rows; ++i)
      for (int64_t j = 0; j < pad; ++j) raw_set(i * ld + j, NAN);
  }
  int64_t esize() const { return dt == DT::kF32 ? 4 : 2; }
  unsigned char* origin() { return bytes.data() + (ld - cols) * esize(); }
  DView view() { return {origin(), dt, rows, cols, ld}; }
  Mat mat() { return {origin(), dt == DT::kF32 ? DType::kF32 : DType::kBF16, rows, cols, ld}; }
  void raw_set(int64_t i, float x) {
    if (dt == DT::kF32) {
      std::memcpy(bytes.data() + 4 * i, &x, 4);
    } else {
      const uint16_t h = cuda::f32_to_bf16(x);
      std::memcpy(bytes.data() + 2 * i, &h, 2);
    }
  }
  float get(int64_t r, int64_t c) const {
    const int64_t i = r * ld + (ld - cols) + c;
    if (dt == DT::kF32) {
      float x;
      std::memcpy(&x, bytes.data() + 4 * i, 4);
      return x;
    }
    uint16_t h;
    std::memcpy(&h, bytes.data() + 2 * i, 2);
    return cuda::bf16_to_f32(h);
  }
  void set(int64_t r, int64_t c, float x) { raw_set(r * ld + (ld - cols) + c, x); }
  // mean + stddev N(0, 1), stored in the dtype; returns what is stored, row-major, in fp64.
  std::vector<double> fill(uint64_t seed, double stddev = 1.0, double mean = 0.0) {
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t c = 0; c < cols; ++c)
        set(r, c, float(mean + stddev * normal_at(seed, uint64_t(r * cols + c))));
    return values();
  }
  std::vector<double> values() const {
    std::vector<double> v;
    v.reserve(size_t(rows * cols));
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t c = 0; c < cols; ++c) v.push_back(get(r, c));
    return v;
  }
};

// Values as an output of dtype t stores them.
template <class T>
std::vector<double> stored(const std::vector<T>& v, DT t) {
  return test::rounded(cast<double>(v), t == DT::kF32 ? DType::kF32 : DType::kBF16);
}

// ---- the kernels' element access and reduction order, on the host ----

float hload(const DView& v, int64_t r, int64_t c) {
  const int64_t i = r * v.ld + c;
  return v.dtype == DT::kF32 ? static_cast<const float*>(v.data)[i]
                             : cuda::bf16_to_f32(static_cast<const uint16_t*>(v.data)[i]);
}
void hstore(const DView& v, int64_t r, int64_t c, float x) {
  const int64_t i = r * v.ld + c;
  if (v.dtype == DT::kF32)
    static_cast<float*>(v.data)[i] = x;
  else
    static_cast<uint16_t*>(v.data)[i] = cuda::f32_to_bf16(x);
}
float* hf32(const DView& v, int64_t r, int64_t c) {
  return static_cast<float*>(v.data) + r * v.ld + c;
}

// elementwise_math.h's block sum of n terms over `lanes` lanes: lane t folds terms t, t + lanes,
// ... with step(acc, i); then the tree, stride lanes/2 first.
template <class T, class Step>
T lane_sum(int64_t n, int lanes, Step step) {
  std::vector<T> lane(size_t(lanes), T(0));
  for (int64_t i = 0; i < n; ++i) lane[size_t(i % lanes)] = step(lane[size_t(i % lanes)], i);
  for (int s = lanes / 2; s > 0; s >>= 1)
    for (int t = 0; t < s; ++t) lane[size_t(t)] += lane[size_t(t + s)];
  return lane[0];
}

void emu_rmsnorm_forward(const DView& x, const DView& w, int64_t group, float eps, const DView& y) {
  const int64_t gpr = x.cols / group;
  for (int64_t u = 0; u < x.rows * gpr; ++u) {
    const int64_t r = u / gpr, c0 = u % gpr * group;
    const float ss = lane_sum<float>(group, cuda::kRowThreads, [&](float a, int64_t c) {
      return cuda::rms_ss_step(a, hload(x, r, c0 + c));
    });
    const float inv = cuda::rms_inv(ss, group, eps);
    for (int64_t c = 0; c < group; ++c)
      hstore(y, r, c0 + c, cuda::rms_y(hload(x, r, c0 + c), inv, hload(w, 0, c)));
  }
}

// ws: the workspace, exactly rms_workspace_bytes(group) (at() checks every index against it).
void emu_rmsnorm_backward(const DView& x, const DView& w, int64_t group, float eps, const DView& dy,
                          const DView& dx, const DView& dw, std::vector<float>& ws) {
  ASSERT_EQ(int64_t(ws.size()) * 4, cuda::rms_workspace_bytes(group));
  const int64_t gpr = x.cols / group;
  for (int b = 0; b < cuda::kRmsDwBlocks; ++b)
    for (int64_t c = 0; c < group; ++c) ws.at(size_t(b * group + c)) = 0.0f;
  // Units in increasing order: each block's partials see its own units in increasing order.
  for (int64_t u = 0; u < x.rows * gpr; ++u) {
    const int64_t r = u / gpr, c0 = u % gpr * group;
    const int b = cuda::rms_dw_block(u);
    const float ss = lane_sum<float>(group, cuda::kRowThreads, [&](float a, int64_t c) {
      return cuda::rms_ss_step(a, hload(x, r, c0 + c));
    });
    const float dot = lane_sum<float>(group, cuda::kRowThreads, [&](float a, int64_t c) {
      return cuda::rms_dot_step(a, hload(x, r, c0 + c), hload(w, 0, c), hload(dy, r, c0 + c));
    });
    const float inv = cuda::rms_inv(ss, group, eps), k = cuda::rms_k(dot, inv, group);
    for (int64_t c = 0; c < group; ++c) {
      const float xv = hload(x, r, c0 + c), g = hload(dy, r, c0 + c);
      float& p = ws.at(size_t(b * group + c));
      p = cuda::rms_dw_step(p, xv, g, inv);
      hstore(dx, r, c0 + c, cuda::rms_dx(xv, hload(w, 0, c), g, inv, k));
    }
  }
  for (int64_t c = 0; c < group; ++c) {
    float s = ws[size_t(c)];
    for (int b = 1; b < cuda::kRmsDwBlocks; ++b) s += ws[size_t(b * group + c)];
    *hf32(dw, 0, c) = *hf32(dw, 0, c) + s;
  }
}

void emu_swiglu_forward(const DView& a, const DView& b, const DView& h) {
  for (int64_t r = 0; r < a.rows; ++r)
    for (int64_t c = 0; c < a.cols; ++c)
      hstore(h, r, c, cuda::swiglu(hload(a, r, c), hload(b, r, c)));
}
void emu_swiglu_backward(const DView& a, const DView& b, const DView& dh, const DView& da,
                         const DView& db) {
  for (int64_t r = 0; r < a.rows; ++r)
    for (int64_t c = 0; c < a.cols; ++c) {
      const cuda::SwigluGrad g = cuda::swiglu_grad(hload(a, r, c), hload(b, r, c), hload(dh, r, c));
      hstore(da, r, c, g.da);
      hstore(db, r, c, g.db);
    }
}

double emu_cross_entropy(const DView& x, const std::vector<int32_t>& labels, float scale) {
  double loss = 0;
  for (int64_t r = 0; r < x.rows; ++r) {
    float* row = hf32(x, r, 0);
    const int32_t label = labels[size_t(r)];
    if (label < 0) {
      std::fill_n(row, x.cols, 0.0f);
      loss += 0.0;
      continue;
    }
    const float target = row[label];
    float m = cuda::neg_inf();
    for (int64_t c = 0; c < x.cols; ++c) m = std::fmax(m, row[c]);
    const double sum = lane_sum<double>(x.cols, cuda::kRowThreads, [&](double a, int64_t c) {
      return a + double(cuda::ce_exp(row[c], m));
    });
    const float p = cuda::ce_p(scale, sum);
    for (int64_t c = 0; c < x.cols; ++c) row[c] = cuda::ce_grad(row[c], m, p, c == label, scale);
    loss += cuda::ce_row_loss(m, sum, target);
  }
  return loss;
}

double emu_sum_squares(const DView& x) {
  std::vector<double> lanes(size_t(cuda::kSumLanes), 0.0);
  for (int64_t i = 0; i < x.rows * x.cols; ++i) {
    double& a = lanes[size_t(i % cuda::kSumLanes)];
    a = cuda::sumsq_step(a, hload(x, i / x.cols, i % x.cols));
  }
  std::vector<double> partials(static_cast<size_t>(cuda::kSumBlocks));
  for (int b = 0; b < cuda::kSumBlocks; ++b) {
    double* l = &lanes[size_t(b) * cuda::kRowThreads];
    for (int s = cuda::kRowThreads / 2; s > 0; s >>= 1)
      for (int t = 0; t < s; ++t) l[t] += l[t + s];
    partials[size_t(b)] = l[0];
  }
  return cuda::sum_partials(partials.data());
}

void emu_adamw(const DView& w, const DView& g, const DView& m, const DView& v,
               const cuda::AdamWConsts& k) {
  for (int64_t r = 0; r < w.rows; ++r)
    for (int64_t c = 0; c < w.cols; ++c)
      cuda::adamw_update(k, *hf32(w, r, c), *hf32(g, r, c), *hf32(m, r, c), *hf32(v, r, c));
}

void emu_finalize(const DView& acc, const DView& m, const DView& l, int d, const DView& o,
                  const DView& lse) {
  for (int64_t i = 0; i < acc.rows; ++i)
    for (int64_t c = 0; c < acc.cols; ++c) {
      const int64_t h = c / d;
      hstore(o, i, c, cuda::finalize_o(*hf32(acc, i, c), *hf32(l, h, i)));
      if (c == h * d) *hf32(lse, h, i) = cuda::finalize_lse(*hf32(m, h, i), *hf32(l, h, i));
    }
}

void emu_lse_merge(const DView& o, const DView& lse, const DView& o2, const DView& lse2, int d) {
  for (int64_t i = 0; i < o.rows; ++i)
    for (int64_t h = 0; h < o.cols / d; ++h) {
      const cuda::LseMerge mw = cuda::lse_merge_weights(*hf32(lse, h, i), *hf32(lse2, h, i));
      for (int64_t c = h * d; c < (h + 1) * d; ++c)
        if (mw.kind != cuda::MergeKind::kKeep)
          hstore(o, i, c, cuda::lse_merge_value(mw, hload(o, i, c), hload(o2, i, c)));
      *hf32(lse, h, i) = mw.lse;
    }
}

// merge_partial_kernel: every acc column with the row's old m, then m and l.
void emu_merge_partial(const DView& acc, const DView& m, const DView& l, const DView& o2,
                       const DView& lse2, int d) {
  for (int64_t i = 0; i < acc.rows; ++i)
    for (int64_t h = 0; h < acc.cols / d; ++h) {
      const cuda::PartialMerge w = cuda::partial_merge_weights(*hf32(m, h, i), *hf32(lse2, h, i));
      for (int64_t c = h * d; c < (h + 1) * d; ++c)
        *hf32(acc, i, c) = cuda::partial_merge_acc(w, *hf32(acc, i, c), hload(o2, i, c));
      *hf32(l, h, i) = cuda::partial_merge_l(w, *hf32(l, h, i));
      *hf32(m, h, i) = w.m;
    }
}

void emu_delta(const DView& o, const DView& dout, int d, const DView& delta) {
  for (int64_t i = 0; i < o.rows; ++i)
    for (int64_t h = 0; h < o.cols / d; ++h)
      *hf32(delta, h, i) = lane_sum<float>(d, cuda::kWarp, [&](float a, int64_t e) {
        return cuda::delta_step(a, hload(o, i, h * d + e), hload(dout, i, h * d + e));
      });
}

// Rows [row, row + rows) at positions [pos, pos + rows) (elementwise_cuda.h's RopeRun).
struct RopeRows {
  int64_t row, rows, pos;
};
void emu_rope(const DView& x, int d, const std::vector<RopeRows>& runs,
              const std::vector<double>& inv_freq, int sign) {
  const int half = d / 2;
  for (const RopeRows& run : runs)
    for (int64_t t = 0; t < run.rows; ++t)
      for (int i = 0; i < half; ++i) {
        const cuda::RopeCs cs = cuda::rope_cos_sin(run.pos + t, inv_freq[size_t(i)], sign);
        for (int64_t h = 0; h < x.cols / d; ++h) {
          float a = hload(x, run.row + t, h * d + i), b = hload(x, run.row + t, h * d + i + half);
          cuda::rope_rotate(a, b, cs);
          hstore(x, run.row + t, h * d + i, a);
          hstore(x, run.row + t, h * d + i + half, b);
        }
      }
}
std::vector<RopeRows> runs_of(const RowPositions& p) {
  std::vector<RopeRows> v;
  int64_t row = 0;
  for (const RowPositions::Run& r : p.runs) {
    v.push_back({row, r.rows, r.pos});
    row += r.rows;
  }
  return v;
}

// ---- references not in reference/ (the formulas of test_backend_ops.cpp) ----

// Naive cross-entropy in math type T: grad = scale (softmax - onehot), 0 for label -1; returns
// the sum of -log softmax[label].
template <class T>
double cross_entropy_ref(std::vector<T>& x, int64_t rows, int64_t v,
                         const std::vector<int32_t>& labels, double scale) {
  double loss = 0;
  for (int64_t r = 0; r < rows; ++r) {
    T* row = x.data() + r * v;
    if (labels[size_t(r)] < 0) {
      std::fill_n(row, v, T(0));
      continue;
    }
    T m = row[0];
    for (int64_t j = 1; j < v; ++j) m = std::max(m, row[j]);
    T sum = 0;
    for (int64_t j = 0; j < v; ++j) sum += std::exp(row[j] - m);
    loss += double(m + std::log(sum) - row[labels[size_t(r)]]);
    for (int64_t j = 0; j < v; ++j) row[j] = T(scale) * std::exp(row[j] - m) / sum;
    row[labels[size_t(r)]] -= T(scale);
  }
  return loss;
}

// (o1, l1) <- merge((o1, l1), (o2, l2)) of one row of one head in math type T.
template <class T>
void merge_row(T* o1, T& l1, const T* o2, T l2, int d) {
  const T ninf = -std::numeric_limits<T>::infinity();
  if (l2 == ninf) return;
  if (l1 == ninf) {
    std::copy(o2, o2 + d, o1);
    l1 = l2;
    return;
  }
  const T mx = std::max(l1, l2), w1 = std::exp(l1 - mx), w2 = std::exp(l2 - mx);
  for (int e = 0; e < d; ++e) o1[e] = (o1[e] * w1 + o2[e] * w2) / (w1 + w2);
  l1 = mx + std::log(w1 + w2);
}

// PyTorch's torch.optim.AdamW (single-tensor path) on one element, in fp64, the gradient
// pre-multiplied by grad_scale: param.mul_(1 - lr wd); exp_avg.lerp_(grad, 1 - beta1);
// exp_avg_sq.mul_(beta2).addcmul_(grad, grad, 1 - beta2); denom = sqrt(exp_avg_sq) /
// sqrt(1 - beta2^t) + eps; param.addcdiv_(exp_avg, denom, -lr / (1 - beta1^t)).
void adamw_pytorch(double& w, double g, double& m, double& v, const AdamWArgs& a) {
  const double grad = g * a.grad_scale;
  w *= 1 - a.lr * a.weight_decay;
  m += (grad - m) * (1 - a.beta1);
  v = v * a.beta2 + (1 - a.beta2) * grad * grad;
  const double bc1 = 1 - std::pow(a.beta1, double(a.step));
  const double bc2 = 1 - std::pow(a.beta2, double(a.step));
  const double denom = std::sqrt(v) / std::sqrt(bc2) + a.eps;
  w += -(a.lr / bc1) * (m / denom);
}
// The same-precision baseline: the formula of backend.h in fp32.
void adamw_f32(float& w, float g, float& m, float& v, const AdamWArgs& a) {
  const float gr = float(a.grad_scale) * g;
  m = float(a.beta1) * m + (1 - float(a.beta1)) * gr;
  v = float(a.beta2) * v + (1 - float(a.beta2)) * gr * gr;
  const float bc1 = float(1 - std::pow(a.beta1, double(a.step)));
  const float bc2 = float(1 - std::pow(a.beta2, double(a.step)));
  w = w * (1 - float(a.lr) * float(a.weight_decay)) -
      float(a.lr) / bc1 * m / (std::sqrt(v) / std::sqrt(bc2) + float(a.eps));
}

// ---- bf16 ----

TEST(CudaMath, Bf16ToF32IsCoreDtypeForEveryValue) {
  for (uint32_t h = 0; h < 65536; ++h) {
    const float a = cuda::bf16_to_f32(uint16_t(h)), b = upipe::bf16_to_f32(uint16_t(h));
    ASSERT_EQ(cuda::f32_bits(a), cuda::f32_bits(b)) << "bf16 0x" << std::hex << h;
  }
}

TEST(CudaMath, F32ToBf16IsCoreDtypeBitForBit) {
  // Every bf16 pattern with low halves at and around the rounding tie, NaN payloads (an
  // exponent of ones with any mantissa), subnormals, then random words.
  const uint32_t lows[] = {0x0000, 0x0001, 0x3fff, 0x7fff, 0x8000, 0x8001, 0xbfff, 0xffff};
  auto same = [](uint32_t u) {
    const float f = cuda::bits_f32(u);
    return cuda::f32_to_bf16(f) == upipe::f32_to_bf16(f);
  };
  for (uint32_t hi = 0; hi < 65536; ++hi)
    for (uint32_t lo : lows) ASSERT_TRUE(same(hi << 16 | lo)) << std::hex << (hi << 16 | lo);
  for (uint64_t i = 0; i < 1000000; ++i) {
    const uint32_t u = uint32_t(uniform_at(77, i) * 4294967296.0);
    ASSERT_TRUE(same(u)) << std::hex << u;
  }
  // The rule itself: ties to even, overflow to infinity, NaN stays a quiet NaN.
  auto r = [](uint32_t u) { return cuda::f32_to_bf16(cuda::bits_f32(u)); };
  EXPECT_EQ(r(0x3f808000u), 0x3f80);  // tie, even below
  EXPECT_EQ(r(0x3f818000u), 0x3f82);  // tie, odd below: up
  EXPECT_EQ(r(0x3f808001u), 0x3f81);
  EXPECT_EQ(r(0x00008000u), 0x0000);  // subnormal tie
  EXPECT_EQ(r(0x00018000u), 0x0002);
  EXPECT_EQ(r(0x7f7fffffu), 0x7f80);  // the largest float rounds to infinity
  EXPECT_EQ(r(0xff800000u), 0xff80);
  EXPECT_EQ(r(0x7f800001u), 0x7fc0);  // a NaN that truncation would make infinity
  EXPECT_EQ(r(0xffc00000u), 0xffc0);
  EXPECT_TRUE(std::isnan(cuda::bf16_to_f32(r(0x7fffffffu))));
  EXPECT_EQ(cuda::f32_bits(cuda::neg_inf()), cuda::f32_bits(-kInf));
}

// ---- SwiGLU ----

TEST(CudaMath, SwigluMatchesReference) {
  for (DT t : {DT::kF32, DT::kBF16}) {
    const int64_t rows = 9, cols = 301;
    HostMat a(t, rows, cols, 3), b(t, rows, cols), dh(t, rows, cols, 5);
    HostMat h(t, rows, cols, 2), da(t, rows, cols), db(t, rows, cols, 1);
    a.fill(1, 3.0);
    // Saturated and extreme inputs: exp(-a) overflows to inf for a < -88.7.
    const float edge[] = {0.0f, -0.0f, 20.0f, -20.0f, 88.0f, -88.0f, -100.0f, -1000.0f, 1000.0f};
    for (int i = 0; i < 9; ++i) a.set(0, i, edge[i]);
    const auto av = a.values(), bv = b.fill(2), dhv = dh.fill(3);
    emu_swiglu_forward(a.view(), b.view(), h.view());
    emu_swiglu_backward(a.view(), b.view(), dh.view(), da.view(), db.view());
    std::vector<double> h64(av.size()), da64(av.size()), db64(av.size());
    ref::swiglu_forward<double>(cview(av, rows, cols), cview(bv, rows, cols),
                                view(h64, rows, cols));
    ref::swiglu_backward<double>(cview(av, rows, cols), cview(bv, rows, cols),
                                 cview(dhv, rows, cols), view(da64, rows, cols),
                                 view(db64, rows, cols));
    const auto a32 = cast<float>(av), b32 = cast<float>(bv), dh32 = cast<float>(dhv);
    std::vector<float> h32(av.size()), da32(av.size()), db32(av.size());
    ref::swiglu_forward<float>(cview(a32, rows, cols), cview(b32, rows, cols),
                               view(h32, rows, cols));
    ref::swiglu_backward<float>(cview(a32, rows, cols), cview(b32, rows, cols),
                                cview(dh32, rows, cols), view(da32, rows, cols),
                                view(db32, rows, cols));
    const std::string dt = t == DT::kF32 ? " fp32" : " bf16";
    expect_close(h.values(), h64, stored(h32, t), "swiglu h" + dt);
    expect_close(da.values(), da64, stored(da32, t), "swiglu da" + dt);
    expect_close(db.values(), db64, stored(db32, t), "swiglu db" + dt);
  }
}

// ---- RMSNorm ----

struct RmsCase {
  int64_t rows, cols, group;
  DT t;
  bool in_place;  // y over x, dx over dy
};
void rmsnorm_case(const RmsCase& c) {
  const std::string name = "rmsnorm " + std::to_string(c.rows) + "x" + std::to_string(c.cols) +
                           " group " + std::to_string(c.group) +
                           (c.t == DT::kF32 ? " fp32" : " bf16") + (c.in_place ? " in place" : "");
  const float eps = 1e-5f;
  HostMat x(c.t, c.rows, c.cols, 3), w(c.t, 1, c.group), dy(c.t, c.rows, c.cols, 1);
  HostMat y(c.t, c.rows, c.cols, 2), dx(c.t, c.rows, c.cols), dw(DT::kF32, 1, c.group);
  const auto xv = x.fill(10), wv = w.fill(11, 0.25, 1.0), dyv = dy.fill(12), dw0 = dw.fill(13);
  HostMat xin = x;  // the forward may run in place
  const DView yv = c.in_place ? xin.view() : y.view();
  emu_rmsnorm_forward(xin.view(), w.view(), c.group, eps, yv);
  const auto yout = c.in_place ? xin.values() : y.values();
  std::vector<float> ws(size_t(cuda::rms_workspace_bytes(c.group) / 4), NAN);
  const DView dxv = c.in_place ? dy.view() : dx.view();
  emu_rmsnorm_backward(x.view(), w.view(), c.group, eps, dy.view(), dxv, dw.view(), ws);
  const auto dxout = c.in_place ? dy.values() : dx.values();

  const int64_t n = c.rows * c.cols / c.group;
  std::vector<double> y64(xv.size()), dx64(xv.size()), dw64 = dw0;
  ref::rmsnorm_forward<double>(cview(xv, n, c.group), wv.data(), eps, view(y64, n, c.group));
  ref::rmsnorm_backward<double>(cview(xv, n, c.group), wv.data(), eps, cview(dyv, n, c.group),
                                view(dx64, n, c.group), dw64.data());
  const auto x32 = cast<float>(xv), w32 = cast<float>(wv), dy32 = cast<float>(dyv);
  std::vector<float> y32(xv.size()), dx32(xv.size()), dw32 = cast<float>(dw0);
  ref::rmsnorm_forward<float>(cview(x32, n, c.group), w32.data(), eps, view(y32, n, c.group));
  ref::rmsnorm_backward<float>(cview(x32, n, c.group), w32.data(), eps, cview(dy32, n, c.group),
                               view(dx32, n, c.group), dw32.data());
  expect_close(yout, y64, stored(y32, c.t), name + " y");
  expect_close(dxout, dx64, stored(dx32, c.t), name + " dx");
  expect_close(dw.values(), dw64, cast<double>(dw32), name + " dw");
}

TEST(CudaMath, RmsNormEmulatedKernelsMatchReference) {
  rmsnorm_case({37, 300, 300, DT::kF32, false});
  rmsnorm_case({37, 1024, 32, DT::kF32, false});   // per head: 1184 units, more than the blocks
  rmsnorm_case({3, 4096, 4096, DT::kF32, false});  // 16 columns per lane, most blocks idle
  rmsnorm_case({20, 384, 128, DT::kBF16, true});
  rmsnorm_case({2100, 64, 64, DT::kBF16, false});  // several units per block
}

TEST(CudaMath, RmsNormWorkspaceIsTheDwPartitionExactly) {
  for (int64_t g : {1, 32, 128, 4096}) EXPECT_EQ(cuda::rms_workspace_bytes(g), 4 * g * 1024);
  // Unit u's partial row: u mod the block count, so rows are covered round-robin.
  for (int64_t u : {0, 1, 1023, 1024, 1025, 100000})
    EXPECT_EQ(cuda::rms_dw_block(u), int(u % cuda::kRmsDwBlocks));
  // The emulation writes every partial of its workspace (at() bounds every index by the query),
  // and dw's bits do not depend on anything but the data: a second run gives the same.
  HostMat x(DT::kF32, 300, 64), w(DT::kF32, 1, 64), dy(DT::kF32, 300, 64), dx(DT::kF32, 300, 64);
  HostMat dw1(DT::kF32, 1, 64), dw2(DT::kF32, 1, 64);
  x.fill(1);
  w.fill(2);
  dy.fill(3);
  std::vector<float> ws(size_t(cuda::rms_workspace_bytes(64) / 4), NAN);
  emu_rmsnorm_backward(x.view(), w.view(), 64, 1e-5f, dy.view(), dx.view(), dw1.view(), ws);
  for (float p : ws) ASSERT_FALSE(std::isnan(p));
  emu_rmsnorm_backward(x.view(), w.view(), 64, 1e-5f, dy.view(), dx.view(), dw2.view(), ws);
  EXPECT_EQ(dw1.bytes, dw2.bytes);
}

// ---- AdamW ----

TEST(CudaMath, AdamwMatchesPyTorchFormulaInDouble) {
  const int64_t n = 1037;
  const AdamWArgs cases[] = {
      {1e-2, 0.9, 0.95, 1e-8, 0.1, 0.5, 1},
      {1e-2, 0.9, 0.95, 1e-8, 0.1, 0.5, 7},
      {3e-4, 0.9, 0.999, 1e-8, 0.0, 1.0, 1000},
      {1e-3, 0.8, 0.99, 1e-6, 0.01, 2.0, 3},
  };
  uint64_t seed = 30;
  for (const AdamWArgs& a : cases) {
    const std::string name = "adamw step " + std::to_string(a.step);
    HostMat w(DT::kF32, 1, n), g(DT::kF32, 1, n), m(DT::kF32, 1, n), v(DT::kF32, 1, n);
    auto w64 = w.fill(seed++), g64 = g.fill(seed++), m64 = m.fill(seed++, 0.1),
         v64 = v.fill(seed++, 0.01, 0.05);  // second moments are positive
    // A zero gradient on zero moments: only the decay moves w.
    g.set(0, 0, 0.0f);
    m.set(0, 0, 0.0f);
    v.set(0, 0, 0.0f);
    g64[0] = m64[0] = v64[0] = 0;
    auto w32 = cast<float>(w64), m32 = cast<float>(m64), v32 = cast<float>(v64);
    for (int64_t i = 0; i < n; ++i) {
      adamw_pytorch(w64[size_t(i)], g64[size_t(i)], m64[size_t(i)], v64[size_t(i)], a);
      adamw_f32(w32[size_t(i)], float(g64[size_t(i)]), m32[size_t(i)], v32[size_t(i)], a);
    }
    emu_adamw(
        w.view(), g.view(), m.view(), v.view(),
        cuda::adamw_consts(a.lr, a.beta1, a.beta2, a.eps, a.weight_decay, a.grad_scale, a.step));
    expect_close(w.values(), w64, cast<double>(w32), name + " w");
    expect_close(m.values(), m64, cast<double>(m32), name + " m");
    expect_close(v.values(), v64, cast<double>(v32), name + " v");
    EXPECT_EQ(m.get(0, 0), 0.0f);
    EXPECT_EQ(v.get(0, 0), 0.0f);
  }
}

// ---- online softmax: finalize, merge ----

TEST(CudaMath, FinalizeMapsEmptyRowsToZeroAndNegInf) {
  const int hq = 3, d = 40;
  const int64_t sq = 25;
  HostMat acc(DT::kF32, sq, hq * d, 2), m(DT::kF32, hq, sq), l(DT::kF32, hq, sq, 1);
  HostMat lse(DT::kF32, hq, sq);
  const auto accv = acc.fill(40);
  m.fill(41, 3.0);
  l.fill(42, 0.5, 2.0);
  for (int h = 0; h < hq; ++h)
    for (int64_t i = h; i < sq; i += 4) {
      l.set(h, i, 0.0f);  // the row saw no key: acc holds leftovers that must not leak
      m.set(h, i, -kInf);
    }
  const auto lv = l.values(), mv2 = m.values();
  for (DT t : {DT::kF32, DT::kBF16}) {
    HostMat o(t, sq, hq * d, 3);
    emu_finalize(acc.view(), m.view(), l.view(), d, o.view(), lse.view());
    std::vector<double> o64(accv.size()), lse64(size_t(hq * sq));
    std::vector<float> o32(accv.size()), lse32(lse64.size());
    for (int h = 0; h < hq; ++h)
      for (int64_t i = 0; i < sq; ++i) {
        const size_t li = size_t(h * sq + i);
        const bool empty = lv[li] == 0;
        lse64[li] = empty ? -INFINITY : mv2[li] + std::log(lv[li]);
        lse32[li] = empty ? -kInf : float(mv2[li]) + std::log(float(lv[li]));
        for (int e = 0; e < d; ++e) {
          const size_t at = size_t(i * hq * d + h * d + e);
          o64[at] = empty ? 0.0 : accv[at] / lv[li];
          o32[at] = empty ? 0.0f : float(accv[at]) / float(lv[li]);
          if (empty) {
            ASSERT_EQ(o.get(i, h * d + e), 0.0f) << h << "," << i;
          }
        }
        if (empty) {
          ASSERT_EQ(lse.get(h, i), -kInf) << h << "," << i;
        }
      }
    expect_close(o.values(), o64, stored(o32, t), "finalize o");
    expect_close(lse.values(), lse64, cast<double>(lse32), "finalize lse");
  }
}

TEST(CudaMath, LseMergeMatchesReferenceWithEmptyPartials) {
  const int hq = 3, d = 40;
  const int64_t sq = 60;
  for (DT t : {DT::kF32, DT::kBF16}) {
    HostMat o1(t, sq, hq * d, 4), o2(t, sq, hq * d, 1);
    HostMat l1(DT::kF32, hq, sq, 2), l2(DT::kF32, hq, sq);
    const auto o1v = o1.fill(50), o2v = o2.fill(51);
    l1.fill(52, 3.0);
    l2.fill(53, 3.0);
    // -inf on either side or both; far apart partials (one weight underflows to 0).
    for (int h = 0; h < hq; ++h)
      for (int64_t i = 0; i < sq; ++i) {
        if (i % 7 == 0) l1.set(h, i, -kInf);
        if (i % 5 == 0) l2.set(h, i, -kInf);
        if (i % 11 == 1) l2.set(h, i, l1.get(h, i) + 120.0f);
        if (i % 13 == 2) l2.set(h, i, l1.get(h, i) - 120.0f);
      }
    const auto l1v = l1.values(), l2v = l2.values();
    emu_lse_merge(o1.view(), l1.view(), o2.view(), l2.view(), d);
    auto o64 = o1v, lse64 = l1v;
    auto o32 = cast<float>(o1v), lse32 = cast<float>(l1v);
    const auto o2_32 = cast<float>(o2v);
    for (int h = 0; h < hq; ++h)
      for (int64_t i = 0; i < sq; ++i) {
        const size_t at = size_t(i * hq * d + h * d), li = size_t(h * sq + i);
        merge_row<double>(&o64[at], lse64[li], &o2v[at], l2v[li], d);
        merge_row<float>(&o32[at], lse32[li], &o2_32[at], float(l2v[li]), d);
        // An empty partial: the other one, exactly.
        if (l2v[li] == -INFINITY || l1v[li] == -INFINITY) {
          const bool keep = l2v[li] == -INFINITY;
          ASSERT_EQ(l1.get(h, i), float(keep ? l1v[li] : l2v[li])) << h << "," << i;
          for (int e = 0; e < d; ++e)
            ASSERT_EQ(o1.get(i, h * d + e),
                      float(keep ? o1v[at + size_t(e)] : o2v[at + size_t(e)]));
        }
      }
    expect_close(o1.values(), o64, stored(o32, t), "lse_merge o");
    expect_close(l1.values(), lse64, cast<double>(lse32), "lse_merge lse");
  }
}

// cuDNN's accumulate mode (attention_cudnn.cpp): an online state that takes the normalised
// partials (o_b, lse_b) of key blocks, o_b stored in the dtype, then is finalised, is the softmax
// over all keys within the same-precision rule; a block a row sees nothing of (lse_b = -inf)
// leaves its state bit for bit, and the first block a row sees replaces the empty state.
TEST(CudaMath, MergedNormalisedPartialsAreTheWholeSoftmax) {
  const int hq = 2, d = 16, blocks = 3;
  const int64_t sq = 30, bk = 7;  // keys per block
  for (DT t : {DT::kF32, DT::kBF16}) {
    HostMat acc(DT::kF32, sq, hq * d, 1), m(DT::kF32, hq, sq), l(DT::kF32, hq, sq, 2);
    HostMat o(t, sq, hq * d), lse(DT::kF32, hq, sq);
    for (int64_t i = 0; i < sq; ++i)
      for (int h = 0; h < hq; ++h) {
        m.set(h, i, -kInf);
        l.set(h, i, 0.0f);
        for (int e = 0; e < d; ++e) acc.set(i, h * d + e, 0.0f);
      }
    // Scores s and values v of every (row, head, key); row i sees block b unless (i + b) % 4 == 0
    // (so some rows see only some blocks, and row 3 of block 1 first sees a later block).
    auto score = [](int64_t i, int h, int64_t j) {
      return 4.0 * normal_at(900, uint64_t((i * 2 + h) * 64 + j));
    };
    auto value = [](int h, int64_t j, int e) {
      return normal_at(901, uint64_t((h * 64 + j) * 16 + e));
    };
    auto sees = [](int64_t i, int b) { return (i + b) % 4 != 0; };
    std::vector<double> o64(size_t(sq * hq * d), 0.0), lse64(size_t(hq * sq));
    for (int b = 0; b < blocks; ++b) {
      HostMat ob(t, sq, hq * d, 3), lb(DT::kF32, hq, sq);
      for (int64_t i = 0; i < sq; ++i)
        for (int h = 0; h < hq; ++h) {
          if (!sees(i, b)) {
            lb.set(h, i, -kInf);
            for (int e = 0; e < d; ++e) ob.set(i, h * d + e, 0.0f);
            continue;
          }
          double mx = -INFINITY, sum = 0;
          for (int64_t j = b * bk; j < (b + 1) * bk; ++j) mx = std::max(mx, score(i, h, j));
          for (int64_t j = b * bk; j < (b + 1) * bk; ++j) sum += std::exp(score(i, h, j) - mx);
          lb.set(h, i, float(mx + std::log(sum)));
          for (int e = 0; e < d; ++e) {
            double x = 0;
            for (int64_t j = b * bk; j < (b + 1) * bk; ++j)
              x += std::exp(score(i, h, j) - mx) / sum * value(h, j, e);
            ob.set(i, h * d + e, float(x));
          }
        }
      const std::vector<double> acc_before = acc.values(), m_before = m.values(),
                                l_before = l.values();
      emu_merge_partial(acc.view(), m.view(), l.view(), ob.view(), lb.view(), d);
      const std::vector<double> acc_after = acc.values(), m_after = m.values(),
                                l_after = l.values();
      for (int64_t i = 0; i < sq; ++i)
        for (int h = 0; h < hq; ++h) {
          const size_t li = size_t(h * sq + i);
          if (!sees(i, b)) {  // kept bit for bit
            ASSERT_EQ(m_after[li], m_before[li]);
            ASSERT_EQ(l_after[li], l_before[li]);
            for (int e = 0; e < d; ++e)
              ASSERT_EQ(acc_after[size_t(i * hq * d + h * d + e)],
                        acc_before[size_t(i * hq * d + h * d + e)]);
          } else if (m_before[li] == -INFINITY) {  // the first partial replaces the empty state
            ASSERT_EQ(m_after[li], double(lb.get(h, i)));
            ASSERT_EQ(l_after[li], 1.0);
            for (int e = 0; e < d; ++e)
              ASSERT_EQ(acc_after[size_t(i * hq * d + h * d + e)], double(ob.get(i, h * d + e)));
          }
        }
    }
    emu_finalize(acc.view(), m.view(), l.view(), d, o.view(), lse.view());
    // The softmax over every key a row sees, in fp64.
    for (int64_t i = 0; i < sq; ++i)
      for (int h = 0; h < hq; ++h) {
        double mx = -INFINITY, sum = 0;
        for (int b = 0; b < blocks; ++b)
          if (sees(i, b))
            for (int64_t j = b * bk; j < (b + 1) * bk; ++j) mx = std::max(mx, score(i, h, j));
        for (int b = 0; b < blocks; ++b)
          if (sees(i, b))
            for (int64_t j = b * bk; j < (b + 1) * bk; ++j) sum += std::exp(score(i, h, j) - mx);
        lse64[size_t(h * sq + i)] = mx + std::log(sum);
        for (int e = 0; e < d; ++e) {
          double x = 0;
          for (int b = 0; b < blocks; ++b)
            if (sees(i, b))
              for (int64_t j = b * bk; j < (b + 1) * bk; ++j)
                x += std::exp(score(i, h, j) - mx) / sum * value(h, j, e);
          o64[size_t(i * hq * d + h * d + e)] = x;
        }
      }
    // Within fp32 rounding (bf16: each partial and the output stored in bf16 once).
    const double tol_o = (t == DT::kF32 ? 64 * kEps32 : 3.0 / 256) * test::max_abs(o64);
    EXPECT_LE(test::max_abs_diff(o.values(), o64), tol_o) << "merged o " << int(t);
    EXPECT_LE(test::max_abs_diff(lse.values(), lse64), 64 * kEps32 * test::max_abs(lse64))
        << "merged lse " << int(t);
  }
}

TEST(CudaMath, AttentionDeltaMatchesReference) {
  const int hq = 4, d = 72;  // d not a multiple of the warp: lanes hold 2 or 3 terms
  const int64_t sq = 33;
  for (DT t : {DT::kF32, DT::kBF16}) {
    HostMat o(t, sq, hq * d, 3), g(t, sq, hq * d), delta(DT::kF32, hq, sq, 1);
    const auto ov = o.fill(60), gv = g.fill(61);
    emu_delta(o.view(), g.view(), d, delta.view());
    std::vector<double> r64(size_t(hq * sq));
    std::vector<float> r32(r64.size());
    for (int h = 0; h < hq; ++h)
      for (int64_t i = 0; i < sq; ++i) {
        double s = 0;
        float s32 = 0;
        for (int e = 0; e < d; ++e) {
          const size_t at = size_t(i * hq * d + h * d + e);
          s += ov[at] * gv[at];
          s32 += float(ov[at]) * float(gv[at]);
        }
        r64[size_t(h * sq + i)] = s;
        r32[size_t(h * sq + i)] = s32;
      }
    expect_close(delta.values(), r64, cast<double>(r32), "attention_delta");
  }
}

// ---- cross-entropy ----

void cross_entropy_case(int64_t rows, int64_t v, uint64_t seed) {
  const std::string name = "cross_entropy " + std::to_string(rows) + "x" + std::to_string(v);
  const double scale = 1.0 / 12;
  std::vector<int32_t> labels(static_cast<size_t>(rows));
  for (int64_t r = 0; r < rows; ++r) labels[size_t(r)] = int32_t((r * 389) % v);
  labels[1] = -1;
  labels[size_t(rows - 1)] = -1;  // the sequence's last token predicts nothing
  labels[2] = int32_t(v - 1);
  labels[3] = 0;
  HostMat x(DT::kF32, rows, v, 3);
  x.fill(seed, 4.0);
  x.set(4, 5, 60.0f);  // one dominant logit
  const auto x0 = x.values();
  HostMat xc = x;
  const double loss = emu_cross_entropy(x.view(), labels, float(scale));
  std::vector<double> x64 = x0;
  std::vector<float> x32 = cast<float>(x0);
  const double l64 = cross_entropy_ref(x64, rows, v, labels, scale);
  const double l32 = cross_entropy_ref(x32, rows, v, labels, scale);
  const auto got = x.values();
  expect_close(got, x64, cast<double>(x32), name + " grad");
  EXPECT_LE(std::abs(loss - l64), 2 * std::abs(l32 - l64) + 4 * kEps32 * std::abs(l64))
      << name << " loss " << loss << " vs fp64 " << l64;
  for (int64_t c = 0; c < v; ++c) ASSERT_EQ(got[size_t(v + c)], 0.0) << "label -1 row";
  // The CPU backend on the same tile: the same loss to fp32 rounding.
  const auto cpu = make_backend(BackendKind::kCpu);
  const double lc = cpu->cross_entropy(xc.mat(), labels, float(scale));
  EXPECT_NEAR(loss, lc, 8 * kEps32 * std::abs(l64)) << name;
}

TEST(CudaMath, CrossEntropyEmulatedKernelMatchesReference) {
  cross_entropy_case(13, 1001, 70);
  cross_entropy_case(9, 100, 71);  // fewer columns than lanes
}

TEST(CudaMath, CrossEntropyLayoutFitsTheParamBlock) {
  constexpr cuda::CeLayout lay = cuda::ce_layout(cuda::ParamBlock::kBytes);
  EXPECT_GE(lay.rows, 65536);
  EXPECT_EQ(lay.loss_offset % 8, 0);
  EXPECT_GE(lay.loss_offset, 4 * lay.rows);
  EXPECT_LE(lay.loss_offset + 8 * lay.rows, cuda::ParamBlock::kBytes);
  for (int64_t b : {int64_t(64), int64_t(1000), int64_t(4096 + 4)}) {
    const cuda::CeLayout l = cuda::ce_layout(b);
    EXPECT_GE(l.rows, 1);
    EXPECT_LE(l.loss_offset + 8 * l.rows, b) << b;
  }
}

// ---- sum of squares ----

TEST(CudaMath, SumSquaresFixedGridMatchesExactSum) {
  struct Case {
    int64_t rows, cols, pad;
  };
  // A short vector, one beyond the grid's lanes (lanes fold several terms), a strided view.
  for (const Case& c : {Case{1, 1037, 0}, Case{1, 300001, 0}, Case{50, 300, 10}}) {
    HostMat x(DT::kF32, c.rows, c.cols, c.pad);
    const auto xv = x.fill(80);
    long double want = 0;
    for (double e : xv) want += (long double)e * e;
    const double got = emu_sum_squares(x.view());
    EXPECT_NEAR(got, double(want), 1e-13 * double(want)) << c.cols;
    EXPECT_NEAR(got, make_backend(BackendKind::kCpu)->sum_squares(x.mat()), 1e-12 * got);
  }
  EXPECT_EQ(cuda::kSumLanes, int64_t(cuda::kSumBlocks) * cuda::kRowThreads);
  EXPECT_LE(cuda::kSumBlocks * 8, cuda::ParamBlock::kBytes);
}

// ---- RoPE ----

RopeParams llama31() {
  RopeParams p;
  p.theta = 500000.0;
  p.scaling = {true, 8.0, 1.0, 4.0, 8192};
  return p;
}

TEST(CudaMath, RopeMatchesReferenceAtLargePositions) {
  struct Case {
    int heads, d;
    RowPositions pos;
    RopeParams rp;
    int sign;
    DT t;
  };
  RopeParams plain;
  plain.theta = 500000.0;
  const Case cases[] = {
      {3, 64, {{{20, 3000000}, {30, 7999970}}}, plain, +1, DT::kF32},  // zigzag, millions
      {2, 128, RowPositions::contiguous(33, 1000000), llama31(), -1, DT::kF32},
      {4, 32, {{{16, 0}, {16, 700}}}, llama31(), +1, DT::kBF16},
  };
  uint64_t seed = 90;
  for (const Case& c : cases) {
    const int64_t rows = c.pos.total_rows(), cols = int64_t(c.heads) * c.d;
    HostMat x(c.t, rows, cols, 4);
    const auto x0 = x.fill(seed++);
    const auto inv = c.rp.inv_freq(c.d);
    emu_rope(x.view(), c.d, runs_of(c.pos), inv, c.sign);
    const auto p = c.pos.expand();
    auto x64 = x0;
    auto x32 = cast<float>(x0);
    const auto inv_ref = ref::rope_inv_freq(c.rp, c.d);
    ref::rope<double>(view(x64, rows, cols), c.d, p.data(), inv_ref, c.sign);
    ref::rope<float>(view(x32, rows, cols), c.d, p.data(), inv_ref, c.sign);
    expect_close(x.values(), x64, stored(x32, c.t), "rope d" + std::to_string(c.d));
  }
}

TEST(CudaMath, RopeIsShardIndependentAndInvertible) {
  const int d = 64;
  const int64_t rows = 300, split = 77;
  HostMat x(DT::kF32, rows, 2 * d), y(DT::kF32, rows, 2 * d);
  const auto before = x.fill(9);
  y.fill(9);
  const auto inv = llama31().inv_freq(d);
  emu_rope(x.view(), d, {{0, rows, 5000}}, inv, +1);
  emu_rope(y.view(), d, {{0, split, 5000}, {split, rows - split, 5000 + split}}, inv, +1);
  EXPECT_EQ(x.bytes, y.bytes);
  EXPECT_GT(test::max_abs_diff(x.values(), before), 0.1);
  emu_rope(x.view(), d, {{0, rows, 5000}}, inv, -1);
  EXPECT_LE(test::max_abs_diff(x.values(), before), 4 * kEps32 * test::max_abs(before));
}

// ---- the embedding's scatter-add: row_groups.h and the kernel's order, on the host ----

// The kernel of scatter_add_rows on the host: groups in any order (the GPU runs them in
// parallel), each group's rows in its order, every sum rounded into the table's dtype.
void emulate_scatter_add(const DView& table, const DView& src, const int32_t* ids, int64_t n,
                         int64_t chunk) {
  std::vector<int32_t> words(size_t(3 * chunk + 1));
  for (int64_t r0 = 0; r0 < n; r0 += chunk) {
    const int64_t rows = std::min(chunk, n - r0);
    const cuda::RowGroups g = cuda::group_rows(ids + r0, rows, words.data());
    for (int64_t k = g.groups - 1; k >= 0; --k) {  // the groups backwards: order-free
      const int32_t id = words[size_t(g.ids_at + k)];
      for (int64_t c = 0; c < table.cols; ++c) {
        float acc = hload(table, id, c);
        for (int32_t j = words[size_t(g.starts_at + k)]; j < words[size_t(g.starts_at + k + 1)];
             ++j) {
          acc += hload(src, r0 + words[size_t(j)], c);
          if (table.dtype == DT::kBF16) acc = cuda::bf16_to_f32(cuda::f32_to_bf16(acc));
        }
        hstore(table, id, c, acc);
      }
    }
  }
}

TEST(CudaMath, RowGroupsListEveryRowOnceInAscendingOrderPerId) {
  const std::vector<int32_t> ids = {4, 1, 4, 0, 1, 4, 9, 0};
  std::vector<int32_t> w(3 * ids.size() + 1, -7);
  const cuda::RowGroups g = cuda::group_rows(ids.data(), int64_t(ids.size()), w.data());
  ASSERT_EQ(g.groups, 4);
  EXPECT_EQ(std::vector<int32_t>(w.begin(), w.begin() + 8),
            (std::vector<int32_t>{3, 7, 1, 4, 0, 2, 5, 6}));  // rows by (id, row)
  EXPECT_EQ(std::vector<int32_t>(w.begin() + g.ids_at, w.begin() + g.ids_at + 4),
            (std::vector<int32_t>{0, 1, 4, 9}));
  EXPECT_EQ(std::vector<int32_t>(w.begin() + g.starts_at, w.begin() + g.starts_at + 5),
            (std::vector<int32_t>{0, 2, 4, 7, 8}));
  EXPECT_LE(g.starts_at + g.groups + 1, int64_t(w.size()));
  // The chunk sizes fit the parameter block: 3n + 1 words of scatter, n of gather.
  const int64_t words = cuda::ParamBlock::kBytes / 4;
  EXPECT_LE(3 * cuda::scatter_chunk_rows(words) + 1, words);
  EXPECT_LE(cuda::gather_chunk_rows(words), words);
}

// Grouped and chunked, the kernel's arithmetic gives the CPU backend's bytes (one add_into per
// row, r ascending) for every dtype pair, with a table row repeated across chunks.
TEST(CudaMath, ScatterAddEmulationIsCpuBackendBitwise) {
  auto cpu = make_backend(BackendKind::kCpu);
  const int64_t vocab = 7, cols = 40, n = 50;
  std::vector<int32_t> ids(static_cast<size_t>(n));
  for (int64_t r = 0; r < n; ++r) ids[size_t(r)] = int32_t((r * r + 3 * r) % vocab);
  uint64_t seed = 900;
  for (DT tt : {DT::kF32, DT::kBF16})
    for (DT st : {DT::kF32, DT::kBF16})
      for (int64_t chunk : {int64_t(7), n}) {
        HostMat table(tt, vocab, cols, 2), src(st, n, cols, 3);
        table.fill(seed++, 30.0);  // large against the rows: bf16 rounding at every addition
        src.fill(seed++);
        HostMat want = table;
        emulate_scatter_add(table.view(), src.view(), ids.data(), n, chunk);
        cpu->scatter_add_rows(want.mat(), src.mat(), ids);
        EXPECT_EQ(table.bytes, want.bytes)
            << (tt == DT::kF32 ? "fp32" : "bf16") << " table, "
            << (st == DT::kF32 ? "fp32" : "bf16") << " rows, chunks of " << chunk;
      }
}

// ---- the kernels on a GPU ----

#if defined(UPIPE_HAVE_CUDA)

// The device arena's one reservation: free memory less the headroom; ranks sharing a GPU each at
// most an equal share less the headroom (so the last of 4 ranks reserving in turn on 141 GB still
// fits); UPIPE_CUDA_RESERVE wins. Host arithmetic, no GPU needed.
TEST(CudaMemory, ReservationLeavesHeadroomAndSharesTheGpu) {
  const int64_t g = int64_t(1) << 30, h = cuda::kHeadroomBytes;
  unsetenv("UPIPE_CUDA_RESERVE");
  EXPECT_EQ(cuda::device_reservation_bytes(100 * g), 100 * g - h);
  EXPECT_EQ(cuda::device_reservation_bytes(100 * g, 140 * g, 1), 100 * g - h);
  EXPECT_EQ(cuda::device_reservation_bytes(2 * g), 0);
  // Four ranks on 140 GiB: each 35 GiB less the headroom, whenever it reserves.
  int64_t free = 139 * g, reserved = 0;
  for (int r = 0; r < 4; ++r) {
    const int64_t want = cuda::device_reservation_bytes(free, 140 * g, 4);
    EXPECT_EQ(want, 35 * g - h) << "rank " << r;
    reserved += want;
    free -= want + g / 2;  // and its context's half GiB
  }
  EXPECT_LE(reserved, 140 * g - 4 * h);
  EXPECT_GT(free, 0);
  // Little free memory: what is free, less the headroom, not the share.
  EXPECT_EQ(cuda::device_reservation_bytes(20 * g, 140 * g, 4), 17 * g);
  ScopedEnv set("UPIPE_CUDA_RESERVE", "6G");
  EXPECT_EQ(cuda::device_reservation_bytes(100 * g, 140 * g, 4), 6 * g);
}

// A device copy of a HostMat (same layout, padding included).
class DevMat {
 public:
  explicit DevMat(const HostMat& h) : h_(h) {
    EXPECT_EQ(cudaMalloc(&p_, h.bytes.size()), cudaSuccess);
    EXPECT_EQ(cudaMemcpy(p_, h.bytes.data(), h.bytes.size(), cudaMemcpyHostToDevice), cudaSuccess);
  }
  ~DevMat() { cudaFree(p_); }
  DevMat(const DevMat&) = delete;
  DevMat& operator=(const DevMat&) = delete;
  DView view() const {
    return {static_cast<char*>(p_) + (h_.ld - h_.cols) * h_.esize(), h_.dt, h_.rows, h_.cols,
            h_.ld};
  }
  HostMat get() const {
    HostMat out = h_;
    EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    EXPECT_EQ(cudaMemcpy(out.bytes.data(), p_, out.bytes.size(), cudaMemcpyDeviceToHost),
              cudaSuccess);
    return out;
  }

 private:
  HostMat h_;
  void* p_ = nullptr;
};

class DevBytes {
 public:
  explicit DevBytes(int64_t n) {
    if (n > 0) {
      EXPECT_EQ(cudaMalloc(&p_, size_t(n)), cudaSuccess);
    }
  }
  ~DevBytes() { cudaFree(p_); }
  DevBytes(const DevBytes&) = delete;
  DevBytes& operator=(const DevBytes&) = delete;
  void* get() const { return p_; }

 private:
  void* p_ = nullptr;
};

class CudaKernels : public ::testing::Test {
 protected:
  void SetUp() override {
    int n = 0;
    const cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess || n == 0)
      GTEST_SKIP() << "no CUDA device (" << (e != cudaSuccess ? cudaGetErrorString(e) : "0 devices")
                   << "): the kernels run only on a GPU";
    cpu_ = make_backend(BackendKind::kCpu);
  }
  static constexpr cudaStream_t s = nullptr;
  std::unique_ptr<Backend> cpu_;
};

std::string dt_name(DT t) {
  return t == DT::kF32 ? "fp32" : "bf16";
}

TEST_F(CudaKernels, DataMovementEqualsCpuBackendBytes) {
  const int64_t rows = 9, cols = 1100, pad = 5;
  uint64_t seed = 1000;
  for (DT t : {DT::kF32, DT::kBF16}) {
    HostMat x(t, rows, cols, pad);
    x.fill(seed++);
    DevMat dx(x);
    cuda::fill(dx.view(), 1.5f, s);
    cpu_->fill(x.mat(), 1.5f);
    EXPECT_EQ(dx.get().bytes, x.bytes) << "fill " << dt_name(t);
    for (DT to : {DT::kF32, DT::kBF16}) {
      HostMat src(t, rows, cols, pad), dst(to, rows, cols, 2 * pad);
      src.fill(seed++);
      DevMat ds(src), dd(dst);
      cuda::convert(dd.view(), ds.view(), s);
      cpu_->convert(dst.mat(), src.mat());
      EXPECT_EQ(dd.get().bytes, dst.bytes) << "convert " << dt_name(t) << "->" << dt_name(to);
      HostMat acc(to, rows, cols, 3);
      acc.fill(seed++);
      DevMat da(acc);
      cuda::add_into(da.view(), ds.view(), s);
      cpu_->add_into(acc.mat(), src.mat());
      EXPECT_EQ(da.get().bytes, acc.bytes) << "add_into " << dt_name(to) << " += " << dt_name(t);
    }
  }
  for (float beta : {0.0f, 1.0f, 0.5f}) {
    HostMat dst(DT::kF32, 70, 45, pad), src(DT::kF32, 45, 70, 3);
    dst.fill(seed++);
    src.fill(seed++);
    if (beta == 0.0f) dst.set(3, 4, NAN);  // beta 0 does not read dst
    DevMat dd(dst), ds(src);
    cuda::add_transposed(dd.view(), ds.view(), beta, s);
    cpu_->add_transposed(dst.mat(), src.mat(), beta);
    EXPECT_EQ(dd.get().bytes, dst.bytes) << "add_transposed beta " << beta;
  }
  HostMat acc(DT::kF32, 20, 96, 4), m(DT::kF32, 3, 20, 1), l(DT::kF32, 3, 20);
  DevMat dacc(acc), dm(m), dl(l);
  cuda::attention_accumulate_init(dacc.view(), dm.view(), dl.view(), s);
  cpu_->attention_accumulate_init(acc.mat(), m.mat(), l.mat());
  EXPECT_EQ(dacc.get().bytes, acc.bytes);
  EXPECT_EQ(dm.get().bytes, m.bytes);
  EXPECT_EQ(dl.get().bytes, l.bytes);
}

// The embedding's rows against the CPU backend's bytes, with more rows than one chunk of ids
// (gather and scatter) and table rows repeated within and across chunks.
TEST_F(CudaKernels, EmbeddingRowsEqualCpuBackendBytes) {
  cuda::ParamBlock pb;
  const int64_t words = cuda::ParamBlock::kBytes / 4;
  const int64_t n = std::max(cuda::gather_chunk_rows(words), cuda::scatter_chunk_rows(words)) + 91;
  const int64_t vocab = 50, cols = 3;
  std::vector<int32_t> ids(static_cast<size_t>(n));
  for (int64_t r = 0; r < n; ++r) ids[size_t(r)] = int32_t((r * 7919) % vocab);
  uint64_t seed = 1300;
  for (DT tt : {DT::kF32, DT::kBF16})
    for (DT rt : {DT::kF32, DT::kBF16}) {
      const std::string pair = dt_name(tt) + " table, " + dt_name(rt) + " rows";
      HostMat table(tt, vocab, cols, 2), dst(rt, n, cols, 1);
      table.fill(seed++);
      DevMat dtab(table), ddst(dst);
      cuda::gather_rows(ddst.view(), dtab.view(), ids.data(), n, pb, s);
      cpu_->gather_rows(dst.mat(), table.mat(), ids);
      EXPECT_EQ(ddst.get().bytes, dst.bytes) << "gather_rows " << pair;
      HostMat acc(tt, vocab, cols, 1), src(rt, n, cols, 2);
      acc.fill(seed++, 30.0);
      src.fill(seed++);
      DevMat dacc(acc), dsrc(src);
      cuda::scatter_add_rows(dacc.view(), dsrc.view(), ids.data(), n, pb, s);
      cpu_->scatter_add_rows(acc.mat(), src.mat(), ids);
      EXPECT_EQ(dacc.get().bytes, acc.bytes) << "scatter_add_rows " << pair;
    }
}

TEST_F(CudaKernels, RopeMatchesReference) {
  struct Case {
    int heads, d;
    RowPositions pos;
    DT t;
  };
  RowPositions many;  // more runs than one launch carries
  for (int64_t k = 0; k < 70; ++k) many.runs.push_back({3, 1000 * k + 7});
  const Case cases[] = {
      {3, 64, {{{20, 3000000}, {30, 7999970}}}, DT::kF32},
      {2, 64, many, DT::kBF16},
      {2, 1024, RowPositions::contiguous(9, 123456), DT::kF32},  // more frequencies than a launch
  };
  uint64_t seed = 1100;
  for (const Case& c : cases) {
    for (int sign : {+1, -1}) {
      const int64_t rows = c.pos.total_rows(), cols = int64_t(c.heads) * c.d;
      HostMat x(c.t, rows, cols, 4);
      const auto x0 = x.fill(seed++);
      const auto inv = llama31().inv_freq(c.d);
      std::vector<cuda::RopeRun> runs;
      for (const RopeRows& r : runs_of(c.pos)) runs.push_back({r.row, r.rows, r.pos});
      DevMat dx(x);
      cuda::rope(dx.view(), c.d, runs.data(), int64_t(runs.size()), inv.data(), sign, s);
      const auto p = c.pos.expand();
      auto x64 = x0;
      auto x32 = cast<float>(x0);
      ref::rope<double>(view(x64, rows, cols), c.d, p.data(), inv, sign);
      ref::rope<float>(view(x32, rows, cols), c.d, p.data(), inv, sign);
      expect_close(dx.get().values(), x64, stored(x32, c.t), "rope d" + std::to_string(c.d));
    }
  }
}

TEST_F(CudaKernels, RmsNormBitwiseEmulationAndDeterministic) {
  const RmsCase cases[] = {{37, 300, 300, DT::kF32, false},
                           {37, 1024, 32, DT::kF32, false},
                           {3, 4096, 4096, DT::kF32, false},
                           {20, 384, 128, DT::kBF16, true},
                           {2100, 64, 64, DT::kBF16, false}};
  const float eps = 1e-5f;
  for (const RmsCase& c : cases) {
    const std::string name = std::to_string(c.rows) + "x" + std::to_string(c.cols) + " g" +
                             std::to_string(c.group) + " " + dt_name(c.t);
    HostMat x(c.t, c.rows, c.cols, 3), w(c.t, 1, c.group), dy(c.t, c.rows, c.cols, 1);
    HostMat y(c.t, c.rows, c.cols, 2), dx(c.t, c.rows, c.cols), dw(DT::kF32, 1, c.group);
    x.fill(10);
    w.fill(11, 0.25, 1.0);
    dy.fill(12);
    dw.fill(13);
    DevMat gx(x), gw(w), gy(y), gdy(dy), gdx(dx), gdw(dw);
    DevBytes ws(cuda::rmsnorm_workspace_bytes(c.group));
    EXPECT_EQ(cuda::rmsnorm_workspace_bytes(c.group), cuda::rms_workspace_bytes(c.group));
    // Backward first (x is intact), then the forward, in place when asked.
    const DView gdxv = c.in_place ? gdy.view() : gdx.view();
    cuda::rmsnorm_backward(gx.view(), gw.view(), c.group, eps, gdy.view(), gdxv, gdw.view(),
                           ws.get(), s);
    const HostMat dx_once = c.in_place ? gdy.get() : gdx.get(), dw_once = gdw.get();
    cuda::rmsnorm_forward(gx.view(), gw.view(), c.group, eps, c.in_place ? gx.view() : gy.view(),
                          ws.get(), s);
    std::vector<float> hws(size_t(cuda::rms_workspace_bytes(c.group) / 4));
    HostMat xe = x;
    const DView dxe = c.in_place ? dy.view() : dx.view();
    emu_rmsnorm_backward(x.view(), w.view(), c.group, eps, dy.view(), dxe, dw.view(), hws);
    emu_rmsnorm_forward(xe.view(), w.view(), c.group, eps, c.in_place ? xe.view() : y.view());
    EXPECT_EQ(dx_once.bytes, c.in_place ? dy.bytes : dx.bytes) << name << " dx";
    EXPECT_EQ(dw_once.bytes, dw.bytes) << name << " dw";
    EXPECT_EQ((c.in_place ? gx.get() : gy.get()).bytes, c.in_place ? xe.bytes : y.bytes)
        << name << " y";
    // The same inputs again: the same bits (dw accumulates twice, through the same partials).
    if (!c.in_place) {
      cuda::rmsnorm_backward(gx.view(), gw.view(), c.group, eps, gdy.view(), gdx.view(), gdw.view(),
                             ws.get(), s);
      emu_rmsnorm_backward(x.view(), w.view(), c.group, eps, dy.view(), dx.view(), dw.view(), hws);
      EXPECT_EQ(gdw.get().bytes, dw.bytes) << name << " dw twice";
    }
  }
}

TEST_F(CudaKernels, SwigluMatchesReference) {
  for (DT t : {DT::kF32, DT::kBF16}) {
    const int64_t rows = 20, cols = 513;
    HostMat a(t, rows, cols, 3), b(t, rows, cols), dh(t, rows, cols, 5), h(t, rows, cols, 2),
        da(t, rows, cols), db(t, rows, cols, 1);
    const auto av = a.fill(1, 3.0), bv = b.fill(2), dhv = dh.fill(3);
    DevMat ga(a), gb(b), gdh(dh), gh(h), gda(da), gdb(db);
    EXPECT_EQ(cuda::swiglu_workspace_bytes(cols), 0);
    cuda::swiglu_forward(ga.view(), gb.view(), gh.view(), nullptr, s);
    cuda::swiglu_backward(ga.view(), gb.view(), gdh.view(), gda.view(), gdb.view(), nullptr, s);
    std::vector<double> h64(av.size()), da64(av.size()), db64(av.size());
    ref::swiglu_forward<double>(cview(av, rows, cols), cview(bv, rows, cols),
                                view(h64, rows, cols));
    ref::swiglu_backward<double>(cview(av, rows, cols), cview(bv, rows, cols),
                                 cview(dhv, rows, cols), view(da64, rows, cols),
                                 view(db64, rows, cols));
    const auto a32 = cast<float>(av), b32 = cast<float>(bv), dh32 = cast<float>(dhv);
    std::vector<float> h32(av.size()), da32(av.size()), db32(av.size());
    ref::swiglu_forward<float>(cview(a32, rows, cols), cview(b32, rows, cols),
                               view(h32, rows, cols));
    ref::swiglu_backward<float>(cview(a32, rows, cols), cview(b32, rows, cols),
                                cview(dh32, rows, cols), view(da32, rows, cols),
                                view(db32, rows, cols));
    expect_close(gh.get().values(), h64, stored(h32, t), "swiglu h " + dt_name(t));
    expect_close(gda.get().values(), da64, stored(da32, t), "swiglu da " + dt_name(t));
    expect_close(gdb.get().values(), db64, stored(db32, t), "swiglu db " + dt_name(t));
  }
}

TEST_F(CudaKernels, CrossEntropyMatchesReferenceAndChunks) {
  cuda::ParamBlock pb;
  const int64_t chunk = cuda::ce_layout(cuda::ParamBlock::kBytes).rows;
  struct Case {
    int64_t rows, v;
  };
  // The last case has more rows than one chunk of labels.
  for (const Case& c : {Case{13, 1001}, Case{9, 100}, Case{chunk + 37, 8}}) {
    const std::string name = "cross_entropy " + std::to_string(c.rows) + "x" + std::to_string(c.v);
    const double scale = 1.0 / 12;
    std::vector<int32_t> labels(size_t(c.rows));
    for (int64_t r = 0; r < c.rows; ++r) labels[size_t(r)] = int32_t((r * 389) % c.v);
    labels[1] = -1;
    labels[size_t(c.rows - 1)] = -1;
    labels[2] = int32_t(c.v - 1);
    HostMat x(DT::kF32, c.rows, c.v, 3);
    const auto x0 = x.fill(200, 4.0);
    DevMat gx(x);
    const double loss = cuda::cross_entropy(gx.view(), labels.data(), c.rows, float(scale), pb, s);
    std::vector<double> x64 = x0;
    std::vector<float> x32 = cast<float>(x0);
    const double l64 = cross_entropy_ref(x64, c.rows, c.v, labels, scale);
    const double l32 = cross_entropy_ref(x32, c.rows, c.v, labels, scale);
    const auto got = gx.get().values();
    expect_close(got, x64, cast<double>(x32), name + " grad");
    EXPECT_LE(std::abs(loss - l64), 2 * std::abs(l32 - l64) + 4 * kEps32 * std::abs(l64))
        << name << " loss " << loss << " vs fp64 " << l64;
    for (int64_t j = 0; j < c.v; ++j) ASSERT_EQ(got[size_t(c.v + j)], 0.0) << name;
    // The loss sum is deterministic: the same tile again gives the same bits.
    DevMat gx2(x);
    EXPECT_EQ(cuda::cross_entropy(gx2.view(), labels.data(), c.rows, float(scale), pb, s), loss);
  }
}

TEST_F(CudaKernels, SumSquaresAndAdamwBitwiseEmulation) {
  cuda::ParamBlock pb;
  for (int64_t cols : {int64_t(1037), int64_t(300001)}) {
    HostMat x(DT::kF32, 1, cols);
    x.fill(300);
    DevMat gx(x);
    const double a = cuda::sum_squares(gx.view(), pb, s);
    EXPECT_EQ(a, emu_sum_squares(x.view())) << cols;
    EXPECT_EQ(cuda::sum_squares(gx.view(), pb, s), a) << "the same bits every call";
  }
  HostMat strided(DT::kF32, 50, 300, 10);
  strided.fill(301);
  DevMat gs(strided);
  EXPECT_EQ(cuda::sum_squares(gs.view(), pb, s), emu_sum_squares(strided.view()));

  const AdamWArgs a{1e-2, 0.9, 0.95, 1e-8, 0.1, 0.5, 7};
  const int64_t n = 5000;
  HostMat w(DT::kF32, 1, n), g(DT::kF32, 1, n), m(DT::kF32, 1, n), v(DT::kF32, 1, n);
  w.fill(310);
  g.fill(311);
  m.fill(312, 0.1);
  v.fill(313, 0.01, 0.05);
  DevMat gw(w), gg(g), gm(m), gv(v);
  cuda::adamw(gw.view(), gg.view(), gm.view(), gv.view(),
              {a.lr, a.beta1, a.beta2, a.eps, a.weight_decay, a.grad_scale, a.step}, s);
  emu_adamw(
      w.view(), g.view(), m.view(), v.view(),
      cuda::adamw_consts(a.lr, a.beta1, a.beta2, a.eps, a.weight_decay, a.grad_scale, a.step));
  EXPECT_EQ(gw.get().bytes, w.bytes);
  EXPECT_EQ(gm.get().bytes, m.bytes);
  EXPECT_EQ(gv.get().bytes, v.bytes);
}

TEST_F(CudaKernels, AttentionBookkeepingMatchesEmulation) {
  const int hq = 3, d = 40;
  const int64_t sq = 60;
  for (DT t : {DT::kF32, DT::kBF16}) {
    // finalize, with empty rows: exact zeros and -inf, the rest within 2 ulp (logf may differ).
    HostMat acc(DT::kF32, sq, hq * d, 2), m(DT::kF32, hq, sq), l(DT::kF32, hq, sq, 1);
    HostMat o(t, sq, hq * d, 3), lse(DT::kF32, hq, sq);
    acc.fill(400);
    m.fill(401, 3.0);
    l.fill(402, 0.5, 2.0);
    for (int h = 0; h < hq; ++h)
      for (int64_t i = h; i < sq; i += 4) l.set(h, i, 0.0f);
    DevMat gacc(acc), gm(m), gl(l), go(o), glse(lse);
    cuda::attention_finalize(gacc.view(), gm.view(), gl.view(), d, go.view(), glse.view(), s);
    emu_finalize(acc.view(), m.view(), l.view(), d, o.view(), lse.view());
    EXPECT_EQ(go.get().bytes, o.bytes) << "finalize o " << dt_name(t);
    const auto gl_v = glse.get().values(), el_v = lse.values();
    for (size_t i = 0; i < el_v.size(); ++i)
      ASSERT_NEAR(gl_v[i], el_v[i], 2 * kEps32 * std::abs(el_v[i])) << "finalize lse " << i;

    // lse_merge with empty partials: exact copies; mixed rows within fp32 rounding of exp/log.
    HostMat o1(t, sq, hq * d, 4), o2(t, sq, hq * d, 1), l1(DT::kF32, hq, sq, 2),
        l2(DT::kF32, hq, sq);
    o1.fill(410);
    o2.fill(411);
    l1.fill(412, 3.0);
    l2.fill(413, 3.0);
    for (int h = 0; h < hq; ++h)
      for (int64_t i = 0; i < sq; ++i) {
        if (i % 7 == 0) l1.set(h, i, -kInf);
        if (i % 5 == 0) l2.set(h, i, -kInf);
      }
    DevMat go1(o1), go2(o2), gl1(l1), gl2(l2);
    cuda::lse_merge(go1.view(), gl1.view(), go2.view(), gl2.view(), d, s);
    emu_lse_merge(o1.view(), l1.view(), o2.view(), l2.view(), d);
    const auto om = go1.get().values(), oe = o1.values();
    const double tol = (t == DT::kF32 ? 8 * kEps32 : 1.0 / 128) * test::max_abs(oe);
    EXPECT_LE(test::max_abs_diff(om, oe), tol) << "lse_merge o " << dt_name(t);
    const auto lm = gl1.get().values(), le = l1.values();
    for (size_t i = 0; i < le.size(); ++i)
      ASSERT_NEAR(lm[i], le[i], 4 * kEps32 * std::max(1.0, std::abs(le[i]))) << "merge lse " << i;
    for (int64_t i = 0; i < sq; i += 5)
      for (int h = 0; h < hq; ++h) ASSERT_EQ(lm[size_t(h * sq + i)], le[size_t(h * sq + i)]);

    // delta: fmaf lanes and a shuffle tree, the emulation's bits.
    HostMat dout(t, sq, hq * d, 2), delta(DT::kF32, hq, sq, 1);
    dout.fill(420);
    DevMat gdo(dout), gdelta(delta);
    cuda::attention_delta(go.view(), gdo.view(), d, gdelta.view(), s);
    emu_delta(o.view(), dout.view(), d, delta.view());
    EXPECT_EQ(gdelta.get().bytes, delta.bytes) << "delta " << dt_name(t);

    // A normalised partial into an online state (cuDNN's accumulate mode), with empty states and
    // empty partials: within fp32 rounding of exp (the emulation's fmaf on the host), m exactly.
    HostMat sa(DT::kF32, sq, hq * d, 1), sm(DT::kF32, hq, sq), sl(DT::kF32, hq, sq, 3);
    HostMat po(t, sq, hq * d, 2), pl(DT::kF32, hq, sq);
    sa.fill(430);
    sm.fill(431, 3.0);
    sl.fill(432, 0.5, 2.0);
    po.fill(433);
    pl.fill(434, 3.0);
    for (int h = 0; h < hq; ++h)
      for (int64_t i = 0; i < sq; ++i) {
        if (i % 6 == 0) sm.set(h, i, -kInf);
        if (i % 6 == 0) sl.set(h, i, 0.0f);
        if (i % 4 == 0) pl.set(h, i, -kInf);
      }
    for (int64_t i = 0; i < sq; ++i)
      if (i % 6 == 0)
        for (int c = 0; c < hq * d; ++c) sa.set(i, c, 0.0f);
    DevMat gsa(sa), gsm(sm), gsl(sl), gpo(po), gpl(pl);
    cuda::attention_merge_partial(gsa.view(), gsm.view(), gsl.view(), gpo.view(), gpl.view(), d, s);
    emu_merge_partial(sa.view(), sm.view(), sl.view(), po.view(), pl.view(), d);
    EXPECT_EQ(gsm.get().bytes, sm.bytes) << "merge_partial m " << dt_name(t);
    const auto ga = gsa.get().values(), ea = sa.values(), gsl_v = gsl.get().values(),
               esl_v = sl.values();
    EXPECT_LE(test::max_abs_diff(ga, ea), 4 * kEps32 * test::max_abs(ea)) << "merge_partial acc";
    EXPECT_LE(test::max_abs_diff(gsl_v, esl_v), 4 * kEps32 * test::max_abs(esl_v))
        << "merge_partial l";
  }
}

#else

TEST(CudaKernels, NeedACudaBuild) {
  GTEST_SKIP() << "built without CUDA (UPIPE_CUDA=OFF): the kernels run only in a CUDA build on "
                  "a GPU";
}

#endif

}  // namespace
}  // namespace upipe
