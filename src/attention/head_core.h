// The attention a head-sharded strategy runs after its forward all-to-all: on q (n, hq*d) and
// resident k, v (n, hk*d) over the n tokens its all-to-all group holds. LocalCore calls the
// kernel on the whole sequence (Ulysses, UPipe); a ring core (USP, UPipe+ring) rotates K/V
// between groups. The core also reports the device bytes it allocates and the messages it
// sends, for the formulas. With packed documents the strategy builds the mask metadata of the
// core's views once per forward or backward (mask_views) and hands it to every call.
#pragma once

#include <memory>
#include <vector>

#include "attention/documents.h"
#include "backend/attention.h"
#include "backend/device.h"
#include "comm/communicator.h"

namespace upipe {

class HeadCore {
 public:
  virtual ~HeadCore() = default;
  // p.q, p.k, p.v are head-sharded views; positions in p are ignored by cores that know their
  // own token placement. mask: the documents' mask of mask_views (null: one document).
  virtual void forward(const AttnProblem& p, const DocMask* mask, const Mat& o, const Mat& lse) = 0;
  // Accumulates into fp32 dq, dk, dv. o: the forward's output rows of q (attention_backward).
  virtual void backward(const AttnProblem& p, const DocMask* mask, const Mat& dout, const Mat& lse,
                        const Mat& delta, const Mat& dq, const Mat& dk, const Mat& dv,
                        const Mat& o) = 0;
  // The documents of the following calls (null: one document); a core that places rows by them
  // (the ring core) refreshes its placement.
  virtual void set_documents(std::shared_ptr<const Documents>) {}
  // The global rows of each view the core's mask has a list for: the whole sequence in order for
  // a local core, every ring member's rows for a ring core.
  virtual std::vector<RowPositions> mask_views(const Documents& d) const = 0;
  // Peak bytes allocated inside one forward / backward call with hq query and hk KV heads.
  virtual int64_t forward_bytes(int hq, int hk) const = 0;
  virtual int64_t backward_bytes(int hq, int hk) const = 0;
  // Adds the calls and bytes one forward / backward call sends (none for a local core).
  virtual void add_forward_comm(CommStats&, int /*hq*/, int /*hk*/) const {}
  virtual void add_backward_comm(CommStats&, int /*hq*/, int /*hk*/) const {}
  // Whether results merge partial softmax results (the `check` tolerance rule, strategy.h).
  virtual bool merges_partials() const { return false; }
};

class LocalCore final : public HeadCore {
 public:
  LocalCore(Device& dev, int d, DType t) : dev_(dev), d_(d), t_(t) {}
  void forward(const AttnProblem& p, const DocMask* mask, const Mat& o, const Mat& lse) override;
  void backward(const AttnProblem& p, const DocMask* mask, const Mat& dout, const Mat& lse,
                const Mat& delta, const Mat& dq, const Mat& dk, const Mat& dv,
                const Mat& o) override;
  std::vector<RowPositions> mask_views(const Documents& d) const override;
  int64_t forward_bytes(int, int) const override;
  int64_t backward_bytes(int, int) const override;

 private:
  Device& dev_;
  int d_;
  DType t_;
};

}  // namespace upipe
