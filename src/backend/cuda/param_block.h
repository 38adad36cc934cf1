// The CUDA backend's parameter block: a fixed-size piece of pinned, mapped host memory
// (cudaHostAllocMapped) through which ops pass what does not fit a kernel's arguments (the
// labels of a cross-entropy tile, the ids of the embedding's rows) and return host scalars (a loss
// sum, a sum of squares). It is the GPU's counterpart of the CPU ops' fixed stack buffers: host
// memory outside both arenas, of a size that depends on nothing (kBytes), so the device arena's
// accounting stays exact. An op that uses it synchronises its stream before it returns, so the next
// op may reuse it.
#pragma once

#include <cstdint>

namespace upipe::cuda {

class ParamBlock {
 public:
  static constexpr int64_t kBytes = int64_t(1) << 20;
  ParamBlock();
  ~ParamBlock();
  ParamBlock(const ParamBlock&) = delete;
  ParamBlock& operator=(const ParamBlock&) = delete;
  void* host() const { return host_; }      // the host's address of the block
  void* device() const { return device_; }  // the same bytes as kernels see them
  static constexpr int64_t bytes() { return kBytes; }

 private:
  void* host_ = nullptr;
  void* device_ = nullptr;
};

}  // namespace upipe::cuda
