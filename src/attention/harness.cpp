#include "attention/harness.h"

#include <chrono>
#include <cmath>
#include <memory>
#include <vector>

#include "backend/tensor_ops.h"
#include "core/rng.h"

namespace upipe {
namespace {

constexpr uint64_t kSeedX = 1, kSeedDy = 2, kSeedWq = 3, kSeedWk = 4, kSeedWv = 5, kSeedWo = 6,
                   kSeedWqn = 7, kSeedWkn = 8;

// Fills rows of m whose global row index is given by `rows`; element (g, c) is
// stddev * normal(seed, g * cols + c).
// Values are made on the host and uploaded (nothing is made for a device that does not compute).
void fill_rows(Device& dev, const Mat& m, const RowPositions& rows, uint64_t seed, double stddev,
               double mean = 0.0) {
  if (!dev.backend().computes()) return;
  std::vector<float> buf(size_t(m.cols));
  int64_t r = 0;
  for (const RowPositions::Run& run : rows.runs) {
    for (int64_t t = 0; t < run.rows; ++t, ++r) {
      const uint64_t g = uint64_t(run.pos + t);
      for (int64_t c = 0; c < m.cols; ++c)
        buf[size_t(c)] = float(mean + stddev * normal_at(seed, g * uint64_t(m.cols) + uint64_t(c)));
      upload(dev, buf.data(), m.rows_of(r, 1));
    }
  }
}

void fill_all(Device& dev, const Mat& m, uint64_t seed, double stddev, double mean = 0.0) {
  fill_rows(dev, m, RowPositions::contiguous(m.rows, 0), seed, stddev, mean);
}

double now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

}  // namespace

BlockTensors make_block_tensors(Device& dev, const AttentionConfig& c, const RowPositions& rows,
                                uint64_t seed) {
  Arena& mem = dev.mem();
  const int64_t n = rows.total_rows(), dm = c.model_dim(), d = c.head_dim;
  const DType t = c.dtype, f32 = DType::kF32;
  BlockTensors b;
  const DType ot = c.out_dtype();
  b.x = Tensor(mem, Tag::kAct, t, n, dm);
  b.dy = Tensor(mem, Tag::kAct, ot, n, dm);
  b.y = Tensor(mem, Tag::kAct, ot, n, dm);
  b.dx = Tensor(mem, Tag::kAct, ot, n, dm);
  b.wq = Tensor(mem, Tag::kParams, t, c.heads * d, dm);
  b.wk = Tensor(mem, Tag::kParams, t, c.kv_heads * d, dm);
  b.wv = Tensor(mem, Tag::kParams, t, c.kv_heads * d, dm);
  b.wo = Tensor(mem, Tag::kParams, t, dm, c.heads * d);
  b.gq = Tensor(mem, Tag::kGrads, f32, c.heads * d, dm);
  b.gk = Tensor(mem, Tag::kGrads, f32, c.kv_heads * d, dm);
  b.gv = Tensor(mem, Tag::kGrads, f32, c.kv_heads * d, dm);
  b.go = Tensor(mem, Tag::kGrads, f32, dm, c.heads * d);
  if (c.qk_norm) {
    b.wqn = Tensor(mem, Tag::kParams, t, 1, d);
    b.wkn = Tensor(mem, Tag::kParams, t, 1, d);
    b.gqn = Tensor(mem, Tag::kGrads, f32, 1, d);
    b.gkn = Tensor(mem, Tag::kGrads, f32, 1, d);
  }
  const uint64_t s = seed * 16;
  fill_rows(dev, b.x, rows, s + kSeedX, 1.0);
  fill_rows(dev, b.dy, rows, s + kSeedDy, 1.0);
  const double wstd = 1.0 / std::sqrt(double(dm));
  fill_all(dev, b.wq, s + kSeedWq, wstd);
  fill_all(dev, b.wk, s + kSeedWk, wstd);
  fill_all(dev, b.wv, s + kSeedWv, wstd);
  fill_all(dev, b.wo, s + kSeedWo, wstd);
  if (c.qk_norm) {
    fill_all(dev, b.wqn, s + kSeedWqn, 0.25, 1.0);
    fill_all(dev, b.wkn, s + kSeedWkn, 0.25, 1.0);
  }
  return b;
}

BlockRun run_block(AttentionStrategy& s, Device& dev, BlockTensors& t, bool accumulate, bool keep) {
  const float beta = accumulate ? 1.0f : 0.0f;
  Arena& mem = dev.mem();
  mem.reset_peak();
  dev.host().reset_peak();
  const int watch = mem.start_watch(kAttnIntermediateTags);
  BlockRun r;
  double t0 = now();
  std::unique_ptr<AttentionStash> kept;
  if (keep)
    kept = s.forward_stash(t.x, t.weights(), t.y, beta);
  else
    s.forward(t.x, t.weights(), t.y, beta);
  dev.backend().sync(Stream{});  // a GPU queues the work: time it finished
  r.fwd_s = now() - t0;
  t0 = now();
  if (keep)
    s.backward_stashed(std::move(kept), t.x, t.dy, t.weights(), t.dx, t.grads(), beta, beta);
  else
    s.backward(t.x, t.dy, t.weights(), t.dx, t.grads(), beta, beta);
  dev.backend().sync(Stream{});
  r.bwd_s = now() - t0;
  r.peak_bytes = mem.peak();
  r.peak_by_tag = mem.at_peak_by_tag();
  r.attn_peak_bytes = mem.watch_peak(watch);
  r.host_peak_bytes = dev.host().peak();
  mem.stop_watch(watch);
  return r;
}

}  // namespace upipe
