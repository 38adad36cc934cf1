// `upipe bench comm`: one collective through the engine's communicator, in its blocking and
// non-blocking forms, and the plain MPI call on the same buffers, so the engine's overhead shows.
// The data each path moves is checked against the predicted result before anything is timed.
//
// Definitions (nccl-tests'): B = --bytes is the total buffer of one rank — the all-to-all send
// (and receive) buffer, the all-gather output, the reduce-scatter input, the all-reduce buffer,
// the sendrecv message; the collectives move B/n to or from each of the n ranks. B is rounded
// down to a multiple of 4n (whole int32/fp32 blocks). algbw = B / t; busbw = algbw × factor:
// (n-1)/n for all-to-all, all-gather and reduce-scatter, 2(n-1)/n for all-reduce, 1 for
// sendrecv (a ring: send to rank+1, receive from rank-1). GB/s are 1e9 bytes per second.
// t is the median over --iters of the slowest rank's time for one call, with a barrier before
// each call; the three paths are timed interleaved so a drift in machine speed hits all alike.
#include <mpi.h>

#include <fmt/format.h>
#include <algorithm>
#include <chrono>
#include <climits>
#include <cstring>
#include <functional>
#include <nlohmann/json.hpp>
#include <stdexcept>
#include <vector>

#include "apps/upipe/commands.h"
#include "apps/upipe/report.h"
#include "apps/upipe/settings_cli.h"
#include "backend/device.h"
#include "comm/mpi/mpi_comm.h"
#include "core/arena.h"
#include "core/errors.h"
#include "core/watchdog.h"

