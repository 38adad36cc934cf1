// The CPU backend: oneDNN GEMM, the AVX2/FMA flash-attention kernels and the elementwise kernels
// of this directory, on host memory (the device arena is simulated HBM). Every op runs
// synchronously on the calling thread, so streams are trivially ordered.
#pragma once

#include "backend/backend.h"
#include "backend/copy_lanes.h"

namespace upipe {

class CpuBackend final : public Backend {
 public:
  // One thread per rank: oneDNN runs on one OpenMP thread unless OMP_NUM_THREADS says otherwise.
  // Its scratchpads grow with the thread count, so a plan (the meta device asks this backend)
  // and a run count the same workspace bytes only with the same count.
  CpuBackend();
  BackendKind kind() const override { return BackendKind::kCpu; }
  bool computes() const override { return true; }
  std::unique_ptr<Allocator> make_device_allocator() const override;
  std::unique_ptr<Allocator> make_host_allocator() const override;
  void copy(void* dst, const void* src, int64_t bytes, CopyKind kind, Stream s) override;
  // Throws when deferred copies were never waited on (a strategy missed a wait).
  void sync(Stream) override;
  // At once (the default), or with UPIPE_CPU_COPIES=deferred only when waited on: the copies up
  // to the ticket waited on, in the order of the two copy lanes (copy_lanes.h) farthest from
  // issue order. That is the latest and the most reordered a GPU's two copy streams may run
  // them, so a missing wait or a missing dependency between the lanes shows on the CPU as stale
  // data or a sync error (tests/cli/async_copies.sh).
  CopyTicket copy_async(void* dst, const void* src, int64_t bytes, CopyKind kind) override;
  void wait_copy(CopyTicket t) override;

  int64_t gemm_workspace_bytes(const GemmShape& s) const override;
  int64_t attention_fwd_workspace_bytes(const AttnShape& s) const override;
  int64_t attention_bwd_workspace_bytes(const AttnShape& s) const override;
  int64_t rmsnorm_workspace_bytes(int64_t group) const override;
  int64_t swiglu_workspace_bytes(int64_t cols) const override;
  bool gemm_supports(const GemmShape& s) const override;
  bool native_bf16_gemm() const override;
  bool attention_supports(const AttnShape& s) const override;
  // False; UPIPE_CPU_ATTN_READS_O=1 says true (nothing else changes: the CPU kernels ignore o),
  // so the strategies' keep-o paths and formulas, which only the CUDA backend takes otherwise, run
  // in the CPU suite.
  bool attention_backward_reads_o(const AttnShape& s) const override;

  void gemm(const GemmArgs& a, void* ws) override;
  void attention_forward(const AttnFwdArgs& a, void* ws) override;
  void attention_backward(const AttnBwdArgs& a, void* ws) override;
  void attention_accumulate_init(const Mat& acc, const Mat& m, const Mat& l) override;
  void attention_finalize(const Mat& acc, const Mat& m, const Mat& l, int d, const Mat& o,
                          const Mat& lse) override;
  void lse_merge(const Mat& o, const Mat& lse, const Mat& o2, const Mat& lse2, int d) override;
  void attention_delta(const Mat& o, const Mat& dout, int d, const Mat& delta) override;
  void rope(const Mat& x, int d, const RowPositions& pos, const RopeParams& rp, int sign) override;
  void rmsnorm_forward(const Mat& x, const Mat& w, int64_t group, float eps, const Mat& y,
                       void* ws) override;
  void rmsnorm_backward(const Mat& x, const Mat& w, int64_t group, float eps, const Mat& dy,
                        const Mat& dx, const Mat& dw, void* ws) override;
  double cross_entropy(const Mat& logits, std::span<const int32_t> labels, float scale) override;
  void swiglu_forward(const Mat& a, const Mat& b, const Mat& h, void* ws) override;
  void swiglu_backward(const Mat& a, const Mat& b, const Mat& dh, const Mat& da, const Mat& db,
                       void* ws) override;
  void fill(const Mat& x, float value) override;
  void convert(const Mat& dst, const Mat& src) override;
  void add_into(const Mat& dst, const Mat& src) override;
  void add_transposed(const Mat& dst, const Mat& src, float beta) override;
  void gather_rows(const Mat& dst, const Mat& table, std::span<const int32_t> ids) override;
  void scatter_add_rows(const Mat& table, const Mat& src, std::span<const int32_t> ids) override;
  double sum_squares(const Mat& x) override;
  void adamw(const Mat& w, const Mat& g, const Mat& m, const Mat& v, const AdamWArgs& a) override;

 private:
  struct PendingCopy {
    void* dst = nullptr;
    const void* src = nullptr;
    int64_t bytes = 0;
  };
  bool defer_ = false;
  bool reads_o_ = false;            // UPIPE_CPU_ATTN_READS_O=1
  CopyLanes<PendingCopy> pending_;  // deferred copies not yet run
};

}  // namespace upipe
