// The staged communicator (comm/staged) over MPI on real ranks. With either copier it passes the
// checks the MPI communicator passes (tests/multirank/comm_checks.h: every op, non-blocking ones
// in flight together, split groups) and counts exactly what its inner communicator counts.
// DeferredCopier holds every copy until sync(), as an asynchronous device copy would, and fills
// new staging memory with a poison byte, so a missing sync or a stale staging byte shows up as
// wrong data; it also tracks the staging memory, which must all be returned.
#include <cstring>
#include <vector>

#include "comm/staged/staged_comm.h"
#include "multirank/comm_checks.h"
#include "multirank/mpi_test_main.h"

namespace upipe {
namespace {

using test::exercise;
using test::world;

class DeferredCopier final : public DeviceCopier {
 public:
  void to_host(void* host, const void* dev, int64_t bytes) override {
    pending_.push_back({host, dev, bytes});
  }
  void to_device(void* dev, const void* host, int64_t bytes) override {
    pending_.push_back({dev, host, bytes});
  }
  void sync() override {
    for (const Copy& c : pending_) std::memcpy(c.dst, c.src, size_t(c.bytes));
    pending_.clear();
  }
  void* alloc_host(int64_t bytes) override {
    void* p = DeviceCopier::alloc_host(bytes);
    std::memset(p, kPoison, size_t(bytes));
    live_bytes_ += bytes;
    ++allocs_;
    return p;
  }
  void free_host(void* p, int64_t bytes) override {
    live_bytes_ -= bytes;
    DeviceCopier::free_host(p, bytes);
  }
  int64_t live_bytes() const { return live_bytes_; }
  int allocs() const { return allocs_; }
  bool idle() const { return pending_.empty(); }

