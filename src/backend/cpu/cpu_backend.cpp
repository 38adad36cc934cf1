#include "backend/cpu/cpu_backend.h"

#include <fmt/format.h>

#include <cstdlib>
#include <cstring>
#include <string>

#include "backend/cpu/attention_cpu.h"
#include "backend/cpu/attention_tiles.h"
#include "backend/cpu/cpu_ops.h"
#include "backend/cpu/gemm_cpu.h"
#include "core/errors.h"

// libgomp's, which oneDNN runs on (linked explicitly: the backend is not built with -fopenmp).
extern "C" void omp_set_num_threads(int n);

namespace upipe {

CpuBackend::CpuBackend() {
  static const bool once = [] {
    if (std::getenv("OMP_NUM_THREADS") == nullptr) omp_set_num_threads(1);
    return true;
  }();
  (void)once;
  if (const char* v = std::getenv("UPIPE_CPU_COPIES")) {
    const std::string mode(v);
    if (mode == "deferred")
      defer_ = true;
    else if (mode != "immediate" && !mode.empty())
      throw ConfigError(
          fmt::format("UPIPE_CPU_COPIES={}: expected immediate (the default) or deferred", mode));
  }
  if (const char* v = std::getenv("UPIPE_CPU_ATTN_READS_O")) {
    const std::string mode(v);
    if (mode == "1")
      reads_o_ = true;
    else if (mode != "0" && !mode.empty())
      throw ConfigError(
          fmt::format("UPIPE_CPU_ATTN_READS_O={}: expected 0 (the default) or 1", mode));
  }
}

bool CpuBackend::attention_backward_reads_o(const AttnShape&) const {
  return reads_o_;
}

std::unique_ptr<Allocator> CpuBackend::make_device_allocator() const {
  return std::make_unique<HostCachingAllocator>();
}

std::unique_ptr<Allocator> CpuBackend::make_host_allocator() const {
  return std::make_unique<HostCachingAllocator>();
}

void CpuBackend::copy(void* dst, const void* src, int64_t bytes, CopyKind, Stream) {
  std::memcpy(dst, src, size_t(bytes));
}

CopyTicket CpuBackend::copy_async(void* dst, const void* src, int64_t bytes, CopyKind kind) {
  const CopyTicket t{++async_copies_};
  if (defer_)
    pending_.issue(t.id, CopyExtent::of(dst, src, bytes, kind), {dst, src, bytes});
  else
    copy(dst, src, bytes, kind, Stream{});
  return t;
}

void CpuBackend::wait_copy(CopyTicket t) {
  const auto retired = pending_.retire(t.id);
  for (size_t i : copy_run_order(retired.copies)) {
    const PendingCopy& c = retired.copies[i].payload;
    std::memcpy(c.dst, c.src, size_t(c.bytes));
  }
}

void CpuBackend::sync(Stream) {
  if (pending_.empty()) return;
  const size_t n = pending_.size();
  pending_.clear();  // never run: their buffers may be gone
  throw Error(
      fmt::format("{} asynchronous cop{} never waited on before sync (a missing Device::wait)", n,
                  n == 1 ? "y was" : "ies were"));
}

int64_t CpuBackend::gemm_workspace_bytes(const GemmShape& s) const {
  return cpu::gemm_workspace_bytes(s);
}

int64_t CpuBackend::attention_fwd_workspace_bytes(const AttnShape& s) const {
  return cpu::attn_fwd_workspace_bytes(s.d, s.t, cpu::attn_bf16_dot(s.t));
}

int64_t CpuBackend::attention_bwd_workspace_bytes(const AttnShape& s) const {
  return cpu::attn_bwd_workspace_bytes(s.d, s.t, cpu::attn_bf16_dot(s.t));
}

int64_t CpuBackend::rmsnorm_workspace_bytes(int64_t group) const {
  return 3 * group * 4;
}

int64_t CpuBackend::swiglu_workspace_bytes(int64_t cols) const {
  return 3 * cols * 4;
}

bool CpuBackend::native_bf16_gemm() const {
  return cpu::native_bf16_gemm();
}

bool CpuBackend::gemm_supports(const GemmShape& s) const {
  auto ok = [](DType t) { return t == DType::kF32 || t == DType::kBF16; };
  return ok(s.a) && ok(s.b) && ok(s.c);
}

bool CpuBackend::attention_supports(const AttnShape& s) const {
  return s.d > 0 && s.d <= 1024 && (s.t == DType::kF32 || s.t == DType::kBF16);
}

void CpuBackend::gemm(const GemmArgs& a, void* ws) {
  cpu::gemm(a, ws);
}

void CpuBackend::attention_forward(const AttnFwdArgs& a, void* ws) {
  float* w = static_cast<float*>(ws);
  if (a.accumulate)
    cpu::attention_forward(a.p, nullptr, nullptr, &a.acc, &a.m, &a.l, w);
  else
    cpu::attention_forward(a.p, &a.o, &a.lse, nullptr, nullptr, nullptr, w);
}

void CpuBackend::attention_backward(const AttnBwdArgs& a, void* ws) {
  cpu::attention_backward(a.p, a.dout, a.lse, a.delta, a.dq, a.dk, a.dv, static_cast<float*>(ws));
}

void CpuBackend::attention_accumulate_init(const Mat& acc, const Mat& m, const Mat& l) {
  cpu::fill(acc, 0.0f);
  cpu::fill(m, -INFINITY);
  cpu::fill(l, 0.0f);
}

void CpuBackend::attention_finalize(const Mat& acc, const Mat& m, const Mat& l, int d, const Mat& o,
                                    const Mat& lse) {
  cpu::attention_finalize(acc, m, l, d, o, lse);
}

void CpuBackend::lse_merge(const Mat& o, const Mat& lse, const Mat& o2, const Mat& lse2, int d) {
  cpu::lse_merge(o, lse, o2, lse2, d);
}

void CpuBackend::attention_delta(const Mat& o, const Mat& dout, int d, const Mat& delta) {
  cpu::attention_delta(o, dout, d, delta);
}

void CpuBackend::rope(const Mat& x, int d, const RowPositions& pos, const RopeParams& rp,
                      int sign) {
  cpu::rope(x, d, pos, rp, sign);
}

void CpuBackend::rmsnorm_forward(const Mat& x, const Mat& w, int64_t group, float eps, const Mat& y,
                                 void* ws) {
  cpu::rmsnorm_forward(x, w, group, eps, y, static_cast<float*>(ws));
}

void CpuBackend::rmsnorm_backward(const Mat& x, const Mat& w, int64_t group, float eps,
                                  const Mat& dy, const Mat& dx, const Mat& dw, void* ws) {
  cpu::rmsnorm_backward(x, w, group, eps, dy, dx, dw, static_cast<float*>(ws));
}

double CpuBackend::cross_entropy(const Mat& logits, std::span<const int32_t> labels, float scale) {
  return cpu::cross_entropy(logits, labels, scale);
}

void CpuBackend::swiglu_forward(const Mat& a, const Mat& b, const Mat& h, void* ws) {
  cpu::swiglu_forward(a, b, h, static_cast<float*>(ws));
}

void CpuBackend::swiglu_backward(const Mat& a, const Mat& b, const Mat& dh, const Mat& da,
                                 const Mat& db, void* ws) {
  cpu::swiglu_backward(a, b, dh, da, db, static_cast<float*>(ws));
}

void CpuBackend::fill(const Mat& x, float value) {
  cpu::fill(x, value);
}

void CpuBackend::convert(const Mat& dst, const Mat& src) {
  cpu::convert(dst, src);
}

void CpuBackend::add_into(const Mat& dst, const Mat& src) {
  cpu::add_into(dst, src);
}

void CpuBackend::add_transposed(const Mat& dst, const Mat& src, float beta) {
  cpu::add_transposed(dst, src, beta);
}

void CpuBackend::gather_rows(const Mat& dst, const Mat& table, std::span<const int32_t> ids) {
  for (int64_t r = 0; r < dst.rows; ++r)
    cpu::convert(dst.rows_of(r, 1), table.rows_of(ids[size_t(r)], 1));
}

void CpuBackend::scatter_add_rows(const Mat& table, const Mat& src, std::span<const int32_t> ids) {
  for (int64_t r = 0; r < src.rows; ++r)
    cpu::add_into(table.rows_of(ids[size_t(r)], 1), src.rows_of(r, 1));
}

double CpuBackend::sum_squares(const Mat& x) {
  return cpu::sum_squares(x);
}

void CpuBackend::adamw(const Mat& w, const Mat& g, const Mat& m, const Mat& v, const AdamWArgs& a) {
  cpu::adamw(w, g, m, v, a);
}

}  // namespace upipe
