#define _GNU_SOURCE
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <fcntl.h>
#include <sys/socket.h>
#include <sys/wait.h>
static volatile sig_atomic_t got;
static void on_bus(int sig) { (void)sig; got = 1; }
static unsigned char want(size_t i) { return (unsigned char)(i * 13 + i / 4096); }
int main(int argc, char **argv) {
    size_t len = (size_t)atoi(argv[1]) << 20;
    /* The program's own SIGBUS handler keeps working. */
    struct sigaction sa; memset(&sa, 0, sizeof sa); sa.sa_handler = on_bus;
    if (sigaction(SIGBUS, &sa, 0)) return 2;
    /* A file of `len` bytes. */
    unsigned char *src = malloc(len);
    for (size_t i = 0; i < len; i++) src[i] = want(i);
    char path[] = "/tmp/uswap-kio-XXXXXX";
    int fd = mkstemp(path); if (fd < 0) return 3;
    unlink(path);
    for (size_t off = 0; off < len;) { ssize_t n = write(fd, src + off, len - off); if (n <= 0) { perror("write"); return 4; } off += n; }
    /* Other memory, four times as much, pushes src and dst out. */
    unsigned char *dst = malloc(len);
    memset(dst, 0xee, len);
    size_t big = 4 * len; unsigned char *other = malloc(big);
    for (size_t i = 0; i < big; i += 64) other[i] = (unsigned char)i;
    /* read(2) into the swapped-out dst. */
    if (lseek(fd, 0, SEEK_SET)) return 5;
    for (size_t off = 0; off < len;) { ssize_t n = read(fd, dst + off, len - off); if (n <= 0) { perror("read"); return 6; } off += n; }
    for (size_t i = 0; i < len; i++) if (dst[i] != want(i)) { fprintf(stderr, "read byte %zu\n", i); return 7; }
    for (size_t i = 0; i < big; i += 64) other[i] ^= 1;
    /* send(2) from the swapped-out src through a socket pair. */
    int sv[2]; if (socketpair(AF_UNIX, SOCK_STREAM, 0, sv)) return 8;
    pid_t pid = fork();   /* the child only reads the socket: it touches no heap */
    if (pid == 0) {
        static unsigned char buf[65536]; unsigned long sum = 0; size_t got_bytes = 0; ssize_t n;
        close(sv[0]);
        while ((n = read(sv[1], buf, sizeof buf)) > 0) { for (ssize_t i = 0; i < n; i++) sum += buf[i] * (got_bytes + i + 1); got_bytes += n; }
        char line[64]; int k = snprintf(line, sizeof line, "%zu %lu\n", got_bytes, sum);
        if (write(1, line, k) != k) _exit(9);
        _exit(0);
    }
    close(sv[1]);
    for (size_t off = 0; off < len;) { ssize_t n = send(sv[0], src + off, len - off, 0); if (n <= 0) { perror("send"); return 10; } off += n; }
    close(sv[0]);
    int status; waitpid(pid, &status, 0);
    if (!WIFEXITED(status) || WEXITSTATUS(status)) return 11;
    unsigned long sum = 0; for (size_t i = 0; i < len; i++) sum += src[i] * (i + 1);
    raise(SIGBUS);
    if (!got) return 12;
    printf("%zu %lu\nok\n", len, sum);
    return 0;
}
