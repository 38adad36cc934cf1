#include "comm/mpi/mpi_comm.h"

#include <algorithm>
#include <climits>
#include <numeric>
#include <utility>
#include <vector>

#include "comm/mpi/fail_job.h"
#include "core/check.h"
#include "core/launcher.h"
#include "core/watchdog.h"

namespace upipe {

std::string MpiRuntime::library_version() {
  char text[MPI_MAX_LIBRARY_VERSION_STRING];
  int len = 0;
  if (MPI_Get_library_version(text, &len) != MPI_SUCCESS) return "unknown";
  std::string v(text, size_t(len));
  const size_t eol = v.find_first_of("\r\n");
  return eol == std::string::npos ? v : v.substr(0, eol);
}
namespace {

// The least time MPI_Finalize is given under the watchdog (see ~MpiRuntime).
constexpr double kFinalizeTimeoutS = 60;

void mpi_check(int rc, const char* call, const char* file, int line) {
  if (rc == MPI_SUCCESS) return;
  char err[MPI_MAX_ERROR_STRING];
  int len = 0;
  MPI_Error_string(rc, err, &len);
  fatal(file, line,
        fmt::format("{} failed: {} — check that every rank runs the same configuration and "
                    "that mpirun started all ranks",
                    call, std::string(err, size_t(len))));
}
#define MPI_CHECK(call) mpi_check((call), #call, __FILE__, __LINE__)

void abort_handler(int code) {
  guard_launcher();
  MPI_Abort(MPI_COMM_WORLD, code);
}

// A contiguous datatype of `unit` bytes (MPI_BYTE for 1), freed with its holder unless released
// (to a request that still uses it).
struct ByteUnit {
  int64_t bytes = 1;
  MPI_Datatype type = MPI_BYTE;
  bool owned = false;
  explicit ByteUnit(int64_t unit) : bytes(std::max<int64_t>(unit, 1)) {
    if (unit <= 1) return;
    MPI_CHECK(MPI_Type_contiguous(int(unit), MPI_BYTE, &type));
    MPI_CHECK(MPI_Type_commit(&type));
    owned = true;
  }
  ByteUnit(const ByteUnit&) = delete;
  ByteUnit& operator=(const ByteUnit&) = delete;
  ~ByteUnit() {
    if (owned) MPI_CHECK(MPI_Type_free(&type));
  }
  // Hands the datatype's ownership to the caller (MPI_DATATYPE_NULL when none was made).
  MPI_Datatype release() {
    if (!owned) return MPI_DATATYPE_NULL;
    owned = false;
    return type;
  }
};

// The most elements (a reduction) or datatype units (a transfer of bytes) one MPI call carries:
// MPI counts are ints. Reductions and all-gathers past it run in pieces of at most this many
// (a ZeRO-3 unit's shard past 2^31 elements ended the job in a CHECK). Tests lower it
// (set_mpi_piece_limit_for_testing) to run the pieces on small buffers.
int64_t g_max_count = INT_MAX;

// The unit of bytes for MPI int counts: 1 where `largest` fits a count, else the largest power of
// two up to 1 MiB dividing `all` (the gcd of the counts), so multi-GiB transfers work.
int64_t byte_unit(int64_t largest, int64_t all) {
  if (largest <= g_max_count) return 1;
  return all == 0 ? 1 : std::gcd(all, int64_t(1) << 20);
}

// A count of `bytes` as (count, datatype) with count fitting an int, where it does (fits()).
struct ByteCount {
  ByteUnit unit;
  const MPI_Datatype& type = unit.type;
  int count = 0;
  explicit ByteCount(int64_t bytes, bool may_not_fit = false) : unit(byte_unit(bytes, bytes)) {
    const bool fits = bytes / unit.bytes <= g_max_count;
    UPIPE_CHECK(fits || may_not_fit, "message of {} bytes is too large to send", bytes);
    count = fits ? int(bytes / unit.bytes) : -1;
  }
  bool fits() const { return count >= 0; }
  MPI_Datatype release() { return unit.release(); }
};

// Calls f(a, k) for the pieces [a, a + k) of n, each at most g_max_count long.
template <class F>
void for_each_piece(int64_t n, F&& f) {
  for (int64_t a = 0; a < n; a += g_max_count) f(a, int(std::min(g_max_count, n - a)));
}

int to_int(int64_t v, const char* what) {
  UPIPE_CHECK(v >= 0 && v <= g_max_count, "{} = {} does not fit an MPI int count", what, v);
  return int(v);
}

void bf16_sum(void* in, void* inout, int* len, MPI_Datatype*) {
  auto* a = static_cast<const uint16_t*>(in);
  auto* b = static_cast<uint16_t*>(inout);
  for (int i = 0; i < *len; ++i) b[i] = f32_to_bf16(bf16_to_f32(a[i]) + bf16_to_f32(b[i]));
}

void bf16_max(void* in, void* inout, int* len, MPI_Datatype*) {
  auto* a = static_cast<const uint16_t*>(in);
  auto* b = static_cast<uint16_t*>(inout);
  for (int i = 0; i < *len; ++i)
    if (bf16_to_f32(a[i]) > bf16_to_f32(b[i])) b[i] = a[i];
}

MPI_Op g_bf16_sum = MPI_OP_NULL, g_bf16_max = MPI_OP_NULL;

std::pair<MPI_Datatype, MPI_Op> reduce_type(DType t, ReduceOp op) {
  if (t == DType::kF32) return {MPI_FLOAT, op == ReduceOp::kSum ? MPI_SUM : MPI_MAX};
  return {MPI_UINT16_T, op == ReduceOp::kSum ? g_bf16_sum : g_bf16_max};
}

// Up to two requests and the large-message datatypes they use; the datatypes are freed only
// once the requests complete.
class MpiWork final : public Work {
 public:
  explicit MpiWork(CommOp op) : op_(op) {}
  MpiWork(const MpiWork&) = delete;
  MpiWork& operator=(const MpiWork&) = delete;
  ~MpiWork() override { wait(); }
  void wait() override {
    if (n_ > 0) {
      WatchdogOp scope(comm_op_name(op_));
      MPI_CHECK(MPI_Waitall(n_, reqs_, MPI_STATUSES_IGNORE));
    }
    n_ = 0;
    for (MPI_Datatype& t : types_)
      if (t != MPI_DATATYPE_NULL) MPI_CHECK(MPI_Type_free(&t));
  }
  MPI_Request* add() {
    UPIPE_CHECK(n_ < kMaxRequests, "MpiWork holds at most {} requests", kMaxRequests);
    return &reqs_[n_++];
  }
  void keep(ByteCount& c) {
    for (MPI_Datatype& t : types_)
      if (t == MPI_DATATYPE_NULL) {
        t = c.release();
        return;
      }
    UPIPE_CHECK(false, "MpiWork keeps at most {} datatypes", kMaxRequests);
  }

