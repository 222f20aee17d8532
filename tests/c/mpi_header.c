/* nccl.h included after mpi.h: the MPI_Comm convenience wrappers (ferrocclCommInitMpiComm,
 * ferrocclCommInitMpiCommConfig) must compile cleanly. Compile-only check (test-c.sh). */
#include <mpi.h>

#include "nccl.h"

ncclResult_t init_from_world(ncclComm_t* comm);
ncclResult_t init_from_world_config(ncclComm_t* comm, ncclConfig_t* config);

ncclResult_t init_from_world(ncclComm_t* comm) {
  return ferrocclCommInitMpiComm(comm, MPI_COMM_WORLD);
}

ncclResult_t init_from_world_config(ncclComm_t* comm, ncclConfig_t* config) {
  return ferrocclCommInitMpiCommConfig(comm, MPI_COMM_WORLD, config);
}
