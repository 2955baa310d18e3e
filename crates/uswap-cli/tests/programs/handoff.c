/* Hand-offs between threads and between processes, thousands of them,
 * each through a different kind of wait, with everything they touch in
 * the heap: a lost wake-up shows as a pair that stops moving.
 *
 *   handoff ROUNDS CHURN_MIB
 *
 * Pairs (each passes a token ROUNDS times each way):
 *   sem     two threads, two sem_t in a malloc'd block (sem_wait/sem_post);
 *   cond    two threads, a mutex and a condition variable, malloc'd;
 *   futex   two threads, a raw futex word (FUTEX_WAIT/FUTEX_WAKE, private),
 *           malloc'd, the calls made with syscall(2);
 *   pipe    two threads, a pipe each way, the bytes read into and written
 *           from malloc'd buffers;
 *   fork    a parent and a forked child, a pipe each way, heap buffers;
 *           the child touches its copy of the churned memory between
 *           rounds, so both sides fault while they wait;
 *   timed   two threads, sem_timedwait with a deadline far away.
 * Meanwhile a churner thread walks CHURN_MIB of heap memory (to push the
 * pairs' pages out under a budget smaller than it), and one busy thread
 * per CPU keeps the CPUs loaded.
 *
 * A watchdog checks every pair's count each second; a pair that has not
 * moved for 20 s is reported with every count, every thread's stack is
 * dumped by the command in $HANDOFF_DUMP (a printf format given the pid:
 * gdb attached from outside), and the process exits 3.  Exit 0 when
 * every pair finished; every count is printed at the end.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <linux/futex.h>
#include <pthread.h>
#include <semaphore.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static long rounds;
static volatile int stop;

enum { SEM, COND, FUTEX, PIPE, FORK, TIMED, PAIRS };
static const char *names[PAIRS] = {"sem", "cond", "futex", "pipe", "fork", "timed"};
static _Atomic long done[PAIRS];

static void die(const char *what) {
    perror(what);
    exit(2);
}

/* sem: ping-pong through two semaphores. */
struct sems {
    sem_t a, b;
};
static void *sem_side(void *arg) {
    struct sems *s = arg;
    for (long i = 0; i < rounds; i++) {
        while (sem_wait(&s->b) != 0)
            if (errno != EINTR) die("sem_wait");
        done[SEM]++;
        sem_post(&s->a);
    }
    return NULL;
}
static void *sem_pair(void *unused) {
    (void)unused;
    struct sems *s = malloc(sizeof *s);
    sem_init(&s->a, 0, 0);
    sem_init(&s->b, 0, 0);
    pthread_t t;
    pthread_create(&t, NULL, sem_side, s);
    for (long i = 0; i < rounds; i++) {
        sem_post(&s->b);
        while (sem_wait(&s->a) != 0)
            if (errno != EINTR) die("sem_wait");
    }
    pthread_join(t, NULL);
    free(s);
    return NULL;
}

/* timed: the same through sem_timedwait with a far deadline. */
static void timed_wait(sem_t *s) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    ts.tv_sec += 3600;
    while (sem_timedwait(s, &ts) != 0)
        if (errno != EINTR) die("sem_timedwait");
}
static void *timed_side(void *arg) {
    struct sems *s = arg;
    for (long i = 0; i < rounds; i++) {
        timed_wait(&s->b);
        done[TIMED]++;
        sem_post(&s->a);
    }
    return NULL;
}
static void *timed_pair(void *unused) {
    (void)unused;
    struct sems *s = malloc(sizeof *s);
    sem_init(&s->a, 0, 0);
    sem_init(&s->b, 0, 0);
    pthread_t t;
    pthread_create(&t, NULL, timed_side, s);
    for (long i = 0; i < rounds; i++) {
        sem_post(&s->b);
        timed_wait(&s->a);
    }
    pthread_join(t, NULL);
    free(s);
    return NULL;
}

