// The communicator interface every strategy talks through (c10d / nccl-tests style): the
// collectives attention needs, point-to-point with a wait-able handle, and split into
// sub-groups. Backends: mpi/ (OpenMPI, real processes), fake/ (meta device: moves no data,
// counts the same calls and bytes), nccl/ (one GPU per rank, device buffers; CUDA builds only),
// staged/ (device buffers through host memory over an inner one, for ranks sharing a GPU).
// Every backend counts its calls and the bytes this rank sends to other ranks, so tests can
// check the communication volume of a schedule.
// A group made by split() counts its traffic toward its parent too, so the CP group's totals
// include what a strategy sends over its sub-groups (USP's Ulysses groups and ring).
// Non-blocking forms (i*) count when they are started, exactly as their blocking forms do.
#pragma once

#include <array>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

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

// A pending transfer (point-to-point or collective). wait() blocks until it is complete and
// may be called again; destroying an unfinished Work waits for it.
class Work {
 public:
  virtual ~Work() = default;
  virtual void wait() = 0;
};

// split(): every rank of the parent evaluates the same rule, which gives each parent rank its
// color and key. Ranks with equal color form a group, ordered by key, ties by parent rank
// (MPI_Comm_split's order). Colors and keys must be non-negative.
struct SplitKey {
  int color = 0;
  int key = 0;
};
using SplitRule = std::function<SplitKey(int parent_rank)>;

struct SplitPlace {
  int rank = 0;  // this rank's index in its group
  int size = 0;  // ranks in the group
};
// Where parent rank `rank` of `size` lands under `rule`: the pure function both backends use
// (the MPI backend checks MPI_Comm_split's answer against it).
SplitPlace split_place(const SplitRule& rule, int rank, int size);

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
  virtual void barrier() = 0;

  // Non-blocking forms, same arguments and results as the blocking ones. The buffers must stay
  // untouched until wait(). Every rank starts the same collectives in the same order; several
  // may be in flight at once.
  virtual std::unique_ptr<Work> iall_to_all(const void* send, void* recv,
                                            int64_t bytes_per_rank) = 0;
  virtual std::unique_ptr<Work> iall_gather(const void* send, void* recv,
                                            int64_t bytes_per_rank) = 0;
  virtual std::unique_ptr<Work> ireduce_scatter(const void* send, void* recv, int64_t count,
                                                DType t, ReduceOp op) = 0;
  virtual std::unique_ptr<Work> iall_reduce(void* buf, int64_t count, DType t, ReduceOp op) = 0;
  virtual std::unique_ptr<Work> isendrecv(const void* send, int64_t send_bytes, int dst, void* recv,
                                          int64_t recv_bytes, int src) = 0;

  // The group this rank joins under `rule` (see SplitRule); every rank of this communicator
  // calls split with the same rule. The parent must outlive the group.
  virtual std::unique_ptr<Communicator> split(const SplitRule& rule) = 0;

  const CommStats& stats() const { return stats_; }
  void reset_stats() { stats_ = CommStats{}; }

 protected:
  // Records one call in this communicator's counters and in those of every ancestor.
  void record(CommOp op, int64_t bytes) {
    stats_.add(op, bytes);
    if (parent_ != nullptr) parent_->record(op, bytes);
  }
  // For a communicator that runs each call on an inner one (staged, routed): records the one call
  // of op that `inner` recorded since its counters were `before`, checking that it was one.
  void record_as(const Communicator& inner, CommOp op, const CommStats& before);
  CommStats stats_;
  Communicator* parent_ = nullptr;  // the communicator split() made this group from
};

// Collective: rank 0 runs `check` (a look at a file only it reads or writes); what it throws is
// thrown on every rank with the same text (a ConfigError as one, anything else as an Error), so
// every rank fails alike and the job ends cleanly with one line instead of rank 0 alone failing
// while the others wait for it.
void on_rank0_everywhere(Communicator& world, const std::function<void()>& check);

// Collective: root's `s` on every rank.
std::string broadcast_string(Communicator& world, std::string s, int root);

// Collective: the host name of every rank, indexed by rank (messages that name where a rank runs).
std::vector<std::string> host_names(Communicator& world);

// Collective: every rank runs `check` (a look at what this rank's host sees); the failure of the
// lowest rank that failed is thrown on every rank with its text, as on_rank0_everywhere does.
void on_every_rank_everywhere(Communicator& world, const std::function<void()>& check);

}  // namespace upipe
