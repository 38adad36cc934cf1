// Every op of the Backend interface (backend/backend.h), run through its front-end on every
// backend that computes, against the naive references of backend/reference/ (ggml's
// test-backend-ops): gemm, attention forward (normalised, and online accumulate + finalize),
// delta, backward, lse_merge, rope, rmsnorm (whole row and per head), swiglu, cross-entropy,
// fill, convert, add_into, add_transposed, the embedding's gather_rows and scatter_add_rows and
// upload/download, on strided views and both storage dtypes.
// A new backend is one more entry of kComputing. The CPU backend runs once per instruction-set
// path this CPU supports (cpu_isa.h: avx2, avx512, avx512bf16, amx), each against the references.
//
// Tolerance rule (the one of test_attention_kernel.cpp and test_elementwise.cpp): the
// reference runs in fp64 on the stored inputs; a naive same-precision baseline (fp32 math,
// outputs stored in the backend's output dtype) measures what the precision allows; the
// backend's max error against fp64 must be within 2x the baseline's plus a floor of 4 fp32 ulp
// of the largest reference value. Pure data movement (fill, convert, add_into, add_transposed
// with beta in {0, 1/2, 1}, gather_rows, scatter_add_rows, upload/download) must be exact.
//
// Workspace: each front-end call must take from the device arena exactly the bytes of the
// backend's query, all of them tagged workspace, and give them back. The meta backend runs the
// same op list: op by op it must take the bytes the backend it plans for takes, and compute
// nothing. Its arena is not backed (every tensor's data is null, so an op that wrote would
// crash); the test reads only the arena's counters, never meta memory.
#include <gtest/gtest.h>

#include <cstdlib>
#include <deque>
#include <limits>
#include <string>

#include "backend/attention.h"
#include "backend/cpu/cpu_isa.h"
#include "backend/gemm.h"
#include "backend/loss.h"
#include "backend/optim.h"
#include "backend/reference/attention_ref.h"
#include "backend/reference/elementwise_ref.h"
#include "backend/rmsnorm.h"
#include "backend/rope.h"
#include "backend/swiglu.h"
#include "backend/tensor_ops.h"
#include "common/test_util.h"
#include "core/errors.h"
#include "core/rng.h"
#include "unit/scoped_env.h"

namespace upipe {

// gtest prints a backend by its name.
void PrintTo(BackendKind k, std::ostream* os) {
  *os << backend_kind_name(k);
}

namespace {

using test::cast;
using test::cview;
using test::view;

// The backends that compute; each is tested against reference/, and the meta backend planning
// for it must match its workspace.
const BackendKind kComputing[] = {BackendKind::kCpu};

// One computing backend on one of its code paths.
struct Path {
  BackendKind kind;
  CpuIsa isa;
};
// The CPU on every ISA path it supports; the GPU where this build has it and a GPU is present.
std::vector<Path> paths() {
  std::vector<Path> v;
  for (BackendKind k : kComputing)
    for (CpuIsa isa : supported_cpu_isas()) v.push_back({k, isa});
  if (cuda_device_available()) v.push_back({BackendKind::kCuda, cpu_isa()});
  return v;
}
std::string path_name(const Path& p) {
  if (p.kind == BackendKind::kCuda) return "cuda";
  return std::string(backend_kind_name(p.kind)) + "_" + cpu_isa_name(p.isa);
}
void PrintTo(const Path& p, std::ostream* os) {
  *os << path_name(p);
}

// Selects the path for the scope and restores the default path after it.
class OnPath {
 public:
  explicit OnPath(CpuIsa isa) : before_(cpu_isa()) { set_cpu_isa(isa); }
  ~OnPath() { set_cpu_isa(before_); }

 private:
  CpuIsa before_;
};

using test::kEps32;
constexpr DType F = DType::kF32, B = DType::kBF16;

// The backend's error against fp64 within 2x the same-precision baseline's, plus 4 fp32 ulp.
void expect_rule(const std::string& what, const std::vector<double>& fast,
                 const std::vector<double>& r64, const std::vector<double>& base) {
  test::expect_close(fast, r64, base, what);
}

// expect_rule with the baseline's error counted `roundings` times: for a bf16 result a backend may
// store in bf16 that many times on its way (cuDNN's accumulate mode: each partial, then o).
void expect_rule_roundings(const std::string& what, const std::vector<double>& fast,
                           const std::vector<double>& r64, const std::vector<double>& base,
                           int roundings) {
  ASSERT_EQ(fast.size(), r64.size()) << what;
  const double err = test::max_abs_diff(fast, r64), base_err = test::max_abs_diff(base, r64);
  EXPECT_LE(err, 2 * roundings * base_err + 4 * kEps32 * test::max_abs(r64))
      << what << ": fast " << err << ", same-precision baseline " << base_err;
}

// Values as an output of dtype t stores them.
template <class T>
std::vector<double> stored(const std::vector<T>& v, DType t) {
  return test::rounded(cast<double>(v), t);
}

// One op of one workspace record: the front-end call's name and the bytes it took.
struct WsRecord {
  std::string op;
  int64_t bytes;
  bool operator==(const WsRecord&) const = default;
};
std::ostream& operator<<(std::ostream& os, const WsRecord& r) {
  return os << r.op << ": " << r.bytes;
}

// The op runner on one device: makes tensors, fills them through upload, runs front-end calls
// with the workspace checks, and reads results back (only when the device computes).
class Ops {
 public:
  Ops(Device& dev, bool verify) : dev_(dev), verify_(verify && dev.backend().computes()) {}
  Device& dev() { return dev_; }
  const Backend& be() const { return dev_.backend(); }
  // Whether to compare results with the references (never on a device that does not compute).
  bool verify() const { return verify_; }
  const std::vector<WsRecord>& log() const { return log_; }

  // A (rows, cols) view of dtype t; with pad > 0 the columns [pad, pad + cols) of a wider
  // tensor (ld = cols + pad), so the op sees a strided view.
  Mat make(DType t, int64_t rows, int64_t cols, int64_t pad = 0) {
    tensors_.emplace_back(dev_.mem(), Tag::kOther, t, rows, cols + pad);
    return tensors_.back().mat().cols_of(pad, cols);
  }
  // Uploads mean + stddev N(0, 1) values (seed) into m; returns what m stores, in fp64.
  std::vector<double> init(const Mat& m, uint64_t seed, double stddev = 1.0, double mean = 0.0) {
    std::vector<float> v(size_t(m.rows * m.cols));
    for (size_t i = 0; i < v.size(); ++i) v[i] = float(mean + stddev * normal_at(seed, i));
    upload(dev_, v.data(), m);
    return stored(v, m.dtype);
  }
  std::vector<double> get(const Mat& m) { return cast<double>(download(dev_, m)); }

