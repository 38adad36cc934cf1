// Per-element and per-row math of the CUDA backend's own kernels (elementwise_cuda.cu), and the
// fixed partitions of their reductions. nvcc compiles it for the kernels, the host compiler for
// tests/unit/test_cuda_math.cpp, which checks every function against src/backend/reference/ and
// emulates each kernel's reduction order with the constants and rules below. The kernels are
// compiled with -fmad=false and use fmaf only where written here, and the test with
// -ffp-contract=off, so arithmetic made of + - * / sqrt and fma gives the same bits on both sides
// (exp, log, sin and cos differ in the last bits between libm and CUDA's library).
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

#include "backend/cuda/bf16.h"
#include "backend/cuda/hd.h"

namespace upipe::cuda {

UPIPE_HD float neg_inf() {
  return bits_f32(0xff800000u);
}

// ---- one fixed reduction order for a block's row sums ----

// A row of n terms summed by a block of L lanes (L a power of two): lane t adds terms t, t + L,
// t + 2L, ... in increasing order starting from 0, then the lanes are combined as a tree, stride
// L/2 first: lane t += lane t + s for t < s. The kernels run it in shared memory, the test
// sequentially; both give the same bits. kRowThreads is the lane count of every row kernel
// (rmsnorm, cross-entropy, sum_squares' blocks); attention_delta sums a head over a warp.
constexpr int kRowThreads = 256;
constexpr int kWarp = 32;

// ---- SiLU / SwiGLU (reference: elementwise_ref.h swiglu_*, the CPU's operation order) ----

UPIPE_HD float sigmoid(float x) {
  return 1.0f / (1.0f + expf(-x));
}
UPIPE_HD float silu(float x) {
  return x * sigmoid(x);
}
// h = silu(a) * b.
UPIPE_HD float swiglu(float a, float b) {
  return silu(a) * b;
}
struct SwigluGrad {
  float da, db;
};
// da = g b sg (1 + a (1 - sg)), db = g a sg, for dh = g.
UPIPE_HD SwigluGrad swiglu_grad(float a, float b, float g) {
  const float sg = sigmoid(a);
  const float dsilu = 1.0f + a * (1.0f - sg);
  return {((g * b) * sg) * dsilu, (g * a) * sg};
}

// ---- RMSNorm over `group`-wide column groups (a unit: one row's one group) ----

// Lane step of the row sums: sum x^2 and sum (w dy) x.
UPIPE_HD float rms_ss_step(float acc, float x) {
  return fmaf(x, x, acc);
}
UPIPE_HD float rms_dot_step(float acc, float x, float w, float g) {
  return fmaf(w * g, x, acc);
}
// 1 / sqrt(mean(x^2) + eps) from the unit's sum of squares over n values.
UPIPE_HD float rms_inv(float ss, int64_t n, float eps) {
  return 1.0f / sqrtf(ss / float(n) + eps);
}
UPIPE_HD float rms_y(float x, float inv, float w) {
  return (x * inv) * w;
}
// dx = (w g) inv - x k with k = dot inv^3 / n (reference: rmsnorm_backward).
UPIPE_HD float rms_k(float dot, float inv, int64_t n) {
  return dot * inv * inv * inv / float(n);
}
UPIPE_HD float rms_dx(float x, float w, float g, float inv, float k) {
  return fmaf(w * g, inv, -(x * k));
}
// dw's partial of one column: acc + g x inv.
UPIPE_HD float rms_dw_step(float acc, float x, float g, float inv) {
  return fmaf(g * x, inv, acc);
}

// dw's fixed partition: the backward runs exactly kRmsDwBlocks blocks; block b takes the units
// u = b, b + kRmsDwBlocks, ... (unit u: row u / (cols / group), group u % (cols / group)) in
// increasing order and keeps its column partials in workspace row b (group floats, from 0); then
// dw[c] += ((p_0[c] + p_1[c]) + p_2[c]) + ... over b in increasing order. The bytes depend on
// group only; the forward uses none of them. 1024 blocks of 256 threads fill a GPU of ~128 SMs
// at 8 resident blocks each (an H200: 132); QK-norm's units are small (one head's d columns), so
// the backward is latency-bound and its time is units / blocks iterations.
constexpr int kRmsDwBlocks = 1024;
UPIPE_HD int rms_dw_block(int64_t unit) {
  return int(unit % kRmsDwBlocks);
}
constexpr int64_t rms_workspace_bytes(int64_t group) {
  return int64_t(kRmsDwBlocks) * group * 4;
}

// ---- AdamW (backend.h AdamWArgs: PyTorch's torch.optim.AdamW) ----

// The step's scalars, formed on the host in fp64 and rounded once to fp32.
struct AdamWConsts {
  float decay;      // 1 - lr wd
  float b1, c1;     // beta1, 1 - beta1
  float b2, c2;     // beta2, 1 - beta2
  float gs;         // grad_scale
  float step_size;  // lr / (1 - beta1^t)
  float bc2_sqrt;   // sqrt(1 - beta2^t)
  float eps;
};
inline AdamWConsts adamw_consts(double lr, double beta1, double beta2, double eps,
                                double weight_decay, double grad_scale, int64_t step) {
  const double bc1 = 1.0 - std::pow(beta1, double(step));
  const double bc2 = 1.0 - std::pow(beta2, double(step));
  return {float(1.0 - lr * weight_decay),
          float(beta1),
          float(1.0 - beta1),
          float(beta2),
          float(1.0 - beta2),
          float(grad_scale),
          float(lr / bc1),
          float(std::sqrt(bc2)),
          float(eps)};
}
// w = w (1 - lr wd); g' = gs g; m = b1 m + (1 - b1) g'; v = b2 v + (1 - b2) g'^2;
// w -= step_size * (m / (sqrt(v) / bc2_sqrt + eps)), PyTorch's operation order.
UPIPE_HD void adamw_update(const AdamWConsts& k, float& w, float g, float& m, float& v) {
  const float gr = k.gs * g;
  m = k.b1 * m + k.c1 * gr;
  v = k.b2 * v + (k.c2 * gr) * gr;
  const float den = sqrtf(v) / k.bc2_sqrt + k.eps;
  w = w * k.decay - k.step_size * (m / den);
}

// ---- online softmax: finalize and the merge of two normalised partials ----

// o = acc / l, lse = m + log(l); a row with l = 0 (it saw no key) gets o = 0, lse = -inf.
UPIPE_HD float finalize_o(float acc, float l) {
  return l > 0.0f ? acc * (1.0f / l) : 0.0f;
}
UPIPE_HD float finalize_lse(float m, float l) {
  return l > 0.0f ? m + logf(l) : neg_inf();
}

// (o, lse) <- merge((o, lse), (o2, lse2)) over disjoint key sets; lse = -inf is an empty
// partial: lse2 = -inf keeps the first (also when both are empty), lse = -inf takes the second.
enum class MergeKind : uint8_t { kKeep, kTakeSecond, kMix };
struct LseMerge {
  MergeKind kind;
  float w1, w2, inv;  // kMix: o = (o w1 + o2 w2) inv
  float lse;          // the merged lse
};
UPIPE_HD LseMerge lse_merge_weights(float l1, float l2) {
  if (l2 == neg_inf()) return {MergeKind::kKeep, 1.0f, 0.0f, 1.0f, l1};
  if (l1 == neg_inf()) return {MergeKind::kTakeSecond, 0.0f, 1.0f, 1.0f, l2};
  const float mx = fmaxf(l1, l2);
  const float w1 = expf(l1 - mx), w2 = expf(l2 - mx);
  return {MergeKind::kMix, w1, w2, 1.0f / (w1 + w2), mx + logf(w1 + w2)};
}
UPIPE_HD float lse_merge_value(const LseMerge& mw, float o1, float o2) {
  if (mw.kind == MergeKind::kKeep) return o1;
  if (mw.kind == MergeKind::kTakeSecond) return o2;
  return (o1 * mw.w1 + o2 * mw.w2) * mw.inv;
}

// The online-softmax state (acc, m, l) of one row and head takes a normalised partial (o2, lse2)
// over other keys (a cuDNN forward block, attention_cudnn.cpp): m' = max(m, lse2),
// acc' = acc alpha + o2 beta, l' = l alpha + beta, with alpha = exp(m - m') (0 while the row has
// seen nothing: m = -inf) and beta = exp(lse2 - m'). A partial with lse2 = -inf (no key) keeps it.
struct PartialMerge {
  bool keep;
  float alpha, beta, m;  // the scales and the new m
};
UPIPE_HD PartialMerge partial_merge_weights(float m, float lse2) {
  if (lse2 == neg_inf()) return {true, 1.0f, 0.0f, m};
  const float mn = fmaxf(m, lse2);
  return {false, m == neg_inf() ? 0.0f : expf(m - mn), expf(lse2 - mn), mn};
}
UPIPE_HD float partial_merge_acc(const PartialMerge& w, float acc, float o2) {
  return w.keep ? acc : fmaf(acc, w.alpha, o2 * w.beta);
}
UPIPE_HD float partial_merge_l(const PartialMerge& w, float l) {
  return w.keep ? l : fmaf(l, w.alpha, w.beta);
}

// attention_delta's lane step: delta = sum_e o do over a warp's lanes (kWarp), tree-combined.
UPIPE_HD float delta_step(float acc, float o, float g) {
  return fmaf(o, g, acc);
}

// ---- cross-entropy rows (reference: the CPU's cross_entropy_t) ----

// A row with a label: m = max, sum = sum_j exp(x_j - m) in fp64 (lanes as above),
// grad_j = exp(x_j - m) * p - [j == label] scale with p = scale / sum, and its loss
// m + log(sum) - x_label in fp64. A row with label -1 becomes 0 and adds 0.
UPIPE_HD float ce_exp(float x, float m) {
  return expf(x - m);
}
UPIPE_HD float ce_p(float scale, double sum) {
  return float(double(scale) / sum);
}
UPIPE_HD float ce_grad(float x, float m, float p, bool is_label, float scale) {
  const float v = ce_exp(x, m) * p;
  return is_label ? v - scale : v;
}
UPIPE_HD double ce_row_loss(float m, double sum, float target) {
  return double(m) + log(sum) - double(target);
}
// The parameter block during one chunk of rows: `rows` int32 labels at byte 0, then `rows`
// fp64 per-row losses at byte loss_offset (8-aligned); the tile's loss is their sum in row order.
struct CeLayout {
  int64_t rows, loss_offset;
};
constexpr CeLayout ce_layout(int64_t block_bytes) {
  const int64_t rows = (block_bytes - 8) / 12;
  return {rows, (rows * 4 + 7) / 8 * 8};
}

// ---- sum of squares: fp64, a fixed grid ----

// kSumBlocks blocks of kRowThreads lanes: global lane g = b kRowThreads + t adds x_i^2 (fp64 fma)
// for the flat indices i = g, g + kSumBlocks kRowThreads, ... in increasing order; each block's
// lanes are tree-combined into partial b (written to the parameter block); the host adds the
// partials in increasing b (sum_partials). The same x gives the same bits on every GPU.
constexpr int kSumBlocks = 512;
constexpr int64_t kSumLanes = int64_t(kSumBlocks) * kRowThreads;
UPIPE_HD double sumsq_step(double acc, float x) {
  return fma(double(x), double(x), acc);
}
inline double sum_partials(const double* partials) {
  double s = 0;
  for (int b = 0; b < kSumBlocks; ++b) s += partials[b];
  return s;
}

// ---- RoPE (rotate-half; reference: elementwise_ref.h rope) ----

// cos and sign * sin of pos * inv_freq, in fp64 from the position itself (never a recurrence
// from the shard's start, so a position's rotation does not depend on the sharding), each
// rounded once to fp32.
struct RopeCs {
  float c, s;
};
UPIPE_HD RopeCs rope_cos_sin(int64_t pos, double inv_freq, int sign) {
  const double ang = double(pos) * inv_freq;
  return {float(cos(ang)), float(double(sign) * sin(ang))};
}
// (a, b) = (x1 c - x2 s, x2 c + x1 s) for the pair (x1, x2) = (x[i], x[i + d/2]).
UPIPE_HD void rope_rotate(float& a, float& b, RopeCs cs) {
  const float x1 = a, x2 = b;
  a = x1 * cs.c - x2 * cs.s;
  b = x2 * cs.c + x1 * cs.s;
}

}  // namespace upipe::cuda
