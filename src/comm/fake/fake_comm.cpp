#include "comm/fake/fake_comm.h"

#include "core/check.h"

namespace upipe {
namespace {
class DoneWork final : public Work {
 public:
  void wait() override {}
};
}  // namespace

FakeCommunicator::FakeCommunicator(int rank, int size) : rank_(rank), size_(size) {
  UPIPE_CHECK(size >= 1 && rank >= 0 && rank < size, "rank {} of {}", rank, size);
}

void FakeCommunicator::all_to_all(const void*, void*, int64_t bytes_per_rank) {
  record(CommOp::kAllToAll, bytes_per_rank * (size_ - 1));
}

void FakeCommunicator::all_to_allv(const void*, const int64_t* send_bytes, const int64_t*, void*,
                                   const int64_t*, const int64_t*) {
  int64_t b = 0;
  for (int i = 0; i < size_; ++i)
    if (i != rank_) b += send_bytes[i];
  record(CommOp::kAllToAllV, b);
}

void FakeCommunicator::all_gather(const void*, void*, int64_t bytes_per_rank) {
  record(CommOp::kAllGather, bytes_per_rank * (size_ - 1));
}

void FakeCommunicator::reduce_scatter(const void*, void*, int64_t count, DType t, ReduceOp) {
  record(CommOp::kReduceScatter, count * dtype_size(t) * (size_ - 1));
}

void FakeCommunicator::all_reduce(void*, int64_t count, DType t, ReduceOp) {
  // Counted as a reduce-scatter plus an all-gather (the bandwidth-optimal ring algorithm):
  // 2 (C-1)/C of the buffer leaves each rank.
  const int64_t bytes = count * dtype_size(t);
  record(CommOp::kAllReduce, size_ > 1 ? 2 * bytes * (size_ - 1) / size_ : 0);
}

void FakeCommunicator::broadcast(void*, int64_t bytes, int root) {
  record(CommOp::kBroadcast, rank_ == root ? bytes * (size_ - 1) : 0);
}

void FakeCommunicator::sendrecv(const void*, int64_t send_bytes, int dst, void*, int64_t, int) {
  record(CommOp::kSendRecv, dst == rank_ ? 0 : send_bytes);
}

void FakeCommunicator::barrier() {
  record(CommOp::kBarrier, 0);
}

std::unique_ptr<Work> FakeCommunicator::iall_to_all(const void* send, void* recv,
                                                    int64_t bytes_per_rank) {
  all_to_all(send, recv, bytes_per_rank);
  return std::make_unique<DoneWork>();
}

std::unique_ptr<Work> FakeCommunicator::iall_gather(const void* send, void* recv,
                                                    int64_t bytes_per_rank) {
  all_gather(send, recv, bytes_per_rank);
  return std::make_unique<DoneWork>();
}

std::unique_ptr<Work> FakeCommunicator::ireduce_scatter(const void* send, void* recv, int64_t count,
                                                        DType t, ReduceOp op) {
  reduce_scatter(send, recv, count, t, op);
  return std::make_unique<DoneWork>();
}

std::unique_ptr<Work> FakeCommunicator::iall_reduce(void* buf, int64_t count, DType t,
                                                    ReduceOp op) {
  all_reduce(buf, count, t, op);
  return std::make_unique<DoneWork>();
}

std::unique_ptr<Work> FakeCommunicator::isendrecv(const void* send, int64_t send_bytes, int dst,
                                                  void* recv, int64_t recv_bytes, int src) {
  sendrecv(send, send_bytes, dst, recv, recv_bytes, src);
  return std::make_unique<DoneWork>();
}

std::unique_ptr<Communicator> FakeCommunicator::split(const SplitRule& rule) {
  const SplitPlace p = split_place(rule, rank_, size_);
  auto c = std::make_unique<FakeCommunicator>(p.rank, p.size);
  c->parent_ = this;
  return c;
}

}  // namespace upipe