/* cond: a turn variable under a mutex, two condition variables. */
struct conds {
    pthread_mutex_t m;
    pthread_cond_t c;
    long turn;
};
static void *cond_side(void *arg) {
    struct conds *c = arg;
    for (long i = 0; i < rounds; i++) {
        pthread_mutex_lock(&c->m);
        while (c->turn != 2 * i + 1)
            pthread_cond_wait(&c->c, &c->m);
        c->turn++;
        done[COND]++;
        pthread_cond_broadcast(&c->c);
        pthread_mutex_unlock(&c->m);
    }
    return NULL;
}
static void *cond_pair(void *unused) {
    (void)unused;
    struct conds *c = malloc(sizeof *c);
    pthread_mutex_init(&c->m, NULL);
    pthread_cond_init(&c->c, NULL);
    c->turn = 0;
    pthread_t t;
    pthread_create(&t, NULL, cond_side, c);
    for (long i = 0; i < rounds; i++) {
        pthread_mutex_lock(&c->m);
        while (c->turn != 2 * i)
            pthread_cond_wait(&c->c, &c->m);
        c->turn++;
        pthread_cond_broadcast(&c->c);
        pthread_mutex_unlock(&c->m);
    }
    pthread_join(t, NULL);
    free(c);
    return NULL;
}

/* futex: a word that counts turns, raw FUTEX_WAIT/WAKE. */
static void futex_await(_Atomic uint32_t *w, uint32_t want) {
    for (;;) {
        uint32_t v = atomic_load(w);
        if (v == want) return;
        if (syscall(SYS_futex, w, FUTEX_WAIT_PRIVATE, v, NULL, NULL, 0) != 0 && errno != EAGAIN &&
            errno != EINTR)
            die("futex wait");
    }
}
static void futex_bump(_Atomic uint32_t *w) {
    atomic_fetch_add(w, 1);
    syscall(SYS_futex, w, FUTEX_WAKE_PRIVATE, 1, NULL, NULL, 0);
}
static void *futex_side(void *arg) {
    _Atomic uint32_t *w = arg;
    for (long i = 0; i < rounds; i++) {
        futex_await(w, (uint32_t)(2 * i + 1));
        done[FUTEX]++;
        futex_bump(w);
    }
    return NULL;
}
static void *futex_pair(void *unused) {
    (void)unused;
    _Atomic uint32_t *w = malloc(64);
    atomic_store(w, 0);
    pthread_t t;
    pthread_create(&t, NULL, futex_side, (void *)w);
    for (long i = 0; i < rounds; i++) {
        futex_bump(w);
        futex_await(w, (uint32_t)(2 * i + 2));
    }
    pthread_join(t, NULL);
    free((void *)w);
    return NULL;
}

/* pipe: a byte each way, read into and written from heap buffers. */
static void xread(int fd, char *buf, size_t n) {
    while (n) {
        ssize_t r = read(fd, buf, n);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) die("read");
        buf += r;
        n -= r;
    }
}
static void xwrite(int fd, const char *buf, size_t n) {
    while (n) {
        ssize_t r = write(fd, buf, n);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) die("write");
        buf += r;
        n -= r;
    }
}
struct pipes {
    int there[2], back[2];
};
static void *pipe_side(void *arg) {
    struct pipes *p = arg;
    char *buf = malloc(256);
    for (long i = 0; i < rounds; i++) {
        xread(p->there[0], buf, 64);
        done[PIPE]++;
        xwrite(p->back[1], buf, 64);
    }
    free(buf);
    return NULL;
}
static void *pipe_pair(void *unused) {
    (void)unused;
    struct pipes *p = malloc(sizeof *p);
    if (pipe(p->there) || pipe(p->back)) die("pipe");
    pthread_t t;
    pthread_create(&t, NULL, pipe_side, p);
    char *buf = malloc(256);
    memset(buf, 7, 256);
    for (long i = 0; i < rounds; i++) {
        xwrite(p->there[1], buf, 64);
        xread(p->back[0], buf, 64);
    }
    pthread_join(t, NULL);
    free(buf);
    close(p->there[0]), close(p->there[1]), close(p->back[0]), close(p->back[1]);
    free(p);
    return NULL;
}

/* The churned memory: the forked child walks its copy too. */
static char *churn;
static size_t churn_len;

static void walk(size_t from, size_t pages) {
    for (size_t i = 0; i < pages; i++) {
        size_t at = ((from + i) * 4096) % churn_len;
        churn[at]++;
    }
}

