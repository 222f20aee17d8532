/* How fast a kernel copy (process_vm_readv, what ferroccl's peers use for malloc'd buffers) and
 * a user-space memcpy run, by where the destination lies relative to the source within a 4 KiB
 * page (issue 15; bench/results/page-offset-2026-12-06.md). On AMD Zen cores `rep movsb`, which
 * the kernel copies with (and glibc's memcpy for mid sizes), is several times slower when the
 * destination lies 1-31 bytes past the source modulo 4 KiB.
 *
 *   gcc -O2 bench/page_offset_probe.c -o page_offset_probe && ./page_offset_probe 256
 *   arg: bytes per copy in KiB (default 256); 64 MiB copied per measurement, best of 5
 *
 * The source is a page-aligned 64 MiB anonymous mapping (asked for huge pages), the destination
 * one piece, at each offset below from a page boundary; process_vm_readv reads this process's
 * own memory.
 */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

#ifndef MADV_COLLAPSE
#define MADV_COLLAPSE 25
#endif

static double now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec + t.tv_nsec * 1e-9;
}

int main(int argc, char **argv) {
  size_t piece = (size_t)(argc > 1 ? atoi(argv[1]) : 256) << 10;
  const size_t total = 64 << 20;
  if (piece == 0 || piece > total) {
    fprintf(stderr, "usage: %s [KiB per copy, 1..65536]\n", argv[0]);
    return 2;
  }
  char *src = mmap(0, total, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  char *dst = mmap(0, piece + 16384, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (src == MAP_FAILED || dst == MAP_FAILED) {
    perror("mmap");
    return 1;
  }
  memset(src, 1, total);
  memset(dst, 2, piece + 16384);
  madvise(src, total, MADV_COLLAPSE); /* best effort: peers' buffers are on huge pages too */
  pid_t me = getpid();
  const int offsets[] = {0, 8, 16, 24, 32, 40, 48, 56, 64, 128, 1040, 2064, 4104}; /* 4104: 8 past, one page on */
  for (size_t k = 0; k < sizeof offsets / sizeof offsets[0]; k++) {
    char *to = dst + offsets[k];
    double kernel = 1e9, user = 1e9;
    for (int rep = 0; rep < 5; rep++) {
      double t = now();
      for (size_t at = 0; at + piece <= total; at += piece) {
        struct iovec local = {to, piece}, remote = {src + at, piece};
        if (process_vm_readv(me, &local, 1, &remote, 1, 0) != (ssize_t)piece) {
          perror("process_vm_readv");
          return 1;
        }
      }
      t = now() - t;
      if (t < kernel) kernel = t;
      t = now();
      for (size_t at = 0; at + piece <= total; at += piece) {
        memcpy(to, src + at, piece);
        __asm__ volatile("" ::"r"(to) : "memory"); /* keep every copy */
      }
      t = now() - t;
      if (t < user) user = t;
    }
    printf("piece %zu KiB, destination %4d bytes past the source (mod 4 KiB): process_vm_readv %5.1f GB/s, "
           "memcpy %5.1f GB/s\n",
           piece >> 10, offsets[k] % 4096, total / kernel / 1e9, total / user / 1e9);
  }
  return 0;
}
