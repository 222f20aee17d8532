// Device-to-device copy bandwidth on the current GPU: the memory-bandwidth ceiling the GPU
// path is measured against (bytes read plus bytes written per second). Median of 20 timed
// copies after 3 warm-ups, timed with CUDA events. Then the same for cudaMemset (bytes written
// per second): the ceiling of write-heavy traffic, such as an all-gather or broadcast of many
// ranks sharing the GPU (one read, P writes).
//   nvcc -O2 -gencode=arch=compute_90,code=sm_90 copy_bw.cu -o copy_bw && ./copy_bw [MiB]
#include <cuda_runtime.h>
#include <stdio.h>
#include <stdlib.h>
#include <algorithm>
#include <vector>

#define CHECK(x) do { cudaError_t e = (x); if (e != cudaSuccess) { \
  fprintf(stderr, "%s: %s\n", #x, cudaGetErrorString(e)); return 1; } } while (0)

// Median of 20 timed runs of `op` after 3 warm-ups, in ms (CUDA events on the default stream).
template <typename F>
static float median_ms(F op) {
  cudaEvent_t start, stop;
  cudaEventCreate(&start);
  cudaEventCreate(&stop);
  std::vector<float> ms;
  for (int i = 0; i < 23; i++) {
    cudaEventRecord(start);
    op(i);
    cudaEventRecord(stop);
    cudaEventSynchronize(stop);
    float t;
    cudaEventElapsedTime(&t, start, stop);
    if (i >= 3) ms.push_back(t);
  }
  std::sort(ms.begin(), ms.end());
  return ms[ms.size() / 2];
}

int main(int argc, char** argv) {
  size_t mib = argc > 1 ? strtoull(argv[1], NULL, 10) : 1024;
  size_t bytes = mib << 20;
  void *a, *b;
  CHECK(cudaMalloc(&a, bytes));
  CHECK(cudaMalloc(&b, bytes));
  CHECK(cudaMemset(a, 1, bytes));
  float med = median_ms([&](int) { cudaMemcpy(b, a, bytes, cudaMemcpyDeviceToDevice); });
  CHECK(cudaGetLastError());
  printf("copy %zu MiB device-to-device: median %.3f ms, %.1f GB/s each way, %.1f GB/s read+written\n",
         mib, med, bytes / med / 1e6, 2.0 * bytes / med / 1e6);
  med = median_ms([&](int i) { cudaMemset(b, i, bytes); });
  CHECK(cudaGetLastError());
  printf("memset %zu MiB: median %.3f ms, %.1f GB/s written\n", mib, med, bytes / med / 1e6);
  return 0;
}
