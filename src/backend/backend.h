// The op interface every computation of the engine goes through (ggml-style: a small table of
// documented ops). A Backend computes; the front-end functions of this directory (gemm.h,
// attention.h, rope.h, rmsnorm.h, swiglu.h, tensor_ops.h) validate shapes, take each op's
// workspace from the device arena (tag workspace) at the size the backend's query states, and
// call the backend. Strategies and the model see only the front-ends and the queries, never
// which backend runs.
//
// Implementations: cpu/ (oneDNN GEMM, Highway flash attention), meta/ (answers the queries of
// the backend it plans for, computes nothing; the planner's device), cuda/ (cuBLASLt, own
// flash-attention kernels; built with -DUPIPE_CUDA=ON).
// docs/backend.md states the contract each op must satisfy and how a backend is tested
// (tests/unit/test_backend_ops.cpp runs every op of every computing backend against
// reference/).
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "core/allocator.h"
#include "core/dtype.h"
#include "core/tensor.h"

namespace upipe {

enum class BackendKind { kCpu, kMeta, kCuda };
const char* backend_kind_name(BackendKind k);
// "cpu" or "cuda" (the computing backends a user picks); throws ConfigError otherwise, and for
// "cuda" when this build has no CUDA backend.
BackendKind parse_backend_kind(const std::string& name);
// Whether this build has the CUDA backend (-DUPIPE_CUDA=ON), and whether this process can run
// it (a GPU and a driver); if not, why (the reason tests skip with).
bool cuda_backend_built();
bool cuda_device_available(std::string* why = nullptr);
// The CUDA libraries this process loaded and their versions (cuda_library_versions), "" in a build
// without the CUDA backend.
std::string cuda_libraries();
// The bytes of this process's GPU in use by anyone (cudaMemGetInfo: total - free); -1 without
// CUDA. Around a step it shows what was allocated outside the device arena (should be nothing).
int64_t cuda_driver_used_bytes();

// An ordered queue of copies and kernels (a CUDA stream on the GPU). The CPU backend runs
// everything at once, in order; the default stream (id 0) is the one every op uses.
struct Stream {
  int id = 0;
};

enum class CopyKind { kHostToDevice, kDeviceToHost, kDeviceToDevice, kHostToHost };

// An asynchronous copy (Backend::copy_async): its number in issue order across the backend's copy
// lanes, counted from 1; 0 names no copy (waiting on it does nothing).
struct CopyTicket {
  int64_t id = 0;
};

// ---- Op parameters (plain structs; views carry their own strides) ----

// C = alpha op(A) op(B) + beta C, fp32 accumulation; operands fp32 or bf16 in any mix.
struct GemmShape {
  int64_t m = 0, n = 0, k = 0;  // op(A): (m, k), op(B): (k, n), C: (m, n)
  DType a = DType::kF32, b = DType::kF32, c = DType::kF32;
};
struct GemmArgs {
  Mat a;
  bool trans_a = false;
  Mat b;
  bool trans_b = false;
  Mat c;
  float alpha = 1.0f, beta = 0.0f;
  GemmShape shape() const;
};

// Rows of a view that hold one document at consecutive positions inside it: rows [row, row +
// rows) of a span list hold positions [pos, pos + rows) of document `doc`.
struct DocSpan {
  int64_t row = 0, rows = 0;
  int64_t doc = 0;  // document id: any numbering the query and key lists share
  int64_t pos = 0;  // position of the span's first row inside its document
};
// The documents of a view's rows (packed sequences), for document-causal attention: query row i
// sees key row j iff both lie in spans of the same document and pos(j) <= pos(i). A list covers
// its rows in row order and is sorted by (doc, pos), so the keys one query row sees are one
// contiguous range of key rows; each list is in device memory (the mask metadata a strategy
// builds once per layer, tag docs). row0 is the list row of the view's row 0, so sub-views of a
// sequence share its list. docs/backend.md says how a varlen kernel (cuDNN) would map it.
struct DocRows {
  const DocSpan* spans = nullptr;
  int64_t count = 0;
  int64_t row0 = 0;
  bool empty() const { return count == 0; }
  DocRows shifted(int64_t rows) const { return {spans, count, row0 + rows}; }
};

// Causal flash attention on head-major views (see attention.h for the layout and the
// reduction-order contract). Without documents (q_docs, k_docs empty) query row i sits at
// position q_pos0 + i and key row j at k_pos0 + j; with them (both given, causal) the spans
// decide what is visible and q_pos0, k_pos0 are unused.
struct AttnProblem {
  Mat q;  // (sq, hq*d)
  Mat k;  // (sk, hk*d)
  Mat v;  // (sk, hk*d)
  int hq = 0, hk = 0, d = 0;
  int64_t q_pos0 = 0, k_pos0 = 0;
  bool causal = true;
  float scale = 0.0f;  // 0 means 1/sqrt(d)
  DocRows q_docs = {}, k_docs = {};

