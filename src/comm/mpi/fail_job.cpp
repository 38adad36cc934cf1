// MpiRuntime::fail_job: how a rank that caught an error ends the job. The ranks cannot be told
// apart in advance: an error may be raised by every rank alike (bad input), or by one rank while
// the others wait for it in a collective they can never leave. So the failing rank announces
// itself (a small message to every rank on a private communicator) and enters a non-blocking
// barrier there, polled for kFailAgreeSeconds: it completes only when every rank failed.
#include <mpi.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <thread>
#include <vector>

#include "comm/mpi/fail_job.h"
#include "comm/mpi/mpi_comm.h"

namespace upipe {
namespace {

MPI_Comm g_fail_comm = MPI_COMM_NULL;
constexpr int kNoticeTag = 7301;
// After the deadline, a rank that leaves the printing to a lower rank waits this long for that
// rank's MPI_Abort before calling its own.
constexpr double kLingerSeconds = 5.0;

struct Notice {
  uint64_t cause_hash = 0;
  int32_t exit_code = 0;
  int32_t valid = 0;
};

uint64_t fnv1a(const std::string& s) {
  uint64_t h = 1469598103934665603ull;
  for (unsigned char c : s) h = (h ^ c) * 1099511628211ull;
  return h;
}

void print_line(const std::string& line) {
  std::fprintf(stderr, "%s\n", line.c_str());
  std::fflush(stderr);
}

// Receives every notice that has arrived.
void drain(std::vector<Notice>& seen) {
  for (;;) {
    int flag = 0;
    MPI_Status st;
    if (MPI_Iprobe(MPI_ANY_SOURCE, kNoticeTag, g_fail_comm, &flag, &st) != MPI_SUCCESS || !flag)
      return;
    Notice n;
    MPI_Recv(&n, sizeof n, MPI_BYTE, st.MPI_SOURCE, kNoticeTag, g_fail_comm, MPI_STATUS_IGNORE);
    seen[size_t(st.MPI_SOURCE)] = n;
  }
}

// Whether a rank below `rank` reported the same cause (and so prints it instead).
bool lower_rank_has(const std::vector<Notice>& seen, int rank) {
  for (int r = 0; r < rank; ++r)
    if (seen[size_t(r)].valid && seen[size_t(r)].cause_hash == seen[size_t(rank)].cause_hash)
      return true;
  return false;
}

}  // namespace

std::string cause_key(std::string_view what) {
  static constexpr std::string_view kRankFile = "rank_";
  std::string key;
  key.reserve(what.size());
  for (size_t i = 0; i < what.size();) {
    if (what.substr(i, kRankFile.size()) == kRankFile) {
      key += kRankFile;
      i += kRankFile.size();
      if (i < what.size() && what[i] >= '0' && what[i] <= '9') {
        key += '#';
        while (i < what.size() && what[i] >= '0' && what[i] <= '9') ++i;
      }
      continue;
    }
    key += what[i++];
  }
  return key;
}

void init_fail_comm() {
  MPI_Comm_dup(MPI_COMM_WORLD, &g_fail_comm);
}

void free_fail_comm() {
  if (g_fail_comm != MPI_COMM_NULL) MPI_Comm_free(&g_fail_comm);
}

int MpiRuntime::fail_job(int exit_code, const std::string& cause, const std::string& line) {
  int rank = 0, size = 1;
  MPI_Comm_rank(g_fail_comm, &rank);
  MPI_Comm_size(g_fail_comm, &size);
  if (size == 1) {
    print_line(line);
    return exit_code;
  }
  std::vector<Notice> seen(static_cast<size_t>(size));
  Notice& mine = seen[size_t(rank)];
  mine = {fnv1a(cause_key(cause)), exit_code, 1};
  std::vector<MPI_Request> sends;
  for (int r = 0; r < size; ++r) {
    if (r == rank) continue;
    sends.emplace_back();
    MPI_Isend(&mine, sizeof mine, MPI_BYTE, r, kNoticeTag, g_fail_comm, &sends.back());
  }
  MPI_Request all_failed;
  MPI_Ibarrier(g_fail_comm, &all_failed);
  const auto deadline =
      std::chrono::steady_clock::now() + std::chrono::duration<double>(kFailAgreeSeconds);
  int done = 0;
  while (!done && std::chrono::steady_clock::now() < deadline) {
    MPI_Test(&all_failed, &done, MPI_STATUS_IGNORE);
    drain(seen);
    if (!done) std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  if (done) {
    // Every rank posted its notice before entering the barrier: all of them arrive.
    for (int r = 0; r < size; ++r)
      if (r != rank && !seen[size_t(r)].valid)
        MPI_Recv(&seen[size_t(r)], sizeof(Notice), MPI_BYTE, r, kNoticeTag, g_fail_comm,
                 MPI_STATUS_IGNORE);
    MPI_Waitall(int(sends.size()), sends.data(), MPI_STATUSES_IGNORE);
    if (!lower_rank_has(seen, rank)) print_line(line);
    int status = 0;
    for (const Notice& n : seen) status = std::max(status, int(n.exit_code));
    return status;
  }
  drain(seen);
  if (lower_rank_has(seen, rank)) {
    std::this_thread::sleep_for(std::chrono::duration<double>(kLingerSeconds));
  } else {
    print_line(line);
  }
  abort_job(exit_code);
}

}  // namespace upipe
