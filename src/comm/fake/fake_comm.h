// The meta-device communicator: plays rank `rank` of a group of `size` without moving data.
// It counts the same calls and bytes as a real backend, so the planner and communication
// tests see the schedule's true volume. Non-blocking calls count and return a finished Work;
// split() places this rank exactly where MPI_Comm_split would.
#pragma once

#include "comm/communicator.h"

namespace upipe {

class FakeCommunicator final : public Communicator {
 public:
  FakeCommunicator(int rank, int size);
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  std::string backend() const override { return "fake"; }
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
  std::unique_ptr<Communicator> split(const SplitRule& rule) override;

 private:
  int rank_, size_;
};

}  // namespace upipe
