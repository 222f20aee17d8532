/* Stand-in for CUDA's cuda_fp16.h (see cuda_runtime.h here): only the type name. */
#ifndef FERROCCL_FAKE_CUDA_FP16_H
#define FERROCCL_FAKE_CUDA_FP16_H
typedef struct { unsigned short x; } half;
#endif
