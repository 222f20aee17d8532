/*
 * ompi_bench: times MPI_Allreduce (float sum), MPI_Allgather, MPI_Bcast and
 * MPI_Reduce_scatter_block (float sum) the way ferroccl-bench (nccl-tests 2.19.6) times
 * ncclAllReduce, ncclAllGather, ncclBroadcast and ncclReduceScatter, so the two tables can be
 * compared row by row.
 *
 *   mpicc -O2 -o ompi_bench bench/ompi_bench.c
 *   mpirun -np 2 ompi_bench [-C all_reduce,all_gather,broadcast,reduce_scatter] [-b 8] [-e 256M] [-f 2]
 *          [-n 20] [-w 5] [--tier 64M:5:2 ...] [-a 1] [-c 1] [-J out.json]
 *
 * Same as nccl-tests / ferroccl-bench:
 *  - sizes from -b to -e, multiplied by -f (K/M/G suffixes are powers of 1024);
 *  - count = size / 4 floats; all_gather sends count/nranks per rank, rounded down to a
 *    multiple of 16 bytes, and its size column is the total received (count * nranks * 4);
 *    reduce_scatter likewise receives count/nranks per rank, and its size column is the total
 *    each rank sends;
 *  - time per call = wall clock of the timed loop / iterations, combined over ranks by -a
 *    (0 rank 0's, 1 mean, 2 minimum, 3 maximum; default 1 like nccl-tests);
 *  - algbw = bytes / time (all_gather: bytes received; reduce_scatter: bytes sent), busbw =
 *    algbw * 2(n-1)/n (all_reduce), (n-1)/n (all_gather, reduce_scatter), 1 (broadcast);
 *  - out-of-place and in-place columns: MPI_Allreduce with MPI_IN_PLACE, MPI_Allgather with
 *    MPI_IN_PLACE (each rank's block already at recvbuf + rank * count), MPI_Reduce_scatter_block
 *    with MPI_IN_PLACE (the whole input in recvbuf, the result at its start; NCCL puts it at
 *    recvbuf + rank * count, the same traffic).  MPI_Bcast has only one
 *    buffer, so broadcast is timed once and both columns carry that measurement.
 *
 * Different on purpose:
 *  - iterations adapt to the size: sizes >= S (--tier S:N:W, repeatable; default 64M:5:2) use N
 *    timed and W warm-up iterations instead of -n/-w, so the largest sizes do not take minutes
 *    on a small host while the smallest get enough calls to time (the comparison script gives
 *    ferroccl-bench the same schedule);
 *  - warm-up calls run right before each size's timed loop (nccl-tests warms every size up
 *    front); either way the timed loop never includes the first call at a size. --warmup-pass
 *    adds nccl-tests' pass as well (every size's warm-up calls, out of place, over doubling
 *    sizes, before the sweep), as ferroccl-bench --warmup-each does: then both programs warm
 *    up alike.
 *  - -c N checks N calls per size (fresh inputs; exact small-integer sums) after timing.
 */
#define _GNU_SOURCE
#include <mpi.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

enum coll { ALL_REDUCE, ALL_GATHER, BROADCAST, REDUCE_SCATTER, NCOLL };
static const char *coll_name[NCOLL] = {"all_reduce", "all_gather", "broadcast", "reduce_scatter"};

struct measure {
    double time_us, algbw, busbw;
    long wrong; /* -1: not checked */
};

struct row {
    enum coll coll;
    size_t size, count;
    int iters, warmup;
    struct measure oop, ip;
};

static int rank, nranks;
static int opt_average = 1, opt_check = 1, opt_root = 0;
static size_t opt_min = 8, opt_max = 256u << 20, opt_factor = 2;
static int opt_iters = 20, opt_warmup = 5, opt_warmup_pass = 0, opt_fresh_inputs = 0, opt_arrays = 0, opt_unalign = 0;
/* Iteration tiers: sizes >= tier_from[k] use tier_iters[k] / tier_warmup[k] (the largest
 * matching tier wins); smaller sizes use -n / -w. */
#define MAX_TIERS 8
static int ntiers = 0, tiers_given = 0;
static size_t tier_from[MAX_TIERS];
static int tier_iters[MAX_TIERS], tier_warmup[MAX_TIERS];
static int opt_colls[NCOLL] = {1, 1, 1};
static const char *opt_json = NULL;