/* fork: a parent and its child, a pipe each way; the child checks that
 * every byte it receives is the round's. */
static void *fork_pair(void *unused) {
    (void)unused;
    int there[2], back[2];
    if (pipe(there) || pipe(back)) die("pipe");
    pid_t pid = fork();
    if (pid < 0) die("fork");
    char *buf = malloc(4096);
    if (pid == 0) {
        close(there[1]), close(back[0]);
        for (long i = 0; i < rounds; i++) {
            xread(there[0], buf, 4096);
            for (int k = 0; k < 4096; k++)
                if (buf[k] != (char)i) {
                    fprintf(stderr, "fork pair: round %ld byte %d is %d\n", i, k, buf[k]);
                    _exit(4);
                }
            walk((size_t)i * 7, 4);
            xwrite(back[1], buf, 4096);
        }
        _exit(0);
    }
    close(there[0]), close(back[1]);
    for (long i = 0; i < rounds; i++) {
        memset(buf, (char)i, 4096);
        xwrite(there[1], buf, 4096);
        xread(back[0], buf, 4096);
        done[FORK]++;
    }
    int st;
    if (waitpid(pid, &st, 0) != pid || !WIFEXITED(st) || WEXITSTATUS(st) != 0) {
        fprintf(stderr, "fork pair: child ended with status %d\n", st);
        exit(4);
    }
    free(buf);
    close(there[1]), close(back[0]);
    return NULL;
}

static void *churner(void *unused) {
    (void)unused;
    size_t pages = churn_len / 4096, at = 0;
    while (!stop) {
        walk(at, 64);
        at += 64;
        if (at >= pages) at = 0;
    }
    return NULL;
}

static void *spinner(void *unused) {
    (void)unused;
    volatile unsigned long x = 0;
    while (!stop) x++;
    return NULL;
}

int main(int argc, char **argv) {
    rounds = argc > 1 ? atol(argv[1]) : 2000;
    long churn_mib = argc > 2 ? atol(argv[2]) : 128;
    churn_len = (size_t)churn_mib << 20;
    churn = malloc(churn_len);
    memset(churn, 1, churn_len);

    pthread_t load[3], pairs[PAIRS];
    pthread_create(&load[0], NULL, churner, NULL);
    pthread_create(&load[1], NULL, spinner, NULL);
    pthread_create(&load[2], NULL, spinner, NULL);
    void *(*fns[PAIRS])(void *) = {sem_pair, cond_pair, futex_pair, pipe_pair, fork_pair, timed_pair};
    for (int i = 0; i < PAIRS; i++) pthread_create(&pairs[i], NULL, fns[i], NULL);

    long last[PAIRS] = {0};
    int still[PAIRS] = {0};
    for (;;) {
        sleep(1);
        int finished = 1;
        for (int i = 0; i < PAIRS; i++) {
            long d = done[i];
            if (d >= rounds) continue;
            finished = 0;
            still[i] = d == last[i] ? still[i] + 1 : 0;
            last[i] = d;
            if (still[i] >= 20) {
                fprintf(stderr, "handoff: the %s pair has not moved for 20 s:", names[i]);
                for (int k = 0; k < PAIRS; k++) fprintf(stderr, " %s %ld", names[k], (long)done[k]);
                fprintf(stderr, " of %ld\n", rounds);
                fflush(stderr);
                /* Every thread's stack, from outside, before the end. */
                const char *dump = getenv("HANDOFF_DUMP");
                if (dump) {
                    char cmd[512];
                    snprintf(cmd, sizeof cmd, dump, (int)getpid());
                    if (system(cmd) != 0) fprintf(stderr, "handoff: the dump failed\n");
                }
                _exit(3);
            }
        }
        if (finished) break;
    }
    for (int i = 0; i < PAIRS; i++) pthread_join(pairs[i], NULL);
    stop = 1;
    for (int i = 0; i < 3; i++) pthread_join(load[i], NULL);
    long total = 0;
    for (int i = 0; i < PAIRS; i++) {
        printf("%s %ld\n", names[i], (long)done[i]);
        total += done[i];
    }
    printf("handoffs %ld\n", total);
    return 0;
}
