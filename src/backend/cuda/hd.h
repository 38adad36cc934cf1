// UPIPE_HD marks per-element math that is compiled twice: by nvcc for the CUDA kernels and by the
// host compiler for the unit tests that check it against src/backend/reference/ on the CPU.
// Headers that use it include nothing heavier than <cmath>, <cstdint> and dev_view.h, so nvcc
// never sees fmt, Highway or the arenas.
#pragma once

#if defined(__CUDACC__)
#define UPIPE_HD __host__ __device__ __forceinline__
#else
#define UPIPE_HD inline
#endif
