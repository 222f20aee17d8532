/* A communicator straight from an MPI communicator (ferroccl extension): no unique id.
 * Splits MPI_COMM_WORLD into halves with MPI, builds a ferroccl communicator on each half,
 * and runs a broadcast, an all-gather and grouped send/recv around a ring on it.
 */
#include <mpi.h>
#include <nccl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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
  int wrank, wsize;
  MPI_Comm_rank(MPI_COMM_WORLD, &wrank);
  MPI_Comm_size(MPI_COMM_WORLD, &wsize);
  MPI_Comm half;
  MPI_Comm_split(MPI_COMM_WORLD, wrank % 2, wrank, &half);

  ncclComm_t comm;
  CHECK(ferrocclCommInitMpiComm(&comm, half)); /* static inline from nccl.h, takes MPI_Comm */
  int rank, n;
  CHECK(ncclCommUserRank(comm, &rank));
  CHECK(ncclCommCount(comm, &n));

  long wrong = 0;
  const size_t count = 4096;
  double* buf = malloc(count * sizeof(double));
  for (size_t i = 0; i < count; i++) buf[i] = rank == 0 ? (double)i * 0.5 : -1.0;
  CHECK(ncclBcast(buf, count, ncclDouble, 0, comm, NULL));
  for (size_t i = 0; i < count; i++) wrong += buf[i] != (double)i * 0.5;

  int* all = malloc((size_t)n * count * sizeof(int));
  int* mine = malloc(count * sizeof(int));
  for (size_t i = 0; i < count; i++) mine[i] = rank * 100000 + (int)i;
  CHECK(ncclAllGather(mine, all, count, ncclInt, comm, NULL));
  for (int r = 0; r < n; r++)
    for (size_t i = 0; i < count; i++) wrong += all[(size_t)r * count + i] != r * 100000 + (int)i;

  int next = (rank + 1) % n, prev = (rank + n - 1) % n;
  int* got = malloc(count * sizeof(int));
  CHECK(ncclGroupStart());
  CHECK(ncclSend(mine, count, ncclInt, next, comm, NULL));
  CHECK(ncclRecv(got, count, ncclInt, prev, comm, NULL));
  CHECK(ncclGroupEnd());
  for (size_t i = 0; i < count; i++) wrong += got[i] != prev * 100000 + (int)i;

  /* The MPI communicator is untouched and still usable. */
  long total = 0;
  MPI_Allreduce(&wrong, &total, 1, MPI_LONG, MPI_SUM, MPI_COMM_WORLD);
  if (wrank == 0) printf("init_mpi: %d world ranks in halves: %s (%ld wrong)\n", wsize, total ? "FAILED" : "OK", total);
  CHECK(ncclCommDestroy(comm));
  MPI_Comm_free(&half);
  free(buf); free(all); free(mine); free(got);
  MPI_Finalize();
  return total ? 1 : 0;
}
