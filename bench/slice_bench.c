/* Collectives on slices of one large malloc'd array, as a simulation code passes them
 * (issue 15): ferroccl through its NCCL API next to MPI on the same buffers, in one run.
 *
 *   mpicc -O2 bench/slice_bench.c -I<prefix>/include -L<prefix>/lib -lferroccl \
 *         -Wl,-rpath,<prefix>/lib -o slice_bench
 *   mpirun -np 2 ./slice_bench [-C broadcast,all_gather,all_reduce,reduce_scatter] \
 *         [-s 32K,128K,512K] [-n 2000] [-r 5] [-a 64M]
 *
 * Every rank mallocs two arrays of -a bytes (default 64 MiB) for each library (so that what
 * one library does to its memory, such as ferroccl's huge pages, does not help the other),
 * writes them, and passes the collectives a slice of each at a fixed offset inside (not
 * page-aligned, as a field's interior is): input at 5 MiB + 12 KiB, output at 7 MiB + 20 KiB.
 * nccl-tests and ferroccl-bench instead allocate buffers of the largest size and use their
 * starts. Sizes are the message as nccl-tests counts it (all-gather: all ranks' blocks;
 * reduce-scatter: what each rank sends). Floats (sum) for the reductions, bytes otherwise;
 * broadcasts in place (root 0), as MPI_Bcast is.
 *
 * Each (collective, size) runs -r rounds; a round times -n back-to-back calls of each library
 * between barriers (the slowest rank counts), ferroccl first in even rounds and MPI first in
 * odd ones. Printed: the median and the best round of each, in microseconds per call, and
 * MPI time / ferroccl time (> 1: ferroccl faster). Every round's first call of each library is
 * not timed (a warm-up); after its timed calls, each library's output is overwritten with a
 * marker, one more call is made, and that output is checked against the exact result.
 *
 * ferroccl may back these arrays with transparent huge pages (FERROCCL_HUGE_PAGES, on by
 * default) while MPI's arrays keep the pages the system gave them: the ratios therefore depend
 * on the host's huge-page setting (`madvise` on the 2-core VM: nothing on huge pages unless
 * asked for).
 */
#include <mpi.h>
#include <nccl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum coll { BROADCAST, ALL_GATHER, ALL_REDUCE, REDUCE_SCATTER, NCOLLS };
static const char *names[NCOLLS] = {"broadcast", "all_gather", "all_reduce", "reduce_scatter"};

