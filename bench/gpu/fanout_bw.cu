// One source copied to P destinations on one GPU (what an all-gather or broadcast of P ranks
// sharing the GPU does: one read, P writes), in kernel variants, against the device copy and
// cudaMemset in the same run. Bandwidth counts bytes read plus bytes written.
//   base    grid-stride loop, one 16-byte load, P 16-byte stores (ferroccl's fold kernel today)
//   unroll4 four independent 16-byte loads in flight per thread before the stores
//   cs      base with streaming stores (st.global.cs: evict-first, the outputs are not re-read)
//   u4cs    unroll4 with streaming stores
//   rot     base, each block starting its destination loop at a different destination
//   phN     phased: the source in N-MiB chunks, each chunk copied to destination 0, then 1, ...,
//           so DRAM sees one write stream at a time and the chunk is re-read from L2
//           (streaming stores, so the writes do not evict it)
//   wonly   P destinations written with a constant, nothing read (is it the writes' pattern?)
//   tile    each block copies 64 KiB tiles whole (sequential runs per destination), four loads in
//           flight, streaming stores
//   Pcopy   P device-to-device cudaMemcpyAsync calls (the source read P times)
//   tmaN    the copy engine of each SM (TMA, cp.async.bulk): one thread per block loads an N-KiB
//           tile into shared memory and stores it to every destination with bulk stores
// FANOUT_SKEW_BYTES=S places destination m S x m bytes past its allocation's start (are equally
// aligned destinations contending for the same DRAM channels?).
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

__global__ void __launch_bounds__(256) fanout_rot(const V16* __restrict__ src, Outs outs, int n_out, unsigned long long packs) {
  const unsigned long long stride = (unsigned long long)gridDim.x * blockDim.x;
  const int first = blockIdx.x % n_out;
  for (unsigned long long j = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x; j < packs; j += stride) {
    V16 v = src[j];
    for (int k = 0; k < n_out; ++k) {
      int m = first + k;
      if (m >= n_out) m -= n_out;
      outs.p[m][j] = v;
    }
  }
}

__global__ void __launch_bounds__(256) fanout_phased(const V16* __restrict__ src, Outs outs, int n_out, unsigned long long packs,
                                                     unsigned long long chunk_packs) {
  const unsigned long long stride = (unsigned long long)gridDim.x * blockDim.x;
  const unsigned long long start = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x;
  for (unsigned long long c0 = 0; c0 < packs; c0 += chunk_packs) {
    const unsigned long long end = c0 + chunk_packs < packs ? c0 + chunk_packs : packs;
    for (int m = 0; m < n_out; ++m) {
      for (unsigned long long j = c0 + start; j < end; j += stride) __stcs((float4*)(outs.p[m] + j), *(const float4*)&src[j]);
    }
  }
}

__global__ void __launch_bounds__(256) fanout_write_only(Outs outs, int n_out, unsigned long long packs) {
  const unsigned long long stride = (unsigned long long)gridDim.x * blockDim.x;
  const float4 v = make_float4(1.f, 2.f, 3.f, 4.f);
  for (unsigned long long j = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x; j < packs; j += stride)
    for (int m = 0; m < n_out; ++m) __stcs((float4*)(outs.p[m] + j), v);
}

// 64 KiB tiles = 4096 packs: 256 threads x 4 loads x 4 rounds.
__global__ void __launch_bounds__(256) fanout_tile(const V16* __restrict__ src, Outs outs, int n_out, unsigned long long packs) {
  const unsigned long long tile = 4096;
  for (unsigned long long t0 = (unsigned long long)blockIdx.x * tile; t0 < packs; t0 += (unsigned long long)gridDim.x * tile) {
    for (int r = 0; r < 4; ++r) {
      const unsigned long long base = t0 + r * 1024 + threadIdx.x;
      float4 v[4];
#pragma unroll
      for (int u = 0; u < 4; ++u) v[u] = base + u * 256 < packs ? *(const float4*)&src[base + u * 256] : make_float4(0, 0, 0, 0);
      for (int m = 0; m < n_out; ++m) {
#pragma unroll
        for (int u = 0; u < 4; ++u)
          if (base + u * 256 < packs) __stcs((float4*)(outs.p[m] + base + u * 256), v[u]);
      }
    }
  }
}

