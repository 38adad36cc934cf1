#include "comm/nccl/cuda_copier.h"

#include <cstdio>

#include "comm/nccl/nccl_check.h"
#include "core/check.h"
#include "core/watchdog.h"

namespace upipe {

void CudaCopier::to_host(void* host, const void* dev, int64_t bytes) {
  UPIPE_COMM_CUDA_CHECK(cudaMemcpyAsync(host, dev, size_t(bytes), cudaMemcpyDefault, stream_));
}

void CudaCopier::to_device(void* dev, const void* host, int64_t bytes) {
  UPIPE_COMM_CUDA_CHECK(cudaMemcpyAsync(dev, host, size_t(bytes), cudaMemcpyDefault, stream_));
}

void CudaCopier::sync() {
  WatchdogOp scope("staging copy");
  UPIPE_COMM_CUDA_CHECK(cudaStreamSynchronize(stream_));
}

void* CudaCopier::alloc_host(int64_t bytes) {
  void* p = nullptr;
  UPIPE_COMM_CUDA_CHECK(cudaMallocHost(&p, size_t(bytes)));
  return p;
}

void CudaCopier::free_host(void* p, int64_t) {
  const cudaError_t rc = cudaFreeHost(p);
  if (rc != cudaSuccess)
    std::fprintf(stderr, "[rank %d] cudaFreeHost failed: %s\n", log_rank(), cudaGetErrorString(rc));
}

}  // namespace upipe
