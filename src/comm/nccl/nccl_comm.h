// The NCCL backend: one rank per GPU, every buffer a device buffer. The MPI communicator
// bootstraps it (rank 0's ncclUniqueId goes to every rank by MPI broadcast) and is not used
// after. Every call runs on the communicator's own stream, created on its device, after the work
// issued so far on the compute stream (an event, so the host does not wait for it): blocking
// calls then synchronize their stream, so their result is complete when they return, exactly as
// MPI's are; non-blocking calls return an NcclWork (an event recorded after the call). Calls,
// bytes and splits count by mpi_comm's rules. Ranks sharing one GPU cannot use NCCL (it refuses
// two ranks on one device): make_nccl_comm says so and names the staged communicator
// (comm/staged/staged_comm.h) instead.
//
// This header needs no CUDA include: streams and events are the CUDA runtime's own opaque types
// (cudaStream_t is CUstream_st*, cudaEvent_t is CUevent_st*), declared here.
#pragma once

#include <array>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "comm/communicator.h"

struct CUstream_st;
struct CUevent_st;
struct ncclComm;

namespace upipe {

// "" when this process can run NCCL (a GPU is visible, the NCCL loaded is 2.18 or newer), else
// why not, e.g. "no GPU: cudaGetDeviceCount failed: CUDA driver version is insufficient for CUDA
// runtime version".
std::string nccl_unavailable_reason();
// Whether p is device memory (cudaPointerGetAttributes: cudaMemoryTypeDevice); host memory,
// pinned or not, and managed memory are not (the routed communicator's classifier: NCCL takes
// device buffers only).
bool is_device_pointer(const void* p);
// The version of the NCCL library this process loaded ("2.28.9"), which may differ from the
// headers it was built with.
std::string nccl_library_version();

// The two lowest ranks whose GPU UUIDs (uuids[rank]) are equal, {-1, -1} when all differ.
inline std::pair<int, int> ranks_sharing_gpu(const std::vector<std::array<uint8_t, 16>>& uuids) {
  for (size_t b = 1; b < uuids.size(); ++b)
    for (size_t a = 0; a < b; ++a)
      if (uuids[a] == uuids[b]) return {int(a), int(b)};
  return {-1, -1};
}

// Collective over mpi_world, each rank passing the device it would use: the two lowest ranks that
// would drive the same GPU, {-1, -1} when every rank has its own (so NCCL can run).
std::pair<int, int> ranks_sharing_gpu(Communicator& mpi_world, int device);

class NcclCommunicator;

// A non-blocking NCCL call: an event recorded on the communicator's stream after the call.
// wait() blocks the host until it completes (polling NCCL's asynchronous error meanwhile, see
// NcclCommunicator::await). A compute stream that consumes the result should
// call wait_on(stream) instead: the stream waits on the device and the host goes on. After
// wait_on the completion belongs to that stream, so destroying the Work does not block (a later
// wait() still does).
class NcclWork final : public Work {
 public:
  NcclWork(CommOp op, NcclCommunicator& comm);
  ~NcclWork() override;
  NcclWork(const NcclWork&) = delete;
  NcclWork& operator=(const NcclWork&) = delete;
  void wait() override;
  void wait_on(CUstream_st* stream);

