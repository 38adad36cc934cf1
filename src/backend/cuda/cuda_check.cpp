#include "backend/cuda/cuda_check.h"

#include <cublasLt.h>
#include <cuda_runtime_api.h>
#include <fmt/format.h>

#include "core/errors.h"

namespace upipe::cuda {

void fail_cuda(int status, const char* expr, const char* file, int line) {
  throw Error(fmt::format("CUDA error {} ({}) in {} at {}:{}", status,
                          cudaGetErrorString(static_cast<cudaError_t>(status)), expr, file, line));
}

void fail_cublas(int status, const char* expr, const char* file, int line) {
  throw Error(fmt::format("cuBLAS error {} ({}) in {} at {}:{}", status,
                          cublasLtGetStatusString(static_cast<cublasStatus_t>(status)), expr, file,
                          line));
}

}  // namespace upipe::cuda
