#include "comm/staged/staged_comm.h"

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <exception>
#include <new>

#include "core/check.h"

namespace upipe {
namespace {

// The receive region of a staging buffer starts on this boundary, so the inner communicator's
// reductions see element-aligned (and cache-line-aligned) data.
constexpr int64_t kStagingAlign = 64;

int64_t round_up(int64_t v, int64_t a) {
  return (v + a - 1) / a * a;
}

// The bytes [0, extent) that blocks at `displs` of `bytes` span.
int64_t extent(const int64_t* bytes, const int64_t* displs, int n) {
  int64_t e = 0;
  for (int i = 0; i < n; ++i) {
    UPIPE_CHECK(bytes[i] >= 0 && displs[i] >= 0, "block {}: {} bytes at displacement {}", i,
                bytes[i], displs[i]);
    if (bytes[i] > 0) e = std::max(e, displs[i] + bytes[i]);
  }
  return e;
}

}  // namespace

void* DeviceCopier::alloc_host(int64_t bytes) {
  return ::operator new(size_t(bytes), std::align_val_t(kStagingAlign));
}

void DeviceCopier::free_host(void* p, int64_t) {
  ::operator delete(p, std::align_val_t(kStagingAlign));
}

void HostCopier::to_host(void* host, const void* dev, int64_t bytes) {
  std::memcpy(host, dev, size_t(bytes));
}

void HostCopier::to_device(void* dev, const void* host, int64_t bytes) {
  std::memcpy(dev, host, size_t(bytes));
}

StagingPool::~StagingPool() {
  for (auto& b : buffers_)
    if (b->data != nullptr) copier_.free_host(b->data, b->capacity);
}

StagingPool::Buffer* StagingPool::acquire(int64_t bytes) {
  Buffer* fit = nullptr;      // the smallest free buffer that holds `bytes`
  Buffer* largest = nullptr;  // the largest free one, to grow when none fits
  for (auto& b : buffers_) {
    if (b->busy) continue;
    if (b->capacity >= bytes && (fit == nullptr || b->capacity < fit->capacity)) fit = b.get();
    if (largest == nullptr || b->capacity > largest->capacity) largest = b.get();
  }
  if (fit == nullptr) {
    if (largest == nullptr) {
      buffers_.push_back(std::make_unique<Buffer>());
      largest = buffers_.back().get();
    }
    if (largest->data != nullptr) copier_.free_host(largest->data, largest->capacity);
    largest->data = nullptr;
    largest->capacity = 0;
    if (bytes > 0) largest->data = static_cast<uint8_t*>(copier_.alloc_host(bytes));
    largest->capacity = bytes;
    fit = largest;
  }
  fit->busy = true;
  return fit;
}

int64_t StagingPool::bytes_held() const {
  int64_t s = 0;
  for (const auto& b : buffers_) s += b->capacity;
  return s;
}

int StagingPool::busy() const {
  return int(
      std::count_if(buffers_.begin(), buffers_.end(), [](const auto& b) { return b->busy; }));
}

// One staged call: a staging buffer (send region, then the receive region), the copies back to
// the device it owes, and the inner communicator's counters before the call, so the call records
// exactly what the inner call recorded.
class StagedCommunicator::Call {
 public:
  Call(StagedCommunicator& comm, CommOp op, int64_t send_bytes, int64_t recv_bytes)
      : comm_(comm),
        op_(op),
        recv_offset_(round_up(send_bytes, kStagingAlign)),
        before_(comm.inner_.stats()) {
    buf_ = comm_.pool_->acquire(recv_bytes > 0 ? recv_offset_ + recv_bytes : send_bytes);
    ++comm_.in_flight_;
  }
  Call(const Call&) = delete;
  Call& operator=(const Call&) = delete;
  ~Call() { release(); }

  uint8_t* send() { return buf_->data; }
  uint8_t* recv() { return buf_->data + recv_offset_; }
  // Copies `bytes` of device memory into the staging buffer at `host`.
  void take(uint8_t* host, const void* dev, int64_t bytes) {
    if (bytes > 0) copier().to_host(host, dev, bytes);
  }
  // Waits for take()'s copies: the inner call reads the staging buffer next.
  void inputs_ready() { copier().sync(); }
  // Owes the device `bytes` from the staging buffer at `host` once the inner call completes.
  void give_back(void* dev, const uint8_t* host, int64_t bytes) {
    if (bytes > 0) owed_.push_back({dev, host, bytes});
  }
  // Called once the inner call has started (it counts when it starts).
  void count() { comm_.record_as(comm_.inner_, op_, before_); }
  // Called once the inner call has completed: copies the results back, waits for the copies and
  // returns the staging buffer to the pool.
  void finish() {
    for (const Owed& o : owed_) copier().to_device(o.dev, o.host, o.bytes);
    copier().sync();
    owed_.clear();
    release();
  }

