#define _GNU_SOURCE
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
static unsigned char want(size_t i) { return (unsigned char)(i * 7 + i / 4096); }
int main(int argc, char **argv) {
    size_t len = (size_t)atoi(argv[1]) << 20;
    unsigned char *p = mmap(0, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) return 2;
    for (size_t i = 0; i < len; i += 512) if (p[i]) return 3;
    for (size_t i = 0; i < len; i++) p[i] = want(i);
    if (madvise(p + len / 4, len / 4, MADV_DONTNEED)) return 4;
    unsigned char *q = mremap(p, len, 2 * len, MREMAP_MAYMOVE);
    if (q == MAP_FAILED) return 5;
    for (size_t i = 0; i < 2 * len; i++) {
        unsigned char w = (i < len / 4 || (i >= len / 2 && i < len)) ? want(i) : 0;
        if (q[i] != w) { fprintf(stderr, "byte %zu reads %d, not %d\n", i, q[i], w); return 6; }
    }
    if (munmap(q, len) || munmap(q + len, len)) return 7;
    unsigned char *r = mmap(0, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (r == MAP_FAILED) return 8;
    for (size_t i = 0; i < len; i += 512) if (r[i]) return 9;
    puts("ok");
    return 0;
}
