/* Link test: the smallest program using libnccl. Prints the version and checks that the
 * library matches the header it was compiled against. */
#include "nccl.h"

#include <stdio.h>

int main(void) {
  int version = 0;
  ncclResult_t r = ncclGetVersion(&version);
  if (r != ncclSuccess) {
    fprintf(stderr, "ncclGetVersion failed: %s\n", ncclGetErrorString(r));
    return 1;
  }
  printf("ncclGetVersion: %d (header %d, ferroccl %d.%d.%d)\n", version, NCCL_VERSION_CODE,
         FERROCCL_VERSION_MAJOR, FERROCCL_VERSION_MINOR, FERROCCL_VERSION_PATCH);
  return version == NCCL_VERSION_CODE ? 0 : 1;
}
