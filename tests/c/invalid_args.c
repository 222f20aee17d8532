/* Bad arguments from C: each call must fail with NCCL's code, have no effect, and leave a
 * message for ncclGetLastError. Prints one line per check and "N passed, M failed"; exits
 * non-zero on any failure.
 *
 * FERROCCL_EXPECT_TLS=1|0 (set by tests/packaging/test-c.sh from the build) selects what a
 * valid PSK must give: ncclSuccess with TLS, ncclInvalidUsage (fail closed) without. */
#include "nccl.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int passed = 0;
static int failed = 0;

static const char* code_name(ncclResult_t r) {
  switch (r) {
    case ncclSuccess: return "ncclSuccess";
    case ncclUnhandledCudaError: return "ncclUnhandledCudaError";
    case ncclSystemError: return "ncclSystemError";
    case ncclInternalError: return "ncclInternalError";
    case ncclInvalidArgument: return "ncclInvalidArgument";
    case ncclInvalidUsage: return "ncclInvalidUsage";
    case ncclRemoteError: return "ncclRemoteError";
    case ncclInProgress: return "ncclInProgress";
    case ncclTimeout: return "ncclTimeout";
    default: return "(unknown)";
  }
}

static void report(int ok, const char* what, const char* detail) {
  if (ok) {
    passed++;
    printf("PASS %s\n", what);
  } else {
    failed++;
    printf("FAIL %s%s%s\n", what, detail[0] ? ": " : "", detail);
  }
}

/* `got` must equal `want`; for error codes, ncclGetLastError must say something. */
static void expect(const char* what, ncclResult_t got, ncclResult_t want) {
  char detail[512];
  detail[0] = '\0';
  int ok = got == want;
  if (!ok) {
    snprintf(detail, sizeof detail, "got %s (%d), want %s (%d); last error \"%s\"",
             code_name(got), (int)got, code_name(want), (int)want, ncclGetLastError(NULL));
  } else if (want != ncclSuccess && want != ncclInProgress) {
    const char* msg = ncclGetLastError(NULL);
    if (msg == NULL || msg[0] == '\0') {
      ok = 0;
      snprintf(detail, sizeof detail, "right code %s but ncclGetLastError(NULL) is empty",
               code_name(got));
    }
  }
  report(ok, what, detail);
}

static void expect_string(ncclResult_t code, const char* want) {
  char what[96];
  char detail[512];
  const char* got = ncclGetErrorString(code);
  snprintf(what, sizeof what, "ncclGetErrorString(%d)", (int)code);
  int ok = got != NULL && strcmp(got, want) == 0;
  snprintf(detail, sizeof detail, "got \"%s\", want \"%s\"", got ? got : "(NULL)", want);
  report(ok, what, ok ? "" : detail);
}

