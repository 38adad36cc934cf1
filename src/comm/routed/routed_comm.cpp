#include "comm/routed/routed_comm.h"

#include <type_traits>
#include <utility>

#include "core/check.h"

namespace upipe {

RoutedCommunicator::RoutedCommunicator(Communicator& device, Communicator& host,
                                       IsDeviceMemory is_device)
    : device_(device), host_(host), is_device_(std::move(is_device)) {
  UPIPE_CHECK(device_.rank() == host_.rank() && device_.size() == host_.size(),
              "routed communicator: device {} is rank {} of {}, host {} rank {} of {}",
              device_.backend(), device_.rank(), device_.size(), host_.backend(), host_.rank(),
              host_.size());
}

RoutedCommunicator::RoutedCommunicator(std::unique_ptr<Communicator> device,
                                       std::unique_ptr<Communicator> host, IsDeviceMemory is_device)
    : RoutedCommunicator(*device, *host, std::move(is_device)) {
  owned_device_ = std::move(device);
  owned_host_ = std::move(host);
}

Communicator& RoutedCommunicator::pick(std::initializer_list<const void*> buffers) {
  bool device = true;
  for (const void* b : buffers)
    if (b != nullptr && !is_device_(b)) device = false;
  ++(device ? device_calls_ : host_calls_);
  return device ? device_ : host_;
}

// A non-blocking call records when it starts, as the inner ones do.
template <class F>
auto RoutedCommunicator::routed(CommOp op, std::initializer_list<const void*> buffers, F&& f) {
  Communicator& c = pick(buffers);
  const CommStats before = c.stats();
  if constexpr (std::is_void_v<std::invoke_result_t<F&, Communicator&>>) {
    f(c);
    record_as(c, op, before);
  } else {
    auto work = f(c);
    record_as(c, op, before);
    return work;
  }
}

void RoutedCommunicator::all_to_all(const void* send, void* recv, int64_t bytes_per_rank) {
  routed(CommOp::kAllToAll, {send, recv},
         [&](Communicator& c) { c.all_to_all(send, recv, bytes_per_rank); });
}

void RoutedCommunicator::all_to_allv(const void* send, const int64_t* send_bytes,
                                     const int64_t* send_displs, void* recv,
                                     const int64_t* recv_bytes, const int64_t* recv_displs) {
  routed(CommOp::kAllToAllV, {send, recv}, [&](Communicator& c) {
    c.all_to_allv(send, send_bytes, send_displs, recv, recv_bytes, recv_displs);
  });
}

void RoutedCommunicator::all_gather(const void* send, void* recv, int64_t bytes_per_rank) {
  routed(CommOp::kAllGather, {send, recv},
         [&](Communicator& c) { c.all_gather(send, recv, bytes_per_rank); });
}

void RoutedCommunicator::reduce_scatter(const void* send, void* recv, int64_t count, DType t,
                                        ReduceOp op) {
  routed(CommOp::kReduceScatter, {send, recv},
         [&](Communicator& c) { c.reduce_scatter(send, recv, count, t, op); });
}

void RoutedCommunicator::all_reduce(void* buf, int64_t count, DType t, ReduceOp op) {
  routed(CommOp::kAllReduce, {buf}, [&](Communicator& c) { c.all_reduce(buf, count, t, op); });
}

void RoutedCommunicator::broadcast(void* buf, int64_t bytes, int root) {
  routed(CommOp::kBroadcast, {buf}, [&](Communicator& c) { c.broadcast(buf, bytes, root); });
}

void RoutedCommunicator::sendrecv(const void* send, int64_t send_bytes, int dst, void* recv,
                                  int64_t recv_bytes, int src) {
  routed(CommOp::kSendRecv, {send, recv},
         [&](Communicator& c) { c.sendrecv(send, send_bytes, dst, recv, recv_bytes, src); });
}

void RoutedCommunicator::barrier() {
  ++host_calls_;
  const CommStats before = host_.stats();
  host_.barrier();
  record_as(host_, CommOp::kBarrier, before);
}

std::unique_ptr<Work> RoutedCommunicator::iall_to_all(const void* send, void* recv,
                                                      int64_t bytes_per_rank) {
  return routed(CommOp::kAllToAll, {send, recv},
                [&](Communicator& c) { return c.iall_to_all(send, recv, bytes_per_rank); });
}

std::unique_ptr<Work> RoutedCommunicator::iall_gather(const void* send, void* recv,
                                                      int64_t bytes_per_rank) {
  return routed(CommOp::kAllGather, {send, recv},
                [&](Communicator& c) { return c.iall_gather(send, recv, bytes_per_rank); });
}

std::unique_ptr<Work> RoutedCommunicator::ireduce_scatter(const void* send, void* recv,
                                                          int64_t count, DType t, ReduceOp op) {
  return routed(CommOp::kReduceScatter, {send, recv},
                [&](Communicator& c) { return c.ireduce_scatter(send, recv, count, t, op); });
}

std::unique_ptr<Work> RoutedCommunicator::iall_reduce(void* buf, int64_t count, DType t,
                                                      ReduceOp op) {
  return routed(CommOp::kAllReduce, {buf},
                [&](Communicator& c) { return c.iall_reduce(buf, count, t, op); });
}

std::unique_ptr<Work> RoutedCommunicator::isendrecv(const void* send, int64_t send_bytes, int dst,
                                                    void* recv, int64_t recv_bytes, int src) {
  return routed(CommOp::kSendRecv, {send, recv}, [&](Communicator& c) {
    return c.isendrecv(send, send_bytes, dst, recv, recv_bytes, src);
  });
}

std::unique_ptr<Communicator> RoutedCommunicator::split(const SplitRule& rule) {
  auto device = device_.split(rule);
  auto host = host_.split(rule);
  std::unique_ptr<RoutedCommunicator> c(
      new RoutedCommunicator(std::move(device), std::move(host), is_device_));
  c->parent_ = this;
  return c;
}

}  // namespace upipe
