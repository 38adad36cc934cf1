// CPU implementations of RoPE, RMSNorm (whole rows or per head), SwiGLU, cross-entropy, AdamW and
// the elementwise data-movement ops, written once with Highway, compiled per vector target by
// foreach_target and dispatched at run time (cpu_isa.h). fp32 rows are read and written in
// place; bf16 ones go through fp32 rows (workspace or stack), rounded once when stored.
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "backend/cpu/elementwise_cpu.cpp"
#include <hwy/foreach_target.h>  // IWYU pragma: keep
//
#include <hwy/cache_control.h>
#include <hwy/highway.h>

#include <algorithm>
#include <cmath>
#include <cstring>

#include "backend/cpu/cpu_isa.h"
#include "backend/cpu/cpu_ops.h"
#include "backend/cpu/rope_angles.h"
#include "backend/cpu/vec_math-inl.h"

HWY_BEFORE_NAMESPACE();
namespace upipe::cpu {
namespace HWY_NAMESPACE {
namespace {

bool is_bf16(const Mat& x) {
  return x.dtype == DType::kBF16;
}

// The n values at (r, c0) of x as fp32: in place for an fp32 view, else staged in buf.
const float* f32_at(const Mat& x, int64_t r, int64_t c0, int64_t n, float* buf) {
  if (!is_bf16(x)) return static_cast<const float*>(x.at(r, c0));
  widen_row(x.at(r, c0), true, buf, n);
  return buf;
}
// Where the n output values at (r, c0) of x are computed: in place for fp32, else in buf, which
// store_at then rounds into x.
float* out_at(const Mat& x, int64_t r, int64_t c0, float* buf) {
  return is_bf16(x) ? buf : static_cast<float*>(x.at(r, c0));
}
void store_at(const Mat& x, int64_t r, int64_t c0, int64_t n, const float* buf) {
  if (is_bf16(x)) narrow_row(buf, x.at(r, c0), true, n);
}

// RMSNorm reads a row segment twice (its reductions, then the output) but from memory only in
// the first pass; these prefetches keep memory as busy as a copy's interleaved reads and writes:
// the first pass asks for the output's lines in the exclusive state (prefetchw, where the CPU
// has it), the second reads the next segment's inputs into L2 ahead of its first pass.
// next_segment is where the step after (r, c0) of a walk over groups of n columns starts (null
// after the last one).
const char* next_segment(const Mat& x, int64_t r, int64_t c0, int64_t n) {
  if (c0 + n < x.cols) return static_cast<const char*>(x.at(r, c0 + n));
  return r + 1 < x.rows ? static_cast<const char*>(x.at(r + 1, 0)) : nullptr;
}
// The line of chunk k of a segment of x starting at seg, to be read; the line of chunk k of the
// segment (r, c0) of x, to be written.
HWY_INLINE void prefetch_chunk(const char* seg, const Mat& x, const Chunk& k) {
  if (seg) _mm_prefetch(seg + k.c * dtype_size(x.dtype), _MM_HINT_T1);
}
HWY_INLINE void prefetch_chunk_w(const Mat& x, int64_t r, int64_t c0, const Chunk& k, bool have) {
  const char* p = static_cast<const char*>(x.at(r, c0 + k.c));
  if (have) asm volatile("prefetchw %0" : : "m"(*p));
}

// Rows of at most kRow values on the stack, for the ops that have no workspace.
constexpr int64_t kRow = 1024;

}  // namespace

void rope_t(const Mat& x, int d, const RowPositions& pos, const RopeParams& rp, int sign) {
  const DF df;
  const int half = d / 2;
  const int64_t heads = x.cols / d;
  RopeAngles angles(half, rp.inv_freq(d));
  float cs[512], sn[512], a[512], b[512];
  int64_t r = 0;
  for (const RowPositions::Run& run : pos.runs)
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
        widen_row(base, is_bf16(x), a, half);
        widen_row(second, is_bf16(x), b, half);
        for_chunks(half, [&](const Chunk& k) HWY_ATTR {
          const VF va = k.load(a), vb = k.load(b), c = k.load(cs), s = k.load(sn);
          k.store(a, hn::Sub(hn::Mul(va, c), hn::Mul(vb, s)));
          k.store(b, hn::Add(hn::Mul(vb, c), hn::Mul(va, s)));
        });
        narrow_row(a, base, is_bf16(x), half);
        narrow_row(b, second, is_bf16(x), half);
      }
    }
  (void)df;
}

