// Kernels of elementwise_cuda.h: simple grid-stride loops over strided views, one block per unit
// for the row ops, tree reductions in shared memory in elementwise_math.h's order. Compiled with
// -fmad=false (src/CMakeLists.txt) so only the fmaf of elementwise_math.h fuse, as on the host.
#include "backend/cuda/elementwise_cuda.h"

#include <cuda_runtime.h>

#include <algorithm>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/elementwise_math.h"
#include "backend/cuda/row_groups.h"

namespace upipe::cuda {
namespace {

constexpr int kThreads = 256;  // threads of the elementwise blocks
constexpr int64_t kMaxGridX = int64_t(1) << 20;
constexpr int64_t kMaxGridY = 65535;

static_assert(kRowThreads == kThreads, "row kernels and the reduction rule share the lane count");

__device__ __forceinline__ float load(const DView& v, int64_t r, int64_t c) {
  const int64_t i = r * v.ld + c;
  return v.dtype == DT::kF32 ? static_cast<const float*>(v.data)[i]
                             : bf16_to_f32(static_cast<const uint16_t*>(v.data)[i]);
}
__device__ __forceinline__ void store(const DView& v, int64_t r, int64_t c, float x) {
  const int64_t i = r * v.ld + c;
  if (v.dtype == DT::kF32)
    static_cast<float*>(v.data)[i] = x;
  else
    static_cast<uint16_t*>(v.data)[i] = f32_to_bf16(x);
}
__device__ __forceinline__ float* f32_at(const DView& v, int64_t r, int64_t c) {
  return static_cast<float*>(v.data) + r * v.ld + c;
}

__host__ __device__ int64_t cdiv(int64_t a, int64_t b) {
  return (a + b - 1) / b;
}
bool empty(const DView& v) {
  return v.rows <= 0 || v.cols <= 0;
}
void check_launch() {
  UPIPE_CUDA_CHECK(cudaGetLastError());
}

// A grid for (rows, cols) elementwise loops: blocks of kThreads columns in x, rows in y.
dim3 grid_2d(int64_t rows, int64_t cols) {
  return dim3(unsigned(std::min(cdiv(cols, kThreads), kMaxGridX)),
              unsigned(std::min(rows, kMaxGridY)));
}
// Calls f(r, c) for every element of a (rows, cols) grid laid out by grid_2d.
template <class F>
__device__ __forceinline__ void for_each_2d(int64_t rows, int64_t cols, F&& f) {
  const int64_t c0 = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t cstep = int64_t(gridDim.x) * blockDim.x;
  for (int64_t r = blockIdx.y; r < rows; r += gridDim.y)
    for (int64_t c = c0; c < cols; c += cstep) f(r, c);
}

// The tree of elementwise_math.h over kRowThreads lanes; every thread gets the total. red:
// kRowThreads values of shared memory, free again when this returns.
template <class T>
__device__ T block_sum(T v, T* red) {
  const int t = int(threadIdx.x);
  red[t] = v;
  __syncthreads();
  for (int s = kRowThreads / 2; s > 0; s >>= 1) {
    if (t < s) red[t] += red[t + s];
    __syncthreads();
  }
  const T total = red[0];
  __syncthreads();
  return total;
}
__device__ float block_max(float v, float* red) {
  const int t = int(threadIdx.x);
  red[t] = v;
  __syncthreads();
  for (int s = kRowThreads / 2; s > 0; s >>= 1) {
    if (t < s) red[t] = fmaxf(red[t], red[t + s]);
    __syncthreads();
  }
  const float total = red[0];
  __syncthreads();
  return total;
}

// ---- data movement ----

__global__ void fill_kernel(DView x, float value) {
  for_each_2d(x.rows, x.cols, [&](int64_t r, int64_t c) { store(x, r, c, value); });
}

__global__ void convert_kernel(DView dst, DView src) {
  for_each_2d(src.rows, src.cols, [&](int64_t r, int64_t c) { store(dst, r, c, load(src, r, c)); });
}

__global__ void add_into_kernel(DView dst, DView src) {
  for_each_2d(src.rows, src.cols,
              [&](int64_t r, int64_t c) { store(dst, r, c, load(dst, r, c) + load(src, r, c)); });
}

// The ids live in the parameter block (mapped host memory, read over the bus): each block reads
// what it needs once into shared memory, never once per thread.

// dst row r = table row ids[r]: blocks of columns in x, rows in y.
__global__ void gather_rows_kernel(DView dst, DView table, const int32_t* ids) {
  __shared__ int64_t row;
  const int64_t c0 = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t cstep = int64_t(gridDim.x) * blockDim.x;
  for (int64_t r = blockIdx.y; r < dst.rows; r += gridDim.y) {
    if (threadIdx.x == 0) row = ids[r];
    __syncthreads();
    for (int64_t c = c0; c < dst.cols; c += cstep) store(dst, r, c, load(table, row, c));
    __syncthreads();
  }
}

// Group g of row_groups.h (blocks of columns in x, groups in y): table row gid[g] += the group's
// src rows order[starts[g]] ... in that (ascending) order, each sum rounded into table's dtype.
// The group's rows come into shared memory kThreads at a time; every loop bound is the block's,
// so every thread reaches every barrier.
__global__ void scatter_add_rows_kernel(DView table, DView src, const int32_t* order,
                                        const int32_t* gid, const int32_t* starts, int64_t groups) {
  __shared__ int32_t rows[kThreads];
  __shared__ int64_t head[3];  // the group's table row, first and end index into order
  const int64_t cstep = int64_t(gridDim.x) * blockDim.x;
  const int t = int(threadIdx.x);
  const bool bf16 = table.dtype == DT::kBF16;
  for (int64_t g = blockIdx.y; g < groups; g += gridDim.y) {
    if (t == 0) {
      head[0] = gid[g];
      head[1] = starts[g];
      head[2] = starts[g + 1];
    }
    __syncthreads();
    const int64_t row = head[0], k0 = head[1], k1 = head[2];
    for (int64_t cb = int64_t(blockIdx.x) * blockDim.x; cb < table.cols; cb += cstep) {
      const int64_t c = cb + t;
      const bool active = c < table.cols;
      float acc = active ? load(table, row, c) : 0.0f;
      for (int64_t kb = k0; kb < k1; kb += kThreads) {
        const int64_t n = k1 - kb < kThreads ? k1 - kb : kThreads;
        __syncthreads();  // the previous rows are read
        if (t < n) rows[t] = order[kb + t];
        __syncthreads();
        if (!active) continue;
        for (int64_t j = 0; j < n; ++j) {
          acc += load(src, rows[j], c);
          if (bf16) acc = bf16_to_f32(f32_to_bf16(acc));
        }
      }
      if (active) store(table, row, c, acc);
    }
    __syncthreads();  // head is read
  }
}

constexpr int kTile = 32, kTileRows = 8;

// 32 x 32 tiles of dst through shared memory, so both src and dst are read along their rows.
__global__ void add_transposed_kernel(DView dst, DView src, float beta) {
  __shared__ float tile[kTile][kTile + 1];
  const int tx = int(threadIdx.x), ty = int(threadIdx.y);
  const int64_t ntr = cdiv(dst.rows, kTile), ntc = cdiv(dst.cols, kTile);
  const float* sp = static_cast<const float*>(src.data);
  for (int64_t br = blockIdx.y; br < ntr; br += gridDim.y)
    for (int64_t bc = blockIdx.x; bc < ntc; bc += gridDim.x) {
      const int64_t r0 = br * kTile, c0 = bc * kTile;
      // tile[k][x] = src(c0 + k, r0 + x) = dst's (r0 + x, c0 + k) term.
      for (int k = ty; k < kTile; k += kTileRows)
        if (c0 + k < dst.cols && r0 + tx < dst.rows) tile[k][tx] = sp[(c0 + k) * src.ld + r0 + tx];
      __syncthreads();
      for (int k = ty; k < kTile; k += kTileRows) {
        const int64_t r = r0 + k, c = c0 + tx;
        if (r < dst.rows && c < dst.cols) {
          float* d = f32_at(dst, r, c);
          const float v = tile[tx][k];
          *d = beta == 0.0f ? v : beta * *d + v;
        }
      }
      __syncthreads();
    }
}

// ---- RoPE ----

// One launch: up to kRopeRuns runs and kRopeFreqs frequencies [i0, i0 + nfreq), by value (under
// the 4 KiB of classic kernel parameters).
constexpr int kRopeRuns = 32, kRopeFreqs = 256;
struct RopeLaunch {
  double inv_freq[kRopeFreqs];  // inv_freq[i0 + i]
  RopeRun runs[kRopeRuns];
  int nruns, i0, nfreq, half;
  int64_t heads, rows;  // rows: of all the launch's runs
  int sign;
};
static_assert(sizeof(RopeLaunch) + sizeof(DView) <= 4000, "RoPE launch parameters above 4 KiB");

constexpr int kRopeFreqThreads = 64, kRopeRowThreads = 4;

// threadIdx.x: frequencies, threadIdx.y: rows of the launch (flattened over its runs).
__global__ void rope_kernel(DView x, RopeLaunch p) {
  const int64_t rstep = int64_t(gridDim.x) * kRopeRowThreads;
  for (int64_t q = int64_t(blockIdx.x) * kRopeRowThreads + threadIdx.y; q < p.rows; q += rstep) {
    int64_t off = q;
    int k = 0;
    while (off >= p.runs[k].rows) off -= p.runs[k++].rows;
    const int64_t row = p.runs[k].row + off, pos = p.runs[k].pos + off;
    for (int i = int(threadIdx.x); i < p.nfreq; i += kRopeFreqThreads) {
      const RopeCs cs = rope_cos_sin(pos, p.inv_freq[i], p.sign);
      const int64_t col = p.i0 + i;
      for (int64_t h = 0; h < p.heads; ++h) {
        const int64_t ca = h * 2 * p.half + col, cb = ca + p.half;
        float a = load(x, row, ca), b = load(x, row, cb);
        rope_rotate(a, b, cs);
        store(x, row, ca, a);
        store(x, row, cb, b);
      }
    }
  }
}

// ---- RMSNorm ----

struct Unit {
  int64_t row, c0;
};
__device__ __forceinline__ Unit unit_at(int64_t u, int64_t groups_per_row, int64_t group) {
  return {u / groups_per_row, (u % groups_per_row) * group};
}

__global__ void rmsnorm_forward_kernel(DView x, DView w, int64_t group, float eps, DView y) {
  __shared__ float red[kRowThreads];
  const int t = int(threadIdx.x);
  const int64_t gpr = x.cols / group, units = x.rows * gpr;
  for (int64_t u = blockIdx.x; u < units; u += gridDim.x) {
    const Unit un = unit_at(u, gpr, group);
    float ss = 0.0f;
    for (int64_t c = t; c < group; c += kRowThreads)
      ss = rms_ss_step(ss, load(x, un.row, un.c0 + c));
    const float inv = rms_inv(block_sum(ss, red), group, eps);
    // y may be x: each thread rewrites only the elements it read.
    for (int64_t c = t; c < group; c += kRowThreads)
      store(y, un.row, un.c0 + c, rms_y(load(x, un.row, un.c0 + c), inv, load(w, 0, c)));
  }
}

// Exactly kRmsDwBlocks blocks; block b's dw partials are ws row b (elementwise_math.h).
__global__ void rmsnorm_backward_kernel(DView x, DView w, int64_t group, float eps, DView dy,
                                        DView dx, float* ws) {
  __shared__ float red[kRowThreads];
  const int t = int(threadIdx.x);
  const int64_t gpr = x.cols / group, units = x.rows * gpr;
  float* part = ws + int64_t(blockIdx.x) * group;
  // Thread t owns columns t + k kRowThreads of the partial row: no other thread touches them.
  for (int64_t c = t; c < group; c += kRowThreads) part[c] = 0.0f;
  for (int64_t u = blockIdx.x; u < units; u += kRmsDwBlocks) {
    const Unit un = unit_at(u, gpr, group);
    float ss = 0.0f, dot = 0.0f;
    for (int64_t c = t; c < group; c += kRowThreads) {
      const float xv = load(x, un.row, un.c0 + c);
      ss = rms_ss_step(ss, xv);
      dot = rms_dot_step(dot, xv, load(w, 0, c), load(dy, un.row, un.c0 + c));
    }
    const float inv = rms_inv(block_sum(ss, red), group, eps);
    const float k = rms_k(block_sum(dot, red), inv, group);
    // dx may be dy: each thread rewrites only the elements it read.
    for (int64_t c = t; c < group; c += kRowThreads) {
      const float xv = load(x, un.row, un.c0 + c), g = load(dy, un.row, un.c0 + c);
      part[c] = rms_dw_step(part[c], xv, g, inv);
      store(dx, un.row, un.c0 + c, rms_dx(xv, load(w, 0, c), g, inv, k));
    }
  }
}

// dw[c] += ((p_0 + p_1) + p_2) + ... over the kRmsDwBlocks partial rows.
__global__ void rmsnorm_dw_kernel(const float* ws, int64_t group, DView dw) {
  for (int64_t c = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; c < group;
       c += int64_t(gridDim.x) * blockDim.x) {
    float s = ws[c];
    for (int b = 1; b < kRmsDwBlocks; ++b) s += ws[int64_t(b) * group + c];
    float* d = f32_at(dw, 0, c);
    *d = *d + s;
  }
}

// ---- SwiGLU ----

__global__ void swiglu_forward_kernel(DView a, DView b, DView h) {
  for_each_2d(a.rows, a.cols,
              [&](int64_t r, int64_t c) { store(h, r, c, swiglu(load(a, r, c), load(b, r, c))); });
}

__global__ void swiglu_backward_kernel(DView a, DView b, DView dh, DView da, DView db) {
  for_each_2d(a.rows, a.cols, [&](int64_t r, int64_t c) {
    const SwigluGrad gr = swiglu_grad(load(a, r, c), load(b, r, c), load(dh, r, c));
    store(da, r, c, gr.da);
    store(db, r, c, gr.db);
  });
}

// ---- cross-entropy ----

// Rows [row0, row0 + n) of the logits, one block per row; labels and losses: the chunk's n
// entries in the parameter block.
__global__ void cross_entropy_kernel(DView x, int64_t row0, int64_t n, const int32_t* labels,
                                     double* losses, float scale) {
  __shared__ float red[kRowThreads];
  __shared__ double red64[kRowThreads];
  const int t = int(threadIdx.x);
  __shared__ int32_t label_of_row;
  const int64_t v = x.cols;
  for (int64_t r = blockIdx.x; r < n; r += gridDim.x) {
    float* row = f32_at(x, row0 + r, 0);
    // One read of the label in mapped host memory per row, not one per thread; the second barrier
    // keeps the next row's read from overwriting it before every thread has it.
    if (t == 0) label_of_row = labels[r];
    __syncthreads();
    const int32_t label = label_of_row;
    __syncthreads();
    if (label < 0) {
      for (int64_t c = t; c < v; c += kRowThreads) row[c] = 0.0f;
      if (t == 0) losses[r] = 0.0;
      continue;
    }
    // Every read of the row's old values happens before the block_sum below; the writes after.
    const float target = row[label];
    float mx = neg_inf();
    for (int64_t c = t; c < v; c += kRowThreads) mx = fmaxf(mx, row[c]);
    const float m = block_max(mx, red);
    double sum = 0.0;
    for (int64_t c = t; c < v; c += kRowThreads) sum += double(ce_exp(row[c], m));
    sum = block_sum(sum, red64);
    const float p = ce_p(scale, sum);
    for (int64_t c = t; c < v; c += kRowThreads) row[c] = ce_grad(row[c], m, p, c == label, scale);
    if (t == 0) losses[r] = ce_row_loss(m, sum, target);
  }
}

// ---- sum of squares ----

// Exactly kSumBlocks blocks; partial b to partials[b].
__global__ void sum_squares_kernel(DView x, double* partials) {
  __shared__ double red[kRowThreads];
  const int64_t total = x.rows * x.cols;
  const bool flat = x.rows <= 1 || x.ld == x.cols;
  const float* p = static_cast<const float*>(x.data);
  double acc = 0.0;
  for (int64_t i = int64_t(blockIdx.x) * kRowThreads + threadIdx.x; i < total; i += kSumLanes) {
    const int64_t at = flat ? i : i / x.cols * x.ld + i % x.cols;
    acc = sumsq_step(acc, p[at]);
  }
  acc = block_sum(acc, red);
  if (threadIdx.x == 0) partials[blockIdx.x] = acc;
}

// ---- AdamW ----

__global__ void adamw_kernel(DView w, DView g, DView m, DView v, AdamWConsts k) {
  for_each_2d(w.rows, w.cols, [&](int64_t r, int64_t c) {
    float* pw = f32_at(w, r, c);
    float* pm = f32_at(m, r, c);
    float* pv = f32_at(v, r, c);
    float wv = *pw, mv = *pm, vv = *pv;
    adamw_update(k, wv, *f32_at(g, r, c), mv, vv);
    *pw = wv;
    *pm = mv;
    *pv = vv;
  });
}

// ---- attention bookkeeping ----

__global__ void attention_finalize_kernel(DView acc, DView m, DView l, int d, DView o, DView lse) {
  for_each_2d(acc.rows, acc.cols, [&](int64_t i, int64_t c) {
    const int64_t h = c / d;
    const float li = *f32_at(l, h, i);
    store(o, i, c, finalize_o(*f32_at(acc, i, c), li));
    if (c == h * d) *f32_at(lse, h, i) = finalize_lse(*f32_at(m, h, i), li);
  });
}

// One block per query row: the row's o is merged while every lse of the row is still the old
// one; the new lse values are written after the block's barrier.
__global__ void lse_merge_kernel(DView o, DView lse, DView o2, DView lse2, int d) {
  const int t = int(threadIdx.x);
  const int64_t hq = o.cols / d;
  for (int64_t i = blockIdx.x; i < o.rows; i += gridDim.x) {
    for (int64_t c = t; c < o.cols; c += kThreads) {
      const int64_t h = c / d;
      const LseMerge mw = lse_merge_weights(*f32_at(lse, h, i), *f32_at(lse2, h, i));
      if (mw.kind != MergeKind::kKeep)
        store(o, i, c, lse_merge_value(mw, load(o, i, c), load(o2, i, c)));
    }
    __syncthreads();
    for (int64_t h = t; h < hq; h += kThreads) {
      float* l1 = f32_at(lse, h, i);
      *l1 = lse_merge_weights(*l1, *f32_at(lse2, h, i)).lse;
    }
  }
}

// One block per query row, as lse_merge_kernel: acc takes the partial while every m of the row is
// still the old one; m and l are updated after the block's barrier.
__global__ void merge_partial_kernel(DView acc, DView m, DView l, DView o2, DView lse2, int d) {
  const int t = int(threadIdx.x);
  const int64_t hq = acc.cols / d;
  for (int64_t i = blockIdx.x; i < acc.rows; i += gridDim.x) {
    for (int64_t c = t; c < acc.cols; c += kThreads) {
      const int64_t h = c / d;
      const PartialMerge w = partial_merge_weights(*f32_at(m, h, i), *f32_at(lse2, h, i));
      float* a = f32_at(acc, i, c);
      *a = partial_merge_acc(w, *a, load(o2, i, c));
    }
    __syncthreads();
    for (int64_t h = t; h < hq; h += kThreads) {
      float* mi = f32_at(m, h, i);
      const PartialMerge w = partial_merge_weights(*mi, *f32_at(lse2, h, i));
      float* li = f32_at(l, h, i);
      *li = partial_merge_l(w, *li);
      *mi = w.m;
    }
  }
}

// One warp per (row i, head h); lanes combined in the tree order (shuffles, stride 16 first).
__global__ void attention_delta_kernel(DView o, DView dout, int d, DView delta) {
  const int lane = int(threadIdx.x) % kWarp;
  const int64_t hq = o.cols / d, pairs = o.rows * hq;
  const int64_t wstep = int64_t(gridDim.x) * (kThreads / kWarp);
  for (int64_t p = (int64_t(blockIdx.x) * kThreads + threadIdx.x) / kWarp; p < pairs; p += wstep) {
    const int64_t i = p / hq, h = p % hq;
    float acc = 0.0f;
    for (int e = lane; e < d; e += kWarp)
      acc = delta_step(acc, load(o, i, h * d + e), load(dout, i, h * d + e));
    for (int s = kWarp / 2; s > 0; s >>= 1) acc += __shfl_down_sync(0xffffffffu, acc, s);
    if (lane == 0) *f32_at(delta, h, i) = acc;
  }
}

// At least one block (a launch of none is an invalid configuration; the kernels' grid-stride
// loops then run no iteration), at most kMaxGridX.
unsigned blocks_for(int64_t units) {
  return unsigned(std::clamp<int64_t>(units, 1, kMaxGridX));
}

}  // namespace

void fill(const DView& x, float value, cudaStream_t s) {
  if (empty(x)) return;
  fill_kernel<<<grid_2d(x.rows, x.cols), kThreads, 0, s>>>(x, value);
  check_launch();
}

void convert(const DView& dst, const DView& src, cudaStream_t s) {
  if (empty(src)) return;
  if (dst.dtype == src.dtype) {
    const size_t es = src.dtype == DT::kF32 ? 4 : 2;
    // Both contiguous (one row, or ld = cols): one linear copy (cudaMemcpy2D refuses a pitch
    // above the device's limit, 2^31 - 1 bytes, which a long one-row view exceeds).
    const auto contiguous = [](const DView& v) { return v.rows == 1 || v.ld == v.cols; };
    if (contiguous(dst) && contiguous(src)) {
      UPIPE_CUDA_CHECK(cudaMemcpyAsync(dst.data, src.data, size_t(src.rows * src.cols) * es,
                                       cudaMemcpyDeviceToDevice, s));
      return;
    }
    // A one-row view may carry any ld (Mat::contiguous); cudaMemcpy2D refuses a pitch below the
    // width even for one row.
    const auto pitch = [&](const DView& v) { return size_t(std::max(v.ld, v.cols)) * es; };
    UPIPE_CUDA_CHECK(cudaMemcpy2DAsync(dst.data, pitch(dst), src.data, pitch(src),
                                       size_t(src.cols) * es, size_t(src.rows),
                                       cudaMemcpyDeviceToDevice, s));
    return;
  }
  convert_kernel<<<grid_2d(src.rows, src.cols), kThreads, 0, s>>>(dst, src);
  check_launch();
}

void add_into(const DView& dst, const DView& src, cudaStream_t s) {
  if (empty(src)) return;
  add_into_kernel<<<grid_2d(src.rows, src.cols), kThreads, 0, s>>>(dst, src);
  check_launch();
}

void add_transposed(const DView& dst, const DView& src, float beta, cudaStream_t s) {
  if (empty(dst)) return;
  const dim3 grid(unsigned(std::min(cdiv(dst.cols, kTile), kMaxGridX)),
                  unsigned(std::min(cdiv(dst.rows, kTile), kMaxGridY)));
  add_transposed_kernel<<<grid, dim3(kTile, kTileRows), 0, s>>>(dst, src, beta);
  check_launch();
}

void gather_rows(const DView& dst, const DView& table, const int32_t* ids, int64_t n,
                 ParamBlock& pb, cudaStream_t s) {
  if (n <= 0 || dst.cols <= 0) return;
  const int64_t chunk = gather_chunk_rows(ParamBlock::kBytes / 4);
  for (int64_t r0 = 0; r0 < n; r0 += chunk) {
    const int64_t rows = std::min(chunk, n - r0);
    // The block is free: its previous user synchronised its stream before it returned.
    std::copy(ids + r0, ids + r0 + rows, static_cast<int32_t*>(pb.host()));
    DView d = dst;
    d.data = static_cast<char*>(dst.data) + r0 * dst.ld * (dst.dtype == DT::kF32 ? 4 : 2);
    d.rows = rows;
    gather_rows_kernel<<<grid_2d(rows, d.cols), kThreads, 0, s>>>(
        d, table, static_cast<const int32_t*>(pb.device()));
    check_launch();
    UPIPE_CUDA_CHECK(cudaStreamSynchronize(s));
  }
}

void scatter_add_rows(const DView& table, const DView& src, const int32_t* ids, int64_t n,
                      ParamBlock& pb, cudaStream_t s) {
  if (n <= 0 || table.cols <= 0) return;
  const int64_t chunk = scatter_chunk_rows(ParamBlock::kBytes / 4);
  int32_t* host = static_cast<int32_t*>(pb.host());
  const int32_t* dev = static_cast<const int32_t*>(pb.device());
  for (int64_t r0 = 0; r0 < n; r0 += chunk) {
    const int64_t rows = std::min(chunk, n - r0);
    // The block is free: its previous user synchronised its stream before it returned (chunks
    // run in order, so a table row's additions stay in ascending row order across chunks).
    const RowGroups g = group_rows(ids + r0, rows, host);
    DView sv = src;
    sv.data = static_cast<char*>(src.data) + r0 * src.ld * (src.dtype == DT::kF32 ? 4 : 2);
    sv.rows = rows;
    scatter_add_rows_kernel<<<grid_2d(g.groups, table.cols), kThreads, 0, s>>>(
        table, sv, dev, dev + g.ids_at, dev + g.starts_at, g.groups);
    check_launch();
    UPIPE_CUDA_CHECK(cudaStreamSynchronize(s));
  }
}

void rope(const DView& x, int d, const RopeRun* runs, int64_t nruns, const double* inv_freq,
          int sign, cudaStream_t s) {
  if (empty(x)) return;
  const int half = d / 2;
  for (int i0 = 0; i0 < half; i0 += kRopeFreqs)
    for (int64_t r0 = 0; r0 < nruns; r0 += kRopeRuns) {
      RopeLaunch p{};
      p.i0 = i0;
      p.nfreq = std::min(kRopeFreqs, half - i0);
      p.half = half;
      p.heads = x.cols / d;
      p.sign = sign;
      p.nruns = int(std::min<int64_t>(kRopeRuns, nruns - r0));
      for (int i = 0; i < p.nfreq; ++i) p.inv_freq[i] = inv_freq[i0 + i];
      p.rows = 0;
      for (int k = 0; k < p.nruns; ++k) {
        p.runs[k] = runs[r0 + k];
        p.rows += p.runs[k].rows;
      }
      if (p.rows == 0) continue;
      rope_kernel<<<blocks_for(cdiv(p.rows, kRopeRowThreads)),
                    dim3(kRopeFreqThreads, kRopeRowThreads), 0, s>>>(x, p);
      check_launch();
    }
}

int64_t rmsnorm_workspace_bytes(int64_t group) {
  return rms_workspace_bytes(group);
}

void rmsnorm_forward(const DView& x, const DView& w, int64_t group, float eps, const DView& y,
                     void*, cudaStream_t s) {
  if (empty(x)) return;
  rmsnorm_forward_kernel<<<blocks_for(x.rows * (x.cols / group)), kRowThreads, 0, s>>>(x, w, group,
                                                                                       eps, y);
  check_launch();
}

void rmsnorm_backward(const DView& x, const DView& w, int64_t group, float eps, const DView& dy,
                      const DView& dx, const DView& dw, void* ws, cudaStream_t s) {
  if (empty(x)) return;
  float* part = static_cast<float*>(ws);
  rmsnorm_backward_kernel<<<kRmsDwBlocks, kRowThreads, 0, s>>>(x, w, group, eps, dy, dx, part);
  check_launch();
  rmsnorm_dw_kernel<<<blocks_for(cdiv(group, kThreads)), kThreads, 0, s>>>(part, group, dw);
  check_launch();
}

int64_t swiglu_workspace_bytes(int64_t) {
  return 0;
}

void swiglu_forward(const DView& a, const DView& b, const DView& h, void*, cudaStream_t s) {
  if (empty(a)) return;
  swiglu_forward_kernel<<<grid_2d(a.rows, a.cols), kThreads, 0, s>>>(a, b, h);
  check_launch();
}

void swiglu_backward(const DView& a, const DView& b, const DView& dh, const DView& da,
                     const DView& db, void*, cudaStream_t s) {
  if (empty(a)) return;
  swiglu_backward_kernel<<<grid_2d(a.rows, a.cols), kThreads, 0, s>>>(a, b, dh, da, db);
  check_launch();
}

double cross_entropy(const DView& logits, const int32_t* labels, int64_t n, float scale,
                     ParamBlock& pb, cudaStream_t s) {
  constexpr CeLayout lay = ce_layout(ParamBlock::kBytes);
  static_assert(lay.rows > 0 && lay.loss_offset % 8 == 0 &&
                lay.loss_offset + lay.rows * 8 <= ParamBlock::kBytes);
  char* host = static_cast<char*>(pb.host());
  char* dev = static_cast<char*>(pb.device());
  const double* host_losses = reinterpret_cast<const double*>(host + lay.loss_offset);
  double loss = 0.0;
  if (logits.cols <= 0) return loss;
  for (int64_t r0 = 0; r0 < n; r0 += lay.rows) {
    const int64_t rows = std::min(lay.rows, n - r0);
    // The block is free: its previous user synchronised its stream before it returned.
    std::copy(labels + r0, labels + r0 + rows, reinterpret_cast<int32_t*>(host));
    cross_entropy_kernel<<<blocks_for(rows), kRowThreads, 0, s>>>(
        logits, r0, rows, reinterpret_cast<const int32_t*>(dev),
        reinterpret_cast<double*>(dev + lay.loss_offset), scale);
    check_launch();
    UPIPE_CUDA_CHECK(cudaStreamSynchronize(s));
    for (int64_t r = 0; r < rows; ++r) loss += host_losses[r];
  }
  return loss;
}

double sum_squares(const DView& x, ParamBlock& pb, cudaStream_t s) {
  static_assert(kSumBlocks * 8 <= ParamBlock::kBytes);
  if (empty(x)) return 0.0;
  sum_squares_kernel<<<kSumBlocks, kRowThreads, 0, s>>>(x, static_cast<double*>(pb.device()));
  check_launch();
  UPIPE_CUDA_CHECK(cudaStreamSynchronize(s));
  return sum_partials(static_cast<const double*>(pb.host()));
}

void adamw(const DView& w, const DView& g, const DView& m, const DView& v, const AdamWParams& a,
           cudaStream_t s) {
  if (empty(w)) return;
  const AdamWConsts k =
      adamw_consts(a.lr, a.beta1, a.beta2, a.eps, a.weight_decay, a.grad_scale, a.step);
  adamw_kernel<<<grid_2d(w.rows, w.cols), kThreads, 0, s>>>(w, g, m, v, k);
  check_launch();
}

void attention_accumulate_init(const DView& acc, const DView& m, const DView& l, cudaStream_t s) {
  fill(acc, 0.0f, s);
  fill(m, neg_inf(), s);
  fill(l, 0.0f, s);
}

void attention_finalize(const DView& acc, const DView& m, const DView& l, int d, const DView& o,
                        const DView& lse, cudaStream_t s) {
  if (empty(acc)) return;
  attention_finalize_kernel<<<grid_2d(acc.rows, acc.cols), kThreads, 0, s>>>(acc, m, l, d, o, lse);
  check_launch();
}

void attention_merge_partial(const DView& acc, const DView& m, const DView& l, const DView& o2,
                             const DView& lse2, int d, cudaStream_t s) {
  if (empty(acc)) return;
  merge_partial_kernel<<<blocks_for(acc.rows), kThreads, 0, s>>>(acc, m, l, o2, lse2, d);
  check_launch();
}

void lse_merge(const DView& o, const DView& lse, const DView& o2, const DView& lse2, int d,
               cudaStream_t s) {
  if (empty(o)) return;
  lse_merge_kernel<<<blocks_for(o.rows), kThreads, 0, s>>>(o, lse, o2, lse2, d);
  check_launch();
}

void attention_delta(const DView& o, const DView& dout, int d, const DView& delta, cudaStream_t s) {
  if (empty(o)) return;
  const int64_t pairs = o.rows * (o.cols / d);
  attention_delta_kernel<<<blocks_for(cdiv(pairs, kThreads / kWarp)), kThreads, 0, s>>>(o, dout, d,
                                                                                        delta);
  check_launch();
}

}  // namespace upipe::cuda
