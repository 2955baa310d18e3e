// A program that runs a command now and then (bash, Perl's system,
// libuv), between passes over its heap:
//   forkchurn MIB PASSES FORKS
// MIB MiB of heap is written, then the program forks FORKS children that
// exit at once, then PASSES passes read every page (writing a word in one
// page of eight).  Prints a digest, and the passes' time on stderr.
// After a fork the kernel no longer treats the parent's pages as its own
// alone (the child shared them), and UFFDIO_MOVE refuses them until they
// are written again: before, such pages stayed resident, over the
// budget's reclaim, and every pass went to direct reclaim.
#define _GNU_SOURCE
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

int main(int argc, char **argv) {
    if (argc < 4) return 2;
    size_t len = (size_t)atoi(argv[1]) << 20;
    int passes = atoi(argv[2]), forks = atoi(argv[3]);
    unsigned char *p = malloc(len);
    for (size_t i = 0; i < len; i++) p[i] = (unsigned char)(i * 7);
    for (int f = 0; f < forks; f++) {
        pid_t c = fork();
        if (c == 0) _exit(0);
        waitpid(c, 0, 0);
    }
    uint64_t sum = 0;
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    for (int r = 0; r < passes; r++)
        for (size_t i = 0; i < len; i += 4096) {
            sum += p[i + (size_t)r];
            if ((i / 4096) % 8 == (size_t)r % 8) p[i + 8]++;
        }
    clock_gettime(CLOCK_MONOTONIC, &t1);
    fprintf(stderr, "forkchurn: %.2f s\n", (double)(t1.tv_sec - t0.tv_sec) + (double)(t1.tv_nsec - t0.tv_nsec) * 1e-9);
    printf("%llu\n", (unsigned long long)sum);
    return 0;
}
