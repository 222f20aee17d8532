// The floor of ordering P processes' streams on one GPU with stream memory operations, without
// ferroccl: what the one-GPU path's 8-byte latency can never go below. Each iteration is the
// path's handshake around one tiny kernel on rank 0's stream:
//   reset:  rank r>0: ready[r]=1, wait done[r]==1, done[r]=0
//           rank 0:   wait ready[r]==1, ready[r]=0 (each r); kernel; done[r]=1 (each r)
//   epoch:  rank r>0: ready[r]=k, wait done>=k
//           rank 0:   wait ready[r]>=k (each r); kernel; done=k
//   alone:  rank 0 only queues its kernel (no ordering at all: the kernel launch floor)
// Like nccl-tests, every rank queues `iters` iterations and synchronises once; the time per
// iteration is printed by rank 0 (median of 5 repeats). Flags live in a device block of rank 0's,
// opened by the others through CUDA IPC, as in ferroccl.
//   nvcc -O2 flag_protocol.cu -lcuda -lmpi -o flag_protocol
//   mpirun -np P ./flag_protocol [iters]
#include <cuda.h>
#include <cuda_runtime.h>
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <vector>
#include <algorithm>

#define CU(x) do { CUresult e = (x); if (e != CUDA_SUCCESS) { const char* s; cuGetErrorString(e, &s); \
  fprintf(stderr, "%s: %s\n", #x, s); MPI_Abort(MPI_COMM_WORLD, 1); } } while (0)
#define CUDA(x) do { cudaError_t e = (x); if (e != cudaSuccess) { \
  fprintf(stderr, "%s: %s\n", #x, cudaGetErrorString(e)); MPI_Abort(MPI_COMM_WORLD, 1); } } while (0)

__global__ void tiny(float* x) { if (threadIdx.x == 0) x[0] += 1.0f; }

static CUstreamBatchMemOpParams wait_op(CUdeviceptr a, unsigned v, bool geq) {
  CUstreamBatchMemOpParams p; memset(&p, 0, sizeof p);
  p.waitValue.operation = CU_STREAM_MEM_OP_WAIT_VALUE_32;
  p.waitValue.address = a; p.waitValue.value = v;
  p.waitValue.flags = geq ? CU_STREAM_WAIT_VALUE_GEQ : CU_STREAM_WAIT_VALUE_EQ;
  return p;
}
static CUstreamBatchMemOpParams write_op(CUdeviceptr a, unsigned v) {
  CUstreamBatchMemOpParams p; memset(&p, 0, sizeof p);
  p.writeValue.operation = CU_STREAM_MEM_OP_WRITE_VALUE_32;
  p.writeValue.address = a; p.writeValue.value = v;
  return p;
}

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int rank, n;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &n);
  int iters = argc > 1 ? atoi(argv[1]) : 2000;
  CUDA(cudaSetDevice(0));
  CUDA(cudaFree(0));
  const size_t line = 64;  // one flag line per rank, as in ferroccl
  char* block = 0;
  cudaIpcMemHandle_t h;
  if (rank == 0) {
    CUDA(cudaMalloc(&block, 2 * 64 * line));
    CUDA(cudaIpcGetMemHandle(&h, block));
  }
  MPI_Bcast(&h, sizeof h, MPI_BYTE, 0, MPI_COMM_WORLD);
  if (rank != 0) CUDA(cudaIpcOpenMemHandle((void**)&block, h, cudaIpcMemLazyEnablePeerAccess));
  CUdeviceptr ready = (CUdeviceptr)block, done = (CUdeviceptr)block + 64 * line;
  float* x;
  CUDA(cudaMalloc(&x, 4));
  cudaStream_t s;
  CUDA(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  const char* modes[] = {"alone", "reset", "epoch"};
  unsigned epoch = 0;
  if (rank == 0) printf("# %d processes on one GPU, %d iterations per repeat, us per iteration (median of 5)\n", n, iters);
  for (int m = 0; m < 3; m++) {
    if (rank == 0) CUDA(cudaMemset(block, 0, 2 * 64 * line));
    CUDA(cudaDeviceSynchronize());
    MPI_Barrier(MPI_COMM_WORLD);
    std::vector<double> t;
    for (int rep = 0; rep < 6; rep++) {
      MPI_Barrier(MPI_COMM_WORLD);
      double t0 = MPI_Wtime();
      for (int i = 0; i < iters; i++) {
        std::vector<CUstreamBatchMemOpParams> ops;
        if (m == 0) {
          if (rank == 0) tiny<<<1, 32, 0, s>>>(x);
          continue;
        }
        if (m == 2) epoch++;
        if (rank == 0) {
          for (int r = 1; r < n; r++) {
            ops.push_back(wait_op(ready + r * line, m == 1 ? 1 : epoch, m == 2));
            if (m == 1) ops.push_back(write_op(ready + r * line, 0));
          }
          if (!ops.empty()) CU(cuStreamBatchMemOp(s, ops.size(), ops.data(), 0));
          tiny<<<1, 32, 0, s>>>(x);
          ops.clear();
          if (m == 1) for (int r = 1; r < n; r++) ops.push_back(write_op(done + r * line, 1));
          else ops.push_back(write_op(done, epoch));
          CU(cuStreamBatchMemOp(s, ops.size(), ops.data(), 0));
        } else if (m == 1) {
          ops.push_back(write_op(ready + rank * line, 1));
          ops.push_back(wait_op(done + rank * line, 1, false));
          ops.push_back(write_op(done + rank * line, 0));
          CU(cuStreamBatchMemOp(s, ops.size(), ops.data(), 0));
        } else {
          ops.push_back(write_op(ready + rank * line, epoch));
          ops.push_back(wait_op(done, epoch, true));
          CU(cuStreamBatchMemOp(s, ops.size(), ops.data(), 0));
        }
      }
      CUDA(cudaStreamSynchronize(s));
      double dt = MPI_Wtime() - t0;
      double worst;
      MPI_Reduce(&dt, &worst, 1, MPI_DOUBLE, MPI_MAX, 0, MPI_COMM_WORLD);
      if (rep > 0) t.push_back(worst / iters * 1e6);
    }
    if (rank == 0) {
      std::sort(t.begin(), t.end());
      printf("%-6s P=%d  %8.2f us  (min %.2f, max %.2f)\n", modes[m], n, t[t.size() / 2], t.front(), t.back());
      fflush(stdout);
    }
  }
  MPI_Finalize();
  return 0;
}