 private:
  static constexpr int kMaxRequests = 2;
  MPI_Request reqs_[kMaxRequests];
  MPI_Datatype types_[kMaxRequests] = {MPI_DATATYPE_NULL, MPI_DATATYPE_NULL};
  int n_ = 0;
  CommOp op_;  // names the wait for the watchdog
};

// Past the int counts, one blocking call per piece (at most one piece's MPI scratch alive; the
// non-blocking forms run these too and return done: no piece then overlaps other work).
// all_gather: piece [a, a + k) of every rank's block, received at a in each block by a datatype
// of k bytes whose extent is the block.
void gather_pieces(MPI_Comm comm, const void* send, void* recv, int64_t bytes_per_rank) {
  for_each_piece(bytes_per_rank, [&](int64_t a, int k) {
    MPI_Datatype piece = MPI_DATATYPE_NULL, strided = MPI_DATATYPE_NULL;
    MPI_CHECK(MPI_Type_contiguous(k, MPI_BYTE, &piece));
    MPI_CHECK(MPI_Type_create_resized(piece, 0, MPI_Aint(bytes_per_rank), &strided));
    MPI_CHECK(MPI_Type_free(&piece));
    MPI_CHECK(MPI_Type_commit(&strided));
    MPI_CHECK(MPI_Allgather(static_cast<const char*>(send) + a, k, MPI_BYTE,
                            static_cast<char*>(recv) + a, 1, strided, comm));
    MPI_CHECK(MPI_Type_free(&strided));
  });
}

// reduce_scatter: each rank's block reduced to it, piece by piece (a builtin reduction takes no
// strided datatype, so no piece can be one reduce-scatter).
void reduce_scatter_pieces(MPI_Comm comm, int rank, int size, const void* send, void* recv,
                           int64_t count, DType t, ReduceOp op) {
  // Named, not a structured binding: clang 14 does not capture bindings in a lambda.
  const std::pair<MPI_Datatype, MPI_Op> type_op = reduce_type(t, op);
  const MPI_Datatype type = type_op.first;
  const MPI_Op mop = type_op.second;
  const int64_t es = dtype_size(t);
  for (int root = 0; root < size; ++root)
    for_each_piece(count, [&](int64_t a, int k) {
      const char* from = static_cast<const char*>(send) + (int64_t(root) * count + a) * es;
      void* to = root == rank ? static_cast<char*>(recv) + a * es : nullptr;
      MPI_CHECK(MPI_Reduce(from, to, k, type, mop, root, comm));
    });
}

void all_reduce_pieces(MPI_Comm comm, void* buf, int64_t count, DType t, ReduceOp op) {
  const std::pair<MPI_Datatype, MPI_Op> type_op = reduce_type(t, op);
  const MPI_Datatype type = type_op.first;
  const MPI_Op mop = type_op.second;
  const int64_t es = dtype_size(t);
  for_each_piece(count, [&](int64_t a, int k) {
    MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, static_cast<char*>(buf) + a * es, k, type, mop, comm));
  });
}

