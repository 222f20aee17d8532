// How fast the CPU and loopback TCP use host memory of each kind the staged path could stage
// device buffers in: cudaHostAlloc'd (portable, mapped), plain malloc, and malloc'd or mmap'd
// (with MADV_HUGEPAGE) memory registered with cudaHostRegister. Prints memcpy in and out and
// a loopback TCP transfer (one sender thread, one receiver thread, 512 KiB writes) per kind.
//   nvcc -O2 pinned_host.cu -o pinned_host && ./pinned_host [MiB]
#include <arpa/inet.h>
#include <cuda_runtime.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <unistd.h>
#include <algorithm>
#include <chrono>
#include <thread>
#include <vector>

#define CUDA(x) do { cudaError_t e = (x); if (e != cudaSuccess) { \
  fprintf(stderr, "%s: %s\n", #x, cudaGetErrorString(e)); exit(1); } } while (0)

static double now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

enum Kind { HOST_ALLOC, MALLOC, MALLOC_REGISTERED, HUGE_REGISTERED };
static const char* names[] = {"cudaHostAlloc", "malloc", "malloc+register", "mmap hugepage+register"};

static char* alloc(Kind k, size_t bytes) {
  char* p = nullptr;
  switch (k) {
    case HOST_ALLOC: CUDA(cudaHostAlloc((void**)&p, bytes, cudaHostAllocPortable | cudaHostAllocMapped)); break;
    case MALLOC: p = (char*)malloc(bytes); break;
    case MALLOC_REGISTERED:
      p = (char*)aligned_alloc(4096, bytes);
      memset(p, 1, bytes);
      CUDA(cudaHostRegister(p, bytes, cudaHostRegisterPortable | cudaHostRegisterMapped));
      break;
    case HUGE_REGISTERED:
      p = (char*)mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
      madvise(p, bytes, MADV_HUGEPAGE);
      memset(p, 1, bytes);
      CUDA(cudaHostRegister(p, bytes, cudaHostRegisterPortable | cudaHostRegisterMapped));
      break;
  }
  memset(p, 1, bytes);
  return p;
}

static double best_copy(char* dst, const char* src, size_t bytes) {
  double best = 1e9;
  for (int i = 0; i < 10; i++) {
    double t = now();
    memcpy(dst, src, bytes);
    best = std::min(best, now() - t);
  }
  return bytes / best / 1e9;
}

// Loopback TCP from src to dst, one thread each; best of 5.
static double tcp(const char* src, char* dst, size_t bytes) {
  int ls = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  bind(ls, (sockaddr*)&a, sizeof a);
  socklen_t len = sizeof a;
  getsockname(ls, (sockaddr*)&a, &len);
  listen(ls, 1);
  int c = socket(AF_INET, SOCK_STREAM, 0);
  connect(c, (sockaddr*)&a, sizeof a);
  int s = accept(ls, nullptr, nullptr);
  int one = 1;
  setsockopt(c, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  double best = 1e9;
  for (int rep = 0; rep < 5; rep++) {
    double t = now();
    std::thread rx([&] {
      size_t got = 0;
      while (got < bytes) {
        ssize_t n = recv(s, dst + got, std::min(bytes - got, (size_t)512 << 10), 0);
        if (n <= 0) exit(2);
        got += n;
      }
    });
    size_t sent = 0;
    while (sent < bytes) {
      ssize_t n = send(c, src + sent, std::min(bytes - sent, (size_t)512 << 10), 0);
      if (n <= 0) exit(3);
      sent += n;
    }
    rx.join();
    best = std::min(best, now() - t);
  }
  close(c);
  close(s);
  close(ls);
  return bytes / best / 1e9;
}

int main(int argc, char** argv) {
  size_t mib = argc > 1 ? strtoull(argv[1], nullptr, 10) : 16;
  size_t bytes = mib << 20;
  CUDA(cudaSetDevice(0));
  char* plain = alloc(MALLOC, bytes);
  char* plain2 = alloc(MALLOC, bytes);
  printf("# %zu MiB; GB/s, best of 10 (memcpy) or 5 (TCP)\n# %-24s %12s %12s %12s %12s\n", mib, "kind", "memcpy in",
         "memcpy out", "TCP send", "TCP recv");
  for (int k = 0; k < 4; k++) {
    char* x = alloc((Kind)k, bytes);
    printf("  %-24s %12.2f %12.2f %12.2f %12.2f\n", names[k], best_copy(x, plain, bytes), best_copy(plain, x, bytes),
           tcp(x, plain2, bytes), tcp(plain2, x, bytes));
  }
  return 0;
}
