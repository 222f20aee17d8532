/* Stand-in for CUDA's cuda_bf16.h (see cuda_runtime.h here): only the type name. */
#ifndef FERROCCL_FAKE_CUDA_BF16_H
#define FERROCCL_FAKE_CUDA_BF16_H
typedef struct { unsigned short x; } __nv_bfloat16;
#endif
