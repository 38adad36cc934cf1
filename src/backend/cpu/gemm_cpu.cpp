// GEMM through oneDNN: its matmul primitive in user-scratchpad mode (scratch from the arena) where
// that runs the brgemm implementation, which keeps all its buffers in the scratchpad, and sgemm
// elsewhere (see kMatmulMaxN). Created primitives are cached per thread, keyed by the whole
// problem.
#include "backend/cpu/gemm_cpu.h"

#include <fmt/format.h>
#include <immintrin.h>
#include <oneapi/dnnl/dnnl.h>

#include <algorithm>
#include <array>
#include <bit>
#include <cstdint>
#include <cstring>
#include <limits>
#include <list>
#include <memory>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>

#include "backend/cpu/cpu_isa.h"

namespace upipe::cpu {
namespace {

// Widest N that runs on the matmul primitive. Measured on AVX-512 (docs/kernels.md): oneDNN 2.6's
// brgemm matmul beats sgemm by 5-60% up to N = 256 (every block of the bf16 path, the per-stage
// projections) and at N = 512 by 10-50% with a transposed A (weight gradients such as the LM
// head's 8192x512x1024) and up to 30% otherwise (0.9-1.0 at worst); beyond, from N = 768, sgemm's
// own driver is mostly the faster one. The gemm-based matmul oneDNN falls back to calls that
// same driver and, with a sum post-op, adds a pass over C; so those problems call sgemm directly.
constexpr int64_t kMatmulMaxN = 512;
// Created products kept per thread. A training step uses a few dozen shapes (every stage of a
// strategy and every layer repeat them); the bound only stops a shape sweep from hoarding JIT
// code.
constexpr size_t kMaxCachedProducts = 256;
// Columns of C one fp32 x bf16 product computes at a time (gemm_split3): A's blocks are split
// once per panel, so for N up to this once in all.
constexpr int64_t kSplitPanel = 2048;
constexpr size_t kMaxCachedBounds = 4096;
// oneDNN carves its scratchpad at 64-byte offsets; the staging floats follow it.
constexpr int64_t kScratchAlign = 64;
constexpr int64_t kNoLimit = std::numeric_limits<int64_t>::max();

const char* status_name(dnnl_status_t st) {
  switch (st) {
    case dnnl_success:
      return "success";
    case dnnl_out_of_memory:
      return "out_of_memory";
    case dnnl_invalid_arguments:
      return "invalid_arguments";
    case dnnl_unimplemented:
      return "unimplemented";
    case dnnl_iterator_ends:
      return "iterator_ends";
    case dnnl_runtime_error:
      return "runtime_error";
    case dnnl_not_required:
      return "not_required";
  }
  return "unknown";
}

// One fp32 product on row-major operands: C(m, n) = alpha op(A) op(B) + beta C. It runs on the
// matmul primitive when N <= kMatmulMaxN, oneDNN's implementation for it is brgemm and its
// scratchpad fits scratch_limit (the bytes the caller reserved); on sgemm otherwise.
struct ProductKey {
  int64_t m, n, k, lda, ldb, ldc;
  bool ta, tb;
  float alpha, beta;
  int64_t scratch_limit;
  // bf16 A and B (oneDNN's bf16 matmul, fp32 accumulation; brgemm only, no sgemm fallback), and
  // a bf16 C.
  bool ab_bf16 = false, c_bf16 = false;
  bool operator==(const ProductKey&) const = default;
};

struct ProductKeyHash {
  size_t operator()(const ProductKey& p) const {
    uint64_t h = 0xcbf29ce484222325ull;
    auto mix = [&h](uint64_t v) { h = (h ^ v) * 0x100000001b3ull + (h >> 29); };
    for (int64_t v : {p.m, p.n, p.k, p.lda, p.ldb, p.ldc, p.scratch_limit}) mix(uint64_t(v));
    mix(uint64_t(p.ta) | uint64_t(p.tb) << 1 | uint64_t(p.ab_bf16) << 2 | uint64_t(p.c_bf16) << 3);
    mix(std::bit_cast<uint32_t>(p.alpha) | uint64_t(std::bit_cast<uint32_t>(p.beta)) << 32);
    return size_t(h);
  }
};

std::string describe(const ProductKey& p) {
  return fmt::format(
      "{} matmul m={} n={} k={} lda={} ldb={} ldc={} trans_a={} trans_b={} "
      "alpha={} beta={}",
      p.ab_bf16 ? (p.c_bf16 ? "bf16" : "bf16->fp32") : "fp32", p.m, p.n, p.k, p.lda, p.ldb, p.ldc,
      p.ta, p.tb, p.alpha, p.beta);
}

}  // namespace
}  // namespace upipe::cpu

