/* All-reduce across MPI ranks with NCCL's classic pattern: rank 0 makes a unique id, MPI
 * broadcasts it, every rank calls ncclCommInitRank. Host buffers: each call returns when the
 * operation is complete for this rank. Checks every result; exit code 0 only if all match.
 *
 *   mpicc allreduce_mpi.c -I<prefix>/include -L<prefix>/lib -lnccl -o allreduce_mpi
 *   mpirun -np 4 ./allreduce_mpi
 */
#include <mpi.h>
#include <nccl.h>
#include <stdio.h>
#include <stdlib.h>

#define CHECK(cmd) do {                                                         \
    ncclResult_t r_ = (cmd);                                                    \
    if (r_ != ncclSuccess) {                                                    \
      fprintf(stderr, "%s:%d %s failed: %s (%s)\n", __FILE__, __LINE__, #cmd,   \
              ncclGetErrorString(r_), ncclGetLastError(NULL));                  \
      MPI_Abort(MPI_COMM_WORLD, 1);                                             \
    }                                                                           \
  } while (0)

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int rank, nranks;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &nranks);

  ncclUniqueId id;
  if (rank == 0) CHECK(ncclGetUniqueId(&id));
  MPI_Bcast(&id, sizeof(id), MPI_BYTE, 0, MPI_COMM_WORLD);
  ncclComm_t comm;
  CHECK(ncclCommInitRank(&comm, nranks, id, rank));

  const size_t count = 1 << 20;
  float* send = malloc(count * sizeof(float));
  float* recv = malloc(count * sizeof(float));
  for (size_t i = 0; i < count; i++) send[i] = (float)(rank + 1) + (float)(i % 5);
  CHECK(ncclAllReduce(send, recv, count, ncclFloat, ncclSum, comm, NULL));

  long wrong = 0;
  for (size_t i = 0; i < count; i++) {
    float want = (float)(nranks * (nranks + 1) / 2) + (float)(nranks * (int)(i % 5));
    if (recv[i] != want) wrong++;
  }
  /* In place, integer max. */
  int* v = malloc(count * sizeof(int));
  for (size_t i = 0; i < count; i++) v[i] = (int)((i * 7 + (size_t)rank * 13) % 1000);
  CHECK(ncclAllReduce(v, v, count, ncclInt32, ncclMax, comm, NULL));
  for (size_t i = 0; i < count; i++) {
    int want = 0;
    for (int r = 0; r < nranks; r++) {
      int x = (int)((i * 7 + (size_t)r * 13) % 1000);
      if (x > want) want = x;
    }
    if (v[i] != want) wrong++;
  }
  long total = 0;
  MPI_Allreduce(&wrong, &total, 1, MPI_LONG, MPI_SUM, MPI_COMM_WORLD);
  if (rank == 0) printf("allreduce_mpi: %d ranks, %zu floats: %s (%ld wrong)\n", nranks, count, total ? "FAILED" : "OK", total);
  CHECK(ncclCommDestroy(comm));
  free(send); free(recv); free(v);
  MPI_Finalize();
  return total ? 1 : 0;
}
