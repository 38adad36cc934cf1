// The MPI backend (OpenMPI): one rank per process. MpiRuntime initialises MPI, installs the
// fatal handler (MPI_Abort, so a failure on one rank ends the job instead of hanging the
// others) and hands out the world communicator. Every MPI return code is checked. Blocking
// collectives call MPI's blocking forms; the i* forms call MPI_I* and return a Work that owns
// the request(s) and any large-message datatype until they complete. MPI counts are ints: byte
// transfers past them go in a larger unit datatype; reductions and all-gathers past them in
// pieces, one blocking call each (a reduce-scatter as one reduce per rank's block and piece),
// also from the non-blocking forms, which then return done. Every call and every
// Work::wait runs inside a WatchdogOp naming its collective (core/watchdog.h), so a started
// watchdog ends the job when one of them makes no progress.
#pragma once

#include <mpi.h>

#include <memory>
#include <string>

#include "comm/communicator.h"

namespace upipe {

class MpiRuntime {
 public:
  MpiRuntime(int* argc, char*** argv);
  ~MpiRuntime();
  MpiRuntime(const MpiRuntime&) = delete;
  MpiRuntime& operator=(const MpiRuntime&) = delete;
  std::unique_ptr<Communicator> world();
  // Ends every rank of the job with exit_code (MPI_Abort, after leaving a launcher guard:
  // core/launcher.h). Never returns.
  [[noreturn]] static void abort_job(int exit_code);
  // Called by a rank that caught an error (`cause`, printed as `line`), on any rank at any point:
  // ends the job within seconds (docs/training.md, "What ends a job"). It tells the other ranks
  // and waits up to kFailAgreeSeconds for all of them to fail too. If they do (an error every rank
  // detects alike, e.g. bad input checked before any communication), the lowest rank of each
  // distinct cause prints its line and the status to exit with (the largest of the ranks') is
  // returned, so the job ends cleanly. Otherwise the other ranks are waiting in a collective for
  // this one: it prints its line (unless a lower rank reported the same cause and prints it) and
  // ends the whole job with MPI_Abort(exit_code); it never returns.
  static int fail_job(int exit_code, const std::string& cause, const std::string& line);
  // The first line of MPI_Get_library_version ("Open MPI v4.1.4, package: ...").
  static std::string library_version();
};

inline constexpr double kFailAgreeSeconds = 2.0;

// Tests only: the most one MPI call's count may be (2^31 - 1 by default, the most an int holds).
// Reductions of more elements run in pieces of at most that many; an all-gather of more units
// (bytes, or a larger unit where one divides them) in pieces of at most that many bytes; any
// other call past it fails its check.
void set_mpi_piece_limit_for_testing(int64_t max_count);

class MpiCommunicator final : public Communicator {
 public:
  explicit MpiCommunicator(MPI_Comm comm, bool owned);
  ~MpiCommunicator() override;
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  std::string backend() const override { return "mpi"; }
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
  MPI_Comm handle() const { return comm_; }

 private:
  MPI_Comm comm_;
  bool owned_;
  int rank_ = 0, size_ = 1;
};

}  // namespace upipe
