#include "train/flops.h"

#include <algorithm>
#include <chrono>

#include "backend/gemm.h"
#include "backend/tensor_ops.h"
#include "core/errors.h"

namespace upipe {

double training_flops_per_sequence(const ModelConfig& m, int64_t seq_len) {
  const double d = double(m.hidden_size), f = double(m.intermediate_size);
  const double layer = d * double(m.q_dim()) * 2 + d * double(m.kv_dim()) * 2 + 3 * d * f;
  const double matrix_params = double(m.num_hidden_layers) * layer + double(m.vocab_size) * d;
  const double s = double(seq_len);
  const double attention = 6.0 * s * double(m.q_dim()) * double(m.num_hidden_layers);
  return s * (6.0 * matrix_params + attention);
}

namespace {

double timed_gemm_flops(Device& dev, DType dtype, int64_t n, int reps) {
  Tensor a(dev.mem(), Tag::kWorkspace, dtype, n, n), b(dev.mem(), Tag::kWorkspace, dtype, n, n),
      c(dev.mem(), Tag::kWorkspace, DType::kF32, n, n);
  fill(dev, a, 0.5f);
  fill(dev, b, 0.25f);
  double best = 1e30;
  for (int i = 0; i <= reps; ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    gemm(dev, a, false, b, true, c);
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (i > 0) best = std::min(best, s);  // the first call warms up
  }
  return 2.0 * double(n) * double(n) * double(n) / best;
}

}  // namespace

double measure_gemm_flops(Device& dev, DType dtype, int64_t n, int reps, int64_t* measured_n) {
  if (!dev.backend().computes()) return 0;
  // The operands come out of the run's own budget, which the plan does not count them in: where
  // they do not fit beside what is resident, smaller ones (down to 64) are timed instead.
  for (;; n /= 2) try {
      const double rate = timed_gemm_flops(dev, dtype, n, reps);
      if (measured_n) *measured_n = n;
      return rate;
    } catch (const OutOfMemoryError&) {
      if (n / 2 < 64) throw;
    }
}

GemmRate measure_job_gemm_rate(Communicator& world, Device& dev, DType dtype, int64_t n_wanted,
                               int reps) {
  world.barrier();
  int64_t n = 0;
  float rate = float(measure_gemm_flops(dev, dtype, n_wanted, reps, &n));
  world.all_reduce(&rate, 1, DType::kF32, ReduceOp::kMax);
  float minus_side = -float(n);
  world.all_reduce(&minus_side, 1, DType::kF32, ReduceOp::kMax);
  return {double(rate), int64_t(-minus_side)};
}

}  // namespace upipe
