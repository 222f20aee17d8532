/* nccl.h brings in CUDA's headers when they are on the include path, as NVIDIA's nccl.h does:
 * CUDA clients (nccl-tests' common.cu) use `half` and friends without including cuda_fp16.h.
 * Built by tests/packaging/test-c.sh with -I tests/c/fakecuda (stand-ins for CUDA's headers),
 * without including any CUDA header itself. Without that include path, the same file must
 * fail (checked there too), which proves the test can fail. */
#include "nccl.h"

#ifndef CUDART_VERSION
#error "nccl.h did not include cuda_runtime.h although it is on the include path"
#endif

static half h;
static __nv_bfloat16 b;
static __nv_fp8_e4m3 f;

int main(void) {
  cudaStream_t s = 0;
  int version = 0;
  (void)s;
  h.x = 1;
  b.x = 2;
  f.x = 3;
  return (ncclGetVersion(&version) == ncclSuccess && version == NCCL_VERSION_CODE && h.x + b.x + f.x == 6) ? 0 : 1;
}