// x (rows, cols) is normalised over each `group`-wide column group; ws: 3 group floats.
void rmsnorm_forward_t(const Mat& x, const Mat& w, int64_t group, float eps, const Mat& y,
                       float* ws) {
  const DF df;
  float* row = ws;
  float* wf = row + group;
  widen_row(w.at(0, 0), is_bf16(w), wf, group);
  const int64_t n = group;
  const bool pw = cpu_has_prefetchw();
  for (int64_t r = 0; r < x.rows; ++r)
    for (int64_t c0 = 0; c0 < x.cols; c0 += n) {
      const float* xr = f32_at(x, r, c0, n, row);
      float* yr = out_at(y, r, c0, row);
      VF vss = hn::Zero(df);
      for_chunks(n, [&](const Chunk& k) HWY_ATTR {
        prefetch_chunk_w(y, r, c0, k, pw);
        const VF v = k.load(xr);
        vss = hn::MulAdd(v, v, vss);
      });
      const VF vinv = hn::Set(df, 1.0f / std::sqrt(sum_lanes(vss) / float(n) + eps));
      const char* next = next_segment(x, r, c0, n);
      for_chunks(n, [&](const Chunk& k) HWY_ATTR {
        prefetch_chunk(next, x, k);
        k.store(yr, hn::Mul(hn::Mul(k.load(xr), vinv), k.load(wf)));
      });
      store_at(y, r, c0, n, yr);
    }
}

void rmsnorm_backward_t(const Mat& x, const Mat& w, int64_t group, float eps, const Mat& dy,
                        const Mat& dx, const Mat& dw, float* ws) {
  const DF df;
  float* xbuf = ws;
  float* gbuf = xbuf + group;
  float* wf = gbuf + group;
  widen_row(w.at(0, 0), is_bf16(w), wf, group);
  float* dwp = dw.f32();
  const int64_t n = group;
  const bool pw = cpu_has_prefetchw();
  for (int64_t r = 0; r < x.rows; ++r)
    for (int64_t c0 = 0; c0 < x.cols; c0 += n) {
      // dx may be dy (in place): each element of gr is read before dxr's is written.
      const float* xr = f32_at(x, r, c0, n, xbuf);
      const float* gr = f32_at(dy, r, c0, n, gbuf);
      float* dxr = out_at(dx, r, c0, gbuf);
      VF vss = hn::Zero(df), vdot = hn::Zero(df);
      for_chunks(n, [&](const Chunk& k) HWY_ATTR {
        prefetch_chunk_w(dx, r, c0, k, pw);
        const VF xv = k.load(xr);
        vss = hn::MulAdd(xv, xv, vss);
        vdot = hn::MulAdd(hn::Mul(k.load(wf), k.load(gr)), xv, vdot);
      });
      const float inv = 1.0f / std::sqrt(sum_lanes(vss) / float(n) + eps);
      const VF vinv = hn::Set(df, inv),
               vk = hn::Set(df, sum_lanes(vdot) * inv * inv * inv / float(n));
      const char *next_x = next_segment(x, r, c0, n), *next_g = next_segment(dy, r, c0, n);
      for_chunks(n, [&](const Chunk& k) HWY_ATTR {
        prefetch_chunk(next_x, x, k);
        prefetch_chunk(next_g, dy, k);
        const VF xv = k.load(xr), gv = k.load(gr);
        k.store(dwp, hn::MulAdd(hn::Mul(gv, xv), vinv, k.load(dwp)));
        k.store(dxr, hn::MulSub(hn::Mul(k.load(wf), gv), vinv, hn::Mul(xv, vk)));
      });
      store_at(dx, r, c0, n, dxr);
    }
}