/* Bytes with an optional K/M/G suffix (powers of 1024); 0 for anything else. */
static size_t parse_size(const char *s) {
    char *end;
    double v = strtod(s, &end);
    double m = 1;
    switch (*end) {
    case 'k': case 'K': m = 1024.0; end++; break;
    case 'm': case 'M': m = 1024.0 * 1024; end++; break;
    case 'g': case 'G': m = 1024.0 * 1024 * 1024; end++; break;
    default: break;
    }
    if (end == s || *end != '\0' || !(v > 0) || v * m > 1e15) return 0;
    return (size_t)(v * m);
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

#define NCCL_CHECK(call)                                                                  \
    do {                                                                                  \
        ncclResult_t rc_ = (call);                                                        \
        if (rc_ != ncclSuccess) {                                                         \
            fprintf(stderr, "%s failed: %s\n", #call, ncclGetErrorString(rc_));         \
            MPI_Abort(MPI_COMM_WORLD, 1);                                                 \
        }                                                                                 \
    } while (0)

struct setup {
    int rank, n;
    ncclComm_t comm;
    /* Slices of each library's arrays: [0] ferroccl's, [1] MPI's. */
    char *in[2], *out[2];
};

/* One call of `c` on `bytes` (nccl-tests' size) through ferroccl (lib 0) or MPI (lib 1). */
static void call(const struct setup *s, enum coll c, size_t bytes, int lib) {
    size_t per_rank = bytes / (size_t)s->n;
    char *in = s->in[lib], *out = s->out[lib];
    switch (c) {
    case BROADCAST:
        if (lib == 0)
            NCCL_CHECK(ncclBroadcast(out, out, bytes, ncclInt8, 0, s->comm, NULL));
        else
            MPI_Bcast(out, (int)bytes, MPI_BYTE, 0, MPI_COMM_WORLD);
        break;
    case ALL_GATHER:
        if (lib == 0)
            NCCL_CHECK(ncclAllGather(in, out, per_rank, ncclInt8, s->comm, NULL));
        else
            MPI_Allgather(in, (int)per_rank, MPI_BYTE, out, (int)per_rank, MPI_BYTE, MPI_COMM_WORLD);
        break;
    case ALL_REDUCE:
        if (lib == 0)
            NCCL_CHECK(ncclAllReduce(in, out, bytes / 4, ncclFloat, ncclSum, s->comm, NULL));
        else
            MPI_Allreduce(in, out, (int)(bytes / 4), MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
        break;
    case REDUCE_SCATTER:
        if (lib == 0)
            NCCL_CHECK(ncclReduceScatter(in, out, per_rank / 4, ncclFloat, ncclSum, s->comm, NULL));
        else
            MPI_Reduce_scatter_block(in, out, (int)(per_rank / 4), MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
        break;
    default: break;
    }
}

/* Inputs: rank r's float i (or byte i) is (r + 1) * (i % 7 + 1); small integers, so every
 * sum is exact whatever the order. */
static void fill_input(const struct setup *s, enum coll c, size_t bytes) {
    for (int lib = 0; lib < 2; lib++) {
        if (c == ALL_REDUCE || c == REDUCE_SCATTER) {
            float *f = (float *)s->in[lib];
            for (size_t i = 0; i < bytes / 4; i++) f[i] = (float)((s->rank + 1) * (int)(i % 7 + 1));
        } else {
            /* A broadcast's root sends what its output slice holds (in place). */
            char *in = c == BROADCAST ? s->out[lib] : s->in[lib];
            for (size_t i = 0; i < bytes; i++) in[i] = (char)((s->rank + 1) * (int)(i % 7 + 1));
        }
    }
}

/* Wrong elements of the output of the last call of library `lib`. */
static size_t count_wrong(const struct setup *s, enum coll c, size_t bytes, int lib) {
    size_t wrong = 0, per_rank = bytes / (size_t)s->n;
    int total = s->n * (s->n + 1) / 2;
    const char *out = s->out[lib];
    const float *f = (const float *)out;
    switch (c) {
    case BROADCAST:
        for (size_t i = 0; i < bytes; i++) wrong += out[i] != (char)(1 * (int)(i % 7 + 1));
        break;
    case ALL_GATHER:
        for (size_t i = 0; i < bytes; i++) {
            int r = (int)(i / per_rank);
            wrong += out[i] != (char)((r + 1) * (int)(i % per_rank % 7 + 1));
        }
        break;
    case ALL_REDUCE:
        for (size_t i = 0; i < bytes / 4; i++) wrong += f[i] != (float)(total * (int)(i % 7 + 1));
        break;
    case REDUCE_SCATTER:
        for (size_t i = 0; i < per_rank / 4; i++) {
            size_t global = (size_t)s->rank * (per_rank / 4) + i;
            wrong += f[i] != (float)(total * (int)(global % 7 + 1));
        }
        break;
    default: break;
    }
    return wrong;
}

/* Overwrites library `lib`'s output with a marker (a broadcast root's output is its input),
 * makes one call and returns how many elements of this rank's output are wrong. */
static uint64_t checked_call(const struct setup *s, enum coll c, size_t bytes, int lib) {
    size_t out_len = c == REDUCE_SCATTER ? bytes / (size_t)s->n : bytes;
    if (!(c == BROADCAST && s->rank == 0)) memset(s->out[lib], 0xa5, out_len);
    MPI_Barrier(MPI_COMM_WORLD);
    call(s, c, bytes, lib);
    return count_wrong(s, c, bytes, lib);
}

/* Seconds per call of `iters` calls, the slowest rank's. */
static double timed(const struct setup *s, enum coll c, size_t bytes, int lib, int iters) {
    call(s, c, bytes, lib);
    MPI_Barrier(MPI_COMM_WORLD);
    double t0 = MPI_Wtime();
    for (int i = 0; i < iters; i++) call(s, c, bytes, lib);
    double t = (MPI_Wtime() - t0) / iters, slowest;
    MPI_Allreduce(&t, &slowest, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
    return slowest;
}

int main(int argc, char **argv) {
    MPI_Init(&argc, &argv);
    struct setup s;
    MPI_Comm_rank(MPI_COMM_WORLD, &s.rank);
    MPI_Comm_size(MPI_COMM_WORLD, &s.n);
    int colls[NCOLLS] = {1, 1, 1, 1};
    size_t sizes[64];
    int nsizes = 0, iters = 2000, rounds = 5;
    size_t array = 64u << 20;
    for (int i = 1; i < argc; i++) {
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(argv[i], "-C") && v) {
            memset(colls, 0, sizeof colls);
            char *list = strdup(v);
            for (char *t = strtok(list, ","); t; t = strtok(NULL, ",")) {
                int found = 0;
                for (int c = 0; c < NCOLLS; c++)
                    if (!strcmp(t, names[c])) colls[c] = found = 1;
                if (!found) {
                    if (!s.rank) fprintf(stderr, "unknown collective %s\n", t);
                    MPI_Abort(MPI_COMM_WORLD, 2);
                }
            }
            free(list);
            i++;
        } else if (!strcmp(argv[i], "-s") && v) {
            char *list = strdup(v);
            for (char *t = strtok(list, ","); t; t = strtok(NULL, ",")) {
                size_t b = parse_size(t);
                if (b == 0 || nsizes == 64) {
                    if (!s.rank) fprintf(stderr, "slice_bench: -s takes up to 64 sizes > 0 (%s)\n", t);
                    MPI_Abort(MPI_COMM_WORLD, 2);
                }
                sizes[nsizes++] = b;
            }
            free(list);
            i++;
        } else if (!strcmp(argv[i], "-n") && v) {
            iters = atoi(v), i++;
        } else if (!strcmp(argv[i], "-r") && v) {
            rounds = atoi(v), i++;
        } else if (!strcmp(argv[i], "-a") && v) {
            array = parse_size(v), i++;
        } else {
            if (!s.rank) fprintf(stderr, "usage: slice_bench [-C colls] [-s sizes] [-n iters] [-r rounds] [-a array]\n");
            MPI_Abort(MPI_COMM_WORLD, 2);
        }
    }
    if (nsizes == 0) {
        sizes[0] = 32u << 10, sizes[1] = 128u << 10, sizes[2] = 512u << 10;
        nsizes = 3;
    }
    if (rounds < 1 || rounds > 99 || iters < 1) {
        if (!s.rank) fprintf(stderr, "slice_bench: -r must be 1-99 and -n positive\n");
        MPI_Abort(MPI_COMM_WORLD, 2);
    }
    const size_t in_at = (5u << 20) + 12288, out_at = (7u << 20) + 20480;
    size_t largest = 0;
    for (int k = 0; k < nsizes; k++) largest = sizes[k] > largest ? sizes[k] : largest;
    if (array < out_at + largest || largest > (size_t)1 << 30) {
        if (!s.rank)
            fprintf(stderr, "slice_bench: -a must hold 7 MiB + 20 KiB + the largest size, which is at most 1 GiB\n");
        MPI_Abort(MPI_COMM_WORLD, 2);
    }
    char *arrays[4];
    for (int a = 0; a < 4; a++) {
        arrays[a] = malloc(array);
        if (!arrays[a]) MPI_Abort(MPI_COMM_WORLD, 1);
        /* Written once, as a simulation's fields are: every page resident. */
        memset(arrays[a], 0, array);
    }
    for (int lib = 0; lib < 2; lib++) {
        s.in[lib] = arrays[2 * lib] + in_at;
        s.out[lib] = arrays[2 * lib + 1] + out_at;
    }

    ncclUniqueId id;
    if (s.rank == 0) NCCL_CHECK(ncclGetUniqueId(&id));
    MPI_Bcast(&id, sizeof id, MPI_BYTE, 0, MPI_COMM_WORLD);
    NCCL_CHECK(ncclCommInitRank(&s.comm, s.n, id, s.rank));

    if (s.rank == 0) {
        int version = 0;
        ncclGetVersion(&version);
        char mpi[MPI_MAX_LIBRARY_VERSION_STRING];
        int len = 0;
        MPI_Get_library_version(mpi, &len);
        char *nl = strchr(mpi, '\n');
        if (nl) *nl = 0;
        printf("# slice_bench: %d ranks, arrays of %zu bytes (malloc'd, written; each library its own), input at +%zu, output at +%zu\n",
               s.n, array, in_at, out_at);
        printf("# ferroccl (NCCL API version %d) vs %s\n", version, mpi);
        printf("# %d rounds of %d calls each (the two libraries alternate going first); us per call, slowest rank\n",
               rounds, iters);
        printf("%-15s %10s %12s %12s %12s %12s %8s %7s\n", "collective", "bytes", "ferroccl_med", "mpi_med",
               "ferroccl_best", "mpi_best", "mpi/ferr", "wrong");
    }
    int failed = 0;
    for (int c = 0; c < NCOLLS; c++) {
        if (!colls[c]) continue;
        for (int k = 0; k < nsizes; k++) {
            size_t bytes = sizes[k] / (size_t)(s.n * 4) * (size_t)(s.n * 4);
            if (bytes == 0) continue;
            fill_input(&s, c, bytes);
            double t[2][99];
            uint64_t wrong = 0;
            for (int r = 0; r < rounds; r++)
                for (int k = 0; k < 2; k++) {
                    int lib = (k + r) % 2;
                    t[lib][r] = timed(&s, c, bytes, lib, iters) * 1e6;
                    uint64_t w = checked_call(&s, c, bytes, lib), all = 0;
                    MPI_Allreduce(&w, &all, 1, MPI_UINT64_T, MPI_SUM, MPI_COMM_WORLD);
                    wrong += all;
                }
            qsort(t[0], rounds, sizeof(double), cmp_double);
            qsort(t[1], rounds, sizeof(double), cmp_double);
            double fm = t[0][rounds / 2], mm = t[1][rounds / 2];
            if (s.rank == 0)
                printf("%-15s %10zu %12.2f %12.2f %12.2f %12.2f %8.2f %7llu\n", names[c], bytes, fm, mm, t[0][0],
                       t[1][0], mm / fm, (unsigned long long)wrong);
            failed |= wrong != 0;
        }
    }
    NCCL_CHECK(ncclCommDestroy(s.comm));
    for (int a = 0; a < 4; a++) free(arrays[a]);
    MPI_Finalize();
    return failed;
}