int main(void) {
  ncclComm_t comm = NULL;
  ncclComm_t out = NULL;
  ncclUniqueId id;
  int value = -12345;
  float sendbuf[4] = {1, 2, 3, 4};
  float recvbuf[4] = {0, 0, 0, 0};
  const char* expect_tls = getenv("FERROCCL_EXPECT_TLS");

  /* ---- encryption: process-global and fixed once a unique id exists, so it comes first
   *      (and is reset to plaintext before anything else). */
  {
    static const char key[] = "0123456789abcdef0123456789abcdef0123456789abcdef";
    ncclEncryptionConfig_t enc = NCCL_ENCRYPTION_CONFIG_INITIALIZER;
    enc.magic = 0;
    enc.mode = NCCL_ENCRYPTION_MODE_PSK;
    enc.psk = key;
    expect("ncclSetEncryption(bad magic)", ncclSetEncryption(&enc), ncclInvalidArgument);
    enc.magic = NCCL_API_MAGIC;
    enc.psk = NULL;
    expect("ncclSetEncryption(PSK mode, NULL psk)", ncclSetEncryption(&enc), ncclInvalidArgument);
    enc.psk = "too short";
    expect("ncclSetEncryption(psk < 32 bytes)", ncclSetEncryption(&enc), ncclInvalidArgument);
    enc.mode = 7;
    enc.psk = key;
    expect("ncclSetEncryption(mode 7)", ncclSetEncryption(&enc), ncclInvalidArgument);
    enc.mode = NCCL_ENCRYPTION_MODE_PSK;
    ncclResult_t r = ncclSetEncryption(&enc);
    if (expect_tls != NULL && strcmp(expect_tls, "1") == 0) {
      expect("ncclSetEncryption(valid PSK, TLS build)", r, ncclSuccess);
    } else if (expect_tls != NULL && strcmp(expect_tls, "0") == 0) {
      expect("ncclSetEncryption(valid PSK, no-TLS build fails closed)", r, ncclInvalidUsage);
    } else {
      report(r == ncclSuccess || r == ncclInvalidUsage, "ncclSetEncryption(valid PSK)", code_name(r));
    }
    expect("ncclSetEncryption(NULL) = plaintext", ncclSetEncryption(NULL), ncclSuccess);
  }

  /* ---- error strings: NCCL's exact texts */
  expect_string(ncclSuccess, "no error");
  expect_string(ncclUnhandledCudaError, "unhandled cuda error (run with NCCL_DEBUG=INFO for details)");
  expect_string(ncclSystemError, "unhandled system error (run with NCCL_DEBUG=INFO for details)");
  expect_string(ncclInternalError, "internal error - please report this issue to the NCCL developers");
  expect_string(ncclInvalidArgument, "invalid argument (run with NCCL_DEBUG=WARN for details)");
  expect_string(ncclInvalidUsage, "invalid usage (run with NCCL_DEBUG=WARN for details)");
  expect_string(ncclRemoteError, "remote process exited or there was a network error");
  expect_string(ncclInProgress, "NCCL operation in progress");
  expect_string(ncclTimeout, "timeout");
  expect_string(ncclNumResults, "unknown result code");
  expect_string((ncclResult_t)42, "unknown result code");
  expect_string((ncclResult_t)-1, "unknown result code");

  /* ---- no communicator needed */
  expect("ncclGetVersion(NULL)", ncclGetVersion(NULL), ncclInvalidArgument);
  expect("ncclGetUniqueId(NULL)", ncclGetUniqueId(NULL), ncclInvalidArgument);
  memset(&id, 0, sizeof id);
  expect("ncclGetUniqueId(&id)", ncclGetUniqueId(&id), ncclSuccess);
  expect("ncclCommInitRank(NULL comm*)", ncclCommInitRank(NULL, 1, id, 0), ncclInvalidArgument);
  out = NULL;
  expect("ncclCommInitRank(nranks 0)", ncclCommInitRank(&out, 0, id, 0), ncclInvalidArgument);
  report(out == NULL, "ncclCommInitRank(nranks 0) leaves *comm untouched", "");
  expect("ncclCommInitRank(nranks -1)", ncclCommInitRank(&out, -1, id, 0), ncclInvalidArgument);
  expect("ncclCommInitRank(rank == nranks)", ncclCommInitRank(&out, 2, id, 2), ncclInvalidArgument);
  expect("ncclCommInitRank(rank -1)", ncclCommInitRank(&out, 2, id, -1), ncclInvalidArgument);
  {
    ncclConfig_t bad = NCCL_CONFIG_INITIALIZER;
    bad.magic = 0x12345678u;
    expect("ncclCommInitRankConfig(bad magic)", ncclCommInitRankConfig(&out, 1, id, 0, &bad),
           ncclInvalidArgument);
  }
  report(out == NULL, "failed inits leave *comm untouched", "");

  expect("ncclAllReduce(NULL comm)",
         ncclAllReduce(sendbuf, recvbuf, 4, ncclFloat32, ncclSum, NULL, NULL), ncclInvalidArgument);
  expect("ncclBroadcast(NULL comm)", ncclBroadcast(sendbuf, recvbuf, 4, ncclFloat32, 0, NULL, NULL),
         ncclInvalidArgument);
  expect("ncclSend(NULL comm)", ncclSend(sendbuf, 4, ncclFloat32, 0, NULL, NULL), ncclInvalidArgument);
  expect("ncclRecv(NULL comm)", ncclRecv(recvbuf, 4, ncclFloat32, 0, NULL, NULL), ncclInvalidArgument);
  expect("ncclCommCount(NULL comm)", ncclCommCount(NULL, &value), ncclInvalidArgument);
  expect("ncclCommUserRank(NULL comm)", ncclCommUserRank(NULL, &value), ncclInvalidArgument);
  expect("ncclCommCuDevice(NULL comm)", ncclCommCuDevice(NULL, &value), ncclInvalidArgument);
  report(value == -12345, "failed queries leave the out-parameter untouched", "");
  {
    ncclResult_t async = ncclSuccess;
    expect("ncclCommGetAsyncError(NULL comm)", ncclCommGetAsyncError(NULL, &async), ncclInvalidArgument);
  }
  /* NCCL returns ncclSuccess for ncclCommDestroy(NULL) / ncclCommAbort(NULL). */
  expect("ncclCommDestroy(NULL)", ncclCommDestroy(NULL), ncclSuccess);
  expect("ncclCommAbort(NULL)", ncclCommAbort(NULL), ncclSuccess);

  /* ---- with a single-rank communicator (host memory, no GPU needed) */
  ncclResult_t init = ncclGetUniqueId(&id);
  if (init == ncclSuccess) init = ncclCommInitRank(&comm, 1, id, 0);
  expect("ncclCommInitRank(1 rank) for the checks below", init, ncclSuccess);
  if (init == ncclSuccess && comm != NULL) {
    expect("ncclAllReduce(dtype 99)",
           ncclAllReduce(sendbuf, recvbuf, 4, (ncclDataType_t)99, ncclSum, comm, NULL), ncclInvalidArgument);
    expect("ncclAllReduce(dtype -1)",
           ncclAllReduce(sendbuf, recvbuf, 4, (ncclDataType_t)-1, ncclSum, comm, NULL), ncclInvalidArgument);
    expect("ncclAllReduce(dtype ncclNumTypes)",
           ncclAllReduce(sendbuf, recvbuf, 4, ncclNumTypes, ncclSum, comm, NULL), ncclInvalidArgument);
    expect("ncclAllReduce(op 99, not a PreMulSum handle)",
           ncclAllReduce(sendbuf, recvbuf, 4, ncclFloat32, (ncclRedOp_t)99, comm, NULL), ncclInvalidArgument);
    expect("ncclAllReduce(op -1)",
           ncclAllReduce(sendbuf, recvbuf, 4, ncclFloat32, (ncclRedOp_t)-1, comm, NULL), ncclInvalidArgument);
    expect("ncclAllReduce(NULL sendbuff, count 4)",
           ncclAllReduce(NULL, recvbuf, 4, ncclFloat32, ncclSum, comm, NULL), ncclInvalidArgument);
    expect("ncclReduce(root 1 of 1)",
           ncclReduce(sendbuf, recvbuf, 4, ncclFloat32, ncclSum, 1, comm, NULL), ncclInvalidArgument);
    expect("ncclBroadcast(root -1)", ncclBroadcast(sendbuf, recvbuf, 4, ncclFloat32, -1, comm, NULL),
           ncclInvalidArgument);
    expect("ncclSend(peer 1 of 1)", ncclSend(sendbuf, 4, ncclFloat32, 1, comm, NULL), ncclInvalidArgument);
    expect("ncclRecv(peer -1)", ncclRecv(recvbuf, 4, ncclFloat32, -1, comm, NULL), ncclInvalidArgument);
    expect("ncclCommCount(NULL out)", ncclCommCount(comm, NULL), ncclInvalidArgument);
    expect("ncclCommUserRank(NULL out)", ncclCommUserRank(comm, NULL), ncclInvalidArgument);
    expect("ncclCommSplit(NULL newcomm)", ncclCommSplit(comm, 0, 0, NULL, NULL), ncclInvalidArgument);
    {
      ncclRedOp_t op;
      float scalar = 2.0f;
      expect("ncclRedOpCreatePreMulSum(NULL op)",
             ncclRedOpCreatePreMulSum(NULL, &scalar, ncclFloat32, ncclScalarHostImmediate, comm),
             ncclInvalidArgument);
      expect("ncclRedOpCreatePreMulSum(dtype 99)",
             ncclRedOpCreatePreMulSum(&op, &scalar, (ncclDataType_t)99, ncclScalarHostImmediate, comm),
             ncclInvalidArgument);
      expect("ncclRedOpCreatePreMulSum(residence 7)",
             ncclRedOpCreatePreMulSum(&op, &scalar, ncclFloat32, (ncclScalarResidence_t)7, comm),
             ncclInvalidArgument);
      expect("ncclRedOpDestroy(ncclSum)", ncclRedOpDestroy(ncclSum, comm), ncclInvalidArgument);
    }
    /* The communicator still works after all that. */
    value = 0;
    expect("ncclCommCount after bad calls", ncclCommCount(comm, &value), ncclSuccess);
    report(value == 1, "ncclCommCount == 1", "");
    expect("ncclAllReduce(valid, 1 rank)",
           ncclAllReduce(sendbuf, recvbuf, 4, ncclFloat32, ncclSum, comm, NULL), ncclSuccess);
    report(recvbuf[0] == 1 && recvbuf[3] == 4, "1-rank allreduce copies sendbuff", "");
    expect("ncclCommDestroy", ncclCommDestroy(comm), ncclSuccess);
  }

  printf("%d passed, %d failed\n", passed, failed);
  return failed == 0 ? 0 : 1;
}