// Max-subtracted log-sum-exp: exp_v in fp32, the row sum in fp64 lanes in a fixed order. Three
// passes over a row (max; exp and sum; scale) while it sits in cache.
double cross_entropy_t(const Mat& logits, const int32_t* labels, float scale) {
  const DF df;
  const hn::Repartition<double, DF> dd;
  const hn::Half<DF> dh;
  const int64_t v = logits.cols;
  const VF neg_inf = hn::Set(df, -INFINITY);
  double loss = 0;
  for (int64_t r = 0; r < logits.rows; ++r) {
    float* row = static_cast<float*>(logits.at(r, 0));
    const int32_t label = labels[r];
    if (label < 0) {
      std::fill_n(row, v, 0.0f);
      continue;
    }
    VF vmax = neg_inf;
    for_chunks(
        v, [&](const Chunk& k) HWY_ATTR { vmax = hn::Max(vmax, k.select(k.load(row), neg_inf)); });
    const float m = max_lanes(vmax);
    const float target = row[label];
    const VF vm = hn::Set(df, m);
    auto sum_lo = hn::Zero(dd), sum_hi = hn::Zero(dd);
    for_chunks(v, [&](const Chunk& k) HWY_ATTR {
      const VF e = k.select(exp_v(hn::Sub(k.load(row), vm)), hn::Zero(df));
      k.store(row, e);
      sum_lo = hn::Add(sum_lo, hn::PromoteTo(dd, hn::LowerHalf(dh, e)));
      sum_hi = hn::Add(sum_hi, hn::PromoteTo(dd, hn::UpperHalf(dh, e)));
    });
    const double sum = hn::GetLane(hn::SumOfLanes(dd, hn::Add(sum_lo, sum_hi)));
    loss += double(m) + std::log(sum) - double(target);
    const VF p = hn::Set(df, float(double(scale) / sum));
    for_chunks(v, [&](const Chunk& k) HWY_ATTR { k.store(row, hn::Mul(k.load(row), p)); });
    row[label] -= scale;
  }
  return loss;
}

void swiglu_forward_t(const Mat& a, const Mat& b, const Mat& h, float* ws) {
  for (int64_t r = 0; r < a.rows; ++r) {
    const float* ar = f32_at(a, r, 0, a.cols, ws);
    const float* br = f32_at(b, r, 0, a.cols, ws + a.cols);
    float* hr = out_at(h, r, 0, ws + 2 * a.cols);
    for_chunks(a.cols, [&](const Chunk& k) HWY_ATTR {
      const VF x = k.load(ar);
      k.store(hr, hn::Mul(hn::Mul(x, sigmoid_v(x)), k.load(br)));
    });
    store_at(h, r, 0, a.cols, hr);
  }
}

void swiglu_backward_t(const Mat& a, const Mat& b, const Mat& dh, const Mat& da, const Mat& db,
                       float* ws) {
  const VF one = hn::Set(DF(), 1.0f);
  for (int64_t r = 0; r < a.rows; ++r) {
    // da and db may be written over a's and b's staged rows: each chunk is read before written.
    const float* ar = f32_at(a, r, 0, a.cols, ws);
    const float* br = f32_at(b, r, 0, a.cols, ws + a.cols);
    const float* gr = f32_at(dh, r, 0, a.cols, ws + 2 * a.cols);
    float* dar = out_at(da, r, 0, ws);
    float* dbr = out_at(db, r, 0, ws + a.cols);
    for_chunks(a.cols, [&](const Chunk& k) HWY_ATTR {
      const VF x = k.load(ar), y = k.load(br), g = k.load(gr), sg = sigmoid_v(x);
      // da = g b sg (1 + x (1 - sg)), db = g x sg, in the order of the scalar reference.
      const VF dsilu = hn::Add(one, hn::Mul(x, hn::Sub(one, sg)));
      k.store(dar, hn::Mul(hn::Mul(hn::Mul(g, y), sg), dsilu));
      k.store(dbr, hn::Mul(hn::Mul(g, x), sg));
    });
    store_at(da, r, 0, a.cols, dar);
    store_at(db, r, 0, a.cols, dbr);
  }
}

void fill_t(const Mat& x, float value) {
  if (value == 0.0f) {
    for (int64_t r = 0; r < x.rows; ++r)
      std::memset(x.at(r, 0), 0, size_t(x.cols * dtype_size(x.dtype)));
    return;
  }
  float row[kRow];
  std::fill_n(row, kRow, value);
  for (int64_t r = 0; r < x.rows; ++r)
    for (int64_t c0 = 0; c0 < x.cols; c0 += kRow)
      narrow_row(row, x.at(r, c0), is_bf16(x), std::min(kRow, x.cols - c0));
}