// A macro so the failure names the call site's line; every oneDNN status goes through it.
#define UPIPE_DNNL_CHECK(call, key)                                             \
  do {                                                                          \
    const dnnl_status_t st_ = (call);                                           \
    UPIPE_CHECK(st_ == dnnl_success, "oneDNN {} returned {} for the {}", #call, \
                ::upipe::cpu::status_name(st_), ::upipe::cpu::describe(key));   \
  } while (0)

namespace upipe::cpu {
namespace {

struct PdDelete {
  void operator()(dnnl_primitive_desc_t p) const { dnnl_primitive_desc_destroy(p); }
};
struct PrimDelete {
  void operator()(dnnl_primitive_t p) const { dnnl_primitive_destroy(p); }
};
struct MemDelete {
  void operator()(dnnl_memory_t p) const { dnnl_memory_destroy(p); }
};
struct AttrDelete {
  void operator()(dnnl_primitive_attr_t p) const { dnnl_primitive_attr_destroy(p); }
};
struct PostOpsDelete {
  void operator()(dnnl_post_ops_t p) const { dnnl_post_ops_destroy(p); }
};
struct StreamDelete {
  void operator()(dnnl_stream_t p) const { dnnl_stream_destroy(p); }
};
using PdPtr = std::unique_ptr<dnnl_primitive_desc, PdDelete>;
using PrimPtr = std::unique_ptr<dnnl_primitive, PrimDelete>;
using MemPtr = std::unique_ptr<dnnl_memory, MemDelete>;

dnnl_engine_t engine() {
  static const dnnl_engine_t eng = [] {
    dnnl_engine_t e = nullptr;
    const dnnl_status_t st = dnnl_engine_create(&e, dnnl_cpu, 0);
    UPIPE_CHECK(st == dnnl_success, "oneDNN could not create its CPU engine: {}", status_name(st));
    return e;
  }();
  return eng;
}

dnnl_stream_t stream() {
  thread_local const std::unique_ptr<dnnl_stream, StreamDelete> s = [] {
    dnnl_stream_t p = nullptr;
    const dnnl_status_t st = dnnl_stream_create(&p, engine(), dnnl_stream_default_flags);
    UPIPE_CHECK(st == dnnl_success, "oneDNN could not create a CPU stream: {}", status_name(st));
    return std::unique_ptr<dnnl_stream, StreamDelete>(p);
  }();
  return s.get();
}

int64_t scratchpad_bytes(const_dnnl_primitive_desc_t pd) {
  return int64_t(
      dnnl_memory_desc_get_size(dnnl_primitive_desc_query_md(pd, dnnl_query_scratchpad_md, 0)));
}

// The primitive descriptor for `key`: alpha as output scales, beta as a sum post-op, transposes
// and leading dimensions as strides, scratchpad owned by the caller.
PdPtr create_pd(const ProductKey& key) {
  dnnl_memory_desc_t a_md, b_md, c_md;
  const dnnl_dims_t a_dims = {key.m, key.k}, b_dims = {key.k, key.n}, c_dims = {key.m, key.n};
  const dnnl_dims_t a_str = {key.ta ? 1 : key.lda, key.ta ? key.lda : 1};
  const dnnl_dims_t b_str = {key.tb ? 1 : key.ldb, key.tb ? key.ldb : 1};
  const dnnl_dims_t c_str = {key.ldc, 1};
  const dnnl_data_type_t ab = key.ab_bf16 ? dnnl_bf16 : dnnl_f32,
                         ct = key.c_bf16 ? dnnl_bf16 : dnnl_f32;
  UPIPE_DNNL_CHECK(dnnl_memory_desc_init_by_strides(&a_md, 2, a_dims, ab, a_str), key);
  UPIPE_DNNL_CHECK(dnnl_memory_desc_init_by_strides(&b_md, 2, b_dims, ab, b_str), key);
  UPIPE_DNNL_CHECK(dnnl_memory_desc_init_by_strides(&c_md, 2, c_dims, ct, c_str), key);
  dnnl_matmul_desc_t desc;
  UPIPE_DNNL_CHECK(dnnl_matmul_desc_init(&desc, &a_md, &b_md, nullptr, &c_md), key);

  dnnl_primitive_attr_t raw_attr = nullptr;
  UPIPE_DNNL_CHECK(dnnl_primitive_attr_create(&raw_attr), key);
  const std::unique_ptr<dnnl_primitive_attr, AttrDelete> attr(raw_attr);
  UPIPE_DNNL_CHECK(dnnl_primitive_attr_set_scratchpad_mode(attr.get(), dnnl_scratchpad_mode_user),
                   key);
  if (key.alpha != 1.0f)
    UPIPE_DNNL_CHECK(dnnl_primitive_attr_set_output_scales(attr.get(), 1, 0, &key.alpha), key);
  if (key.beta != 0.0f) {
    dnnl_post_ops_t raw_po = nullptr;
    UPIPE_DNNL_CHECK(dnnl_post_ops_create(&raw_po), key);
    const std::unique_ptr<dnnl_post_ops, PostOpsDelete> po(raw_po);
    UPIPE_DNNL_CHECK(dnnl_post_ops_append_sum(po.get(), key.beta), key);
    UPIPE_DNNL_CHECK(dnnl_primitive_attr_set_post_ops(attr.get(), po.get()), key);
  }

  dnnl_primitive_desc_t pd = nullptr;
  const dnnl_status_t st = dnnl_primitive_desc_create(&pd, &desc, attr.get(), engine(), nullptr);
  // This CPU may have no bf16 matmul at all (oneDNN 2.6 needs AVX512-BF16 for it).
  if (key.ab_bf16 && st == dnnl_unimplemented) return nullptr;
  UPIPE_DNNL_CHECK(st, key);
  return PdPtr(pd);
}

// oneDNN's choice for `key` when it is the brgemm matmul (all of its buffers in the scratchpad),
// else null. The scratchpad limit is not checked here.
PdPtr brgemm_pd(const ProductKey& key) {
  if (key.n > kMatmulMaxN && !key.ab_bf16) return nullptr;
  PdPtr pd = create_pd(key);
  if (!pd) return nullptr;
  const char* impl = nullptr;
  UPIPE_DNNL_CHECK(dnnl_primitive_desc_query(pd.get(), dnnl_query_impl_info_str, 0, &impl), key);
  return std::string_view(impl).starts_with("brg") ? std::move(pd) : nullptr;
}

// A product ready to run: the created primitive and the memory objects its calls rebind to the
// operands, or nothing (sgemm).
class Product {
 public:
  explicit Product(const ProductKey& key) : key_(key), pd_(brgemm_pd(key)) {
    if (pd_) scratch_bytes_ = scratchpad_bytes(pd_.get());
    if (scratch_bytes_ > key.scratch_limit) {
      pd_.reset();
      scratch_bytes_ = 0;
    }
  }

