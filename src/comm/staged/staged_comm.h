// The communicator for ranks that share one GPU (NCCL refuses two ranks on one device): buffers
// passed to it are device buffers; every call copies its inputs to host staging memory, runs the
// same call of an inner host communicator (MPI) there, and copies the results back. The copies go
// through DeviceCopier, an interface defined here, so comm stays free of the backends (core <-
// comm, backend): the CUDA copier lives in comm/nccl/cuda_copier.h, HostCopier (memcpy) serves
// tests and the CPU.
//
// Stats are the inner communicator's: each call records exactly the calls and bytes the inner
// call recorded, so a staged run counts what an MPI run of the same schedule counts.
// Non-blocking forms complete eagerly on the host side: they copy the inputs, start the inner
// non-blocking call and return; the Work's wait() finishes the inner call and copies the results
// back, so the device result buffers hold the result only after wait().
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "comm/communicator.h"

namespace upipe {

// Moves bytes between device memory (the buffers callers pass in) and host staging memory.
// to_host / to_device may return before the copy is done; sync() returns once every copy issued
// so far has completed. A copier must order its copies after the device work that produced the
// data (the CUDA copier issues them on the compute stream).
class DeviceCopier {
 public:
  virtual ~DeviceCopier() = default;
  virtual void to_host(void* host, const void* dev, int64_t bytes) = 0;
  virtual void to_device(void* dev, const void* host, int64_t bytes) = 0;
  virtual void sync() = 0;
  // Staging memory (the CUDA copier pins it, which device copies need to run at full bandwidth
  // and asynchronously). Never called with bytes == 0.
  virtual void* alloc_host(int64_t bytes);
  virtual void free_host(void* p, int64_t bytes);
};

// "Device" memory is host memory: for tests, and for running the staged path on the CPU.
class HostCopier final : public DeviceCopier {
 public:
  void to_host(void* host, const void* dev, int64_t bytes) override;
  void to_device(void* dev, const void* host, int64_t bytes) override;
  void sync() override {}
};

// The host staging memory of a staged communicator and of every group split from it: one buffer
// per call in flight (a blocking call holds one while it runs, a non-blocking one until its
// wait()), each grown to the largest call it has served and then kept, so a training loop that
// repeats its calls allocates nothing after the first step. After a step of blocking calls it
// holds one buffer of the largest call's send + receive bytes; k non-blocking calls in flight at
// once hold k. It is outside the arenas on purpose: arenas account a step's tensors identically
// on the meta device and on real ranks (the planner's contract), while staging exists only on
// this real-rank path; it is host memory, not part of the device budget; and its size is the
// largest message, whose device buffers the arenas already count.
class StagingPool {
 public:
  explicit StagingPool(DeviceCopier& copier) : copier_(copier) {}
  ~StagingPool();
  StagingPool(const StagingPool&) = delete;
  StagingPool& operator=(const StagingPool&) = delete;

  struct Buffer {
    uint8_t* data = nullptr;  // [capacity] host bytes
    int64_t capacity = 0;
    bool busy = false;
  };
  // A free buffer of at least `bytes`, marked busy until release(); prefers one already large
  // enough, else grows the largest free one (or adds one when all are busy).
  Buffer* acquire(int64_t bytes);
  void release(Buffer* b) { b->busy = false; }

  DeviceCopier& copier() { return copier_; }
  int64_t bytes_held() const;
  int buffers() const { return int(buffers_.size()); }
  int busy() const;

 private:
  DeviceCopier& copier_;
  std::vector<std::unique_ptr<Buffer>> buffers_;  // unique_ptr: a busy Buffer never moves
};

class StagedCommunicator final : public Communicator {
 public:
  // Wraps `inner`, which must outlive this communicator; so must `copier`.
  StagedCommunicator(Communicator& inner, DeviceCopier& copier);
  // Every Work must be finished or destroyed before its communicator is.
  ~StagedCommunicator() override;

  int rank() const override { return inner_.rank(); }
  int size() const override { return inner_.size(); }
  std::string backend() const override { return "staged(" + inner_.backend() + ")"; }
  void all_to_all(const void* send, void* recv, int64_t bytes_per_rank) override;
  void all_to_allv(const void* send, const int64_t* send_bytes, const int64_t* send_displs,
                   void* recv, const int64_t* recv_bytes, const int64_t* recv_displs) override;
  void all_gather(const void* send, void* recv, int64_t bytes_per_rank) override;
  void reduce_scatter(const void* send, void* recv, int64_t count, DType t, ReduceOp op) override;
  void all_reduce(void* buf, int64_t count, DType t, ReduceOp op) override;
  void broadcast(void* buf, int64_t bytes, int root) override;
  void sendrecv(const void* send, int64_t send_bytes, int dst, void* recv, int64_t recv_bytes,
                int src) override;
  void barrier() override;
  std::unique_ptr<Work> iall_to_all(const void* send, void* recv, int64_t bytes_per_rank) override;
  std::unique_ptr<Work> iall_gather(const void* send, void* recv, int64_t bytes_per_rank) override;
  std::unique_ptr<Work> ireduce_scatter(const void* send, void* recv, int64_t count, DType t,
                                        ReduceOp op) override;
  std::unique_ptr<Work> iall_reduce(void* buf, int64_t count, DType t, ReduceOp op) override;
  std::unique_ptr<Work> isendrecv(const void* send, int64_t send_bytes, int dst, void* recv,
                                  int64_t recv_bytes, int src) override;
  // The group wraps inner().split(rule) and shares this communicator's copier and staging pool.
  std::unique_ptr<Communicator> split(const SplitRule& rule) override;

  Communicator& inner() { return inner_; }
  const StagingPool& staging() const { return *pool_; }

 private:
  StagedCommunicator(std::unique_ptr<Communicator> inner, std::shared_ptr<StagingPool> pool);
  class Call;
  class CallWork;

  std::unique_ptr<Communicator> owned_;  // the inner group, for a communicator made by split()
  Communicator& inner_;
  std::shared_ptr<StagingPool> pool_;
  int in_flight_ = 0;  // this communicator's calls holding a staging buffer
};

}  // namespace upipe