constexpr int kP2pTag = 17;

}  // namespace

void set_mpi_piece_limit_for_testing(int64_t max_count) {
  UPIPE_CHECK(max_count >= 1 && max_count <= INT_MAX, "piece limit {} not in [1, 2^31)", max_count);
  g_max_count = max_count;
}

MpiRuntime::MpiRuntime(int* argc, char*** argv) {
  end_with_launcher();  // first: the launcher that started this rank is alive now
  int provided = 0;
  MPI_CHECK(MPI_Init_thread(argc, argv, MPI_THREAD_FUNNELED, &provided));
  MPI_CHECK(MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN));
  int rank = 0;
  MPI_CHECK(MPI_Comm_rank(MPI_COMM_WORLD, &rank));
  set_log_rank(rank);
  set_fatal_handler(abort_handler);
  MPI_CHECK(MPI_Op_create(bf16_sum, 1, &g_bf16_sum));
  MPI_CHECK(MPI_Op_create(bf16_max, 1, &g_bf16_max));
  init_fail_comm();
}

MpiRuntime::~MpiRuntime() {
  MPI_Op_free(&g_bf16_sum);
  MPI_Op_free(&g_bf16_max);
  free_fail_comm();
  set_fatal_handler(nullptr);
  // Every rank has finished the command (rank 0's last writes, eval's gradients, a plan on the
  // meta device, take as long as they take: unwatched, as the command's own tail always was).
  MPI_Barrier(MPI_COMM_WORLD);
  // MPI_Finalize then waits for every host's daemon: a host that stopped or dropped off the
  // network after the work was done would hold it forever. Under the watchdog (where a command
  // started it), at least kFinalizeTimeoutS.
  try {
    if (Watchdog::timeout_s() > 0)
      Watchdog::start(std::max(Watchdog::timeout_s(), kFinalizeTimeoutS));
  } catch (const std::exception&) {  // no thread for it: finalize unwatched, as before
  }
  {
    WatchdogOp op("MPI_Finalize, after the command's work");
    MPI_Finalize();
  }
  Watchdog::stop();
  // A launcher still there long after its ranks ended (mpirun waiting for a host gone after the
  // job ended) is ended by the guard; a normal one exits within seconds.
  guard_launcher_after_end();
}

std::unique_ptr<Communicator> MpiRuntime::world() {
  return std::make_unique<MpiCommunicator>(MPI_COMM_WORLD, false);
}

void MpiRuntime::abort_job(int exit_code) {
  guard_launcher();
  MPI_Abort(MPI_COMM_WORLD, exit_code);
  std::abort();
}

MpiCommunicator::MpiCommunicator(MPI_Comm comm, bool owned) : comm_(comm), owned_(owned) {
  MPI_CHECK(MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN));
  MPI_CHECK(MPI_Comm_rank(comm_, &rank_));
  MPI_CHECK(MPI_Comm_size(comm_, &size_));
}

MpiCommunicator::~MpiCommunicator() {
  if (owned_) MPI_CHECK(MPI_Comm_free(&comm_));
}

void MpiCommunicator::all_to_all(const void* send, void* recv, int64_t bytes_per_rank) {
  record(CommOp::kAllToAll, bytes_per_rank * (size_ - 1));
  WatchdogOp scope(comm_op_name(CommOp::kAllToAll));
  ByteCount c(bytes_per_rank);
  MPI_CHECK(MPI_Alltoall(send, c.count, c.type, recv, c.count, c.type, comm_));
}

