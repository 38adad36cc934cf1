#include "attention/ring_pass.h"

#include <utility>

#include "backend/attention.h"
#include "backend/tensor_ops.h"

namespace upipe {
namespace {

// Calls fn(q_row0, k_row0, problem rows and positions) for every pair of a query run of `mine`
// and a key run of `theirs` in which some key is visible to some query.
template <class Fn>
void for_each_visible_pair(const RowPositions& mine, const RowPositions& theirs, Fn&& fn) {
  int64_t qr = 0;
  for (const RowPositions::Run& a : mine.runs) {
    int64_t kr = 0;
    for (const RowPositions::Run& b : theirs.runs) {
      if (b.pos <= a.pos + a.rows - 1) fn(qr, a, kr, b);
      kr += b.rows;
    }
    qr += a.rows;
  }
}

AttnProblem pair_problem(const Mat& q, const Mat& k, const Mat& v, int hq, int hk, int d,
                         int64_t qr, const RowPositions::Run& a, int64_t kr,
                         const RowPositions::Run& b) {
  AttnProblem p{q.rows_of(qr, a.rows), k.rows_of(kr, b.rows), v.rows_of(kr, b.rows), hq, hk, d};
  p.q_pos0 = a.pos;
  p.k_pos0 = b.pos;
  return p;
}

// Calls fn like for_each_visible_pair for the blocks of this member (`me`) and member `src`:
// with documents once for the whole blocks (when any key is visible), else per visible pair of
// runs.
template <class Fn>
void for_each_step_call(const RingGeometry& ring, int me, int src, Fn&& fn) {
  const RowPositions mine = ring.layout.positions(me);
  const RowPositions theirs = ring.layout.positions(src);
  if (!ring.mask) return for_each_visible_pair(mine, theirs, fn);
  if (!ring.mask->any_visible(size_t(me), size_t(src))) return;
  fn(0, RowPositions::Run{mine.total_rows(), 0}, 0, RowPositions::Run{theirs.total_rows(), 0});
}

// The kernel problem of one call; with documents rows qr.. and kr.. of the members' lists.
AttnProblem step_problem(const RingGeometry& ring, int me, int src, const Mat& q, const Mat& k,
                         const Mat& v, int hq, int hk, int d, int64_t qr,
                         const RowPositions::Run& a, int64_t kr, const RowPositions::Run& b) {
  AttnProblem p = pair_problem(q, k, v, hq, hk, d, qr, a, kr, b);
  if (ring.mask) {
    p.q_docs = ring.mask->list(size_t(me)).shifted(qr);
    p.k_docs = ring.mask->list(size_t(src)).shifted(kr);
  }
  return p;
}

Mat half(const Buffer& buf, int i, int64_t n, int64_t cols, DType t) {
  return Mat{static_cast<char*>(buf.data()) + i * mat_bytes(n, cols, t), t, n, cols, cols};
}

}  // namespace

int kv_ring_slots(int members) {
  return members > 1 ? 2 : 1;
}
int dkv_ring_buffers(int members) {
  return members > 1 ? 3 : 1;
}

KvRing::KvRing(Device& dev, int members, int64_t n, int64_t kv_cols, DType t)
    : n_(n), cols_(kv_cols), t_(t) {
  for (int i = 0; i < kv_ring_slots(members); ++i)
    slot_[i] = Buffer(dev.mem(), ring_block_bytes(n, kv_cols, t), Tag::kRing);
}

Mat KvRing::k() const {
  return half(slot_[cur_], 0, n_, cols_, t_);
}
Mat KvRing::v() const {
  return half(slot_[cur_], 1, n_, cols_, t_);
}

std::unique_ptr<Work> KvRing::start(Communicator& comm) {
  const int c = comm.size(), me = comm.rank();
  const int64_t bytes = slot_[cur_].bytes();
  return comm.isendrecv(slot_[cur_].data(), bytes, (me + 1) % c, slot_[1 - cur_].data(), bytes,
                        (me + c - 1) % c);
}

void KvRing::finish(std::unique_ptr<Work>& w) {
  w->wait();
  w.reset();
  cur_ = 1 - cur_;
}

void KvRing::reset() {
  slot_[0].reset();
  slot_[1].reset();
  cur_ = 0;
}

Mat ring_dk(const Buffer& dkv, int64_t n, int64_t kv_cols) {
  return half(dkv, 0, n, kv_cols, DType::kF32);
}
Mat ring_dv(const Buffer& dkv, int64_t n, int64_t kv_cols) {
  return half(dkv, 1, n, kv_cols, DType::kF32);
}

void ring_forward(Device& dev, const RingGeometry& ring, const Mat& q, int hq, int hk, int d,
                  KvRing& kv, bool come_home, const Mat& acc, const Mat& m, const Mat& l) {
  const int c = ring.comm.size(), me = ring.comm.rank();
  for (int i = 0; i < c; ++i) {
    std::unique_ptr<Work> w;
    if (c > 1 && (i + 1 < c || come_home)) w = kv.start(ring.comm);
    const Mat k = kv.k(), v = kv.v();
    const int src = (me - i + c) % c;
    for_each_step_call(
        ring, me, src,
        [&](int64_t qr, const RowPositions::Run& a, int64_t kr, const RowPositions::Run& b) {
          attention_forward_accumulate(
              dev, step_problem(ring, me, src, q, k, v, hq, hk, d, qr, a, kr, b),
              acc.rows_of(qr, a.rows), m.cols_of(qr, a.rows), l.cols_of(qr, a.rows));
        });
    if (w) kv.finish(w);
  }
}

Buffer ring_backward(Device& dev, const RingGeometry& ring, const Mat& q, const Mat& dout,
                     const Mat& lse, const Mat& delta, int hq, int hk, int d, KvRing& kv,
                     const Mat& dq, const Mat& o) {
  Communicator& comm = ring.comm;
  const int c = comm.size(), me = comm.rank(), next = (me + 1) % c, prev = (me + c - 1) % c;
  const int64_t n = q.rows, cols = int64_t(hk) * d;
  Buffer dkv[3];
  for (int i = 0; i < dkv_ring_buffers(c); ++i)
    dkv[i] = Buffer(dev.mem(), ring_block_bytes(n, cols, DType::kF32), Tag::kRing);
  // blk: this step's contribution; sent: the accumulator in flight to `next`; recv: the one
  // arriving from `prev` for the block this member holds.
  int blk = 0, sent = 1, recv = 2;
  std::unique_ptr<Work> dkv_work;
  for (int i = 0; i < c; ++i) {
    std::unique_ptr<Work> kv_work;
    if (i + 1 < c) kv_work = kv.start(comm);
    const Mat k = kv.k(), v = kv.v();
    const Mat dk = ring_dk(dkv[blk], n, cols), dv = ring_dv(dkv[blk], n, cols);
    zero(dev, dk);
    zero(dev, dv);
    const int src = (me - i + c) % c;
    for_each_step_call(
        ring, me, src,
        [&](int64_t qr, const RowPositions::Run& a, int64_t kr, const RowPositions::Run& b) {
          attention_backward(dev, step_problem(ring, me, src, q, k, v, hq, hk, d, qr, a, kr, b),
                             dout.rows_of(qr, a.rows), lse.cols_of(qr, a.rows),
                             delta.cols_of(qr, a.rows), dq.rows_of(qr, a.rows),
                             dk.rows_of(kr, b.rows), dv.rows_of(kr, b.rows),
                             o.data ? o.rows_of(qr, a.rows) : Mat{});
        });
    if (dkv_work) {
      dkv_work->wait();
      add_into(dev, dk, ring_dk(dkv[recv], n, cols));
      add_into(dev, dv, ring_dv(dkv[recv], n, cols));
    }
    if (c > 1) {
      const int64_t bytes = dkv[blk].bytes();
      dkv_work = comm.isendrecv(dkv[blk].data(), bytes, next, dkv[sent].data(), bytes, prev);
      blk = std::exchange(recv, std::exchange(sent, blk));
    }
    if (kv_work) kv.finish(kv_work);
  }
  if (dkv_work) dkv_work->wait();
  return std::move(dkv[c > 1 ? recv : blk]);
}

void add_ring_forward_comm(CommStats& st, int members, int64_t n, int64_t kv_cols, DType t,
                           bool come_home) {
  if (members == 1) return;
  const int hops = come_home ? members : members - 1;
  for (int i = 0; i < hops; ++i) st.add(CommOp::kSendRecv, ring_block_bytes(n, kv_cols, t));
}

void add_ring_backward_comm(CommStats& st, int members, int64_t n, int64_t kv_cols, DType t) {
  if (members == 1) return;
  for (int i = 0; i + 1 < members; ++i) st.add(CommOp::kSendRecv, ring_block_bytes(n, kv_cols, t));
  for (int i = 0; i < members; ++i)
    st.add(CommOp::kSendRecv, ring_block_bytes(n, kv_cols, DType::kF32));
}

}  // namespace upipe