namespace upipe::app {
namespace {

enum class Op { kAllToAll, kAllGather, kReduceScatter, kAllReduce, kSendRecv };
constexpr const char* kOpNames[] = {"all-to-all", "all-gather", "reduce-scatter", "all-reduce",
                                    "sendrecv"};

struct Options {
  std::string op = "all-to-all";
  std::string bytes = "16M";
  int iters = 20, warmup = 5;
  bool json = false;
};

Op parse_op(const std::string& s) {
  for (int i = 0; i < 5; ++i)
    if (s == kOpNames[i]) return Op(i);
  throw ConfigError("unknown --op '" + s +
                    "'; use all-to-all, all-gather, reduce-scatter, all-reduce or sendrecv");
}

double bus_factor(Op op, int n) {
  if (op == Op::kSendRecv) return 1.0;
  if (op == Op::kAllReduce) return 2.0 * (n - 1) / n;
  return double(n - 1) / n;
}

void mpi_ok(int rc, const char* call) {
  if (rc != MPI_SUCCESS) throw std::runtime_error(std::string(call) + " failed");
}

double now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// Element k of the block rank q sends to (or contributes for) rank j: distinct per (q, j, k).
uint32_t pattern(int q, int j, int64_t k) {
  return uint32_t(q) * 2654435761u + uint32_t(j) * 40503u + uint32_t(k);
}
// What rank q contributes to element i of a reduction: small integers, exact in any fp32 sum.
float reduce_input(int q, int64_t i) {
  return float((q + i) % 13);
}

// One rank's buffers for `op` on a total of B bytes (all-reduce works in place in `send`).
struct Buffers {
  Buffer send, recv;
  int64_t send_bytes = 0, recv_bytes = 0;
};

Buffers make_buffers(Arena& mem, Op op, int64_t b, int n) {
  const int64_t blk = b / n;
  Buffers x;
  x.send_bytes = op == Op::kAllGather ? blk : b;
  x.recv_bytes = op == Op::kReduceScatter ? blk : op == Op::kAllReduce ? 0 : b;
  x.send = Buffer(mem, x.send_bytes, Tag::kOther);
  if (x.recv_bytes > 0) x.recv = Buffer(mem, x.recv_bytes, Tag::kOther);
  return x;
}

// Fills the inputs of rank r (all-reduce: the buffer itself).
void fill(Buffers& x, Op op, int r, int n) {
  if (op == Op::kReduceScatter || op == Op::kAllReduce) {
    auto* s = static_cast<float*>(x.send.data());
    for (int64_t i = 0; i < x.send_bytes / 4; ++i) s[i] = reduce_input(r, i);
  } else {
    auto* s = static_cast<uint32_t*>(x.send.data());
    const int64_t per = (op == Op::kAllToAll ? x.send_bytes / n : x.send_bytes) / 4;
    const int blocks = op == Op::kAllToAll ? n : 1;
    for (int j = 0; j < blocks; ++j)
      for (int64_t k = 0; k < per; ++k) s[j * per + k] = pattern(r, j, k);
  }
  if (x.recv_bytes > 0) std::memset(x.recv.data(), 0xFF, size_t(x.recv_bytes));
}

// Whether rank r of n holds the predicted result of `op` after one call on fill()'s inputs.
bool result_ok(const Buffers& x, Op op, int r, int n) {
  if (op == Op::kReduceScatter || op == Op::kAllReduce) {
    const auto* got =
        static_cast<const float*>(op == Op::kAllReduce ? x.send.data() : x.recv.data());
    const int64_t count = (op == Op::kAllReduce ? x.send_bytes : x.recv_bytes) / 4;
    const int64_t base = op == Op::kReduceScatter ? r * count : 0;
    for (int64_t k = 0; k < count; ++k) {
      float want = 0;
      for (int q = 0; q < n; ++q) want += reduce_input(q, base + k);
      if (got[k] != want) return false;
    }
    return true;
  }
  const auto* got = static_cast<const uint32_t*>(x.recv.data());
  if (op == Op::kSendRecv) {
    const int src = (r + n - 1) % n;
    for (int64_t k = 0; k < x.recv_bytes / 4; ++k)
      if (got[k] != pattern(src, 0, k)) return false;
    return true;
  }
  const int64_t per = x.recv_bytes / n / 4;
  for (int j = 0; j < n; ++j)
    for (int64_t k = 0; k < per; ++k)
      if (got[j * per + k] != (op == Op::kAllToAll ? pattern(j, r, k) : pattern(j, 0, k)))
        return false;
  return true;
}

struct Path {
  const char* name;
  std::function<void()> call;
  std::vector<double> times;
};

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t m = v.size() / 2;
  return v.size() % 2 ? v[m] : 0.5 * (v[m - 1] + v[m]);
}

int run(Process& proc, const Options& opt, const SettingArgs& sa, const CLI::App& cmd) {
  Watchdog::start(resolve_settings(proc, sa, cmd).config.comm.timeout);
  auto* mpi = dynamic_cast<MpiCommunicator*>(&proc.world);
  if (mpi == nullptr) throw ConfigError("bench comm needs the MPI backend");
  const Op op = parse_op(opt.op);
  Communicator& c = proc.world;
  const MPI_Comm h = mpi->handle();
  const int n = c.size(), r = c.rank(), next = (r + 1) % n, prev = (r + n - 1) % n;
  const int64_t requested = parse_bytes(opt.bytes, "--bytes");
  const int64_t b = requested / (4 * n) * (4 * n);
  if (b == 0)
    throw ConfigError(
        fmt::format("--bytes {} is below one int32 per rank; use at least {}", requested, 4 * n));
  const int64_t blk = b / n;
  if ((op == Op::kSendRecv ? b : blk) > INT_MAX)
    throw ConfigError(
        fmt::format("--bytes {} gives {} bytes per MPI call's count; the raw MPI "
                    "comparison needs at most {}",
                    opt.bytes, op == Op::kSendRecv ? b : blk, INT_MAX));
  Device dev;
  Buffers x = make_buffers(dev.mem(), op, b, n);
  void* s = x.send.data();
  void* rv = x.recv.data();
  const int ib = int(blk), fc = int(blk / 4);
  std::vector<Path> paths;
  switch (op) {
    case Op::kAllToAll:
      paths = {{"upipe", [&] { c.all_to_all(s, rv, blk); }, {}},
               {"upipe_nonblocking", [&] { c.iall_to_all(s, rv, blk)->wait(); }, {}},
               {"mpi",
                [&] { mpi_ok(MPI_Alltoall(s, ib, MPI_BYTE, rv, ib, MPI_BYTE, h), "MPI_Alltoall"); },
                {}}};
      break;
    case Op::kAllGather:
      paths = {
          {"upipe", [&] { c.all_gather(s, rv, blk); }, {}},
          {"upipe_nonblocking", [&] { c.iall_gather(s, rv, blk)->wait(); }, {}},
          {"mpi",
           [&] { mpi_ok(MPI_Allgather(s, ib, MPI_BYTE, rv, ib, MPI_BYTE, h), "MPI_Allgather"); },
           {}}};
      break;
    case Op::kReduceScatter:
      paths = {{"upipe", [&] { c.reduce_scatter(s, rv, fc, DType::kF32, ReduceOp::kSum); }, {}},
               {"upipe_nonblocking",
                [&] { c.ireduce_scatter(s, rv, fc, DType::kF32, ReduceOp::kSum)->wait(); },
                {}},
               {"mpi",
                [&] {
                  mpi_ok(MPI_Reduce_scatter_block(s, rv, fc, MPI_FLOAT, MPI_SUM, h),
                         "MPI_Reduce_scatter_block");
                },
                {}}};
      break;
    case Op::kAllReduce:
      paths = {{"upipe", [&] { c.all_reduce(s, b / 4, DType::kF32, ReduceOp::kSum); }, {}},
               {"upipe_nonblocking",
                [&] { c.iall_reduce(s, b / 4, DType::kF32, ReduceOp::kSum)->wait(); },
                {}},
               {"mpi",
                [&] {
                  mpi_ok(MPI_Allreduce(MPI_IN_PLACE, s, int(b / 4), MPI_FLOAT, MPI_SUM, h),
                         "MPI_Allreduce");
                },
                {}}};
      break;
    case Op::kSendRecv:
      paths = {{"upipe", [&] { c.sendrecv(s, b, next, rv, b, prev); }, {}},
               {"upipe_nonblocking", [&] { c.isendrecv(s, b, next, rv, b, prev)->wait(); }, {}},
               {"mpi",
                [&] {
                  mpi_ok(MPI_Sendrecv(s, int(b), MPI_BYTE, next, 23, rv, int(b), MPI_BYTE, prev, 23,
                                      h, MPI_STATUS_IGNORE),
                         "MPI_Sendrecv");
                },
                {}}};
      break;
  }
  // Correctness first: every path, on freshly filled buffers, on every rank.
  for (Path& p : paths) {
    fill(x, op, r, n);
    p.call();
    int ok = result_ok(x, op, r, n) ? 1 : 0;
    mpi_ok(MPI_Allreduce(MPI_IN_PLACE, &ok, 1, MPI_INT, MPI_MIN, h), "MPI_Allreduce");
    if (!ok) {
      if (proc.root())
        std::fprintf(stderr, "upipe bench comm: %s through %s moved wrong data\n",
                     kOpNames[int(op)], p.name);
      return 1;
    }
  }
  // The in-place all-reduce would grow its values call after call: time it on zeros.
  if (op == Op::kAllReduce) std::memset(s, 0, size_t(b));
  for (int it = 0; it < opt.warmup + opt.iters; ++it)
    for (Path& p : paths) {
      mpi_ok(MPI_Barrier(h), "MPI_Barrier");
      const double t0 = now();
      p.call();
      double dt = now() - t0;
      mpi_ok(MPI_Allreduce(MPI_IN_PLACE, &dt, 1, MPI_DOUBLE, MPI_MAX, h), "MPI_Allreduce");
      if (it >= opt.warmup) p.times.push_back(dt);
    }
  if (!proc.root()) return 0;
  // One rank (no mpirun) moves its data within its own memory: the GB/s are a copy's, not a link's.
  const bool one_rank = n == 1;
  if (one_rank)
    std::fprintf(
        stderr,
        "upipe bench comm: warning: one rank: nothing crosses a link (every byte is a "
        "copy within this process), so these GB/s are memory bandwidth, not "
        "interconnect bandwidth; run it under mpirun on ranks of different hosts (2 ranks of "
        "one host measure its shared memory)\n");
  const double factor = bus_factor(op, n);
  nlohmann::json j = {{"op", kOpNames[int(op)]}, {"ranks", n},           {"bytes", b},
                      {"iters", opt.iters},      {"warmup", opt.warmup}, {"time", "median"},
                      {"bus_factor", factor},    {"one_rank", one_rank}};
  for (const Path& p : paths) {
    const double t = median(p.times);
    j[p.name] = {{"time_s", t},
                 {"min_time_s", *std::min_element(p.times.begin(), p.times.end())},
                 {"algbw_gbps", double(b) / t / 1e9},
                 {"busbw_gbps", double(b) / t / 1e9 * factor}};
  }
  const double t_mpi = j["mpi"]["time_s"];
  j["overhead"] = double(j["upipe"]["time_s"]) / t_mpi;
  j["overhead_nonblocking"] = double(j["upipe_nonblocking"]["time_s"]) / t_mpi;
  if (opt.json) {
    print_json(j);
    return 0;
  }
  std::printf("%s of %s (%lld B) on %d ranks; median of %d calls, data checked first\n",
              kOpNames[int(op)], format_bytes(b).c_str(), (long long)b, n, opt.iters);
  std::printf("  %-18s %12s %12s %12s\n", "path", "time us", "algbw GB/s", "busbw GB/s");
  for (const Path& p : paths)
    std::printf("  %-18s %12.1f %12.3f %12.3f\n", p.name, double(j[p.name]["time_s"]) * 1e6,
                double(j[p.name]["algbw_gbps"]), double(j[p.name]["busbw_gbps"]));
  std::printf("  overhead vs MPI: %.3fx blocking, %.3fx non-blocking\n", double(j["overhead"]),
              double(j["overhead_nonblocking"]));
  return 0;
}

}  // namespace

