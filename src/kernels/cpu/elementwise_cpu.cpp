// CPU implementations of RoPE, RMSNorm and SwiGLU (the dispatch layer is in this file too:
// these ops have no workspace, so meta simply returns).
#include <cmath>

#include "kernels/rmsnorm.h"
#include "kernels/rope.h"
#include "kernels/swiglu.h"

namespace upipe {
namespace {

// Loads row r of x as fp32 into buf (x.cols elements) and stores it back.
void load_row(const Mat& x, int64_t r, float* buf) {
  to_f32(x.at(r, 0), x.dtype, buf, x.cols);
}
void store_row(const Mat& x, int64_t r, const float* buf) {
  from_f32(buf, x.at(r, 0), x.dtype, x.cols);
}

// cos/sin of pos * inv_freq[i] for consecutive positions. Exact fp64 sincos at every multiple
// of kRopeAnchor, then rotation by inv_freq[i] in fp64 (error ~1e-15 after 63 steps): a
// position's values depend only on the position, never on where a shard starts, and cost a
// few FMAs instead of a sincos.
constexpr int64_t kRopeAnchor = 64;

class RopeAngles {
 public:
  RopeAngles(int half, double theta, int d) : half_(half) {
    for (int i = 0; i < half; ++i) {
      inv_[i] = std::pow(theta, -2.0 * i / d);
      step_c_[i] = std::cos(inv_[i]);
      step_s_[i] = std::sin(inv_[i]);
    }
  }
  // Positions the generator at `pos` (anchor, then steps forward).
  void seek(int64_t pos) {
    pos_ = pos - pos % kRopeAnchor;
    for (int i = 0; i < half_; ++i) {
      c_[i] = std::cos(double(pos_) * inv_[i]);
      s_[i] = std::sin(double(pos_) * inv_[i]);
    }
    while (pos_ < pos) advance();
  }
  void advance() {
    ++pos_;
    if (pos_ % kRopeAnchor == 0) {
      seek(pos_);
      return;
    }
    for (int i = 0; i < half_; ++i) {
      const double c = c_[i] * step_c_[i] - s_[i] * step_s_[i];
      s_[i] = s_[i] * step_c_[i] + c_[i] * step_s_[i];
      c_[i] = c;
    }
  }
  double cos(int i) const { return c_[i]; }
  double sin(int i) const { return s_[i]; }

