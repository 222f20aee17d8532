/* Compile-time checks of nccl.h's ABI against NVIDIA NCCL's (NCCL 2.27 layout, LP64).
 *
 * Built by tests/packaging/test-c.sh as C99 and C11 (-std=c99/-std=c11 -Wall -Wextra -pedantic
 * -Werror), as C++11 through abi_static_asserts.cpp, each also with -DWITH_FAKE_CUDA
 * (tests/c/fakecuda/cuda_runtime.h included before nccl.h). The program is linked against
 * libnccl and run: main() checks what is not a constant expression (the initializer macros)
 * and calls ncclGetVersion, which proves the C/C++ linkage of the declarations. */
#ifdef WITH_FAKE_CUDA
#include <cuda_runtime.h>
#endif
#include "nccl.h"

#include <limits.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>

#if defined(__cplusplus)
#define ABI_ASSERT(cond, msg) static_assert(cond, msg)
#elif defined(__STDC_VERSION__) && __STDC_VERSION__ >= 201112L
#define ABI_ASSERT(cond, msg) _Static_assert(cond, msg)
#else /* C99: a negative array size fails the build */
#define ABI_CAT_(a, b) a##b
#define ABI_CAT(a, b) ABI_CAT_(a, b)
#define ABI_ASSERT(cond, msg) typedef char ABI_CAT(abi_assert_line_, __LINE__)[(cond) ? 1 : -1]
#endif

/* ---- sizes */
ABI_ASSERT(sizeof(ncclUniqueId) == 128, "sizeof(ncclUniqueId)");
ABI_ASSERT(NCCL_UNIQUE_ID_BYTES == 128, "NCCL_UNIQUE_ID_BYTES");
ABI_ASSERT(sizeof(ncclConfig_t) == 96, "sizeof(ncclConfig_t)");
ABI_ASSERT(sizeof(ncclEncryptionConfig_t) == 32, "sizeof(ncclEncryptionConfig_t)");
ABI_ASSERT(sizeof(ncclSimInfo_t) == 24, "sizeof(ncclSimInfo_t)");
ABI_ASSERT(sizeof(ncclResult_t) == 4, "sizeof(ncclResult_t)");
ABI_ASSERT(sizeof(ncclDataType_t) == 4, "sizeof(ncclDataType_t)");
ABI_ASSERT(sizeof(ncclRedOp_t) == 4, "sizeof(ncclRedOp_t)");
ABI_ASSERT(sizeof(ncclScalarResidence_t) == 4, "sizeof(ncclScalarResidence_t)");
ABI_ASSERT(sizeof(ncclComm_t) == sizeof(void*), "sizeof(ncclComm_t)");
ABI_ASSERT(sizeof(ncclWindow_t) == sizeof(void*), "sizeof(ncclWindow_t)");
ABI_ASSERT(sizeof(cudaStream_t) == sizeof(void*), "sizeof(cudaStream_t)");

/* ---- ncclConfig_t offsets (nccl-reference.md section 3) */
ABI_ASSERT(offsetof(ncclConfig_t, size) == 0, "ncclConfig_t.size");
ABI_ASSERT(offsetof(ncclConfig_t, magic) == 8, "ncclConfig_t.magic");
ABI_ASSERT(offsetof(ncclConfig_t, version) == 12, "ncclConfig_t.version");
ABI_ASSERT(offsetof(ncclConfig_t, blocking) == 16, "ncclConfig_t.blocking");
ABI_ASSERT(offsetof(ncclConfig_t, cgaClusterSize) == 20, "ncclConfig_t.cgaClusterSize");
ABI_ASSERT(offsetof(ncclConfig_t, minCTAs) == 24, "ncclConfig_t.minCTAs");
ABI_ASSERT(offsetof(ncclConfig_t, maxCTAs) == 28, "ncclConfig_t.maxCTAs");
ABI_ASSERT(offsetof(ncclConfig_t, netName) == 32, "ncclConfig_t.netName");
ABI_ASSERT(offsetof(ncclConfig_t, splitShare) == 40, "ncclConfig_t.splitShare");
ABI_ASSERT(offsetof(ncclConfig_t, trafficClass) == 44, "ncclConfig_t.trafficClass");
ABI_ASSERT(offsetof(ncclConfig_t, commName) == 48, "ncclConfig_t.commName");
ABI_ASSERT(offsetof(ncclConfig_t, collnetEnable) == 56, "ncclConfig_t.collnetEnable");
ABI_ASSERT(offsetof(ncclConfig_t, CTAPolicy) == 60, "ncclConfig_t.CTAPolicy");
ABI_ASSERT(offsetof(ncclConfig_t, shrinkShare) == 64, "ncclConfig_t.shrinkShare");
ABI_ASSERT(offsetof(ncclConfig_t, nvlsCTAs) == 68, "ncclConfig_t.nvlsCTAs");
ABI_ASSERT(offsetof(ncclConfig_t, nChannelsPerNetPeer) == 72, "ncclConfig_t.nChannelsPerNetPeer");
ABI_ASSERT(offsetof(ncclConfig_t, nvlinkCentricSched) == 76, "ncclConfig_t.nvlinkCentricSched");
ABI_ASSERT(offsetof(ncclConfig_t, graphUsageMode) == 80, "ncclConfig_t.graphUsageMode");
ABI_ASSERT(offsetof(ncclConfig_t, numRmaCtx) == 84, "ncclConfig_t.numRmaCtx");
ABI_ASSERT(offsetof(ncclConfig_t, maxP2pPeers) == 88, "ncclConfig_t.maxP2pPeers");
ABI_ASSERT(offsetof(ncclConfig_t, graphStreamOrdering) == 92, "ncclConfig_t.graphStreamOrdering");

