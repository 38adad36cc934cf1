#include "attention/ring_core.h"

#include "attention/ring.h"
#include "attention/ring_pass.h"
#include "backend/tensor_ops.h"

namespace upipe {
namespace {

// The ring's K/V block holding this group's k, v views (n, hk*d).
KvRing fill_ring(Device& dev, int members, const AttnProblem& p) {
  KvRing kv(dev, members, p.k.rows, p.k.cols, p.k.dtype);
  copy(dev, kv.k(), p.k);
  copy(dev, kv.v(), p.v);
  return kv;
}

}  // namespace

RingCore::RingCore(Device& dev, std::unique_ptr<Communicator> ring, int64_t seq_len, int d, DType t)
    : dev_(dev),
      ring_(std::move(ring)),
      layout_{LayoutKind::kZigzag, seq_len, ring_->size(), 1},
      n_(seq_len / ring_->size()),
      d_(d),
      t_(t) {}

void RingCore::set_documents(std::shared_ptr<const Documents> docs) {
  layout_ = with_documents(SeqLayout{LayoutKind::kZigzag, layout_.seq_len, ring_->size(), 1},
                           std::move(docs));
}

std::vector<RowPositions> RingCore::mask_views(const Documents& d) const {
  UPIPE_CHECK(layout_.docs.get() == &d, "ring core: mask views of documents it was not given");
  return member_rows(layout_);
}

void RingCore::forward(const AttnProblem& p, const DocMask* mask, const Mat& o, const Mat& lse) {
  UPIPE_CHECK(p.q.rows == n_ && p.k.rows == n_, "ring core holds {} rows, got q {} and k {}", n_,
              p.q.rows, p.k.rows);
  Arena& mem = dev_.mem();
  KvRing kv = fill_ring(dev_, ring_->size(), p);
  Tensor acc(mem, Tag::kAttnOut, DType::kF32, n_, p.q.cols);
  Tensor m(mem, Tag::kAttnOut, DType::kF32, p.hq, n_);
  Tensor l(mem, Tag::kAttnOut, DType::kF32, p.hq, n_);
  attention_accumulate_init(dev_, acc, m, l);
  ring_forward(dev_, {*ring_, layout_, mask}, p.q, p.hq, p.hk, p.d, kv, false, acc, m, l);
  attention_finalize(dev_, acc, m, l, p.d, o, lse);
}

void RingCore::backward(const AttnProblem& p, const DocMask* mask, const Mat& dout, const Mat& lse,
                        const Mat& delta, const Mat& dq, const Mat& dk, const Mat& dv,
                        const Mat& o) {
  UPIPE_CHECK(p.q.rows == n_ && p.k.rows == n_, "ring core holds {} rows, got q {} and k {}", n_,
              p.q.rows, p.k.rows);
  KvRing kv = fill_ring(dev_, ring_->size(), p);
  const Buffer home = ring_backward(dev_, {*ring_, layout_, mask}, p.q, dout, lse, delta, p.hq,
                                    p.hk, p.d, kv, dq, o);
  add_into(dev_, dk, ring_dk(home, n_, p.k.cols));
  add_into(dev_, dv, ring_dv(home, n_, p.k.cols));
}

int64_t RingCore::forward_bytes(int hq, int hk) const {
  const int r = ring_->size();
  const int64_t kv_cols = int64_t(hk) * d_;
  return kv_ring_slots(r) * ring_block_bytes(n_, kv_cols, t_) +
         mat_bytes(n_, int64_t(hq) * d_, DType::kF32) + 2 * mat_bytes(hq, n_, DType::kF32) +
         attention_fwd_workspace_bytes(dev_.backend(), hq, hk, d_, t_);
}

int64_t RingCore::backward_bytes(int hq, int hk) const {
  const int r = ring_->size();
  const int64_t kv_cols = int64_t(hk) * d_;
  return kv_ring_slots(r) * ring_block_bytes(n_, kv_cols, t_) +
         dkv_ring_buffers(r) * ring_block_bytes(n_, kv_cols, DType::kF32) +
         attention_bwd_workspace_bytes(dev_.backend(), hq, hk, d_, t_);
}

void RingCore::add_forward_comm(CommStats& st, int, int hk) const {
  add_ring_forward_comm(st, ring_->size(), n_, int64_t(hk) * d_, t_, false);
}

void RingCore::add_backward_comm(CommStats& st, int, int hk) const {
  add_ring_backward_comm(st, ring_->size(), n_, int64_t(hk) * d_, t_);
}

}  // namespace upipe
