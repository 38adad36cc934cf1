#include "backend/cuda/gemm_cublaslt.h"

#include <cublasLt.h>
#include <fmt/format.h>

#include <bit>
#include <list>
#include <unordered_map>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/elementwise_cuda.h"
#include "backend/cuda/gemm_desc.h"
#include "core/errors.h"

namespace upipe::cuda {
namespace {

cudaDataType_t lt_type(DT t) {
  return t == DT::kF32 ? CUDA_R_32F : CUDA_R_16BF;
}

// The largest power of two (at most 256) dividing the address: cuBLASLt's heuristics assume
// 256-byte aligned operands unless told, and strided column slices of a head-sharded buffer
// are often less aligned.
uint32_t alignment_of(const void* p) {
  const uint64_t a = uint64_t(reinterpret_cast<uintptr_t>(p));
  return a == 0 ? 256u : uint32_t(std::min<uint64_t>(256, a & (~a + 1)));
}

struct Key {
  int64_t m, n, k, lda, ldb, ldc;
  bool ta, tb;
  DT a, b, c;
  uint32_t align_a, align_b, align_c;
  bool operator==(const Key&) const = default;
};
struct KeyHash {
  size_t operator()(const Key& x) const {
    uint64_t h = 0xcbf29ce484222325ull;
    auto mix = [&h](uint64_t v) { h = (h ^ v) * 0x100000001b3ull + (h >> 29); };
    for (int64_t v : {x.m, x.n, x.k, x.lda, x.ldb, x.ldc}) mix(uint64_t(v));
    mix(uint64_t(x.ta) | uint64_t(x.tb) << 1 | uint64_t(x.a) << 2 | uint64_t(x.b) << 4 |
        uint64_t(x.c) << 6);
    mix(uint64_t(x.align_a) | uint64_t(x.align_b) << 16 | uint64_t(x.align_c) << 32);
    return size_t(h);
  }
};

// A planned product: its descriptors and the algorithm cuBLASLt's heuristic chose.
struct Plan {
  cublasLtMatmulDesc_t desc = nullptr;
  cublasLtMatrixLayout_t la = nullptr, lb = nullptr, lc = nullptr;
  cublasLtMatmulAlgo_t algo{};
  Plan() = default;
  Plan(const Plan&) = delete;
  Plan& operator=(const Plan&) = delete;
  ~Plan() {
    if (la) cublasLtMatrixLayoutDestroy(la);
    if (lb) cublasLtMatrixLayoutDestroy(lb);
    if (lc) cublasLtMatrixLayoutDestroy(lc);
    if (desc) cublasLtMatmulDescDestroy(desc);
  }
};

// Products kept: a training step uses a few dozen shapes; the bound stops a sweep from hoarding.
constexpr size_t kMaxPlans = 512;

}  // namespace

struct LtGemm::Impl {
  cublasLtHandle_t handle = nullptr;
  std::list<Key> order;  // oldest first
  std::unordered_map<Key, std::unique_ptr<Plan>, KeyHash> plans;

  const Plan& plan(const Key& key, const LtProblem& p) {
    if (auto it = plans.find(key); it != plans.end()) return *it->second;
    auto pl = std::make_unique<Plan>();
    UPIPE_CUBLAS_CHECK(cublasLtMatmulDescCreate(&pl->desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    const cublasOperation_t ta = p.trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;
    const cublasOperation_t tb = p.trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;
    UPIPE_CUBLAS_CHECK(
        cublasLtMatmulDescSetAttribute(pl->desc, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof(ta)));
    UPIPE_CUBLAS_CHECK(
        cublasLtMatmulDescSetAttribute(pl->desc, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof(tb)));
    UPIPE_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&pl->la, lt_type(p.a.dtype), uint64_t(p.a.rows),
                                                  uint64_t(p.a.cols), p.a.ld));
    UPIPE_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&pl->lb, lt_type(p.b.dtype), uint64_t(p.b.rows),
                                                  uint64_t(p.b.cols), p.b.ld));
    UPIPE_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&pl->lc, lt_type(p.c.dtype), uint64_t(p.c.rows),
                                                  uint64_t(p.c.cols), p.c.ld));
    cublasLtMatmulPreference_t pref = nullptr;
    UPIPE_CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&pref));
    const uint64_t ws = uint64_t(kLtWorkspaceBytes);
    cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws,
                                         sizeof(ws));
    cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES,
                                         &key.align_a, sizeof(uint32_t));
    cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
                                         &key.align_b, sizeof(uint32_t));
    cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES,
                                         &key.align_c, sizeof(uint32_t));
    cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES,
                                         &key.align_c, sizeof(uint32_t));
    // No split-K: each element's dot product runs in one sequence over k, so a row's result
    // does not depend on how many rows the call has (a rank's shard or the whole sequence):
    // Backend::native_bf16_gemm's promise, which upipe check's data-movement rule relies on.
    const uint32_t reduction = CUBLASLT_REDUCTION_SCHEME_NONE;
    cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK,
                                         &reduction, sizeof(reduction));
    cublasLtMatmulHeuristicResult_t result{};
    int found = 0;
    const cublasStatus_t st = cublasLtMatmulAlgoGetHeuristic(
        handle, pl->desc, pl->la, pl->lb, pl->lc, pl->lc, pref, 1, &result, &found);
    cublasLtMatmulPreferenceDestroy(pref);
    if (st != CUBLAS_STATUS_SUCCESS || found == 0)
      throw Error(fmt::format(
          "cuBLASLt has no algorithm for the column-major product m={} n={} k={} lda={} ldb={} "
          "ldc={} ({})",
          p.m, p.n, p.k, p.a.ld, p.b.ld, p.c.ld, cublasLtGetStatusString(st)));
    pl->algo = result.algo;
    if (plans.size() >= kMaxPlans) {
      plans.erase(order.front());
      order.pop_front();
    }
    order.push_back(key);
    return *plans.emplace(key, std::move(pl)).first->second;
  }
};