/* ---- ncclEncryptionConfig_t / ncclSimInfo_t offsets */
ABI_ASSERT(offsetof(ncclEncryptionConfig_t, size) == 0, "ncclEncryptionConfig_t.size");
ABI_ASSERT(offsetof(ncclEncryptionConfig_t, magic) == 8, "ncclEncryptionConfig_t.magic");
ABI_ASSERT(offsetof(ncclEncryptionConfig_t, version) == 12, "ncclEncryptionConfig_t.version");
ABI_ASSERT(offsetof(ncclEncryptionConfig_t, mode) == 16, "ncclEncryptionConfig_t.mode");
ABI_ASSERT(offsetof(ncclEncryptionConfig_t, psk) == 24, "ncclEncryptionConfig_t.psk");
ABI_ASSERT(offsetof(ncclSimInfo_t, magic) == 8, "ncclSimInfo_t.magic");
ABI_ASSERT(offsetof(ncclSimInfo_t, version) == 12, "ncclSimInfo_t.version");
ABI_ASSERT(offsetof(ncclSimInfo_t, estimatedTime) == 16, "ncclSimInfo_t.estimatedTime");

/* ---- ncclResult_t */
ABI_ASSERT(ncclSuccess == 0, "ncclSuccess");
ABI_ASSERT(ncclUnhandledCudaError == 1, "ncclUnhandledCudaError");
ABI_ASSERT(ncclSystemError == 2, "ncclSystemError");
ABI_ASSERT(ncclInternalError == 3, "ncclInternalError");
ABI_ASSERT(ncclInvalidArgument == 4, "ncclInvalidArgument");
ABI_ASSERT(ncclInvalidUsage == 5, "ncclInvalidUsage");
ABI_ASSERT(ncclRemoteError == 6, "ncclRemoteError");
ABI_ASSERT(ncclInProgress == 7, "ncclInProgress");
ABI_ASSERT(ncclTimeout == 8, "ncclTimeout");
ABI_ASSERT(ncclNumResults == 9, "ncclNumResults");

/* ---- ncclDataType_t, aliases included */
ABI_ASSERT(ncclInt8 == 0 && ncclChar == 0, "ncclInt8/ncclChar");
ABI_ASSERT(ncclUint8 == 1, "ncclUint8");
ABI_ASSERT(ncclInt32 == 2 && ncclInt == 2, "ncclInt32/ncclInt");
ABI_ASSERT(ncclUint32 == 3, "ncclUint32");
ABI_ASSERT(ncclInt64 == 4, "ncclInt64");
ABI_ASSERT(ncclUint64 == 5, "ncclUint64");
ABI_ASSERT(ncclFloat16 == 6 && ncclHalf == 6, "ncclFloat16/ncclHalf");
ABI_ASSERT(ncclFloat32 == 7 && ncclFloat == 7, "ncclFloat32/ncclFloat");
ABI_ASSERT(ncclFloat64 == 8 && ncclDouble == 8, "ncclFloat64/ncclDouble");
ABI_ASSERT(ncclBfloat16 == 9, "ncclBfloat16");
ABI_ASSERT(ncclFloat8e4m3 == 10, "ncclFloat8e4m3");
ABI_ASSERT(ncclFloat8e5m2 == 11, "ncclFloat8e5m2");
ABI_ASSERT(ncclNumTypes == 12, "ncclNumTypes");

/* ---- ncclRedOp_t */
ABI_ASSERT(ncclSum == 0, "ncclSum");
ABI_ASSERT(ncclProd == 1, "ncclProd");
ABI_ASSERT(ncclMax == 2, "ncclMax");
ABI_ASSERT(ncclMin == 3, "ncclMin");
ABI_ASSERT(ncclAvg == 4, "ncclAvg");
ABI_ASSERT(ncclNumOps == 5, "ncclNumOps");
ABI_ASSERT(ncclMaxRedOp == 0x7fffffff, "ncclMaxRedOp");

/* ---- ncclScalarResidence_t */
ABI_ASSERT(ncclScalarDevice == 0, "ncclScalarDevice");
ABI_ASSERT(ncclScalarHostImmediate == 1, "ncclScalarHostImmediate");

