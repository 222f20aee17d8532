// C++11 build of the ABI checks: the same assertions through static_assert, and the
// declarations must have C linkage (the program links against libnccl and calls it).
#include "abi_static_asserts.c"