  int64_t sq() const { return q.rows; }
  int64_t sk() const { return k.rows; }
  bool documents() const { return !q_docs.empty(); }
  float softmax_scale() const;
};
// What the attention workspace depends on: never the rows, so one query covers every call of a
// strategy's schedule with these heads.
struct AttnShape {
  int d = 0;
  DType t = DType::kF32;
  bool documents = false;  // document-causal (DocRows given)
  int hq = 0, hk = 0;      // the call's query and KV heads
};
// Forward: either normalised (o, lse) or an online-softmax continuation (acc, m, l).
struct AttnFwdArgs {
  AttnProblem p;
  Mat o, lse;     // (sq, hq*d) q's dtype, (hq, sq) fp32
  Mat acc, m, l;  // (sq, hq*d) fp32, (hq, sq) fp32, (hq, sq) fp32
  bool accumulate = false;
};
struct AttnBwdArgs {
  AttnProblem p;
  Mat dout, lse, delta;  // (sq, hq*d), (hq, sq) fp32, (hq, sq) fp32
  Mat dq, dk, dv;        // fp32, accumulated
  // The forward's o (sq, hq*d) in q's dtype, where the caller still holds it (empty otherwise): a
  // library backward that computes its own delta from o (cuDNN's) can take the call only then.
  Mat o;
};

// Rotary embedding frequencies: theta^(-2i/d), optionally rescaled by the Llama-3.1 "llama3"
// rule of Hugging Face transformers (factor, low/high frequency factors, original context).
struct RopeScaling {
  bool enabled = false;
  double factor = 1.0, low_freq_factor = 1.0, high_freq_factor = 4.0;
  int64_t original_max_position = 8192;
  bool operator==(const RopeScaling&) const = default;
};
struct RopeParams {
  double theta = 10000.0;
  RopeScaling scaling;
  // The d/2 inverse frequencies, in fp64, that every backend's RoPE uses (reference/ writes the
  // same rule out independently, as transformers does, to test it).
  std::vector<double> inv_freq(int d) const;
};

// Maps the local rows of a shard to global positions as runs: rows [start, start+len) hold
// positions [pos, pos+len). Contiguous shards have one run, zigzag shards two.
struct RowPositions {
  struct Run {
    int64_t rows, pos;
  };
  std::vector<Run> runs;
  static RowPositions contiguous(int64_t rows, int64_t pos0) { return {{{rows, pos0}}}; }
  int64_t total_rows() const;
  // Positions of each local row, expanded (tests and references).
  std::vector<int64_t> expand() const;
};

// One AdamW step (PyTorch's torch.optim.AdamW, decoupled weight decay, bias correction) on a
// range of a parameter: w -= lr*wd*w; m = b1 m + (1-b1) g'; v = b2 v + (1-b2) g'^2;
// w -= lr/(1-b1^t) * m / (sqrt(v)/sqrt(1-b2^t) + eps), with g' = grad_scale * g (the clipping
// factor).
struct AdamWArgs {
  double lr = 1e-3, beta1 = 0.9, beta2 = 0.95, eps = 1e-8, weight_decay = 0.0;
  double grad_scale = 1.0;
  int64_t step = 1;  // t, counted from 1
};

// ---- The interface ----

class Backend {
 protected:
  int64_t async_copies_ = 0;  // tickets issued (the default copy_async's numbering)