  // Whether a bf16 product runs here (else its caller stages the operands to fp32).
  bool runs_bf16() const { return pd_ != nullptr; }

  // a: op(A) at lda, b: op(B) at ldb, c: (m, n) at ldc, in the key's types; scratch: scratchpad
  // bytes, 64-aligned.
  void run(const void* a, const void* b, void* c, void* scratch) {
    if (!pd_) {
      UPIPE_CHECK(!key_.ab_bf16, "no bf16 product for the {}", describe(key_));
      return sgemm(static_cast<const float*>(a), static_cast<const float*>(b),
                   static_cast<float*>(c));
    }
    if (!prim_) create();
    UPIPE_DNNL_CHECK(dnnl_memory_set_data_handle(mem_[0].get(), const_cast<void*>(a)), key_);
    UPIPE_DNNL_CHECK(dnnl_memory_set_data_handle(mem_[1].get(), const_cast<void*>(b)), key_);
    UPIPE_DNNL_CHECK(dnnl_memory_set_data_handle(mem_[2].get(), c), key_);
    dnnl_exec_arg_t args[4] = {{DNNL_ARG_SRC, mem_[0].get()},
                               {DNNL_ARG_WEIGHTS, mem_[1].get()},
                               {DNNL_ARG_DST, mem_[2].get()},
                               {DNNL_ARG_SCRATCHPAD, mem_[3].get()}};
    int nargs = 3;
    if (scratch_bytes_ > 0) {
      UPIPE_DNNL_CHECK(dnnl_memory_set_data_handle(mem_[3].get(), scratch), key_);
      nargs = 4;
    }
    UPIPE_DNNL_CHECK(dnnl_primitive_execute(prim_.get(), stream(), nargs, args), key_);
    UPIPE_DNNL_CHECK(dnnl_stream_wait(stream()), key_);
  }

 private:
  void sgemm(const float* a, const float* b, float* c) const {
    const ProductKey& p = key_;
    UPIPE_DNNL_CHECK(dnnl_sgemm(p.ta ? 'T' : 'N', p.tb ? 'T' : 'N', p.m, p.n, p.k, p.alpha, a,
                                p.lda, b, p.ldb, p.beta, c, p.ldc),
                     p);
  }

