/* Prints nccl.h's constants and struct layouts as "NAME VALUE" lines; tests/fortran/constants.F90
 * prints the same list from the Fortran module and test-fortran.sh diffs the two. */
#include "nccl.h"

#include <stddef.h>
#include <stdio.h>

#define P(name) printf("%s %ld\n", #name, (long)(name))
#define OFF(type, field) printf("offsetof(%s,%s) %ld\n", #type, #field, (long)offsetof(type, field))

int main(void) {
  P(NCCL_MAJOR); P(NCCL_MINOR); P(NCCL_PATCH); P(NCCL_VERSION_CODE);
  P(FERROCCL_VERSION_MAJOR); P(FERROCCL_VERSION_MINOR); P(FERROCCL_VERSION_PATCH);
  P(ncclSuccess); P(ncclUnhandledCudaError); P(ncclSystemError); P(ncclInternalError);
  P(ncclInvalidArgument); P(ncclInvalidUsage); P(ncclRemoteError); P(ncclInProgress);
  P(ncclTimeout); P(ncclNumResults);
  P(ncclInt8); P(ncclChar); P(ncclUint8); P(ncclInt32); P(ncclInt); P(ncclUint32);
  P(ncclInt64); P(ncclUint64); P(ncclFloat16); P(ncclHalf); P(ncclFloat32); P(ncclFloat);
  P(ncclFloat64); P(ncclDouble); P(ncclBfloat16); P(ncclFloat8e4m3); P(ncclFloat8e5m2);
  P(ncclNumTypes);
  P(ncclSum); P(ncclProd); P(ncclMax); P(ncclMin); P(ncclAvg); P(ncclNumOps); P(ncclMaxRedOp);
  P(ncclScalarDevice); P(ncclScalarHostImmediate);
  P(NCCL_UNIQUE_ID_BYTES); P(NCCL_CONFIG_UNDEF_INT); P(NCCL_SPLIT_NOCOLOR);
  printf("NCCL_API_MAGIC %ld\n", (long)(int)NCCL_API_MAGIC);
  P(NCCL_WIN_DEFAULT); P(NCCL_WIN_COLL_SYMMETRIC); P(NCCL_WIN_STRICT_ORDERING);
  P(NCCL_WIN_REQUIRED_ALIGNMENT);
  P(NCCL_CTA_POLICY_DEFAULT); P(NCCL_CTA_POLICY_EFFICIENCY); P(NCCL_CTA_POLICY_ZERO);
  P(NCCL_SHRINK_DEFAULT); P(NCCL_SHRINK_ABORT);
  P(NCCL_ENCRYPTION_MODE_NONE); P(NCCL_ENCRYPTION_MODE_PSK);
  printf("NCCL_UNDEF_FLOAT %.1f\n", (double)NCCL_UNDEF_FLOAT);
  P(sizeof(ncclUniqueId)); P(sizeof(ncclConfig_t)); P(sizeof(ncclSimInfo_t));
  P(sizeof(ncclEncryptionConfig_t));
  OFF(ncclConfig_t, size); OFF(ncclConfig_t, magic); OFF(ncclConfig_t, version);
  OFF(ncclConfig_t, blocking); OFF(ncclConfig_t, cgaClusterSize); OFF(ncclConfig_t, minCTAs);
  OFF(ncclConfig_t, maxCTAs); OFF(ncclConfig_t, netName); OFF(ncclConfig_t, splitShare);
  OFF(ncclConfig_t, trafficClass); OFF(ncclConfig_t, commName); OFF(ncclConfig_t, collnetEnable);
  OFF(ncclConfig_t, CTAPolicy); OFF(ncclConfig_t, shrinkShare); OFF(ncclConfig_t, nvlsCTAs);
  OFF(ncclConfig_t, nChannelsPerNetPeer); OFF(ncclConfig_t, nvlinkCentricSched);
  OFF(ncclConfig_t, graphUsageMode); OFF(ncclConfig_t, numRmaCtx); OFF(ncclConfig_t, maxP2pPeers);
  OFF(ncclConfig_t, graphStreamOrdering);
  OFF(ncclSimInfo_t, magic); OFF(ncclSimInfo_t, version); OFF(ncclSimInfo_t, estimatedTime);
  OFF(ncclEncryptionConfig_t, magic); OFF(ncclEncryptionConfig_t, version);
  OFF(ncclEncryptionConfig_t, mode); OFF(ncclEncryptionConfig_t, psk);
  {
    ncclConfig_t c = NCCL_CONFIG_INITIALIZER;
    ncclSimInfo_t s = NCCL_SIM_INFO_INITIALIZER;
    ncclEncryptionConfig_t e = NCCL_ENCRYPTION_CONFIG_INITIALIZER;
    printf("NCCL_CONFIG_INITIALIZER %ld %ld %ld %ld %d %d\n", (long)c.size, (long)(int)c.magic,
           (long)c.version, (long)c.blocking, c.netName == NULL, c.commName == NULL);
    printf("NCCL_SIM_INFO_INITIALIZER %ld %ld %ld %.1f\n", (long)s.size, (long)(int)s.magic,
           (long)s.version, (double)s.estimatedTime);
    printf("NCCL_ENCRYPTION_CONFIG_INITIALIZER %ld %ld %ld %ld %d\n", (long)e.size,
           (long)(int)e.magic, (long)e.version, (long)e.mode, e.psk == NULL);
  }
  return 0;
}
