// A program that closes or takes descriptor numbers it never opened, as
// daemons and shells do, between writing its heap and reading it back:
//   descriptors MIB close_range | closefrom | close_loop | syscall | dup2 FILE
// The heap (MIB MiB of malloc'd blocks, several times the budget) is
// written, the descriptors are closed or replaced, the heap is read back
// and written again, twice; any byte that differs is reported.  With dup2,
// FILE is put under every number from 3 to the descriptor limit, and must
// be empty at the end: nothing of uswap's went into it.
#define _GNU_SOURCE
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#define BLOCK (64 << 10)

static unsigned char want(size_t b, size_t i, int round) { return (unsigned char)(b * 31 + i * 7 + round); }

static void fill(unsigned char **blocks, size_t n, int round) {
    for (size_t b = 0; b < n; b++)
        for (size_t i = 0; i < BLOCK; i++) blocks[b][i] = want(b, i, round);
}

static int check(unsigned char **blocks, size_t n, int round) {
    size_t bad = 0;
    for (size_t b = 0; b < n; b++)
        for (size_t i = 0; i < BLOCK; i++)
            if (blocks[b][i] != want(b, i, round)) bad++;
    if (bad) fprintf(stderr, "round %d: %zu bytes differ from what was written\n", round, bad);
    return bad == 0;
}

int main(int argc, char **argv) {
    if (argc < 3) return 2;
    size_t n = ((size_t)atoi(argv[1]) << 20) / BLOCK;
    const char *how = argv[2];
    unsigned char **blocks = malloc(n * sizeof *blocks);
    for (size_t b = 0; b < n; b++)
        if (!(blocks[b] = malloc(BLOCK))) return 3;
    struct rlimit rl;
    getrlimit(RLIMIT_NOFILE, &rl);
    int file = -1;
    for (int round = 0; round < 3; round++) {
        fill(blocks, n, round);
        if (!strcmp(how, "close_range")) {
            if (close_range(3, ~0U, 0)) { perror("close_range"); return 4; }
        } else if (!strcmp(how, "closefrom")) {
            closefrom(3);
        } else if (!strcmp(how, "close_loop")) {
            for (long fd = 3; fd < sysconf(_SC_OPEN_MAX); fd++) close((int)fd);
        } else if (!strcmp(how, "syscall")) {
            if (syscall(SYS_close_range, 3, ~0U, 0)) { perror("syscall(close_range)"); return 4; }
            for (int fd = 3; fd < (int)rl.rlim_cur; fd++) syscall(SYS_close, fd);
        } else if (!strcmp(how, "dup2")) {
            if (file < 0) file = open(argv[3], O_WRONLY | O_CREAT | O_TRUNC, 0600);
            if (file < 0) { perror(argv[3]); return 4; }
            for (int fd = 3; fd < (int)rl.rlim_cur; fd++)
                if (fd != file) dup2(file, fd);
        } else {
            return 2;
        }
        if (!check(blocks, n, round)) return 5;
    }
    if (file >= 0) {
        struct stat st;
        if (fstat(file, &st) || st.st_size != 0) {
            fprintf(stderr, "%s holds %lld bytes the program never wrote\n", argv[3], (long long)st.st_size);
            return 6;
        }
    }
    puts("ok");
    return 0;
}
