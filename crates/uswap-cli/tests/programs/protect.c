// What fiber libraries, JITs and file mappers do with memory they map
// and give back, in a heap several times the budget:
//   protect MIB
// - a fiber stack: mmap, mprotect(PROT_NONE) its lowest page (the guard),
//   use, munmap; then mmap again and write every byte (the guard must be
//   gone);
// - a JIT: mmap, write, mprotect(PROT_READ|PROT_EXEC), munmap; mmap again
//   and write;
// - a file mapped MAP_SHARED|MAP_FIXED over mapped memory, unmapped; the
//   heap then used: the file must not change;
// - posix_memalign'd memory made read-only a while, then writable,
//   freed.
#define _GNU_SOURCE
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#define MB (1 << 20)

static void fill(unsigned char *p, size_t n, int v) { memset(p, v, n); }
static int same(unsigned char *p, size_t n, int v) {
    for (size_t i = 0; i < n; i++) if (p[i] != (unsigned char)v) return 0;
    return 1;
}
static void churn(size_t mib) {
    unsigned char **b = malloc(mib * sizeof *b);
    for (size_t i = 0; i < mib; i++) { b[i] = malloc(MB); memset(b[i], (int)i, MB); }
    for (size_t i = 0; i < mib; i++) free(b[i]);
    free(b);
}

int main(int argc, char **argv) {
    size_t mib = (size_t)atoi(argv[1]);
    for (int round = 0; round < 20; round++) {
        unsigned char *s = mmap(0, 256 << 10, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (s == MAP_FAILED) return 2;
        if (mprotect(s, 4096, PROT_NONE)) return 3;
        fill(s + 4096, (256 << 10) - 4096, round);
        if (munmap(s, 256 << 10)) return 4;
        unsigned char *t = mmap(0, 256 << 10, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (t == MAP_FAILED) return 5;
        fill(t, 256 << 10, round + 1);
        if (!same(t, 256 << 10, round + 1)) return 6;
        munmap(t, 256 << 10);

        unsigned char *j = mmap(0, 64 << 10, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        fill(j, 64 << 10, 0xc3);
        if (mprotect(j, 64 << 10, PROT_READ | PROT_EXEC)) return 7;
        if (j[100] != 0xc3) return 8;
        munmap(j, 64 << 10);
        unsigned char *k = mmap(0, 64 << 10, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        fill(k, 64 << 10, 7);
        munmap(k, 64 << 10);

        // Memory malloc gave, protected a while (a read-only table),
        // then made writable again and freed.
        void *a;
        if (posix_memalign(&a, 4096, 64 << 10)) return 9;
        fill(a, 64 << 10, 1);
        if (mprotect(a, 64 << 10, PROT_READ) || mprotect(a, 64 << 10, PROT_READ | PROT_WRITE)) return 10;
        free(a);
        churn(mib / 8);
    }
    char path[4096];
    snprintf(path, sizeof path, "%s/mapped-%d", argv[2], (int)getuid());
    int fd = open(path, O_RDWR | O_CREAT | O_TRUNC, 0600);
    if (fd < 0 || ftruncate(fd, MB)) return 11;
    unsigned char *m = mmap(0, MB, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    fill(m, MB, 5);
    unsigned char *f = mmap(m, MB, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_FIXED, fd, 0);
    if (f != m) return 12;
    fill(f, MB, 'f');
    munmap(f, MB);
    churn(mib);
    for (int i = 0; i < 8; i++) {
        unsigned char *n = mmap(0, MB, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        fill(n, MB, 9);
    }
    churn(mib);
    unsigned char *back = mmap(0, MB, PROT_READ, MAP_SHARED, fd, 0);
    if (!same(back, MB, 'f')) { fputs("the file changed after it was unmapped\n", stderr); return 13; }
    unlink(path);
    puts("ok");
    return 0;
}
