// Does a stream held on a flag wait (cuStreamWaitValue32) slow another stream's copies on the
// same GPU? The staged path's traces show one rank's input copies stalling for 0.5-2 ms while
// the other rank's stream waits for a released flag. Rank 1 times `pieces` copies of
// `piece_kib` KiB device -> pinned host, each followed by a flag write (as the staged path
// queues its input), from enqueue to stream completion, while:
//   alone       rank 0 does nothing
//   peer-wait   rank 0's stream is held on a flag wait (in rank 0's pinned memory) the whole time
//   peer-copy   rank 0's stream copies pinned host -> device the same bytes (no wait)
//   own-wait    rank 1's second stream is held on a flag wait (same process and context)
// Median of `reps` repeats per case, printed by rank 1 in us. Run with and without MPS.
//   nvcc -O2 wait_contention.cu -lcuda -lmpi -o wait_contention
//   mpirun -np 2 ./wait_contention [pieces] [piece_kib] [reps]
#include <cuda.h>
#include <cuda_runtime.h>
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <vector>
#include <algorithm>

#define CU(x) do { CUresult e = (x); if (e != CUDA_SUCCESS) { const char* s; cuGetErrorString(e, &s); \
  fprintf(stderr, "%s: %s\n", #x, s); MPI_Abort(MPI_COMM_WORLD, 1); } } while (0)
#define CUDA(x) do { cudaError_t e = (x); if (e != cudaSuccess) { \
  fprintf(stderr, "%s: %s\n", #x, cudaGetErrorString(e)); MPI_Abort(MPI_COMM_WORLD, 1); } } while (0)

enum Case { ALONE, PEER_WAIT, PEER_COPY, OWN_WAIT, CASES };
static const char* names[CASES] = {"alone", "peer-wait", "peer-copy", "own-wait"};

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int rank;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  int pieces = argc > 1 ? atoi(argv[1]) : 16, reps = argc > 3 ? atoi(argv[3]) : 21;
  size_t piece = (size_t)(argc > 2 ? atoi(argv[2]) : 256) << 10, bytes = piece * pieces;
  CUDA(cudaSetDevice(0));
  cudaStream_t s, s2;
  CUDA(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  CUDA(cudaStreamCreateWithFlags(&s2, cudaStreamNonBlocking));
  char *dev, *host;
  CUDA(cudaMalloc(&dev, bytes));
  CUDA(cudaMallocHost(&host, bytes));
  unsigned* flags;  // [0]: the wait's flag, [1..]: landed flags
  CUDA(cudaHostAlloc((void**)&flags, 4096, cudaHostAllocMapped));
  CUdeviceptr flags_dev;
  CUDA(cudaHostGetDevicePointer((void**)&flags_dev, flags, 0));
  volatile unsigned* vflags = flags;
  std::vector<double> t[CASES];
  unsigned epoch = 0;
  for (int r = 0; r < reps; r++) {
    for (int c = 0; c < CASES; c++) {
      epoch++;
      // The waiter's hold is queued before the copies start and lifted after they end.
      if ((c == PEER_WAIT && rank == 0) || (c == OWN_WAIT && rank == 1))
        CU(cuStreamWaitValue32((CUstream)(c == OWN_WAIT ? s2 : s), flags_dev, epoch, CU_STREAM_WAIT_VALUE_GEQ));
      MPI_Barrier(MPI_COMM_WORLD);
      if (c == PEER_COPY && rank == 0)
        for (int k = 0; k < pieces; k++)
          CUDA(cudaMemcpyAsync(dev + k * piece, host + k * piece, piece, cudaMemcpyHostToDevice, s));
      if (rank == 1) {
        double t0 = MPI_Wtime();
        for (int k = 0; k < pieces; k++) {
          CUDA(cudaMemcpyAsync(host + k * piece, dev + k * piece, piece, cudaMemcpyDeviceToHost, s));
          CU(cuStreamWriteValue32((CUstream)s, flags_dev + 4 * (1 + k), epoch, 0));
        }
        while (vflags[pieces] != epoch) {}
        t[c].push_back((MPI_Wtime() - t0) * 1e6);
        CUDA(cudaStreamSynchronize(s));
      }
      MPI_Barrier(MPI_COMM_WORLD);
      vflags[0] = epoch;  // lifts the hold, if any
      CUDA(cudaDeviceSynchronize());
      MPI_Barrier(MPI_COMM_WORLD);
    }
  }
  if (rank == 1) {
    printf("# %d copies of %zu KiB device -> pinned host, each with a flag write; us from enqueue to the last\n"
           "# flag seen by the host; median (min-max) of %d\n", pieces, piece >> 10, reps);
    for (int c = 0; c < CASES; c++) {
      std::sort(t[c].begin(), t[c].end());
      printf("%-10s %9.0f (%.0f-%.0f)\n", names[c], t[c][t[c].size() / 2], t[c].front(), t[c].back());
    }
  }
  MPI_Finalize();
  return 0;
}