 public:
  virtual ~Backend() = default;
  virtual BackendKind kind() const = 0;
  // Whether ops write results (false for meta: allocations are counted, nothing runs).
  virtual bool computes() const = 0;

  // Memory behind the device and host arenas.
  virtual std::unique_ptr<Allocator> make_device_allocator() const = 0;
  virtual std::unique_ptr<Allocator> make_host_allocator() const = 0;
  // Byte copies between or within the arenas, ordered on `stream`.
  virtual void copy(void* dst, const void* src, int64_t bytes, CopyKind kind, Stream s) = 0;
  // Blocks until everything queued on s is done (and every waited-on asynchronous copy).
  virtual void sync(Stream s) = 0;
  // An asynchronous copy beside the compute stream, on one of two copy lanes (copy_lanes.h:
  // device -> host, and the rest), each running its copies in issue order: it starts once every
  // op queued before the call is done, and every copy issued before it that shares memory with
  // it where one of them writes (its source holds their results; they no longer read its
  // destination), so it sees what one queue in issue order would show; copies with disjoint
  // memory may run at once. Nothing queued after the call is ordered after it until wait_copy.
  // Until then no op, copy or host code may write its source or touch its destination.
  // wait_copy(t) orders everything queued after it after copy t and every copy issued before t,
  // on the device only: host code that reads or writes a host buffer of copy t needs sync()
  // first. Every ticket is waited on before its buffers are freed.
  // The default runs the copy at once (the CPU's and the meta device's behaviour; the CPU's
  // UPIPE_CPU_COPIES=deferred runs them only when waited on, reordered as far as the lanes
  // allow, to find a missing wait).
  virtual CopyTicket copy_async(void* dst, const void* src, int64_t bytes, CopyKind kind) {
    copy(dst, src, bytes, kind, Stream{});
    return CopyTicket{++async_copies_};
  }
  virtual void wait_copy(CopyTicket) {}

  // Workspace each op takes from the device arena (bytes, exact) and whether it is supported.
  virtual int64_t gemm_workspace_bytes(const GemmShape& s) const = 0;
  virtual int64_t attention_fwd_workspace_bytes(const AttnShape& s) const = 0;
  virtual int64_t attention_bwd_workspace_bytes(const AttnShape& s) const = 0;
  virtual int64_t rmsnorm_workspace_bytes(int64_t group) const = 0;
  virtual int64_t swiglu_workspace_bytes(int64_t cols) const = 0;
  virtual bool gemm_supports(const GemmShape& s) const = 0;
  // Whether bf16 x bf16 products run as one native bf16 GEMM (fp32 accumulation in an order that
  // does not follow how a product is cut into calls). False where they are staged through fp32
  // blocks (a CPU without AVX512-BF16): an element's fp32 sum then depends on the call's shape,
  // so the same bf16 intermediate computed in differently cut GEMMs may round the other way.
  virtual bool native_bf16_gemm() const { return true; }
  virtual bool attention_supports(const AttnShape& s) const = 0;
  // Whether attention_backward of this shape runs faster given the forward's o (AttnBwdArgs::o):
  // a library kernel that derives delta from o itself (cuDNN's). A strategy that would free o
  // before the backward keeps it through the call then, and its memory formula counts it.
  virtual bool attention_backward_reads_o(const AttnShape&) const { return false; }