int64_t gemm_workspace_bytes(int64_t m, int64_t n, int64_t k, DT a, DT b, DT c) {
  return gemm_staging(m, n, k, a, b, c).bytes;
}

LtGemm::LtGemm() : impl_(std::make_unique<Impl>()) {
  UPIPE_CUBLAS_CHECK(cublasLtCreate(&impl_->handle));
}

LtGemm::~LtGemm() {
  impl_->plans.clear();
  if (impl_->handle) cublasLtDestroy(impl_->handle);
}

// One product cuBLASLt runs as it is (no staging).
void LtGemm::product(const DView& a, bool trans_a, const DView& b, bool trans_b, const DView& c,
                     float alpha, float beta, void* ws, cudaStream_t s) {
  const int64_t k = trans_a ? a.rows : a.cols;
  if (k == 0) {
    // cuBLASLt refuses K = 0; the product is then beta C.
    if (beta == 0.0f)
      fill(c, 0.0f, s);
    else if (beta != 1.0f)
      throw Error("GEMM with k = 0 and beta other than 0 or 1");
    return;
  }
  const LtProblem p = lt_problem(a, trans_a, b, trans_b, c, alpha, beta);
  const Key key{p.m,
                p.n,
                p.k,
                p.a.ld,
                p.b.ld,
                p.c.ld,
                p.trans_a,
                p.trans_b,
                p.a.dtype,
                p.b.dtype,
                p.c.dtype,
                alignment_of(p.a.ptr),
                alignment_of(p.b.ptr),
                alignment_of(p.c.ptr)};
  const Plan& pl = impl_->plan(key, p);
  UPIPE_CUBLAS_CHECK(cublasLtMatmul(impl_->handle, pl.desc, &alpha, p.a.ptr, pl.la, p.b.ptr, pl.lb,
                                    &beta, p.c.ptr, pl.lc, const_cast<void*>(p.c.ptr), pl.lc,
                                    &pl.algo, ws, size_t(kLtWorkspaceBytes), s));
}

void LtGemm::run(const DView& a_in, bool trans_a, const DView& b_in, bool trans_b,
                 const DView& c_in, float alpha, float beta, void* ws, cudaStream_t s) {
  const int64_t m = c_in.rows, n = c_in.cols, k = trans_a ? a_in.rows : a_in.cols;
  if (m == 0 || n == 0) return;
  const GemmStaging st = gemm_staging(m, n, k, a_in.dtype, b_in.dtype, c_in.dtype);
  char* const w = ws_base(ws);  // the layout's origin, 256-byte aligned (kLtAlignSlack)
  if (!st.widen_a && !st.widen_b && !st.stage_c) {
    product(a_in, trans_a, b_in, trans_b, c_in, alpha, beta, w, s);
    return;
  }
  // Staged operands are contiguous fp32 copies of the block's views, in the same orientation.
  auto widened = [&](const DView& v, int64_t off) {
    const DView f{w + off, DT::kF32, v.rows, v.cols, v.cols};
    convert(f, v, s);
    return f;
  };
  for_each_gemm_block(m, k, st, [&](const GemmBlock& blk) {
    DView a = a_block(a_in, trans_a, blk), b = b_block(b_in, trans_b, blk);
    const DView c = rows_view(c_in, blk.r0, blk.rows);
    if (st.widen_a) a = widened(a, st.a_offset);
    if (st.widen_b) b = widened(b, st.b_offset);
    DView cc = c;
    if (st.stage_c) {
      cc = DView{w + st.c_offset, DT::kF32, c.rows, c.cols, c.cols};
      if (blk.first_panel && beta != 0.0f) convert(cc, c, s);
    }
    product(a, trans_a, b, trans_b, cc, alpha, blk.first_panel ? beta : 1.0f, w, s);
    if (st.stage_c && blk.last_panel) convert(c, cc, s);
  });
}

}  // namespace upipe::cuda