 private:
  int half_;
  int64_t pos_ = 0;
  double inv_[512], step_c_[512], step_s_[512], c_[512], s_[512];
};

void rope_apply(Device& dev, const Mat& x, int d, const RowPositions& pos, double theta, int sign) {
  UPIPE_CHECK(d % 2 == 0 && d <= 1024 && x.cols % d == 0, "rope needs even d <= 1024 dividing {}",
              x.cols);
  UPIPE_CHECK(pos.total_rows() == x.rows, "rope positions cover {} rows, x has {}",
              pos.total_rows(), x.rows);
  if (dev.is_meta()) return;
  const int half = d / 2;
  const int64_t heads = x.cols / d;
  RopeAngles angles(half, theta, d);
  float cs[512], sn[512], a[512], b[512], ya[512], yb[512];
  int64_t r = 0;
  for (const RowPositions::Run& run : pos.runs) {
    for (int64_t t = 0; t < run.rows; ++t, ++r) {
      if (t == 0)
        angles.seek(run.pos);
      else
        angles.advance();
      for (int i = 0; i < half; ++i) {
        cs[i] = float(angles.cos(i));
        sn[i] = float(sign * angles.sin(i));
      }
      for (int64_t h = 0; h < heads; ++h) {
        char* base = static_cast<char*>(x.at(r, h * d));
        char* second = base + half * dtype_size(x.dtype);
        to_f32(base, x.dtype, a, half);
        to_f32(second, x.dtype, b, half);
#pragma omp simd
        for (int i = 0; i < half; ++i) {
          ya[i] = a[i] * cs[i] - b[i] * sn[i];
          yb[i] = b[i] * cs[i] + a[i] * sn[i];
        }
        from_f32(ya, base, x.dtype, half);
        from_f32(yb, second, x.dtype, half);
      }
    }
  }
}

float silu(float x) {
  return x / (1.0f + std::exp(-x));
}

}  // namespace

int64_t RowPositions::total_rows() const {
  int64_t n = 0;
  for (const Run& r : runs) n += r.rows;
  return n;
}

std::vector<int64_t> RowPositions::expand() const {
  std::vector<int64_t> v;
  for (const Run& r : runs)
    for (int64_t t = 0; t < r.rows; ++t) v.push_back(r.pos + t);
  return v;
}

void rope_forward(Device& dev, const Mat& x, int d, const RowPositions& pos, double theta) {
  rope_apply(dev, x, d, pos, theta, +1);
}

void rope_backward(Device& dev, const Mat& x, int d, const RowPositions& pos, double theta) {
  rope_apply(dev, x, d, pos, theta, -1);
}

void rmsnorm_forward(Device& dev, const Mat& x, const Mat& w, float eps, const Mat& y) {
  UPIPE_CHECK(w.cols == x.cols && y.rows == x.rows && y.cols == x.cols,
              "rmsnorm shapes: x {}x{}, w {}, y {}x{}", x.rows, x.cols, w.cols, y.rows, y.cols);
  Buffer ws(dev.mem(), rmsnorm_workspace_bytes(x.cols), Tag::kWorkspace);
  if (dev.is_meta()) return;
  float* row = static_cast<float*>(ws.data());
  float* wf = row + x.cols;
  load_row(w, 0, wf);
  const int64_t n = x.cols;
  for (int64_t r = 0; r < x.rows; ++r) {
    load_row(x, r, row);
    float ss = 0.0f;
#pragma omp simd reduction(+ : ss)
    for (int64_t c = 0; c < n; ++c) ss += row[c] * row[c];
    const float inv = 1.0f / std::sqrt(ss / float(n) + eps);
#pragma omp simd
    for (int64_t c = 0; c < n; ++c) row[c] = row[c] * inv * wf[c];
    store_row(y, r, row);
  }
}

void rmsnorm_backward(Device& dev, const Mat& x, const Mat& w, float eps, const Mat& dy,
                      const Mat& dx, const Mat& dw) {
  UPIPE_CHECK(
      dw.dtype == DType::kF32 && dw.cols == x.cols && dy.rows == x.rows && dx.rows == x.rows,
      "rmsnorm backward shapes");
  Buffer ws(dev.mem(), rmsnorm_workspace_bytes(x.cols), Tag::kWorkspace);
  if (dev.is_meta()) return;
  float* xr = static_cast<float*>(ws.data());
  float* gr = xr + x.cols;
  float* wf = gr + x.cols;
  load_row(w, 0, wf);
  float* dwp = dw.f32();
  const int64_t n = x.cols;
  for (int64_t r = 0; r < x.rows; ++r) {
    load_row(x, r, xr);
    load_row(dy, r, gr);
    float ss = 0.0f, dot = 0.0f;
#pragma omp simd reduction(+ : ss, dot)
    for (int64_t c = 0; c < n; ++c) {
      ss += xr[c] * xr[c];
      dot += wf[c] * gr[c] * xr[c];
    }
    const float inv = 1.0f / std::sqrt(ss / float(n) + eps);
    const float k = dot * inv * inv * inv / float(n);
#pragma omp simd
    for (int64_t c = 0; c < n; ++c) {
      dwp[c] += gr[c] * xr[c] * inv;
      gr[c] = wf[c] * gr[c] * inv - xr[c] * k;
    }
    store_row(dx, r, gr);
  }
}

void swiglu_forward(Device& dev, const Mat& a, const Mat& b, const Mat& h) {
  UPIPE_CHECK(a.rows == b.rows && a.cols == b.cols && h.rows == a.rows && h.cols == a.cols,
              "swiglu shapes");
  Buffer ws(dev.mem(), swiglu_workspace_bytes(a.cols), Tag::kWorkspace);
  if (dev.is_meta()) return;
  float* ar = static_cast<float*>(ws.data());
  float* br = ar + a.cols;
  for (int64_t r = 0; r < a.rows; ++r) {
    load_row(a, r, ar);
    load_row(b, r, br);
    for (int64_t c = 0; c < a.cols; ++c) ar[c] = silu(ar[c]) * br[c];
    store_row(h, r, ar);
  }
}

void swiglu_backward(Device& dev, const Mat& a, const Mat& b, const Mat& dh, const Mat& da,
                     const Mat& db) {
  UPIPE_CHECK(a.rows == b.rows && a.cols == b.cols && dh.rows == a.rows && da.rows == a.rows &&
                  db.rows == a.rows,
              "swiglu backward shapes");
  Buffer ws(dev.mem(), swiglu_workspace_bytes(a.cols), Tag::kWorkspace);
  if (dev.is_meta()) return;
  float* ar = static_cast<float*>(ws.data());
  float* br = ar + a.cols;
  float* gr = br + a.cols;
  for (int64_t r = 0; r < a.rows; ++r) {
    load_row(a, r, ar);
    load_row(b, r, br);
    load_row(dh, r, gr);
    for (int64_t c = 0; c < a.cols; ++c) {
      const float x = ar[c], sg = 1.0f / (1.0f + std::exp(-x));
      const float g = gr[c];
      ar[c] = g * br[c] * sg * (1.0f + x * (1.0f - sg));
      br[c] = g * x * sg;
    }
    store_row(da, r, ar);
    store_row(db, r, br);
  }
}

}  // namespace upipe