void convert_t(const Mat& dst, const Mat& src) {
  if (dst.dtype == src.dtype) {
    for (int64_t r = 0; r < src.rows; ++r)
      std::memcpy(dst.at(r, 0), src.at(r, 0), size_t(src.cols * dtype_size(src.dtype)));
    return;
  }
  if (!is_bf16(src)) {
    for (int64_t r = 0; r < src.rows; ++r)
      narrow_row(static_cast<const float*>(src.at(r, 0)), dst.at(r, 0), true, src.cols);
    return;
  }
  for (int64_t r = 0; r < src.rows; ++r)
    widen_row(src.at(r, 0), true, static_cast<float*>(dst.at(r, 0)), src.cols);
}

void add_into_t(const Mat& dst, const Mat& src) {
  if (!is_bf16(dst) && !is_bf16(src)) {
    for (int64_t r = 0; r < src.rows; ++r) {
      float* d = static_cast<float*>(dst.at(r, 0));
      const float* s = static_cast<const float*>(src.at(r, 0));
      for_chunks(src.cols,
                 [&](const Chunk& k) HWY_ATTR { k.store(d, hn::Add(k.load(d), k.load(s))); });
    }
    return;
  }
  // Other dtypes through fp32 chunks: one rounding of the sum into dst.
  float a[kRow], b[kRow];
  for (int64_t r = 0; r < src.rows; ++r)
    for (int64_t c0 = 0; c0 < src.cols; c0 += kRow) {
      const int64_t n = std::min(kRow, src.cols - c0);
      widen_row(dst.at(r, c0), is_bf16(dst), a, n);
      widen_row(src.at(r, c0), is_bf16(src), b, n);
      for_chunks(n, [&](const Chunk& k) HWY_ATTR { k.store(a, hn::Add(k.load(a), k.load(b))); });
      narrow_row(a, dst.at(r, c0), is_bf16(dst), n);
    }
}

