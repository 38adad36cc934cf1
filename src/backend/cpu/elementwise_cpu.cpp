// CPU implementations of RoPE, RMSNorm (whole rows or per head) and SwiGLU, and the
// elementwise data-movement ops.
#include <algorithm>
#include <cmath>
#include <cstring>

#include "backend/cpu/cpu_ops.h"
#include "backend/cpu/vec_math.h"

namespace upipe::cpu {
namespace {

// The n values at (r, c0) of x as fp32: in place for an fp32 view, else staged in buf.
const float* f32_at(const Mat& x, int64_t r, int64_t c0, int64_t n, float* buf) {
  if (x.dtype == DType::kF32) return static_cast<const float*>(x.at(r, c0));
  to_f32(x.at(r, c0), x.dtype, buf, n);
  return buf;
}
// Where the n output values at (r, c0) of x are computed: in place for fp32, else in buf, which
// store_at then rounds into x.
float* out_at(const Mat& x, int64_t r, int64_t c0, float* buf) {
  return x.dtype == DType::kF32 ? static_cast<float*>(x.at(r, c0)) : buf;
}
void store_at(const Mat& x, int64_t r, int64_t c0, int64_t n, const float* buf) {
  if (x.dtype != DType::kF32) from_f32(buf, x.at(r, c0), x.dtype, n);
}

// cos/sin of pos * inv_freq[i] for consecutive positions. Exact fp64 sincos at every multiple
// of kRopeAnchor, then rotation by inv_freq[i] in fp64 (error ~1e-15 after 63 steps): a
// position's values depend only on the position, never on where a shard starts, and cost a
// few FMAs instead of a sincos.
constexpr int64_t kRopeAnchor = 64;

class RopeAngles {
 public:
  RopeAngles(int half, const std::vector<double>& inv_freq) : half_(half) {
    for (int i = 0; i < half; ++i) {
      inv_[i] = inv_freq[size_t(i)];
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

}  // namespace

void rope(const Mat& x, int d, const RowPositions& pos, const RopeParams& rp, int sign) {
  const int half = d / 2;
  const int64_t heads = x.cols / d;
  RopeAngles angles(half, rp.inv_freq(d));
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

// x (rows, cols) is normalised over each `group`-wide column group; ws: 3 group floats. fp32
// groups are read and written in place, other dtypes staged through the workspace. The sums run
// on eight lanes in a fixed order (not the compiler's, which may depend on the data's alignment).
void rmsnorm_forward(const Mat& x, const Mat& w, int64_t group, float eps, const Mat& y,
                     float* ws) {
  float* row = ws;
  float* wf = row + group;
  to_f32(w.at(0, 0), w.dtype, wf, group);
  const int64_t n = group;
  for (int64_t r = 0; r < x.rows; ++r)
    for (int64_t c0 = 0; c0 < x.cols; c0 += n) {
      const float* xr = f32_at(x, r, c0, n, row);
      float* yr = out_at(y, r, c0, row);
      __m256 vss = _mm256_setzero_ps();
      for_chunks8(n, [&](const Chunk8& k) {
        const __m256 v = k.load(xr);
        vss = _mm256_fmadd_ps(v, v, vss);
      });
      const float inv = 1.0f / std::sqrt(hsum8(vss) / float(n) + eps);
      const __m256 vinv = _mm256_set1_ps(inv);
      for_chunks8(n, [&](const Chunk8& k) {
        k.store(yr, _mm256_mul_ps(_mm256_mul_ps(k.load(xr), vinv), k.load(wf)));
      });
      store_at(y, r, c0, n, yr);
    }
}

void rmsnorm_backward(const Mat& x, const Mat& w, int64_t group, float eps, const Mat& dy,
                      const Mat& dx, const Mat& dw, float* ws) {
  float* xbuf = ws;
  float* gbuf = xbuf + group;
  float* wf = gbuf + group;
  to_f32(w.at(0, 0), w.dtype, wf, group);
  float* dwp = dw.f32();
  const int64_t n = group;
  for (int64_t r = 0; r < x.rows; ++r)
    for (int64_t c0 = 0; c0 < x.cols; c0 += n) {
      // dx may be dy (in place): each element of gr is read before dxr's is written.
      const float* xr = f32_at(x, r, c0, n, xbuf);
      const float* gr = f32_at(dy, r, c0, n, gbuf);
      float* dxr = out_at(dx, r, c0, gbuf);
      __m256 vss = _mm256_setzero_ps(), vdot = _mm256_setzero_ps();
      for_chunks8(n, [&](const Chunk8& k) {
        const __m256 xv = k.load(xr);
        vss = _mm256_fmadd_ps(xv, xv, vss);
        vdot = _mm256_fmadd_ps(_mm256_mul_ps(k.load(wf), k.load(gr)), xv, vdot);
      });
      const float inv = 1.0f / std::sqrt(hsum8(vss) / float(n) + eps);
      const __m256 vinv = _mm256_set1_ps(inv),
                   vk = _mm256_set1_ps(hsum8(vdot) * inv * inv * inv / float(n));
      for_chunks8(n, [&](const Chunk8& k) {
        const __m256 xv = k.load(xr), gv = k.load(gr);
        k.store(dwp, _mm256_fmadd_ps(_mm256_mul_ps(gv, xv), vinv, k.load(dwp)));
        k.store(dxr, _mm256_fmsub_ps(_mm256_mul_ps(k.load(wf), gv), vinv, _mm256_mul_ps(xv, vk)));
      });
      store_at(dx, r, c0, n, dxr);
    }
}

// Max-subtracted log-sum-exp on eight lanes: exp8 (vec_math.h) in fp32, the row sum in fp64 in
// a fixed lane order. Three passes over a row (max; exp and sum; scale) while it sits in cache,
// instead of libm's expf per element, which made this the step's largest elementwise cost.
double cross_entropy(const Mat& logits, std::span<const int32_t> labels, float scale) {
  const int64_t v = logits.cols;
  const __m256 neg_inf = _mm256_set1_ps(-INFINITY);
  double loss = 0;
  for (int64_t r = 0; r < logits.rows; ++r) {
    float* row = static_cast<float*>(logits.at(r, 0));
    const int32_t label = labels[size_t(r)];
    if (label < 0) {
      std::fill_n(row, v, 0.0f);
      continue;
    }
    __m256 vmax = neg_inf;
    for_chunks8(
        v, [&](const Chunk8& k) { vmax = _mm256_max_ps(vmax, k.select(k.load(row), neg_inf)); });
    const float m = hmax8(vmax);
    const float target = row[label];
    const __m256 vm = _mm256_set1_ps(m);
    __m256d sum_lo = _mm256_setzero_pd(), sum_hi = _mm256_setzero_pd();
    for_chunks8(v, [&](const Chunk8& k) {
      const __m256 e = k.select(exp8(_mm256_sub_ps(k.load(row), vm)), _mm256_setzero_ps());
      k.store(row, e);
      sum_lo = _mm256_add_pd(sum_lo, _mm256_cvtps_pd(_mm256_castps256_ps128(e)));
      sum_hi = _mm256_add_pd(sum_hi, _mm256_cvtps_pd(_mm256_extractf128_ps(e, 1)));
    });
    const double sum = hsum4d(_mm256_add_pd(sum_lo, sum_hi));
    loss += double(m) + std::log(sum) - double(target);
    const __m256 p = _mm256_set1_ps(float(double(scale) / sum));
    for_chunks8(v, [&](const Chunk8& k) { k.store(row, _mm256_mul_ps(k.load(row), p)); });
    row[label] -= scale;
  }
  return loss;
}

namespace {

// sigmoid(x) = 1 / (1 + exp(-x)), finite for every x because exp8 clamps its argument.
__m256 sigmoid8(__m256 x) {
  const __m256 one = _mm256_set1_ps(1.0f);
  return _mm256_div_ps(one, _mm256_add_ps(one, exp8(neg8(x))));
}

}  // namespace

// SwiGLU on eight lanes with exp8; fp32 rows are read and written in place, other dtypes go
// through the workspace rows.
void swiglu_forward(const Mat& a, const Mat& b, const Mat& h, float* ws) {
  for (int64_t r = 0; r < a.rows; ++r) {
    const float* ar = f32_at(a, r, 0, a.cols, ws);
    const float* br = f32_at(b, r, 0, a.cols, ws + a.cols);
    float* hr = out_at(h, r, 0, ws + 2 * a.cols);
    for_chunks8(a.cols, [&](const Chunk8& k) {
      const __m256 x = k.load(ar);
      k.store(hr, _mm256_mul_ps(_mm256_mul_ps(x, sigmoid8(x)), k.load(br)));
    });
    store_at(h, r, 0, a.cols, hr);
  }
}

void swiglu_backward(const Mat& a, const Mat& b, const Mat& dh, const Mat& da, const Mat& db,
                     float* ws) {
  const __m256 one = _mm256_set1_ps(1.0f);
  for (int64_t r = 0; r < a.rows; ++r) {
    // da and db may be written over a's and b's staged rows: each chunk is read before written.
    const float* ar = f32_at(a, r, 0, a.cols, ws);
    const float* br = f32_at(b, r, 0, a.cols, ws + a.cols);
    const float* gr = f32_at(dh, r, 0, a.cols, ws + 2 * a.cols);
    float* dar = out_at(da, r, 0, ws);
    float* dbr = out_at(db, r, 0, ws + a.cols);
    for_chunks8(a.cols, [&](const Chunk8& k) {
      const __m256 x = k.load(ar), y = k.load(br), g = k.load(gr), sg = sigmoid8(x);
      // da = g b sg (1 + x (1 - sg)), db = g x sg, in the order of the scalar reference.
      const __m256 dsilu = _mm256_add_ps(one, _mm256_mul_ps(x, _mm256_sub_ps(one, sg)));
      k.store(dar, _mm256_mul_ps(_mm256_mul_ps(_mm256_mul_ps(g, y), sg), dsilu));
      k.store(dbr, _mm256_mul_ps(_mm256_mul_ps(g, x), sg));
    });
    store_at(da, r, 0, a.cols, dar);
    store_at(db, r, 0, a.cols, dbr);
  }
}

void fill(const Mat& x, float value) {
  if (value == 0.0f) {
    for (int64_t r = 0; r < x.rows; ++r)
      std::memset(x.at(r, 0), 0, size_t(x.cols * dtype_size(x.dtype)));
    return;
  }
  float row[1024];
  std::fill_n(row, 1024, value);
  for (int64_t r = 0; r < x.rows; ++r)
    for (int64_t c0 = 0; c0 < x.cols; c0 += 1024)
      from_f32(row, x.at(r, c0), x.dtype, std::min<int64_t>(1024, x.cols - c0));
}

void convert(const Mat& dst, const Mat& src) {
  if (dst.dtype == src.dtype) {
    for (int64_t r = 0; r < src.rows; ++r)
      std::memcpy(dst.at(r, 0), src.at(r, 0), size_t(src.cols * dtype_size(src.dtype)));
    return;
  }
  float row[1024];
  for (int64_t r = 0; r < src.rows; ++r)
    for (int64_t c0 = 0; c0 < src.cols; c0 += 1024) {
      const int64_t n = std::min<int64_t>(1024, src.cols - c0);
      to_f32(src.at(r, c0), src.dtype, row, n);
      from_f32(row, dst.at(r, c0), dst.dtype, n);
    }
}

void add_into(const Mat& dst, const Mat& src) {
  if (dst.dtype == DType::kF32 && src.dtype == DType::kF32) {
    for (int64_t r = 0; r < src.rows; ++r) {
      float* d = static_cast<float*>(dst.at(r, 0));
      const float* s = static_cast<const float*>(src.at(r, 0));
      for (int64_t c = 0; c < src.cols; ++c) d[c] += s[c];
    }
    return;
  }
  // Other dtypes through fp32 chunks: one rounding of the sum into dst.
  float a[1024], b[1024];
  for (int64_t r = 0; r < src.rows; ++r)
    for (int64_t c0 = 0; c0 < src.cols; c0 += 1024) {
      const int64_t n = std::min<int64_t>(1024, src.cols - c0);
      to_f32(dst.at(r, c0), dst.dtype, a, n);
      to_f32(src.at(r, c0), src.dtype, b, n);
      for (int64_t c = 0; c < n; ++c) a[c] += b[c];
      from_f32(a, dst.at(r, c0), dst.dtype, n);
    }
}

void add_transposed(const Mat& dst, const Mat& src, float beta) {
  // Blocks of 32 x 32 keep both sides in cache.
  for (int64_t r0 = 0; r0 < dst.rows; r0 += 32)
    for (int64_t c0 = 0; c0 < dst.cols; c0 += 32)
      for (int64_t r = r0; r < std::min(dst.rows, r0 + 32); ++r) {
        float* d = static_cast<float*>(dst.at(r, 0));
        for (int64_t c = c0; c < std::min(dst.cols, c0 + 32); ++c) {
          const float v = *static_cast<const float*>(src.at(c, r));
          d[c] = beta == 0.0f ? v : beta * d[c] + v;
        }
      }
}

double sum_squares(const Mat& x) {
  // Four fp64 partial sums (a fixed order, so the result is deterministic) vectorise.
  double acc[4] = {0, 0, 0, 0};
  for (int64_t r = 0; r < x.rows; ++r) {
    const float* p = static_cast<const float*>(x.at(r, 0));
    int64_t c = 0;
    for (; c + 4 <= x.cols; c += 4)
      for (int k = 0; k < 4; ++k) acc[k] += double(p[c + k]) * double(p[c + k]);
    for (; c < x.cols; ++c) acc[0] += double(p[c]) * double(p[c]);
  }
  return (acc[0] + acc[1]) + (acc[2] + acc[3]);
}

void adamw(const Mat& w, const Mat& g, const Mat& m, const Mat& v, const AdamWArgs& a) {
  const double bc1 = 1.0 - std::pow(a.beta1, double(a.step));
  const double bc2 = 1.0 - std::pow(a.beta2, double(a.step));
  const float decay = float(1.0 - a.lr * a.weight_decay), b1 = float(a.beta1),
              b2 = float(a.beta2), gs = float(a.grad_scale), step = float(a.lr / bc1),
              inv_bc2_sqrt = float(1.0 / std::sqrt(bc2)), eps = float(a.eps);
  for (int64_t r = 0; r < w.rows; ++r) {
    float* pw = static_cast<float*>(w.at(r, 0));
    const float* pg = static_cast<const float*>(g.at(r, 0));
    float* pm = static_cast<float*>(m.at(r, 0));
    float* pv = static_cast<float*>(v.at(r, 0));
    for (int64_t c = 0; c < w.cols; ++c) {
      const float gr = gs * pg[c];
      const float mm = b1 * pm[c] + (1.0f - b1) * gr;
      const float vv = b2 * pv[c] + (1.0f - b2) * gr * gr;
      pm[c] = mm;
      pv[c] = vv;
      pw[c] = pw[c] * decay - step * mm / (std::sqrt(vv) * inv_bc2_sqrt + eps);
    }
  }
}

}  // namespace upipe::cpu