  void create() {
    dnnl_primitive_t p = nullptr;
    UPIPE_DNNL_CHECK(dnnl_primitive_create(&p, pd_.get()), key_);
    prim_.reset(p);
    const dnnl_query_t queries[4] = {dnnl_query_src_md, dnnl_query_weights_md, dnnl_query_dst_md,
                                     dnnl_query_scratchpad_md};
    for (int i = 0; i < 4; ++i) {
      dnnl_memory_t m = nullptr;
      UPIPE_DNNL_CHECK(
          dnnl_memory_create(&m, dnnl_primitive_desc_query_md(pd_.get(), queries[i], 0), engine(),
                             DNNL_MEMORY_NONE),
          key_);
      mem_[i].reset(m);
    }
  }

  ProductKey key_;
  PdPtr pd_;
  int64_t scratch_bytes_ = 0;
  PrimPtr prim_;
  MemPtr mem_[4];  // src, weights, dst, scratchpad
};

// Least-recently-used map; get() creates a missing entry with make().
template <class K, class V, class H>
class LruCache {
 public:
  explicit LruCache(size_t capacity) : capacity_(capacity) {}

  template <class Make>
  V& get(const K& key, Make&& make) {
    if (auto it = index_.find(key); it != index_.end()) {
      order_.splice(order_.begin(), order_, it->second);
      return it->second->second;
    }
    V value = make();
    if (index_.size() == capacity_) {
      index_.erase(order_.back().first);
      order_.pop_back();
    }
    order_.emplace_front(key, std::move(value));
    index_.emplace(key, order_.begin());
    return order_.front().second;
  }