static void usage(void) {
    if (rank == 0)
        fprintf(stderr,
                "usage: ompi_bench [-C colls] [-b S] [-e S] [-f F] [-n N] [-w N] [--tier S:N:W ...]\n"
                "                  [-a 0..3] [-c N] [-r root] [-J file]\n"
                "  -C   comma-separated: all_reduce,all_gather,broadcast,reduce_scatter (default all)\n"
                "  -b/-e smallest/largest size in bytes, K/M/G suffixes (default 8 / 256M)\n"
                "  -f   size factor (default 2)\n"
                "  -n/-w timed / warm-up iterations per size (default 20 / 5)\n"
                "  --tier S:N:W sizes >= S use N timed and W warm-up iterations; repeatable, the largest\n"
                "               matching S wins (default 64M:5:2; --big is the same flag)\n"
                "  --warmup-pass also warm every size up before the sweep (nccl-tests' pass)\n"
                "  --fresh-inputs each rank rewrites its input before every call (as ferroccl-bench)\n"
                "  --arrays   each collective and size in send and receive arrays of their own, of the bytes\n"
                "             it needs rounded up to whole pages, kept to the end (as ferroccl-bench --arrays);\n"
                "             no --warmup-pass\n"
                "  -u N misalign both buffers by N floats (as ferroccl-bench -u; an array section a(N+1:))\n"
                "  -a   time over ranks: 0 rank 0, 1 mean, 2 min, 3 max (default 1)\n"
                "  -c   checked calls per size (default 1; 0 = none)\n"
                "  -r   broadcast root (default 0)\n"
                "  -J   also write JSON to file\n");
}

static int parse_size(const char *s, size_t *out) {
    char *end;
    double v = strtod(s, &end);
    if (end == s || v < 0) return -1;
    double m = 1;
    switch (*end) {
    case 'k': case 'K': m = 1024.0; end++; break;
    case 'm': case 'M': m = 1024.0 * 1024; end++; break;
    case 'g': case 'G': m = 1024.0 * 1024 * 1024; end++; break;
    case '\0': break;
    default: return -1;
    }
    if (*end != '\0') return -1;
    *out = (size_t)(v * m);
    return 0;
}

static void die(const char *msg) {
    if (rank == 0) fprintf(stderr, "ompi_bench: %s\n", msg);
    usage();
    MPI_Finalize();
    exit(2);
}

