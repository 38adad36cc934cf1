// `upipe bench ops`: the memory-bound CPU kernels (RMSNorm, SwiGLU, dtype conversions, AdamW,
// add_into) against a plain copy of the same tensors, one thread, on tensors far larger than the
// caches. Each op's bandwidth is the bytes it must read and write (every input once, every output
// once) over its best time; "x copy" divides by the copy's bandwidth measured in the same
// iterations. A few results are checked against scalar formulas before anything is timed.
#include <chrono>
#include <cmath>
#include <functional>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "apps/upipe/commands.h"
#include "apps/upipe/report.h"
#include "backend/cpu/cpu_isa.h"
#include "backend/device.h"
#include "backend/optim.h"
#include "backend/rmsnorm.h"
#include "backend/swiglu.h"
#include "backend/tensor_ops.h"
#include "core/rng.h"

namespace upipe::app {
namespace {

struct Options {
  int64_t rows = 4096, cols = 4096;
  int iters = 5;
  bool json = false;
};

double now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

struct Op {
  std::string name;
  double bytes;  // read + written
  std::function<void()> run;
  double best = 1e30;
};

// The first n values of row 0 of m, as fp32.
std::vector<float> head(Device& dev, const Mat& m, int64_t n) {
  return download(dev, m.block(0, 1, 0, n));
}

// Spot checks against scalar formulas: y = rmsnorm(x) (w = 1), h = silu(x) g, back = bf16(x).
bool spot_check(Device& dev, const Mat& x, const Mat& y, const Mat& g, const Mat& h,
                const Mat& back) {
  const int64_t n = 64;
  const std::vector<float> xs = head(dev, x, x.cols), ys = head(dev, y, n), gs = head(dev, g, n),
                           hs = head(dev, h, n), xb = head(dev, back, n);
  double ss = 0;
  for (float v : xs) ss += double(v) * v;
  const double inv = 1.0 / std::sqrt(ss / double(x.cols) + 1e-5);
  bool ok = true;
  for (size_t i = 0; i < size_t(n); ++i) {
    ok &= std::abs(ys[i] - xs[i] * inv) <= 1e-5 * (1 + std::abs(ys[i]));
    const double silu = xs[i] / (1 + std::exp(-double(xs[i])));
    ok &= std::abs(hs[i] - silu * gs[i]) <= 1e-5 * (1 + std::abs(silu * gs[i]));
    ok &= xb[i] == bf16_to_f32(f32_to_bf16(xs[i]));
  }
  return ok;
}

int run(Process& proc, const Options& opt) {
  Device dev;
  Arena& mem = dev.mem();
  const int64_t r = opt.rows, c = opt.cols;
  const DType f32 = DType::kF32, bf16 = DType::kBF16;
  auto make = [&](DType t, uint64_t seed) {
    Tensor x(mem, Tag::kOther, t, r, c);
    std::vector<float> row(static_cast<size_t>(c));
    for (int64_t i = 0; i < r; ++i) {
      for (int64_t j = 0; j < c; ++j) row[size_t(j)] = float(normal_at(seed, uint64_t(i * c + j)));
      upload(dev, row.data(), x.mat().rows_of(i, 1));
    }
    return x;
  };
  Tensor x = make(f32, 1), y = make(f32, 2), g = make(f32, 3), m = make(f32, 4), v = make(f32, 5);
  Tensor x16(mem, Tag::kOther, bf16, r, c), back(mem, Tag::kOther, f32, r, c);
  Tensor w(mem, Tag::kOther, f32, 1, c), dw(mem, Tag::kOther, f32, 1, c);
  fill(dev, w, 1.0f);
  zero(dev, dw);
  fill(dev, v, 0.5f);
  const double e = double(r) * double(c);
  const AdamWArgs aw{1e-3, 0.9, 0.95, 1e-8, 0.1, 1.0, 3};
  std::vector<Op> ops = {
      {"copy fp32", 8 * e, [&] { copy(dev, y, x); }},
      {"rmsnorm forward", 8 * e, [&] { rmsnorm_forward(dev, x, w, 1e-5f, y); }},
      {"rmsnorm backward", 12 * e, [&] { rmsnorm_backward(dev, x, w, 1e-5f, g, m, dw); }},
      {"swiglu forward", 12 * e, [&] { swiglu_forward(dev, x, g, y); }},
      {"swiglu backward", 20 * e, [&] { swiglu_backward(dev, x, g, y, m, back); }},
      {"convert fp32->bf16", 6 * e, [&] { copy(dev, x16, x); }},
      {"convert bf16->fp32", 6 * e, [&] { copy(dev, back, x16); }},
      {"add_into fp32", 12 * e, [&] { add_into(dev, y, x); }},
      {"adamw", 28 * e, [&] { adamw(dev, y, g, m, v, aw); }},
  };
  // Correctness first: y = rmsnorm(x), then h = swiglu(x, g) into m, bf16 round trip into back.
  rmsnorm_forward(dev, x, w, 1e-5f, y);
  swiglu_forward(dev, x, g, m);
  copy(dev, x16, x);
  copy(dev, back, x16);
  if (!spot_check(dev, x, y, g, m, back)) {
    std::fprintf(stderr, "upipe bench ops: a result differs from its scalar formula\n");
    return 1;
  }
  for (int it = 0; it < opt.iters; ++it)
    for (Op& op : ops) {
      const double t0 = now();
      op.run();
      op.best = std::min(op.best, now() - t0);
    }
  if (!proc.root()) return 0;
  const double copy_gbs = ops[0].bytes / ops[0].best / 1e9;
  nlohmann::json jops = nlohmann::json::array();
  for (const Op& op : ops) {
    const double gbs = op.bytes / op.best / 1e9;
    jops.push_back({{"op", op.name}, {"s", op.best}, {"gb_per_s", gbs}, {"vs_copy", gbs / copy_gbs}});
  }
  if (opt.json) {
    print_json({{"rows", r}, {"cols", c}, {"iters", opt.iters}, {"ops", jops},
                {"cpu", cpu_model_name()}});
    return 0;
  }
  std::printf("memory-bound kernels, (%lld, %lld) fp32 tensors, one thread, kernels %s\n",
              (long long)r, (long long)c, cpu_isa_name(cpu_isa()));
  for (const auto& j : jops)
    std::printf("  %-20s %8.4f s  %6.2f GB/s  (%.2fx copy)\n", j["op"].get<std::string>().c_str(),
                j["s"].get<double>(), j["gb_per_s"].get<double>(), j["vs_copy"].get<double>());
  return 0;
}

}  // namespace

Runner add_bench_ops(CLI::App& cmd) {
  auto opt = std::make_shared<Options>();
  cmd.add_option("--rows", opt->rows, "rows of every tensor")
      ->capture_default_str()
      ->check(integer_in<int64_t>(1, int64_t(1) << 20));
  cmd.add_option("--cols", opt->cols, "columns of every tensor (the RMSNorm width)")
      ->capture_default_str()
      ->check(integer_in<int64_t>(64, 65536));
  cmd.add_option("--iters", opt->iters, "timed repetitions (the minimum is reported)")
      ->capture_default_str()
      ->check(integer_in<int>(1, kMaxIters));
  cmd.add_flag("--json", opt->json, "print one JSON object");
  return [opt](Process& p) { return run(p, *opt); };
}

}  // namespace upipe::app