 private:
  using Entry = std::pair<K, V>;
  size_t capacity_;
  std::list<Entry> order_;
  std::unordered_map<K, typename std::list<Entry>::iterator, H> index_;
};

Product& cached_product(const ProductKey& key) {
  thread_local LruCache<ProductKey, Product, ProductKeyHash> cache(kMaxCachedProducts);
  return cache.get(key, [&] { return Product(key); });
}

int64_t round_up(int64_t x, int64_t a) {
  return (x + a - 1) / a * a;
}

// Scratchpad bytes reserved for the products of an (m, n, k) problem: the most the brgemm matmul
// asks for with dense operands, over both transposes of each operand and beta zero or not. A call
// whose strides need more runs on sgemm, so the reservation depends on the shape alone, as the
// memory formulas require.
// With ab_bf16 (c_bf16: C too), the bound of the bf16 products, or -1 when oneDNN has no bf16
// brgemm for a dense operand layout of the shape (the product is then staged to fp32).
int64_t scratch_bound(int64_t m, int64_t n, int64_t k, bool ab_bf16 = false, bool c_bf16 = false) {
  if (m == 0 || n == 0 || k == 0) return 0;
  struct Shape {
    int64_t m, n, k;
    int types;
    bool operator==(const Shape&) const = default;
  };
  struct ShapeHash {
    size_t operator()(const Shape& s) const {
      return std::hash<int64_t>()(s.m) ^ std::hash<int64_t>()(s.n) * 31 ^
             std::hash<int64_t>()(s.k) * 1009 ^ size_t(s.types) * 7919;
    }
  };
  thread_local LruCache<Shape, int64_t, ShapeHash> cache(kMaxCachedBounds);
  return cache.get(Shape{m, n, k, int(ab_bf16) | int(c_bf16) << 1}, [&] {
    int64_t bound = 0;
    for (int variant = 0; variant < 8; ++variant) {
      const bool ta = variant & 1, tb = variant & 2;
      const ProductKey key{m,        n,       k,     ta ? m : k, tb ? k : n,
                           n,        ta,      tb,    1.0f,       float(variant >> 2),
                           kNoLimit, ab_bf16, c_bf16};
      const PdPtr pd = brgemm_pd(key);
      if (!pd && ab_bf16) return int64_t(-1);
      if (pd) bound = std::max(bound, scratchpad_bytes(pd.get()));
    }
    return round_up(bound, kScratchAlign);
  });
}

// gemm_split3's panel width: kSplitPanel columns, or one tile where C has fewer than 64 rows (the
// copy of B's block, kGemmTile x the width, would then outweigh the product's own buffers).
int64_t split_panel(int64_t m, int64_t n) {
  return std::min(n, std::min(m, kGemmTile) >= 64 ? kSplitPanel : kGemmTile);
}

// The workspace of one gemm() call: the scratchpad first (the buffer's start is page-aligned),
// then the fp32 staging blocks of the bf16 operands. bf16 A and B run as one bf16 product
// (direct) where oneDNN has one for the shape; the workspace then also covers the staged path,
// taken when the operands' strides rule the bf16 product out.
struct Workspace {
  int64_t scratch = 0, a_elems = 0, b_elems = 0, c_elems = 0;
  int64_t direct_scratch = -1;  // >= 0: the bf16 product's reservation
  // >= 0: fp32 A and bf16 B on the bf16 product (gemm_split3 below): its scratchpad reservation
  // (every block shape, dense operands), then the three bf16 parts of A's block, a dense bf16
  // copy of B's block and the dense fp32 C panel.
  int64_t split_scratch = -1, split_parts = 0, split_copy = 0, split_c = 0;  // bf16, bf16, fp32
  int64_t staged() const { return scratch + (a_elems + b_elems + c_elems) * 4; }
  int64_t split() const {
    return split_scratch < 0 ? -1 : split_scratch + (split_parts + split_copy) * 2 + split_c * 4;
  }
  int64_t bytes() const { return std::max({staged(), direct_scratch, split()}); }
};

Workspace workspace(int64_t m, int64_t n, int64_t k, DType a, DType b, DType c) {
  Workspace w;
  if (a == DType::kF32 && b == DType::kF32 && c == DType::kF32) {
    w.scratch = scratch_bound(m, n, k);
    return w;
  }
  if (a == DType::kBF16 && b == DType::kBF16)
    w.direct_scratch = scratch_bound(m, n, k, true, c == DType::kBF16);
  const int64_t mb = std::min(m, kGemmTile), nb = std::min(n, kGemmTile),
                kb = std::min(k, kGemmTile);
  w.scratch = scratch_bound(mb, nb, kb);
  if (a != DType::kF32) w.a_elems = mb * kb;
  if (b != DType::kF32) w.b_elems = kb * nb;
  if (c != DType::kF32) w.c_elems = mb * nb;
  // Only with a full tile of depth: shallower products are cheap on the fp32 path, and the
  // panel's buffers would outweigh them. Never by the row count: whether a product is split
  // must not depend on how a strategy cuts C's rows, or ranks and local would round differently.
  if (a == DType::kF32 && b == DType::kBF16 && k >= kGemmTile && m > 0 && n > 0 &&
      native_bf16_gemm()) {
    const int64_t np = split_panel(m, n);
    for (int64_t nr : {mb, m % mb})
      for (int64_t nc : {np, n % np})
        for (int64_t nk : {kb, k % kb}) {
          if (nr == 0 || nc == 0 || nk == 0 || w.split_scratch == -2) continue;
          const int64_t bound = scratch_bound(nr, nc, nk, true, false);
          w.split_scratch = bound < 0 ? -2 : std::max(w.split_scratch, bound);
        }
    if (w.split_scratch < 0) {
      w.split_scratch = -1;
      return w;
    }
    // In bf16 elements, each buffer 64-byte aligned.
    w.split_parts = round_up(3 * mb * kb, kScratchAlign / 2);
    w.split_copy = round_up(kb * np, kScratchAlign / 2);
    w.split_c = mb * np;
  }
  return w;
}

// bf16 of x rounded to nearest even, NaN kept a NaN (f32_to_bf16, written without a branch so
// the loops below vectorise).
inline uint32_t bf16_bits(uint32_t u) {
  const uint32_t rounded = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
  return (u & 0x7fffffffu) > 0x7f800000u ? ((u >> 16) | 0x40u) : rounded;
}

// Eight lanes of bf16_bits, as the low halves of 32-bit lanes.
inline __m256i bf16_bits8(__m256i u) {
  const __m256i one = _mm256_set1_epi32(1),
                abs = _mm256_and_si256(u, _mm256_set1_epi32(0x7fffffff));
  const __m256i rounded =
      _mm256_srli_epi32(_mm256_add_epi32(_mm256_add_epi32(u, _mm256_set1_epi32(0x7fff)),
                                         _mm256_and_si256(_mm256_srli_epi32(u, 16), one)),
                        16);
  const __m256i nan = _mm256_or_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(0x40));
  return _mm256_blendv_epi8(rounded, nan, _mm256_cmpgt_epi32(abs, _mm256_set1_epi32(0x7f800000)));
}

// The low 16 bits of eight 32-bit lanes stored as eight bf16.
inline void store_bf16x8(uint16_t* p, __m256i v) {
  const __m128i lo = _mm256_castsi256_si128(v), hi = _mm256_extracti128_si256(v, 1);
  _mm_storeu_si128(reinterpret_cast<__m128i*>(p), _mm_packus_epi32(lo, hi));
}

// n values of x split into three bf16 parts: hi = bf16(x), mid = bf16(x - hi), lo = bf16(x - hi -
// mid) (both differences exact in fp32), so hi + mid + lo holds x's 24 significant bits.
// Non-finite x gives non-finite parts.
void split3_row(const float* x, int64_t n, uint16_t* hi, uint16_t* mid, uint16_t* lo) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 v = _mm256_loadu_ps(x + i);
    const __m256i h = bf16_bits8(_mm256_castps_si256(v));
    const __m256 r1 = _mm256_sub_ps(v, _mm256_castsi256_ps(_mm256_slli_epi32(h, 16)));
    const __m256i m = bf16_bits8(_mm256_castps_si256(r1));
    const __m256 r2 = _mm256_sub_ps(r1, _mm256_castsi256_ps(_mm256_slli_epi32(m, 16)));
    store_bf16x8(hi + i, h);
    store_bf16x8(mid + i, m);
    store_bf16x8(lo + i, bf16_bits8(_mm256_castps_si256(r2)));
  }
  for (; i < n; ++i) {
    const float v = x[i];
    const uint32_t h = bf16_bits(std::bit_cast<uint32_t>(v));
    const float r1 = v - std::bit_cast<float>(h << 16);
    const uint32_t m = bf16_bits(std::bit_cast<uint32_t>(r1));
    const float r2 = r1 - std::bit_cast<float>(m << 16);
    hi[i] = uint16_t(h);
    mid[i] = uint16_t(m);
    lo[i] = uint16_t(bf16_bits(std::bit_cast<uint32_t>(r2)));
  }
}

