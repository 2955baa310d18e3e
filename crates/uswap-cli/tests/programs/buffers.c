// System calls given heap buffers that are out, as programs make them:
//   buffers MIB DIR
// Each buffer is written, then MIB MiB of other heap memory is touched
// (pushing it out), then the call is made.  Covered: pipe, uname,
// nanosleep, waitpid's status, a setvbuf buffer flushed by fflush (a
// write inside libc), system with a command built at run time, system
// after putenv of a heap string, preadv and the raw preadv2, getdents64
// into a heap buffer, readlink, getrandom, socketpair and recvmmsg.
#define _GNU_SOURCE
#include <dirent.h>
#include <pthread.h>
#include <signal.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <sys/utsname.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static char *junk;
static size_t junk_len;
static void push_out(void) {
    for (size_t i = 0; i < junk_len; i += 4096) junk[i]++;
}

#define CHECK(cond, what)                                          \
    do {                                                           \
        if (!(cond)) {                                             \
            fprintf(stderr, "%s: %s\n", what, strerror(errno));   \
            bad++;                                                 \
        }                                                          \
    } while (0)

int main(int argc, char **argv) {
    if (argc < 3) return 2;
    junk_len = (size_t)atoi(argv[1]) << 20;
    junk = malloc(junk_len);
    memset(junk, 1, junk_len);
    int bad = 0;
    char path[4096];

    int *fds = malloc(2 * sizeof *fds);
    push_out();
    CHECK(pipe(fds) == 0, "pipe");

    struct utsname *u = malloc(sizeof *u);
    push_out();
    CHECK(uname(u) == 0 && strcmp(u->sysname, "Linux") == 0, "uname");

    struct timespec *ts = calloc(1, sizeof *ts);
    ts->tv_nsec = 1000;
    push_out();
    CHECK(nanosleep(ts, 0) == 0, "nanosleep");

    int *status = malloc(sizeof *status);
    pid_t pid = fork();
    if (pid == 0) _exit(7);
    push_out();
    CHECK(waitpid(pid, status, 0) == pid && WEXITSTATUS(*status) == 7, "waitpid");

    snprintf(path, sizeof path, "%s/out-%d.txt", argv[2], (int)getuid());
    char *vbuf = malloc(65536);
    FILE *f = fopen(path, "w");
    CHECK(f != 0, "fopen");
    if (!f) return 3;
    setvbuf(f, vbuf, _IOFBF, 65536);
    for (int i = 0; i < 2000; i++) fprintf(f, "line %d\n", i);
    push_out();
    CHECK(fflush(f) == 0, "fflush of a setvbuf buffer");
    fclose(f);

    char *cmd = strdup("exit 3");
    push_out();
    int r = system(cmd);
    CHECK(WIFEXITED(r) && WEXITSTATUS(r) == 3, "system");

    char *var = strdup("USWAP_TEST_VAR=hello");
    putenv(var);
    push_out();
    r = system("test \"$USWAP_TEST_VAR\" = hello");
    CHECK(r == 0, "system after putenv");

    char *b1 = malloc(100), *b2 = malloc(100);
    int fd = open(path, O_RDONLY);
    struct iovec iov[2] = {{b1, 10}, {b2, 10}};
    push_out();
    CHECK(preadv(fd, iov, 2, 0) == 20 && memcmp(b1, "line 0\nlin", 10) == 0, "preadv");
    push_out();
    CHECK(syscall(SYS_preadv2, fd, iov, 2, 0, 0, 0) == 20, "raw preadv2");

    char *dents = malloc(8192);
    int dir = open(argv[2], O_RDONLY | O_DIRECTORY);
    push_out();
    CHECK(syscall(SYS_getdents64, dir, dents, 8192) > 0, "getdents64");

    char *link = malloc(4096);
    push_out();
    CHECK(readlink("/proc/self/exe", link, 4096) > 0, "readlink");

    char *rnd = malloc(4096);
    push_out();
    CHECK(getrandom(rnd, 4096, 0) == 4096, "getrandom");

    int *sv = malloc(2 * sizeof *sv);
    push_out();
    CHECK(socketpair(AF_UNIX, SOCK_DGRAM, 0, sv) == 0, "socketpair");
    send(sv[0], "one", 3, 0);
    send(sv[0], "two", 3, 0);
    struct mmsghdr *msgs = calloc(2, sizeof *msgs);
    char *m1 = malloc(16), *m2 = malloc(16);
    struct iovec *mv = malloc(2 * sizeof *mv);
    mv[0] = (struct iovec){m1, 16};
    mv[1] = (struct iovec){m2, 16};
    msgs[0].msg_hdr.msg_iov = &mv[0];
    msgs[0].msg_hdr.msg_iovlen = 1;
    msgs[1].msg_hdr.msg_iov = &mv[1];
    msgs[1].msg_hdr.msg_iovlen = 1;
    push_out();
    CHECK(recvmmsg(sv[1], msgs, 2, 0, 0) == 2 && memcmp(m2, "two", 3) == 0, "recvmmsg");

    // The old signal mask and alternate stack into heap memory that is
    // out (their calls are not the guard's: their interposers go through
    // memory of their own).
    sigset_t *oldmask = malloc(sizeof *oldmask);
    stack_t *oldstack = malloc(sizeof *oldstack);
    push_out();
    CHECK(sigprocmask(SIG_BLOCK, 0, oldmask) == 0, "sigprocmask into a heap set");
    push_out();
    CHECK(pthread_sigmask(SIG_BLOCK, 0, oldmask) == 0, "pthread_sigmask into a heap set");
    push_out();
    CHECK(sigaltstack(0, oldstack) == 0, "sigaltstack into a heap stack_t");

    puts(bad ? "bad" : "ok");
    return bad;
}
