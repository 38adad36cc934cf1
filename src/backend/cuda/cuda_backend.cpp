#include "backend/cuda/cuda_backend.h"

#include <cublasLt.h>
#include <cuda_runtime_api.h>
#include <fmt/format.h>

#include <array>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <type_traits>
#include <utility>

#include "backend/copy_lanes.h"
#include "backend/cuda/attention_cuda.h"
#include "backend/cuda/attention_cudnn.h"
#include "backend/cuda/cuda_check.h"
#include "backend/cuda/cuda_memory.h"
#include "backend/cuda/elementwise_cuda.h"
#include "backend/cuda/gemm_cublaslt.h"
#include "backend/cuda/param_block.h"
#include "core/check.h"
#include "core/errors.h"

namespace upipe {
namespace {

// The kernels take dev_view.h's PODs; these are the same fields.
static_assert(sizeof(cuda::DSpan) == sizeof(DocSpan) && offsetof(DocSpan, row) == 0 &&
              offsetof(DocSpan, rows) == 8 && offsetof(DocSpan, doc) == 16 &&
              offsetof(DocSpan, pos) == 24);
static_assert(static_cast<int>(DType::kF32) == static_cast<int>(cuda::DT::kF32) &&
              static_cast<int>(DType::kBF16) == static_cast<int>(cuda::DT::kBF16));

cuda::DT dt(DType t) {
  return static_cast<cuda::DT>(static_cast<int>(t));
}

cuda::DView dv(const Mat& m) {
  return {m.data, dt(m.dtype), m.rows, m.cols, m.ld};
}

cuda::DDocs docs(const DocRows& r) {
  return {reinterpret_cast<const cuda::DSpan*>(r.spans), r.count, r.row0};
}

cuda::DAttn attn(const AttnProblem& p) {
  cuda::DAttn a;
  a.q = dv(p.q);
  a.k = dv(p.k);
  a.v = dv(p.v);
  a.hq = p.hq;
  a.hk = p.hk;
  a.d = p.d;
  a.q_pos0 = p.q_pos0;
  a.k_pos0 = p.k_pos0;
  a.causal = p.causal;
  a.scale = p.softmax_scale();
  a.q_docs = docs(p.q_docs);
  a.k_docs = docs(p.k_docs);
  return a;
}

}  // namespace

bool cuda_available(std::string* why) {
  int n = 0;
  const cudaError_t st = cudaGetDeviceCount(&n);
  if (st != cudaSuccess || n == 0) {
    if (why != nullptr)
      *why = st != cudaSuccess ? fmt::format("no CUDA device: {}", cudaGetErrorString(st))
                               : std::string("no CUDA device: cudaGetDeviceCount found none");
    cudaGetLastError();  // clear the sticky error for later calls
    return false;
  }
  return true;
}

std::string cuda_library_versions() {
  // CUDA codes versions as major * 1000 + minor * 10; cuBLASLt as major * 10000 + minor * 100 +
  // patch.
  const auto cuda_version = [](int v) { return fmt::format("{}.{}", v / 1000, v % 1000 / 10); };
  int driver = 0, runtime = 0;
  const bool has_driver = cudaDriverGetVersion(&driver) == cudaSuccess && driver > 0;
  if (cudaRuntimeGetVersion(&runtime) != cudaSuccess) runtime = 0;
  const size_t lt = cublasLtGetVersion();
  return fmt::format("driver {}, runtime {}, cuBLASLt {}.{}.{}, {}",
                     has_driver ? cuda_version(driver) : std::string("none"), cuda_version(runtime),
                     lt / 10000, lt / 100 % 100, lt % 100, cuda::cudnn_version());
}

int64_t cuda_used_bytes() {
  size_t free = 0, total = 0;
  UPIPE_CUDA_CHECK(cudaMemGetInfo(&free, &total));
  return int64_t(total) - int64_t(free);
}

struct CudaBackend::State {
  cudaStream_t stream = nullptr;
  // The copy lanes of copy_async (copy_lanes.h): [0] device -> host, [1] the rest; two streams,
  // so an offload and a fetch run in the two directions of the link at once.
  std::array<cudaStream_t, kCopyLanes> lanes{};
  // The asynchronous copies not yet waited on, each with the event recorded after it.
  CopyLanes<cudaEvent_t> copies;
  cuda::LtGemm gemm;
  cuda::ParamBlock params;
  ~State() {
    for (cudaStream_t l : lanes)
      if (l != nullptr) cudaStreamSynchronize(l);
    for (const auto& c : copies.retire(INT64_MAX).copies) cudaEventDestroy(c.payload);
    for (cudaStream_t l : lanes)
      if (l != nullptr) cudaStreamDestroy(l);
    if (stream != nullptr) cudaStreamDestroy(stream);
  }
};

namespace {

cudaMemcpyKind memcpy_kind(CopyKind kind) {
  return kind == CopyKind::kHostToDevice     ? cudaMemcpyHostToDevice
         : kind == CopyKind::kDeviceToHost   ? cudaMemcpyDeviceToHost
         : kind == CopyKind::kDeviceToDevice ? cudaMemcpyDeviceToDevice
                                             : cudaMemcpyHostToHost;
}

cudaEvent_t new_event() {
  cudaEvent_t e = nullptr;
  UPIPE_CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
  return e;
}

}  // namespace

CudaBackend::CudaBackend(Mode mode) : mode_(mode) {
  if (mode_ == Mode::kQueryOnly) return;
  std::string why;
  if (!cuda_available(&why)) throw ConfigError(fmt::format("--backend cuda: {}", why));
  int n = 0;
  UPIPE_CUDA_CHECK(cudaGetDeviceCount(&n));
  device_ = cuda::local_rank() % n;
  UPIPE_CUDA_CHECK(cudaSetDevice(device_));
  state_ = std::make_unique<State>();
  UPIPE_CUDA_CHECK(cudaStreamCreateWithFlags(&state_->stream, cudaStreamNonBlocking));
  for (cudaStream_t& l : state_->lanes)
    UPIPE_CUDA_CHECK(cudaStreamCreateWithFlags(&l, cudaStreamNonBlocking));
}

CudaBackend::~CudaBackend() {
  if (state_) cudaStreamSynchronize(state_->stream);  // the copy lanes: State's destructor
}

CudaBackend::State& CudaBackend::run_state() const {
  UPIPE_CHECK(state_ != nullptr, "a query-only CUDA backend (the planner's) runs no op");
  return *state_;
}

void* CudaBackend::native_stream() const {
  return run_state().stream;
}

std::unique_ptr<Allocator> CudaBackend::make_device_allocator() const {
  run_state();
  return std::make_unique<cuda::DeviceAllocator>();
}

std::unique_ptr<Allocator> CudaBackend::make_host_allocator() const {
  run_state();
  return cuda::make_pinned_host_allocator();
}

void CudaBackend::copy(void* dst, const void* src, int64_t bytes, CopyKind kind, Stream) {
  cudaStream_t s = run_state().stream;
  UPIPE_CUDA_CHECK(cudaMemcpyAsync(dst, src, size_t(bytes), memcpy_kind(kind), s));
  // Host code reads what it downloads at once, and may free what it uploaded (a temporary row):
  // any copy that touches host memory completes before it returns. Device-to-device copies stay
  // ordered on the stream.
  if (kind != CopyKind::kDeviceToDevice) UPIPE_CUDA_CHECK(cudaStreamSynchronize(s));
}

void CudaBackend::sync(Stream) {
  State& st = run_state();
  UPIPE_CUDA_CHECK(cudaStreamSynchronize(st.stream));
  for (cudaStream_t l : st.lanes) UPIPE_CUDA_CHECK(cudaStreamSynchronize(l));
}

CopyTicket CudaBackend::copy_async(void* dst, const void* src, int64_t bytes, CopyKind kind) {
  State& st = run_state();
  // UPIPE_CUDA_COPIES=sync: every asynchronous copy as a synchronous one on the compute stream (to
  // measure what the copy lanes' overlap gains; bench/gpu_check.sh runs fpdt both ways).
  static const bool sync_copies = [] {
    const char* v = std::getenv("UPIPE_CUDA_COPIES");
    return v != nullptr && std::string(v) == "sync";
  }();
  if (sync_copies) {
    copy(dst, src, bytes, kind, Stream{});
    return CopyTicket{++async_copies_};
  }
  // The copy starts after the compute stream's work so far, and after the other lane's pending
  // copies that share memory with it (copy_lanes.h); its own lane keeps issue order.
  const CopyExtent at = CopyExtent::of(dst, src, bytes, kind);
  cudaStream_t lane = st.lanes[size_t(at.lane)];
  cudaEvent_t ready = new_event();
  UPIPE_CUDA_CHECK(cudaEventRecord(ready, st.stream));
  UPIPE_CUDA_CHECK(cudaStreamWaitEvent(lane, ready, 0));
  UPIPE_CUDA_CHECK(cudaEventDestroy(ready));  // released once the wait has passed it
  const CopyTicket t{++async_copies_};
  cudaEvent_t done = new_event();
  const auto& c = st.copies.issue(t.id, at, done);
  for (int64_t dep : c.after)
    UPIPE_CUDA_CHECK(cudaStreamWaitEvent(lane, st.copies.find(dep)->payload, 0));
  UPIPE_CUDA_CHECK(cudaMemcpyAsync(dst, src, size_t(bytes), memcpy_kind(kind), lane));
  UPIPE_CUDA_CHECK(cudaEventRecord(done, lane));
  return t;
}

void CudaBackend::wait_copy(CopyTicket t) {
  State& st = run_state();
  // Each lane runs in issue order: the event of its newest copy <= t covers the lane's rest.
  const auto retired = st.copies.retire(t.id);
  for (const auto& c : retired.copies)
    if (c.id == retired.newest[size_t(c.at.lane)])
      UPIPE_CUDA_CHECK(cudaStreamWaitEvent(st.stream, c.payload, 0));
  for (const auto& c : retired.copies) UPIPE_CUDA_CHECK(cudaEventDestroy(c.payload));
}

int64_t CudaBackend::gemm_workspace_bytes(const GemmShape& s) const {
  return cuda::gemm_workspace_bytes(s.m, s.n, s.k, dt(s.a), dt(s.b), dt(s.c));
}

int64_t CudaBackend::attention_fwd_workspace_bytes(const AttnShape& s) const {
  return cuda::attention_fwd_workspace_bytes(s.hq, s.hk, s.d, dt(s.t), s.documents);
}

int64_t CudaBackend::attention_bwd_workspace_bytes(const AttnShape& s) const {
  return cuda::attention_bwd_workspace_bytes(s.hq, s.hk, s.d, dt(s.t), s.documents);
}

int64_t CudaBackend::rmsnorm_workspace_bytes(int64_t group) const {
  return cuda::rmsnorm_workspace_bytes(group);
}

int64_t CudaBackend::swiglu_workspace_bytes(int64_t cols) const {
  return cuda::swiglu_workspace_bytes(cols);
}

bool CudaBackend::gemm_supports(const GemmShape& s) const {
  auto ok = [](DType t) { return t == DType::kF32 || t == DType::kBF16; };
  return ok(s.a) && ok(s.b) && ok(s.c);
}

bool CudaBackend::attention_backward_reads_o(const AttnShape& s) const {
  return cuda::attention_backward_reads_o(s.d, dt(s.t));
}

bool CudaBackend::attention_supports(const AttnShape& s) const {
  return cuda::attention_supports(s.d, dt(s.t), s.documents);
}

void CudaBackend::gemm(const GemmArgs& a, void* ws) {
  State& st = run_state();
  st.gemm.run(dv(a.a), a.trans_a, dv(a.b), a.trans_b, dv(a.c), a.alpha, a.beta, ws, st.stream);
}

void CudaBackend::attention_forward(const AttnFwdArgs& a, void* ws) {
  cuda::attention_forward(attn(a.p), dv(a.o), dv(a.lse), dv(a.acc), dv(a.m), dv(a.l), a.accumulate,
                          ws, run_state().stream);
}

void CudaBackend::attention_backward(const AttnBwdArgs& a, void* ws) {
  cuda::attention_backward(attn(a.p), dv(a.o), dv(a.dout), dv(a.lse), dv(a.delta), dv(a.dq),
                           dv(a.dk), dv(a.dv), ws, run_state().stream);
}

void CudaBackend::attention_accumulate_init(const Mat& acc, const Mat& m, const Mat& l) {
  cuda::attention_accumulate_init(dv(acc), dv(m), dv(l), run_state().stream);
}

void CudaBackend::attention_finalize(const Mat& acc, const Mat& m, const Mat& l, int d,
                                     const Mat& o, const Mat& lse) {
  cuda::attention_finalize(dv(acc), dv(m), dv(l), d, dv(o), dv(lse), run_state().stream);
}

void CudaBackend::lse_merge(const Mat& o, const Mat& lse, const Mat& o2, const Mat& lse2, int d) {
  cuda::lse_merge(dv(o), dv(lse), dv(o2), dv(lse2), d, run_state().stream);
}

void CudaBackend::attention_delta(const Mat& o, const Mat& dout, int d, const Mat& delta) {
  cuda::attention_delta(dv(o), dv(dout), d, dv(delta), run_state().stream);
}

void CudaBackend::rope(const Mat& x, int d, const RowPositions& pos, const RopeParams& rp,
                       int sign) {
  std::vector<cuda::RopeRun> runs;
  int64_t row = 0;
  for (const RowPositions::Run& r : pos.runs) {
    runs.push_back({row, r.rows, r.pos});
    row += r.rows;
  }
  const std::vector<double> f = rp.inv_freq(d);
  cuda::rope(dv(x), d, runs.data(), int64_t(runs.size()), f.data(), sign, run_state().stream);
}

void CudaBackend::rmsnorm_forward(const Mat& x, const Mat& w, int64_t group, float eps,
                                  const Mat& y, void* ws) {
  cuda::rmsnorm_forward(dv(x), dv(w), group, eps, dv(y), ws, run_state().stream);
}

void CudaBackend::rmsnorm_backward(const Mat& x, const Mat& w, int64_t group, float eps,
                                   const Mat& dy, const Mat& dx, const Mat& dw, void* ws) {
  cuda::rmsnorm_backward(dv(x), dv(w), group, eps, dv(dy), dv(dx), dv(dw), ws, run_state().stream);
}

double CudaBackend::cross_entropy(const Mat& logits, std::span<const int32_t> labels, float scale) {
  State& st = run_state();
  return cuda::cross_entropy(dv(logits), labels.data(), int64_t(labels.size()), scale, st.params,
                             st.stream);
}

void CudaBackend::swiglu_forward(const Mat& a, const Mat& b, const Mat& h, void* ws) {
  cuda::swiglu_forward(dv(a), dv(b), dv(h), ws, run_state().stream);
}

void CudaBackend::swiglu_backward(const Mat& a, const Mat& b, const Mat& dh, const Mat& da,
                                  const Mat& db, void* ws) {
  cuda::swiglu_backward(dv(a), dv(b), dv(dh), dv(da), dv(db), ws, run_state().stream);
}

void CudaBackend::fill(const Mat& x, float value) {
  cuda::fill(dv(x), value, run_state().stream);
}

void CudaBackend::convert(const Mat& dst, const Mat& src) {
  cuda::convert(dv(dst), dv(src), run_state().stream);
}

void CudaBackend::add_into(const Mat& dst, const Mat& src) {
  cuda::add_into(dv(dst), dv(src), run_state().stream);
}

void CudaBackend::add_transposed(const Mat& dst, const Mat& src, float beta) {
  cuda::add_transposed(dv(dst), dv(src), beta, run_state().stream);
}

void CudaBackend::gather_rows(const Mat& dst, const Mat& table, std::span<const int32_t> ids) {
  State& st = run_state();
  cuda::gather_rows(dv(dst), dv(table), ids.data(), int64_t(ids.size()), st.params, st.stream);
}

void CudaBackend::scatter_add_rows(const Mat& table, const Mat& src, std::span<const int32_t> ids) {
  State& st = run_state();
  cuda::scatter_add_rows(dv(table), dv(src), ids.data(), int64_t(ids.size()), st.params, st.stream);
}

double CudaBackend::sum_squares(const Mat& x) {
  State& st = run_state();
  return cuda::sum_squares(dv(x), st.params, st.stream);
}

void CudaBackend::adamw(const Mat& w, const Mat& g, const Mat& m, const Mat& v,
                        const AdamWArgs& a) {
  const cuda::AdamWParams p{a.lr, a.beta1, a.beta2, a.eps, a.weight_decay, a.grad_scale, a.step};
  cuda::adamw(dv(w), dv(g), dv(m), dv(v), p, run_state().stream);
}

}  // namespace upipe
