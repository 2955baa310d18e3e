/* mremap and madvise on mapped memory, as the kernel has them:
 *
 *   remap MIB
 *
 * - MREMAP_FIXED to an address found by mapping and unmapping (stress-ng's
 *   mremap stressor; under uswap run the address was a heap block mimalloc
 *   took back: EINVAL), the contents moving along;
 * - MREMAP_DONTUNMAP: the contents at the new address, the old range still
 *   mapped and reading zeros (it returned the old address);
 * - shrink and grow with MREMAP_MAYMOVE, contents kept;
 * - MAP_POPULATE mappings (went to the kernel, unpaged);
 * - madvise MADV_WIPEONFORK: a forked child reads zeros there, the parent
 *   its data; MADV_POPULATE_READ/WRITE succeed; MADV_DONTNEED reads zeros;
 * - munmap of one range twice, then of the rest: the block was freed at
 *   the second call (bytes counted twice) while half of it was mapped.
 * Each on MIB MiB (several times the budget), every byte checked.
 * Prints "ok" or what differed.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

static int bad;
#define CHECK(c, ...) do { if (!(c)) { printf(__VA_ARGS__); printf("\n"); bad++; } } while (0)

static void fill(unsigned char *p, size_t n, unsigned seed) {
    for (size_t i = 0; i < n; i += 512) p[i] = (unsigned char)(i / 512 * 31 + seed);
}
static int same(const unsigned char *p, size_t n, unsigned seed) {
    for (size_t i = 0; i < n; i += 512)
        if (p[i] != (unsigned char)(i / 512 * 31 + seed)) return 0;
    return 1;
}
static int zeros(const unsigned char *p, size_t n) {
    for (size_t i = 0; i < n; i += 512)
        if (p[i]) return 0;
    return 1;
}
static void *map(size_t n, int extra) {
    void *p = mmap(NULL, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | extra, -1, 0);
    if (p == MAP_FAILED) { perror("mmap"); exit(2); }
    return p;
}

int main(int argc, char **argv) {
    size_t n = (size_t)(argc > 1 ? atoi(argv[1]) : 64) << 20;

    /* MREMAP_FIXED to a found address. */
    unsigned char *a = map(n, 0);
    fill(a, n, 1);
    void *to = map(n / 2, 0);
    munmap(to, n / 2);
    unsigned char *b = mremap(a, n, n / 2, MREMAP_MAYMOVE | MREMAP_FIXED, to);
    CHECK(b == to, "MREMAP_FIXED: %p (errno %d), asked %p", (void *)b, errno, to);
    if (b == to) CHECK(same(b, n / 2, 1), "MREMAP_FIXED: contents");
    munmap(b, n / 2);

    /* MREMAP_DONTUNMAP. */
    a = map(n / 2, 0);
    fill(a, n / 2, 2);
    /* The fifth argument is a hint with DONTUNMAP (Linux 6.x): passed. */
    b = mremap(a, n / 2, n / 2, MREMAP_MAYMOVE | MREMAP_DONTUNMAP, NULL);
    CHECK(b != MAP_FAILED && b != a, "MREMAP_DONTUNMAP: %p from %p (errno %d)", (void *)b, (void *)a, errno);
    if (b != MAP_FAILED && b != a) {
        CHECK(same(b, n / 2, 2), "MREMAP_DONTUNMAP: contents");
        CHECK(zeros(a, n / 2), "MREMAP_DONTUNMAP: the old range is not empty");
        munmap(b, n / 2);
    }
    munmap(a, n / 2);

    /* Shrink, then grow with a move. */
    a = map(n, MAP_POPULATE);
    fill(a, n, 3);
    a = mremap(a, n, n / 4, 0);
    CHECK(a != MAP_FAILED && same(a, n / 4, 3), "shrink");
    a = mremap(a, n / 4, n, MREMAP_MAYMOVE);
    CHECK(a != MAP_FAILED && same(a, n / 4, 3) && zeros(a + n / 4, n - n / 4), "grow");
    munmap(a, n);

    /* madvise. */
    a = map(n, 0);
    fill(a, n, 4);
    CHECK(madvise(a, n, MADV_POPULATE_READ) == 0, "MADV_POPULATE_READ: errno %d", errno);
    CHECK(madvise(a, n, MADV_POPULATE_WRITE) == 0, "MADV_POPULATE_WRITE: errno %d", errno);
    CHECK(madvise(a, n / 2, MADV_WIPEONFORK) == 0, "MADV_WIPEONFORK: errno %d", errno);
    pid_t pid = fork();
    if (pid == 0) _exit(zeros(a, n / 2) && same(a + n / 2, n / 2, 4) ? 0 : 1);
    int st;
    waitpid(pid, &st, 0);
    CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0, "MADV_WIPEONFORK: the child saw status %d", st);
    CHECK(same(a, n, 4), "MADV_WIPEONFORK: the parent's data");
    CHECK(madvise(a, n / 4, MADV_DONTNEED) == 0 && zeros(a, n / 4), "MADV_DONTNEED");

    /* munmap twice in one place, then the rest. */
    CHECK(munmap(a, n / 4) == 0 && munmap(a, n / 4) == 0, "munmap twice");
    unsigned char *c = map(n / 4, 0); /* may reuse what was freed too soon */
    fill(c, n / 4, 5);
    CHECK(same(a + n / 2, n / 2, 4), "the rest of the block after munmap twice");
    /* The rest (not the first quarter: `c` may be there now). */
    munmap(a + n / 4, n - n / 4);
    CHECK(same(c, n / 4, 5), "a later mapping");
    munmap(c, n / 4);
    puts(bad ? "bad" : "ok");
    return bad != 0;
}
