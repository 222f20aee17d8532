/* MPI test: communicators made again and again from MPI_COMM_WORLD through ferrocclCommInitMpi
 * in the same processes, each used for an all-reduce and then ended by ncclCommAbort (as after
 * a failure) or ncclCommDestroy; the file descriptors and threads of each process must not
 * grow from the second cycle on (the first creates what lives for the whole process).
 * Run under mpirun -np N. Prints "recreate_mpi: rank R of N: ok (fds A -> B, threads C -> D)". */
#include <mpi.h>

#include "nccl.h"

#include <dirent.h>
#include <stdio.h>
#include <unistd.h>

#define CHECK_NCCL(call)                                                                   \
  do {                                                                                     \
    ncclResult_t r_ = (call);                                                              \
    if (r_ != ncclSuccess) {                                                               \
      fprintf(stderr, "recreate_mpi: rank %d: %s failed: %s (%s)\n", rank, #call,           \
              ncclGetErrorString(r_), ncclGetLastError(NULL));                             \
      MPI_Abort(MPI_COMM_WORLD, 1);                                                        \
    }                                                                                      \
  } while (0)

static int count_entries(const char* path) {
  int n = 0;
  DIR* d = opendir(path);
  if (!d) return -1;
  while (readdir(d)) n++;
  closedir(d);
  return n;
}

static int cycle(int rank, int size, int end_by_abort) {
  ncclComm_t comm = NULL;
  float send[1024], recv[1024];
  int i;
  CHECK_NCCL(ferrocclCommInitMpi(&comm, (int)MPI_Comm_c2f(MPI_COMM_WORLD)));
  for (i = 0; i < 1024; i++) send[i] = (float)(rank + i % 3);
  CHECK_NCCL(ncclAllReduce(send, recv, 1024, ncclFloat32, ncclSum, comm, NULL));
  for (i = 0; i < 1024; i++) {
    float want = (float)size * (size - 1) / 2 + (float)size * (i % 3);
    if (recv[i] != want) {
      fprintf(stderr, "recreate_mpi: rank %d: recv[%d] = %g, want %g\n", rank, i, recv[i], want);
      return 1;
    }
  }
  CHECK_NCCL(end_by_abort ? ncclCommAbort(comm) : ncclCommDestroy(comm));
  return 0;
}

int main(int argc, char** argv) {
  int rank = 0, size = 0, bad = 0, c, fds0, tasks0, fds1, tasks1, tries;
  MPI_Init(&argc, &argv);
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  bad |= cycle(rank, size, 1);
  fds0 = count_entries("/proc/self/fd");
  tasks0 = count_entries("/proc/self/task");
  for (c = 0; c < 6 && !bad; c++) bad |= cycle(rank, size, c % 2 == 0);
  /* Threads of aborted communicators may take a moment to exit. */
  for (tries = 0; tries < 100; tries++) {
    fds1 = count_entries("/proc/self/fd");
    tasks1 = count_entries("/proc/self/task");
    if (fds1 <= fds0 && tasks1 <= tasks0) break;
    usleep(50000);
  }
  if (fds1 > fds0 || tasks1 > tasks0) {
    fprintf(stderr, "recreate_mpi: rank %d: leaked: fds %d -> %d, threads %d -> %d\n", rank, fds0, fds1,
            tasks0, tasks1);
    bad = 1;
  }
  MPI_Allreduce(MPI_IN_PLACE, &bad, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  if (!bad)
    printf("recreate_mpi: rank %d of %d: ok (fds %d -> %d, threads %d -> %d)\n", rank, size, fds0, fds1, tasks0,
           tasks1);
  MPI_Finalize();
  return bad;
}