void MpiCommunicator::all_to_allv(const void* send, const int64_t* send_bytes,
                                  const int64_t* send_displs, void* recv, const int64_t* recv_bytes,
                                  const int64_t* recv_displs) {
  // MPI counts and displacements are ints in units of the datatype: past 2^31 bytes, a unit
  // dividing them all (a head stage's blocks at S/C = 696320 rows put the last displacement there).
  int64_t largest = 0, all = 0;
  for (int i = 0; i < size_; ++i)
    for (const int64_t v : {send_bytes[i], send_displs[i], recv_bytes[i], recv_displs[i]}) {
      largest = std::max(largest, v);
      all = std::gcd(all, v);
    }
  const int64_t unit = byte_unit(largest, all);
  std::vector<int> sc(static_cast<size_t>(size_)), sd(sc.size()), rc(sc.size()), rd(sc.size());
  int64_t sent = 0;
  for (int i = 0; i < size_; ++i) {
    sc[i] = to_int(send_bytes[i] / unit, "all_to_allv send count");
    sd[i] = to_int(send_displs[i] / unit, "all_to_allv send displacement");
    rc[i] = to_int(recv_bytes[i] / unit, "all_to_allv recv count");
    rd[i] = to_int(recv_displs[i] / unit, "all_to_allv recv displacement");
    if (i != rank_) sent += send_bytes[i];
  }
  record(CommOp::kAllToAllV, sent);
  WatchdogOp scope(comm_op_name(CommOp::kAllToAllV));
  const ByteUnit type(unit);
  MPI_CHECK(MPI_Alltoallv(send, sc.data(), sd.data(), type.type, recv, rc.data(), rd.data(),
                          type.type, comm_));
}

void MpiCommunicator::all_gather(const void* send, void* recv, int64_t bytes_per_rank) {
  record(CommOp::kAllGather, bytes_per_rank * (size_ - 1));
  WatchdogOp scope(comm_op_name(CommOp::kAllGather));
  ByteCount c(bytes_per_rank, /*may_not_fit=*/true);
  if (c.fits()) {
    MPI_CHECK(MPI_Allgather(send, c.count, c.type, recv, c.count, c.type, comm_));
    return;
  }
  gather_pieces(comm_, send, recv, bytes_per_rank);
}

void MpiCommunicator::reduce_scatter(const void* send, void* recv, int64_t count, DType t,
                                     ReduceOp op) {
  record(CommOp::kReduceScatter, count * dtype_size(t) * (size_ - 1));
  WatchdogOp scope(comm_op_name(CommOp::kReduceScatter));
  if (count > g_max_count) {
    reduce_scatter_pieces(comm_, rank_, size_, send, recv, count, t, op);
    return;
  }
  auto [type, mop] = reduce_type(t, op);
  MPI_CHECK(MPI_Reduce_scatter_block(send, recv, to_int(count, "reduce_scatter count"), type, mop,
                                     comm_));
}

void MpiCommunicator::all_reduce(void* buf, int64_t count, DType t, ReduceOp op) {
  const int64_t bytes = count * dtype_size(t);
  record(CommOp::kAllReduce, size_ > 1 ? 2 * bytes * (size_ - 1) / size_ : 0);
  WatchdogOp scope(comm_op_name(CommOp::kAllReduce));
  if (count > g_max_count) {
    all_reduce_pieces(comm_, buf, count, t, op);
    return;
  }
  auto [type, mop] = reduce_type(t, op);
  MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, buf, to_int(count, "all_reduce count"), type, mop, comm_));
}

void MpiCommunicator::broadcast(void* buf, int64_t bytes, int root) {
  record(CommOp::kBroadcast, rank_ == root ? bytes * (size_ - 1) : 0);
  WatchdogOp scope(comm_op_name(CommOp::kBroadcast));
  ByteCount c(bytes);
  MPI_CHECK(MPI_Bcast(buf, c.count, c.type, root, comm_));
}

void MpiCommunicator::sendrecv(const void* send, int64_t send_bytes, int dst, void* recv,
                               int64_t recv_bytes, int src) {
  isendrecv(send, send_bytes, dst, recv, recv_bytes, src)->wait();
}

void MpiCommunicator::barrier() {
  record(CommOp::kBarrier, 0);
  WatchdogOp scope(comm_op_name(CommOp::kBarrier));
  MPI_CHECK(MPI_Barrier(comm_));
}

