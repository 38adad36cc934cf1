// cuDNN fused attention for the normalised forward (attention_cudnn.h). One cudnn handle per device
// and one graph per layout (dims, strides, mask, scale), built on first use; a layout cuDNN
// rejects, or one whose plan needs a workspace (the attention workspace query is 0), is remembered
// as unsupported and runs on the flash kernels.
#include "backend/cuda/attention_cudnn.h"

#include "backend/cuda/attention_plan.h"

#if UPIPE_HAVE_CUDNN_FE

#include <cudnn_frontend.h>
#include <fmt/format.h>

#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "backend/cuda/cuda_check.h"
#include "core/errors.h"

namespace upipe::cuda {
namespace {

namespace fe = cudnn_frontend;

enum Uid : int64_t { kQ = 1, kK = 2, kV = 3, kO = 4, kStats = 5 };

// Everything a graph depends on: the five tensors' dims and strides, the mask and the scale.
struct Key {
  int64_t v[5 * 8 + 3];
  bool operator<(const Key& o) const { return std::memcmp(v, o.v, sizeof v) < 0; }
};
Key key_of(const attn::SdpaPlan& p, float scale, int device) {
  Key k{};
  int n = 0;
  for (const attn::Bhsd* t : {&p.q, &p.k, &p.v, &p.o, &p.stats})
    for (int i = 0; i < 4; ++i) {
      k.v[n++] = t->dim[i];
      k.v[n++] = t->stride[i];
    }
  uint32_t bits;
  std::memcpy(&bits, &scale, 4);
  k.v[n++] = int64_t(p.mask);
  k.v[n++] = int64_t(bits);
  k.v[n++] = device;
  return k;
}

std::vector<int64_t> vec(const int64_t (&x)[4]) {
  return {x[0], x[1], x[2], x[3]};
}

struct Cache {
  std::mutex mu;
  std::map<int, cudnnHandle_t> handles;                     // per device
  std::map<Key, std::shared_ptr<fe::graph::Graph>> graphs;  // null: unsupported
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

// The graph of plan p, or null when cuDNN does not support it without a workspace.
std::shared_ptr<fe::graph::Graph> build(cudnnHandle_t h, const attn::SdpaPlan& p, float scale) {
  auto g = std::make_shared<fe::graph::Graph>();
  g->set_io_data_type(fe::DataType_t::BFLOAT16)
      .set_intermediate_data_type(fe::DataType_t::FLOAT)
      .set_compute_data_type(fe::DataType_t::FLOAT);
  auto tensor = [&](const char* name, int64_t uid, const attn::Bhsd& b) {
    return g->tensor(fe::graph::Tensor_attributes()
                         .set_name(name)
                         .set_uid(uid)
                         .set_dim(vec(b.dim))
                         .set_stride(vec(b.stride)));
  };
  auto q = tensor("Q", kQ, p.q), k = tensor("K", kK, p.k), v = tensor("V", kV, p.v);
  auto opts = fe::graph::SDPA_attributes()
                  .set_name("upipe_sdpa")
                  .set_generate_stats(true)
                  .set_attn_scale(scale);
  if (p.mask == attn::SdpaMask::kTopLeft)
    opts.set_diagonal_alignment(fe::DiagonalAlignment_t::TOP_LEFT).set_diagonal_band_right_bound(0);
  else if (p.mask == attn::SdpaMask::kBottomRight)
    opts.set_diagonal_alignment(fe::DiagonalAlignment_t::BOTTOM_RIGHT)
        .set_diagonal_band_right_bound(0);
  auto [o, stats] = g->sdpa(q, k, v, opts);
  o->set_output(true).set_uid(kO).set_dim(vec(p.o.dim)).set_stride(vec(p.o.stride));
  stats->set_output(true)
      .set_uid(kStats)
      .set_data_type(fe::DataType_t::FLOAT)
      .set_dim(vec(p.stats.dim))
      .set_stride(vec(p.stats.stride));
  if (g->build(h, {fe::HeurMode_t::A}).is_bad()) return nullptr;
  int64_t ws = -1;
  if (g->get_workspace_size(ws).is_bad() || ws != 0) return nullptr;
  return g;
}

}  // namespace

bool cudnn_attention_built() {
  return true;
}

bool cudnn_attention_forward(const DAttn& p, const DView& o, const DView& lse, cudaStream_t s) {
  // UPIPE_CUDNN_SDPA=0 at run time: the flash kernels for every call (to compare the two paths,
  // or when cuDNN's arithmetic breaks the head-subset contract a strategy check relies on).
  static const bool disabled = [] {
    const char* v = std::getenv("UPIPE_CUDNN_SDPA");
    return v != nullptr && std::string(v) == "0";
  }();
  if (disabled) return false;
  const attn::SdpaPlan plan = attn::sdpa_plan(p.q, p.k, p.v, o, lse, p.hq, p.hk, p.d, p.q_pos0,
                                              p.k_pos0, p.causal, p.q_docs.count > 0);
  if (!plan.use) return false;
  int device = 0;
  UPIPE_CUDA_CHECK(cudaGetDevice(&device));
  Cache& c = cache();
  std::lock_guard<std::mutex> lock(c.mu);
  const cudnnHandle_t h = handle_for(c, device);
  const Key key = key_of(plan, p.scale, device);
  auto it = c.graphs.find(key);
  if (it == c.graphs.end()) it = c.graphs.emplace(key, build(h, plan, p.scale)).first;
  if (!it->second) return false;
  const cudnnStatus_t st = cudnnSetStream(h, s);
  if (st != CUDNN_STATUS_SUCCESS)
    throw Error(fmt::format("cudnnSetStream failed: {}", cudnnGetErrorString(st)));
  std::unordered_map<int64_t, void*> pack = {
      {kQ, p.q.data}, {kK, p.k.data}, {kV, p.v.data}, {kO, o.data}, {kStats, lse.data}};
  auto r = it->second->execute(h, pack, nullptr);
  if (r.is_bad()) throw Error(fmt::format("cuDNN fused attention failed: {}", r.get_message()));
  return true;
}

}  // namespace upipe::cuda

#else  // !UPIPE_HAVE_CUDNN_FE

namespace upipe::cuda {

bool cudnn_attention_built() {
  return false;
}

bool cudnn_attention_forward(const DAttn&, const DView&, const DView&, cudaStream_t) {
  return false;
}

}  // namespace upipe::cuda

#endif  // UPIPE_HAVE_CUDNN_FE