// The block of rows [r0, r0+nr), columns [c0, c0+nc) of the stored fp32 matrix X split
// (split3_row) into three dense (nr, nc) bf16 blocks at parts, parts + nr nc, parts + 2 nr nc.
// A transposed operand's block is split as stored: its product reads the parts transposed.
void split3(const Mat& x, int64_t r0, int64_t nr, int64_t c0, int64_t nc, uint16_t* parts) {
  const int64_t n = nr * nc;
  for (int64_t r = 0; r < nr; ++r)
    split3_row(static_cast<const float*>(x.at(r0 + r, c0)), nc, parts + r * nc, parts + n + r * nc,
               parts + 2 * n + r * nc);
}

// The block of rows [r0, r0+nr), columns [c0, c0+nc) of the stored bf16 matrix Y copied dense.
void copy_bf16(const Mat& y, int64_t r0, int64_t nr, int64_t c0, int64_t nc, uint16_t* dst) {
  for (int64_t r = 0; r < nr; ++r) std::memcpy(dst + r * nc, y.at(r0 + r, c0), size_t(nc) * 2);
}

// Copies the block of op(X) at rows [r0, r0+nr), columns [c0, c0+nc) into a dense fp32 (nr, nc)
// buffer.
void stage(const Mat& x, bool trans, int64_t r0, int64_t nr, int64_t c0, int64_t nc, float* dst) {
  for (int64_t r = 0; r < nr; ++r) {
    if (!trans) {
      to_f32(x.at(r0 + r, c0), x.dtype, dst + r * nc, nc);
      continue;
    }
    for (int64_t col = 0; col < nc; ++col) {
      const void* p = x.at(c0 + col, r0 + r);
      dst[r * nc + col] = x.dtype == DType::kF32 ? *static_cast<const float*>(p)
                                                 : bf16_to_f32(*static_cast<const uint16_t*>(p));
    }
  }
}

// Address of element (r, c) of op(X).
const float* op_at(const Mat& x, bool trans, int64_t r, int64_t c) {
  return static_cast<const float*>(trans ? x.at(c, r) : x.at(r, c));
}

// C = beta C for a k = 0 product; beta = 0 overwrites, so stale NaNs do not survive.
void scale(float* c, int64_t ldc, int64_t rows, int64_t cols, float beta) {
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t j = 0; j < cols; ++j) c[r * ldc + j] = beta == 0.0f ? 0.0f : beta * c[r * ldc + j];
}

// bf16 A and B as one bf16 product when oneDNN runs it as brgemm within `reserved` scratchpad
// bytes; false (nothing done) otherwise.
bool gemm_bf16(const GemmArgs& g, int64_t reserved, void* scratch) {
  const GemmShape s = g.shape();
  const ProductKey key{s.m,
                       s.n,
                       s.k,
                       g.a.ld,
                       g.b.ld,
                       g.c.ld,
                       g.trans_a,
                       g.trans_b,
                       g.alpha,
                       g.beta,
                       reserved,
                       true,
                       g.c.dtype == DType::kBF16};
  Product& prod = cached_product(key);
  if (!prod.runs_bf16()) return false;
  prod.run(g.a.data, g.b.data, g.c.data, scratch);
  return true;
}

