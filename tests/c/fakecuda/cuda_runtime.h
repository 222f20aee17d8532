/* Minimal stand-in for CUDA's cuda_runtime.h: just enough to prove that nccl.h compiles when
 * the CUDA headers were included first (same cudaStream_t definition as CUDA's driver_types.h). */
#ifndef FERROCCL_FAKE_CUDA_RUNTIME_H
#define FERROCCL_FAKE_CUDA_RUNTIME_H
#define CUDART_VERSION 13000
typedef struct CUstream_st* cudaStream_t;
#endif
