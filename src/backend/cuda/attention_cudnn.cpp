// cuDNN fused attention for the normalised forward and the backward (attention_cudnn.h). One cudnn
// handle per device and one graph per layout (dims, strides, mask, scale), built on first use; a
// layout cuDNN rejects, a forward whose plan needs a workspace (its query is 0) or a backward
// block whose plan needs more than the workspace has left is remembered as unsupported and runs
// on the flash kernels.
#include "backend/cuda/attention_cudnn.h"

#include "backend/cuda/attention_plan.h"

#if UPIPE_HAVE_CUDNN_FE

#include <cudnn_frontend.h>
#include <fmt/format.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <initializer_list>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <vector>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/elementwise_cuda.h"
#include "core/errors.h"

namespace upipe::cuda {
namespace {

namespace fe = cudnn_frontend;

enum Uid : int64_t {
  kQ = 1,
  kK = 2,
  kV = 3,
  kO = 4,
  kStats = 5,
  kDO = 6,
  kDQ = 7,
  kDK = 8,
  kDV = 9
};

// Everything a graph depends on: which pass, its tensors' dims and strides, the mask, the scale
// and the device (unused entries stay 0).
struct Key {
  int64_t v[2 + 9 * 8 + 2];
  bool operator<(const Key& o) const { return std::memcmp(v, o.v, sizeof v) < 0; }
};
Key key_of(int pass, std::initializer_list<const attn::Bhsd*> tensors, attn::SdpaMask mask,
           float scale, int device) {
  Key k{};
  int n = 0;
  k.v[n++] = pass;
  k.v[n++] = device;
  for (const attn::Bhsd* t : tensors)
    for (int i = 0; i < 4; ++i) {
      k.v[n++] = t->dim[i];
      k.v[n++] = t->stride[i];
    }
  uint32_t bits;
  std::memcpy(&bits, &scale, 4);
  k.v[n++] = int64_t(mask);
  k.v[n++] = int64_t(bits);
  return k;
}

std::vector<int64_t> vec(const int64_t (&x)[4]) {
  return {x[0], x[1], x[2], x[3]};
}

// A built graph and the workspace its plan asks for; a null graph: unsupported.
struct Built {
  std::shared_ptr<fe::graph::Graph> g;
  int64_t workspace = 0;
};
struct Cache {
  std::mutex mu;
  std::map<int, cudnnHandle_t> handles;  // per device
  std::map<Key, Built> graphs;
};
Cache& cache() {
  static Cache* c = new Cache;  // never destroyed: handles outlive static destruction order
  return *c;
}

cudnnHandle_t handle_for(Cache& c, int device) {
  auto it = c.handles.find(device);
  if (it != c.handles.end()) return it->second;
  cudnnHandle_t h = nullptr;
  const cudnnStatus_t st = cudnnCreate(&h);
  if (st != CUDNN_STATUS_SUCCESS)
    throw Error(fmt::format("cudnnCreate failed: {}", cudnnGetErrorString(st)));
  c.handles[device] = h;
  return h;
}

std::shared_ptr<fe::graph::Graph> new_graph() {
  auto g = std::make_shared<fe::graph::Graph>();
  g->set_io_data_type(fe::DataType_t::BFLOAT16)
      .set_intermediate_data_type(fe::DataType_t::FLOAT)
      .set_compute_data_type(fe::DataType_t::FLOAT);
  return g;
}

std::shared_ptr<fe::graph::Tensor_attributes> input(fe::graph::Graph& g, const char* name,
                                                    int64_t uid, const attn::Bhsd& b) {
  return g.tensor(fe::graph::Tensor_attributes()
                      .set_name(name)
                      .set_uid(uid)
                      .set_dim(vec(b.dim))
                      .set_stride(vec(b.stride)));
}

void output(const std::shared_ptr<fe::graph::Tensor_attributes>& t, int64_t uid,
            const attn::Bhsd& b, fe::DataType_t type) {
  t->set_output(true)
      .set_uid(uid)
      .set_data_type(type)
      .set_dim(vec(b.dim))
      .set_stride(vec(b.stride));
}

// cuDNN's causal mask of our three (the forward and backward attributes share these setters).
template <class Attributes>
void set_mask(Attributes& opts, attn::SdpaMask mask) {
  if (mask == attn::SdpaMask::kTopLeft)
    opts.set_diagonal_alignment(fe::DiagonalAlignment_t::TOP_LEFT).set_diagonal_band_right_bound(0);
  else if (mask == attn::SdpaMask::kBottomRight)
    opts.set_diagonal_alignment(fe::DiagonalAlignment_t::BOTTOM_RIGHT)
        .set_diagonal_band_right_bound(0);
}

// The graph built for h and its workspace, or a null graph when cuDNN rejects it.
Built finish(cudnnHandle_t h, std::shared_ptr<fe::graph::Graph> g) {
  if (g->build(h, {fe::HeurMode_t::A}).is_bad()) return {};
  int64_t ws = -1;
  if (g->get_workspace_size(ws).is_bad() || ws < 0) return {};
  return {std::move(g), ws};
}

// The forward graph of plan p on cuDNN's implementation `impl`, or a null graph where it is
// rejected (the frontend throws, rather than returning an error, where AUTO finds no
// implementation: a rejection like any other).
Built build_forward(cudnnHandle_t h, const attn::SdpaPlan& p, float scale,
                    fe::AttentionImplementation_t impl) try {
  auto g = new_graph();
  auto q = input(*g, "Q", kQ, p.q), k = input(*g, "K", kK, p.k), v = input(*g, "V", kV, p.v);
  auto opts = fe::graph::SDPA_attributes()
                  .set_name("upipe_sdpa")
                  .set_generate_stats(true)
                  .set_attn_scale(scale)
                  .set_implementation(impl);
  set_mask(opts, p.mask);
  auto [o, stats] = g->sdpa(q, k, v, opts);
  output(o, kO, p.o, fe::DataType_t::BFLOAT16);
  output(stats, kStats, p.stats, fe::DataType_t::FLOAT);
  return finish(h, std::move(g));
} catch (const std::exception&) {
  return {};
}
// The frontend's own choice first (AUTO: its UNIFIED implementation where the graph allows, e.g.
// without a mask on cuDNN >= 9.13.1), then COMPOSITE where that is rejected or asks for more than
// `workspace` bytes: a graph one implementation has no plan for on this GPU may have one in the
// other, and a call cuDNN takes is several times faster than the flash kernels.
Built build_forward(cudnnHandle_t h, const attn::SdpaPlan& p, float scale, int64_t workspace) {
  Built b = build_forward(h, p, scale, fe::AttentionImplementation_t::AUTO);
  if (b.g && b.workspace <= workspace) return b;
  Built c = build_forward(h, p, scale, fe::AttentionImplementation_t::COMPOSITE);
  return c.g && (!b.g || c.workspace <= workspace) ? c : b;
}

// One backward block's tensors: q, o, do rows and the packed stats of its query rows, k, v rows
// of its keys, and the packed bf16 gradients it writes.
struct BwdTensors {
  attn::Bhsd q, k, v, o, dout, stats, dq, dk, dv;
};
DView rows_of(const DView& x, int64_t r0, int64_t rows) {
  DView b = x;
  b.data = static_cast<char*>(x.data) + r0 * x.ld * (x.dtype == DT::kBF16 ? 2 : 4);
  b.rows = rows;
  return b;
}
DView packed_bf16(void* data, int64_t rows, int64_t cols) {
  return {data, DT::kBF16, rows, cols, cols};
}
BwdTensors bwd_tensors(const DAttn& p, const DView& o, const DView& dout,
                       const attn::SdpaBlock& b) {
  BwdTensors t;
  t.q = attn::bhsd_of(rows_of(p.q, b.q0, b.rows), p.hq, p.d);
  t.o = attn::bhsd_of(rows_of(o, b.q0, b.rows), p.hq, p.d);
  t.dout = attn::bhsd_of(rows_of(dout, b.q0, b.rows), p.hq, p.d);
  t.k = attn::bhsd_of(rows_of(p.k, b.k0, b.keys), p.hk, p.d);
  t.v = attn::bhsd_of(rows_of(p.v, b.k0, b.keys), p.hk, p.d);
  t.stats = attn::bhsd_stats({nullptr, DT::kF32, p.hq, b.rows, b.rows});
  t.dq = attn::bhsd_of(packed_bf16(nullptr, b.rows, int64_t(p.hq) * p.d), p.hq, p.d);
  t.dk = attn::bhsd_of(packed_bf16(nullptr, b.keys, int64_t(p.hk) * p.d), p.hk, p.d);
  t.dv = t.dk;
  return t;
}

Built build_backward(cudnnHandle_t h, const BwdTensors& t, attn::SdpaMask mask, float scale) {
  auto g = new_graph();
  auto q = input(*g, "Q", kQ, t.q), k = input(*g, "K", kK, t.k), v = input(*g, "V", kV, t.v);
  auto o = input(*g, "O", kO, t.o), dout = input(*g, "dO", kDO, t.dout);
  auto stats = input(*g, "Stats", kStats, t.stats);
  stats->set_data_type(fe::DataType_t::FLOAT);
  // Deterministic: no atomics in dQ's accumulation, so a step gives the same bits every run.
  auto opts = fe::graph::SDPA_backward_attributes()
                  .set_name("upipe_sdpa_bwd")
                  .set_attn_scale(scale)
                  .set_deterministic_algorithm(true);
  set_mask(opts, mask);
  auto [dq, dk, dv] = g->sdpa_backward(q, k, v, o, dout, stats, opts);
  output(dq, kDQ, t.dq, fe::DataType_t::BFLOAT16);
  output(dk, kDK, t.dk, fe::DataType_t::BFLOAT16);
  output(dv, kDV, t.dv, fe::DataType_t::BFLOAT16);
  return finish(h, std::move(g));
}

bool disabled() {
  // UPIPE_CUDNN_SDPA=0 at run time: the flash kernels for every call (to compare the two paths,
  // or when cuDNN's arithmetic breaks the head-subset contract a strategy check relies on).
  static const bool off = [] {
    const char* v = std::getenv("UPIPE_CUDNN_SDPA");
    return v != nullptr && std::string(v) == "0";
  }();
  return off;
}

// Says once per process and pass, on stderr, why a call cuDNN could have taken runs on the flash
// kernels (cuDNN rejected a block's graph or asked for more workspace than it had): the speed of
// such a run is the flash kernels', which a user should know. Called with the cache's lock held.
void note_fallback(const char* pass, const std::string& why) {
  static std::set<std::string> said;
  if (!said.insert(pass).second) return;
  std::fprintf(stderr, "upipe: cuDNN's attention %s %s; such calls run on the flash kernels\n",
               pass, why.c_str());
}

// Why a block's built graph cannot run in the `left` bytes its temporaries leave ("" if it can).
std::string refusal(const Built& g, const attn::SdpaBlock& b, const DAttn& p, int64_t left) {
  if (!g.g)
    return fmt::format("rejected a {} x {} block of {}/{} heads, d = {}", b.rows, b.keys, p.hq,
                       p.hk, p.d);
  if (g.workspace > left)
    return fmt::format(
        "asked for {} bytes of workspace for a {} x {} block of {}/{} heads (d = {}), {} left "
        "after its temporaries",
        g.workspace, b.rows, b.keys, p.hq, p.hk, p.d, left);
  return {};
}

// A call's workspace from its first 256-byte boundary on (the arena aligns to 64): the base and
// the bytes left from there.
struct Aligned {
  char* base;
  int64_t bytes;
};
Aligned aligned256(void* ws, int64_t bytes) {
  const uintptr_t at = reinterpret_cast<uintptr_t>(ws), base_at = (at + 255) / 256 * 256;
  return {reinterpret_cast<char*>(base_at), bytes - int64_t(base_at - at)};
}

void check(cudnnStatus_t st, const char* what) {
  if (st != CUDNN_STATUS_SUCCESS)
    throw Error(fmt::format("{} failed: {}", what, cudnnGetErrorString(st)));
}

}  // namespace

bool cudnn_attention_built() {
  return true;
}

std::string cudnn_version() {
  // cuDNN 9 codes its version as major * 10000 + minor * 100 + patch.
  const size_t v = cudnnGetVersion();
  return fmt::format("cuDNN {}.{}.{} (frontend {}.{}.{})", v / 10000, v / 100 % 100, v % 100,
                     CUDNN_FRONTEND_MAJOR_VERSION, CUDNN_FRONTEND_MINOR_VERSION,
                     CUDNN_FRONTEND_PATCH_VERSION);
}

bool cudnn_attention_forward(const DAttn& p, const DView& o, const DView& lse, void* ws,
                             int64_t ws_bytes, cudaStream_t s) {
  if (disabled()) return false;
  const attn::SdpaPlan plan = attn::sdpa_plan(p.q, p.k, p.v, o, lse, p.hq, p.hk, p.d, p.q_pos0,
                                              p.k_pos0, p.causal, p.q_docs.count > 0);
  if (!plan.use) return false;
  int device = 0;
  UPIPE_CUDA_CHECK(cudaGetDevice(&device));
  Cache& c = cache();
  std::lock_guard<std::mutex> lock(c.mu);
  const cudnnHandle_t h = handle_for(c, device);
  const Key key =
      key_of(0, {&plan.q, &plan.k, &plan.v, &plan.o, &plan.stats}, plan.mask, p.scale, device);
  // The call's workspace (the accumulate mode's blocks, unused here) is cuDNN's if it asks.
  Aligned al = ws != nullptr ? aligned256(ws, ws_bytes) : Aligned{nullptr, 0};
  al.bytes = std::max<int64_t>(al.bytes, 0);
  auto it = c.graphs.find(key);
  if (it == c.graphs.end())
    it = c.graphs.emplace(key, build_forward(h, plan, p.scale, al.bytes)).first;
  if (!it->second.g || it->second.workspace > al.bytes) {
    note_fallback(
        "forward",
        !it->second.g
            ? fmt::format("rejected a {} x {} call of {}/{} heads, d = {}", p.q.rows, p.k.rows,
                          p.hq, p.hk, p.d)
            : fmt::format("asked for {} bytes of workspace ({} given) for a {} x {} call "
                          "of {}/{} heads, d = {}",
                          it->second.workspace, al.bytes, p.q.rows, p.k.rows, p.hq, p.hk, p.d));
    return false;
  }
  check(cudnnSetStream(h, s), "cudnnSetStream");
  std::unordered_map<int64_t, void*> pack = {
      {kQ, p.q.data}, {kK, p.k.data}, {kV, p.v.data}, {kO, o.data}, {kStats, lse.data}};
  auto r = it->second.g->execute(h, pack, it->second.workspace > 0 ? al.base : nullptr);
  if (r.is_bad()) throw Error(fmt::format("cuDNN fused attention failed: {}", r.get_message()));
  return true;
}

bool cudnn_attention_forward_accumulate(const DAttn& p, const DView& acc, const DView& m,
                                        const DView& l, void* ws, int64_t ws_bytes,
                                        cudaStream_t s) {
  if (disabled() || ws == nullptr) return false;
  if (attn::sdpa_blocks_why_not(p.q, p.k, p.v, p.d, p.q_docs.count > 0) != nullptr) return false;
  const Aligned al = aligned256(ws, ws_bytes);
  char* const base = al.base;
  const int64_t budget = al.bytes;
  const int64_t sq = p.q.rows, sk = p.k.rows, qc = int64_t(p.hq) * p.d;
  int device = 0;
  UPIPE_CUDA_CHECK(cudaGetDevice(&device));
  Cache& c = cache();
  std::lock_guard<std::mutex> lock(c.mu);
  const cudnnHandle_t h = handle_for(c, device);
  // A block's plan: its rows of q, k, v, the packed temporaries as o and stats.
  auto plan_of = [&](const attn::SdpaBlock& b) {
    attn::SdpaPlan sp;
    sp.use = true;
    sp.mask = b.mask;
    sp.q = attn::bhsd_of(rows_of(p.q, b.q0, b.rows), p.hq, p.d);
    sp.k = attn::bhsd_of(rows_of(p.k, b.k0, b.keys), p.hk, p.d);
    sp.v = attn::bhsd_of(rows_of(p.v, b.k0, b.keys), p.hk, p.d);
    sp.o = attn::bhsd_of(packed_bf16(nullptr, b.rows, qc), p.hq, p.d);
    sp.stats = attn::bhsd_stats({nullptr, DT::kF32, p.hq, b.rows, b.rows});
    return sp;
  };
  // A block's graph, built for the `left` bytes of workspace after the temporaries (cached by
  // layout: a later side's budget only decides between implementations the first time).
  auto graph_of = [&](const attn::SdpaBlock& b, int64_t left) -> const Built& {
    const attn::SdpaPlan sp = plan_of(b);
    const Key key = key_of(0, {&sp.q, &sp.k, &sp.v, &sp.o, &sp.stats}, sp.mask, p.scale, device);
    auto it = c.graphs.find(key);
    if (it == c.graphs.end()) it = c.graphs.emplace(key, build_forward(h, sp, p.scale, left)).first;
    return it->second;
  };
  for (int64_t side = attn::sdpa_fwd_first_side(sq, sk, p.hq, p.d, budget); side > 0;
       side = attn::sdpa_bwd_next_side(side)) {
    const attn::SdpaFwdLayout lay = attn::sdpa_fwd_layout(side, p.hq, p.d);
    std::string why;
    const bool mapped = attn::for_each_sdpa_block(
        sq, sk, p.q_pos0, p.k_pos0, p.causal, side, [&](const attn::SdpaBlock& b) {
          if (!why.empty()) return;
          why = refusal(graph_of(b, budget - lay.end), b, p, budget - lay.end);
        });
    if (!mapped) continue;
    if (!why.empty()) {
      if (attn::sdpa_bwd_next_side(side) == 0) note_fallback("forward (accumulate mode)", why);
      continue;
    }
    check(cudnnSetStream(h, s), "cudnnSetStream");
    void* const to = base + lay.o;
    float* const tl = reinterpret_cast<float*>(base + lay.lse);
    attn::for_each_sdpa_block(
        sq, sk, p.q_pos0, p.k_pos0, p.causal, side, [&](const attn::SdpaBlock& b) {
          std::unordered_map<int64_t, void*> pack = {{kQ, rows_of(p.q, b.q0, b.rows).data},
                                                     {kK, rows_of(p.k, b.k0, b.keys).data},
                                                     {kV, rows_of(p.v, b.k0, b.keys).data},
                                                     {kO, to},
                                                     {kStats, tl}};
          auto r = graph_of(b, budget - lay.end).g->execute(h, pack, base + lay.end);
          if (r.is_bad())
            throw Error(
                fmt::format("cuDNN fused attention (accumulate) failed: {}", r.get_message()));
          DView mb = m, lb = l;  // columns [q0, q0 + rows) of the row statistics
          mb.data = static_cast<float*>(m.data) + b.q0;
          lb.data = static_cast<float*>(l.data) + b.q0;
          mb.cols = lb.cols = b.rows;
          attention_merge_partial(rows_of(acc, b.q0, b.rows), mb, lb, packed_bf16(to, b.rows, qc),
                                  {tl, DT::kF32, p.hq, b.rows, b.rows}, p.d, s);
        });
    return true;
  }
  return false;
}

bool cudnn_attention_backward(const DAttn& p, const DView& o, const DView& dout, const DView& lse,
                              const DView& dq, const DView& dk, const DView& dv, void* ws,
                              int64_t ws_bytes, cudaStream_t s) {
  if (disabled() || ws == nullptr) return false;
  if (attn::sdpa_bwd_why_not(p.q, p.k, p.v, o, dout, p.d, p.q_docs.count > 0) != nullptr)
    return false;
  const Aligned al = aligned256(ws, ws_bytes);
  char* const base = al.base;
  const int64_t budget = al.bytes;
  const int64_t sq = p.q.rows, sk = p.k.rows;
  int device = 0;
  UPIPE_CUDA_CHECK(cudaGetDevice(&device));
  Cache& c = cache();
  std::lock_guard<std::mutex> lock(c.mu);
  const cudnnHandle_t h = handle_for(c, device);
  auto graph_of = [&](const attn::SdpaBlock& b) -> const Built& {
    const BwdTensors t = bwd_tensors(p, o, dout, b);
    const Key key = key_of(1, {&t.q, &t.k, &t.v, &t.o, &t.dout, &t.stats, &t.dq, &t.dk, &t.dv},
                           b.mask, p.scale, device);
    auto it = c.graphs.find(key);
    if (it == c.graphs.end())
      it = c.graphs.emplace(key, build_backward(h, t, b.mask, p.scale)).first;
    return it->second;
  };
  for (int64_t side = attn::sdpa_bwd_first_side(sq, sk, p.hq, p.hk, p.d, budget); side > 0;
       side = attn::sdpa_bwd_next_side(side)) {
    const attn::SdpaBwdLayout lay = attn::sdpa_bwd_layout(side, p.hq, p.hk, p.d);
    // Every block mapped, its graph built and its workspace within what the temporaries leave.
    // cudnn-frontend puts cuDNN's own workspace right after its softmax sum (hq x rows fp32,
    // unpadded): blocks whose hq x rows is not a multiple of 4 would misalign it, so a side that
    // has one is not taken.
    std::string why;
    bool misaligned = false;
    const bool mapped = attn::for_each_sdpa_block(
        sq, sk, p.q_pos0, p.k_pos0, p.causal, side, [&](const attn::SdpaBlock& b) {
          if (!why.empty() || misaligned) return;
          if (int64_t(p.hq) * b.rows % 4 != 0) {
            misaligned = true;
            return;
          }
          why = refusal(graph_of(b), b, p, budget - lay.cudnn);
        });
    if (!mapped || misaligned) continue;
    if (!why.empty()) {
      if (attn::sdpa_bwd_next_side(side) == 0) note_fallback("backward", why);
      continue;
    }
    check(cudnnSetStream(h, s), "cudnnSetStream");
    void* const tq = base + lay.dq;
    void* const tk = base + lay.dk;
    void* const tv = base + lay.dv;
    float* const stats = reinterpret_cast<float*>(base + lay.stats);
    int64_t stats_q0 = -1;
    attn::for_each_sdpa_block(
        sq, sk, p.q_pos0, p.k_pos0, p.causal, side, [&](const attn::SdpaBlock& b) {
          if (b.q0 != stats_q0) {  // the block's lse rows, packed (hq, rows)
            UPIPE_CUDA_CHECK(cudaMemcpy2DAsync(
                stats, size_t(b.rows) * 4, static_cast<const float*>(lse.data) + b.q0,
                size_t(lse.ld) * 4, size_t(b.rows) * 4, size_t(p.hq), cudaMemcpyDeviceToDevice, s));
            stats_q0 = b.q0;
          }
          auto bf16_at = [](const DView& x, int64_t r) -> void* {
            return static_cast<char*>(x.data) + r * x.ld * 2;
          };
          std::unordered_map<int64_t, void*> pack = {{kQ, bf16_at(p.q, b.q0)},
                                                     {kK, bf16_at(p.k, b.k0)},
                                                     {kV, bf16_at(p.v, b.k0)},
                                                     {kO, bf16_at(o, b.q0)},
                                                     {kDO, bf16_at(dout, b.q0)},
                                                     {kStats, stats},
                                                     {kDQ, tq},
                                                     {kDK, tk},
                                                     {kDV, tv}};
          auto r = graph_of(b).g->execute(h, pack, base + lay.cudnn);
          if (r.is_bad())
            throw Error(fmt::format("cuDNN fused attention backward failed: {}", r.get_message()));
          const int64_t qc = int64_t(p.hq) * p.d, kc = int64_t(p.hk) * p.d;
          add_into(rows_of(dq, b.q0, b.rows), packed_bf16(tq, b.rows, qc), s);
          add_into(rows_of(dk, b.k0, b.keys), packed_bf16(tk, b.keys, kc), s);
          add_into(rows_of(dv, b.k0, b.keys), packed_bf16(tv, b.keys, kc), s);
        });
    return true;
  }
  return false;
}

}  // namespace upipe::cuda

#else  // !UPIPE_HAVE_CUDNN_FE

namespace upipe::cuda {

bool cudnn_attention_built() {
  return false;
}

std::string cudnn_version() {
  return "cuDNN not built in";
}

bool cudnn_attention_forward(const DAttn&, const DView&, const DView&, void*, int64_t,
                             cudaStream_t) {
  return false;
}

bool cudnn_attention_forward_accumulate(const DAttn&, const DView&, const DView&, const DView&,
                                        void*, int64_t, cudaStream_t) {
  return false;
}

bool cudnn_attention_backward(const DAttn&, const DView&, const DView&, const DView&, const DView&,
                              const DView&, const DView&, void*, int64_t, cudaStream_t) {
  return false;
}

}  // namespace upipe::cuda

#endif  // UPIPE_HAVE_CUDNN_FE