// One thread per block drives the SM's bulk-copy unit: tile into shared memory (completion
// counted on an mbarrier), then one bulk store per destination; the next load waits until
// the stores have read the tile.
template <int TILE>
__global__ void __launch_bounds__(32) fanout_tma(const V16* __restrict__ src, Outs outs, int n_out, unsigned long long bytes) {
  __shared__ alignas(128) unsigned char tile[TILE];
  __shared__ alignas(8) unsigned long long bar;
  if (threadIdx.x != 0) return;
  const unsigned smem = (unsigned)__cvta_generic_to_shared(tile);
  const unsigned mbar = (unsigned)__cvta_generic_to_shared(&bar);
  asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" ::"r"(mbar));
  asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
  unsigned phase = 0;
  for (unsigned long long off = (unsigned long long)blockIdx.x * TILE; off < bytes; off += (unsigned long long)gridDim.x * TILE) {
    const unsigned n = bytes - off < TILE ? (unsigned)(bytes - off) : TILE;
    const char* from = (const char*)src + off;
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(mbar), "r"(n) : "memory");
    asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(smem),
                 "l"(from), "r"(n), "r"(mbar)
                 : "memory");
    asm volatile(
        "{\n .reg .pred p;\n WAIT_%=:\n mbarrier.try_wait.parity.shared::cta.b64 p, [%0], %1;\n @!p bra WAIT_%=;\n}" ::"r"(mbar),
        "r"(phase)
        : "memory");
    phase ^= 1;
    for (int m = 0; m < n_out; ++m)
      asm volatile("cp.async.bulk.global.shared::cta.bulk_group [%0], [%1], %2;" ::"l"((char*)outs.p[m] + off), "r"(smem), "r"(n)
                   : "memory");
    asm volatile("cp.async.bulk.commit_group;" ::: "memory");
    asm volatile("cp.async.bulk.wait_group.read 0;" ::: "memory");
  }
  asm volatile("cp.async.bulk.wait_group 0;" ::: "memory");
}

