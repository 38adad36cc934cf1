#include "attention/check.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <cmath>
#include <map>
#include <optional>
#include <tuple>
#include <vector>

#include "attention/device_comm.h"
#include "attention/harness.h"
#include "attention/local.h"
#include "attention/methods.h"
#include "attention/reference_block.h"
#include "backend/tensor_ops.h"
#include "comm/fake/fake_comm.h"

namespace upipe {
namespace {

constexpr const char* kNames[] = {"y", "dx", "dwq", "dwk", "dwv", "dwo", "dwqn", "dwkn"};

std::vector<double> read_all(Device& dev, const Mat& m) {
  const std::vector<float> f = download(dev, m);
  return std::vector<double>(f.begin(), f.end());
}

// The whole (S, cols) tensor from every rank's shard, in global row order.
// The shard is read back to the host first: on a GPU the rank's device memory is not the
// scratch device's.
std::vector<double> gathered(Device& dev, Communicator& comm, const SeqLayout& layout,
                             const Mat& shard) {
  Device scratch;
  Tensor local(scratch.mem(), Tag::kOther, shard.dtype, shard.rows, shard.cols);
  const std::vector<float> f = download(dev, shard);
  upload(scratch, f.data(), local);
  Tensor global(scratch.mem(), Tag::kOther, shard.dtype, layout.seq_len, shard.cols);
  gather_rows(scratch, comm, layout, local, global);
  return read_all(scratch, global);
}

std::vector<double> summed(Device& dev, Communicator& comm, const Mat& g) {
  std::vector<float> f = download(dev, g);
  comm.all_reduce(f.data(), int64_t(f.size()), DType::kF32, ReduceOp::kSum);
  return std::vector<double>(f.begin(), f.end());
}

// Both are NaN when any value is not finite (std::max would silently drop a NaN), so a
// non-finite output or reference can never pass `err <= tol`.
double max_abs(const std::vector<double>& v) {
  double m = 0;
  for (double x : v) {
    if (!std::isfinite(x)) return std::nan("");
    m = std::max(m, std::abs(x));
  }
  return m;
}

double max_diff(const std::vector<double>& a, const std::vector<double>& b) {
  double m = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    if (!std::isfinite(a[i]) || !std::isfinite(b[i])) return std::nan("");
    m = std::max(m, std::abs(a[i] - b[i]));
  }
  return m;
}

double eps_of(DType t) {
  return t == DType::kF32 ? std::ldexp(1.0, -23) : std::ldexp(1.0, -8);
}

// What a strategy is compared with: `local` on the whole sequence and, for strategies that
// merge partial results, local's own error against the fp64 block (the rule's |local - fp64|).
struct Oracle {
  std::vector<std::vector<double>> want;         // local's tensors, in kNames order
  std::optional<std::vector<double>> local_err;  // per tensor, when computed
};

int tensor_count(const AttentionConfig& cfg) {
  return cfg.qk_norm ? 8 : 6;
}

std::vector<const Mat*> outputs(const BlockTensors& t, int n) {
  std::vector<const Mat*> v{&t.y.mat(),  &t.dx.mat(), &t.gq.mat(),  &t.gk.mat(),
                            &t.gv.mat(), &t.go.mat(), &t.gqn.mat(), &t.gkn.mat()};
  v.resize(size_t(n));
  return v;
}

// One piece of the oracle: `local` on the rows [start, start + len) alone (the whole sequence, or
// one document), and with_fp64 the naive fp64 block on the same inputs. Its y, dx rows go to rows
// start.. of `want` / `r64`, its weight gradients are added to theirs.
void add_piece(const AttentionConfig& whole, BackendKind backend, uint64_t seed, bool with_fp64,
               int64_t start, int64_t len, std::vector<std::vector<double>>& want,
               std::vector<std::vector<double>>& r64) {
  AttentionConfig cfg = whole;
  cfg.seq_len = len;
  const int n = tensor_count(cfg);
  Device odev({backend});  // local on the strategy's backend: the comparison is of data movement
  FakeCommunicator one(0, 1);
  LocalAttention local({odev, one, cfg});
  BlockTensors lt = make_block_tensors(odev, cfg, RowPositions{{{len, start}}}, seed);
  run_block(local, odev, lt);
  // Rows of y, dx are placed; gradients summed.
  auto add = [&](std::vector<double>& dst, int i, const std::vector<double>& src) {
    const int64_t off = i < 2 ? start * int64_t(src.size()) / len : 0;
    for (size_t e = 0; e < src.size(); ++e) dst[size_t(off) + e] += src[e];
  };
  const std::vector<const Mat*> outs = outputs(lt, n);
  for (int i = 0; i < n; ++i) add(want[size_t(i)], i, read_all(odev, *outs[size_t(i)]));
  if (!with_fp64) return;
  ref::BlockData<double> b;
  b.x = read_all(odev, lt.x);
  b.dy = read_all(odev, lt.dy);
  b.wq = read_all(odev, lt.wq);
  b.wk = read_all(odev, lt.wk);
  b.wv = read_all(odev, lt.wv);
  b.wo = read_all(odev, lt.wo);
  if (cfg.qk_norm) {
    b.wqn = read_all(odev, lt.wqn);
    b.wkn = read_all(odev, lt.wkn);
  }
  ref::attention_block<double>(cfg, b);
  const std::vector<double>* got[] = {&b.y, &b.dx, &b.gq, &b.gk, &b.gv, &b.go, &b.gqn, &b.gkn};
  for (int i = 0; i < n; ++i) add(r64[size_t(i)], i, *got[i]);
}

// The inputs are a pure function of (config, seed), so the oracle is computed once per process
// and configuration (and documents): the multi-rank table compares many strategies with the same
// `local` run, and the naive fp64 block dominates a test case's time.
const Oracle& oracle(const AttentionConfig& cfg, BackendKind backend, uint64_t seed, bool with_fp64,
                     const std::vector<int64_t>& doc_lens) {
  static std::map<std::string, Oracle> cache;
  const RopeScaling& rs = cfg.rope.scaling;
  const std::string key =
      fmt::format("{} {} {} {} {} {} {} {} {} {} {} {} {} {} {} {} {} docs {}",
                  backend_kind_name(backend), cfg.seq_len, cfg.heads, cfg.kv_heads, cfg.head_dim,
                  cfg.model_dim(), dtype_name(cfg.dtype), cfg.fp32_residual, cfg.qk_norm,
                  cfg.norm_eps, cfg.rope.theta, rs.enabled, rs.factor, rs.low_freq_factor,
                  rs.high_freq_factor, rs.original_max_position, seed, fmt::join(doc_lens, ","));
  Oracle& o = cache[key];
  if (!o.want.empty() && (o.local_err || !with_fp64)) return o;
  const int n = tensor_count(cfg);
  const int64_t dm = cfg.model_dim(), qd = cfg.q_dim(), kd = cfg.kv_dim(), d = cfg.head_dim;
  const int64_t sizes[] = {cfg.seq_len * dm, cfg.seq_len * dm, qd * dm, kd * dm,
                           kd * dm,          dm * qd,          d,       d};
  std::vector<std::vector<double>> want, r64;
  for (int i = 0; i < n; ++i) {
    want.emplace_back(size_t(sizes[i]), 0.0);
    r64.emplace_back(with_fp64 ? size_t(sizes[i]) : 0, 0.0);
  }
  if (doc_lens.empty()) {
    add_piece(cfg, backend, seed, with_fp64, 0, cfg.seq_len, want, r64);
  } else {
    int64_t start = 0;
    for (int64_t len : doc_lens) {
      add_piece(cfg, backend, seed, with_fp64, start, len, want, r64);
      start += len;
    }
  }
  o.want = std::move(want);
  if (!with_fp64) return o;
  o.local_err.emplace(size_t(n), 0.0);
  for (int i = 0; i < n; ++i)
    (*o.local_err)[size_t(i)] = max_diff(o.want[size_t(i)], r64[size_t(i)]);
  return o;
}

}  // namespace

