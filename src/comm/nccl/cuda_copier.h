// The DeviceCopier of the staged communicator on a GPU (comm/staged/staged_comm.h): copies are
// cudaMemcpyAsync on the compute stream, so they follow the kernels that produced the inputs and
// precede the kernels that read the results, without the host waiting on anything but sync();
// staging memory is pinned (cudaMallocHost), which asynchronous copies at full bandwidth need.
// It lives in comm's CUDA library (upipe_nccl), not in the backend, so comm depends on nothing
// above core.
#pragma once

#include "comm/staged/staged_comm.h"

struct CUstream_st;

namespace upipe {

class CudaCopier final : public DeviceCopier {
 public:
  // nullptr: the legacy default stream.
  explicit CudaCopier(CUstream_st* compute_stream) : stream_(compute_stream) {}
  void to_host(void* host, const void* dev, int64_t bytes) override;
  void to_device(void* dev, const void* host, int64_t bytes) override;
  void sync() override;
  void* alloc_host(int64_t bytes) override;
  void free_host(void* p, int64_t bytes) override;

 private:
  CUstream_st* stream_;
};

}  // namespace upipe
