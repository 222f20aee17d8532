// One source copied to P destinations on one GPU (what an all-gather or broadcast of P ranks
// sharing the GPU does: one read, P writes), in kernel variants, against the device copy and
// cudaMemset in the same run. Bandwidth counts bytes read plus bytes written.
//   base    grid-stride loop, one 16-byte load, P 16-byte stores (ferroccl's fold kernel today)
//   unroll4 four independent 16-byte loads in flight per thread before the stores
//   cs      base with streaming stores (st.global.cs: evict-first, the outputs are not re-read)
//   u4cs    unroll4 with streaming stores
// Launch shape as ferroccl: 256-thread blocks, 8 per SM.
//   nvcc -O2 -gencode=arch=compute_90,code=sm_90 fanout_bw.cu -o fanout_bw && ./fanout_bw [P] [MiB...]
#include <cuda_runtime.h>
#include <stdio.h>
#include <stdlib.h>
#include <algorithm>
#include <vector>

#define CHECK(x) do { cudaError_t e = (x); if (e != cudaSuccess) { \
  fprintf(stderr, "%s: %s\n", #x, cudaGetErrorString(e)); exit(1); } } while (0)

struct alignas(16) V16 { unsigned long long lo, hi; };
struct Outs { V16* p[16]; };

template <int UNROLL, bool STREAM>
__global__ void __launch_bounds__(256) fanout(const V16* __restrict__ src, Outs outs, int n_out, unsigned long long packs) {
  const unsigned long long start = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x;
  const unsigned long long stride = (unsigned long long)gridDim.x * blockDim.x;
  unsigned long long j = start;
  for (; j + (UNROLL - 1) * stride < packs; j += UNROLL * stride) {
    V16 v[UNROLL];
#pragma unroll
    for (int u = 0; u < UNROLL; ++u) v[u] = src[j + u * stride];
    for (int m = 0; m < n_out; ++m) {
#pragma unroll
      for (int u = 0; u < UNROLL; ++u) {
        V16* d = outs.p[m] + j + u * stride;
        if (STREAM) __stcs((float4*)d, *(float4*)&v[u]); else *d = v[u];
      }
    }
  }
  for (; j < packs; j += stride) {
    V16 v = src[j];
    for (int m = 0; m < n_out; ++m) {
      if (STREAM) __stcs((float4*)(outs.p[m] + j), *(float4*)&v); else outs.p[m][j] = v;
    }
  }
}

template <typename F>
static float median_ms(F launch) {
  cudaEvent_t a, b;
  CHECK(cudaEventCreate(&a));
  CHECK(cudaEventCreate(&b));
  std::vector<float> t;
  for (int i = 0; i < 13; i++) {
    CHECK(cudaEventRecord(a));
    launch();
    CHECK(cudaEventRecord(b));
    CHECK(cudaEventSynchronize(b));
    float ms;
    CHECK(cudaEventElapsedTime(&ms, a, b));
    if (i >= 3) t.push_back(ms);
  }
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

int main(int argc, char** argv) {
  int P = argc > 1 ? atoi(argv[1]) : 8;
  std::vector<size_t> sizes;
  for (int i = 2; i < argc; i++) sizes.push_back(strtoull(argv[i], 0, 10));
  if (sizes.empty()) sizes = {32, 128, 256, 1024};
  int sms;
  CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  const int blocks = sms * 8;
  printf("# one source to %d destinations; GB/s = (1 + %d) x bytes / time (read + written); median of 10\n", P, P);
  printf("# %8s %9s %9s %9s %9s %9s %9s\n", "MiB", "copy", "memset", "base", "unroll4", "cs", "u4cs");
  for (size_t mib : sizes) {
    size_t bytes = mib << 20;
    V16* src;
    CHECK(cudaMalloc(&src, bytes));
    CHECK(cudaMemset(src, 1, bytes));
    Outs outs;
    for (int m = 0; m < P; m++) CHECK(cudaMalloc(&outs.p[m], bytes));
    unsigned long long packs = bytes / 16;
    double fan = (1.0 + P) * bytes / 1e6, two = 2.0 * bytes / 1e6;
    float copy = median_ms([&] { CHECK(cudaMemcpyAsync(outs.p[0], src, bytes, cudaMemcpyDeviceToDevice)); });
    float set = median_ms([&] { CHECK(cudaMemsetAsync(outs.p[0], 7, bytes)); });
    float base = median_ms([&] { fanout<1, false><<<blocks, 256>>>(src, outs, P, packs); });
    float u4 = median_ms([&] { fanout<4, false><<<blocks, 256>>>(src, outs, P, packs); });
    float cs = median_ms([&] { fanout<1, true><<<blocks, 256>>>(src, outs, P, packs); });
    float u4cs = median_ms([&] { fanout<4, true><<<blocks, 256>>>(src, outs, P, packs); });
    CHECK(cudaGetLastError());
    // Every destination holds the source.
    std::vector<unsigned char> h(4096);
    for (int m = 0; m < P; m++) {
      CHECK(cudaMemcpy(h.data(), (char*)outs.p[m] + bytes - 4096, 4096, cudaMemcpyDeviceToHost));
      for (unsigned char c : h) if (c != 1) { fprintf(stderr, "destination %d wrong\n", m); return 1; }
    }
    printf("  %8zu %9.0f %9.0f %9.0f %9.0f %9.0f %9.0f\n", mib, two / copy, bytes / 1e6 / set, fan / base, fan / u4,
           fan / cs, fan / u4cs);
    for (int m = 0; m < P; m++) CHECK(cudaFree(outs.p[m]));
    CHECK(cudaFree(src));
  }
  return 0;
}