 private:
  struct Owed {
    void* dev;
    const uint8_t* host;
    int64_t bytes;
  };
  DeviceCopier& copier() { return comm_.pool_->copier(); }
  void release() {
    if (buf_ == nullptr) return;
    comm_.pool_->release(buf_);
    buf_ = nullptr;
    --comm_.in_flight_;
  }

  StagedCommunicator& comm_;
  CommOp op_;
  int64_t recv_offset_;
  CommStats before_;  // the inner communicator's counters before the call
  StagingPool::Buffer* buf_ = nullptr;
  std::vector<Owed> owed_;
};

// A started inner call and the staged call around it; wait() completes both.
class StagedCommunicator::CallWork final : public Work {
 public:
  CallWork(std::unique_ptr<Call> call, std::unique_ptr<Work> inner)
      : call_(std::move(call)), inner_(std::move(inner)) {}
  // Destructors must not throw (std::terminate would skip the job's error path): a failed wait
  // here is reported and the error that unwinds goes on.
  ~CallWork() override {
    try {
      wait();
    } catch (const std::exception& e) {
      std::fprintf(stderr, "[rank %d] a pending staged call failed during teardown: %s\n",
                   log_rank(), e.what());
    }
  }
  void wait() override {
    if (call_ == nullptr) return;
    inner_->wait();
    call_->finish();
    call_.reset();
  }

