#include "backend/cuda/param_block.h"

#include <cuda_runtime_api.h>

#include "backend/cuda/cuda_check.h"

namespace upipe::cuda {

ParamBlock::ParamBlock() {
  UPIPE_CUDA_CHECK(cudaHostAlloc(&host_, size_t(kBytes), cudaHostAllocMapped));
  UPIPE_CUDA_CHECK(cudaHostGetDevicePointer(&device_, host_, 0));
}

ParamBlock::~ParamBlock() {
  if (host_ != nullptr) cudaFreeHost(host_);
}

}  // namespace upipe::cuda
