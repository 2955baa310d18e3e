/* A process ends when its program's last thread does, as glibc has it:
 *
 *   ends fork-from-thread   a thread forks; in the child that thread (its
 *                           only one) returns: the child must end (status
 *                           0), and the parent's waitpid return;
 *   ends main-exits         main calls pthread_exit while a thread it
 *                           started works; when that thread returns the
 *                           process ends with status 0;
 *   ends term               main calls pthread_exit while a thread waits
 *                           in pause(): a SIGTERM sent to the process
 *                           reaches that thread and ends the process.
 *
 * Each may touch MIB MiB of heap first (third argument), so that uswap's
 * threads have started.  Under uswap run its threads kept such processes
 * alive with a zombie leader, and blocked the SIGTERM.
 */
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

static void touch(size_t mib) {
    size_t bytes = mib << 20;
    char *m = malloc(bytes);
    for (size_t i = 0; i < bytes; i += 4096) m[i] = (char)i;
    /* Kept: the pages go out, the threads of uswap stay. */
}

static void *returns(void *arg) {
    (void)arg;
    usleep(100 * 1000);
    return NULL;
}

static void *forks(void *arg) {
    (void)arg;
    pid_t pid = fork();
    if (pid == 0) return NULL; /* the child's one thread ends here */
    int st;
    if (waitpid(pid, &st, 0) != pid) _exit(5);
    printf("child ended: %s %d\n", WIFEXITED(st) ? "status" : "signal",
           WIFEXITED(st) ? WEXITSTATUS(st) : WTERMSIG(st));
    fflush(stdout);
    return NULL;
}

static void *waits(void *arg) {
    (void)arg;
    for (;;) pause();
    return NULL;
}

int main(int argc, char **argv) {
    const char *what = argc > 1 ? argv[1] : "fork-from-thread";
    touch(argc > 2 ? (size_t)atoi(argv[2]) : 0);
    pthread_t t;
    if (!strcmp(what, "fork-from-thread")) {
        pthread_create(&t, NULL, forks, NULL);
        pthread_join(t, NULL);
        return 0;
    }
    if (!strcmp(what, "main-exits")) {
        pthread_create(&t, NULL, returns, NULL);
        pthread_exit(NULL);
    }
    if (!strcmp(what, "term")) {
        pthread_create(&t, NULL, waits, NULL);
        printf("%d\n", getpid());
        fflush(stdout);
        pthread_exit(NULL);
    }
    return 2;
}
