// The floor of the staged path's hand-off between a stream and a host thread, without ferroccl:
// what a small staged call (device buffers over sockets) can never go below. Each iteration
// is one staged call's stream work and its worker's answer:
//   stream:  copy `bytes` device -> pinned staging; ready = k; wait done >= k; copy staging -> device
//   worker:  wait ready >= k; done = k  (no engine: the host call's own time comes on top)
// Flags are words of pinned host memory, written and waited on by stream memory operations, as
// in ferroccl's stream worker. Like nccl-tests, each process queues `iters` iterations and
// synchronises once; rank 0 prints the time per iteration (median of 5 repeats). The processes
// do not talk to each other during the timed loop: run 1 process, then 2 or more on the one GPU,
// to see what sharing the GPU between processes (contexts) costs each of them.
// Mode 1 issues both copies through cuMemcpyBatchAsync with CU_MEMCPY_FLAG_PREFER_OVERLAP_WITH_COMPUTE
// (CUDA 12.8+): a hint to run them on a copy engine, not the SMs' engine, which processes that
// share a GPU without MPS take in time slices (mode 0, plain cudaMemcpyAsync, is the default).
// Modes 2 and 3 leave out the copy back (2) or the copy out (3), to tell which of them is slow.
//   nvcc -O2 handoff_floor.cu -lcuda -lmpi -o handoff_floor
//   mpirun -np P ./handoff_floor [bytes] [iters] [mode]
#include <cuda.h>
#include <cuda_runtime.h>
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <atomic>
#include <thread>
#include <vector>
#include <algorithm>

#define CU(x) do { CUresult e = (x); if (e != CUDA_SUCCESS) { const char* s; cuGetErrorString(e, &s); \
  fprintf(stderr, "%s: %s\n", #x, s); MPI_Abort(MPI_COMM_WORLD, 1); } } while (0)
#define CUDA(x) do { cudaError_t e = (x); if (e != cudaSuccess) { \
  fprintf(stderr, "%s: %s\n", #x, cudaGetErrorString(e)); MPI_Abort(MPI_COMM_WORLD, 1); } } while (0)

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int rank, n;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &n);
  size_t bytes = argc > 1 ? strtoul(argv[1], 0, 0) : 8;
  int iters = argc > 2 ? atoi(argv[2]) : 200;
  int mode = argc > 3 ? atoi(argv[3]) : 0;
  CUDA(cudaSetDevice(0));
  CUDA(cudaFree(0));
  char *dev_in, *dev_out, *stage_in, *stage_out;
  CUDA(cudaMalloc(&dev_in, bytes));
  CUDA(cudaMalloc(&dev_out, bytes));
  CUDA(cudaHostAlloc(&stage_in, bytes, cudaHostAllocPortable));
  CUDA(cudaHostAlloc(&stage_out, bytes, cudaHostAllocPortable));
  unsigned* flags;  // [0] ready, [16] done: separate cache lines
  CUDA(cudaHostAlloc(&flags, 4096, cudaHostAllocPortable));
  memset(flags, 0, 4096);
  CUdeviceptr ready = (CUdeviceptr)flags, done = (CUdeviceptr)(flags + 16);
  cudaStream_t s;
  CUDA(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  std::atomic<unsigned>* ready_word = reinterpret_cast<std::atomic<unsigned>*>(flags);
  std::atomic<unsigned>* done_word = reinterpret_cast<std::atomic<unsigned>*>(flags + 16);
  unsigned k = 0;
  std::vector<double> t;
  if (rank == 0) printf("# %d processes on one GPU, %zu B, %d iterations per repeat, mode %d\n", n, bytes, iters, mode);
  CUmemcpyAttributes d2h = {}, h2d = {};
  d2h.srcAccessOrder = h2d.srcAccessOrder = CU_MEMCPY_SRC_ACCESS_ORDER_STREAM;
  d2h.flags = h2d.flags = CU_MEMCPY_FLAG_PREFER_OVERLAP_WITH_COMPUTE;
  d2h.srcLocHint.type = h2d.dstLocHint.type = CU_MEM_LOCATION_TYPE_DEVICE;
  d2h.dstLocHint.type = h2d.srcLocHint.type = CU_MEM_LOCATION_TYPE_HOST;
  auto batch_copy = [&](void* dst, const void* src, CUmemcpyAttributes* attr) {
    CUdeviceptr d = (CUdeviceptr)dst, sp = (CUdeviceptr)src;
    size_t size = bytes, idx = 0;
#if CUDA_VERSION >= 13000
    CU(cuMemcpyBatchAsync(&d, &sp, &size, 1, attr, &idx, 1, (CUstream)s));
#else
    size_t fail = 0;
    CU(cuMemcpyBatchAsync(&d, &sp, &size, 1, attr, &idx, 1, &fail, (CUstream)s));
#endif
  };
  for (int rep = 0; rep < 6; rep++) {
    MPI_Barrier(MPI_COMM_WORLD);
    double t0 = MPI_Wtime();
    unsigned first = k + 1, last = k + iters;
    // The worker, a thread of its own as in ferroccl: answers each ready flag as soon as it sees it.
    std::thread worker([=] {
      for (unsigned j = first; j <= last; j++) {
        while ((int)(ready_word->load(std::memory_order_acquire) - j) < 0) {
        }
        done_word->store(j, std::memory_order_release);
      }
    });
    for (int i = 0; i < iters; i++) {
      k++;
      if (mode == 1) batch_copy(stage_in, dev_in, &d2h);
      else if (mode != 3) CUDA(cudaMemcpyAsync(stage_in, dev_in, bytes, cudaMemcpyDeviceToHost, s));
      CU(cuStreamWriteValue32(s, ready, k, 0));
      CU(cuStreamWaitValue32(s, done, k, CU_STREAM_WAIT_VALUE_GEQ));
      if (mode == 1) batch_copy(dev_out, stage_out, &h2d);
      else if (mode != 2) CUDA(cudaMemcpyAsync(dev_out, stage_out, bytes, cudaMemcpyHostToDevice, s));
    }
    worker.join();
    CUDA(cudaStreamSynchronize(s));
    double dt = (MPI_Wtime() - t0) / iters * 1e6;
    if (rep > 0) t.push_back(dt);
  }
  std::sort(t.begin(), t.end());
  double all[64];
  double med = t[t.size() / 2];
  MPI_Gather(&med, 1, MPI_DOUBLE, all, 1, MPI_DOUBLE, 0, MPI_COMM_WORLD);
  if (rank == 0) {
    printf("# us per iteration, median of %zu repeats, per process:", t.size());
    for (int r = 0; r < n; r++) printf(" %.2f", all[r]);
    printf("\n");
  }
  MPI_Finalize();
  return 0;
}