static void parse_args(int argc, char **argv) {
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        const char *v = (i + 1 < argc) ? argv[i + 1] : NULL;
#define NEED()                                     \
    do {                                           \
        if (!v) die("missing value for a flag");   \
        i++;                                       \
    } while (0)
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            usage();
            MPI_Finalize();
            exit(0);
        } else if (!strcmp(a, "-b") || !strcmp(a, "--minbytes")) {
            NEED();
            if (parse_size(v, &opt_min)) die("bad -b");
        } else if (!strcmp(a, "-e") || !strcmp(a, "--maxbytes")) {
            NEED();
            if (parse_size(v, &opt_max)) die("bad -e");
        } else if (!strcmp(a, "-f") || !strcmp(a, "--stepfactor")) {
            NEED();
            opt_factor = strtoul(v, NULL, 10);
            if (opt_factor < 2) die("-f must be at least 2");
        } else if (!strcmp(a, "-n") || !strcmp(a, "--iters")) {
            NEED();
            opt_iters = atoi(v);
            if (opt_iters < 1) die("-n must be at least 1");
        } else if (!strcmp(a, "-w") || !strcmp(a, "--warmup_iters")) {
            NEED();
            opt_warmup = atoi(v);
            if (opt_warmup < 0) die("bad -w");
        } else if (!strcmp(a, "--tier") || !strcmp(a, "--big")) {
            NEED();
            if (ntiers == MAX_TIERS) die("too many --tier");
            char buf[64];
            snprintf(buf, sizeof buf, "%s", v);
            char *c1 = strchr(buf, ':');
            char *c2 = c1 ? strchr(c1 + 1, ':') : NULL;
            if (!c1 || !c2) die("--big wants S:N:W");
            *c1 = *c2 = '\0';
            if (parse_size(buf, &tier_from[ntiers])) die("bad --tier size");
            tier_iters[ntiers] = atoi(c1 + 1);
            tier_warmup[ntiers] = atoi(c2 + 1);
            if (tier_iters[ntiers] < 1 || tier_warmup[ntiers] < 0) die("bad --tier iterations");
            ntiers++;
            tiers_given = 1;
        } else if (!strcmp(a, "--warmup-pass")) {
            opt_warmup_pass = 1;
        } else if (!strcmp(a, "--arrays")) {
            opt_arrays = 1;
        } else if (!strcmp(a, "-u") || !strcmp(a, "--unalign")) {
            NEED();
            char *end;
            long u = strtol(v, &end, 10);
            if (*v == '\0' || *end != '\0' || u < 0 || u > 1024) die("-u wants 0..1024 floats");
            opt_unalign = (int)u;
        } else if (!strcmp(a, "--fresh-inputs")) {
            opt_fresh_inputs = 1;
            continue;
        } else if (!strcmp(a, "-a") || !strcmp(a, "--average")) {
            NEED();
            opt_average = atoi(v);
            if (opt_average < 0 || opt_average > 3) die("-a is 0..3");
        } else if (!strcmp(a, "-c") || !strcmp(a, "--check")) {
            NEED();
            opt_check = atoi(v);
        } else if (!strcmp(a, "-r") || !strcmp(a, "--root")) {
            NEED();
            opt_root = atoi(v);
        } else if (!strcmp(a, "-J") || !strcmp(a, "--output_file")) {
            NEED();
            opt_json = v;
        } else if (!strcmp(a, "-C") || !strcmp(a, "--colls")) {
            NEED();
            char buf[256];
            snprintf(buf, sizeof buf, "%s", v);
            memset(opt_colls, 0, sizeof opt_colls);
            for (char *t = strtok(buf, ","); t; t = strtok(NULL, ",")) {
                int found = 0;
                for (int c = 0; c < NCOLL; c++)
                    if (!strcmp(t, coll_name[c]) || !strcmp(t, "all")) opt_colls[c] = found = 1;
                if (!found) die("unknown collective in -C");
            }
        } else {
            die("unknown flag");
        }
#undef NEED
    }
    if (!tiers_given) {
        tier_from[0] = (size_t)64 << 20;
        tier_iters[0] = 5;
        tier_warmup[0] = 2;
        ntiers = 1;
    }
    if (opt_min > opt_max) die("-b is larger than -e");
    if (opt_root < 0 || opt_root >= nranks) die("-r out of range");
}

/* Element counts as nccl-tests' getCollByteCount (float). */
static void counts(enum coll c, size_t size, size_t *param, size_t *send, size_t *recv, size_t *bytes) {
    size_t count = size / sizeof(float);
    if (c == ALL_GATHER) {
        size_t per = (count / (size_t)nranks) & ~(size_t)(16 / sizeof(float) - 1);
        *param = per;
        *send = per;
        *recv = per * (size_t)nranks;
    } else if (c == REDUCE_SCATTER) {
        size_t per = (count / (size_t)nranks) & ~(size_t)(16 / sizeof(float) - 1);
        *param = per;
        *send = per * (size_t)nranks;
        /* In place, recvbuf holds the whole input. */
        *recv = per * (size_t)nranks;
    } else {
        *param = *send = *recv = count;
    }
    *bytes = (*send > *recv ? *send : *recv) * sizeof(float);
}

static void schedule(size_t size, int *iters, int *warmup) {
    size_t best = 0;
    *iters = opt_iters;
    *warmup = opt_warmup;
    for (int k = 0; k < ntiers; k++)
        if (size >= tier_from[k] && tier_from[k] >= best) {
            best = tier_from[k];
            *iters = tier_iters[k];
            *warmup = tier_warmup[k];
        }
}

static void bandwidth(enum coll c, size_t param, double sec, double *algbw, double *busbw) {
    double n = nranks, bytes = (double)param * sizeof(float), base = bytes, factor = 1;
    if (c == ALL_REDUCE) factor = 2 * (n - 1) / n;
    if (c == ALL_GATHER || c == REDUCE_SCATTER) { base = bytes * n; factor = (n - 1) / n; }
    *algbw = sec > 0 ? base / 1e9 / sec : 0;
    *busbw = *algbw * factor;
}

