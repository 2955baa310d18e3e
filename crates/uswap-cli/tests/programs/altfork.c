/* Signals delivered onto an alternate stack that lives in the heap, in
 * forked children that swap: stress-ng's workers, forked from a process
 * whose 64 KiB alternate stack is an anonymous mapping (served from the
 * heap under uswap run), died of SIGSEGV ("bad frame in rt_sigreturn")
 * hundreds of times a second once the child's copy of the stack was
 * taken out.
 *
 *   altfork CHILDREN MIB
 *
 * The parent maps a 64 KiB alternate stack, installs a SIGUSR1 handler
 * on it, and forks CHILDREN children one after another; each writes MIB
 * MiB of its own (several times the budget, so that everything cold goes
 * out), raising SIGUSR1 every 64 pages, then checks every page.  Prints
 * the signals handled and "ok" when every child ended with status 0.
 */
#define _GNU_SOURCE
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

static volatile sig_atomic_t handled;

static void on_usr1(int sig) {
    (void)sig;
    /* Some stack of the handler's own, on the alternate stack. */
    volatile char scratch[2048];
    scratch[0] = 1;
    scratch[2047] = scratch[0];
    handled++;
}

int main(int argc, char **argv) {
    int children = argc > 1 ? atoi(argv[1]) : 4;
    size_t bytes = (size_t)(argc > 2 ? atoi(argv[2]) : 64) << 20;
    stack_t ss = {.ss_size = 65536, .ss_flags = 0};
    ss.ss_sp = mmap(NULL, ss.ss_size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (ss.ss_sp == MAP_FAILED || sigaltstack(&ss, NULL) != 0) {
        perror("sigaltstack");
        return 2;
    }
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_usr1;
    sa.sa_flags = SA_ONSTACK;
    sigaction(SIGUSR1, &sa, NULL);
    raise(SIGUSR1);
    int bad = 0;
    for (int c = 0; c < children; c++) {
        pid_t pid = fork();
        if (pid == 0) {
            size_t pages = bytes / 4096;
            unsigned char *m = malloc(bytes);
            for (size_t i = 0; i < pages; i++) {
                m[i * 4096] = (unsigned char)(i * 7 + c);
                if (i % 64 == 0) raise(SIGUSR1);
            }
            for (size_t i = 0; i < pages; i++) {
                if (m[i * 4096] != (unsigned char)(i * 7 + c)) _exit(3);
                if (i % 64 == 0) raise(SIGUSR1);
            }
            _exit(handled >= (int)(2 * pages / 64) ? 0 : 4);
        }
        int st;
        waitpid(pid, &st, 0);
        if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) {
            printf("child %d: %s %d\n", c, WIFSIGNALED(st) ? "signal" : "status",
                   WIFSIGNALED(st) ? WTERMSIG(st) : WEXITSTATUS(st));
            bad++;
        }
    }
    puts(bad ? "bad" : "ok");
    return bad != 0;
}
