/* Stand-in for CUDA's cuda_fp8.h (see cuda_runtime.h here): only the type names. */
#ifndef FERROCCL_FAKE_CUDA_FP8_H
#define FERROCCL_FAKE_CUDA_FP8_H
typedef struct { unsigned char x; } __nv_fp8_e4m3;
typedef struct { unsigned char x; } __nv_fp8_e5m2;
#endif
