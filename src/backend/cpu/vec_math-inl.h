// Small vector math of the CPU kernels, written once with Google Highway and compiled per target
// (AVX2: 8 fp32 lanes, AVX-512: 16): exp, sigmoid, masked chunks of a row, bf16 <-> fp32, and
// lane reductions. A reduction's lane order is fixed for a target (a row's sum never depends on
// what else is computed or on its alignment), so fp32 results are deterministic per path.
//
// Per-target header for files that include hwy/foreach_target.h: the toggle guard lets it be
// included once per target.
#if defined(UPIPE_BACKEND_CPU_VEC_MATH_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef UPIPE_BACKEND_CPU_VEC_MATH_INL_H_
#undef UPIPE_BACKEND_CPU_VEC_MATH_INL_H_
#else
#define UPIPE_BACKEND_CPU_VEC_MATH_INL_H_
#endif

#include <hwy/highway.h>

#include <cstdint>

HWY_BEFORE_NAMESPACE();
namespace upipe::cpu {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

using DF = hn::ScalableTag<float>;
using VF = hn::Vec<DF>;
using DU32 = hn::RebindToUnsigned<DF>;
using DI32 = hn::RebindToSigned<DF>;
// bf16 values of one fp32 vector (half width), as raw uint16.
using DBF = hn::Rebind<uint16_t, DF>;
constexpr int kLanes = int(HWY_LANES(float));

// exp(x) for x <= 0 up to ~88 in magnitude: t = x log2(e) split into n + r with |r| <= 1/2, 2^r by
// a degree-6 minimax polynomial (<= 1.3 ulp on its range), 2^n added to the exponent bits. The
// rounding of t adds a relative error of about eps |x|, the size of that of forming x itself.
// t is clamped to [-126, 126]: exp(-inf) is ~1e-38, never used (callers zero masked entries).
HWY_INLINE VF exp_v(VF x) {
  const DF d;
  VF t = hn::Mul(x, hn::Set(d, 1.44269504088896341f));
  t = hn::Min(hn::Max(t, hn::Set(d, -126.0f)), hn::Set(d, 126.0f));
  const VF n = hn::Round(t);
  const VF r = hn::Sub(t, n);
  VF p = hn::Set(d, 1.535336341e-4f);
  p = hn::MulAdd(p, r, hn::Set(d, 1.339887618e-3f));
  p = hn::MulAdd(p, r, hn::Set(d, 9.618436917e-3f));
  p = hn::MulAdd(p, r, hn::Set(d, 5.550332367e-2f));
  p = hn::MulAdd(p, r, hn::Set(d, 2.402264774e-1f));
  p = hn::MulAdd(p, r, hn::Set(d, 6.931471825e-1f));
  p = hn::MulAdd(p, r, hn::Set(d, 1.0f));
  const DI32 di;
  const auto e = hn::ShiftLeft<23>(hn::ConvertTo(di, n));
  return hn::BitCast(d, hn::Add(hn::BitCast(di, p), e));
}

// sigmoid(x) = 1 / (1 + exp(-x)), finite for every x because exp_v clamps its argument.
HWY_INLINE VF sigmoid_v(VF x) {
  const DF d;
  const VF one = hn::Set(d, 1.0f);
  return hn::Div(one, hn::Add(one, exp_v(hn::Neg(x))));
}

HWY_INLINE float sum_lanes(VF v) {
  return hn::GetLane(hn::SumOfLanes(DF(), v));
}
HWY_INLINE float max_lanes(VF v) {
  return hn::GetLane(hn::MaxOfLanes(DF(), v));
}

// kLanes bf16 values (raw uint16) widened to fp32, and fp32 rounded to bf16 (nearest even, NaN
// kept a quiet NaN), as f32_to_bf16 in core/dtype.h does for one value.
HWY_INLINE VF load_bf16(const uint16_t* p) {
  const DF d;
  const DU32 du;
  return hn::BitCast(d, hn::ShiftLeft<16>(hn::PromoteTo(du, hn::LoadU(DBF(), p))));
}
// The first n of them, reading only those n (a row's tail may end at its buffer's end, where a
// full load would read past it: AddressSanitizer caught that on an odd d): through a zeroed copy.
HWY_INLINE VF load_bf16_n(const uint16_t* p, size_t n) {
  alignas(64) uint16_t tmp[kLanes] = {};
  for (size_t i = 0; i < n; ++i) tmp[i] = p[i];
  return load_bf16(tmp);
}
HWY_INLINE hn::Vec<DU32> round_bf16_bits(VF x) {
  const DF d;
  const DU32 du;
  const auto u = hn::BitCast(du, x);
  const auto lsb = hn::And(hn::ShiftRight<16>(u), hn::Set(du, 1u));
  const auto rounded = hn::ShiftRight<16>(hn::Add(u, hn::Add(hn::Set(du, 0x7fffu), lsb)));
  const auto quiet = hn::Or(hn::ShiftRight<16>(u), hn::Set(du, 0x40u));
  const auto is_nan = hn::RebindMask(du, hn::IsNaN(x));
  (void)d;
  return hn::IfThenElse(is_nan, quiet, rounded);
}
// The bf16 bits (at most 0xffff) narrowed to uint16 lanes; Highway narrows from int32.
HWY_INLINE hn::Vec<DBF> bf16_of(VF x) {
  return hn::DemoteTo(DBF(), hn::BitCast(DI32(), round_bf16_bits(x)));
}
HWY_INLINE void store_bf16(VF x, uint16_t* p) {
  hn::StoreU(bf16_of(x), DBF(), p);
}
HWY_INLINE void store_bf16_n(VF x, uint16_t* p, size_t n) {
  const DBF db;
  const auto h = bf16_of(x);
  alignas(64) uint16_t tmp[kLanes];
  hn::Store(h, db, tmp);
  for (size_t i = 0; i < n; ++i) p[i] = tmp[i];
}
// x rounded to bf16 and widened back: the value a bf16 store would keep.
HWY_INLINE VF to_bf16_precision(VF x) {
  return hn::BitCast(DF(), hn::ShiftLeft<16>(round_bf16_bits(x)));
}

// One vector of consecutive floats at offset c of a row, or the fewer that remain at its end
// (the masked load reads zeros there and the masked store leaves the memory alone).
struct Chunk {
  int64_t c;
  int64_t n;  // lanes in use, kLanes when full
  bool full() const { return n == kLanes; }
  VF load(const float* row) const {
    const DF d;
    return full() ? hn::LoadU(d, row + c) : hn::MaskedLoad(hn::FirstN(d, size_t(n)), d, row + c);
  }
  void store(float* row, VF x) const {
    const DF d;
    if (full())
      hn::StoreU(x, d, row + c);
    else
      hn::BlendedStore(x, hn::FirstN(d, size_t(n)), d, row + c);
  }
  // x in the chunk's lanes, `fill` in the lanes past the row's end.
  VF select(VF x, VF fill) const {
    return full() ? x : hn::IfThenElse(hn::FirstN(DF(), size_t(n)), x, fill);
  }
};

// Calls f(Chunk) over [0, n) in order: full chunks, then the masked tail.
template <class F>
HWY_INLINE void for_chunks(int64_t n, F&& f) {
  int64_t c = 0;
  for (; c + kLanes <= n; c += kLanes) f(Chunk{c, kLanes});
  if (c < n) f(Chunk{c, n - c});
}

// n fp32 values from a buffer of dtype `bf16 ? bf16 : fp32` (the conversions of the kernels).
HWY_INLINE void widen_row(const void* src, bool bf16, float* dst, int64_t n) {
  if (!bf16) {
    const float* s = static_cast<const float*>(src);
    for_chunks(n, [&](const Chunk& k) HWY_ATTR { k.store(dst, k.load(s)); });
    return;
  }
  const uint16_t* s = static_cast<const uint16_t*>(src);
  for_chunks(n, [&](const Chunk& k) HWY_ATTR {
    k.store(dst, k.full() ? load_bf16(s + k.c) : load_bf16_n(s + k.c, size_t(k.n)));
  });
}
HWY_INLINE void narrow_row(const float* src, void* dst, bool bf16, int64_t n) {
  if (!bf16) {
    float* d = static_cast<float*>(dst);
    for_chunks(n, [&](const Chunk& k) HWY_ATTR { k.store(d, k.load(src)); });
    return;
  }
  uint16_t* d = static_cast<uint16_t*>(dst);
  for_chunks(n, [&](const Chunk& k) HWY_ATTR {
    if (k.full())
      store_bf16(k.load(src), d + k.c);
    else
      store_bf16_n(k.load(src), d + k.c, size_t(k.n));
  });
}

}  // namespace HWY_NAMESPACE
}  // namespace upipe::cpu
HWY_AFTER_NAMESPACE();

#endif  // toggle guard
