/* Built by tests/packaging/test-c.sh against the CUDA toolkit's own headers (where installed):
 * nccl.h alone must bring in half, __nv_bfloat16 and __nv_fp8_e4m3, as NVIDIA's nccl.h does
 * (nccl-tests' common.cu relies on it). The stand-ins of tests/c/fakecuda are checked in CI. */
#include "nccl.h"

static_assert(sizeof(half) == 2, "half");
static_assert(sizeof(__nv_bfloat16) == 2, "bf16");
static_assert(sizeof(__nv_fp8_e4m3) == 1, "fp8 e4m3");

int main() {
  half h;
  __nv_bfloat16 b;
  __nv_fp8_e4m3 f;
  (void)h;
  (void)b;
  (void)f;
  int version = 0;
  return (ncclGetVersion(&version) == ncclSuccess && version == NCCL_VERSION_CODE && CUDART_VERSION > 0) ? 0 : 1;
}
