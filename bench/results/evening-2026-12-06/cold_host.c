// 2-rank host all-reduce over sockets: warm buffers, buffers flushed from cache (clflush: only
// the user's buffers cold, as DMA-written staging), and everything evicted (512 MiB junk write).
#include <mpi.h>
#include <nccl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <x86intrin.h>
static double now(void) { return MPI_Wtime(); }
static void flush(void* p, size_t n) { for (size_t i = 0; i < n; i += 64) _mm_clflush((char*)p + i); _mm_mfence(); }
static int cmp(const void* a, const void* b) { double x = *(double*)a, y = *(double*)b; return x < y ? -1 : x > y; }
int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int rank, n; MPI_Comm_rank(MPI_COMM_WORLD, &rank); MPI_Comm_size(MPI_COMM_WORLD, &n);
  ncclUniqueId id; if (rank == 0) ncclGetUniqueId(&id);
  MPI_Bcast(&id, sizeof id, MPI_BYTE, 0, MPI_COMM_WORLD);
  ncclComm_t comm; if (ncclCommInitRank(&comm, n, id, rank) != ncclSuccess) return 1;
  size_t maxb = (size_t)atoi(argc > 1 ? argv[1] : "16") << 20, junkb = 512u << 20;
  float* s = malloc(maxb); float* r = malloc(maxb); char* junk = malloc(junkb);
  for (size_t i = 0; i < maxb / 4; i++) s[i] = 1.0f;
  memset(r, 0, maxb); memset(junk, 1, junkb);
  if (rank == 0) printf("# %8s %9s %9s %9s  (us, median of %d)\n", "bytes", "warm", "flushed", "evicted", 15);
  for (size_t b = 1 << 20; b <= maxb; b *= 2) {
    double t[3][15];
    for (int i = 0; i < 17; i++) for (int m = 0; m < 3; m++) {
      if (m == 1) { flush(s, b); flush(r, b); }
      if (m == 2) { memset(junk, i, junkb); __asm__ volatile("" : : "r"(junk) : "memory"); }
      MPI_Barrier(MPI_COMM_WORLD);
      double t0 = now();
      ncclAllReduce(s, r, b / 4, ncclFloat, ncclSum, comm, 0);
      double d = now() - t0;
      if (i >= 2) t[m][i - 2] = d * 1e6;
    }
    for (int m = 0; m < 3; m++) qsort(t[m], 15, sizeof(double), cmp);
    if (rank == 0) printf("  %8zu %9.0f %9.0f %9.0f\n", b, t[0][7], t[1][7], t[2][7]);
  }
  ncclCommDestroy(comm); MPI_Finalize(); return 0;
}
