#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <stdint.h>
#define T 4
static size_t per;
static int block_sigbus;
static void *work(void *arg) {
    size_t t = (size_t)arg;
    if (block_sigbus && t == 0) {
        /* A thread that blocks SIGBUS before its first allocation. */
        sigset_t s;
        sigemptyset(&s);
        sigaddset(&s, SIGBUS);
        pthread_sigmask(SIG_BLOCK, &s, 0);
    }
    size_t n = per / 4096;
    unsigned char **blocks = malloc(n * sizeof(void*));
    for (size_t i = 0; i < n; i++) {
        blocks[i] = malloc(4000 + (i % 7) * 13);
        memset(blocks[i], (int)(t * 31 + i), 4000);
    }
    for (int r = 0; r < 2; r++)
      for (size_t i = 0; i < n; i++) {
        for (int k = 0; k < 4000; k += 997) if (blocks[i][k] != (unsigned char)(t * 31 + i)) { fprintf(stderr, "thread %zu block %zu bad\n", t, i); exit(3); }
        if (i % 3 == 0) { free(blocks[i]); blocks[i] = malloc(4000); memset(blocks[i], (int)(t*31+i), 4000); }
      }
    for (size_t i = 0; i < n; i++) free(blocks[i]);
    free(blocks);
    return 0;
}
int main(int argc, char **argv) {
    per = (size_t)atoi(argv[1]) << 20;
    block_sigbus = argc > 2 && strcmp(argv[2], "block-sigbus") == 0;
    pthread_t th[T];
    for (size_t t = 0; t < T; t++) pthread_create(&th[t], 0, work, (void*)t);
    for (int t = 0; t < T; t++) pthread_join(th[t], 0);
    puts("ok");
    return 0;
}
