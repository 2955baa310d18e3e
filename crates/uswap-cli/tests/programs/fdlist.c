/* The descriptors a program can find, every way it may look:
 *
 *   fdlist [PAST]
 *
 * prints, one line each, the open descriptors that readdir of
 * /proc/self/fd, readdir of /dev/fd, scandir of /proc/self/fd, the raw
 * getdents64 system call on /proc/self/fd, and fcntl(F_GETFD) on every
 * number from 0 to the soft descriptor limit plus PAST (default 64) find,
 * and the limit itself.  The listings' own descriptor is left out.  Under
 * uswap run every line must be the plain run's: uswap's descriptors
 * (userfaultfd, swap file, pidfd, io_uring) are no program's to find.
 */
#define _GNU_SOURCE
#include <dirent.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

static int cmp(const void *a, const void *b) { return *(const int *)a - *(const int *)b; }

static void show(const char *how, int *fds, int n, int skip) {
    qsort(fds, n, sizeof *fds, cmp);
    printf("%s:", how);
    for (int i = 0; i < n; i++)
        if (fds[i] != skip) printf(" %d", fds[i]);
    printf("\n");
}

static void by_readdir(const char *path) {
    DIR *d = opendir(path);
    if (!d) { perror(path); exit(2); }
    int fds[4096], n = 0;
    struct dirent *e;
    while ((e = readdir(d)) && n < 4096)
        if (e->d_name[0] != '.') fds[n++] = atoi(e->d_name);
    int own = dirfd(d);
    closedir(d);
    show(path, fds, n, own);
}

int main(int argc, char **argv) {
    int past = argc > 1 ? atoi(argv[1]) : 64;
    by_readdir("/proc/self/fd");
    by_readdir("/dev/fd");

    struct dirent **list;
    int n = scandir("/proc/self/fd", &list, NULL, NULL), fds[4096], k = 0;
    for (int i = 0; i < n; i++) {
        if (list[i]->d_name[0] != '.' && k < 4096) fds[k++] = atoi(list[i]->d_name);
        free(list[i]);
    }
    free(list);
    /* scandir's own descriptor is closed by now: nothing to skip. */
    show("scandir", fds, k, -1);

    int dfd = open("/proc/self/fd", O_RDONLY | O_DIRECTORY);
    char buf[4096];
    k = 0;
    for (;;) {
        long got = syscall(SYS_getdents64, dfd, buf, sizeof buf);
        if (got <= 0) break;
        for (long at = 0; at < got;) {
            unsigned short reclen = *(unsigned short *)(buf + at + 16);
            const char *name = buf + at + 19;
            if (name[0] != '.' && k < 4096) fds[k++] = atoi(name);
            at += reclen;
        }
    }
    close(dfd);
    show("getdents64", fds, k, dfd);

    struct rlimit rl;
    getrlimit(RLIMIT_NOFILE, &rl);
    k = 0;
    for (long fd = 0; fd < (long)rl.rlim_cur + past && k < 4096; fd++)
        if (fcntl((int)fd, F_GETFD) != -1) fds[k++] = (int)fd;
    show("probed", fds, k, -1);
    printf("limit %ld\n", (long)rl.rlim_cur);
    return 0;
}
