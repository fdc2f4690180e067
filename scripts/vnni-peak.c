// Peak rate of the multiply-accumulate instructions the int8 kernels are built on, on one core:
// 12 independent `vpdpbusd` chains (zmm, then ymm), `vpmulld` and `vpdpwssd` (zmm), and 12
// `vpdpbusd` beside 8 `vpaddd` (whether plain vector adds compete with them for issue slots).
// The ceiling a batched decode step's compute is judged against (BENCHMARKS.md).
//
//   gcc -O2 -march=native scripts/vnni-peak.c -o /tmp/vnni-peak && /tmp/vnni-peak
//   (/tmp/vnni-peak & /tmp/vnni-peak; wait)    # both cores at once
#include <immintrin.h>
#include <stdio.h>
#include <time.h>

static double seconds(struct timespec a, struct timespec b) {
    return (b.tv_sec - a.tv_sec) + (b.tv_nsec - a.tv_nsec) * 1e-9;
}

int main(void) {
    const long iterations = 100000000;
    struct timespec start, end;
    __m512i acc[12];
    __m512i w = _mm512_set1_epi8(3), x = _mm512_set1_epi8(5);
    int sink = 0;

    for (int i = 0; i < 12; i++) acc[i] = _mm512_set1_epi32(i);
    clock_gettime(CLOCK_MONOTONIC, &start);
    for (long n = 0; n < iterations; n++) {
#pragma GCC unroll 12
        for (int i = 0; i < 12; i++) acc[i] = _mm512_dpbusd_epi32(acc[i], w, x);
        __asm__ volatile("" : "+v"(w));
    }
    clock_gettime(CLOCK_MONOTONIC, &end);
    for (int i = 0; i < 12; i++) sink += _mm512_reduce_add_epi32(acc[i]);
    double t = seconds(start, end);
    printf("vpdpbusd zmm: %.2f G/s, %.1f G int8 MAC/s\n", iterations * 12 / t / 1e9,
           iterations * 12 * 64 / t / 1e9);

    __m256i acc2[12];
    __m256i w2 = _mm256_set1_epi8(3), x2 = _mm256_set1_epi8(5);
    for (int i = 0; i < 12; i++) acc2[i] = _mm256_set1_epi32(i);
    clock_gettime(CLOCK_MONOTONIC, &start);
    for (long n = 0; n < iterations; n++) {
#pragma GCC unroll 12
        for (int i = 0; i < 12; i++) acc2[i] = _mm256_dpbusd_epi32(acc2[i], w2, x2);
        __asm__ volatile("" : "+v"(w2));
    }
    clock_gettime(CLOCK_MONOTONIC, &end);
    for (int i = 0; i < 12; i++) sink += _mm256_extract_epi32(acc2[i], 0);
    t = seconds(start, end);
    printf("vpdpbusd ymm: %.2f G/s, %.1f G int8 MAC/s\n", iterations * 12 / t / 1e9,
           iterations * 12 * 32 / t / 1e9);

    for (int i = 0; i < 12; i++) acc[i] = _mm512_set1_epi32(i + 1);
    clock_gettime(CLOCK_MONOTONIC, &start);
    for (long n = 0; n < iterations; n++) {
#pragma GCC unroll 12
        for (int i = 0; i < 12; i++) acc[i] = _mm512_mullo_epi32(acc[i], w);
        __asm__ volatile("" : "+v"(w));
    }
    clock_gettime(CLOCK_MONOTONIC, &end);
    for (int i = 0; i < 12; i++) sink += _mm512_reduce_add_epi32(acc[i]);
    printf("vpmulld zmm: %.2f G/s\n", iterations * 12 / seconds(start, end) / 1e9);

    for (int i = 0; i < 12; i++) acc[i] = _mm512_set1_epi32(i + 1);
    clock_gettime(CLOCK_MONOTONIC, &start);
    for (long n = 0; n < iterations; n++) {
#pragma GCC unroll 12
        for (int i = 0; i < 12; i++) acc[i] = _mm512_dpwssd_epi32(acc[i], w, x);
        __asm__ volatile("" : "+v"(w));
    }
    clock_gettime(CLOCK_MONOTONIC, &end);
    for (int i = 0; i < 12; i++) sink += _mm512_reduce_add_epi32(acc[i]);
    printf("vpdpwssd zmm: %.2f G/s\n", iterations * 12 / seconds(start, end) / 1e9);

    __m512i adds[4];
    for (int i = 0; i < 12; i++) acc[i] = _mm512_set1_epi32(i + 1);
    for (int i = 0; i < 4; i++) adds[i] = _mm512_set1_epi32(i + 1);
    clock_gettime(CLOCK_MONOTONIC, &start);
    for (long n = 0; n < iterations; n++) {
#pragma GCC unroll 12
        for (int i = 0; i < 12; i++) acc[i] = _mm512_dpbusd_epi32(acc[i], w, x);
#pragma GCC unroll 4
        for (int i = 0; i < 4; i++) adds[i] = _mm512_add_epi32(adds[i], w);
#pragma GCC unroll 4
        for (int i = 0; i < 4; i++) adds[i] = _mm512_add_epi32(adds[i], x);
        __asm__ volatile("" : "+v"(w));
    }
    clock_gettime(CLOCK_MONOTONIC, &end);
    for (int i = 0; i < 12; i++) sink += _mm512_reduce_add_epi32(acc[i]);
    for (int i = 0; i < 4; i++) sink += _mm512_reduce_add_epi32(adds[i]);
    printf("vpdpbusd zmm beside 8 vpaddd per 12: %.2f G vpdpbusd/s\n",
           iterations * 12 / seconds(start, end) / 1e9);
    return sink == 42;  // keeps the sums alive
}
