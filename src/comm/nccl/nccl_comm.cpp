#include "comm/nccl/nccl_comm.h"

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <thread>

#include "comm/nccl/nccl_check.h"
#include "core/check.h"
#include "core/errors.h"
#include "core/watchdog.h"

// ncclCommSplit (the strategies' groups) is the newest call used; ncclAlltoAll (2.28) is not, so
// an older NCCL on the GPU machine (a PyTorch wheel's) still runs. make_nccl_comm checks the
// library's version at run time too: it may be older than these headers.
#if NCCL_VERSION_CODE < NCCL_VERSION(2, 18, 0)
#error "comm/nccl needs NCCL >= 2.18 (ncclCommSplit)"
#endif

namespace upipe {
namespace nccl {

void fail_nccl(ncclResult_t rc, const char* expr, const char* file, int line) {
  const char* detail = ncclGetLastError(nullptr);
  throw Error(fmt::format(
      "NCCL error {} ({}{}{}) in {} at {}:{} — check that every rank runs the "
      "same calls in the same order and has its own GPU",
      int(rc), ncclGetErrorString(rc), detail != nullptr && detail[0] != '\0' ? ": " : "",
      detail != nullptr ? detail : "", expr, file, line));
}

void fail_cuda(cudaError_t rc, const char* expr, const char* file, int line) {
  throw Error(fmt::format("CUDA error {} ({}) in {} at {}:{}", int(rc), cudaGetErrorString(rc),
                          expr, file, line));
}

}  // namespace nccl

namespace {

// Destructors must not throw: a failure there is reported and the teardown goes on.
void report_teardown(bool ok, const char* what, const char* text) {
  if (ok) return;
  std::fprintf(stderr, "[rank %d] %s failed during teardown: %s\n", log_rank(), what, text);
}
#define UPIPE_TEARDOWN_CUDA(expr)                                        \
  do {                                                                   \
    const cudaError_t rc_ = (expr);                                      \
    report_teardown(rc_ == cudaSuccess, #expr, cudaGetErrorString(rc_)); \
  } while (0)

size_t to_count(int64_t v, const char* what) {
  UPIPE_CHECK(v >= 0, "{} = {} must be non-negative", what, v);
  return size_t(v);
}

ncclDataType_t nccl_type(DType t) {
  return t == DType::kF32 ? ncclFloat32 : ncclBfloat16;
}

ncclRedOp_t nccl_op(ReduceOp op) {
  return op == ReduceOp::kSum ? ncclSum : ncclMax;
}

// An NCCL group that ends on every path: a throw between ncclGroupStart and ncclGroupEnd would
// leave this thread's group open, and NCCL would defer every later call on it (the
// communicator's destroy included) into a group that never ends.
class GroupScope {
 public:
  GroupScope() { UPIPE_NCCL_CHECK(ncclGroupStart()); }
  ~GroupScope() {
    if (!ended_) {
      const ncclResult_t rc = ncclGroupEnd();
      report_teardown(rc == ncclSuccess, "ncclGroupEnd", ncclGetErrorString(rc));
    }
  }
  GroupScope(const GroupScope&) = delete;
  GroupScope& operator=(const GroupScope&) = delete;
  void end() {
    ended_ = true;
    UPIPE_NCCL_CHECK(ncclGroupEnd());
  }

 private:
  bool ended_ = false;
};

}  // namespace

bool is_device_pointer(const void* p) {
  cudaPointerAttributes a{};
  if (cudaPointerGetAttributes(&a, p) != cudaSuccess) {
    (void)cudaGetLastError();  // not sticky, but pending: no stale status for a later launch
    return false;
  }
  return a.type == cudaMemoryTypeDevice;
}

std::string nccl_library_version() {
  int v = 0;
  if (ncclGetVersion(&v) != ncclSuccess) return "unknown";
  // NCCL >= 2.9 codes a version as major * 10000 + minor * 100 + patch.
  return fmt::format("{}.{}.{}", v / 10000, v / 100 % 100, v % 100);
}

std::string nccl_unavailable_reason() {
  int v = 0;
  if (ncclGetVersion(&v) != ncclSuccess) return "ncclGetVersion failed";
  if (v < NCCL_VERSION(2, 18, 0))
    return fmt::format("the NCCL library loaded ({}) is older than 2.18, which upipe needs",
                       nccl_library_version());
  int n = 0;
  const cudaError_t rc = cudaGetDeviceCount(&n);
  if (rc != cudaSuccess)
    return fmt::format("no GPU: cudaGetDeviceCount failed: {}", cudaGetErrorString(rc));
  if (n == 0) return "no GPU: cudaGetDeviceCount found 0 devices";
  return {};
}

std::pair<int, int> ranks_sharing_gpu(Communicator& mpi_world, int device) {
  cudaDeviceProp prop;
  UPIPE_COMM_CUDA_CHECK(cudaGetDeviceProperties(&prop, device));
  std::array<uint8_t, 16> mine;
  static_assert(sizeof(prop.uuid.bytes) == sizeof(mine));
  std::memcpy(mine.data(), prop.uuid.bytes, mine.size());
  std::vector<std::array<uint8_t, 16>> all(size_t(mpi_world.size()));
  mpi_world.all_gather(mine.data(), all.data(), int64_t(mine.size()));
  return ranks_sharing_gpu(all);
}

NcclWork::NcclWork(CommOp op, NcclCommunicator& comm) : comm_(comm), op_(op) {
  UPIPE_COMM_CUDA_CHECK(cudaEventCreateWithFlags(&event_, cudaEventDisableTiming));
  UPIPE_COMM_CUDA_CHECK(cudaEventRecord(event_, comm.stream()));
}

NcclWork::~NcclWork() {
  // Destructors must not throw (std::terminate would skip the error path that ends the job
  // with its message): a failed wait here is reported, the error that unwinds goes on.
  if (!handed_over_) {
    try {
      wait();
    } catch (const std::exception& e) {
      report_teardown(false, "waiting for a pending NCCL call", e.what());
    }
  }
  UPIPE_TEARDOWN_CUDA(cudaEventDestroy(event_));
}

void NcclWork::wait() {
  handed_over_ = true;  // a failed wait is not retried by the destructor
  comm_.await(event_, op_);
}

void NcclWork::wait_on(CUstream_st* stream) {
  UPIPE_COMM_CUDA_CHECK(cudaStreamWaitEvent(stream, event_, 0));
  handed_over_ = true;
}

NcclCommunicator::NcclCommunicator(Communicator& mpi_world, int device)
    : device_(device), rank_(mpi_world.rank()), size_(mpi_world.size()) {
  UPIPE_COMM_CUDA_CHECK(cudaSetDevice(device_));
  // A rank's communicators (the world and its splits: USP's and upipe-ring's two groups, whose
  // calls may be in flight together under --overlap) launch their kernels in the host's order,
  // which is the same program order on every rank, so kernels of two communicators cannot wait
  // on each other across GPUs. Read by NCCL at its first init; a user's own setting wins.
  setenv("NCCL_LAUNCH_ORDER_IMPLICIT", "1", 0);
  ncclUniqueId id;
  std::memset(&id, 0, sizeof(id));
  if (rank_ == 0) UPIPE_NCCL_CHECK(ncclGetUniqueId(&id));
  mpi_world.broadcast(&id, int64_t(sizeof(id)), 0);
  {
    WatchdogOp scope("nccl init");
    UPIPE_NCCL_CHECK(ncclCommInitRank(&comm_, size_, id, rank_));
  }
  init_streams();
}

NcclCommunicator::NcclCommunicator(ncclComm* comm, int device, CUstream_st* compute)
    : comm_(comm), device_(device), compute_(compute) {
  UPIPE_NCCL_CHECK(ncclCommCount(comm_, &size_));
  UPIPE_NCCL_CHECK(ncclCommUserRank(comm_, &rank_));
  init_streams();
}

void NcclCommunicator::init_streams() {
  // Non-blocking: the comm stream never serialises with the legacy default stream behind the
  // host's back; its order with compute is the explicit event of after_compute().
  UPIPE_COMM_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
  UPIPE_COMM_CUDA_CHECK(cudaEventCreateWithFlags(&ready_, cudaEventDisableTiming));
  UPIPE_COMM_CUDA_CHECK(cudaMalloc(&barrier_buf_, sizeof(float)));
  UPIPE_COMM_CUDA_CHECK(cudaMemsetAsync(barrier_buf_, 0, sizeof(float), stream_));
}

NcclCommunicator::~NcclCommunicator() {
  // ncclCommDestroy waits for the communicator's queued kernels: while an error unwinds, one may
  // wait for a peer that never comes, so it is aborted instead.
  if (comm_ != nullptr && std::uncaught_exceptions() > 0) abort_comm();
  // Otherwise its last calls end first under the watchdog (a peer that never matches a handed-over
  // Work would block ncclCommDestroy with no deadline), aborting on a peer's failure.
  if (comm_ != nullptr) {
    try {
      await(nullptr, "nccl teardown");
    } catch (const std::exception& e) {
      report_teardown(false, "waiting for the last NCCL calls", e.what());
    }
  }
  if (comm_ != nullptr) {
    const ncclResult_t rc = ncclCommDestroy(comm_);
    report_teardown(rc == ncclSuccess, "ncclCommDestroy", ncclGetErrorString(rc));
  }
  UPIPE_TEARDOWN_CUDA(cudaFree(barrier_buf_));
  UPIPE_TEARDOWN_CUDA(cudaEventDestroy(ready_));
  UPIPE_TEARDOWN_CUDA(cudaStreamDestroy(stream_));
}

void NcclCommunicator::after_compute() {
  live_comm();
  UPIPE_COMM_CUDA_CHECK(cudaEventRecord(ready_, compute_));
  UPIPE_COMM_CUDA_CHECK(cudaStreamWaitEvent(stream_, ready_, 0));
}

ncclComm* NcclCommunicator::live_comm() const {
  if (comm_ == nullptr)
    throw Error(fmt::format(
        "rank {}: the NCCL communicator was aborted after an earlier error; no call can run on it",
        rank_));
  return comm_;
}

void NcclCommunicator::abort_comm() {
  if (comm_ == nullptr) return;
  const ncclResult_t rc = ncclCommAbort(comm_);
  report_teardown(rc == ncclSuccess, "ncclCommAbort", ncclGetErrorString(rc));
  comm_ = nullptr;
}

void NcclCommunicator::await(CUevent_st* event, const char* what) {
  WatchdogOp scope(what);
  for (int64_t polls = 0;; ++polls) {
    const cudaError_t st = event != nullptr ? cudaEventQuery(event) : cudaStreamQuery(stream_);
    if (st == cudaSuccess) return;
    if (st != cudaErrorNotReady) UPIPE_COMM_CUDA_CHECK(st);
    if (comm_ != nullptr) {
      ncclResult_t async = ncclSuccess;
      UPIPE_NCCL_CHECK(ncclCommGetAsyncError(comm_, &async));
      if (async != ncclSuccess && async != ncclInProgress) {
        const char* detail = ncclGetLastError(comm_);
        const std::string why = fmt::format("{}{}{}", ncclGetErrorString(async),
                                            detail != nullptr && detail[0] != '\0' ? ": " : "",
                                            detail != nullptr ? detail : "");
        abort_comm();  // ends the kernels that would wait for the peer forever
        throw Error(fmt::format(
            "rank {}: NCCL failed during {} ({}); the communicator was aborted — a peer rank "
            "failed or left, its own message says why",
            rank_, what, why));
      }
    }
    // Spin briefly (most waits are short), then give the core back.
    if (polls < 1000)
      std::this_thread::yield();
    else
      std::this_thread::sleep_for(std::chrono::microseconds(20));
  }
}

std::unique_ptr<Work> NcclCommunicator::started(CommOp op) {
  return std::make_unique<NcclWork>(op, *this);
}

void NcclCommunicator::enqueue_all_to_all(const void* send, void* recv, int64_t bytes_per_rank) {
  const size_t n = to_count(bytes_per_rank, "all_to_all bytes per rank");
  record(CommOp::kAllToAll, bytes_per_rank * (size_ - 1));
  after_compute();
  if (n == 0) return;
  // One grouped send and receive per peer, the self block included: what ncclAlltoAll (2.28+)
  // does inside, without needing that version.
  auto* s = static_cast<const uint8_t*>(send);
  auto* r = static_cast<uint8_t*>(recv);
  GroupScope group;
  for (int i = 0; i < size_; ++i) {
    UPIPE_NCCL_CHECK(ncclSend(s + size_t(i) * n, n, ncclInt8, i, comm_, stream_));
    UPIPE_NCCL_CHECK(ncclRecv(r + size_t(i) * n, n, ncclInt8, i, comm_, stream_));
  }
  group.end();
}

// NCCL matches a send to a receive of exactly the same size, unlike MPI (which accepts a larger
// receive): recv_bytes must equal the peer's send_bytes. Zero-byte sides are skipped on both ends
// alike, since the peer's matching side is zero too.
void NcclCommunicator::enqueue_sendrecv(const void* send, int64_t send_bytes, int dst, void* recv,
                                        int64_t recv_bytes, int src) {
  UPIPE_CHECK((dst == rank_) == (src == rank_),
              "sendrecv to {} from {} on rank {}: either both peers are this rank or neither", dst,
              src, rank_);
  record(CommOp::kSendRecv, dst == rank_ ? 0 : send_bytes);
  after_compute();
  if (dst == rank_) {
    UPIPE_CHECK(send_bytes <= recv_bytes, "sendrecv to self: {} bytes into a {}-byte receive",
                send_bytes, recv_bytes);
    if (send_bytes > 0)
      UPIPE_COMM_CUDA_CHECK(
          cudaMemcpyAsync(recv, send, size_t(send_bytes), cudaMemcpyDeviceToDevice, stream_));
    return;
  }
  const size_t sn = to_count(send_bytes, "sendrecv send bytes");
  const size_t rn = to_count(recv_bytes, "sendrecv recv bytes");
  GroupScope group;
  if (sn > 0) UPIPE_NCCL_CHECK(ncclSend(send, sn, ncclInt8, dst, comm_, stream_));
  if (rn > 0) UPIPE_NCCL_CHECK(ncclRecv(recv, rn, ncclInt8, src, comm_, stream_));
  group.end();
}

void NcclCommunicator::all_to_all(const void* send, void* recv, int64_t bytes_per_rank) {
  WatchdogOp scope(comm_op_name(CommOp::kAllToAll));
  enqueue_all_to_all(send, recv, bytes_per_rank);
  sync(CommOp::kAllToAll);
}

void NcclCommunicator::all_to_allv(const void* send, const int64_t* send_bytes,
                                   const int64_t* send_displs, void* recv,
                                   const int64_t* recv_bytes, const int64_t* recv_displs) {
  WatchdogOp scope(comm_op_name(CommOp::kAllToAllV));
  int64_t sent = 0;
  for (int i = 0; i < size_; ++i) {
    to_count(send_bytes[i], "all_to_allv send bytes");
    to_count(send_displs[i], "all_to_allv send displacement");
    to_count(recv_bytes[i], "all_to_allv recv bytes");
    to_count(recv_displs[i], "all_to_allv recv displacement");
    if (i != rank_) sent += send_bytes[i];
  }
  record(CommOp::kAllToAllV, sent);
  after_compute();
  auto* s = static_cast<const uint8_t*>(send);
  auto* r = static_cast<uint8_t*>(recv);
  // Grouped, so every pair's transfers progress together; the self block goes through NCCL too.
  GroupScope group;
  for (int i = 0; i < size_; ++i) {
    if (send_bytes[i] > 0)
      UPIPE_NCCL_CHECK(
          ncclSend(s + send_displs[i], size_t(send_bytes[i]), ncclInt8, i, comm_, stream_));
    if (recv_bytes[i] > 0)
      UPIPE_NCCL_CHECK(
          ncclRecv(r + recv_displs[i], size_t(recv_bytes[i]), ncclInt8, i, comm_, stream_));
  }
  group.end();
  sync(CommOp::kAllToAllV);
}

void NcclCommunicator::all_gather(const void* send, void* recv, int64_t bytes_per_rank) {
  WatchdogOp scope(comm_op_name(CommOp::kAllGather));
  iall_gather(send, recv, bytes_per_rank)->wait();
}

void NcclCommunicator::reduce_scatter(const void* send, void* recv, int64_t count, DType t,
                                      ReduceOp op) {
  WatchdogOp scope(comm_op_name(CommOp::kReduceScatter));
  ireduce_scatter(send, recv, count, t, op)->wait();
}

void NcclCommunicator::all_reduce(void* buf, int64_t count, DType t, ReduceOp op) {
  WatchdogOp scope(comm_op_name(CommOp::kAllReduce));
  iall_reduce(buf, count, t, op)->wait();
}

void NcclCommunicator::broadcast(void* buf, int64_t bytes, int root) {
  WatchdogOp scope(comm_op_name(CommOp::kBroadcast));
  record(CommOp::kBroadcast, rank_ == root ? bytes * (size_ - 1) : 0);
  after_compute();
  UPIPE_NCCL_CHECK(
      ncclBroadcast(buf, buf, to_count(bytes, "broadcast bytes"), ncclInt8, root, comm_, stream_));
  sync(CommOp::kBroadcast);
}

void NcclCommunicator::sendrecv(const void* send, int64_t send_bytes, int dst, void* recv,
                                int64_t recv_bytes, int src) {
  WatchdogOp scope(comm_op_name(CommOp::kSendRecv));
  enqueue_sendrecv(send, send_bytes, dst, recv, recv_bytes, src);
  sync(CommOp::kSendRecv);
}

void NcclCommunicator::barrier() {
  WatchdogOp scope(comm_op_name(CommOp::kBarrier));
  live_comm();
  record(CommOp::kBarrier, 0);
  UPIPE_NCCL_CHECK(
      ncclAllReduce(barrier_buf_, barrier_buf_, 1, ncclFloat32, ncclSum, comm_, stream_));
  sync(CommOp::kBarrier);
}

std::unique_ptr<Work> NcclCommunicator::iall_to_all(const void* send, void* recv,
                                                    int64_t bytes_per_rank) {
  WatchdogOp scope(comm_op_name(CommOp::kAllToAll));
  enqueue_all_to_all(send, recv, bytes_per_rank);
  return started(CommOp::kAllToAll);
}

std::unique_ptr<Work> NcclCommunicator::iall_gather(const void* send, void* recv,
                                                    int64_t bytes_per_rank) {
  WatchdogOp scope(comm_op_name(CommOp::kAllGather));
  record(CommOp::kAllGather, bytes_per_rank * (size_ - 1));
  after_compute();
  UPIPE_NCCL_CHECK(ncclAllGather(send, recv, to_count(bytes_per_rank, "all_gather bytes per rank"),
                                 ncclInt8, comm_, stream_));
  return started(CommOp::kAllGather);
}

std::unique_ptr<Work> NcclCommunicator::ireduce_scatter(const void* send, void* recv, int64_t count,
                                                        DType t, ReduceOp op) {
  WatchdogOp scope(comm_op_name(CommOp::kReduceScatter));
  record(CommOp::kReduceScatter, count * dtype_size(t) * (size_ - 1));
  after_compute();
  UPIPE_NCCL_CHECK(ncclReduceScatter(send, recv, to_count(count, "reduce_scatter count"),
                                     nccl_type(t), nccl_op(op), comm_, stream_));
  return started(CommOp::kReduceScatter);
}

std::unique_ptr<Work> NcclCommunicator::iall_reduce(void* buf, int64_t count, DType t,
                                                    ReduceOp op) {
  WatchdogOp scope(comm_op_name(CommOp::kAllReduce));
  const int64_t bytes = count * dtype_size(t);
  record(CommOp::kAllReduce, size_ > 1 ? 2 * bytes * (size_ - 1) / size_ : 0);
  after_compute();
  UPIPE_NCCL_CHECK(ncclAllReduce(buf, buf, to_count(count, "all_reduce count"), nccl_type(t),
                                 nccl_op(op), comm_, stream_));
  return started(CommOp::kAllReduce);
}

std::unique_ptr<Work> NcclCommunicator::isendrecv(const void* send, int64_t send_bytes, int dst,
                                                  void* recv, int64_t recv_bytes, int src) {
  WatchdogOp scope(comm_op_name(CommOp::kSendRecv));
  enqueue_sendrecv(send, send_bytes, dst, recv, recv_bytes, src);
  return started(CommOp::kSendRecv);
}

std::unique_ptr<Communicator> NcclCommunicator::split(const SplitRule& rule) {
  const SplitPlace want = split_place(rule, rank_, size_);
  const SplitKey me = rule(rank_);
  ncclComm* sub = nullptr;
  {
    WatchdogOp scope("split");
    UPIPE_NCCL_CHECK(ncclCommSplit(live_comm(), me.color, me.key, &sub, nullptr));
  }
  std::unique_ptr<NcclCommunicator> c(new NcclCommunicator(sub, device_, compute_));
  UPIPE_CHECK(c->size() == want.size && c->rank() == want.rank,
              "split gave rank {} of {}, the rule gives rank {} of {}; every rank must pass the "
              "same rule",
              c->rank(), c->size(), want.rank, want.size);
  c->parent_ = this;
  return c;
}

std::string nccl_world_unusable(Communicator& mpi_world, int device) {
  std::string why = nccl_unavailable_reason();
  if (why.empty()) {
    int n = 0;
    UPIPE_COMM_CUDA_CHECK(cudaGetDeviceCount(&n));
    if (device < 0 || device >= n)
      why = fmt::format("device {} is not one of the {} visible GPUs (0..{})", device, n, n - 1);
  }
  // Every rank learns whether any rank cannot run, so all of them decide alike.
  float cannot = why.empty() ? 0.0f : 1.0f;
  mpi_world.all_reduce(&cannot, 1, DType::kF32, ReduceOp::kMax);
  if (!why.empty()) return fmt::format("NCCL cannot run on rank {}: {}", mpi_world.rank(), why);
  if (cannot > 0)
    return "NCCL cannot run on another rank (its message says why); every rank needs a GPU";
  const auto [a, b] = ranks_sharing_gpu(mpi_world, device);
  if (a >= 0)
    return fmt::format(
        "ranks {} and {} would drive the same GPU, which NCCL refuses; give each rank its own GPU "
        "(device = local rank) or use the staged communicator (comm/staged/staged_comm.h), which "
        "runs MPI collectives through host memory",
        a, b);
  return {};
}

std::unique_ptr<Communicator> make_nccl_comm(Communicator& mpi_world, int device) {
  const std::string why = nccl_world_unusable(mpi_world, device);
  if (!why.empty()) throw Error(why);
  return std::make_unique<NcclCommunicator>(mpi_world, device);
}

}  // namespace upipe