  // Ops. ws points at the op's workspace (its query's size). Views may be strided.
  virtual void gemm(const GemmArgs& a, void* ws) = 0;
  virtual void attention_forward(const AttnFwdArgs& a, void* ws) = 0;
  virtual void attention_backward(const AttnBwdArgs& a, void* ws) = 0;
  // acc = 0, m = -inf, l = 0.
  virtual void attention_accumulate_init(const Mat& acc, const Mat& m, const Mat& l) = 0;
  // o = acc / l, lse = m + log(l); rows with l = 0 get o = 0, lse = -inf.
  virtual void attention_finalize(const Mat& acc, const Mat& m, const Mat& l, int d, const Mat& o,
                                  const Mat& lse) = 0;
  // (o, lse) <- merge((o, lse), (o2, lse2)) over disjoint key sets.
  virtual void lse_merge(const Mat& o, const Mat& lse, const Mat& o2, const Mat& lse2, int d) = 0;
  // delta (hq, sq) = rowsum(do * o) per head.
  virtual void attention_delta(const Mat& o, const Mat& dout, int d, const Mat& delta) = 0;
  // In-place rotation of every d-wide head of x (rows, heads*d); sign -1 is the backward.
  virtual void rope(const Mat& x, int d, const RowPositions& pos, const RopeParams& rp,
                    int sign) = 0;
  // y = x / rms(x) * w over each `group`-wide column group of x (rows, cols); w: (1, group).
  // group = cols is the model's RMSNorm, group = d Qwen3's per-head QK-norm.
  virtual void rmsnorm_forward(const Mat& x, const Mat& w, int64_t group, float eps, const Mat& y,
                               void* ws) = 0;
  // dx = d(y)/d(x)^T dy (dx may alias dy); dw (1, group) fp32 accumulated (+=).
  virtual void rmsnorm_backward(const Mat& x, const Mat& w, int64_t group, float eps, const Mat& dy,
                                const Mat& dx, const Mat& dw, void* ws) = 0;
  // Cross-entropy of a (T, V) fp32 tile of logits, in place: each row r with labels[r] >= 0
  // becomes scale * (softmax(row) - onehot(labels[r])), a row with label -1 becomes 0. Returns the
  // tile's sum of -log softmax(row)[labels[r]] (unscaled). labels: T ids on the host.
  virtual double cross_entropy(const Mat& logits, std::span<const int32_t> labels, float scale) = 0;
  virtual void swiglu_forward(const Mat& a, const Mat& b, const Mat& h, void* ws) = 0;
  virtual void swiglu_backward(const Mat& a, const Mat& b, const Mat& dh, const Mat& da,
                               const Mat& db, void* ws) = 0;
  // Elementwise data movement on views.
  virtual void fill(const Mat& x, float value) = 0;
  virtual void convert(const Mat& dst, const Mat& src) = 0;   // dtypes may differ
  virtual void add_into(const Mat& dst, const Mat& src) = 0;  // dst += src, in fp32, rounded once
  // dst (r, c) = beta dst + src^T, fp32.
  virtual void add_transposed(const Mat& dst, const Mat& src, float beta) = 0;
  // Embedding rows; ids: dst.rows (src.rows) row indices of table, on the host. gather_rows:
  // dst row r = table row ids[r], converted to dst's dtype. scatter_add_rows: table row ids[r] +=
  // src row r, in fp32 rounded once into table's dtype per addition, r ascending (a row that ids
  // names twice takes its additions in that order: the same bits as one add_into per row).
  virtual void gather_rows(const Mat& dst, const Mat& table, std::span<const int32_t> ids) = 0;
  virtual void scatter_add_rows(const Mat& table, const Mat& src, std::span<const int32_t> ids) = 0;
  // Optimizer ops on contiguous fp32 views. sum_squares: the sum of x^2 accumulated in fp64 in a
  // fixed order (deterministic: the same bits for the same x; 0 on a device that does not
  // compute).
  virtual double sum_squares(const Mat& x) = 0;
  // AdamW on w, with gradient g and moments m, v (all fp32, same shape), in place.
  virtual void adamw(const Mat& w, const Mat& g, const Mat& m, const Mat& v,
                     const AdamWArgs& a) = 0;
};

// The backend of `kind`; a meta backend answers the queries of `plans_for` (a CUDA target needs
// no GPU: its queries are pure functions).
std::unique_ptr<Backend> make_backend(BackendKind kind, BackendKind plans_for = BackendKind::kCpu);

}  // namespace upipe
