#include "multirank/comm_checks.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <vector>

namespace upipe::test {
namespace {

// The value rank q contributes at element j of a reduction: a small integer, exact in fp32 and
// bf16 and in any sum of up to 8 of them, so every reduction order gives the same bits.
float reduce_input(int q, int j) {
  return float((3 * q + j) % 11);
}

float reduced(int n, int j, ReduceOp op) {
  float acc = reduce_input(0, j);
  for (int q = 1; q < n; ++q)
    acc = op == ReduceOp::kSum ? acc + reduce_input(q, j) : std::max(acc, reduce_input(q, j));
  return acc;
}

std::vector<uint8_t> reduce_inputs(int q, int count, DType t) {
  std::vector<float> v(static_cast<size_t>(count));
  for (int j = 0; j < count; ++j) v[size_t(j)] = reduce_input(q, j);
  std::vector<uint8_t> out(size_t(count) * size_t(dtype_size(t)));
  from_f32(v.data(), out.data(), t, count);
  return out;
}

std::vector<float> as_f32(const std::vector<uint8_t>& b, DType t) {
  std::vector<float> v(b.size() / size_t(dtype_size(t)));
  to_f32(b.data(), t, v.data(), int64_t(v.size()));
  return v;
}

// Each non-blocking collective against its blocking form on the same inputs (identical bytes)
// and against the predicted result; checks only when `check` (the fake backend moves no data).
void exercise_nonblocking(Communicator& c, bool check) {
  const int r = c.rank(), n = c.size(), per = 5;
  {
    std::vector<int32_t> send(size_t(n * per)), a(send.size(), -1), b(send.size(), -2);
    for (int i = 0; i < n * per; ++i) send[size_t(i)] = r * 1000 + i;
    c.all_to_all(send.data(), a.data(), per * 4);
    c.iall_to_all(send.data(), b.data(), per * 4)->wait();
    if (check) {
      EXPECT_EQ(a, b);
      for (int j = 0; j < n; ++j) EXPECT_EQ(b[size_t(j * per)], j * 1000 + r * per);
    }
  }
  {
    std::vector<int32_t> send(static_cast<size_t>(per)), a(size_t(n * per), -1), b(a.size(), -2);
    for (int k = 0; k < per; ++k) send[size_t(k)] = r * 1000 + k;
    c.all_gather(send.data(), a.data(), per * 4);
    c.iall_gather(send.data(), b.data(), per * 4)->wait();
    if (check) {
      EXPECT_EQ(a, b);
      for (int j = 0; j < n; ++j) EXPECT_EQ(b[size_t(j * per + per - 1)], j * 1000 + per - 1);
    }
  }
  for (DType t : {DType::kF32, DType::kBF16}) {
    for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kMax}) {
      const std::vector<uint8_t> send = reduce_inputs(r, n * per, t);
      std::vector<uint8_t> a(size_t(per) * size_t(dtype_size(t)), 0xAA), b(a.size(), 0x55);
      c.reduce_scatter(send.data(), a.data(), per, t, op);
      c.ireduce_scatter(send.data(), b.data(), per, t, op)->wait();
      if (check) {
        EXPECT_EQ(a, b) << dtype_name(t);
        const std::vector<float> got = as_f32(b, t);
        for (int k = 0; k < per; ++k)
          EXPECT_EQ(got[size_t(k)], reduced(n, r * per + k, op)) << dtype_name(t);
      }
      std::vector<uint8_t> x = reduce_inputs(r, per, t), y = x;
      c.all_reduce(x.data(), per, t, op);
      c.iall_reduce(y.data(), per, t, op)->wait();
      if (check) {
        EXPECT_EQ(x, y) << dtype_name(t);
        const std::vector<float> got = as_f32(y, t);
        for (int k = 0; k < per; ++k) EXPECT_EQ(got[size_t(k)], reduced(n, k, op)) << dtype_name(t);
      }
    }
  }
}

}  // namespace

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
  exercise_nonblocking(c, check);
  c.barrier();
}

void exercise_overlap(Communicator& c) {
  const int r = c.rank(), n = c.size(), per = 1 << 16;
  const size_t un = size_t(n), up = size_t(per);
  {
    // all-gather: element k of rank q is q*per + k. reduce-scatter (fp32 sum): element i of
    // rank q's input is (q+1) * (i % 97), so block r sums to n(n+1)/2 * ((r*per + k) % 97).
    std::vector<int32_t> gsend(up), grecv(un * up, -1);
    for (int k = 0; k < per; ++k) gsend[size_t(k)] = r * per + k;
    std::vector<float> rsend(un * up), rrecv(up, -1.0f);
    for (size_t i = 0; i < rsend.size(); ++i) rsend[i] = float((r + 1) * int(i % 97));
    auto gather = c.iall_gather(gsend.data(), grecv.data(), per * 4);
    auto scatter = c.ireduce_scatter(rsend.data(), rrecv.data(), per, DType::kF32, ReduceOp::kSum);
    scatter->wait();
    gather->wait();
    for (size_t i = 0; i < grecv.size(); ++i) ASSERT_EQ(grecv[i], int32_t(i)) << i;
    const float tri = float(n * (n + 1) / 2);
    for (int k = 0; k < per; ++k)
      ASSERT_EQ(rrecv[size_t(k)], tri * float((size_t(r) * up + size_t(k)) % 97)) << k;
  }
  {
    // Two all-to-alls: in the first, block j of rank q carries q*n + j; the second sends the
    // negation. Each received block holds its value in every element.
    std::vector<int32_t> s1(un * up), s2(un * up), r1(un * up, 0), r2(un * up, 0);
    for (int j = 0; j < n; ++j)
      for (int k = 0; k < per; ++k) {
        s1[size_t(j) * up + size_t(k)] = r * n + j;
        s2[size_t(j) * up + size_t(k)] = -(r * n + j);
      }
    auto w1 = c.iall_to_all(s1.data(), r1.data(), per * 4);
    auto w2 = c.iall_to_all(s2.data(), r2.data(), per * 4);
    w2->wait();
    w1->wait();
    w1->wait();  // waiting twice is allowed
    for (int j = 0; j < n; ++j)
      for (int k = 0; k < per; k += 1021) {
        ASSERT_EQ(r1[size_t(j) * up + size_t(k)], j * n + r);
        ASSERT_EQ(r2[size_t(j) * up + size_t(k)], -(j * n + r));
      }
  }
  {
    // A Work destroyed unfinished waits: the result is complete once the handle is gone.
    std::vector<float> v(up, float(r + 1));
    { auto w = c.iall_reduce(v.data(), per, DType::kF32, ReduceOp::kSum); }
    EXPECT_EQ(v[up - 1], float(n * (n + 1) / 2));
  }
}

void exercise_grid_split(Communicator& w) {
  const int n = w.size();
  const int u = n >= 4 ? 2 : 1;  // groups of u consecutive ranks, and the orthogonal groups
  auto row = w.split([u](int q) { return SplitKey{q / u, q % u}; });
  auto col = w.split([u](int q) { return SplitKey{q % u, q / u}; });
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

void expect_same_stats(const CommStats& got, const CommStats& want, const std::string& what) {
  for (int op = 0; op < kNumCommOps; ++op) {
    EXPECT_EQ(got.calls[size_t(op)], want.calls[size_t(op)])
        << what << ": " << comm_op_name(CommOp(op));
    EXPECT_EQ(got.bytes_sent[size_t(op)], want.bytes_sent[size_t(op)])
        << what << ": " << comm_op_name(CommOp(op));
  }
}

}  // namespace upipe::test
