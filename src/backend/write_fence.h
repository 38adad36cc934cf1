// A buffer that asynchronous copies may still be reading (Device::copy_async: the offloaded stash
// saving the residual stream to the host while the layer's projections and attention run):
// whoever writes part of such a buffer calls before_write(region) first, which orders the write
// after every copy still reading those bytes. The copies run beside the work until the first
// write that needs them done, not until the first op. A null fence: no copy reads the buffer.
#pragma once

#include "core/tensor.h"

namespace upipe {

class WriteFence {
 public:
  // region: the rows about to be written (any view of the fenced buffer).
  virtual void before_write(const Mat& region) = 0;

 protected:
  ~WriteFence() = default;
};

inline void fence_write(WriteFence* fence, const Mat& region) {
  if (fence != nullptr) fence->before_write(region);
}

}  // namespace upipe
