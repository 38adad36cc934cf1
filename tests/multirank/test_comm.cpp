// The MPI communicator on real ranks, with inputs built so every result is exactly
// predictable, and the call/byte counters checked against the fake (meta) backend replaying
// the same calls.
#include <numeric>
#include <vector>

#include "comm/fake/fake_comm.h"
#include "multirank/mpi_test_main.h"

namespace upipe {
namespace {

using test::world;

// Runs the same sequence of calls on any communicator; returns nothing, checks results only
// when `check` (the fake backend moves no data).
void exercise(Communicator& c, bool check) {
  const int r = c.rank(), n = c.size();
  // all_to_all: block j of rank r carries r*1000 + j*10 + k.
  {
    const int per = 3;
    std::vector<int32_t> send(size_t(n * per)), recv(size_t(n * per), -1);
    for (int j = 0; j < n; ++j)
      for (int k = 0; k < per; ++k) send[size_t(j * per + k)] = r * 1000 + j * 10 + k;
    c.all_to_all(send.data(), recv.data(), per * 4);
    if (check) {
      for (int j = 0; j < n; ++j)
        for (int k = 0; k < per; ++k) EXPECT_EQ(recv[size_t(j * per + k)], j * 1000 + r * 10 + k);
    }
  }
  // all_to_allv: rank r sends j+1 ints to rank j, all equal to r*100+j.
  {
    const size_t un = static_cast<size_t>(n);
    std::vector<int64_t> sb(un), sd(un), rb(un), rd(un);
    int64_t so = 0, ro = 0;
    for (int j = 0; j < n; ++j) {
      sb[size_t(j)] = (j + 1) * 4;
      sd[size_t(j)] = so;
      so += sb[size_t(j)];
      rb[size_t(j)] = (r + 1) * 4;
      rd[size_t(j)] = ro;
      ro += rb[size_t(j)];
    }
    std::vector<int32_t> send(size_t(so / 4)), recv(size_t(ro / 4), -1);
    for (int j = 0; j < n; ++j)
      for (int k = 0; k <= j; ++k) send[size_t(sd[size_t(j)] / 4 + k)] = r * 100 + j;
    c.all_to_allv(send.data(), sb.data(), sd.data(), recv.data(), rb.data(), rd.data());
    if (check) {
      for (int j = 0; j < n; ++j)
        for (int k = 0; k <= r; ++k) EXPECT_EQ(recv[size_t(rd[size_t(j)] / 4 + k)], j * 100 + r);
    }
  }
  // all_gather.
  {
    std::vector<int32_t> send{r, -r}, recv(size_t(2 * n), 99);
    c.all_gather(send.data(), recv.data(), 8);
    if (check) {
      for (int j = 0; j < n; ++j) {
        EXPECT_EQ(recv[size_t(2 * j)], j);
        EXPECT_EQ(recv[size_t(2 * j + 1)], -j);
      }
    }
  }
  // reduce_scatter, fp32 and bf16 sums of small integers (exact in both).
  for (DType t : {DType::kF32, DType::kBF16}) {
    const int per = 5;
    std::vector<float> vals(size_t(n * per));
    for (int j = 0; j < n * per; ++j) vals[size_t(j)] = float(r + j % 7);
    std::vector<uint8_t> send(size_t(n * per) * size_t(dtype_size(t))),
        recv(size_t(per) * size_t(dtype_size(t)));
    from_f32(vals.data(), send.data(), t, n * per);
    c.reduce_scatter(send.data(), recv.data(), per, t, ReduceOp::kSum);
    std::vector<float> got(static_cast<size_t>(per));
    to_f32(recv.data(), t, got.data(), per);
    if (check) {
      for (int k = 0; k < per; ++k)
        EXPECT_EQ(got[size_t(k)], float(n * (n - 1) / 2 + n * ((r * per + k) % 7)));
    }
  }
  // all_reduce sum and max.
  {
    std::vector<float> v{float(r), 1.0f, float(-r)};
    c.all_reduce(v.data(), 3, DType::kF32, ReduceOp::kSum);
    if (check) {
      EXPECT_EQ(v, (std::vector<float>{float(n * (n - 1) / 2), float(n), -float(n * (n - 1) / 2)}));
    }
    std::vector<float> m{float(r), float(-r)};
    c.all_reduce(m.data(), 2, DType::kF32, ReduceOp::kMax);
    if (check) {
      EXPECT_EQ(m, (std::vector<float>{float(n - 1), 0.0f}));
    }
  }
  // broadcast from the last rank.
  {
    int64_t v = r == n - 1 ? 4242 : -1;
    c.broadcast(&v, 8, n - 1);
    if (check) {
      EXPECT_EQ(v, 4242);
    }
  }
  // Ring sendrecv, blocking and non-blocking.
  {
    const int next = (r + 1) % n, prev = (r + n - 1) % n;
    int32_t out = r * 7, in = -1;
    c.sendrecv(&out, 4, next, &in, 4, prev);
    if (check) {
      EXPECT_EQ(in, prev * 7);
    }
    int32_t in2 = -1;
    auto w = c.isendrecv(&out, 4, prev, &in2, 4, next);
    w->wait();
    if (check) {
      EXPECT_EQ(in2, next * 7);
    }
  }
  c.barrier();
}

TEST(Comm, CollectivesGiveExactResults) {
  exercise(world(), true);
}

TEST(Comm, FakeBackendCountsWhatMpiCounts) {
  Communicator& w = world();
  w.reset_stats();
  exercise(w, true);
  FakeCommunicator fake(w.rank(), w.size());
  exercise(fake, false);
  for (int op = 0; op < kNumCommOps; ++op) {
    EXPECT_EQ(fake.stats().calls[size_t(op)], w.stats().calls[size_t(op)])
        << comm_op_name(CommOp(op));
    EXPECT_EQ(fake.stats().bytes_sent[size_t(op)], w.stats().bytes_sent[size_t(op)])
        << comm_op_name(CommOp(op));
  }
  // all_to_all of 3 ints per rank: 12 bytes to each other rank.
  EXPECT_EQ(w.stats().bytes_of(CommOp::kAllToAll), 12 * (w.size() - 1));
}

TEST(Comm, SplitIntoGridGroups) {
  Communicator& w = world();
  const int n = w.size();
  const int u = n >= 4 ? 2 : 1;  // groups of u consecutive ranks, and the orthogonal groups
  auto row = w.split(w.rank() / u, w.rank() % u, u);
  auto col = w.split(w.rank() % u, w.rank() / u, n / u);
  EXPECT_EQ(row->size(), u);
  EXPECT_EQ(row->rank(), w.rank() % u);
  EXPECT_EQ(col->size(), n / u);
  EXPECT_EQ(col->rank(), w.rank() / u);
  // Sum of world ranks within each group.
  float s = float(w.rank());
  row->all_reduce(&s, 1, DType::kF32, ReduceOp::kSum);
  const int base = w.rank() / u * u;
  EXPECT_EQ(s, float(u * base + u * (u - 1) / 2));
  exercise(*row, true);
  exercise(*col, true);
}

// A group's traffic also shows in the counters of the communicator it was split from (a
// strategy's sub-group traffic is part of the CP group's volume), for both backends.
TEST(Comm, SplitGroupsCountTowardTheirParent) {
  Communicator& w = world();
  const int n = w.size(), u = n % 2 == 0 ? 2 : 1;
  FakeCommunicator fake(w.rank(), n);
  for (Communicator* c : {&w, static_cast<Communicator*>(&fake)}) {
    auto row = c->split(c->rank() / u, c->rank() % u, u);
    auto col = row->split(0, row->rank(), u);  // a group of a group
    c->reset_stats();
    int32_t out = 1, in = 0;
    col->sendrecv(&out, 4, (col->rank() + 1) % u, &in, 4, (col->rank() + u - 1) % u);
    std::vector<int32_t> send(size_t(2 * u), 3), recv(send.size());
    row->all_to_all(send.data(), recv.data(), 8);
    EXPECT_EQ(c->stats().calls_of(CommOp::kSendRecv), 1);
    EXPECT_EQ(c->stats().bytes_of(CommOp::kSendRecv), u > 1 ? 4 : 0);
    EXPECT_EQ(c->stats().calls_of(CommOp::kAllToAll), 1);
    EXPECT_EQ(c->stats().bytes_of(CommOp::kAllToAll), 8 * (u - 1));
    EXPECT_EQ(row->stats().calls_of(CommOp::kSendRecv), 1);
  }
}

TEST(Comm, LargeMessageUsesUnitDatatype) {
  Communicator& w = world();
  if (w.size() > 1) GTEST_SKIP() << "memory-heavy (4 GiB); runs on one rank";
  // 2 GiB + 4 KiB per rank exceeds an int byte count.
  const int64_t bytes = (int64_t(1) << 31) + 4096;
  std::vector<uint8_t> send(size_t(bytes) * size_t(w.size())), recv(send.size());
  for (int j = 0; j < w.size(); ++j)
    send[size_t(j) * size_t(bytes) + size_t(bytes) - 1] = uint8_t(10 * w.rank() + j);
  w.all_to_all(send.data(), recv.data(), bytes);
  for (int j = 0; j < w.size(); ++j)
    EXPECT_EQ(recv[size_t(j) * size_t(bytes) + size_t(bytes) - 1], uint8_t(10 * j + w.rank()));
}

}  // namespace
}  // namespace upipe
