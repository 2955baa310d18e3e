// Signal set-ups ordinary programs make, each followed by touching heap
// memory several times the budget (most of it out):
//   signals MIB block_all    - sigfillset + pthread_sigmask(SIG_BLOCK) in
//                              main before starting workers, one of which
//                              waits in sigwait (the server pattern)
//   signals MIB handler_mask - a SIGALRM handler installed with a full
//                              sa_mask reads the heap, 200 times
//   signals MIB altstack     - an alternate signal stack from malloc and an
//                              SA_ONSTACK handler that reads the heap,
//                              raised after the heap went out, 200 times
//   signals MIB pending      - SIGBUS blocked, sent with raise: it waits
//                              (and the mask says blocked) until unblocked,
//                              then the program's handler runs once
#define _GNU_SOURCE
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define BLOCK 4096
static size_t n;
static unsigned char **blocks;
static volatile unsigned long sum;
static volatile int handled;
static char *alt;
static size_t alt_size;

static unsigned char want(size_t b, size_t i) { return (unsigned char)(b * 13 + i); }

static void fill(void) {
    for (size_t b = 0; b < n; b++)
        for (size_t i = 0; i < BLOCK; i++) blocks[b][i] = want(b, i);
}

static size_t check(size_t from, size_t count) {
    size_t bad = 0;
    for (size_t k = 0; k < count; k++) {
        size_t b = (from + k) % n;
        for (size_t i = 0; i < BLOCK; i += 64)
            if (blocks[b][i] != want(b, i)) bad++;
    }
    return bad;
}

static void on_alarm(int sig) {
    (void)sig;
    // A stride through the heap, from a handler: faults served here.
    sum += check((size_t)handled * 97, 64);
    handled++;
}

static void on_stack(int sig) {
    char here;
    (void)sig;
    if (&here < alt || &here >= alt + alt_size) { write(2, "not on the alternate stack\n", 27); _exit(7); }
    sum += check((size_t)handled * 97, 64);
    handled++;
}

static void on_bus(int sig) { (void)sig; handled++; }

static void *worker(void *arg) {
    size_t t = (size_t)arg;
    size_t bad = 0;
    for (int r = 0; r < 3; r++) bad += check(t * n / 4, n);
    return (void *)bad;
}

static void *waiter(void *arg) {
    (void)arg;
    sigset_t s;
    sigemptyset(&s);
    sigaddset(&s, SIGUSR1);
    int got = 0;
    sigwait(&s, &got);
    return (void *)(intptr_t)got;
}

int main(int argc, char **argv) {
    if (argc < 3) return 2;
    n = ((size_t)atoi(argv[1]) << 20) / BLOCK;
    const char *how = argv[2];
    blocks = malloc(n * sizeof *blocks);
    for (size_t b = 0; b < n; b++) blocks[b] = malloc(BLOCK);
    if (!strcmp(how, "block_all")) {
        sigset_t all;
        sigfillset(&all);
        pthread_sigmask(SIG_BLOCK, &all, 0);
        fill();
        pthread_t w[3], s;
        pthread_create(&s, 0, waiter, 0);
        for (size_t t = 0; t < 3; t++) pthread_create(&w[t], 0, worker, (void *)t);
        size_t bad = check(0, n);
        for (int t = 0; t < 3; t++) { void *r; pthread_join(w[t], &r); bad += (size_t)r; }
        pthread_kill(s, SIGUSR1);
        void *got;
        pthread_join(s, &got);
        if (bad || (intptr_t)got != SIGUSR1) { fprintf(stderr, "%zu bad, sigwait got %d\n", bad, (int)(intptr_t)got); return 3; }
    } else if (!strcmp(how, "handler_mask") || !strcmp(how, "altstack")) {
        struct sigaction sa;
        memset(&sa, 0, sizeof sa);
        sigfillset(&sa.sa_mask);
        int sig = SIGALRM;
        sa.sa_handler = on_alarm;
        if (!strcmp(how, "altstack")) {
            alt_size = 64 << 10;
            alt = malloc(alt_size);
            stack_t ss = {.ss_sp = alt, .ss_size = alt_size, .ss_flags = 0};
            if (sigaltstack(&ss, 0)) { perror("sigaltstack"); return 4; }
            sa.sa_handler = on_stack;
            sa.sa_flags = SA_ONSTACK;
            sig = SIGUSR2;
        }
        sigaction(sig, &sa, 0);
        fill();
        for (int k = 0; k < 200; k++) {
            // The rest of the heap in again, so the handler's stride is out.
            if (check((size_t)k * 1000, n / 2)) return 5;
            raise(sig);
        }
        if (handled != 200 || sum) { fprintf(stderr, "handled %d, %lu bad\n", handled, sum); return 6; }
    } else if (!strcmp(how, "pending")) {
        signal(SIGBUS, on_bus);
        sigset_t bus, old;
        sigemptyset(&bus);
        sigaddset(&bus, SIGBUS);
        sigprocmask(SIG_BLOCK, &bus, 0);
        fill();
        raise(SIGBUS);
        if (check(0, n)) return 3;
        if (handled) { fputs("a blocked SIGBUS was handled\n", stderr); return 4; }
        sigprocmask(SIG_UNBLOCK, &bus, &old);
        if (!sigismember(&old, SIGBUS)) { fputs("the mask did not say SIGBUS was blocked\n", stderr); return 5; }
        if (handled != 1) { fprintf(stderr, "handled %d times after unblocking\n", handled); return 6; }
        if (check(0, n)) return 7;
    } else {
        return 2;
    }
    puts("ok");
    return 0;
}