Runner add_bench_comm(CLI::App& cmd) {
  auto opt = std::make_shared<Options>();
  cmd.add_option("--op", opt->op, "all-to-all, all-gather, reduce-scatter, all-reduce or sendrecv")
      ->capture_default_str();
  cmd.add_option("--bytes", opt->bytes,
                 "total buffer per rank as in nccl-tests (all-to-all send buffer, all-gather "
                 "output, reduce-scatter input, all-reduce buffer, sendrecv message), e.g. 64M; "
                 "rounded down to a multiple of 4 x ranks")
      ->capture_default_str();
  cmd.add_option("--iters", opt->iters, "timed calls per path (the median is reported)")
      ->capture_default_str()
      ->check(integer_in<int>(1, kMaxIters));
  cmd.add_option("--warmup", opt->warmup, "untimed calls per path first")
      ->capture_default_str()
      ->check(integer_in<int>(0, kMaxIters));
  cmd.add_flag("--json", opt->json, "print one JSON object");
  cmd.footer(
      "algbw = bytes / time; busbw = algbw x (n-1)/n (all-to-all, all-gather, reduce-scatter), "
      "2(n-1)/n (all-reduce), 1 (sendrecv), as in nccl-tests. time = median over --iters of the "
      "slowest rank, a barrier before each call. Compared with the plain MPI call on the same "
      "buffers (MPI_Alltoall, MPI_Allgather, MPI_Reduce_scatter_block, MPI_Allreduce, "
      "MPI_Sendrecv).");
  auto sa = add_settings(cmd, kScopeComm);
  CLI::App* c = &cmd;
  return [opt, sa, c](Process& p) { return run(p, *opt, *sa, *c); };
}

}  // namespace upipe::app
