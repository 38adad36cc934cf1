// The communicator interface every strategy talks through (c10d / nccl-tests style): the
// collectives attention needs, point-to-point with a wait-able handle, and split into
// sub-groups. Backends: mpi/ (OpenMPI, real processes), fake/ (meta device: moves no data,
// counts the same calls and bytes), later nccl/. Every backend counts its calls and the bytes
// this rank sends to other ranks, so tests can check the communication volume of a schedule.
// A group made by split() counts its traffic toward its parent too, so the CP group's totals
// include what a strategy sends over its sub-groups (USP's Ulysses groups and ring).
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <string>

#include "core/dtype.h"

namespace upipe {

enum class ReduceOp { kSum, kMax };

enum class CommOp : uint8_t {
  kAllToAll,
  kAllToAllV,
  kAllGather,
  kReduceScatter,
  kAllReduce,
  kBroadcast,
  kSendRecv,
  kBarrier,
  kCount
};
constexpr int kNumCommOps = static_cast<int>(CommOp::kCount);
const char* comm_op_name(CommOp op);

struct CommStats {
  std::array<int64_t, kNumCommOps> calls{};
  std::array<int64_t, kNumCommOps> bytes_sent{};  // bytes this rank sends to other ranks
  void add(CommOp op, int64_t bytes) {
    calls[static_cast<int>(op)] += 1;
    bytes_sent[static_cast<int>(op)] += bytes;
  }
  int64_t calls_of(CommOp op) const { return calls[static_cast<int>(op)]; }
  int64_t bytes_of(CommOp op) const { return bytes_sent[static_cast<int>(op)]; }
  int64_t total_bytes() const;
  int64_t total_calls() const;
};

// A pending point-to-point transfer. wait() blocks until it is complete; destroying an
// unfinished Work waits for it.
class Work {
 public:
  virtual ~Work() = default;
  virtual void wait() = 0;
};

class Communicator {
 public:
  virtual ~Communicator() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  virtual std::string backend() const = 0;

  // Block i of `send` (bytes_per_rank bytes) goes to rank i; block j of `recv` comes from j.
  virtual void all_to_all(const void* send, void* recv, int64_t bytes_per_rank) = 0;
  // Variable sizes, all in bytes, one entry per rank.
  virtual void all_to_allv(const void* send, const int64_t* send_bytes, const int64_t* send_displs,
                           void* recv, const int64_t* recv_bytes, const int64_t* recv_displs) = 0;
  // recv holds size() blocks of bytes_per_rank, block i from rank i.
  virtual void all_gather(const void* send, void* recv, int64_t bytes_per_rank) = 0;
  // send holds size() blocks of count elements; this rank receives the reduction of block rank().
  virtual void reduce_scatter(const void* send, void* recv, int64_t count, DType t,
                              ReduceOp op) = 0;
  virtual void all_reduce(void* buf, int64_t count, DType t, ReduceOp op) = 0;
  virtual void broadcast(void* buf, int64_t bytes, int root) = 0;
  // Send to dst and receive from src at once (either may be this rank's own index only when
  // both are).
  virtual void sendrecv(const void* send, int64_t send_bytes, int dst, void* recv,
                        int64_t recv_bytes, int src) = 0;
  // Non-blocking sendrecv; the buffers must stay untouched until wait().
  virtual std::unique_ptr<Work> isendrecv(const void* send, int64_t send_bytes, int dst, void* recv,
                                          int64_t recv_bytes, int src) = 0;
  virtual void barrier() = 0;
  // Ranks with the same color form a new group, ordered by key (ties by rank). group_size is
  // the number of ranks sharing this color: the fake backend cannot learn it from the other
  // ranks, and the real ones check it. The parent must outlive the group.
  virtual std::unique_ptr<Communicator> split(int color, int key, int group_size) = 0;

  const CommStats& stats() const { return stats_; }
  void reset_stats() { stats_ = CommStats{}; }

 protected:
  // Records one call in this communicator's counters and in those of every ancestor.
  void record(CommOp op, int64_t bytes) {
    stats_.add(op, bytes);
    if (parent_ != nullptr) parent_->record(op, bytes);
  }
  CommStats stats_;
  Communicator* parent_ = nullptr;  // the communicator split() made this group from
};

}  // namespace upipe
