// The head core of USP and UPipe+ring: attention for the query heads a rank holds after its
// Ulysses group's all-to-all, over the whole sequence, by a ring pass (ring_pass.h) across the
// r groups. The group's n = S/r rows are its zigzag shard over r groups, in order (the zigzag
// grid layout arranges the members' shards so the all-to-all assembles exactly that). Each
// call copies the K/V heads it reads into the rotating ring block, so a resident UPipe KV set
// is never disturbed; K/V therefore travel the ring once per call (per stage). With packed
// documents the groups' rows are the documents' placement over the r groups (layout.h), and the
// mask the strategy builds once per forward or backward has one list per group (mask_views).
#pragma once

#include <memory>

#include "attention/head_core.h"
#include "attention/layout.h"

namespace upipe {

class RingCore final : public HeadCore {
 public:
  // ring: the communicator across the r groups (its rank is this rank's group index).
  RingCore(Device& dev, std::unique_ptr<Communicator> ring, int64_t seq_len, int d, DType t);
  void forward(const AttnProblem& p, const DocMask* mask, const Mat& o, const Mat& lse) override;
  void backward(const AttnProblem& p, const DocMask* mask, const Mat& dout, const Mat& lse,
                const Mat& delta, const Mat& dq, const Mat& dk, const Mat& dv,
                const Mat& o) override;
  void set_documents(std::shared_ptr<const Documents> docs) override;
  std::vector<RowPositions> mask_views(const Documents& d) const override;
  int64_t forward_bytes(int hq, int hk) const override;
  int64_t backward_bytes(int hq, int hk) const override;
  void add_forward_comm(CommStats& st, int hq, int hk) const override;
  void add_backward_comm(CommStats& st, int hq, int hk) const override;
  bool merges_partials() const override { return true; }

 private:
  Device& dev_;
  std::unique_ptr<Communicator> ring_;
  SeqLayout layout_;  // zigzag over the r groups, or the documents' placement over them
  int64_t n_;         // S / r
  int d_;
  DType t_;
};

}  // namespace upipe
