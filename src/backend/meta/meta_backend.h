// The meta backend: the planner's device. Its arenas count bytes without backing them, every
// workspace query is answered by the backend it plans for (so a plan has exactly the bytes a
// real run of that backend has), and ops compute nothing. This is the one place that knows
// a device may not compute.
#pragma once

#include "backend/backend.h"

namespace upipe {

class MetaBackend final : public Backend {
 public:
  explicit MetaBackend(std::unique_ptr<Backend> target) : target_(std::move(target)) {}
  BackendKind kind() const override { return BackendKind::kMeta; }
  bool computes() const override { return false; }
  const Backend& target() const { return *target_; }
  std::unique_ptr<Allocator> make_device_allocator() const override;
  std::unique_ptr<Allocator> make_host_allocator() const override;
  void copy(void*, const void*, int64_t, CopyKind, Stream) override {}
  void sync(Stream) override {}

  int64_t gemm_workspace_bytes(const GemmShape& s) const override {
    return target_->gemm_workspace_bytes(s);
  }
  int64_t attention_fwd_workspace_bytes(const AttnShape& s) const override {
    return target_->attention_fwd_workspace_bytes(s);
  }
  int64_t attention_bwd_workspace_bytes(const AttnShape& s) const override {
    return target_->attention_bwd_workspace_bytes(s);
  }
  int64_t rmsnorm_workspace_bytes(int64_t group) const override {
    return target_->rmsnorm_workspace_bytes(group);
  }
  int64_t swiglu_workspace_bytes(int64_t cols) const override {
    return target_->swiglu_workspace_bytes(cols);
  }
  bool gemm_supports(const GemmShape& s) const override { return target_->gemm_supports(s); }
  bool attention_supports(const AttnShape& s) const override {
    return target_->attention_supports(s);
  }
  bool attention_backward_reads_o(const AttnShape& s) const override {
    return target_->attention_backward_reads_o(s);
  }

  void gemm(const GemmArgs&, void*) override {}
  void attention_forward(const AttnFwdArgs&, void*) override {}
  void attention_backward(const AttnBwdArgs&, void*) override {}
  void attention_accumulate_init(const Mat&, const Mat&, const Mat&) override {}
  void attention_finalize(const Mat&, const Mat&, const Mat&, int, const Mat&,
                          const Mat&) override {}
  void lse_merge(const Mat&, const Mat&, const Mat&, const Mat&, int) override {}
  void attention_delta(const Mat&, const Mat&, int, const Mat&) override {}
  void rope(const Mat&, int, const RowPositions&, const RopeParams&, int) override {}
  void rmsnorm_forward(const Mat&, const Mat&, int64_t, float, const Mat&, void*) override {}
  void rmsnorm_backward(const Mat&, const Mat&, int64_t, float, const Mat&, const Mat&, const Mat&,
                        void*) override {}
  double cross_entropy(const Mat&, std::span<const int32_t>, float) override { return 0.0; }
  void swiglu_forward(const Mat&, const Mat&, const Mat&, void*) override {}
  void swiglu_backward(const Mat&, const Mat&, const Mat&, const Mat&, const Mat&, void*) override {
  }
  void fill(const Mat&, float) override {}
  void convert(const Mat&, const Mat&) override {}
  void add_into(const Mat&, const Mat&) override {}
  void add_transposed(const Mat&, const Mat&, float) override {}
  void gather_rows(const Mat&, const Mat&, std::span<const int32_t>) override {}
  void scatter_add_rows(const Mat&, const Mat&, std::span<const int32_t>) override {}
  double sum_squares(const Mat&) override { return 0.0; }
  void adamw(const Mat&, const Mat&, const Mat&, const Mat&, const AdamWArgs&) override {}

 private:
  std::unique_ptr<Backend> target_;
};

}  // namespace upipe
