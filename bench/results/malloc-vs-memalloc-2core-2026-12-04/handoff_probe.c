/* Handoff probe (record for malloc-vs-memalloc-2core-2026-12-04.md): what it costs to hand a
 * buffer from one process to another through shared memory, as a broadcast through a slot
 * does. Two processes (fork), a shared anonymous mapping: the sender copies `len` bytes from
 * its private buffer into the shared slot (in pieces of `chunk`, publishing how far it got
 * after each), the receiver copies each piece out as it lands, then acknowledges; the sender
 * waits for the acknowledgement before the next round. Prints microseconds per round.
 *
 *   gcc -O2 handoff_probe.c -o handoff_probe && ./handoff_probe 131072 20000 [chunk]
 *
 * Not pinned to CPUs: on the 2-core VM the two processes land on the two vCPUs.
 */
#define _GNU_SOURCE
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

int main(int argc, char **argv) {
    if (argc < 3) {
        fprintf(stderr, "usage: handoff_probe bytes rounds [chunk]\n");
        return 2;
    }
    size_t len = strtoul(argv[1], NULL, 10);
    long rounds = atol(argv[2]);
    size_t chunk = argc > 3 ? strtoul(argv[3], NULL, 10) : len;
    if (len == 0 || chunk == 0 || rounds < 1) return 2;
    char *shared = mmap(NULL, len + 8192, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (shared == MAP_FAILED) return 1;
    memset(shared, 0, len + 8192);
    /* Bytes published so far (over all rounds), and the last round acknowledged: own lines. */
    _Atomic long *published = (_Atomic long *)shared, *acked = (_Atomic long *)(shared + 64);
    char *slot = shared + 4096;
    pid_t child = fork();
    char *buf = aligned_alloc(4096, (len + 4095) / 4096 * 4096);
    if (!buf) return 1;
    memset(buf, child ? 1 : 2, len);
    if (child == 0) {
        for (long i = 1; i <= rounds; i++) {
            long base = (i - 1) * (long)len;
            size_t got = 0;
            while (got < len) {
                long p;
                while ((p = atomic_load_explicit(published, memory_order_acquire)) <= base + (long)got)
                    ;
                size_t upto = (size_t)(p - base);
                memcpy(buf + got, slot + got, upto - got);
                got = upto;
            }
            atomic_store_explicit(acked, i, memory_order_release);
        }
        _exit(0);
    }
    double t0 = now();
    for (long i = 1; i <= rounds; i++) {
        for (size_t off = 0; off < len; off += chunk) {
            size_t l = chunk < len - off ? chunk : len - off;
            memcpy(slot + off, buf + off, l);
            atomic_store_explicit(published, (i - 1) * (long)len + (long)(off + l), memory_order_release);
        }
        while (atomic_load_explicit(acked, memory_order_acquire) < i)
            ;
    }
    double per_round = (now() - t0) / rounds;
    waitpid(child, NULL, 0);
    printf("len %zu chunk %zu: %.2f us per handoff\n", len, chunk, per_round * 1e6);
    return 0;
}
