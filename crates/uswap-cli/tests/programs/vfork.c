// Python's subprocess, in C: argument lists built in the heap, pushed out
// by other work, then every signal blocked, vfork, and the child execs
// with them (the kernel reads them; the child touches them first):
//   vfork MIB ROUNDS
// Each round builds ~1 MB of arguments, touches MIB MiB of other heap
// memory, and runs `sh -c 'echo $#' sh ARGS...` through vfork + execv.
// The argument lists are kept (ROUNDS MiB of them); at the end the rest of
// the heap is touched again: what the execs read must not stay held
// (resident) in the parent.
#define _GNU_SOURCE
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#define ARGS 1000
#define ARG_LEN 1000

static unsigned char *other;
static size_t other_len;

static unsigned long churn(void) {
    unsigned long s = 0;
    for (size_t i = 0; i < other_len; i += 4096) { other[i]++; s += other[i]; }
    return s;
}

int main(int argc, char **argv) {
    if (argc < 3) return 2;
    other_len = (size_t)atoi(argv[1]) << 20;
    int rounds = atoi(argv[2]);
    other = malloc(other_len);
    memset(other, 1, other_len);
    for (int k = 0; k < rounds; k++) {
        char **args = malloc((ARGS + 5) * sizeof *args);
        args[0] = strdup("sh");
        args[1] = strdup("-c");
        args[2] = strdup("echo $# ${#1}");
        args[3] = strdup("sh");
        for (int i = 0; i < ARGS; i++) {
            args[4 + i] = malloc(ARG_LEN + 1);
            memset(args[4 + i], 'a' + (k + i) % 26, ARG_LEN);
            args[4 + i][ARG_LEN] = 0;
        }
        args[4 + ARGS] = 0;
        churn();
        int p[2];
        if (pipe(p)) return 3;
        sigset_t all, old;
        sigfillset(&all);
        pthread_sigmask(SIG_BLOCK, &all, &old);
        pid_t pid = vfork();
        if (pid == 0) {
            dup2(p[1], 1);
            execv("/bin/sh", args);
            _exit(127);
        }
        pthread_sigmask(SIG_SETMASK, &old, 0);
        close(p[1]);
        char out[64] = {0};
        ssize_t got = read(p[0], out, sizeof out - 1);
        close(p[0]);
        int status;
        if (waitpid(pid, &status, 0) != pid || !WIFEXITED(status) || WEXITSTATUS(status) != 0) {
            fprintf(stderr, "round %d: the child ended with status %#x\n", k, status);
            return 4;
        }
        if (got <= 0 || strcmp(out, "1000 1000\n")) { fprintf(stderr, "round %d: the child said %s\n", k, out); return 5; }
        // Kept: what the execs read must not stay held in the parent.
    }
    churn();
    churn();
    puts("ok");
    return 0;
}