std::unique_ptr<Work> MpiCommunicator::iall_to_all(const void* send, void* recv,
                                                   int64_t bytes_per_rank) {
  record(CommOp::kAllToAll, bytes_per_rank * (size_ - 1));
  WatchdogOp scope(comm_op_name(CommOp::kAllToAll));
  auto w = std::make_unique<MpiWork>(CommOp::kAllToAll);
  ByteCount c(bytes_per_rank);
  MPI_CHECK(MPI_Ialltoall(send, c.count, c.type, recv, c.count, c.type, comm_, w->add()));
  w->keep(c);
  return w;
}

std::unique_ptr<Work> MpiCommunicator::iall_gather(const void* send, void* recv,
                                                   int64_t bytes_per_rank) {
  record(CommOp::kAllGather, bytes_per_rank * (size_ - 1));
  WatchdogOp scope(comm_op_name(CommOp::kAllGather));
  auto w = std::make_unique<MpiWork>(CommOp::kAllGather);
  ByteCount c(bytes_per_rank, /*may_not_fit=*/true);
  if (!c.fits()) {
    gather_pieces(comm_, send, recv, bytes_per_rank);
    return w;
  }
  MPI_CHECK(MPI_Iallgather(send, c.count, c.type, recv, c.count, c.type, comm_, w->add()));
  w->keep(c);
  return w;
}

std::unique_ptr<Work> MpiCommunicator::ireduce_scatter(const void* send, void* recv, int64_t count,
                                                       DType t, ReduceOp op) {
  record(CommOp::kReduceScatter, count * dtype_size(t) * (size_ - 1));
  WatchdogOp scope(comm_op_name(CommOp::kReduceScatter));
  auto w = std::make_unique<MpiWork>(CommOp::kReduceScatter);
  if (count > g_max_count) {
    reduce_scatter_pieces(comm_, rank_, size_, send, recv, count, t, op);
    return w;
  }
  auto [type, mop] = reduce_type(t, op);
  MPI_CHECK(MPI_Ireduce_scatter_block(send, recv, to_int(count, "reduce_scatter count"), type, mop,
                                      comm_, w->add()));
  return w;
}

std::unique_ptr<Work> MpiCommunicator::iall_reduce(void* buf, int64_t count, DType t, ReduceOp op) {
  const int64_t bytes = count * dtype_size(t);
  record(CommOp::kAllReduce, size_ > 1 ? 2 * bytes * (size_ - 1) / size_ : 0);
  WatchdogOp scope(comm_op_name(CommOp::kAllReduce));
  auto w = std::make_unique<MpiWork>(CommOp::kAllReduce);
  if (count > g_max_count) {
    all_reduce_pieces(comm_, buf, count, t, op);
    return w;
  }
  auto [type, mop] = reduce_type(t, op);
  MPI_CHECK(MPI_Iallreduce(MPI_IN_PLACE, buf, to_int(count, "all_reduce count"), type, mop, comm_,
                           w->add()));
  return w;
}

std::unique_ptr<Work> MpiCommunicator::isendrecv(const void* send, int64_t send_bytes, int dst,
                                                 void* recv, int64_t recv_bytes, int src) {
  record(CommOp::kSendRecv, dst == rank_ ? 0 : send_bytes);
  WatchdogOp scope(comm_op_name(CommOp::kSendRecv));
  auto w = std::make_unique<MpiWork>(CommOp::kSendRecv);
  ByteCount rc(recv_bytes), sc(send_bytes);
  MPI_CHECK(MPI_Irecv(recv, rc.count, rc.type, src, kP2pTag, comm_, w->add()));
  MPI_CHECK(MPI_Isend(send, sc.count, sc.type, dst, kP2pTag, comm_, w->add()));
  w->keep(rc);
  w->keep(sc);
  return w;
}

std::unique_ptr<Communicator> MpiCommunicator::split(const SplitRule& rule) {
  const SplitPlace want = split_place(rule, rank_, size_);
  const SplitKey me = rule(rank_);
  MPI_Comm sub;
  {
    WatchdogOp scope("split");
    MPI_CHECK(MPI_Comm_split(comm_, me.color, me.key, &sub));
  }
  auto c = std::make_unique<MpiCommunicator>(sub, true);
  UPIPE_CHECK(c->size() == want.size && c->rank() == want.rank,
              "split gave rank {} of {}, the rule gives rank {} of {}; every rank must pass the "
              "same rule",
              c->rank(), c->size(), want.rank, want.size);
  c->parent_ = this;
  return c;
}

}  // namespace upipe
