/* IO the kernel's workers do later, into heap buffers: kernel AIO
 * (io_setup, io_submit, io_getevents) reading into a buffer that has gone
 * out, then an io_uring (raw system calls, no liburing) reading into a
 * buffer never written and writing from one that has gone out; then a
 * forked child reads into memory never written.  Every
 * byte is checked; a completion with an error ends the program with it.
 *
 *   async_io MIB [SECONDS_BEFORE]
 *
 * MIB: each buffer's size (three of them, and four times as much other
 * memory to push them out).  SECONDS_BEFORE: a sleep before the set-up,
 * for a test that watches the process paged first. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <linux/aio_abi.h>
#include <linux/io_uring.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#define CHUNK (1u << 20)

static unsigned char want(size_t i) { return (unsigned char)(i * 31 + i / 4096 + 7); }

static int temp_file(void) {
    char path[] = "/tmp/uswap-aio-XXXXXX";
    int fd = mkstemp(path);
    if (fd < 0) { perror("mkstemp"); exit(2); }
    unlink(path);
    return fd;
}

static void check(const unsigned char *buf, size_t len, const char *what) {
    for (size_t i = 0; i < len; i++)
        if (buf[i] != want(i)) { fprintf(stderr, "%s: byte %zu is %u, not %u\n", what, i, buf[i], want(i)); exit(3); }
}

/* Kernel AIO: `len` bytes of `fd` into `buf`, a chunk an iocb. */
static void aio_read_all(int fd, unsigned char *buf, size_t len) {
    aio_context_t ctx = 0;
    if (syscall(SYS_io_setup, 8, &ctx)) { perror("io_setup"); exit(4); }
    for (size_t off = 0; off < len; off += CHUNK) {
        struct iocb cb; memset(&cb, 0, sizeof cb);
        cb.aio_fildes = fd; cb.aio_lio_opcode = IOCB_CMD_PREAD;
        cb.aio_buf = (unsigned long)(buf + off); cb.aio_nbytes = CHUNK; cb.aio_offset = off;
        struct iocb *list[1] = { &cb };
        if (syscall(SYS_io_submit, ctx, 1, list) != 1) { perror("io_submit"); exit(5); }
        struct io_event ev;
        if (syscall(SYS_io_getevents, ctx, 1, 1, &ev, NULL) != 1) { perror("io_getevents"); exit(6); }
        if (ev.res != CHUNK) { fprintf(stderr, "AIO read at %zu: %s\n", off, strerror((int)-ev.res)); exit(7); }
    }
    syscall(SYS_io_destroy, ctx);
}

struct ring {
    int fd;
    unsigned *sq_tail, *sq_mask, *sq_array, *cq_head, *cq_tail, *cq_mask;
    struct io_uring_sqe *sqes;
    struct io_uring_cqe *cqes;
};

static void ring_setup(struct ring *r) {
    struct io_uring_params p; memset(&p, 0, sizeof p);
    r->fd = (int)syscall(SYS_io_uring_setup, 4, &p);
    if (r->fd < 0) { perror("io_uring_setup"); exit(8); }
    size_t sq_len = p.sq_off.array + p.sq_entries * sizeof(unsigned);
    size_t cq_len = p.cq_off.cqes + p.cq_entries * sizeof(struct io_uring_cqe);
    unsigned char *sq = mmap(0, sq_len, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, r->fd, IORING_OFF_SQ_RING);
    unsigned char *cq = mmap(0, cq_len, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, r->fd, IORING_OFF_CQ_RING);
    r->sqes = mmap(0, p.sq_entries * sizeof(struct io_uring_sqe), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, r->fd, IORING_OFF_SQES);
    if (sq == MAP_FAILED || cq == MAP_FAILED || r->sqes == MAP_FAILED) { perror("mmap ring"); exit(9); }
    r->sq_tail = (unsigned *)(sq + p.sq_off.tail); r->sq_mask = (unsigned *)(sq + p.sq_off.ring_mask);
    r->sq_array = (unsigned *)(sq + p.sq_off.array);
    r->cq_head = (unsigned *)(cq + p.cq_off.head); r->cq_tail = (unsigned *)(cq + p.cq_off.tail);
    r->cq_mask = (unsigned *)(cq + p.cq_off.ring_mask);
    r->cqes = (struct io_uring_cqe *)(cq + p.cq_off.cqes);
}

