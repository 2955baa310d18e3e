// A seccomp filter as container runtimes' default profiles have it for
// userfaultfd (moby's and Podman's refuse the call with EPERM; opening
// /dev/userfaultfd stays allowed), then exec the rest of the arguments:
//   nouffd [-enosys] PROGRAM ARGS...
#define _GNU_SOURCE
#include <errno.h>
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <unistd.h>

int main(int argc, char **argv) {
    int err = EPERM, first = 1;
    if (argc > 1 && !strcmp(argv[1], "-enosys")) { err = ENOSYS; first = 2; }
    if (argc <= first) return 2;
    struct sock_filter f[] = {
        BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, nr)),
        BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, SYS_userfaultfd, 0, 1),
        BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ERRNO | (err & SECCOMP_RET_DATA)),
        BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
    };
    struct sock_fprog prog = { .len = sizeof f / sizeof f[0], .filter = f };
    if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) || prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, &prog)) {
        perror("seccomp");
        return 3;
    }
    execvp(argv[first], argv + first);
    perror("exec");
    return 4;
}
