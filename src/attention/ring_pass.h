// The ring pass that ring attention and the ring core of USP / UPipe+ring share. The members of
// a ring communicator each hold the query rows and one K/V block of a zigzag token set (member
// i: chunks i and 2M-1-i of the sequence cut into 2M chunks, M members); the K/V blocks travel
// around the ring (member i sends to i+1, receives from i-1), double-buffered, so the transfer
// of the next block overlaps the attention on the current one.
//   forward:  online-softmax accumulation into the caller's (acc, m, l) over the M blocks; with
//             come_home the blocks make one more hop, so every member ends with its own block
//             again (the backward needs it and it costs no memory: the hop overlaps the last
//             block's attention).
//   backward: K/V travel with fp32 dK/dV accumulators. Each step a member computes its
//             contribution for the block it holds into a zeroed buffer while the accumulator
//             for that block arrives from the previous member, adds it, and sends the sum on;
//             after M steps each accumulator is home. Three accumulator buffers (computing,
//             sending, receiving) let the dK/dV transfer overlap the next step's attention.
// Only (query chunk, key chunk) pairs with a visible key are given to the kernel, with their
// global positions, so causal masking is by global position. With packed documents the members'
// rows are the documents' placement (layout.h) and each step is one kernel call on the whole
// blocks with their document lists (the mask: one list per member), skipped when no query row
// of the member shares a document with an earlier-or-equal key of the block; a row without a
// visible key in a step adds nothing to its online softmax (the merge is -inf safe). Sizes are
// pure functions below; the strategies' memory formulas use them.
#pragma once

#include <cstdint>
#include <memory>

#include "attention/documents.h"
#include "attention/layout.h"
#include "backend/device.h"
#include "comm/communicator.h"
#include "core/tensor.h"

namespace upipe {

// The ring: its communicator (member index = rank) and the zigzag layout of its members' rows;
// with packed documents, the mask of the members' rows (list i: member i's).
struct RingGeometry {
  Communicator& comm;
  SeqLayout layout;               // zigzag over comm.size() members
  const DocMask* mask = nullptr;  // null: one document
};

// Rotating K/V blocks: [k (n, kv_cols) | v (n, kv_cols)] in the block dtype, tag ring; two slots
// (current, incoming), one on a ring of one member.
class KvRing {
 public:
  KvRing() = default;
  KvRing(Device& dev, int members, int64_t n, int64_t kv_cols, DType t);
  Mat k() const;  // (n, kv_cols) of the current slot
  Mat v() const;
  // Sends the current slot to the next member and receives the previous member's block into
  // the other slot; finish() waits and makes the received block current.
  std::unique_ptr<Work> start(Communicator& comm);
  void finish(std::unique_ptr<Work>& w);
  void reset();

 private:
  Buffer slot_[2];
  int cur_ = 0;
  int64_t n_ = 0, cols_ = 0;
  DType t_ = DType::kF32;
};

int kv_ring_slots(int members);     // 2, or 1 on a ring of one
int dkv_ring_buffers(int members);  // 3, or 1 on a ring of one
// One [k | v] block of n rows and kv_cols columns per tensor.
inline int64_t ring_block_bytes(int64_t n, int64_t kv_cols, DType t) {
  return 2 * mat_bytes(n, kv_cols, t);
}

// q: (n, hq*d); kv holds this member's block, RoPE applied. Accumulates attention over every
// member's block into acc (n, hq*d) fp32 and m, l (hq, n) fp32 (attention_accumulate_init before,
// attention_finalize after). Allocates only the kernel's workspace.
void ring_forward(Device& dev, const RingGeometry& ring, const Mat& q, int hq, int hk, int d,
                  KvRing& kv, bool come_home, const Mat& acc, const Mat& m, const Mat& l);

// q, dout: (n, hq*d); lse, delta: (hq, n) fp32, final over all keys; kv holds this member's
// block. Accumulates dq (n, hq*d) fp32 and returns this member's dK/dV, summed over the ring, as
// an fp32 buffer [dk (n, hk*d) | dv (n, hk*d)] (tag ring). Allocates dkv_ring_buffers() such
// buffers (one is returned) and the kernel's workspace. o: the forward's output (n, hq*d), or
// empty where the caller has freed it (attention_backward).
Buffer ring_backward(Device& dev, const RingGeometry& ring, const Mat& q, const Mat& dout,
                     const Mat& lse, const Mat& delta, int hq, int hk, int d, KvRing& kv,
                     const Mat& dq, const Mat& o = {});

// Views of the dk and dv halves of a buffer ring_backward returned.
Mat ring_dk(const Buffer& dkv, int64_t n, int64_t kv_cols);
Mat ring_dv(const Buffer& dkv, int64_t n, int64_t kv_cols);

// Point-to-point calls and bytes one member sends in a ring pass of blocks of n rows.
void add_ring_forward_comm(CommStats& st, int members, int64_t n, int64_t kv_cols, DType t,
                           bool come_home);
void add_ring_backward_comm(CommStats& st, int members, int64_t n, int64_t kv_cols, DType t);

}  // namespace upipe