 private:
  std::unique_ptr<Call> call_;
  std::unique_ptr<Work> inner_;
};

StagedCommunicator::StagedCommunicator(Communicator& inner, DeviceCopier& copier)
    : inner_(inner), pool_(std::make_shared<StagingPool>(copier)) {}

StagedCommunicator::StagedCommunicator(std::unique_ptr<Communicator> inner,
                                       std::shared_ptr<StagingPool> pool)
    : owned_(std::move(inner)), inner_(*owned_), pool_(std::move(pool)) {}

StagedCommunicator::~StagedCommunicator() {
  UPIPE_CHECK(in_flight_ == 0,
              "staged communicator destroyed with {} calls in flight; wait for every Work first",
              in_flight_);
}

void StagedCommunicator::all_to_all(const void* send, void* recv, int64_t bytes_per_rank) {
  const int64_t total = bytes_per_rank * size();
  Call c(*this, CommOp::kAllToAll, total, total);
  c.take(c.send(), send, total);
  c.inputs_ready();
  inner_.all_to_all(c.send(), c.recv(), bytes_per_rank);
  c.count();
  c.give_back(recv, c.recv(), total);
  c.finish();
}

void StagedCommunicator::all_to_allv(const void* send, const int64_t* send_bytes,
                                     const int64_t* send_displs, void* recv,
                                     const int64_t* recv_bytes, const int64_t* recv_displs) {
  const int n = size();
  Call c(*this, CommOp::kAllToAllV, extent(send_bytes, send_displs, n),
         extent(recv_bytes, recv_displs, n));
  // Block by block: the gaps between receive blocks are the caller's and must stay untouched.
  // An empty block is skipped: its staging (and the caller's) pointer may be null.
  for (int i = 0; i < n; ++i)
    if (send_bytes[i] > 0)
      c.take(c.send() + send_displs[i], static_cast<const uint8_t*>(send) + send_displs[i],
             send_bytes[i]);
  c.inputs_ready();
  inner_.all_to_allv(c.send(), send_bytes, send_displs, c.recv(), recv_bytes, recv_displs);
  c.count();
  for (int i = 0; i < n; ++i)
    if (recv_bytes[i] > 0)
      c.give_back(static_cast<uint8_t*>(recv) + recv_displs[i], c.recv() + recv_displs[i],
                  recv_bytes[i]);
  c.finish();
}

void StagedCommunicator::all_gather(const void* send, void* recv, int64_t bytes_per_rank) {
  const int64_t total = bytes_per_rank * size();
  Call c(*this, CommOp::kAllGather, bytes_per_rank, total);
  c.take(c.send(), send, bytes_per_rank);
  c.inputs_ready();
  inner_.all_gather(c.send(), c.recv(), bytes_per_rank);
  c.count();
  c.give_back(recv, c.recv(), total);
  c.finish();
}

void StagedCommunicator::reduce_scatter(const void* send, void* recv, int64_t count, DType t,
                                        ReduceOp op) {
  const int64_t block = count * dtype_size(t);
  Call c(*this, CommOp::kReduceScatter, block * size(), block);
  c.take(c.send(), send, block * size());
  c.inputs_ready();
  inner_.reduce_scatter(c.send(), c.recv(), count, t, op);
  c.count();
  c.give_back(recv, c.recv(), block);
  c.finish();
}

void StagedCommunicator::all_reduce(void* buf, int64_t count, DType t, ReduceOp op) {
  const int64_t bytes = count * dtype_size(t);
  Call c(*this, CommOp::kAllReduce, bytes, 0);
  c.take(c.send(), buf, bytes);
  c.inputs_ready();
  inner_.all_reduce(c.send(), count, t, op);
  c.count();
  c.give_back(buf, c.send(), bytes);
  c.finish();
}

void StagedCommunicator::broadcast(void* buf, int64_t bytes, int root) {
  Call c(*this, CommOp::kBroadcast, bytes, 0);
  if (rank() == root) c.take(c.send(), buf, bytes);
  c.inputs_ready();
  inner_.broadcast(c.send(), bytes, root);
  c.count();
  if (rank() != root) c.give_back(buf, c.send(), bytes);
  c.finish();
}

void StagedCommunicator::sendrecv(const void* send, int64_t send_bytes, int dst, void* recv,
                                  int64_t recv_bytes, int src) {
  Call c(*this, CommOp::kSendRecv, send_bytes, recv_bytes);
  c.take(c.send(), send, send_bytes);
  c.inputs_ready();
  inner_.sendrecv(c.send(), send_bytes, dst, c.recv(), recv_bytes, src);
  c.count();
  c.give_back(recv, c.recv(), recv_bytes);
  c.finish();
}

void StagedCommunicator::barrier() {
  Call c(*this, CommOp::kBarrier, 0, 0);
  inner_.barrier();
  c.count();
}

std::unique_ptr<Work> StagedCommunicator::iall_to_all(const void* send, void* recv,
                                                      int64_t bytes_per_rank) {
  const int64_t total = bytes_per_rank * size();
  auto c = std::make_unique<Call>(*this, CommOp::kAllToAll, total, total);
  c->take(c->send(), send, total);
  c->inputs_ready();
  auto w = inner_.iall_to_all(c->send(), c->recv(), bytes_per_rank);
  c->count();
  c->give_back(recv, c->recv(), total);
  return std::make_unique<CallWork>(std::move(c), std::move(w));
}

std::unique_ptr<Work> StagedCommunicator::iall_gather(const void* send, void* recv,
                                                      int64_t bytes_per_rank) {
  const int64_t total = bytes_per_rank * size();
  auto c = std::make_unique<Call>(*this, CommOp::kAllGather, bytes_per_rank, total);
  c->take(c->send(), send, bytes_per_rank);
  c->inputs_ready();
  auto w = inner_.iall_gather(c->send(), c->recv(), bytes_per_rank);
  c->count();
  c->give_back(recv, c->recv(), total);
  return std::make_unique<CallWork>(std::move(c), std::move(w));
}

std::unique_ptr<Work> StagedCommunicator::ireduce_scatter(const void* send, void* recv,
                                                          int64_t count, DType t, ReduceOp op) {
  const int64_t block = count * dtype_size(t);
  auto c = std::make_unique<Call>(*this, CommOp::kReduceScatter, block * size(), block);
  c->take(c->send(), send, block * size());
  c->inputs_ready();
  auto w = inner_.ireduce_scatter(c->send(), c->recv(), count, t, op);
  c->count();
  c->give_back(recv, c->recv(), block);
  return std::make_unique<CallWork>(std::move(c), std::move(w));
}

std::unique_ptr<Work> StagedCommunicator::iall_reduce(void* buf, int64_t count, DType t,
                                                      ReduceOp op) {
  const int64_t bytes = count * dtype_size(t);
  auto c = std::make_unique<Call>(*this, CommOp::kAllReduce, bytes, 0);
  c->take(c->send(), buf, bytes);
  c->inputs_ready();
  auto w = inner_.iall_reduce(c->send(), count, t, op);
  c->count();
  c->give_back(buf, c->send(), bytes);
  return std::make_unique<CallWork>(std::move(c), std::move(w));
}

std::unique_ptr<Work> StagedCommunicator::isendrecv(const void* send, int64_t send_bytes, int dst,
                                                    void* recv, int64_t recv_bytes, int src) {
  auto c = std::make_unique<Call>(*this, CommOp::kSendRecv, send_bytes, recv_bytes);
  c->take(c->send(), send, send_bytes);
  c->inputs_ready();
  auto w = inner_.isendrecv(c->send(), send_bytes, dst, c->recv(), recv_bytes, src);
  c->count();
  c->give_back(recv, c->recv(), recv_bytes);
  return std::make_unique<CallWork>(std::move(c), std::move(w));
}

std::unique_ptr<Communicator> StagedCommunicator::split(const SplitRule& rule) {
  std::unique_ptr<StagedCommunicator> c(new StagedCommunicator(inner_.split(rule), pool_));
  c->parent_ = this;
  return c;
}

}  // namespace upipe
