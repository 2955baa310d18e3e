// Where a UFFDIO_MOVE's TLB flush goes: the cost of moving scattered
// pages (every 4th of a 64 MiB region) one call each, from a thread on
// CPU 0, while CPU 1 runs (a) a spinning thread of the same process,
// (b) a spinning thread of another process, (c) nothing.
#define _GNU_SOURCE
#include <fcntl.h>
#include <linux/userfaultfd.h>
#include <pthread.h>
#include <sched.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define PAGE 4096UL
#ifndef UFFD_FEATURE_MOVE
#define UFFD_FEATURE_MOVE (1 << 16)
struct uffdio_move { __u64 dst, src, len, mode; __s64 move; };
#define UFFDIO_MOVE _IOWR(UFFDIO, 0x05, struct uffdio_move)
#endif
#define LEN (64UL << 20)
#define NPAGES (LEN / PAGE)

static volatile int stop;
static void pin(int cpu) {
    cpu_set_t s; CPU_ZERO(&s); CPU_SET(cpu, &s);
    if (sched_setaffinity(0, sizeof s, &s)) { perror("affinity"); exit(1); }
}
static void *spin(void *arg) {
    pin(1);
    volatile uint64_t x = 0;
    char *p = arg;  /* touch our own memory now and then */
    while (!stop) { x++; if ((x & 0xffff) == 0 && p) p[(x >> 16) % 64 * PAGE] = 1; }
    return NULL;
}
static double now(void) { struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec + t.tv_nsec / 1e9; }

static double round_(int uffd, char *src, char *dst) {
    for (size_t i = 0; i < NPAGES; i++) src[i * PAGE] = (char)i;
    double t0 = now(); size_t n = 0;
    for (size_t i = 0; i < NPAGES; i += 4, n++) {
        struct uffdio_move m = { .dst = (uint64_t)(dst + i * PAGE), .src = (uint64_t)(src + i * PAGE), .len = PAGE, .mode = 0 };
        if (ioctl(uffd, UFFDIO_MOVE, &m)) { perror("UFFDIO_MOVE"); exit(1); }
    }
    double us = (now() - t0) * 1e6 / n;
    for (size_t i = 0; i < NPAGES; i += 4) if (dst[i * PAGE] != (char)i) { fprintf(stderr, "bad data\n"); exit(1); }
    madvise(dst, LEN, MADV_DONTNEED);
    return us;
}

int main(void) {
    int uffd = syscall(SYS_userfaultfd, O_CLOEXEC | UFFD_USER_MODE_ONLY);
    if (uffd < 0) { perror("userfaultfd"); return 1; }
    struct uffdio_api api = { .api = UFFD_API, .features = UFFD_FEATURE_MOVE };
    if (ioctl(uffd, UFFDIO_API, &api)) { perror("UFFDIO_API"); return 1; }
    char *src = mmap(NULL, LEN, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    char *dst = mmap(NULL, LEN, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    madvise(src, LEN, MADV_NOHUGEPAGE); madvise(dst, LEN, MADV_NOHUGEPAGE);
    struct uffdio_register r = { .range = { (uint64_t)dst, LEN }, .mode = UFFDIO_REGISTER_MODE_MISSING };
    if (ioctl(uffd, UFFDIO_REGISTER, &r)) { perror("register"); return 1; }
    pin(0);
    const char *names[] = { "a: CPU 1 runs a thread of this process", "b: CPU 1 runs another process", "c: CPU 1 idle" };
    for (int round = 0; round < 3; round++) {
        for (int k = 0; k < 3; k++) {
            pthread_t t; pid_t child = 0; stop = 0;
            char *own = mmap(NULL, 64 * PAGE, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
            if (k == 0) pthread_create(&t, NULL, spin, own);
            if (k == 1) { child = fork(); if (!child) { spin(own); _exit(0); } }
            usleep(20000);
            double us = round_(uffd, src, dst);
            if (k == 0) { stop = 1; pthread_join(t, NULL); }
            if (k == 1) { kill(child, 9); waitpid(child, NULL, 0); }
            printf("round %d  %-42s %6.2f us a page\n", round + 1, names[k], us);
            munmap(own, 64 * PAGE);
        }
    }
    return 0;
}