void add_transposed_t(const Mat& dst, const Mat& src, float beta) {
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

// fp64 lanes in a fixed order, so the result is deterministic for the target.
double sum_squares_t(const Mat& x) {
  const DF df;
  const hn::Repartition<double, DF> dd;
  const hn::Half<DF> dh;
  auto lo = hn::Zero(dd), hi = hn::Zero(dd);
  for (int64_t r = 0; r < x.rows; ++r) {
    const float* p = static_cast<const float*>(x.at(r, 0));
    for_chunks(x.cols, [&](const Chunk& k) HWY_ATTR {
      const VF v = k.select(k.load(p), hn::Zero(df));
      const auto a = hn::PromoteTo(dd, hn::LowerHalf(dh, v)),
                 b = hn::PromoteTo(dd, hn::UpperHalf(dh, v));
      lo = hn::MulAdd(a, a, lo);
      hi = hn::MulAdd(b, b, hi);
    });
  }
  return hn::GetLane(hn::SumOfLanes(dd, hn::Add(lo, hi)));
}

void adamw_t(const Mat& w, const Mat& g, const Mat& m, const Mat& v, const AdamWArgs& a) {
  const DF df;
  const double bc1 = 1.0 - std::pow(a.beta1, double(a.step));
  const double bc2 = 1.0 - std::pow(a.beta2, double(a.step));
  const VF decay = hn::Set(df, float(1.0 - a.lr * a.weight_decay)),
           b1 = hn::Set(df, float(a.beta1)), b2 = hn::Set(df, float(a.beta2)),
           c1 = hn::Set(df, 1.0f - float(a.beta1)), c2 = hn::Set(df, 1.0f - float(a.beta2)),
           gs = hn::Set(df, float(a.grad_scale)), step = hn::Set(df, float(a.lr / bc1)),
           inv_bc2_sqrt = hn::Set(df, float(1.0 / std::sqrt(bc2))), eps = hn::Set(df, float(a.eps));
  for (int64_t r = 0; r < w.rows; ++r) {
    float* pw = static_cast<float*>(w.at(r, 0));
    const float* pg = static_cast<const float*>(g.at(r, 0));
    float* pm = static_cast<float*>(m.at(r, 0));
    float* pv = static_cast<float*>(v.at(r, 0));
    for_chunks(w.cols, [&](const Chunk& k) HWY_ATTR {
      const VF gr = hn::Mul(gs, k.load(pg));
      const VF mm = hn::Add(hn::Mul(b1, k.load(pm)), hn::Mul(c1, gr));
      const VF vv = hn::Add(hn::Mul(b2, k.load(pv)), hn::Mul(hn::Mul(c2, gr), gr));
      k.store(pm, mm);
      k.store(pv, vv);
      const VF den = hn::Add(hn::Mul(hn::Sqrt(vv), inv_bc2_sqrt), eps);
      k.store(pw, hn::Sub(hn::Mul(k.load(pw), decay), hn::Div(hn::Mul(step, mm), den)));
    });
  }
}

int64_t vector_target_t() {
  return HWY_TARGET;
}

}  // namespace HWY_NAMESPACE
}  // namespace upipe::cpu
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace upipe::cpu {

HWY_EXPORT(rope_t);
HWY_EXPORT(rmsnorm_forward_t);
HWY_EXPORT(rmsnorm_backward_t);
HWY_EXPORT(cross_entropy_t);
HWY_EXPORT(swiglu_forward_t);
HWY_EXPORT(swiglu_backward_t);
HWY_EXPORT(fill_t);
HWY_EXPORT(convert_t);
HWY_EXPORT(add_into_t);
HWY_EXPORT(add_transposed_t);
HWY_EXPORT(sum_squares_t);
HWY_EXPORT(adamw_t);
HWY_EXPORT(vector_target_t);

// Each entry point makes sure the path is chosen (cpu_isa), then calls the chosen target's code.
void rope(const Mat& x, int d, const RowPositions& pos, const RopeParams& rp, int sign) {
  cpu_isa();
  HWY_DYNAMIC_DISPATCH(rope_t)(x, d, pos, rp, sign);
}
void rmsnorm_forward(const Mat& x, const Mat& w, int64_t group, float eps, const Mat& y,
                     float* ws) {
  cpu_isa();
  HWY_DYNAMIC_DISPATCH(rmsnorm_forward_t)(x, w, group, eps, y, ws);
}
void rmsnorm_backward(const Mat& x, const Mat& w, int64_t group, float eps, const Mat& dy,
                      const Mat& dx, const Mat& dw, float* ws) {
  cpu_isa();
  HWY_DYNAMIC_DISPATCH(rmsnorm_backward_t)(x, w, group, eps, dy, dx, dw, ws);
}
double cross_entropy(const Mat& logits, std::span<const int32_t> labels, float scale) {
  cpu_isa();
  return HWY_DYNAMIC_DISPATCH(cross_entropy_t)(logits, labels.data(), scale);
}
void swiglu_forward(const Mat& a, const Mat& b, const Mat& h, float* ws) {
  cpu_isa();
  HWY_DYNAMIC_DISPATCH(swiglu_forward_t)(a, b, h, ws);
}
void swiglu_backward(const Mat& a, const Mat& b, const Mat& dh, const Mat& da, const Mat& db,
                     float* ws) {
  cpu_isa();
  HWY_DYNAMIC_DISPATCH(swiglu_backward_t)(a, b, dh, da, db, ws);
}
void fill(const Mat& x, float value) {
  cpu_isa();
  HWY_DYNAMIC_DISPATCH(fill_t)(x, value);
}
void convert(const Mat& dst, const Mat& src) {
  cpu_isa();
  HWY_DYNAMIC_DISPATCH(convert_t)(dst, src);
}
void add_into(const Mat& dst, const Mat& src) {
  cpu_isa();
  HWY_DYNAMIC_DISPATCH(add_into_t)(dst, src);
}
void add_transposed(const Mat& dst, const Mat& src, float beta) {
  cpu_isa();
  HWY_DYNAMIC_DISPATCH(add_transposed_t)(dst, src, beta);
}
double sum_squares(const Mat& x) {
  cpu_isa();
  return HWY_DYNAMIC_DISPATCH(sum_squares_t)(x);
}
void adamw(const Mat& w, const Mat& g, const Mat& m, const Mat& v, const AdamWArgs& a) {
  cpu_isa();
  HWY_DYNAMIC_DISPATCH(adamw_t)(w, g, m, v, a);
}

}  // namespace upipe::cpu

namespace upipe {

std::string cpu_vector_target() {
  cpu_isa();
  return hwy::TargetName(HWY_DYNAMIC_DISPATCH(cpu::vector_target_t)());
}

}  // namespace upipe
#endif  // HWY_ONCE
