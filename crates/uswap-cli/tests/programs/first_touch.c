/* A thread whose first call into uswap is a fault: it starts by reading
 * memory its parent filled (out by then, so the touch is served by
 * uswap's SIGBUS handler, which reads the page back from the swap file
 * on this thread), and only then allocates as much again of its own.
 * Its allocations must come from the paged heap like every other
 * thread's: the route a thread's blocks take is decided at its first
 * call, and a decision made inside uswap's handler, where every signal
 * is blocked, took it for a thread that blocks SIGBUS (what a Go
 * program's threads met when they first faulted before they first
 * allocated). */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
static size_t mib;
static unsigned char *parent;
static unsigned long sum;
static void *work(void *arg) {
    (void)arg;
    /* The first touches: pages the parent wrote, swapped out by now. */
    unsigned long s = 0;
    for (size_t i = 0; i < (mib << 20); i += 4096 * 64) s += parent[i];
    /* Then its own memory, as much as the parent's, a MiB at a time
     * (each past glibc's mmap threshold: its own mapping there). */
    unsigned char **own = malloc(mib * sizeof *own);
    for (size_t m = 0; m < mib; m++) {
        own[m] = malloc(1 << 20);
        if (!own[m]) { fprintf(stderr, "malloc failed\n"); exit(2); }
        memset(own[m], (int)(m * 7 + 1), 1 << 20);
    }
    for (size_t m = 0; m < mib; m++) {
        for (size_t k = 0; k < (1 << 20); k += 4093)
            if (own[m][k] != (unsigned char)(m * 7 + 1)) { fprintf(stderr, "block %zu bad\n", m); exit(3); }
        s += own[m][m];
        free(own[m]);
    }
    free(own);
    sum = s;
    return 0;
}
int main(int argc, char **argv) {
    mib = argc > 1 ? (size_t)atoi(argv[1]) : 48;
    parent = malloc(mib << 20);
    for (size_t i = 0; i < (mib << 20); i++) parent[i] = (unsigned char)(i % 251);
    pthread_t t;
    pthread_create(&t, 0, work, 0);
    pthread_join(t, 0);
    printf("%lu\n", sum);
    return 0;
}
