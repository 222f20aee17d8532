/* What the pieces of a one-host all-reduce of malloc'd buffers cost when every rank runs
 * them at once (issue 15): kernel copies from and to peers (process_vm_readv/writev) against
 * plain copies through shared memory, per rank count and message size.
 *
 *   mpicc -O2 bench/cma_probe.c -o cma_probe && mpirun -np 8 ./cma_probe 2097152
 *
 * Each rank owns a malloc'd input and output of `bytes` and a slice [r*bytes/n, (r+1)*bytes/n).
 * Steps, each timed between barriers (median of the iterations; the slowest rank counts):
 *   private_copy  memcpy of the whole message, private to private (the bandwidth baseline)
 *   copy_in       the whole input into this rank's shared-memory slot (plain stores)
 *   cma_read      this rank's slice of every peer's input, one process_vm_readv per peer
 *                 and piece, into a private scratch (what the direct all-reduce reads)
 *   cma_write     this rank's slice into every peer's output, one process_vm_writev each
 *   slot_read     every other rank's slice out of their slots into this rank's output
 *                 (the copy out of a staged all-reduce)
 *   slot_fold     this rank's slice of every rank's slot summed as floats (the reduction
 *                 over slots)
 * and whole all-reduces (float sum) built from them, a barrier standing in for each wait:
 *   ar_cma        kernel copies both ways: read each peer's piece and fold it, write the
 *                 result into every peer's output (ferroccl's path above 128 KiB at 8+ ranks)
 *   ar_cma_slot   read and fold by kernel copies, the result into this rank's slot (and its
 *                 own output); barrier; every other slice copied out of its reducer's slot
 *   ar_slots      the input into the slot; barrier; fold this slice from every slot into
 *                 this rank's output and slot; barrier; the other slices out of their slots
 *   ar_pull_all   every rank reads every peer's whole input by kernel copies and folds the
 *                 whole message itself (no writes to peers, one wait: read fewer times by
 *                 more ranks; for 2 ranks, one system call stream each instead of two)
 */
#define _GNU_SOURCE
#include <mpi.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/uio.h>
#include <unistd.h>

static double now(void) { return MPI_Wtime(); }

static void fold(float *acc, const float *in, size_t m, int first) {
    if (first)
        for (size_t i = 0; i < m; i++) acc[i] = in[i];
    else
        for (size_t i = 0; i < m; i++) acc[i] += in[i];
}

static void cma(int write, pid_t pid, void *local, uint64_t remote, size_t len) {
    struct iovec l = {local, len};
    struct iovec rv = {(void *)(uintptr_t)remote, len};
    ssize_t got = write ? process_vm_writev(pid, &l, 1, &rv, 1, 0) : process_vm_readv(pid, &l, 1, &rv, 1, 0);
    if (got != (ssize_t)len) {
        perror(write ? "process_vm_writev" : "process_vm_readv");
        MPI_Abort(MPI_COMM_WORLD, 1);
    }
}

/* Every other rank's slice of the result, out of that rank's slot into our output. */
static void copy_out_of_slots(float *out, char **slot, int me, int n, size_t slice) {
    for (int k = 1; k < n; k++) {
        int r = (me + k) % n;
        memcpy((char *)out + (size_t)r * slice, slot[r] + (size_t)r * slice, slice);
    }
}