static float *sendbuf, *recvbuf;

/* Every buffer allocated (one pair, or with --arrays one per collective and size), freed at
 * the end. */
static float **kept_arrays;
static size_t nkept;

/* A zeroed array of n floats, opt_unalign floats into a page-aligned allocation (at least one
 * page), kept until the end. */
static float *array_of(size_t n) {
    n += (size_t)opt_unalign;
    size_t bytes = (n * sizeof(float) + 4095) & ~(size_t)4095;
    float *p = aligned_alloc(4096, bytes ? bytes : 4096);
    if (!p) die("out of memory");
    memset(p, 0, bytes);
    kept_arrays = realloc(kept_arrays, (nkept + 1) * sizeof *kept_arrays);
    if (!kept_arrays) die("out of memory");
    kept_arrays[nkept++] = p;
    return p + opt_unalign;
}

/* One call. MPI counts are int: sizes up to 256 MiB of floats fit. */
static void call(enum coll c, size_t param, int in_place) {
    int cnt = (int)param;
    switch (c) {
    case ALL_REDUCE:
        MPI_Allreduce(in_place ? MPI_IN_PLACE : sendbuf, recvbuf, cnt, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
        break;
    case ALL_GATHER:
        if (in_place)
            MPI_Allgather(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, recvbuf, cnt, MPI_FLOAT, MPI_COMM_WORLD);
        else
            MPI_Allgather(sendbuf, cnt, MPI_FLOAT, recvbuf, cnt, MPI_FLOAT, MPI_COMM_WORLD);
        break;
    case BROADCAST:
        MPI_Bcast(recvbuf, cnt, MPI_FLOAT, opt_root, MPI_COMM_WORLD);
        break;
    case REDUCE_SCATTER:
        MPI_Reduce_scatter_block(in_place ? MPI_IN_PLACE : sendbuf, recvbuf, cnt, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
        break;
    default:
        break;
    }
}

/* Small integers: every partial sum is exact in float. */
static float value(int r, size_t i, unsigned seed) {
    return (float)((r * 7 + i * 13 + seed * 31) % 97);
}

/* Where this rank's input of a call lies, and its elements (*n): the broadcast's buffer, the
 * in-place block, or sendbuf. */
static float *input_of(enum coll c, size_t param, int in_place, size_t *n) {
    *n = (c == REDUCE_SCATTER) ? param * (size_t)nranks : param;
    if (c == BROADCAST || in_place) return (c == ALL_GATHER) ? recvbuf + (size_t)rank * param : recvbuf;
    return sendbuf;
}

static void fill(enum coll c, size_t param, int in_place, unsigned seed) {
    size_t n;
    float *src = input_of(c, param, in_place, &n);
    if (c == BROADCAST) {
        if (rank != opt_root) { for (size_t i = 0; i < n; i++) recvbuf[i] = -1.0f; return; }
    } else if (!in_place) {
        size_t rn = (c == ALL_GATHER) ? param * (size_t)nranks : param;
        for (size_t i = 0; i < rn; i++) recvbuf[i] = -1.0f;
    }
    for (size_t i = 0; i < n; i++) src[i] = value(rank, i, seed);
}

static long count_wrong(enum coll c, size_t param, unsigned seed) {
    long wrong = 0;
    if (c == ALL_REDUCE) {
        for (size_t i = 0; i < param; i++) {
            float e = 0;
            for (int r = 0; r < nranks; r++) e += value(r, i, seed);
            if (recvbuf[i] != e) wrong++;
        }
    } else if (c == ALL_GATHER) {
        for (int r = 0; r < nranks; r++)
            for (size_t i = 0; i < param; i++)
                if (recvbuf[(size_t)r * param + i] != value(r, i, seed)) wrong++;
    } else if (c == REDUCE_SCATTER) {
        for (size_t i = 0; i < param; i++) {
            float e = 0;
            for (int r = 0; r < nranks; r++) e += value(r, (size_t)rank * param + i, seed);
            if (recvbuf[i] != e) wrong++;
        }
    } else {
        for (size_t i = 0; i < param; i++)
            if (recvbuf[i] != value(opt_root, i, seed)) wrong++;
    }
    return wrong;
}

static double combine(double v) {
    double out = v;
    switch (opt_average) {
    case 0: MPI_Bcast(&out, 1, MPI_DOUBLE, 0, MPI_COMM_WORLD); break;
    case 1: MPI_Allreduce(&v, &out, 1, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD); out /= nranks; break;
    case 2: MPI_Allreduce(&v, &out, 1, MPI_DOUBLE, MPI_MIN, MPI_COMM_WORLD); break;
    case 3: MPI_Allreduce(&v, &out, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD); break;
    }
    return out;
}

static unsigned seed_ctr = 1;

/* --fresh-inputs: this rank's input for the next call, its first element written over every
 * element, as an application with new data would (ferroccl-bench's flag of the same name; timed
 * with the calls). A broadcast's non-roots pass no input. */
static void rewrite_input(enum coll c, size_t param, int in_place) {
    if (!opt_fresh_inputs || (c == BROADCAST && rank != opt_root)) return;
    size_t n;
    float *src = input_of(c, param, in_place, &n);
    float first = n ? src[0] : 0;
    for (size_t i = 0; i < n; i++) src[i] = first;
}

/* One call with its input rewritten first (--fresh-inputs). */
static void fresh_call(enum coll c, size_t param, int in_place) {
    rewrite_input(c, param, in_place);
    call(c, param, in_place);
}

static struct measure bench_time(enum coll c, size_t param, int in_place, int iters, int warmup) {
    struct measure m;
    fill(c, param, in_place, 0);
    for (int i = 0; i < warmup; i++) fresh_call(c, param, in_place);
    MPI_Barrier(MPI_COMM_WORLD);
    double t0 = MPI_Wtime();
    for (int i = 0; i < iters; i++) fresh_call(c, param, in_place);
    double sec = (MPI_Wtime() - t0) / iters;
    sec = combine(sec);
    bandwidth(c, param, sec, &m.algbw, &m.busbw);
    m.time_us = sec * 1e6;
    m.wrong = -1;
    if (opt_check > 0) {
        long total = 0;
        for (int k = 0; k < opt_check; k++) {
            unsigned seed = seed_ctr++;
            fill(c, param, in_place, seed);
            call(c, param, in_place);
            long local = count_wrong(c, param, seed);
            MPI_Allreduce(&local, &total, 1, MPI_LONG, MPI_SUM, MPI_COMM_WORLD);
            if (total) break;
        }
        m.wrong = total;
    }
    MPI_Barrier(MPI_COMM_WORLD);
    return m;
}

static void print_cell(const struct measure *m) {
    char w[32];
    if (m->wrong < 0) snprintf(w, sizeof w, "N/A");
    else snprintf(w, sizeof w, "%ld", m->wrong);
    printf("  %7.2f  %6.2f  %6.2f  %6s", m->time_us, m->algbw, m->busbw, w);
}

static void json_measure(FILE *f, const struct measure *m) {
    fprintf(f, "{\"time_us\": %.4f, \"algbw\": %.6f, \"busbw\": %.6f, \"wrong\": ", m->time_us, m->algbw, m->busbw);
    if (m->wrong < 0) fprintf(f, "null}");
    else fprintf(f, "%ld}", m->wrong);
}

static void json_string(FILE *f, const char *s) {
    fputc('"', f);
    for (; *s; s++) {
        unsigned char ch = (unsigned char)*s;
        if (ch == '"' || ch == '\\') fprintf(f, "\\%c", ch);
        else if (ch == '\n') fputs("\\n", f);
        else if (ch < 0x20) fprintf(f, "\\u%04x", ch);
        else fputc(ch, f);
    }
    fputc('"', f);
}

int main(int argc, char **argv) {
    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &nranks);
    parse_args(argc, argv);

    char libver[MPI_MAX_LIBRARY_VERSION_STRING];
    int len;
    MPI_Get_library_version(libver, &len);
    libver[len] = '\0';
    char *nl = strchr(libver, '\n');
    if (nl) *nl = '\0';
    char *comma = strchr(libver, ',');
    if (comma) *comma = '\0';
    char host[256];
    gethostname(host, sizeof host);
    host[sizeof host - 1] = '\0';

    /* Largest buffers any selected collective needs at opt_max. */
    size_t maxsend = 0, maxrecv = 0;
    for (int c = 0; c < NCOLL; c++) {
        if (!opt_colls[c]) continue;
        size_t p, s, r, b;
        counts((enum coll)c, opt_max, &p, &s, &r, &b);
        if (s > maxsend) maxsend = s;
        if (r > maxrecv) maxrecv = r;
    }
    if (opt_arrays) {
        if (opt_warmup_pass) die("--arrays warms each size up in its own arrays: no --warmup-pass");
    } else {
        sendbuf = array_of(maxsend);
        recvbuf = array_of(maxrecv);
    }

    if (rank == 0) {
        printf("# ompi_bench: %s, %d ranks, host %s\n", libver, nranks, host);
        printf("# minBytes %zu maxBytes %zu step: %zu(factor) warmup iters: %d iters: %d validation: %d average: %d unalign: %d\n",
               opt_min, opt_max, opt_factor, opt_warmup, opt_iters, opt_check, opt_average, opt_unalign);
        for (int k = 0; k < ntiers; k++)
            printf("# sizes >= %zu: warmup iters: %d iters: %d\n", tier_from[k], tier_warmup[k], tier_iters[k]);
        printf("# warm-up: each size right before it is timed%s\n", opt_warmup_pass ? ", after a pass over all sizes" : "");
        if (opt_arrays) printf("# buffers: each size in arrays of its own (--arrays)\n");
        if (opt_fresh_inputs) printf("# inputs: each rank rewrites its input before every call (--fresh-inputs)\n");
    }
    char pline[512];
    snprintf(pline, sizeof pline, "#  Rank %2d Pid %6d on %10s [host memory]\n", rank, (int)getpid(), host);
    if (rank == 0) {
        fputs(pline, stdout);
        for (int r = 1; r < nranks; r++) {
            MPI_Recv(pline, sizeof pline, MPI_CHAR, r, 0, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
            fputs(pline, stdout);
        }
    } else {
        MPI_Send(pline, sizeof pline, MPI_CHAR, 0, 0, MPI_COMM_WORLD);
    }

    size_t nsizes = 0;
    for (size_t s = opt_min; s <= opt_max; s *= opt_factor) { nsizes++; if (s == 0) break; }
    struct row *rows = calloc(nsizes * NCOLL, sizeof *rows);
    size_t nrows = 0;

    for (int c = 0; c < NCOLL; c++) {
        if (!opt_colls[c]) continue;
        if (rank == 0) {
            printf("#\n# collective %s\n", coll_name[c]);
            printf("#                                                              out-of-place                       in-place\n");
            printf("#       size         count      type   redop    root     time   algbw   busbw  #wrong     time   algbw   busbw  #wrong\n");
            printf("#        (B)    (elements)                               (us)  (GB/s)  (GB/s)             (us)  (GB/s)  (GB/s)\n");
            fflush(stdout);
        }
        if (opt_warmup_pass) {
            for (size_t size = opt_min; size <= opt_max; size *= 2) {
                size_t param, s, r, bytes;
                counts((enum coll)c, size, &param, &s, &r, &bytes);
                int iters, warmup;
                schedule(size, &iters, &warmup);
                for (int i = 0; i < warmup; i++) call((enum coll)c, param, 0);
                if (size == 0) break;
            }
        }
        double bwsum = 0;
        int bwn = 0;
        long errors = 0;
        for (size_t size = opt_min; size <= opt_max; size *= opt_factor) {
            size_t param, s, r, bytes;
            counts((enum coll)c, size, &param, &s, &r, &bytes);
            int iters, warmup;
            schedule(size, &iters, &warmup);
            if (opt_arrays) {
                sendbuf = array_of(s);
                recvbuf = array_of(r);
            }
            struct row *row = &rows[nrows++];
            row->coll = (enum coll)c;
            row->size = bytes;
            row->count = param;
            row->iters = iters;
            row->warmup = warmup;
            if (rank == 0) {
                printf("%12zu  %12zu  %8s  %6s  %6d", bytes, param, "float", (c == ALL_REDUCE || c == REDUCE_SCATTER) ? "sum" : "none",
                       c == BROADCAST ? opt_root : -1);
                fflush(stdout);
            }
            row->oop = bench_time((enum coll)c, param, 0, iters, warmup);
            if (rank == 0) { print_cell(&row->oop); fflush(stdout); }
            row->ip = (c == BROADCAST) ? row->oop : bench_time((enum coll)c, param, 1, iters, warmup);
            if (rank == 0) { print_cell(&row->ip); printf("\n"); fflush(stdout); }
            bwsum += row->oop.busbw + row->ip.busbw;
            bwn += 2;
            if (row->oop.wrong > 0) errors++;
            if (row->ip.wrong > 0 && c != BROADCAST) errors++;
            if (size == 0) break;
        }
        if (rank == 0) {
            printf("# Out of bounds values : %ld %s\n", errors, errors ? "FAILED" : "OK");
            printf("# Avg bus bandwidth    : %g\n", bwn ? bwsum / bwn : 0.0);
        }
    }

    if (rank == 0 && opt_json) {
        FILE *f = fopen(opt_json, "w");
        if (!f) {
            perror(opt_json);
        } else {
            time_t now = time(NULL);
            char date[64];
            strftime(date, sizeof date, "%Y-%m-%dT%H:%M:%S%z", localtime(&now));
            fprintf(f, "{\n  \"program\": \"ompi_bench\",\n  \"mpi_version\": ");
            json_string(f, libver);
            fprintf(f, ",\n  \"command_line\": ");
            char cmd[2048] = "";
            for (int i = 0; i < argc; i++) {
                if (i) strncat(cmd, " ", sizeof cmd - strlen(cmd) - 1);
                strncat(cmd, argv[i], sizeof cmd - strlen(cmd) - 1);
            }
            json_string(f, cmd);
            fprintf(f, ",\n  \"hostname\": ");
            json_string(f, host);
            fprintf(f, ",\n  \"date\": \"%s\",\n  \"nranks\": %d,\n", date, nranks);
            fprintf(f, "  \"config\": {\"minbytes\": %zu, \"maxbytes\": %zu, \"stepfactor\": %zu, \"iters\": %d, "
                       "\"warmup_iters\": %d, \"warmup_pass\": %s, \"fresh_inputs\": %s, \"arrays\": %s, \"unalign\": %d, \"check\": %d, \"average\": %d, \"root\": %d, \"tiers\": [",
                    opt_min, opt_max, opt_factor, opt_iters, opt_warmup, opt_warmup_pass ? "true" : "false", opt_fresh_inputs ? "true" : "false",
                    opt_arrays ? "true" : "false", opt_unalign, opt_check,
                    opt_average, opt_root);
            for (int k = 0; k < ntiers; k++)
                fprintf(f, "%s{\"from\": %zu, \"iters\": %d, \"warmup_iters\": %d}", k ? ", " : "", tier_from[k],
                        tier_iters[k], tier_warmup[k]);
            fprintf(f, "]},\n");
            fprintf(f, "  \"results\": [\n");
            for (size_t i = 0; i < nrows; i++) {
                struct row *r = &rows[i];
                fprintf(f, "    {\"collective\": \"%s\", \"size\": %zu, \"count\": %zu, \"type\": \"float\", "
                           "\"redop\": \"%s\", \"root\": %d, \"iters\": %d, \"warmup_iters\": %d, \"oop\": ",
                        coll_name[r->coll], r->size, r->count, (r->coll == ALL_REDUCE || r->coll == REDUCE_SCATTER) ? "sum" : "none",
                        r->coll == BROADCAST ? opt_root : -1, r->iters, r->warmup);
                json_measure(f, &r->oop);
                fprintf(f, ", \"ip\": ");
                json_measure(f, &r->ip);
                fprintf(f, "}%s\n", i + 1 < nrows ? "," : "");
            }
            fprintf(f, "  ]\n}\n");
            fclose(f);
        }
    }

    free(rows);
    for (size_t i = 0; i < nkept; i++) free(kept_arrays[i]);
    free(kept_arrays);
    MPI_Finalize();
    return 0;
}
