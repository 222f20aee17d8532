/* The floor of a stream of tiny broadcasts between two processes (issue 15, 2-rank broadcast
 * of 8-128 B), and what a call's own stores and locked instructions add to it.
 *
 *   gcc -O2 bench/tiny_slot_floor.c -o tiny_slot_floor && ./tiny_slot_floor 20000000 0 0
 *   args: messages, locked (1: one locked instruction per message on each side), extra stores
 *   per message on the sender (plain stores to a private, cache-resident array)
 *
 * The sender writes 8 B and a sequence number into one of 64 slots of 128 B in shared memory
 * (as ferroccl's tiny slots), running at most 64 messages ahead of the receiver, which polls the
 * slot, reads it and publishes how far it got. Every message costs the sender one transfer of
 * a line the receiver has read (a read-for-ownership). Stores leave the core in order, so a
 * store behind that transfer waits, and so does the core once the store buffer is full; a
 * locked instruction waits for the whole buffer to drain. Prints ns per message.
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

#define DEPTH 64
#define MAX_EXTRA 256

struct area {
  _Alignas(128) struct {
    _Atomic uint64_t seq;
    uint64_t data[15];
  } slot[DEPTH];
  _Alignas(128) _Atomic uint64_t consumed;
};

static double now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec + t.tv_nsec * 1e-9;
}

int main(int argc, char **argv) {
  if (argc != 4) {
    fprintf(stderr, "usage: %s messages locked(0|1) extra_stores(0..%d)\n", argv[0], MAX_EXTRA);
    return 2;
  }
  long n = atol(argv[1]);
  int locked = atoi(argv[2]);
  int extra = atoi(argv[3]);
  if (n <= 0 || extra < 0 || extra > MAX_EXTRA) {
    fprintf(stderr, "bad arguments\n");
    return 2;
  }
  struct area *a = mmap(0, sizeof *a, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  if (a == MAP_FAILED) {
    perror("mmap");
    return 1;
  }
  memset(a, 0, sizeof *a);
  _Atomic int private_word = 0;
  volatile uint64_t sink[MAX_EXTRA];
  /* The extra stores alone, no peer: what they cost by themselves. */
  double t0 = now();
  for (uint64_t s = 1; s <= (uint64_t)n; s++)
    for (int i = 0; i < extra; i++) sink[i] = s;
  double alone = (now() - t0) / n * 1e9;
  (void)sink[0];
  t0 = now();
  pid_t child = fork();
  if (child == 0) {
    uint64_t sum = 0;
    for (uint64_t s = 1; s <= (uint64_t)n; s++) {
      while (atomic_load_explicit(&a->slot[s % DEPTH].seq, memory_order_acquire) != s) __builtin_ia32_pause();
      sum += a->slot[s % DEPTH].data[0];
      atomic_store_explicit(&a->consumed, s, memory_order_release);
      if (locked) atomic_fetch_add(&private_word, 1);
    }
    _exit(sum == (uint64_t)n * (n + 1) / 2 ? 0 : 3);
  }
  for (uint64_t s = 1; s <= (uint64_t)n; s++) {
    while (s > DEPTH && atomic_load_explicit(&a->consumed, memory_order_acquire) < s - DEPTH) __builtin_ia32_pause();
    a->slot[s % DEPTH].data[0] = s;
    atomic_store_explicit(&a->slot[s % DEPTH].seq, s, memory_order_release);
    if (locked) atomic_fetch_add(&private_word, 1);
    for (int i = 0; i < extra; i++) sink[i] = s;
  }
  int status;
  waitpid(child, &status, 0);
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    fprintf(stderr, "receiver failed (status %d)\n", status);
    return 1;
  }
  printf("locked=%d extra_stores=%d: %.1f ns per message (the extra stores alone: %.1f ns)\n", locked, extra,
         (now() - t0) / n * 1e9, alone);
  return 0;
}
