// Error checks for CUDA runtime, cuBLAS(Lt), cuDNN and NCCL calls: a failing status throws
// upipe::Error naming the call, the status text and the source line (cuda_check.cpp), so a GPU
// fault ends the job by the same path as every other error, never silently.
#pragma once

namespace upipe::cuda {

[[noreturn]] void fail_cuda(int status, const char* expr, const char* file, int line);
[[noreturn]] void fail_cublas(int status, const char* expr, const char* file, int line);

}  // namespace upipe::cuda

#define UPIPE_CUDA_CHECK(expr)                                                 \
  do {                                                                         \
    const int upipe_cuda_status_ = static_cast<int>(expr);                     \
    if (upipe_cuda_status_ != 0)                                               \
      ::upipe::cuda::fail_cuda(upipe_cuda_status_, #expr, __FILE__, __LINE__); \
  } while (0)
#define UPIPE_CUBLAS_CHECK(expr)                                                   \
  do {                                                                             \
    const int upipe_cublas_status_ = static_cast<int>(expr);                       \
    if (upipe_cublas_status_ != 0)                                                 \
      ::upipe::cuda::fail_cublas(upipe_cublas_status_, #expr, __FILE__, __LINE__); \
  } while (0)
