// Error checks for the NCCL and CUDA runtime calls of comm/nccl: a failing status throws
// upipe::Error naming the call, the status text (ncclGetErrorString / cudaGetErrorString, plus
// NCCL's last-error detail) and the source line, so a communication fault ends the job by the
// same path as every other error. comm keeps its own checks because backend/cuda/cuda_check.h
// is above it (core <- comm, backend). Included by .cpp files only: it pulls in the CUDA headers.
#pragma once

#include <cuda_runtime_api.h>
#include <nccl.h>

namespace upipe::nccl {

[[noreturn]] void fail_nccl(ncclResult_t rc, const char* expr, const char* file, int line);
[[noreturn]] void fail_cuda(cudaError_t rc, const char* expr, const char* file, int line);

}  // namespace upipe::nccl

#define UPIPE_NCCL_CHECK(expr)                                             \
  do {                                                                     \
    const ncclResult_t upipe_nccl_rc_ = (expr);                            \
    if (upipe_nccl_rc_ != ncclSuccess)                                     \
      ::upipe::nccl::fail_nccl(upipe_nccl_rc_, #expr, __FILE__, __LINE__); \
  } while (0)
#define UPIPE_COMM_CUDA_CHECK(expr)                                             \
  do {                                                                          \
    const cudaError_t upipe_comm_cuda_rc_ = (expr);                             \
    if (upipe_comm_cuda_rc_ != cudaSuccess)                                     \
      ::upipe::nccl::fail_cuda(upipe_comm_cuda_rc_, #expr, __FILE__, __LINE__); \
  } while (0)
