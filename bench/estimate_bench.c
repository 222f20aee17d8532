/* ncclGroupSimulateEnd's estimate next to the measured time of the same call, in one run: how
 * far the cost model (src/coll/estimate.rs) is from this machine, per collective and size.
 *
 *   mpicc -O2 bench/estimate_bench.c -I<prefix>/include -L<prefix>/lib -lferroccl \
 *         -Wl,-rpath,<prefix>/lib -o estimate_bench
 *   mpirun -np 2 ./estimate_bench [-n 200] [-r 5]
 *
 * Sizes 8 B to 64 MiB by factors of 8 (the message as nccl-tests counts it), floats summed,
 * malloc'd buffers. For each (collective, size): the estimate from a group of one call ended by
 * ncclGroupSimulateEnd (nothing runs), then -r rounds of -n timed calls between barriers (the
 * slowest rank counts, after one untimed warm-up call); printed: the estimate, the median
 * round's time per call, and estimate / measured (1 = exact, 2 = the model says twice as long).
 */
#include <mpi.h>
#include <nccl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum coll { ALL_REDUCE, ALL_GATHER, REDUCE_SCATTER, BROADCAST, NCOLLS };
static const char *names[NCOLLS] = {"all_reduce", "all_gather", "reduce_scatter", "broadcast"};

#define NCCL_CHECK(call)                                                                  \
    do {                                                                                  \
        ncclResult_t r_ = (call);                                                         \
        if (r_ != ncclSuccess) {                                                          \
            fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #call, ncclGetErrorString(r_)); \
            MPI_Abort(MPI_COMM_WORLD, 1);                                                 \
        }                                                                                 \
    } while (0)

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* One call of `c` on a message of `bytes` (floats). */
static ncclResult_t call(enum coll c, const float *in, float *out, size_t bytes, int n, ncclComm_t comm) {
    size_t count = bytes / sizeof(float);
    switch (c) {
    case ALL_REDUCE: return ncclAllReduce(in, out, count, ncclFloat, ncclSum, comm, NULL);
    case ALL_GATHER: return ncclAllGather(in, out, count / n, ncclFloat, comm, NULL);
    case REDUCE_SCATTER: return ncclReduceScatter(in, out, count / n, ncclFloat, ncclSum, comm, NULL);
    case BROADCAST: return ncclBroadcast(in, out, count, ncclFloat, 0, comm, NULL);
    default: return ncclInvalidArgument;
    }
}

int main(int argc, char **argv) {
    int iters = 200, rounds = 5;
    MPI_Init(&argc, &argv);
    for (int i = 1; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "-n")) iters = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "-r")) rounds = atoi(argv[i + 1]);
    }
    if (iters < 1 || rounds < 1) MPI_Abort(MPI_COMM_WORLD, 2);
    int rank, n;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &n);
    ncclUniqueId id;
    if (rank == 0) NCCL_CHECK(ncclGetUniqueId(&id));
    MPI_Bcast(&id, sizeof id, MPI_BYTE, 0, MPI_COMM_WORLD);
    ncclComm_t comm;
    NCCL_CHECK(ncclCommInitRank(&comm, n, id, rank));

    const size_t max_bytes = (size_t)64 << 20;
    float *in = malloc(max_bytes), *out = malloc(max_bytes);
    double *times = malloc(sizeof(double) * rounds);
    if (!in || !out || !times) MPI_Abort(MPI_COMM_WORLD, 3);
    for (size_t i = 0; i < max_bytes / sizeof(float); i++) in[i] = (float)(i % 7);
    memset(out, 0, max_bytes);
    if (rank == 0) printf("# %d ranks; us per call; estimate / measured\n# %-15s %10s %12s %12s %8s\n", n,
                          "collective", "bytes", "estimate", "measured", "ratio");
    for (int c = 0; c < NCOLLS; c++) {
        for (size_t bytes = 8; bytes <= max_bytes; bytes *= 8) {
            size_t unit = sizeof(float) * (size_t)n;
            size_t b = bytes < unit ? unit : bytes / unit * unit;
            ncclSimInfo_t sim = NCCL_SIM_INFO_INITIALIZER;
            NCCL_CHECK(ncclGroupStart());
            NCCL_CHECK(call((enum coll)c, in, out, b, n, comm));
            NCCL_CHECK(ncclGroupSimulateEnd(&sim));
            int its = b >= ((size_t)8 << 20) ? (iters + 19) / 20 : iters;
            for (int r = 0; r < rounds; r++) {
                NCCL_CHECK(call((enum coll)c, in, out, b, n, comm));
                MPI_Barrier(MPI_COMM_WORLD);
                double t = MPI_Wtime();
                for (int k = 0; k < its; k++) NCCL_CHECK(call((enum coll)c, in, out, b, n, comm));
                double mine = (MPI_Wtime() - t) / its, slowest;
                MPI_Allreduce(&mine, &slowest, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
                times[r] = slowest * 1e6;
            }
            qsort(times, rounds, sizeof(double), cmp_double);
            double measured = times[rounds / 2];
            if (rank == 0)
                printf("  %-15s %10zu %12.2f %12.2f %8.2f\n", names[c], b, sim.estimatedTime, measured,
                       sim.estimatedTime / measured);
        }
    }
    fflush(stdout);
    NCCL_CHECK(ncclCommDestroy(comm));
    free(in);
    free(out);
    free(times);
    MPI_Finalize();
    return 0;
}