/* One read or write of `len` bytes at `off`, waited for: its result. */
static int ring_rw(struct ring *r, int op, int fd, unsigned char *buf, unsigned len, size_t off) {
    unsigned tail = *r->sq_tail, i = tail & *r->sq_mask;
    struct io_uring_sqe *e = &r->sqes[i];
    memset(e, 0, sizeof *e);
    e->opcode = (unsigned char)op; e->fd = fd; e->addr = (unsigned long)buf; e->len = len; e->off = off;
    r->sq_array[i] = i;
    atomic_store_explicit((_Atomic unsigned *)r->sq_tail, tail + 1, memory_order_release);
    if (syscall(SYS_io_uring_enter, r->fd, 1, 1, IORING_ENTER_GETEVENTS, NULL, 0) < 0) { perror("io_uring_enter"); exit(10); }
    unsigned head = *r->cq_head;
    if (head == atomic_load_explicit((_Atomic unsigned *)r->cq_tail, memory_order_acquire)) { fprintf(stderr, "no completion\n"); exit(11); }
    int res = r->cqes[head & *r->cq_mask].res;
    atomic_store_explicit((_Atomic unsigned *)r->cq_head, head + 1, memory_order_release);
    return res;
}

int main(int argc, char **argv) {
    size_t len = (size_t)atoi(argv[1]) << 20;
    unsigned before = argc > 2 ? (unsigned)atoi(argv[2]) : 0;
    unsigned char *src = malloc(len);
    for (size_t i = 0; i < len; i++) src[i] = want(i);
    int fd = temp_file();
    for (size_t off = 0; off < len;) { ssize_t n = write(fd, src + off, len - off); if (n <= 0) { perror("write"); return 12; } off += n; }
    /* `old` written, then pushed out with `src` by four times as much. */
    unsigned char *old = malloc(len);
    memset(old, 0xee, len);
    size_t big = 4 * len; unsigned char *other = malloc(big);
    for (size_t i = 0; i < big; i += 64) other[i] = (unsigned char)i;
    if (before) sleep(before);
    aio_read_all(fd, old, len);
    check(old, len, "AIO read into memory that had gone out");
    /* A buffer never written, and a write from `src`, gone out too. */
    unsigned char *fresh = malloc(len);
    struct ring r; ring_setup(&r);
    for (size_t off = 0; off < len; off += CHUNK) {
        int res = ring_rw(&r, IORING_OP_READ, fd, fresh + off, CHUNK, off);
        if (res != CHUNK) { fprintf(stderr, "io_uring read at %zu: %s\n", off, res < 0 ? strerror(-res) : "short"); return 13; }
    }
    check(fresh, len, "io_uring read into memory never written");
    int out = temp_file();
    for (size_t off = 0; off < len; off += CHUNK) {
        int res = ring_rw(&r, IORING_OP_WRITE, out, src + off, CHUNK, off);
        if (res != CHUNK) { fprintf(stderr, "io_uring write at %zu: %s\n", off, res < 0 ? strerror(-res) : "short"); return 14; }
    }
    memset(old, 0, len);
    if (pread(out, old, len, 0) != (ssize_t)len) { perror("pread"); return 15; }
    check(old, len, "io_uring write from memory that had gone out");
    /* A forked child reads into memory never written, and checks what
     * its parent had. */
    pid_t pid = fork();
    if (pid == 0) {
        unsigned char *mine = malloc(len);
        if (pread(fd, mine, len, 0) != (ssize_t)len) { perror("child pread"); _exit(16); }
        check(mine, len, "a forked child's read into memory never written");
        check(fresh, len, "a forked child's copy");
        _exit(0);
    }
    int status;
    if (pid < 0 || waitpid(pid, &status, 0) != pid || !WIFEXITED(status) || WEXITSTATUS(status)) {
        fprintf(stderr, "the forked child failed\n");
        return 17;
    }
    unsigned long sum = 0;
    for (size_t i = 0; i < big; i += 64) sum += other[i];
    printf("%zu %lu\nok\n", len, sum);
    return 0;
}
