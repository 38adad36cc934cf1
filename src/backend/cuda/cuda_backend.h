// The CUDA backend: cuBLASLt GEMMs (gemm_cublaslt.h), the flash-attention kernels
// (attention_cuda.h), the elementwise kernels (elementwise_cuda.h); the device arena is one
// cudaMalloc carved by first fit, the host arena pinned memory (cuda_memory.h). Every op is
// queued on the backend's compute stream; ops that return a host value (cross_entropy,
// sum_squares) and copies that touch host memory synchronise it, so host code sees finished
// results (docs/backend.md, "The CUDA backend").
//
// A query-only instance (no GPU needed) answers the workspace and support queries and nothing
// else: it is what the meta device asks when `upipe plan --backend cuda` plans a GPU run on a
// machine without one.
#pragma once

#include <memory>
#include <string>

#include "backend/backend.h"

namespace upipe {

// Whether this process can run the CUDA backend, and if not why ("no CUDA device: CUDA driver
// version is insufficient for CUDA runtime version"); tests skip with the reason.
bool cuda_available(std::string* why = nullptr);
// "driver 13.0, runtime 13.0, cuBLASLt 13.1.0, cuDNN 9.19.0 (frontend 1.32.0)": the CUDA libraries
// this process loaded ("driver none" without one); no GPU needed.
std::string cuda_library_versions();
// total - free of the current GPU (cudaMemGetInfo).
int64_t cuda_used_bytes();

class CudaBackend final : public Backend {
 public:
  enum class Mode { kRun, kQueryOnly };
  // kRun picks the GPU local_rank % device count (OMPI_COMM_WORLD_LOCAL_RANK) and throws
  // ConfigError, naming the reason, when there is none.
  explicit CudaBackend(Mode mode = Mode::kRun);
  ~CudaBackend() override;
  BackendKind kind() const override { return BackendKind::kCuda; }
  bool computes() const override { return mode_ == Mode::kRun; }
  int device() const { return device_; }
  void* native_stream() const;  // the compute stream (cudaStream_t), for the NCCL communicator

  std::unique_ptr<Allocator> make_device_allocator() const override;
  std::unique_ptr<Allocator> make_host_allocator() const override;
  void copy(void* dst, const void* src, int64_t bytes, CopyKind kind, Stream s) override;
  // Also waits for the copy lanes.
  void sync(Stream s) override;
  // On its lane's stream (copy_lanes.h: device -> host on one, the rest on the other) after an
  // event of the compute stream and the events of the other lane's copies it must follow;
  // wait_copy makes the compute stream wait on each lane's newest event <= t. Pinned host
  // memory (the host arena) makes a host copy truly asynchronous.
  CopyTicket copy_async(void* dst, const void* src, int64_t bytes, CopyKind kind) override;
  void wait_copy(CopyTicket t) override;

  int64_t gemm_workspace_bytes(const GemmShape& s) const override;
  int64_t attention_fwd_workspace_bytes(const AttnShape& s) const override;
  int64_t attention_bwd_workspace_bytes(const AttnShape& s) const override;
  int64_t rmsnorm_workspace_bytes(int64_t group) const override;
  int64_t swiglu_workspace_bytes(int64_t cols) const override;
  bool gemm_supports(const GemmShape& s) const override;
  bool attention_supports(const AttnShape& s) const override;
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
  struct State;  // streams, copy events, cuBLASLt, the parameter block (kRun only)
  State& run_state() const;
  Mode mode_;
  int device_ = -1;
  std::unique_ptr<State> state_;
};

}  // namespace upipe
