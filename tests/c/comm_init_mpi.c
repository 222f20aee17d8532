/* MPI test: a communicator from MPI_COMM_WORLD through ferrocclCommInitMpi (MPI_Fint handle),
 * checked against MPI's size and rank, then a host-memory allreduce. Run under mpirun -np N.
 * Prints "comm_init_mpi_c: rank R of N: ok" per rank; exits non-zero on failure. */
#include <mpi.h>

#include "nccl.h"

#include <stdio.h>

#define CHECK_NCCL(call)                                                                   \
  do {                                                                                     \
    ncclResult_t r_ = (call);                                                              \
    if (r_ != ncclSuccess) {                                                               \
      fprintf(stderr, "comm_init_mpi_c: rank %d: %s failed: %s (%s)\n", rank, #call,             \
              ncclGetErrorString(r_), ncclGetLastError(NULL));                             \
      MPI_Abort(MPI_COMM_WORLD, 1);                                                        \
    }                                                                                      \
  } while (0)

int main(int argc, char** argv) {
  int rank = 0, size = 0, ncclRank = -1, ncclSize = -1, i, bad = 0;
  ncclComm_t comm = NULL;
  double send[16], recv[16];

  MPI_Init(&argc, &argv);
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);

  CHECK_NCCL(ferrocclCommInitMpi(&comm, (int)MPI_Comm_c2f(MPI_COMM_WORLD)));
  CHECK_NCCL(ncclCommCount(comm, &ncclSize));
  CHECK_NCCL(ncclCommUserRank(comm, &ncclRank));
  if (ncclSize != size || ncclRank != rank) {
    fprintf(stderr, "comm_init_mpi_c: rank %d: nccl says rank %d of %d, MPI says %d of %d\n", rank,
            ncclRank, ncclSize, rank, size);
    bad = 1;
  }
  for (i = 0; i < 16; i++) send[i] = (double)(rank + 1) * (i + 1);
  CHECK_NCCL(ncclAllReduce(send, recv, 16, ncclFloat64, ncclSum, comm, NULL));
  for (i = 0; i < 16; i++) {
    double want = (double)size * (size + 1) / 2 * (i + 1);
    if (recv[i] != want) {
      fprintf(stderr, "comm_init_mpi_c: rank %d: recv[%d] = %g, want %g\n", rank, i, recv[i], want);
      bad = 1;
      break;
    }
  }
  CHECK_NCCL(ncclCommDestroy(comm));
  /* The caller's communicator is still usable. */
  MPI_Allreduce(MPI_IN_PLACE, &bad, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  if (!bad) printf("comm_init_mpi_c: rank %d of %d: ok\n", rank, size);
  MPI_Finalize();
  return bad;
}
