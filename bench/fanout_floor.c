/* The floor of a stream of broadcasts on one host (issue 15: malloc'd against ncclMemAlloc
 * broadcasts of 32-512 KiB at 8 and 16 ranks), in plain shared memory, no library.
 *
 *   gcc -O2 bench/fanout_floor.c -o fanout_floor && ./fanout_floor 15 524288 2000 fresh
 *   args: readers, bytes, messages, mode
 *
 * One writer process and `readers` reader processes share two buffers, used in turn. For
 * message i the writer waits until every reader has finished message i - 2 (whose buffer it
 * reuses), fills buffer i % 2 and publishes i; each reader waits for i, copies the buffer to
 * its own private output and publishes that it finished i. So the writer runs one message
 * ahead, as ferroccl's broadcast root does through its two slots. Modes:
 *   fresh    the writer copies its private input into the buffer for every message: the
 *            readers fetch lines another core has just written (ferroccl's slots with malloc'd
 *            buffers; and any root whose data changes between broadcasts, ncclMemAlloc or not)
 *   stagger  as fresh, but reader k starts its copy k/readers of the way in (16 KiB grains,
 *            wrapping around), so that readers ask for different lines at once
 *   reuse    the buffers are filled once; the writer only publishes: the readers copy lines
 *            that stay in their caches from one message to the next (nccl-tests' broadcast
 *            with ncclMemAlloc buffers, whose root never changes its input)
 * Prints us per message (the last reader's finish over the messages, after 10% warm-up).
 */
#define _GNU_SOURCE
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define MAX_READERS 64
#define GRAIN (16 << 10)

struct ctl {
  _Alignas(64) _Atomic uint64_t published;
  struct {
    _Alignas(64) _Atomic uint64_t done;
  } reader[MAX_READERS];
  _Alignas(64) double t0, t1;
};

static double now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec + t.tv_nsec * 1e-9;
}

static void pause_cpu(void) {
#if defined(__x86_64__)
  __builtin_ia32_pause();
#endif
}

int main(int argc, char **argv) {
  if (argc != 5) {
    fprintf(stderr, "usage: %s readers bytes messages fresh|stagger|reuse\n", argv[0]);
    return 2;
  }
  int readers = atoi(argv[1]);
  size_t bytes = strtoull(argv[2], NULL, 0);
  uint64_t msgs = strtoull(argv[3], NULL, 0);
  const char *mode = argv[4];
  int fresh = strcmp(mode, "reuse") != 0, stagger = strcmp(mode, "stagger") == 0;
  if (readers < 1 || readers > MAX_READERS || bytes == 0 || msgs < 10 ||
      (!fresh && strcmp(mode, "reuse") != 0) || (fresh && !stagger && strcmp(mode, "fresh") != 0)) {
    fprintf(stderr, "bad arguments\n");
    return 2;
  }
  struct ctl *c = mmap(NULL, sizeof *c, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  unsigned char *buf = mmap(NULL, 2 * bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  if (c == MAP_FAILED || buf == MAP_FAILED) {
    perror("mmap");
    return 1;
  }
  memset(c, 0, sizeof *c);
  memset(buf, 1, 2 * bytes);
  uint64_t warm = msgs / 10;
  for (int k = 0; k < readers; k++) {
    if (fork() == 0) {
      unsigned char *out = malloc(bytes);
      memset(out, 0, bytes);
      size_t grains = (bytes + GRAIN - 1) / GRAIN;
      size_t first = stagger ? (size_t)k * grains / readers : 0;
      for (uint64_t i = 1; i <= msgs; i++) {
        while (atomic_load_explicit(&c->published, memory_order_acquire) < i) pause_cpu();
        const unsigned char *src = buf + (i % 2) * bytes;
        for (size_t g = 0; g < grains; g++) {
          size_t at = ((first + g) % grains) * GRAIN;
          size_t len = bytes - at < GRAIN ? bytes - at : GRAIN;
          memcpy(out + at, src + at, len);
        }
        atomic_store_explicit(&c->reader[k].done, i, memory_order_release);
      }
      if (out[0] != (fresh ? 7 : 1) || out[bytes - 1] != (fresh ? 7 : 1)) {
        fprintf(stderr, "reader %d: wrong data\n", k);
        _exit(1);
      }
      _exit(0);
    }
  }
  unsigned char *in = malloc(bytes);
  memset(in, 7, bytes);
  for (uint64_t i = 1; i <= msgs; i++) {
    if (i == warm + 1) c->t0 = now();
    // Buffer i % 2 last held message i - 2: wait until every reader is done with it.
    for (int k = 0; k < readers; k++)
      while (i >= 2 && atomic_load_explicit(&c->reader[k].done, memory_order_acquire) < i - 2) pause_cpu();
    // The writer's input stays in its cache, as a benchmark's send buffer does; rewriting
    // the shared buffer (even with the same bytes) takes its lines from the readers' caches.
    if (fresh) memcpy(buf + (i % 2) * bytes, in, bytes);
    atomic_store_explicit(&c->published, i, memory_order_release);
  }
  for (int k = 0; k < readers; k++)
    while (atomic_load_explicit(&c->reader[k].done, memory_order_acquire) < msgs) pause_cpu();
  c->t1 = now();
  int bad = 0;
  for (int k = 0; k < readers; k++) {
    int st;
    wait(&st);
    bad |= !WIFEXITED(st) || WEXITSTATUS(st) != 0;
  }
  printf("%s readers %d bytes %zu: %.2f us per message\n", mode, readers, bytes,
         (c->t1 - c->t0) / (double)(msgs - warm) * 1e6);
  return bad;
}
