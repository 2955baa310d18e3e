/* A runtime's way with memory (OpenJDK, V8): reserve address space
 * inaccessible, commit it a part at a time with mmap(MAP_FIXED) over the
 * reservation or with mprotect, uncommit with mmap(MAP_FIXED, PROT_NONE)
 * or madvise, trim an over-sized reservation to an alignment.  Every
 * byte written reads back, every byte uncommitted reads as zero.  No
 * malloc but one at the end, of 6 GiB (a block past mimalloc's default
 * largest, 2 GiB), two pages of it touched: under a small budget, what
 * goes out is the reservations' memory. */
#define _GNU_SOURCE
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
static unsigned char want(size_t i, int salt) { return (unsigned char)(i * 7 + i / 4096 + salt); }
static int check(unsigned char *p, size_t from, size_t to, int salt, int zero, const char *what) {
    for (size_t i = from; i < to; i++) {
        unsigned char w = zero ? 0 : want(i, salt);
        if (p[i] != w) { fprintf(stderr, "%s: byte %zu reads %d, not %d\n", what, i, p[i], w); return 1; }
    }
    return 0;
}
int main(int argc, char **argv) {
    size_t len = (size_t)atoi(argv[1]) << 20, half = len / 2, q = len / 4;
    const int none = MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE;
    /* OpenJDK: its heap reserved at a hint, committed by fixed mappings. */
    unsigned char *r = mmap((void *)0x80000000UL, len, PROT_NONE, none, -1, 0);
    if (r == MAP_FAILED) return 2;
    if (mmap(r, half, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_FIXED | MAP_ANONYMOUS, -1, 0) != r) return 3;
    for (size_t i = 0; i < half; i++) r[i] = want(i, 1);
    /* V8: pages of the reservation made accessible with mprotect. */
    if (mprotect(r + half, half, PROT_READ | PROT_WRITE)) return 4;
    if (check(r, half, len, 0, 1, "fresh by mprotect")) return 5;
    for (size_t i = half; i < len; i++) r[i] = want(i, 1);
    if (check(r, 0, len, 1, 0, "committed")) return 6;
    /* Uncommit a quarter (OpenJDK shrinking its heap), commit it again:
     * zeros, the rest kept. */
    if (mmap(r + q, q, PROT_NONE, none | MAP_FIXED, -1, 0) != r + q) return 7;
    if (mmap(r + q, q, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_FIXED | MAP_ANONYMOUS, -1, 0) != r + q) return 8;
    if (check(r, q, half, 0, 1, "recommitted") || check(r, 0, q, 1, 0, "kept below") || check(r, half, len, 1, 0, "kept above")) return 9;
    /* V8 discarding pages of its heap. */
    if (madvise(r + half, q, MADV_DONTNEED)) return 10;
    if (check(r, half, half + q, 0, 1, "discarded") || check(r, half + q, len, 1, 0, "kept past the discard")) return 11;
    if (munmap(r, len)) return 12;
    /* A reservation trimmed to a 2 MiB alignment, its ends unmapped. */
    size_t align = 2 << 20;
    unsigned char *big = mmap(0, len + align, PROT_NONE, none, -1, 0);
    if (big == MAP_FAILED) return 13;
    unsigned char *a = (unsigned char *)(((uintptr_t)big + align - 1) & ~(uintptr_t)(align - 1));
    if (a > big && munmap(big, a - big)) return 14;
    if (munmap(a + len, big + len + align - (a + len))) return 15;
    if (mprotect(a, len, PROT_READ | PROT_WRITE)) return 16;
    for (size_t i = 0; i < len; i++) a[i] = want(i, 2);
    if (check(a, 0, len, 2, 0, "aligned")) return 17;
    if (munmap(a, len)) return 18;
    /* What was given back is given again as fresh memory. */
    unsigned char *f = mmap(0, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (f == MAP_FAILED || check(f, 0, len, 0, 1, "fresh")) return 19;
    size_t huge = (size_t)6 << 30;
    unsigned char *m = malloc(huge);
    if (!m) { perror("malloc of 6 GiB"); return 20; }
    m[0] = 1;
    m[huge - 1] = 2;
    if (m[0] + m[huge - 1] != 3) return 21;
    free(m);
    puts("ok");
    return 0;
}