/* ---- macros */
ABI_ASSERT(NCCL_VERSION(2, 27, 7) == 22707, "NCCL_VERSION(2,27,7)");
ABI_ASSERT(NCCL_VERSION(2, 30, 7) == 23007, "NCCL_VERSION(2,30,7)");
ABI_ASSERT(NCCL_VERSION_CODE == NCCL_VERSION(NCCL_MAJOR, NCCL_MINOR, NCCL_PATCH), "NCCL_VERSION_CODE");
ABI_ASSERT(NCCL_VERSION_CODE < NCCL_VERSION(2, 28, 0), "header must advertise <= 2.27.x (no device API)");
ABI_ASSERT(NCCL_VERSION_CODE >= NCCL_VERSION(2, 27, 0), "header must advertise >= 2.27.0");
ABI_ASSERT(NCCL_CONFIG_UNDEF_INT == INT_MIN, "NCCL_CONFIG_UNDEF_INT");
ABI_ASSERT(NCCL_SPLIT_NOCOLOR == -1, "NCCL_SPLIT_NOCOLOR");
ABI_ASSERT(NCCL_API_MAGIC == 0xcafebeef, "NCCL_API_MAGIC");
ABI_ASSERT(NCCL_ENCRYPTION_MODE_NONE == 0, "NCCL_ENCRYPTION_MODE_NONE");
ABI_ASSERT(NCCL_ENCRYPTION_MODE_PSK == 1, "NCCL_ENCRYPTION_MODE_PSK");
ABI_ASSERT(FERROCCL_VERSION_MAJOR >= 0 && FERROCCL_VERSION_MINOR >= 0 && FERROCCL_VERSION_PATCH >= 0,
           "FERROCCL_VERSION_*");

static int failures = 0;

#define CHECK(cond)                                                              \
  do {                                                                           \
    if (!(cond)) {                                                               \
      fprintf(stderr, "abi_static_asserts: FAILED %s (line %d)\n", #cond, __LINE__); \
      failures++;                                                                \
    }                                                                            \
  } while (0)

int main(void) {
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  ncclSimInfo_t sim = NCCL_SIM_INFO_INITIALIZER;
  ncclEncryptionConfig_t enc = NCCL_ENCRYPTION_CONFIG_INITIALIZER;
  ncclComm_t comm = NCCL_COMM_NULL;
  int version = 0;

  CHECK(config.size == sizeof(ncclConfig_t));
  CHECK(config.magic == 0xcafebeef);
  CHECK(config.version == NCCL_VERSION_CODE);
  CHECK(config.blocking == NCCL_CONFIG_UNDEF_INT);
  CHECK(config.cgaClusterSize == NCCL_CONFIG_UNDEF_INT);
  CHECK(config.minCTAs == NCCL_CONFIG_UNDEF_INT);
  CHECK(config.maxCTAs == NCCL_CONFIG_UNDEF_INT);
  CHECK(config.netName == NULL);
  CHECK(config.splitShare == NCCL_CONFIG_UNDEF_INT);
  CHECK(config.trafficClass == NCCL_CONFIG_UNDEF_INT);
  CHECK(config.commName == NULL);
  CHECK(config.collnetEnable == NCCL_CONFIG_UNDEF_INT);
  CHECK(config.CTAPolicy == NCCL_CONFIG_UNDEF_INT);
  CHECK(config.shrinkShare == NCCL_CONFIG_UNDEF_INT);
  CHECK(config.nvlsCTAs == NCCL_CONFIG_UNDEF_INT);
  CHECK(config.nChannelsPerNetPeer == NCCL_CONFIG_UNDEF_INT);
  CHECK(config.nvlinkCentricSched == NCCL_CONFIG_UNDEF_INT);
  CHECK(config.graphUsageMode == NCCL_CONFIG_UNDEF_INT);
  CHECK(config.numRmaCtx == NCCL_CONFIG_UNDEF_INT);
  CHECK(config.maxP2pPeers == NCCL_CONFIG_UNDEF_INT);
  CHECK(config.graphStreamOrdering == NCCL_CONFIG_UNDEF_INT);

  CHECK(sim.size == sizeof(ncclSimInfo_t));
  CHECK(sim.magic == 0x74685283);
  CHECK(sim.version == NCCL_VERSION_CODE);
  CHECK(sim.estimatedTime == NCCL_UNDEF_FLOAT);

  CHECK(enc.size == sizeof(ncclEncryptionConfig_t));
  CHECK(enc.magic == NCCL_API_MAGIC);
  CHECK(enc.mode == NCCL_ENCRYPTION_MODE_NONE);
  CHECK(enc.psk == NULL);

  CHECK(comm == NULL);
  CHECK(ncclGetVersion(&version) == ncclSuccess);
  CHECK(version == NCCL_VERSION_CODE);

  if (failures != 0) {
    fprintf(stderr, "abi_static_asserts: %d runtime check(s) failed\n", failures);
    return 1;
  }
  printf("abi_static_asserts: ok (NCCL %d.%d.%d, code %d, ferroccl %d.%d.%d)\n", NCCL_MAJOR,
         NCCL_MINOR, NCCL_PATCH, version, FERROCCL_VERSION_MAJOR, FERROCCL_VERSION_MINOR,
         FERROCCL_VERSION_PATCH);
  return 0;
}