// fp32 A and bf16 B on the bf16 product (bf16x3). C is computed in panels of split_panel()
// columns and kGemmTile rows, held dense in fp32 across K (staged from C when beta is not zero,
// written back and, for a bf16 C, rounded once); per K block of kGemmTile, A's block is split into
// three bf16 parts (split3: hi + mid + lo hold its 24 significant bits), B's block is read in place
// where oneDNN's bf16 product takes its strides (else copied dense), and the panel accumulates
// alpha part . B for the three parts in order. The products are exact and accumulate in fp32, so
// this has an fp32 GEMM's accuracy on the bf16 units. False (nothing done) when some block shape
// has no bf16 product within the reservation: the caller then stages to fp32.
bool gemm_split3(const GemmArgs& g, const Workspace& w, void* ws) {
  const Mat &a = g.a, &b = g.b, &c = g.c;
  const GemmShape s = g.shape();
  const int64_t m = s.m, n = s.n, k = s.k;
  const int64_t mt = std::min(m, kGemmTile), nt = split_panel(m, n), kt = std::min(k, kGemmTile);
  // A's parts dense as A is stored (a transposed A transposed), B dense or in place, C dense.
  auto key = [&](int64_t nr, int64_t nc, int64_t nk, float beta, bool b_in_place) {
    return ProductKey{nr,
                      nc,
                      nk,
                      g.trans_a ? nr : nk,
                      b_in_place ? b.ld : (g.trans_b ? nk : nc),
                      nc,
                      g.trans_a,
                      g.trans_b,
                      g.alpha,
                      beta,
                      w.split_scratch,
                      true,
                      false};
  };
  // Every block shape must run before C is touched: on B in place (where oneDNN takes its
  // strides), else on dense copies of B's blocks. Only the keys of the path taken are created.
  auto all_run = [&](bool b_in_place) {
    for (int64_t nr : {mt, m % mt})
      for (int64_t nc : {nt, n % nt})
        for (int64_t nk : {kt, k % kt})
          for (float beta : {g.beta, 1.0f})
            if (nr > 0 && nc > 0 && nk > 0 &&
                !cached_product(key(nr, nc, nk, beta, b_in_place)).runs_bf16())
              return false;
    return true;
  };
  const bool in_place = all_run(true);
  if (!in_place && !all_run(false)) return false;
  uint16_t* parts = reinterpret_cast<uint16_t*>(static_cast<char*>(ws) + w.split_scratch);
  uint16_t* copy = parts + w.split_parts;
  float* cbuf = reinterpret_cast<float*>(copy + w.split_copy);
  for (int64_t m0 = 0; m0 < m; m0 += mt) {
    const int64_t nr = std::min(mt, m - m0);
    for (int64_t n0 = 0; n0 < n; n0 += nt) {
      const int64_t nc = std::min(nt, n - n0);
      const Mat cblk = c.block(m0, nr, n0, nc);
      if (g.beta != 0.0f) stage(cblk, false, 0, nr, 0, nc, cbuf);
      float beta_k = g.beta;
      for (int64_t k0 = 0; k0 < k; k0 += kt) {
        const int64_t nk = std::min(kt, k - k0);
        if (g.trans_a)
          split3(a, k0, nk, m0, nr, parts);
        else
          split3(a, m0, nr, k0, nk, parts);
        const void* bp = g.trans_b ? b.at(n0, k0) : b.at(k0, n0);
        if (!in_place) {
          if (g.trans_b)
            copy_bf16(b, n0, nc, k0, nk, copy);
          else
            copy_bf16(b, k0, nk, n0, nc, copy);
          bp = copy;
        }
        for (int t = 0; t < 3; ++t)
          cached_product(key(nr, nc, nk, t == 0 ? beta_k : 1.0f, in_place))
              .run(parts + t * nr * nk, bp, cbuf, ws);
        beta_k = 1.0f;
      }
      for (int64_t r = 0; r < nr; ++r) from_f32(cbuf + r * nc, cblk.at(r, 0), c.dtype, nc);
    }
  }
  return true;
}

}  // namespace

bool native_bf16_gemm() {
  static const bool native = [] {
    const ProductKey probe{64, 64, 64, 64, 64, 64, false, false, 1.0f, 0.0f, kNoLimit, true, false};
    return brgemm_pd(probe) != nullptr;
  }();
  return native;
}