// Whether every destination holds the source (all bytes 1) at every 4093rd byte.
static bool every_destination_holds_source(const Outs& outs, int P, size_t bytes, const char* what) {
  std::vector<unsigned char> h(bytes);
  for (int m = 0; m < P; m++) {
    CHECK(cudaMemcpy(h.data(), outs.p[m], bytes, cudaMemcpyDeviceToHost));
    for (size_t i = 0; i < bytes; i += 4093)
      if (h[i] != 1) {
        fprintf(stderr, "%s: destination %d wrong at %zu\n", what, m, i);
        return false;
      }
  }
  return true;
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
  const char* skew_env = getenv("FANOUT_SKEW_BYTES");
  const size_t skew = skew_env ? strtoull(skew_env, 0, 10) : 0;
  if (skew % 16) { fprintf(stderr, "FANOUT_SKEW_BYTES must be a multiple of 16\n"); return 2; }
  printf("# destination m starts %zu x m bytes into its allocation\n", skew);
  printf("# %8s %9s %9s %9s %9s %9s %9s %9s %9s %9s %9s\n", "MiB", "copy", "memset", "base", "unroll4", "cs", "u4cs", "rot",
         "ph2", "ph8", "ph32");
  printf("#           %9s %9s %9s %9s %9s %9s\n", "wonly", "tile", "Pcopy", "tma16x8", "tma32x6", "tma32x4");
  for (size_t mib : sizes) {
    size_t bytes = mib << 20;
    V16* src;
    CHECK(cudaMalloc(&src, bytes));
    CHECK(cudaMemset(src, 1, bytes));
    Outs outs, allocs;
    for (int m = 0; m < P; m++) {
      CHECK(cudaMalloc(&allocs.p[m], bytes + skew * m));
      outs.p[m] = (V16*)((char*)allocs.p[m] + skew * m);
    }
    unsigned long long packs = bytes / 16;
    double fan = (1.0 + P) * bytes / 1e6, two = 2.0 * bytes / 1e6;
    float copy = median_ms([&] { CHECK(cudaMemcpyAsync(outs.p[0], src, bytes, cudaMemcpyDeviceToDevice)); });
    float set = median_ms([&] { CHECK(cudaMemsetAsync(outs.p[0], 7, bytes)); });
    float base = median_ms([&] { fanout<1, false><<<blocks, 256>>>(src, outs, P, packs); });
    float u4 = median_ms([&] { fanout<4, false><<<blocks, 256>>>(src, outs, P, packs); });
    float cs = median_ms([&] { fanout<1, true><<<blocks, 256>>>(src, outs, P, packs); });
    float u4cs = median_ms([&] { fanout<4, true><<<blocks, 256>>>(src, outs, P, packs); });
    float rot = median_ms([&] { fanout_rot<<<blocks, 256>>>(src, outs, P, packs); });
    float wonly = median_ms([&] { fanout_write_only<<<blocks, 256>>>(outs, P, packs); });
    float pcopy = median_ms([&] {
      for (int m = 0; m < P; m++) CHECK(cudaMemcpyAsync(outs.p[m], src, bytes, cudaMemcpyDeviceToDevice));
    });
    // Bulk copies: tiles of 16 KiB at 8 blocks per SM, 32 KiB at 6 and 4; checked on the last
    // one's output.
    for (int m = 0; m < P; m++) CHECK(cudaMemset(outs.p[m], 0, bytes));
    float tma16 = median_ms([&] { fanout_tma<16384><<<sms * 8, 32>>>(src, outs, P, bytes); });
    float tma32a = median_ms([&] { fanout_tma<32768><<<sms * 6, 32>>>(src, outs, P, bytes); });
    float tma32 = median_ms([&] { fanout_tma<32768><<<sms * 4, 32>>>(src, outs, P, bytes); });
    CHECK(cudaGetLastError());
    if (!every_destination_holds_source(outs, P, bytes, "tma")) return 1;
    for (int m = 0; m < P; m++) CHECK(cudaMemset(outs.p[m], 0, bytes));
    float tile = median_ms([&] { fanout_tile<<<blocks, 256>>>(src, outs, P, packs); });
    CHECK(cudaGetLastError());
    if (!every_destination_holds_source(outs, P, bytes, "tile")) return 1;
    // The check at the end sees what the last phased run wrote.
    for (int m = 0; m < P; m++) CHECK(cudaMemset(outs.p[m], 0, bytes));
    float ph[3];
    const unsigned long long chunk_mib[3] = {2, 8, 32};
    for (int i = 0; i < 3; i++)
      ph[i] = median_ms([&] { fanout_phased<<<blocks, 256>>>(src, outs, P, packs, (chunk_mib[i] << 20) / 16); });
    CHECK(cudaGetLastError());
    // Every destination holds the source.
    std::vector<unsigned char> h(4096);
    for (int m = 0; m < P; m++) {
      CHECK(cudaMemcpy(h.data(), (char*)outs.p[m] + bytes - 4096, 4096, cudaMemcpyDeviceToHost));
      for (unsigned char c : h) if (c != 1) { fprintf(stderr, "destination %d wrong\n", m); return 1; }
    }
    printf("  %8zu %9.0f %9.0f %9.0f %9.0f %9.0f %9.0f %9.0f %9.0f %9.0f %9.0f\n", mib, two / copy, bytes / 1e6 / set,
           fan / base, fan / u4, fan / cs, fan / u4cs, fan / rot, fan / ph[0], fan / ph[1], fan / ph[2]);
    printf("            %9.0f %9.0f %9.0f %9.0f %9.0f %9.0f\n", P * bytes / 1e6 / wonly, fan / tile, 2.0 * P * bytes / 1e6 / pcopy,
           fan / tma16, fan / tma32a, fan / tma32);
    for (int m = 0; m < P; m++) CHECK(cudaFree(allocs.p[m]));
    CHECK(cudaFree(src));
  }
  return 0;
}