  // Runs one front-end call and checks the workspace it takes: exactly `query` bytes, all
  // tagged workspace, all given back.
  template <class Fn>
  void call(const std::string& op, int64_t query, Fn&& fn) {
    Arena& mem = dev_.mem();
    const int64_t before = mem.current(), ws_before = mem.current_by_tag()[Tag::kWorkspace];
    mem.reset_peak();
    fn();
    const int64_t took = mem.peak() - before;
    EXPECT_EQ(took, query) << op << " on " << backend_kind_name(be().kind());
    EXPECT_EQ(mem.at_peak_by_tag()[Tag::kWorkspace] - ws_before, took) << op;
    EXPECT_EQ(mem.current(), before) << op << " kept memory";
    log_.push_back({op, took});
  }

 private:
  Device& dev_;
  bool verify_;
  std::deque<Tensor> tensors_;
  std::vector<WsRecord> log_;
};

// ---- gemm ----

struct GemmCase {
  int64_t m, n, k;
  bool ta, tb;
  DType a, b, c;
  float alpha, beta;
  int64_t pad;  // > 0: every operand a strided view
};

void gemm_ops(Ops& o) {
  const GemmCase cases[] = {
      {37, 29, 53, false, false, F, F, F, 1.0f, 0.0f, 0},
      {37, 29, 53, true, false, F, F, F, -0.5f, 1.0f, 3},
      {37, 29, 53, false, true, F, F, F, 2.0f, 0.25f, 0},
      {37, 29, 53, true, true, F, F, F, 1.0f, 1.0f, 5},
      {300, 40, 64, false, true, B, B, B, 1.0f, 0.0f, 0},
      {300, 40, 64, false, true, B, B, B, 0.5f, 1.0f, 7},
      {130, 70, 300, true, false, F, B, F, 1.0f, 1.0f, 2},  // k beyond one 256 staging tile
      {70, 513, 33, false, false, B, F, B, 1.0f, 0.0f, 0},
      {64, 48, 40, true, true, F, F, B, 1.5f, 1.0f, 4},
      {1, 1, 1, false, false, F, F, F, 1.0f, 0.0f, 0},
  };
  uint64_t seed = 100;
  for (const GemmCase& g : cases) {
    const std::string name = fmt::format("gemm {}x{}x{} t{}{} {}.{}->{} a{} b{} pad{}", g.m, g.n,
                                         g.k, int(g.ta), int(g.tb), dtype_name(g.a),
                                         dtype_name(g.b), dtype_name(g.c), g.alpha, g.beta, g.pad);
    const int64_t ar = g.ta ? g.k : g.m, ac = g.ta ? g.m : g.k;
    const int64_t br = g.tb ? g.n : g.k, bc = g.tb ? g.k : g.n;
    const Mat a = o.make(g.a, ar, ac, g.pad), b = o.make(g.b, br, bc, g.pad),
              c = o.make(g.c, g.m, g.n, g.pad);
    const auto av = o.init(a, seed++), bv = o.init(b, seed++), c0 = o.init(c, seed++);
    o.call(name, gemm_workspace_bytes(o.be(), g.m, g.n, g.k, g.a, g.b, g.c),
           [&] { gemm(o.dev(), a, g.ta, b, g.tb, c, g.alpha, g.beta); });
    if (!o.verify()) continue;
    std::vector<double> r64(size_t(g.m * g.n));
    ref::gemm<double>(cview(av, ar, ac), g.ta, cview(bv, br, bc), g.tb, view(r64, g.m, g.n));
    const auto a32 = cast<float>(av), b32 = cast<float>(bv);
    std::vector<float> r32(r64.size());
    ref::gemm<float>(cview(a32, ar, ac), g.ta, cview(b32, br, bc), g.tb, view(r32, g.m, g.n));
    for (size_t i = 0; i < r64.size(); ++i) {
      r64[i] = g.alpha * r64[i] + g.beta * c0[i];
      r32[i] = g.alpha * r32[i] + g.beta * float(c0[i]);
    }
    expect_rule(name, o.get(c), r64, stored(r32, g.c));
  }
}

// ---- attention: forward, accumulate + finalize, delta, backward ----

struct AttnCase {
  int64_t sq, sk;
  int hq, hk, d;
  int64_t q_pos0, k_pos0;
  DType t;
  int64_t pad;
};

void attention_ops(Ops& o) {
  const AttnCase cases[] = {
      {300, 300, 4, 2, 32, 0, 0, F, 0},     // GQA, ragged tiles
      {800, 800, 2, 1, 32, 0, 0, F, 16},    // more rows than one 768-row forward tile, strided
      {250, 333, 2, 1, 40, 100, 17, B, 8},  // bf16, offsets, d = 40, strided
      {130, 140, 2, 2, 32, 0, 200, F, 0},   // no key visible to any query
      {96, 600, 2, 1, 32, 500, 0, B, 0},    // ring block: queries late, keys early
      {320, 320, 4, 2, 64, 0, 0, B, 0},     // bf16 causal: cuDNN's backward takes it given o
  };
  uint64_t seed = 200;
  for (const AttnCase& c : cases) {
    const std::string name =
        fmt::format("attention sq{} sk{} h{}/{} d{} pos{}/{} {} pad{}", c.sq, c.sk, c.hq, c.hk, c.d,
                    c.q_pos0, c.k_pos0, dtype_name(c.t), c.pad);
    const int64_t qc = int64_t(c.hq) * c.d, kc = int64_t(c.hk) * c.d;
    const Mat q = o.make(c.t, c.sq, qc, c.pad), k = o.make(c.t, c.sk, kc, c.pad),
              v = o.make(c.t, c.sk, kc, c.pad), dout = o.make(c.t, c.sq, qc, c.pad);
    const auto qv = o.init(q, seed++), kv = o.init(k, seed++), vv = o.init(v, seed++),
               dv_in = o.init(dout, seed++);
    const AttnProblem p{q, k, v, c.hq, c.hk, c.d, c.q_pos0, c.k_pos0};
    const int64_t fwd_ws = attention_fwd_workspace_bytes(o.be(), c.hq, c.hk, c.d, c.t),
                  bwd_ws = attention_bwd_workspace_bytes(o.be(), c.hq, c.hk, c.d, c.t);

    // Normalised forward.
    const Mat out = o.make(c.t, c.sq, qc), lse = o.make(F, c.hq, c.sq);
    o.call(name + " forward", fwd_ws, [&] { attention_forward(o.dev(), p, out, lse); });

    // Online accumulation over two key blocks, the later one first, then finalize.
    const int64_t split = c.sk / 2;
    const Mat acc = o.make(F, c.sq, qc), m = o.make(F, c.hq, c.sq), l = o.make(F, c.hq, c.sq);
    const Mat out2 = o.make(c.t, c.sq, qc, c.pad), lse2 = o.make(F, c.hq, c.sq);
    o.call(name + " accumulate_init", 0, [&] { attention_accumulate_init(o.dev(), acc, m, l); });
    const AttnProblem p_late{q,
                             k.rows_of(split, c.sk - split),
                             v.rows_of(split, c.sk - split),
                             c.hq,
                             c.hk,
                             c.d,
                             c.q_pos0,
                             c.k_pos0 + split};
    const AttnProblem p_early{
        q, k.rows_of(0, split), v.rows_of(0, split), c.hq, c.hk, c.d, c.q_pos0, c.k_pos0};
    o.call(name + " forward_accumulate", fwd_ws,
           [&] { attention_forward_accumulate(o.dev(), p_late, acc, m, l); });
    o.call(name + " forward_accumulate", fwd_ws,
           [&] { attention_forward_accumulate(o.dev(), p_early, acc, m, l); });
    o.call(name + " finalize", 0, [&] { attention_finalize(o.dev(), acc, m, l, c.d, out2, lse2); });

    // delta from the stored o, then the backward accumulating into prefilled dq, dk, dv.
    const Mat delta = o.make(F, c.hq, c.sq);
    o.call(name + " delta", 0, [&] { attention_delta(o.dev(), out, dout, c.d, delta); });
    const Mat dq = o.make(F, c.sq, qc, c.pad), dk = o.make(F, c.sk, kc, c.pad),
              dv = o.make(F, c.sk, kc);
    const uint64_t grad_seed = seed;
    const auto dq0 = o.init(dq, seed++), dk0 = o.init(dk, seed++), dv0 = o.init(dv, seed++);
    o.call(name + " backward", bwd_ws,
           [&] { attention_backward(o.dev(), p, dout, lse, delta, dq, dk, dv); });
    // The same backward given o: a backend may then run it on a library kernel (cuDNN's on cuda,
    // for bf16), which stores its gradients in bf16 before they are added.
    const Mat dq_o = o.make(F, c.sq, qc, c.pad), dk_o = o.make(F, c.sk, kc, c.pad),
              dv_o = o.make(F, c.sk, kc);
    o.init(dq_o, grad_seed);
    o.init(dk_o, grad_seed + 1);
    o.init(dv_o, grad_seed + 2);
    o.call(name + " backward given o", bwd_ws,
           [&] { attention_backward(o.dev(), p, dout, lse, delta, dq_o, dk_o, dv_o, out); });
    if (!o.verify()) continue;

    const ref::AttnDims dims{c.sq, c.sk, c.hq, c.hk, c.d, c.q_pos0, c.k_pos0, true};
    std::vector<double> o64(size_t(c.sq * qc)), lse64(size_t(c.hq * c.sq));
    ref::attention_forward<double>(dims, cview(qv, c.sq, qc), cview(kv, c.sk, kc),
                                   cview(vv, c.sk, kc), view(o64, c.sq, qc),
                                   view(lse64, c.hq, c.sq));
    const auto q32 = cast<float>(qv), k32 = cast<float>(kv), v32 = cast<float>(vv),
               do32 = cast<float>(dv_in);
    std::vector<float> o32(o64.size()), lse32(lse64.size());
    // bf16 attention's precision: bf16 operands in every product, the computed P and dS too.
    auto operand = [&](float x) { return float(test::rounded({double(x)}, c.t)[0]); };
    ref::attention_forward<float>(dims, cview(q32, c.sq, qc), cview(k32, c.sk, kc),
                                  cview(v32, c.sk, kc), view(o32, c.sq, qc),
                                  view(lse32, c.hq, c.sq), operand);
    const auto o_base = stored(o32, c.t), lse_base = cast<double>(lse32);
    expect_rule(name + " forward o", o.get(out), o64, o_base);
    expect_rule(name + " forward lse", o.get(lse), lse64, lse_base);
    // On cuda, bf16 runs on cuDNN, which stores each of the two calls' partials in bf16 before o
    // is: three roundings to the baseline's one. Every other backend keeps the strict rule.
    const bool library_bf16 = c.t == B && o.be().kind() == BackendKind::kCuda;
    expect_rule_roundings(name + " accumulate o", o.get(out2), o64, o_base, library_bf16 ? 3 : 1);
    expect_rule(name + " accumulate lse", o.get(lse2), lse64, lse_base);

    // delta = rowsum(do * o) per head, on the o the backend stored.
    const auto o_fast = o.get(out);
    std::vector<double> delta64(size_t(c.hq * c.sq));
    std::vector<float> delta32(delta64.size());
    for (int h = 0; h < c.hq; ++h)
      for (int64_t i = 0; i < c.sq; ++i) {
        double s = 0;
        float s32 = 0;
        for (int e = 0; e < c.d; ++e) {
          const size_t at = size_t(i * qc + h * c.d + e);
          s += o_fast[at] * dv_in[at];
          s32 += float(o_fast[at]) * do32[at];
        }
        delta64[size_t(h * c.sq + i)] = s;
        delta32[size_t(h * c.sq + i)] = s32;
      }
    expect_rule(name + " delta", o.get(delta), delta64, cast<double>(delta32));

    auto dq64 = dq0, dk64 = dk0, dv64 = dv0;
    ref::attention_backward<double>(
        dims, cview(qv, c.sq, qc), cview(kv, c.sk, kc), cview(vv, c.sk, kc), cview(dv_in, c.sq, qc),
        view(dq64, c.sq, qc), view(dk64, c.sk, kc), view(dv64, c.sk, kc));
    auto dq32 = cast<float>(dq0), dk32 = cast<float>(dk0), dv32 = cast<float>(dv0);
    ref::attention_backward<float>(dims, cview(q32, c.sq, qc), cview(k32, c.sk, kc),
                                   cview(v32, c.sk, kc), cview(do32, c.sq, qc),
                                   view(dq32, c.sq, qc), view(dk32, c.sk, kc), view(dv32, c.sk, kc),
                                   operand, operand);
    expect_rule(name + " backward dq", o.get(dq), dq64, cast<double>(dq32));
    expect_rule(name + " backward dk", o.get(dk), dk64, cast<double>(dk32));
    expect_rule(name + " backward dv", o.get(dv), dv64, cast<double>(dv32));
    // Given o, bf16 on cuda (cuDNN's backward, which stores its gradients in bf16): the baseline's
    // gradients (from zero) stored in bf16, then added in fp32. Elsewhere the strict baseline.
    std::vector<float> g32[3] = {std::vector<float>(dq0.size(), 0.f),
                                 std::vector<float>(dk0.size(), 0.f),
                                 std::vector<float>(dv0.size(), 0.f)};
    ref::attention_backward<float>(dims, cview(q32, c.sq, qc), cview(k32, c.sk, kc),
                                   cview(v32, c.sk, kc), cview(do32, c.sq, qc),
                                   view(g32[0], c.sq, qc), view(g32[1], c.sk, kc),
                                   view(g32[2], c.sk, kc), operand, operand);
    const std::vector<double>* start[3] = {&dq0, &dk0, &dv0};
    const std::vector<double>* exact[3] = {&dq64, &dk64, &dv64};
    const std::vector<float>* strict[3] = {&dq32, &dk32, &dv32};
    const Mat given[3] = {dq_o, dk_o, dv_o};
    const char* names[3] = {"dq", "dk", "dv"};
    for (int t = 0; t < 3; ++t) {
      std::vector<double> base = cast<double>(*strict[t]);
      if (library_bf16) {
        const std::vector<double> g = stored(g32[t], B);
        for (size_t i = 0; i < base.size(); ++i)
          base[i] = double(float((*start[t])[i]) + float(g[i]));
      }
      expect_rule(name + " backward given o " + names[t], o.get(given[t]), *exact[t], base);
    }
  }
}

// ---- lse_merge ----

// (o1, l1) <- merge((o1, l1), (o2, l2)) of one row of one head, in math type T.
template <class T>
void merge_row(T* o1, T& l1, const T* o2, T l2, int d) {
  const T ninf = -std::numeric_limits<T>::infinity();
  if (l2 == ninf) return;
  if (l1 == ninf) {
    std::copy(o2, o2 + d, o1);
    l1 = l2;
    return;
  }
  const T mx = std::max(l1, l2), w1 = std::exp(l1 - mx), w2 = std::exp(l2 - mx);
  for (int e = 0; e < d; ++e) o1[e] = (o1[e] * w1 + o2[e] * w2) / (w1 + w2);
  l1 = mx + std::log(w1 + w2);
}

void lse_merge_ops(Ops& o) {
  struct Case {
    int64_t sq;
    int hq, d;
    DType t;
    int64_t pad;
  };
  uint64_t seed = 300;
  for (const Case& c : {Case{70, 3, 32, F, 0}, Case{50, 2, 40, B, 6}}) {
    const std::string name =
        fmt::format("lse_merge sq{} h{} d{} {}", c.sq, c.hq, c.d, dtype_name(c.t));
    const int64_t qc = int64_t(c.hq) * c.d;
    const Mat o1 = o.make(c.t, c.sq, qc, c.pad), o2 = o.make(c.t, c.sq, qc, c.pad);
    const Mat l1 = o.make(F, c.hq, c.sq), l2 = o.make(F, c.hq, c.sq);
    const auto o1v = o.init(o1, seed++), o2v = o.init(o2, seed++);
    // Log-sum-exps of 3 N(0, 1); some -inf (a partial that saw no key), in either or both.
    auto lse_values = [&](uint64_t s, int every) {
      std::vector<float> v(size_t(c.hq * c.sq));
      for (size_t i = 0; i < v.size(); ++i)
        v[i] = i % size_t(every) == 0 ? -INFINITY : float(3 * normal_at(s, i));
      return v;
    };
    const auto l1f = lse_values(seed++, 7), l2f = lse_values(seed++, 5);
    upload(o.dev(), l1f.data(), l1);
    upload(o.dev(), l2f.data(), l2);
    o.call(name, 0, [&] { lse_merge(o.dev(), o1, l1, o2, l2, c.d); });
    if (!o.verify()) continue;
    auto o64 = o1v, l64 = cast<double>(l1f);
    auto o32 = cast<float>(o1v), l32 = l1f;
    const auto o2_32 = cast<float>(o2v);
    for (int h = 0; h < c.hq; ++h)
      for (int64_t i = 0; i < c.sq; ++i) {
        const size_t at = size_t(i * qc + h * c.d), li = size_t(h * c.sq + i);
        merge_row<double>(&o64[at], l64[li], &o2v[at], double(l2f[li]), c.d);
        merge_row<float>(&o32[at], l32[li], &o2_32[at], l2f[li], c.d);
      }
    expect_rule(name + " o", o.get(o1), o64, stored(o32, c.t));
    expect_rule(name + " lse", o.get(l1), l64, cast<double>(l32));
  }
}

// ---- rope ----

void rope_ops(Ops& o) {
  RopeParams plain;
  plain.theta = 500000.0;
  RopeParams small_ctx;  // llama3 rule with a short original context: it bites at these positions
  small_ctx.scaling = {true, 8.0, 1.0, 4.0, 256};
  RopeParams llama31 = plain;  // Llama-3.1's own scaling
  llama31.scaling = {true, 8.0, 1.0, 4.0, 8192};
  struct Case {
    int64_t heads;
    int d;
    RowPositions pos;
    RopeParams rp;
    int sign;
    DType t;
    int64_t pad;
  };
  const Case cases[] = {
      {3, 64, {{{20, 3000000}, {30, 7999970}}}, plain, +1, F, 0},  // zigzag runs, large positions
      {2, 64, {{{40, 100}, {24, 5000}}}, small_ctx, -1, F, 8},
      {4, 32, {{{16, 0}, {16, 700}}}, small_ctx, +1, B, 0},
      {2, 128, RowPositions::contiguous(33, 1000000), llama31, +1, F, 0},
      {2, 128, {{{10, 40000}, {12, 3000}}}, llama31, -1, B, 4},
  };
  uint64_t seed = 400;
  for (const Case& c : cases) {
    const std::string name = fmt::format(
        "rope h{} d{} scaled{} orig{} sign{} {}", c.heads, c.d, int(c.rp.scaling.enabled),
        c.rp.scaling.original_max_position, c.sign, dtype_name(c.t));
    const int64_t rows = c.pos.total_rows(), cols = c.heads * c.d;
    const Mat x = o.make(c.t, rows, cols, c.pad);
    const auto x0 = o.init(x, seed++);
    o.call(name, 0, [&] {
      if (c.sign > 0)
        rope_forward(o.dev(), x, c.d, c.pos, c.rp);
      else
        rope_backward(o.dev(), x, c.d, c.pos, c.rp);
    });
    if (!o.verify()) continue;
    // The frequencies the kernels use are the reference's (transformers' formula).
    const auto inv = ref::rope_inv_freq(c.rp, c.d), inv_k = c.rp.inv_freq(c.d);
    for (size_t i = 0; i < inv.size(); ++i)
      EXPECT_NEAR(inv_k[i], inv[i], 1e-14 * inv[i]) << name << " inv_freq[" << i << "]";
    const auto p = c.pos.expand();
    auto x64 = x0;
    auto x32 = cast<float>(x0);
    ref::rope<double>(view(x64, rows, cols), c.d, p.data(), inv, c.sign);
    ref::rope<float>(view(x32, rows, cols), c.d, p.data(), inv, c.sign);
    expect_rule(name, o.get(x), x64, stored(x32, c.t));
  }
}

// ---- rmsnorm ----

void rmsnorm_ops(Ops& o) {
  struct Case {
    int64_t t, cols, group;  // group 0: the whole row
    DType dt;
    int64_t pad;
    bool dx_is_dy;
  };
  const Case cases[] = {
      {37, 300, 0, F, 0, false},
      {37, 256, 32, F, 4, false},  // per head (QK-norm), strided
      {20, 384, 0, B, 0, true},    // bf16, dx written over dy
      {20, 128, 64, B, 2, false},
  };
  const float eps = 1e-5f;
  uint64_t seed = 500;
  for (const Case& c : cases) {
    const int64_t g = c.group == 0 ? c.cols : c.group;
    const std::string name = fmt::format("rmsnorm {}x{} group {} {}{}", c.t, c.cols, g,
                                         dtype_name(c.dt), c.dx_is_dy ? " in place" : "");
    const Mat x = o.make(c.dt, c.t, c.cols, c.pad), w = o.make(c.dt, 1, g),
              y = o.make(c.dt, c.t, c.cols, c.pad), dy = o.make(c.dt, c.t, c.cols, c.pad);
    const Mat dx = c.dx_is_dy ? dy : o.make(c.dt, c.t, c.cols), dw = o.make(F, 1, g);
    const auto xv = o.init(x, seed++), wv = o.init(w, seed++, 0.25, 1.0), dyv = o.init(dy, seed++),
               dw0 = o.init(dw, seed++);
    const int64_t ws = rmsnorm_workspace_bytes(o.be(), g);
    o.call(name + " forward", ws, [&] { rmsnorm_forward(o.dev(), x, w, eps, y, c.group); });
    o.call(name + " backward", ws,
           [&] { rmsnorm_backward(o.dev(), x, w, eps, dy, dx, dw, c.group); });
    if (!o.verify()) continue;
    // Rows of `group` columns: a (t * cols / g, g) view of the row-major values.
    const int64_t n = c.t * c.cols / g;
    std::vector<double> y64(xv.size()), dx64(xv.size()), dw64 = dw0;
    ref::rmsnorm_forward<double>(cview(xv, n, g), wv.data(), eps, view(y64, n, g));
    ref::rmsnorm_backward<double>(cview(xv, n, g), wv.data(), eps, cview(dyv, n, g),
                                  view(dx64, n, g), dw64.data());
    const auto x32 = cast<float>(xv), w32 = cast<float>(wv), dy32 = cast<float>(dyv);
    std::vector<float> y32(xv.size()), dx32(xv.size()), dw32 = cast<float>(dw0);
    ref::rmsnorm_forward<float>(cview(x32, n, g), w32.data(), eps, view(y32, n, g));
    ref::rmsnorm_backward<float>(cview(x32, n, g), w32.data(), eps, cview(dy32, n, g),
                                 view(dx32, n, g), dw32.data());
    expect_rule(name + " y", o.get(y), y64, stored(y32, c.dt));
    expect_rule(name + " dx", o.get(dx), dx64, stored(dx32, c.dt));
    expect_rule(name + " dw", o.get(dw), dw64, cast<double>(dw32));
  }
}

// ---- swiglu ----

void swiglu_ops(Ops& o) {
  struct Case {
    int64_t t, f;
    DType dt;
    int64_t pad;
  };
  uint64_t seed = 600;
  for (const Case& c : {Case{20, 513, F, 0}, Case{16, 300, B, 6}}) {
    const std::string name = fmt::format("swiglu {}x{} {}", c.t, c.f, dtype_name(c.dt));
    const Mat a = o.make(c.dt, c.t, c.f, c.pad), b = o.make(c.dt, c.t, c.f, c.pad),
              h = o.make(c.dt, c.t, c.f, c.pad), dh = o.make(c.dt, c.t, c.f),
              da = o.make(c.dt, c.t, c.f, c.pad), db = o.make(c.dt, c.t, c.f);
    const auto av = o.init(a, seed++, 3.0), bv = o.init(b, seed++), dhv = o.init(dh, seed++);
    const int64_t ws = swiglu_workspace_bytes(o.be(), c.f);
    o.call(name + " forward", ws, [&] { swiglu_forward(o.dev(), a, b, h); });
    o.call(name + " backward", ws, [&] { swiglu_backward(o.dev(), a, b, dh, da, db); });
    if (!o.verify()) continue;
    std::vector<double> h64(av.size()), da64(av.size()), db64(av.size());
    ref::swiglu_forward<double>(cview(av, c.t, c.f), cview(bv, c.t, c.f), view(h64, c.t, c.f));
    ref::swiglu_backward<double>(cview(av, c.t, c.f), cview(bv, c.t, c.f), cview(dhv, c.t, c.f),
                                 view(da64, c.t, c.f), view(db64, c.t, c.f));
    const auto a32 = cast<float>(av), b32 = cast<float>(bv), dh32 = cast<float>(dhv);
    std::vector<float> h32(av.size()), da32(av.size()), db32(av.size());
    ref::swiglu_forward<float>(cview(a32, c.t, c.f), cview(b32, c.t, c.f), view(h32, c.t, c.f));
    ref::swiglu_backward<float>(cview(a32, c.t, c.f), cview(b32, c.t, c.f), cview(dh32, c.t, c.f),
                                view(da32, c.t, c.f), view(db32, c.t, c.f));
    expect_rule(name + " h", o.get(h), h64, stored(h32, c.dt));
    expect_rule(name + " da", o.get(da), da64, stored(da32, c.dt));
    expect_rule(name + " db", o.get(db), db64, stored(db32, c.dt));
  }
}

// ---- cross-entropy (the fused LM head's per-tile step), in place ----

// Naive cross-entropy in math type T: grad = scale (softmax - onehot), 0 for label -1; returns
// the sum of -log softmax[label].
template <class T>
double cross_entropy_ref(std::vector<T>& x, int64_t rows, int64_t v,
                         const std::vector<int32_t>& labels, double scale) {
  double loss = 0;
  for (int64_t r = 0; r < rows; ++r) {
    T* row = x.data() + r * v;
    if (labels[size_t(r)] < 0) {
      std::fill_n(row, v, T(0));
      continue;
    }
    T m = row[0];
    for (int64_t j = 1; j < v; ++j) m = std::max(m, row[j]);
    T sum = 0;
    for (int64_t j = 0; j < v; ++j) sum += std::exp(row[j] - m);
    loss += double(m + std::log(sum) - row[labels[size_t(r)]]);
    for (int64_t j = 0; j < v; ++j) row[j] = T(scale) * std::exp(row[j] - m) / sum;
    row[labels[size_t(r)]] -= T(scale);
  }
  return loss;
}

void cross_entropy_ops(Ops& o) {
  const int64_t rows = 13, v = 1001, pad = 3;
  const double scale = 1.0 / 12;
  std::vector<int32_t> labels(static_cast<size_t>(rows));
  for (int64_t r = 0; r < rows; ++r) labels[size_t(r)] = int32_t((r * 389) % v);
  labels[4] = -1;
  labels[size_t(rows - 1)] = -1;  // the sequence's last token predicts nothing
  labels[7] = int32_t(v - 1);
  const Mat x = o.make(F, rows, v, pad);
  const auto xv = o.init(x, 800, 4.0);
  double loss = 0;
  o.call("cross_entropy", 0, [&] { loss = cross_entropy(o.dev(), x, labels, float(scale)); });
  if (!o.verify()) return;
  std::vector<double> x64 = xv;
  std::vector<float> x32 = cast<float>(xv);
  const double l64 = cross_entropy_ref(x64, rows, v, labels, scale);
  const double l32 = cross_entropy_ref(x32, rows, v, labels, scale);
  expect_rule("cross_entropy grad", o.get(x), x64, cast<double>(x32));
  EXPECT_LE(std::abs(loss - l64), 2 * std::abs(l32 - l64) + 4 * kEps32 * std::abs(l64))
      << "cross_entropy loss " << loss << " vs fp64 " << l64;
}

// ---- data movement: fill, convert, add_into, add_transposed, upload/download (exact) ----

void data_ops(Ops& o) {
  const int64_t rows = 9, cols = 1100, pad = 5;  // cols above the kernels' 1024-value chunks
  uint64_t seed = 700;
  for (DType t : {F, B}) {
    const std::string dt = dtype_name(t);
    // fill and zero write the view and nothing beside it.
    const Mat whole = o.make(t, rows, cols + pad), x = whole.cols_of(pad, cols);
    const auto before = o.init(whole, seed++);
    o.call("fill " + dt, 0, [&] { fill(o.dev(), x, 1.5f); });
    std::vector<double> after_fill;
    if (o.verify()) after_fill = o.get(whole);
    o.call("zero " + dt, 0, [&] { zero(o.dev(), x.rows_of(2, 3)); });
    if (o.verify()) {
      const auto after_zero = o.get(whole);
      for (int64_t r = 0; r < rows; ++r)
        for (int64_t c = 0; c < cols + pad; ++c) {
          const size_t i = size_t(r * (cols + pad) + c);
          const double filled = c < pad ? before[i] : 1.5;
          ASSERT_EQ(after_fill[i], filled) << "fill " << dt << " at " << r << "," << c;
          ASSERT_EQ(after_zero[i], c >= pad && r >= 2 && r < 5 ? 0.0 : filled)
              << "zero " << dt << " at " << r << "," << c;
        }
    }
    // upload / download round trip on a strided view: what the dtype stores, exactly.
    const Mat u = o.make(t, rows, cols, pad);
    const auto uv = o.init(u, seed++);
    if (o.verify()) {
      EXPECT_EQ(o.get(u), uv) << "upload/download " << dt;
      std::vector<double> sub;
      for (int64_t r = 3; r < 7; ++r)
        for (int64_t c = 100; c < 150; ++c) sub.push_back(uv[size_t(r * cols + c)]);
      EXPECT_EQ(o.get(u.block(3, 4, 100, 50)), sub) << "download of a block " << dt;
    }
    // convert to and from both dtypes, strided.
    for (DType to : {F, B}) {
      const std::string cname = "convert " + dt + "->" + dtype_name(to);
      const Mat src = o.make(t, rows, cols, pad), dst = o.make(to, rows, cols, 2 * pad);
      const auto sv = o.init(src, seed++);
      o.call(cname, 0, [&] { copy(o.dev(), dst, src); });
      if (o.verify()) {
        EXPECT_EQ(o.get(dst), test::rounded(sv, to)) << cname;
      }
    }
  }
  // add_into, every pair of dtypes: dst + src in fp32, rounded once into dst's dtype.
  for (DType dt : {F, B})
    for (DType st : {F, B}) {
      const std::string name = fmt::format("add_into {} += {}", dtype_name(dt), dtype_name(st));
      const Mat dst = o.make(dt, rows, cols, pad), src = o.make(st, rows, cols, 2 * pad);
      const auto d0 = o.init(dst, seed++), s0 = o.init(src, seed++);
      o.call(name, 0, [&] { add_into(o.dev(), dst, src); });
      if (!o.verify()) continue;
      std::vector<double> sum(d0.size());
      for (size_t i = 0; i < sum.size(); ++i) sum[i] = double(float(d0[i]) + float(s0[i]));
      EXPECT_EQ(o.get(dst), test::rounded(sum, dt)) << name;
    }
  // add_transposed: dst (r, c) = beta dst + src^T over several 32 x 32 blocks, ragged edges.
  for (float beta : {0.0f, 1.0f, 0.5f}) {
    const std::string name = fmt::format("add_transposed beta {}", beta);
    const int64_t r = 70, c = 45;
    const Mat dt = o.make(F, r, c, pad), st = o.make(F, c, r, 3);
    const auto dt0 = o.init(dt, seed++), st0 = o.init(st, seed++);
    o.call(name, 0, [&] { add_transposed(o.dev(), dt, st, beta); });
    if (!o.verify()) continue;
    std::vector<double> want(dt0.size());
    for (int64_t i = 0; i < r; ++i)
      for (int64_t j = 0; j < c; ++j)
        want[size_t(i * c + j)] =
            double(beta * float(dt0[size_t(i * c + j)]) + float(st0[size_t(j * r + i)]));
    EXPECT_EQ(o.get(dt), want) << name;
  }
}

// ---- the embedding's rows: gather_rows, scatter_add_rows (exact) ----

void row_ops(Ops& o) {
  const int64_t vocab = 13, cols = 1100, pad = 3;
  // Repeats (row 5 four times, row 0 twice), the first and last rows, unsorted.
  const std::vector<int32_t> ids = {5, 0, 12, 5, 7, 5, 0, 3, 5, 11, 2};
  const int64_t n = int64_t(ids.size());
  uint64_t seed = 750;
  for (DType tt : {F, B})
    for (DType rt : {F, B}) {
      const std::string pair = fmt::format("{} table, {} rows", dtype_name(tt), dtype_name(rt));
      // gather: dst row r = table row ids[r], converted exactly once.
      const Mat table = o.make(tt, vocab, cols, pad), dst = o.make(rt, n, cols, 2 * pad);
      const auto tv = o.init(table, seed++);
      o.call("gather_rows " + pair, 0, [&] { gather_rows(o.dev(), dst, table, ids); });
      if (o.verify()) {
        std::vector<double> want;
        for (int32_t id : ids)
          for (int64_t c = 0; c < cols; ++c) want.push_back(tv[size_t(id * cols + c)]);
        EXPECT_EQ(o.get(dst), test::rounded(want, rt)) << "gather_rows " << pair;
        EXPECT_EQ(o.get(table), tv) << "gather_rows wrote its table, " << pair;
      }
      // scatter-add: table row ids[r] += src row r in fp32, rounded into the table's dtype after
      // each addition, r ascending.
      const Mat src = o.make(rt, n, cols, pad), acc = o.make(tt, vocab, cols, 2 * pad);
      const auto sv = o.init(src, seed++), av = o.init(acc, seed++);
      o.call("scatter_add_rows " + pair, 0, [&] { scatter_add_rows(o.dev(), acc, src, ids); });
      if (!o.verify()) continue;
      std::vector<double> want = av;
      for (int64_t r = 0; r < n; ++r)
        for (int64_t c = 0; c < cols; ++c) {
          double& w = want[size_t(ids[size_t(r)] * cols + c)];
          w = test::rounded({double(float(w) + float(sv[size_t(r * cols + c)]))}, tt)[0];
        }
      EXPECT_EQ(o.get(acc), want) << "scatter_add_rows " << pair;
    }
}

// ---- asynchronous copies (Device::copy_async): the data arrives, in the contract's order ----

void copy_ops(Ops& o) {
  Device& dev = o.dev();
  const int64_t rows = 7, cols = 300, bytes = rows * cols * 4;
  const Mat a = o.make(F, rows, cols), b = o.make(F, rows, cols), c = o.make(F, rows, cols);
  const auto av = o.init(a, 800);
  Tensor host(dev.host(), Tag::kOther, F, rows, cols);  // host arena: pinned on a GPU
  // Device -> host after the op before it (its source holds the op's result), waited on, synced.
  o.call("fill", 0, [&] { fill(dev, b, 2.5f); });
  const CopyTicket t1 = dev.copy_async(host.data(), b.data, bytes, CopyKind::kDeviceToHost);
  EXPECT_GT(t1.id, 0);
  dev.wait(t1);
  dev.backend().sync(Stream{});
  if (o.verify()) {
    const float* h = static_cast<const float*>(host.data());
    for (int64_t i = 0; i < rows * cols; ++i) ASSERT_EQ(h[i], 2.5f) << "device to host at " << i;
  }
  // Device -> host -> device -> device, one wait for the last (the queue runs in issue order),
  // then an op that reads the copy's destination.
  dev.copy_async(host.data(), a.data, bytes, CopyKind::kDeviceToHost);
  dev.copy_async(b.data, host.data(), bytes, CopyKind::kHostToDevice);
  const CopyTicket t2 = dev.copy_async(c.data, b.data, bytes, CopyKind::kDeviceToDevice);
  EXPECT_GT(t2.id, t1.id);
  dev.wait(t2);
  o.call("add_into", 0, [&] { add_into(dev, c, a); });
  if (o.verify()) {
    std::vector<double> twice(av.size());
    for (size_t i = 0; i < av.size(); ++i) twice[i] = double(float(av[i]) + float(av[i]));
    EXPECT_EQ(o.get(b), av) << "host to device";
    EXPECT_EQ(o.get(c), twice) << "device to device, then add_into";
  }
  EXPECT_EQ(dev.copy_async(c.data, a.data, 0, CopyKind::kDeviceToDevice).id, 0) << "empty copy";
  dev.wait_copies();
}

// ---- optimizer: sum_squares (fp64 accumulation) and AdamW (the 2x + 4 ulp rule) ----

template <class T>
void adamw_ref(std::vector<T>& w, const std::vector<T>& g, std::vector<T>& m, std::vector<T>& v,
               const AdamWArgs& a) {
  const T bc1 = T(1 - std::pow(a.beta1, double(a.step))),
          bc2 = T(1 - std::pow(a.beta2, double(a.step)));
  for (size_t i = 0; i < w.size(); ++i) {
    const T gr = T(a.grad_scale) * g[i];
    m[i] = T(a.beta1) * m[i] + (1 - T(a.beta1)) * gr;
    v[i] = T(a.beta2) * v[i] + (1 - T(a.beta2)) * gr * gr;
    w[i] = w[i] * (1 - T(a.lr) * T(a.weight_decay)) -
           T(a.lr) / bc1 * m[i] / (std::sqrt(v[i]) / std::sqrt(bc2) + T(a.eps));
  }
}

void optim_ops(Ops& o) {
  const int64_t n = 1037;  // not a multiple of the vector width
  uint64_t seed = 900;
  const Mat x = o.make(F, 1, n);
  const auto xv = o.init(x, seed++);
  double ss = 0;
  o.call("sum_squares", 0, [&] { ss = sum_squares(o.dev(), x); });
  if (o.verify()) {
    double want = 0;
    for (double e : xv) want += e * e;
    EXPECT_NEAR(ss, want, 1e-12 * want) << "sum_squares";
  }
  for (int64_t step : {1, 7}) {
    const AdamWArgs a{1e-2, 0.9, 0.95, 1e-8, 0.1, 0.5, step};
    const Mat w = o.make(F, 1, n), g = o.make(F, 1, n), m = o.make(F, 1, n), v = o.make(F, 1, n);
    const auto w0 = o.init(w, seed++), g0 = o.init(g, seed++), m0 = o.init(m, seed++);
    const auto v0 = o.init(v, seed++, 0.1, 1.0);  // second moments are positive
    o.call(fmt::format("adamw step {}", step), 0, [&] { adamw(o.dev(), w, g, m, v, a); });
    if (!o.verify()) continue;
    std::vector<double> w64 = w0, m64 = m0, v64 = v0;
    std::vector<float> w32 = cast<float>(w0), m32 = cast<float>(m0), v32 = cast<float>(v0);
    adamw_ref(w64, g0, m64, v64, a);
    adamw_ref(w32, cast<float>(g0), m32, v32, a);
    expect_rule("adamw w", o.get(w), w64, cast<double>(w32));
    expect_rule("adamw m", o.get(m), m64, cast<double>(m32));
    expect_rule("adamw v", o.get(v), v64, cast<double>(v32));
  }
}

void all_ops(Ops& o) {
  gemm_ops(o);
  attention_ops(o);
  lse_merge_ops(o);
  rope_ops(o);
  rmsnorm_ops(o);
  swiglu_ops(o);
  cross_entropy_ops(o);
  data_ops(o);
  row_ops(o);
  optim_ops(o);
}

class BackendOps : public ::testing::TestWithParam<Path> {
 protected:
  void run(void (*ops)(Ops&)) {
    const OnPath on(GetParam().isa);
    ASSERT_EQ(cpu_isa(), GetParam().isa);
    ASSERT_EQ(cpu_vector_target(), GetParam().isa == CpuIsa::kAvx2 ? "AVX2" : "AVX3");
    Device dev({GetParam().kind});
    Ops o(dev, true);
    ops(o);
    EXPECT_FALSE(o.log().empty());
  }
};

TEST_P(BackendOps, Gemm) {
  run(gemm_ops);
}
TEST_P(BackendOps, Attention) {
  run(attention_ops);
}
TEST_P(BackendOps, LseMerge) {
  run(lse_merge_ops);
}
TEST_P(BackendOps, Rope) {
  run(rope_ops);
}
TEST_P(BackendOps, RmsNorm) {
  run(rmsnorm_ops);
}
TEST_P(BackendOps, SwiGlu) {
  run(swiglu_ops);
}
TEST_P(BackendOps, CrossEntropy) {
  run(cross_entropy_ops);
}
TEST_P(BackendOps, DataMovement) {
  run(data_ops);
}
TEST_P(BackendOps, EmbeddingRows) {
  run(row_ops);
}
TEST_P(BackendOps, Optimizer) {
  run(optim_ops);
}
TEST_P(BackendOps, AsyncCopies) {
  run(copy_ops);
}

// The embedding's front-ends refuse an id outside the table and a count other than the rows,
// naming them, on the CPU and on the meta device (which checks what it would run).
TEST(BackendOpsDeathTest, EmbeddingRowsRefuseBadIds) {
  for (BackendKind k : {BackendKind::kCpu, BackendKind::kMeta}) {
    Device dev({k});
    Tensor table(dev.mem(), Tag::kOther, F, 13, 8), rows(dev.mem(), Tag::kOther, F, 2, 8);
    const std::vector<int32_t> past = {1, 13}, negative = {-1, 0}, one = {1};
    EXPECT_DEATH(gather_rows(dev, rows.mat(), table.mat(), past),
                 "id 13 at row 1 is not a row of a 13-row");
    EXPECT_DEATH(scatter_add_rows(dev, table.mat(), rows.mat(), negative), "id -1 at row 0");
    EXPECT_DEATH(gather_rows(dev, rows.mat(), table.mat(), one), "1 ids for 2x8 rows");
  }
}

INSTANTIATE_TEST_SUITE_P(Computing, BackendOps, ::testing::ValuesIn(paths()),
                         [](const auto& i) { return path_name(i.param); });

// The meta backend planning for each computing backend: the same op list takes, call by call,
// the workspace bytes that backend takes (the planner's exactness rests on it), and nothing
// runs: the meta arena is not backed, so every tensor's data is null.
TEST(MetaBackendOps, SameWorkspaceAsItsTargetAndComputesNothing) {
  for (const Path& path : paths()) {
    const OnPath on(path.isa);
    const BackendKind kind = path.kind;
    Device real({kind});
    Device meta({BackendKind::kMeta, int64_t(1) << 40, int64_t(1) << 40, kind});
    ASSERT_FALSE(meta.backend().computes());
    ASSERT_FALSE(meta.mem().backed());
    Ops r(real, false), m(meta, false);
    all_ops(r);
    all_ops(m);
    EXPECT_EQ(m.log(), r.log()) << "meta planning for " << path_name(path);
  }
}

// The CPU's deferred copies (UPIPE_CPU_COPIES=deferred, the test mode that finds a missing wait):
// a copy runs only when waited on, in issue order up to the ticket; a copy never waited on is an
// error at sync; an unknown mode is a configuration error.
TEST(CpuCopies, DeferredRunWhenWaitedOnInIssueOrder) {
  const ScopedEnv env("UPIPE_CPU_COPIES", "deferred");
  Device dev({BackendKind::kCpu});
  Tensor a(dev.host(), Tag::kOther, F, 1, 64), b(dev.host(), Tag::kOther, F, 1, 64),
      c(dev.host(), Tag::kOther, F, 1, 64);
  float* pa = static_cast<float*>(a.data());
  float* pb = static_cast<float*>(b.data());
  float* pc = static_cast<float*>(c.data());
  for (int i = 0; i < 64; ++i) {
    pa[i] = float(i);
    pb[i] = -1.0f;
    pc[i] = -2.0f;
  }
  const CopyTicket t1 = dev.copy_async(pb, pa, 256, CopyKind::kHostToHost);
  const CopyTicket t2 = dev.copy_async(pc, pb, 256, CopyKind::kHostToHost);
  EXPECT_EQ(pb[5], -1.0f) << "ran before its wait";
  dev.wait(t1);
  EXPECT_EQ(pb[5], 5.0f);
  EXPECT_EQ(pc[5], -2.0f) << "a later copy ran with an earlier wait";
  dev.wait(t1);  // again: nothing
  dev.wait(t2);
  EXPECT_EQ(pc[63], 63.0f) << "the second copy read the first one's result";
  dev.backend().sync(Stream{});
  dev.copy_async(pa, pc, 256, CopyKind::kHostToHost);
  try {
    dev.backend().sync(Stream{});
    ADD_FAILURE() << "sync accepted a copy never waited on";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("never waited on"), std::string::npos) << e.what();
  }
  dev.wait_copies();  // the dropped copy is not run later
  EXPECT_EQ(pa[1], 1.0f);
  Ops o(dev, true);  // the op suite's copies keep the contract: right under deferral too
  copy_ops(o);
  dev.backend().sync(Stream{});
  const ScopedEnv bad("UPIPE_CPU_COPIES", "later");
  EXPECT_THROW(Device({BackendKind::kCpu}), ConfigError);
}

// The CUDA backend joins the suite above where a GPU is present; here it says why it did not.
TEST(CudaBackendOps, RunWhereAGpuIs) {
  std::string why;
  if (!cuda_device_available(&why)) GTEST_SKIP() << "cuda ops not run: " << why;
  bool listed = false;
  for (const Path& p : paths()) listed |= p.kind == BackendKind::kCuda;
  EXPECT_TRUE(listed);
}

// Planning for the GPU needs no GPU: the meta device asks the CUDA backend's pure queries. Every
// op takes exactly its query (Ops::call checks it), and the GEMMs take cuBLASLt's scratch, which
// the CPU's do not.
TEST(MetaBackendOps, PlansForCudaWithoutAGpu) {
  if (!cuda_backend_built()) GTEST_SKIP() << "this build has no CUDA backend (-DUPIPE_CUDA=ON)";
  Device meta({BackendKind::kMeta, int64_t(1) << 40, int64_t(1) << 40, BackendKind::kCuda});
  Device meta_cpu({BackendKind::kMeta, int64_t(1) << 40, int64_t(1) << 40, BackendKind::kCpu});
  Ops m(meta, false), c(meta_cpu, false);
  all_ops(m);
  all_ops(c);
  ASSERT_EQ(m.log().size(), c.log().size());
  int gemms = 0;
  for (const WsRecord& r : m.log())
    if (r.op.rfind("gemm", 0) == 0) {
      EXPECT_GE(r.bytes, int64_t(32) << 20) << r;
      ++gemms;
    }
  EXPECT_GT(gemms, 0);
  EXPECT_NE(m.log(), c.log());
}

}  // namespace
}  // namespace upipe
