/* How fast glibc's memcpy and plain vector loops copy, by how far the destination lies past the
 * source modulo 4 KiB (bench/results/unaligned-copies-2026-12-07.md). On AMD Zen cores glibc
 * (2.36, Debian 12) copies 2 KiB-1 MiB with `rep movsb`, which runs 15-30x slower when the
 * destination is 1-15 bytes past the source; ferroccl's src/memcopy.rs takes a loop like
 * fwd_avx2 below at such distances.
 *
 *   gcc -O2 bench/copy_distance_probe.c -o copy_distance_probe && ./copy_distance_probe 131072
 *   arg: bytes per copy (default 131072); best of 30 copies, microseconds
 */
#include <immintrin.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static double now_us(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1e6 + t.tv_nsec / 1e3;
}

static void with_memcpy(char *d, const char *s, size_t n) { memcpy(d, s, n); }

/* 128 bytes a step in four 32-byte loads and stores, the tail by memcpy. */
__attribute__((target("avx2"))) static void fwd_avx2(char *d, const char *s, size_t n) {
    size_t i = 0;
    for (; i + 128 <= n; i += 128) {
        __m256i a = _mm256_loadu_si256((const __m256i *)(s + i)), b = _mm256_loadu_si256((const __m256i *)(s + i + 32)),
                c = _mm256_loadu_si256((const __m256i *)(s + i + 64)), e = _mm256_loadu_si256((const __m256i *)(s + i + 96));
        _mm256_storeu_si256((__m256i *)(d + i), a);
        _mm256_storeu_si256((__m256i *)(d + i + 32), b);
        _mm256_storeu_si256((__m256i *)(d + i + 64), c);
        _mm256_storeu_si256((__m256i *)(d + i + 96), e);
    }
    memcpy(d + i, s + i, n - i);
}

/* The same with 16-byte SSE2 vectors (any x86-64). */
static void fwd_sse2(char *d, const char *s, size_t n) {
    size_t i = 0;
    for (; i + 64 <= n; i += 64) {
        __m128i a = _mm_loadu_si128((const __m128i *)(s + i)), b = _mm_loadu_si128((const __m128i *)(s + i + 16)),
                c = _mm_loadu_si128((const __m128i *)(s + i + 32)), e = _mm_loadu_si128((const __m128i *)(s + i + 48));
        _mm_storeu_si128((__m128i *)(d + i), a);
        _mm_storeu_si128((__m128i *)(d + i + 16), b);
        _mm_storeu_si128((__m128i *)(d + i + 32), c);
        _mm_storeu_si128((__m128i *)(d + i + 48), e);
    }
    memcpy(d + i, s + i, n - i);
}

int main(int argc, char **argv) {
    size_t n = argc > 1 ? strtoul(argv[1], 0, 0) : 131072;
    char *a = aligned_alloc(4096, n + 8192), *b = aligned_alloc(4096, n + 8192);
    if (!a || !b) return 1;
    memset(a, 1, n + 8192);
    memset(b, 2, n + 8192);
    void (*fn[])(char *, const char *, size_t) = {with_memcpy, fwd_avx2, fwd_sse2};
    const char *name[] = {"memcpy", "avx2 loop", "sse2 loop"};
    int dist[] = {0, 4, 8, 12, 16, 24, 32, 48, 64, -8};
    printf("# %zu bytes per copy, us (best of 30), by destination - source modulo 4 KiB\n%-10s", n, "");
    for (int j = 0; j < 10; j++) printf(" %+7d", dist[j]);
    printf("\n");
    for (int k = 0; k < 3; k++) {
        if (k == 1 && !__builtin_cpu_supports("avx2")) continue;
        printf("%-10s", name[k]);
        for (int j = 0; j < 10; j++) {
            char *dst = b + 128 + dist[j];
            const char *src = a + 128;
            double best = 1e30;
            for (int r = 0; r < 30; r++) {
                double t0 = now_us();
                fn[k](dst, src, n);
                double t = now_us() - t0;
                if (t < best) best = t;
            }
            if (memcmp(dst, src, n)) printf(" WRONG");
            printf(" %7.2f", best);
        }
        printf("\n");
    }
    return 0;
}