static int cmp_d(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

int main(int argc, char **argv) {
    MPI_Init(&argc, &argv);
    int me, n;
    MPI_Comm_rank(MPI_COMM_WORLD, &me);
    MPI_Comm_size(MPI_COMM_WORLD, &n);
    size_t bytes = argc > 1 ? strtoull(argv[1], NULL, 0) : (2u << 20);
    size_t piece = argc > 2 ? strtoull(argv[2], NULL, 0) : (256u << 10);
    int iters = argc > 3 ? atoi(argv[3]) : 20;
    size_t slice = bytes / n / 64 * 64;

    float *in = malloc(bytes), *out = malloc(bytes), *scratch = malloc(piece), *acc = malloc(slice);
    for (size_t i = 0; i < bytes / 4; i++) in[i] = (float)(me + i % 7);
    memset(out, 0, bytes);
    /* One shared region: a slot of `bytes` per rank (MPI's shared window keeps this short). */
    MPI_Comm node;
    MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &node);
    char *base;
    MPI_Win win;
    MPI_Win_allocate_shared(bytes, 1, MPI_INFO_NULL, node, &base, &win);
    char **slot = malloc(n * sizeof *slot);
    for (int r = 0; r < n; r++) {
        MPI_Aint sz;
        int du;
        MPI_Win_shared_query(win, r, &sz, &du, &slot[r]);
    }
    memset(slot[me], 0, bytes);
    uint64_t mine[3] = {(uint64_t)getpid(), (uint64_t)(uintptr_t)in, (uint64_t)(uintptr_t)out};
    uint64_t *all = malloc(3 * n * sizeof *all);
    MPI_Allgather(mine, 3, MPI_UINT64_T, all, 3, MPI_UINT64_T, MPI_COMM_WORLD);

    const char *names[] = {"private_copy", "copy_in", "cma_read", "cma_write", "slot_read", "slot_fold", "ar_cma", "ar_cma_slot", "ar_slots", "ar_pull_all"};
    enum { STEPS = 10 };
    double *t = malloc(sizeof(double) * iters);
    char *priv2 = malloc(bytes);
    if (me == 0)
        printf("ranks %d bytes %zu slice %zu piece %zu iters %d\n", n, bytes, slice, piece, iters);
    for (int s = 0; s < STEPS; s++) {
        for (int it = -2; it < iters; it++) {
            MPI_Barrier(MPI_COMM_WORLD);
            double t0 = now();
            size_t lo = (size_t)me * slice;
            switch (s) {
            case 0: memcpy(priv2, in, bytes); break;
            case 1: memcpy(slot[me], in, bytes); break;
            case 2:
                for (int k = 1; k < n; k++) {
                    int r = (me + k) % n;
                    for (size_t off = 0; off < slice; off += piece) {
                        size_t len = slice - off < piece ? slice - off : piece;
                        cma(0, (pid_t)all[3 * r], scratch, all[3 * r + 1] + lo + off, len);
                    }
                }
                break;
            case 3:
                for (int k = 1; k < n; k++) {
                    int r = (me + k) % n;
                    cma(1, (pid_t)all[3 * r], acc, all[3 * r + 2] + lo, slice);
                }
                break;
            case 4:
                copy_out_of_slots(out, slot, me, n, slice);
                break;
            case 5: {
                size_t m = slice / 4;
                const float *a = (const float *)(slot[0] + lo);
                for (size_t i = 0; i < m; i++) acc[i] = a[i];
                for (int r = 1; r < n; r++) {
                    const float *b = (const float *)(slot[r] + lo);
                    for (size_t i = 0; i < m; i++) acc[i] += b[i];
                }
                break;
            }
            case 6:
            case 7: {
                /* Rank order of the fold, as ferroccl: rank 0's input first. */
                float *res = (float *)((char *)out + lo);
                for (int r = 0; r < n; r++) {
                    for (size_t off = 0; off < slice; off += piece) {
                        size_t len = slice - off < piece ? slice - off : piece;
                        const float *src = (const float *)((char *)in + lo + off);
                        if (r != me) {
                            cma(0, (pid_t)all[3 * r], scratch, all[3 * r + 1] + lo + off, len);
                            src = scratch;
                        }
                        fold(res + off / 4, src, len / 4, r == 0);
                    }
                }
                if (s == 6) {
                    for (int k = 1; k < n; k++) {
                        int r = (me + k) % n;
                        cma(1, (pid_t)all[3 * r], res, all[3 * r + 2] + lo, slice);
                    }
                } else {
                    memcpy(slot[me] + lo, res, slice);
                    MPI_Barrier(MPI_COMM_WORLD);
                    copy_out_of_slots(out, slot, me, n, slice);
                }
                break;
            }
            case 8: {
                memcpy(slot[me], in, bytes);
                MPI_Barrier(MPI_COMM_WORLD);
                float *res = (float *)((char *)out + lo);
                for (int r = 0; r < n; r++) fold(res, (const float *)(slot[r] + lo), slice / 4, r == 0);
                MPI_Barrier(MPI_COMM_WORLD); /* every rank has read slice `lo` of our slot */
                memcpy(slot[me] + lo, res, slice);
                MPI_Barrier(MPI_COMM_WORLD);
                copy_out_of_slots(out, slot, me, n, slice);
                break;
            }
            case 9: {
                /* The whole message, in rank order, each peer's input read piece by piece. */
                size_t whole = (size_t)n * slice;
                for (int r = 0; r < n; r++) {
                    for (size_t off = 0; off < whole; off += piece) {
                        size_t len = whole - off < piece ? whole - off : piece;
                        const float *src = (const float *)((char *)in + off);
                        if (r != me) {
                            cma(0, (pid_t)all[3 * r], scratch, all[3 * r + 1] + off, len);
                            src = scratch;
                        }
                        fold(out + off / 4, src, len / 4, r == 0);
                    }
                }
                MPI_Barrier(MPI_COMM_WORLD); /* peers are done reading our input */
                break;
            }
            }
            double dt = now() - t0, mx;
            MPI_Allreduce(&dt, &mx, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
            if (it >= 0) t[it] = mx;
        }
        if (s >= 6) {
            /* The all-reduces must have produced the sum everywhere. */
            size_t bad = 0;
            for (size_t i = 0; i < (size_t)n * slice / 4; i++) {
                float want = (float)(n * (int)(i % 7) + n * (n - 1) / 2);
                bad += out[i] != want;
            }
            if (bad) {
                fprintf(stderr, "rank %d: %s wrong at %zu elements\n", me, names[s], bad);
                MPI_Abort(MPI_COMM_WORLD, 2);
            }
            memset(out, 0, bytes);
        }
        qsort(t, iters, sizeof *t, cmp_d);
        if (me == 0) printf("  %-12s median %9.1f us  min %9.1f us\n", names[s], t[iters / 2] * 1e6, t[0] * 1e6);
    }
    MPI_Win_free(&win);
    MPI_Finalize();
    return 0;
}