CheckResult check_strategy(const AttentionConfig& cfg, Communicator& world,
                           const CheckOptions& opt) {
  Device dev({opt.backend, opt.device_budget, opt.device_budget});
  DeviceComm comm(dev, world);  // the strategy's; host results go through world
  auto strat = make_strategy({dev, comm, cfg});
  const bool docs = opt.doc_lens.size() > 1;  // one document is the plain sequence
  if (docs) strat->set_documents(std::make_shared<const Documents>(opt.doc_lens, cfg.seq_len));
  const SeqLayout layout = strat->layout();
  BlockTensors t = make_block_tensors(dev, cfg, layout.positions(world.rank()), opt.seed);
  comm.get().reset_stats();
  const BlockRun run = run_block(*strat, dev, t);
  CheckResult res;
  res.method = cfg.knobs.method;
  res.ranks = world.size();
  res.comm = comm.get().stats();
  res.communicator = comm.get().backend();
  res.comm_expected = strat->comm_expected();
  res.fwd_s = run.fwd_s;
  res.bwd_s = run.bwd_s;
  res.peak_by_tag = run.peak_by_tag;
  res.attn_formula_bytes = strat->attn_formula_bytes();
  res.host_formula_bytes = strat->host_formula_bytes();
  {  // max of the per-rank peaks
    std::vector<int64_t> mine{run.peak_bytes, run.attn_peak_bytes, run.host_peak_bytes},
        all(size_t(3 * world.size()));
    world.all_gather(mine.data(), all.data(), 3 * sizeof(int64_t));
    for (int j = 0; j < world.size(); ++j) {
      res.peak_bytes = std::max(res.peak_bytes, all[size_t(3 * j)]);
      res.attn_peak_bytes = std::max(res.attn_peak_bytes, all[size_t(3 * j + 1)]);
      res.host_peak_bytes = std::max(res.host_peak_bytes, all[size_t(3 * j + 2)]);
    }
  }
  const int n = tensor_count(cfg);
  std::vector<std::vector<double>> got;
  const std::vector<const Mat*> outs = outputs(t, n);
  for (int i = 0; i < n; ++i)
    got.push_back(i < 2 ? gathered(dev, world, layout, *outs[size_t(i)])
                        : summed(dev, world, *outs[size_t(i)]));
  // Which tensors the merge rule bounds: all of them for strategies that merge softmax partials;
  // with KV heads replicated over ranks (K < C) those that depend on the replicas' dK/dV sums,
  // added in another order than local's single accumulation; and always the QK-norm weight
  // gradients, (1, d) sums of S x heads terms whose order follows the sharding.
  // bf16 GEMMs staged through fp32 (no native bf16 product on this CPU) make a bf16
  // intermediate's rounding depend on how its GEMM is cut (rows per rank, heads per stage), so
  // no tensor is data movement alone there.
  const bool staged_bf16 = cfg.dtype == DType::kBF16 && !dev.backend().native_bf16_gemm();
  const AttentionStrategy::ErrorClass ec =
      docs || staged_bf16 ? AttentionStrategy::ErrorClass::kMerge : strat->error_class();
  auto merged = [&](int i) {
    const std::string nm = kNames[i];
    return ec == AttentionStrategy::ErrorClass::kMerge || nm == "dwqn" || nm == "dwkn" ||
           (ec == AttentionStrategy::ErrorClass::kReplicaSums &&
            (nm == "dx" || nm == "dwk" || nm == "dwv"));
  };
  const std::string merge_rule = "err <= 4 |local - fp64| + the data-movement bound";
  const std::string move_rule =
      "err <= 16 eps_fp32 max|local| (fp32 tensors), 2 eps_bf16 max|local| (bf16 y, dx)";
  if (docs)
    res.rule = "packed documents against each document alone, merge (every tensor): " + merge_rule +
               "; data movement bound: " + move_rule;
  else if (staged_bf16 && strat->error_class() != AttentionStrategy::ErrorClass::kMerge)
    res.rule =
        "bf16 GEMMs staged through fp32 on this CPU (a bf16 intermediate may round the other "
        "way when its GEMM is cut differently), merge (every tensor): " +
        merge_rule + "; data movement bound: " + move_rule;
  else if (ec == AttentionStrategy::ErrorClass::kMerge)
    res.rule = "merge (every tensor): " + merge_rule + "; data movement bound: " + move_rule;
  else if (ec == AttentionStrategy::ErrorClass::kReplicaSums)
    res.rule = std::string("merge for dx, dwk, dwv (replicated KV heads' gradient sums)") +
               (cfg.qk_norm ? ", dwqn, dwkn (long reductions)" : "") + ": " + merge_rule +
               "; data movement for the others: " + move_rule;
  else if (cfg.qk_norm)
    res.rule = "merge for dwqn, dwkn (long reductions): " + merge_rule +
               "; data movement for the others: " + move_rule;
  else
    res.rule = "data movement: " + move_rule;
  bool any_merge = false;
  for (int i = 0; i < n; ++i) any_merge = any_merge || merged(i);
  std::vector<double> verdict(size_t(1 + 2 * n), 0.0);  // passed, then err and tolerance each
  if (world.rank() == 0) {
    const Oracle& o =
        oracle(cfg, opt.backend, opt.seed, any_merge, docs ? opt.doc_lens : std::vector<int64_t>{});
    bool ok = true;
    for (int i = 0; i < n; ++i) {
      const std::vector<double>& want = o.want[size_t(i)];
      const double scale = max_abs(want);
      const bool bf16 = i < 2 && cfg.out_dtype() == DType::kBF16;  // y, dx in the output dtype
      const double move =
          bf16 ? 2 * eps_of(DType::kBF16) * scale : 16 * eps_of(DType::kF32) * scale;
      const double tol = merged(i) ? 4 * (*o.local_err)[size_t(i)] + move : move;
      const double err = max_diff(got[size_t(i)], want);
      verdict[size_t(1 + 2 * i)] = err;
      verdict[size_t(2 + 2 * i)] = tol;
      ok = ok && std::isfinite(err) && std::isfinite(tol) && err <= tol;
    }
    verdict[0] = ok ? 1.0 : 0.0;
  }
  world.broadcast(verdict.data(), int64_t(verdict.size() * sizeof(double)), 0);
  res.passed = verdict[0] == 1.0;
  for (int i = 0; i < n; ++i) {
    res.max_abs_err[kNames[i]] = verdict[size_t(1 + 2 * i)];
    res.tolerance[kNames[i]] = verdict[size_t(2 + 2 * i)];
  }
  return res;
}

}  // namespace upipe
