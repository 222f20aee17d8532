// Device buffers over the staged path (NCCL_P2P_DISABLE=1) next to host buffers over the same
// transport, with the ranks as processes or as threads of one process, on one GPU. Ranks that
// are threads share one CUDA context; ranks that are processes each have their own, and the
// GPU takes those in turns unless the MPS daemon runs (bench/gpu/handoff_floor.cu). This tells
// how much of the staged path's gap to host buffers comes from the contexts taking turns, which
// ranks on different hosts (one process per GPU) never pay.
//   nvcc -O2 -I$PREFIX/include staged_threads.cu -L$PREFIX/lib -lnccl -lmpi -o staged_threads
//   mpirun -np P -x NCCL_P2P_DISABLE=1 -x NCCL_SHM_DISABLE=1 ./staged_threads THREADS [max_bytes]
// Ranks = P x THREADS. Per size, host then device buffers: 3 warm-up calls, then 5 repeats of a
// batch of calls queued back to back (device: one stream synchronisation per batch, as
// nccl-tests times them); time per call = the slowest rank's batch time / batch length; the
// median repeat is printed. Every result is checked once per size and kind (all ranks send 1.0).
#include <cuda_runtime.h>
#include <mpi.h>
#include <nccl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <algorithm>
#include <vector>

#define CUDA(x) do { cudaError_t e = (x); if (e != cudaSuccess) { \
  fprintf(stderr, "%s: %s\n", #x, cudaGetErrorString(e)); MPI_Abort(MPI_COMM_WORLD, 1); } } while (0)
#define NCCL(x) do { ncclResult_t r = (x); if (r != ncclSuccess) { \
  fprintf(stderr, "%s: %s\n", #x, ncclGetErrorString(r)); MPI_Abort(MPI_COMM_WORLD, 1); } } while (0)

struct Shared {
  pthread_barrier_t barrier;
  int threads, nranks, first_rank;
  size_t max_bytes;
  ncclUniqueId id;
  std::vector<double> seconds;  // one per thread, per batch
  double worst;                 // slowest rank of all processes, per batch
};

struct Rank {
  Shared* s;
  int thread;
};

// Every rank of every process meets here; thread 0 of each process speaks MPI for it.
static void barrier_all(Shared* s, int t) {
  pthread_barrier_wait(&s->barrier);
  if (t == 0) MPI_Barrier(MPI_COMM_WORLD);
  pthread_barrier_wait(&s->barrier);
}

static double worst_of_all(Shared* s, int t, double mine) {
  s->seconds[t] = mine;
  pthread_barrier_wait(&s->barrier);
  if (t == 0) {
    double local = *std::max_element(s->seconds.begin(), s->seconds.end());
    MPI_Allreduce(&local, &s->worst, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
  }
  pthread_barrier_wait(&s->barrier);
  return s->worst;
}

static void check(const float* r, size_t count, int nranks, const char* what, size_t bytes) {
  for (size_t i = 0; i < count; i += 1 + count / 64)
    if (r[i] != (float)nranks) {
      fprintf(stderr, "wrong %s result at %zu B, element %zu: %f\n", what, bytes, i, r[i]);
      MPI_Abort(MPI_COMM_WORLD, 2);
    }
}

static void* rank_main(void* arg) {
  Rank* me = (Rank*)arg;
  Shared* s = me->s;
  int t = me->thread, rank = s->first_rank + t;
  CUDA(cudaSetDevice(0));
  ncclComm_t comm;
  NCCL(ncclCommInitRank(&comm, s->nranks, s->id, rank));
  size_t max_count = s->max_bytes / sizeof(float);
  std::vector<float> host_send(max_count, 1.0f), host_recv(max_count), back(max_count);
  float *dev_send, *dev_recv;
  CUDA(cudaMalloc(&dev_send, s->max_bytes));
  CUDA(cudaMalloc(&dev_recv, s->max_bytes));
  CUDA(cudaMemcpy(dev_send, host_send.data(), s->max_bytes, cudaMemcpyHostToDevice));
  cudaStream_t stream;
  CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  if (rank == 0) printf("# %d ranks (%d threads per process); us per call, median of 5 batches\n# bytes host device host/device\n", s->nranks, s->threads);
  for (size_t bytes = 8; bytes <= s->max_bytes; bytes *= 4) {
    size_t count = bytes / sizeof(float);
    int batch = bytes <= 65536 ? 100 : bytes <= (4 << 20) ? 20 : 5;
    double us[2];
    for (int device = 0; device < 2; device++) {
      const float* send = device ? dev_send : host_send.data();
      float* recv = device ? dev_recv : host_recv.data();
      cudaStream_t st = device ? stream : 0;
      std::vector<double> reps;
      for (int rep = -1; rep < 5; rep++) {
        int calls = rep < 0 ? 3 : batch;
        barrier_all(s, t);
        double t0 = MPI_Wtime();
        for (int i = 0; i < calls; i++) NCCL(ncclAllReduce(send, recv, count, ncclFloat, ncclSum, comm, st));
        if (device) CUDA(cudaStreamSynchronize(stream));
        double dt = worst_of_all(s, t, MPI_Wtime() - t0);
        if (rep >= 0) reps.push_back(dt / calls * 1e6);
      }
      if (device) CUDA(cudaMemcpy(back.data(), dev_recv, bytes, cudaMemcpyDeviceToHost));
      check(device ? back.data() : host_recv.data(), count, s->nranks, device ? "device" : "host", bytes);
      std::sort(reps.begin(), reps.end());
      us[device] = reps[reps.size() / 2];
    }
    if (rank == 0) printf("%zu %.2f %.2f %.2f\n", bytes, us[0], us[1], us[0] / us[1]);
  }
  fflush(stdout);
  CUDA(cudaStreamDestroy(stream));
  CUDA(cudaFree(dev_send));
  CUDA(cudaFree(dev_recv));
  NCCL(ncclCommDestroy(comm));
  return 0;
}

int main(int argc, char** argv) {
  int provided;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
  if (provided < MPI_THREAD_SERIALIZED) {
    fprintf(stderr, "MPI gives thread level %d, this needs MPI_THREAD_SERIALIZED\n", provided);
    MPI_Abort(MPI_COMM_WORLD, 1);
  }
  int world_rank, world_size;
  MPI_Comm_rank(MPI_COMM_WORLD, &world_rank);
  MPI_Comm_size(MPI_COMM_WORLD, &world_size);
  Shared s;
  s.threads = argc > 1 ? atoi(argv[1]) : 1;
  s.max_bytes = argc > 2 ? strtoull(argv[2], 0, 0) : (64ull << 20);
  s.nranks = world_size * s.threads;
  s.first_rank = world_rank * s.threads;
  s.seconds.assign(s.threads, 0.0);
  if (world_rank == 0) NCCL(ncclGetUniqueId(&s.id));
  MPI_Bcast(&s.id, sizeof(s.id), MPI_BYTE, 0, MPI_COMM_WORLD);
  pthread_barrier_init(&s.barrier, 0, s.threads);
  std::vector<pthread_t> threads(s.threads);
  std::vector<Rank> ranks(s.threads);
  for (int t = 0; t < s.threads; t++) {
    ranks[t] = Rank{&s, t};
    pthread_create(&threads[t], 0, rank_main, &ranks[t]);
  }
  for (int t = 0; t < s.threads; t++) pthread_join(threads[t], 0);
  pthread_barrier_destroy(&s.barrier);
  MPI_Finalize();
  return 0;
}
