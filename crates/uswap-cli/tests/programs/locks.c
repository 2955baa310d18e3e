// mlockall and a long send, in a heap several times the budget:
//   locks MIB
// mlockall(MCL_CURRENT | MCL_FUTURE) (its result ignored: an ordinary
// user's RLIMIT_MEMLOCK refuses it), then MIB MiB of heap written and
// read back; then the whole buffer sent in one send(2) over a stream
// socket pair to a child that counts the bytes.  uswap's heap must stay
// unlocked (locking it faulted the whole region in), and the send must
// not pin the whole buffer (the budget holds a chunk of it).
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

int main(int argc, char **argv) {
    size_t len = (size_t)atoi(argv[1]) << 20;
    (void)mlockall(MCL_CURRENT | MCL_FUTURE);
    unsigned char *p = malloc(len);
    for (size_t i = 0; i < len; i++) p[i] = (unsigned char)(i % 251);
    for (size_t i = 0; i < len; i += 4096)
        if (p[i] != (unsigned char)(i % 251)) { fputs("bad byte\n", stderr); return 3; }
    munlockall();
    int sv[2];
    if (socketpair(AF_UNIX, SOCK_STREAM, 0, sv)) return 4;
    pid_t c = fork();
    if (c == 0) {
        close(sv[0]);
        static char buf[1 << 16];
        size_t total = 0;
        unsigned sum = 0;
        ssize_t n;
        while ((n = read(sv[1], buf, sizeof buf)) > 0) {
            for (ssize_t i = 0; i < n; i++) sum += buf[i];
            total += (size_t)n;
        }
        printf("%zu %u\n", total, sum);
        fflush(stdout);
        _exit(0);
    }
    close(sv[1]);
    ssize_t sent = send(sv[0], p, len, 0);
    close(sv[0]);
    int st;
    waitpid(c, &st, 0);
    if (sent != (ssize_t)len) { fprintf(stderr, "sent %zd of %zu\n", sent, len); return 5; }
    return WIFEXITED(st) && WEXITSTATUS(st) == 0 ? 0 : 6;
}
