/* A single thread's memcpy of SIZE-byte messages between two buffers of
 * SLOTS messages each, page-aligned as softrnic's registered buffers are,
 * ROUNDS times over: the floor scripts/bench.py --shm puts beside
 * softrnic's 64 KiB write_bw. Prints Gb/s.
 *
 *   memcpy-rate SIZE SLOTS ROUNDS
 *
 * Page alignment matters here: on this machine's AMD EPYC, glibc's
 * `rep movsb` copies 64 KiB twenty times slower when source and
 * destination differ by 16 bytes modulo a page (as two malloc'd buffers
 * may) than when both are page-aligned. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

int main(int argc, char **argv) {
    if (argc != 4) {
        fprintf(stderr, "usage: memcpy-rate SIZE SLOTS ROUNDS\n");
        return 2;
    }
    size_t size = strtoull(argv[1], NULL, 0), slots = strtoull(argv[2], NULL, 0);
    long rounds = strtol(argv[3], NULL, 0);
    char *src = aligned_alloc(4096, size * slots), *dst = aligned_alloc(4096, size * slots);
    if (!src || !dst || size == 0 || slots == 0 || rounds <= 0) {
        fprintf(stderr, "memcpy-rate: bad arguments or no memory\n");
        return 1;
    }
    memset(src, 0x5a, size * slots);
    memset(dst, 0, size * slots);
    struct timespec start, end;
    clock_gettime(CLOCK_MONOTONIC, &start);
    for (long i = 0; i < rounds; i++) {
        size_t at = (size_t)(i % (long)slots) * size;
        memcpy(dst + at, src + at, size);
        /* The copy is used: the compiler may not drop it. */
        __asm__ volatile("" : : "r"(dst) : "memory");
    }
    clock_gettime(CLOCK_MONOTONIC, &end);
    double seconds = (double)(end.tv_sec - start.tv_sec) + (double)(end.tv_nsec - start.tv_nsec) / 1e9;
    printf("%.2f\n", (double)rounds * (double)size * 8 / seconds / 1e9);
    return 0;
}