 private:
  static constexpr uint8_t kPoison = 0xCD;
  struct Copy {
    void* dst;
    const void* src;
    int64_t bytes;
  };
  std::vector<Copy> pending_;
  int64_t live_bytes_ = 0;
  int allocs_ = 0;
};

TEST(StagedComm, HostCopierPassesTheCollectiveChecks) {
  HostCopier copier;
  StagedCommunicator s(world(), copier);
  EXPECT_EQ(s.backend(), "staged(mpi)");
  EXPECT_EQ(s.rank(), world().rank());
  EXPECT_EQ(s.size(), world().size());
  exercise(s, true);
  test::exercise_overlap(s);
  test::exercise_grid_split(s);
  EXPECT_EQ(s.staging().busy(), 0);
}

TEST(StagedComm, DeferredCopiesPassTheCollectiveChecks) {
  DeferredCopier copier;
  {
    StagedCommunicator s(world(), copier);
    exercise(s, true);
    test::exercise_overlap(s);
    test::exercise_grid_split(s);
    EXPECT_TRUE(copier.idle()) << "a call returned with copies not synced";
  }
  EXPECT_EQ(copier.live_bytes(), 0) << "staging memory not returned";
}

// The staged communicator records exactly the calls and bytes of its inner one; a group's
// counters equal its inner group's, and both sides propagate group traffic to their parents.
TEST(StagedComm, CountsWhatTheInnerCommunicatorCounts) {
  HostCopier copier;
  Communicator& w = world();
  StagedCommunicator s(w, copier);
  w.reset_stats();
  exercise(s, true);
  test::exercise_overlap(s);
  test::expect_same_stats(s.stats(), w.stats(), "staged vs its inner mpi");
  EXPECT_GT(s.stats().total_calls(), 20);

  const int n = w.size(), u = n % 2 == 0 ? 2 : 1;
  auto row = s.split([u](int q) { return SplitKey{q / u, q % u}; });
  auto& staged_row = dynamic_cast<StagedCommunicator&>(*row);
  EXPECT_EQ(row->backend(), "staged(mpi)");
  EXPECT_EQ(row->size(), u);
  w.reset_stats();
  s.reset_stats();
  exercise(*row, true);
  test::expect_same_stats(row->stats(), staged_row.inner().stats(), "staged group vs its inner");
  test::expect_same_stats(s.stats(), w.stats(), "group traffic in both parents");
  EXPECT_EQ(s.stats().total_bytes(), row->stats().total_bytes());
}

// One buffer while calls are blocking, grown to the largest call and then kept (no new
// allocation for a smaller or equal call); one more per call in flight.
TEST(StagedComm, StagingGrowsToTheLargestCallAndIsKept) {
  DeferredCopier copier;
  {
    StagedCommunicator s(world(), copier);
    const int n = s.size();
    const auto gather = [&](int64_t bytes) {
      std::vector<uint8_t> send(size_t(bytes), uint8_t(s.rank())), recv(size_t(bytes) * size_t(n));
      s.all_gather(send.data(), recv.data(), bytes);
      for (int j = 0; j < n; ++j) ASSERT_EQ(recv[size_t(j) * size_t(bytes)], uint8_t(j));
    };
    gather(1000);
    // The receive region starts 64-byte aligned after the send region.
    const int64_t first = 1024 + 1000 * int64_t(n);
    EXPECT_EQ(s.staging().bytes_held(), first);
    EXPECT_EQ(s.staging().buffers(), 1);
    gather(100);
    gather(1000);
    EXPECT_EQ(s.staging().bytes_held(), first);
    EXPECT_EQ(copier.allocs(), 1);
    gather(5000);
    const int64_t second = 5056 + 5000 * int64_t(n);
    EXPECT_EQ(s.staging().bytes_held(), second);
    EXPECT_EQ(s.staging().buffers(), 1);
    EXPECT_EQ(copier.live_bytes(), second);

    std::vector<float> a(1000, 1.0f), b(10, 2.0f);
    auto wa = s.iall_reduce(a.data(), 1000, DType::kF32, ReduceOp::kSum);
    auto wb = s.iall_reduce(b.data(), 10, DType::kF32, ReduceOp::kSum);
    EXPECT_EQ(s.staging().busy(), 2);
    EXPECT_EQ(s.staging().buffers(), 2);
    EXPECT_EQ(s.staging().bytes_held(), second + 40);
    wb->wait();
    EXPECT_EQ(s.staging().busy(), 1);
    wa->wait();
    EXPECT_EQ(s.staging().busy(), 0);
    EXPECT_EQ(a[999], float(n));
    EXPECT_EQ(b[9], float(2 * n));
    // A group draws on the same pool.
    auto g = s.split([](int q) { return SplitKey{0, q}; });
    std::vector<uint8_t> gs(100, 7), gr(100 * size_t(n));
    g->all_gather(gs.data(), gr.data(), 100);
    EXPECT_EQ(s.staging().buffers(), 2);
    EXPECT_EQ(gr.back(), 7);
  }
  EXPECT_EQ(copier.live_bytes(), 0);
}

// all_to_allv with gaps between the receive blocks (and unsent bytes between send blocks): the
// staged result equals MPI's, byte for byte, gaps included (the caller's gap bytes untouched).
TEST(StagedComm, AllToAllVLeavesReceiveGapsUntouched) {
  DeferredCopier copier;
  StagedCommunicator s(world(), copier);
  const int r = s.rank(), n = s.size();
  const size_t un = size_t(n);
  std::vector<int64_t> sb(un), sd(un), rb(un), rd(un);
  int64_t so = 0, ro = 0;
  for (int j = 0; j < n; ++j) {
    sb[size_t(j)] = (r + j) % 3 * 5;  // rank q sends (q + j) % 3 * 5 bytes to rank j
    sd[size_t(j)] = so + 3;
    so += sb[size_t(j)] + 3;
    rb[size_t(j)] = (j + r) % 3 * 5;
    rd[size_t(j)] = ro + 7;
    ro += rb[size_t(j)] + 7;
  }
  std::vector<uint8_t> send(size_t(so), 0xEE);
  for (int j = 0; j < n; ++j)
    for (int64_t k = 0; k < sb[size_t(j)]; ++k)
      send[size_t(sd[size_t(j)] + k)] = uint8_t(16 * r + j + k);
  std::vector<uint8_t> via_mpi(size_t(ro), 0x5A), via_staged(size_t(ro), 0x5A);
  world().all_to_allv(send.data(), sb.data(), sd.data(), via_mpi.data(), rb.data(), rd.data());
  s.all_to_allv(send.data(), sb.data(), sd.data(), via_staged.data(), rb.data(), rd.data());
  EXPECT_EQ(via_staged, via_mpi);
  for (int j = 0; j < n; ++j) {
    EXPECT_EQ(via_staged[size_t(rd[size_t(j)] - 1)], 0x5A);
    for (int64_t k = 0; k < rb[size_t(j)]; ++k)
      EXPECT_EQ(via_staged[size_t(rd[size_t(j)] + k)], uint8_t(16 * j + r + k));
  }
}

}  // namespace
}  // namespace upipe
