// One communicator over two: each call goes to `device` (NCCL) when every buffer it is given is
// device memory, else to `host` (the staged communicator over MPI, which takes host and device
// memory alike). On GPUs with a rank each, the decoder and the trainer talk through it: their
// tensors' collectives (the all-to-alls of attention, ZeRO-3's all-gathers and reduce-scatters,
// the gradients' all-reduce) run on NCCL, their host values (a loss, a norm, a flag) on MPI,
// through one Communicator. Which memory a pointer is in is the caller's `is_device` (on CUDA:
// cudaPointerGetAttributes, comm/nccl/nccl_comm.h's is_device_pointer), asked once per buffer and
// call; every rank runs the same code on the same kinds of memory, so every rank routes a
// collective alike. Null pointers (a zero-byte side) have no say; a call with none left goes to
// `device`.
//
// Stats are the inner ones': a call records exactly what the communicator it went to recorded,
// so a routed run counts what an MPI run of the same schedule counts; device_calls() and
// host_calls() say where the calls went.
#pragma once

#include <cstdint>
#include <functional>
#include <initializer_list>
#include <memory>
#include <string>

#include "comm/communicator.h"

namespace upipe {

using IsDeviceMemory = std::function<bool(const void*)>;

class RoutedCommunicator final : public Communicator {
 public:
  // Both must outlive this communicator and span the same ranks in the same order.
  RoutedCommunicator(Communicator& device, Communicator& host, IsDeviceMemory is_device);

  int rank() const override { return host_.rank(); }
  int size() const override { return host_.size(); }
  std::string backend() const override {
    return "routed(" + device_.backend() + ", " + host_.backend() + ")";
  }
  void all_to_all(const void* send, void* recv, int64_t bytes_per_rank) override;
  void all_to_allv(const void* send, const int64_t* send_bytes, const int64_t* send_displs,
                   void* recv, const int64_t* recv_bytes, const int64_t* recv_displs) override;
  void all_gather(const void* send, void* recv, int64_t bytes_per_rank) override;
  void reduce_scatter(const void* send, void* recv, int64_t count, DType t, ReduceOp op) override;
  void all_reduce(void* buf, int64_t count, DType t, ReduceOp op) override;
  void broadcast(void* buf, int64_t bytes, int root) override;
  void sendrecv(const void* send, int64_t send_bytes, int dst, void* recv, int64_t recv_bytes,
                int src) override;
  // On host: it carries no data, and MPI's barrier needs no device.
  void barrier() override;
  std::unique_ptr<Work> iall_to_all(const void* send, void* recv, int64_t bytes_per_rank) override;
  std::unique_ptr<Work> iall_gather(const void* send, void* recv, int64_t bytes_per_rank) override;
  std::unique_ptr<Work> ireduce_scatter(const void* send, void* recv, int64_t count, DType t,
                                        ReduceOp op) override;
  std::unique_ptr<Work> iall_reduce(void* buf, int64_t count, DType t, ReduceOp op) override;
  std::unique_ptr<Work> isendrecv(const void* send, int64_t send_bytes, int dst, void* recv,
                                  int64_t recv_bytes, int src) override;
  // The group routes between device().split(rule) and host().split(rule).
  std::unique_ptr<Communicator> split(const SplitRule& rule) override;

  Communicator& device() { return device_; }
  Communicator& host() { return host_; }
  int64_t device_calls() const { return device_calls_; }
  int64_t host_calls() const { return host_calls_; }

 private:
  RoutedCommunicator(std::unique_ptr<Communicator> device, std::unique_ptr<Communicator> host,
                     IsDeviceMemory is_device);
  // The communicator for a call on these buffers (a null one has no say), counted.
  Communicator& pick(std::initializer_list<const void*> buffers);
  // Runs f(inner) on the picked communicator and records what it recorded for op.
  template <class F>
  auto routed(CommOp op, std::initializer_list<const void*> buffers, F&& f);

  std::unique_ptr<Communicator> owned_device_, owned_host_;  // a split's groups
  Communicator& device_;
  Communicator& host_;
  IsDeviceMemory is_device_;
  int64_t device_calls_ = 0, host_calls_ = 0;
};

}  // namespace upipe
