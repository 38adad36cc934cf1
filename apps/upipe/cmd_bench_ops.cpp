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

// The tensors of the benchmark, (rows, cols) fp32 unless named, N(0, 1) values.
struct Tensors {
  Tensor x, y, g, m, v, x16, back, w, dw;
  Tensors(Device& dev, int64_t r, int64_t c) {
    Arena& mem = dev.mem();
    auto make = [&](uint64_t seed) {
      Tensor t(mem, Tag::kOther, DType::kF32, r, c);
      std::vector<float> row(static_cast<size_t>(c));
      for (int64_t i = 0; i < r; ++i) {
        for (int64_t j = 0; j < c; ++j)
          row[size_t(j)] = float(normal_at(seed, uint64_t(i * c + j)));
        upload(dev, row.data(), t.mat().rows_of(i, 1));
      }
      return t;
    };
    x = make(1), y = make(2), g = make(3), m = make(4), v = make(5);
    x16 = Tensor(mem, Tag::kOther, DType::kBF16, r, c);
    back = Tensor(mem, Tag::kOther, DType::kF32, r, c);
    w = Tensor(mem, Tag::kOther, DType::kF32, 1, c);
    dw = Tensor(mem, Tag::kOther, DType::kF32, 1, c);
    fill(dev, w, 1.0f);
    zero(dev, dw);
    fill(dev, v, 0.5f);  // AdamW's second moments are positive
  }
};

// The timed ops: a copy first (the reference), then every memory-bound kernel.
std::vector<Op> make_ops(Device& dev, Tensors& t, double elems) {
  static const AdamWArgs aw{1e-3, 0.9, 0.95, 1e-8, 0.1, 1.0, 3};
  return {
      {"copy fp32", 8 * elems, [&] { copy(dev, t.y, t.x); }},
      {"rmsnorm forward", 8 * elems, [&] { rmsnorm_forward(dev, t.x, t.w, 1e-5f, t.y); }},
      {"rmsnorm backward", 12 * elems,
       [&] { rmsnorm_backward(dev, t.x, t.w, 1e-5f, t.g, t.m, t.dw); }},
      {"swiglu forward", 12 * elems, [&] { swiglu_forward(dev, t.x, t.g, t.y); }},
      {"swiglu backward", 20 * elems, [&] { swiglu_backward(dev, t.x, t.g, t.y, t.m, t.back); }},
      {"convert fp32->bf16", 6 * elems, [&] { copy(dev, t.x16, t.x); }},
      {"convert bf16->fp32", 6 * elems, [&] { copy(dev, t.back, t.x16); }},
      {"add_into fp32", 12 * elems, [&] { add_into(dev, t.y, t.x); }},
      {"adamw", 28 * elems, [&] { adamw(dev, t.y, t.g, t.m, t.v, aw); }},
  };
}

int run(Process& proc, const Options& opt) {
  Device dev;
  dev.mem().set_advice("fewer --rows or --cols");  // the only sizes this command takes
  dev.mem().set_budget_setting("");
  const int64_t r = opt.rows, c = opt.cols;
  Tensors t(dev, r, c);
  const Tensor &x = t.x, &y = t.y, &g = t.g, &m = t.m, &x16 = t.x16, &back = t.back, &w = t.w;
  std::vector<Op> ops = make_ops(dev, t, double(r) * double(c));
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
    jops.push_back(
        {{"op", op.name}, {"s", op.best}, {"gb_per_s", gbs}, {"vs_copy", gbs / copy_gbs}});
  }
  if (opt.json) {
    print_json(
        {{"rows", r}, {"cols", c}, {"iters", opt.iters}, {"ops", jops}, {"cpu", cpu_model_name()}});
    return 0;
  }
  std::printf("memory-bound kernels, (%lld, %lld) fp32 tensors, one thread, kernels %s\n",
              (long long)r, (long long)c, cpu_isa_name(cpu_isa()));
  for (const auto& j : jops)
    std::printf("  %-20s %9.1f us  %6.2f GB/s  (%.2fx copy)\n", j["op"].get<std::string>().c_str(),
                j["s"].get<double>() * 1e6, j["gb_per_s"].get<double>(),
                j["vs_copy"].get<double>());
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