 private:
  NcclCommunicator& comm_;
  CUevent_st* event_ = nullptr;
  CommOp op_;                 // names the wait for the watchdog
  bool handed_over_ = false;  // wait() or wait_on() was called
};

class NcclCommunicator final : public Communicator {
 public:
  // Collective over mpi_world; makes `device` current on this thread. Prefer make_nccl_comm,
  // which first refuses, with the reason, where NCCL cannot run.
  NcclCommunicator(Communicator& mpi_world, int device);
  // Every Work must be finished or destroyed first.
  ~NcclCommunicator() override;
  NcclCommunicator(const NcclCommunicator&) = delete;
  NcclCommunicator& operator=(const NcclCommunicator&) = delete;

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  std::string backend() const override { return "nccl"; }
  void all_to_all(const void* send, void* recv, int64_t bytes_per_rank) override;
  void all_to_allv(const void* send, const int64_t* send_bytes, const int64_t* send_displs,
                   void* recv, const int64_t* recv_bytes, const int64_t* recv_displs) override;
  void all_gather(const void* send, void* recv, int64_t bytes_per_rank) override;
  void reduce_scatter(const void* send, void* recv, int64_t count, DType t, ReduceOp op) override;
  void all_reduce(void* buf, int64_t count, DType t, ReduceOp op) override;
  void broadcast(void* buf, int64_t bytes, int root) override;
  void sendrecv(const void* send, int64_t send_bytes, int dst, void* recv, int64_t recv_bytes,
                int src) override;
  // NCCL has none: a one-element all-reduce on the comm stream, then a stream synchronize.
  void barrier() override;
  std::unique_ptr<Work> iall_to_all(const void* send, void* recv, int64_t bytes_per_rank) override;
  std::unique_ptr<Work> iall_gather(const void* send, void* recv, int64_t bytes_per_rank) override;
  std::unique_ptr<Work> ireduce_scatter(const void* send, void* recv, int64_t count, DType t,
                                        ReduceOp op) override;
  std::unique_ptr<Work> iall_reduce(void* buf, int64_t count, DType t, ReduceOp op) override;
  std::unique_ptr<Work> isendrecv(const void* send, int64_t send_bytes, int dst, void* recv,
                                  int64_t recv_bytes, int src) override;
  // ncclCommSplit; the group has its own stream and inherits the compute stream.
  std::unique_ptr<Communicator> split(const SplitRule& rule) override;

  // The stream whose work every call waits for before reading its inputs; nullptr (the default)
  // is the legacy default stream.
  void set_compute_stream(CUstream_st* stream) { compute_ = stream; }
  CUstream_st* stream() const { return stream_; }
  int device() const { return device_; }

  // Blocks the host until `event` (nullptr: the whole comm stream) has completed. Between
  // queries it polls ncclCommGetAsyncError: where a peer failed or vanished, NCCL's kernels would
  // spin until the watchdog ends the job; instead the communicator is aborted (ncclCommAbort ends
  // its kernels) and the wait throws with NCCL's reason. Every later call on an aborted
  // communicator throws.
  void await(CUevent_st* event, CommOp op) { await(event, comm_op_name(op)); }
  // The same, for `what` (the watchdog's and the error's name of the wait).
  void await(CUevent_st* event, const char* what);
  bool aborted() const { return comm_ == nullptr; }

 private:
  NcclCommunicator(ncclComm* comm, int device, CUstream_st* compute);
  void init_streams();
  // Makes the comm stream wait for the compute stream; every call starts with it.
  void after_compute();
  // The blocking forms end with it.
  void sync(CommOp op) { await(nullptr, op); }
  // Throws where an earlier error aborted the communicator; every call starts with it.
  ncclComm* live_comm() const;
  // ncclCommAbort, once: its kernels end and comm_ becomes nullptr.
  void abort_comm();
  std::unique_ptr<Work> started(CommOp op);
  void enqueue_all_to_all(const void* send, void* recv, int64_t bytes_per_rank);
  void enqueue_sendrecv(const void* send, int64_t send_bytes, int dst, void* recv,
                        int64_t recv_bytes, int src);

  ncclComm* comm_ = nullptr;
  int device_ = 0;
  int rank_ = 0, size_ = 1;
  CUstream_st* stream_ = nullptr;   // the comm stream (non-blocking w.r.t. the legacy stream)
  CUstream_st* compute_ = nullptr;  // see set_compute_stream
  CUevent_st* ready_ = nullptr;     // recorded on compute_, waited for by stream_
  // [1] fp32 device scalar: barrier()'s all-reduce operand (4 bytes per communicator, outside
  // the arenas like NCCL's own buffers).
  float* barrier_buf_ = nullptr;
};

// Collective over mpi_world, each rank passing the device it would use: "" when NCCL can run on
// every rank, each on its own GPU; else why not (no GPU or an old NCCL somewhere, a device
// outside the visible ones, two ranks on one GPU), the same decision on every rank.
std::string nccl_world_unusable(Communicator& mpi_world, int device);

// The NCCL world for this rank on `device` (collective over mpi_world). Throws upipe::Error,
// alike on every rank, where NCCL cannot run: no GPU (nccl_unavailable_reason), a device
// outside the visible ones, or two ranks on one GPU (then: use the staged communicator).
std::unique_ptr<Communicator> make_nccl_comm(Communicator& mpi_world, int device);

}  // namespace upipe
