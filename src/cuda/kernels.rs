//! Reduction and copy kernels for device memory (CUDA C compiled by NVRTC at first use).