int64_t gemm_workspace_bytes(const GemmShape& s) {
  return workspace(s.m, s.n, s.k, s.a, s.b, s.c).bytes();
}

void gemm(const GemmArgs& g, void* ws) {
  const Mat &a = g.a, &b = g.b, &c = g.c;
  const bool trans_a = g.trans_a, trans_b = g.trans_b;
  const float alpha = g.alpha, beta = g.beta;
  const GemmShape s = g.shape();
  const int64_t m = s.m, n = s.n, k = s.k;
  const Workspace w = workspace(m, n, k, a.dtype, b.dtype, c.dtype);
  if (m == 0 || n == 0) return;
  void* scratch = ws;
  const bool all_f32 = a.dtype == DType::kF32 && b.dtype == DType::kF32 && c.dtype == DType::kF32;
  if (all_f32) {
    if (k == 0) return scale(c.f32(), c.ld, m, n, beta);
    const ProductKey key{m, n, k, a.ld, b.ld, c.ld, trans_a, trans_b, alpha, beta, w.scratch};
    cached_product(key).run(a.f32(), b.f32(), c.f32(), scratch);
    return;
  }
  if (w.direct_scratch >= 0 && k > 0 && gemm_bf16(g, w.direct_scratch, scratch)) return;
  if (w.split() >= 0 && k > 0 && gemm_split3(g, w, ws)) return;
  const int64_t mt = std::min(m, kGemmTile), nt = std::min(n, kGemmTile),
                kt = std::min(k, kGemmTile);
  float* cursor = reinterpret_cast<float*>(static_cast<char*>(ws) + w.scratch);
  float* a32 = w.a_elems ? std::exchange(cursor, cursor + w.a_elems) : nullptr;
  float* b32 = w.b_elems ? std::exchange(cursor, cursor + w.b_elems) : nullptr;
  float* c32 = w.c_elems ? cursor : nullptr;
  for (int64_t m0 = 0; m0 < m; m0 += mt) {
    const int64_t nr = std::min(mt, m - m0);
    for (int64_t n0 = 0; n0 < n; n0 += nt) {
      const int64_t nc = std::min(nt, n - n0);
      const Mat cblk = c.block(m0, nr, n0, nc);
      float* cp = c32 ? c32 : static_cast<float*>(cblk.data);
      const int64_t ldc = c32 ? nc : c.ld;
      if (c32 && beta != 0.0f) stage(cblk, false, 0, nr, 0, nc, c32);
      if (k == 0) scale(cp, ldc, nr, nc, beta);
      float beta_k = beta;
      for (int64_t k0 = 0; k0 < k; k0 += kt) {
        const int64_t nk = std::min(kt, k - k0);
        const float* ap = a32;
        const float* bp = b32;
        int64_t lda = nk, ldb = nc;
        bool ta = false, tb = false;
        if (a32)
          stage(a, trans_a, m0, nr, k0, nk, a32);
        else
          ap = op_at(a, trans_a, m0, k0), lda = a.ld, ta = trans_a;
        if (b32)
          stage(b, trans_b, k0, nk, n0, nc, b32);
        else
          bp = op_at(b, trans_b, k0, n0), ldb = b.ld, tb = trans_b;
        const ProductKey key{nr, nc, nk, lda, ldb, ldc, ta, tb, alpha, beta_k, w.scratch};
        cached_product(key).run(ap, bp, cp, scratch);
        beta_k = 1.0f;
      }
      if (c32)
        for (int64_t r = 0; r < nr; ++r) from_f32(c32 + r * nc, cblk.at(r, 0), c.dtype, nc);
    }
  }
}

}  // namespace upipe::cpu

namespace upipe {

std::string onednn_cpu_isa() {
  switch (dnnl_get_effective_cpu_isa()) {
    case dnnl_cpu_isa_sse41:
      return "sse41";
    case dnnl_cpu_isa_avx:
      return "avx";
    case dnnl_cpu_isa_avx2:
      return "avx2";
    case dnnl_cpu_isa_avx2_vnni:
      return "avx2_vnni";
    case dnnl_cpu_isa_avx512_core:
      return "avx512_core";
    case dnnl_cpu_isa_avx512_core_vnni:
      return "avx512_core_vnni";
    case dnnl_cpu_isa_avx512_core_bf16:
      return "avx512_core_bf16";
    case dnnl_cpu_isa_avx512_core_amx:
      return "avx512_core_amx";
    default:
      return "other";
  }
}

}  // namespace upipe
