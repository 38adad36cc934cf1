// `upipe bench kernel`: the flash-attention kernels against a oneDNN GEMM of the same inner
// dimension, in one process, one thread. Correctness is checked (sampled rows against the
// naive fp64 reference) before anything is timed.
//
// FLOP counting rule: causal forward = 2 S^2 H d (the 4 S^2 H d of two GEMMs, halved by the
// mask); backward = 2.5x forward. The GEMM is (M, K) x (K, N) with K = d and M = N = min(S, 4096),
// i.e. a score block Q K^T of one head.
#include <algorithm>
#include <chrono>
#include <limits>
#include <nlohmann/json.hpp>

#include "apps/upipe/commands.h"
#include "apps/upipe/report.h"
#include "apps/upipe/settings_cli.h"
#include "backend/attention.h"
#include "backend/cpu/cpu_isa.h"
#include "backend/device.h"
#include "backend/gemm.h"
#include "backend/reference/attention_ref.h"
#include "backend/tensor_ops.h"
#include "core/errors.h"
#include "core/rng.h"

namespace upipe::app {
namespace {

struct Options {
  ShapeOptions shape;
  int iters = 3;
  bool json = false;
};

double now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

void fill_random(Device& dev, const Mat& m, uint64_t seed) {
  std::vector<float> v(size_t(m.rows * m.cols));
  for (size_t i = 0; i < v.size(); ++i) v[i] = float(normal_at(seed, uint64_t(i)));
  upload(dev, v.data(), m);
}

std::vector<double> read_rows(Device& dev, const Mat& m, int64_t r0, int64_t n) {
  const std::vector<float> f = download(dev, m.rows_of(r0, n));
  return std::vector<double>(f.begin(), f.end());
}

// Max |fast - fp64| over sampled query rows of o and of dq, each relative to the largest
// |fp64| value of its tensor in those rows.
double sampled_error(Device& dev, const AttnProblem& p, const Mat& o, const Mat& dq,
                     const Mat& dout) {
  const std::vector<double> k = read_rows(dev, p.k, 0, p.sk()), v = read_rows(dev, p.v, 0, p.sk());
  double mo = 0, mdq = 0, eo = 0, edq = 0;
  const int64_t s = p.sq(), qc = p.q.cols, kc = p.k.cols;
  for (int64_t i : {int64_t(0), s / 3, s - 1}) {
    const std::vector<double> q = read_rows(dev, p.q, i, 1), d = read_rows(dev, dout, i, 1);
    ref::AttnDims dims{1, p.sk(), p.hq, p.hk, p.d, i, 0, p.causal};
    const size_t nq = static_cast<size_t>(qc), nk = static_cast<size_t>(p.sk() * kc);
    std::vector<double> o64(nq), lse(static_cast<size_t>(p.hq)), dq64(nq, 0.0), dk(nk, 0.0),
        dv(nk, 0.0);
    ref::attention_forward<double>(dims, {q.data(), 1, qc, qc}, {k.data(), p.sk(), kc, kc},
                                   {v.data(), p.sk(), kc, kc}, {o64.data(), 1, qc, qc},
                                   {lse.data(), p.hq, 1, 1});
    ref::attention_backward<double>(dims, {q.data(), 1, qc, qc}, {k.data(), p.sk(), kc, kc},
                                    {v.data(), p.sk(), kc, kc}, {d.data(), 1, qc, qc},
                                    {dq64.data(), 1, qc, qc}, {dk.data(), p.sk(), kc, kc},
                                    {dv.data(), p.sk(), kc, kc});
    const std::vector<double> of = read_rows(dev, o, i, 1), dqf = read_rows(dev, dq, i, 1);
    for (int64_t c = 0; c < qc; ++c) {
      mo = std::max(mo, std::abs(o64[size_t(c)]));
      mdq = std::max(mdq, std::abs(dq64[size_t(c)]));
      eo = std::max(eo, std::abs(of[size_t(c)] - o64[size_t(c)]));
      edq = std::max(edq, std::abs(dqf[size_t(c)] - dq64[size_t(c)]));
    }
  }
  return std::max(eo / std::max(mo, 1e-30), edq / std::max(mdq, 1e-30));
}

int run(Process& proc, const Options& opt, const SettingArgs& sa, const CLI::App& cmd) {
  const RunConfig set = resolve_settings(proc, sa, cmd).config;
  const AttentionConfig c = opt.shape.config(set);
  const BackendKind kind = parse_backend_kind(set.device.backend);
  Device dev({kind});
  // A GPU queues work: every timed interval ends when the stream has finished it.
  auto done = [&dev] {
    dev.backend().sync(Stream{});
    return now();
  };
  Arena& mem = dev.mem();
  // One rank holds every row of S here: a training run's knobs (more ranks, --offload-stash)
  // would not change this command's peak.
  mem.set_advice("a shorter --seq-len, fewer --heads / --kv-heads, or --dtype bf16");
  mem.set_budget_setting("");  // its budget is no setting of this command
  const int64_t s = c.seq_len, d = c.head_dim, qc = c.heads * d, kc = c.kv_heads * d;
  const DType t = c.dtype, f32 = DType::kF32;
  Tensor q(mem, Tag::kQkv, t, s, qc), k(mem, Tag::kQkv, t, s, kc), v(mem, Tag::kQkv, t, s, kc);
  Tensor o(mem, Tag::kAttnOut, t, s, qc), lse(mem, Tag::kAttnOut, f32, c.heads, s);
  Tensor dout(mem, Tag::kAttnGrad, t, s, qc), delta(mem, Tag::kAttnGrad, f32, c.heads, s);
  Tensor dq(mem, Tag::kAttnGrad, f32, s, qc), dk(mem, Tag::kAttnGrad, f32, s, kc),
      dv(mem, Tag::kAttnGrad, f32, s, kc);
  fill_random(dev, q, 1);
  fill_random(dev, k, 2);
  fill_random(dev, v, 3);
  fill_random(dev, dout, 4);
  const AttnProblem p{q, k, v, c.heads, c.kv_heads, int(d)};
  auto backward = [&] {
    zero(dev, dq);
    zero(dev, dk);
    zero(dev, dv);
    attention_delta(dev, o, dout, int(d), delta);
    attention_backward(dev, p, dout, lse, delta, dq, dk, dv, o);  // o: cuDNN's backward may run
  };
  // Correctness first.
  attention_forward(dev, p, o, lse);
  backward();
  const double err = sampled_error(dev, p, o, dq, dout);
  const double tol = t == f32 ? 1e-4 : 2e-2;
  if (!(err <= tol)) {
    std::fprintf(stderr, "upipe bench kernel: sampled relative error %.3g exceeds %.1g\n", err,
                 tol);
    return 1;
  }
  // The GEMM is timed in the same iterations as the kernels, so the ratios see the same machine
  // state (a shared machine's speed drifts between runs); each time is the minimum.
  const int64_t peak = mem.peak();
  const int64_t gn = std::min<int64_t>(s, 4096);
  Tensor a(mem, Tag::kWorkspace, f32, gn, d), b(mem, Tag::kWorkspace, f32, gn, d),
      cc(mem, Tag::kWorkspace, f32, gn, gn);
  fill_random(dev, a, 5);
  fill_random(dev, b, 6);
  gemm(dev, a, false, b, true, cc);
  double fwd = 1e30, bwd = 1e30, gm = 1e30;
  for (int it = 0; it < opt.iters; ++it) {
    double t0 = done();
    gemm(dev, a, false, b, true, cc);
    gm = std::min(gm, done() - t0);
    t0 = done();
    attention_forward(dev, p, o, lse);
    fwd = std::min(fwd, done() - t0);
    t0 = done();
    backward();
    bwd = std::min(bwd, done() - t0);
  }
  const double fwd_flops = 2.0 * double(s) * double(s) * c.heads * double(d);
  const double fwd_tf = fwd_flops / fwd / 1e12, bwd_tf = 2.5 * fwd_flops / bwd / 1e12;
  const double gemm_tf = 2.0 * double(gn) * double(gn) * double(d) / gm / 1e12;
  if (!proc.root()) return 0;
  nlohmann::json j = {{"backend", backend_kind_name(kind)},
                      {"seq_len", s},
                      {"heads", c.heads},
                      {"kv_heads", c.kv_heads},
                      {"head_dim", d},
                      {"dtype", dtype_name(t)},
                      {"iters", opt.iters},
                      {"fwd_s", fwd},
                      {"bwd_s", bwd},
                      {"fwd_tflops", fwd_tf},
                      {"bwd_tflops", bwd_tf},
                      {"gemm_tflops", gemm_tf},
                      {"fwd_vs_gemm", fwd_tf / gemm_tf},
                      {"bwd_vs_gemm", bwd_tf / gemm_tf},
                      {"gemm_shape", {gn, gn, d}},
                      {"peak_bytes", peak},
                      {"max_rel_err_sampled", err},
                      {"onednn_isa", onednn_cpu_isa()},
                      {"cpu", cpu_model_name()}};
  if (opt.json) {
    print_json(j);
  } else {
    if (kind == BackendKind::kCpu)
      std::printf(
          "attention kernel  S=%lld H=%d K=%d d=%lld %s, one thread, kernels %s, oneDNN %s\n",
          (long long)s, c.heads, c.kv_heads, (long long)d, dtype_name(t), cpu_isa_name(cpu_isa()),
          onednn_cpu_isa().c_str());
    else
      std::printf("attention kernel  S=%lld H=%d K=%d d=%lld %s, %s backend (GEMM: cuBLASLt)\n",
                  (long long)s, c.heads, c.kv_heads, (long long)d, dtype_name(t),
                  backend_kind_name(kind));
    std::printf("  forward   %9.4f s  %7.1f GFLOP/s  (%.2fx GEMM)\n", fwd, fwd_tf * 1e3,
                fwd_tf / gemm_tf);
    std::printf("  backward  %9.4f s  %7.1f GFLOP/s  (%.2fx GEMM)\n", bwd, bwd_tf * 1e3,
                bwd_tf / gemm_tf);
    std::printf("  GEMM %lldx%lldx%lld       %7.1f GFLOP/s\n", (long long)gn, (long long)gn,
                (long long)d, gemm_tf * 1e3);
    std::printf("  peak %s, sampled max relative error %.2e\n", format_bytes(peak).c_str(), err);
  }
  return 0;
}

}  // namespace

Runner add_bench_kernel(CLI::App& cmd) {
  auto opt = std::make_shared<Options>();
  add_shape_options(cmd, opt->shape, false);
  cmd.add_option("--iters", opt->iters, "timed repetitions (the minimum is reported)")
      ->capture_default_str()
      ->check(integer_in<int>(1, kMaxIters));
  cmd.add_flag("--json", opt->json, "print one JSON object");
  auto sa = add_settings(cmd, kScopeKernel);
  CLI::App* c = &cmd;
  return [opt, sa, c](Process& p) { return run(p, *opt, *sa, *c); };
}

}  // namespace upipe::app
