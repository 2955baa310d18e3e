//! Every x86-64 system call that reads or writes a buffer of the caller's
//! (`copy_from_user`, `copy_to_user`, `get_user` and kin), with where each
//! buffer is and how long: what the guard's filter traps on, and what its
//! SIGSYS handler brings in before it makes the call.
//!
//! Left out, on purpose (never trapped):
//! - calls whose addresses are not buffers the kernel copies: `mmap`,
//!   `munmap`, `mprotect`, `madvise`, `mremap`, `msync`, `mlock` and kin,
//!   `process_madvise`, `set_robust_list`, `set_tid_address`, `rseq`,
//!   `shmat`, `brk`;
//! - calls whose effect a signal handler's return would undo or that must
//!   not run inside one: `rt_sigreturn`, `rt_sigprocmask` and
//!   `sigaltstack` (restored from the signal frame at its return; the
//!   preload's interposers copy their sets and stacks through its own
//!   memory instead), `clone`, `clone3`, `vfork`, `execve`, `execveat`
//!   (run with every signal blocked inside `posix_spawn`, where a trap
//!   would kill; the exec interposers bring their strings in);
//! - `io_submit`'s and `io_uring_enter`'s buffers, read and written
//!   later, by the kernel's workers, where no trap can help: instead the
//!   calls that set such IO up, `io_setup` and `io_uring_setup`
//!   ([`UNPAGING`]), are always trapped, and at the first that succeeds
//!   the process stops paging (`guard::stop_paging`).
//!
//! Lengths are the x86-64 layouts of the kernel's structures.  Where a
//! length cannot be known (`ioctl`'s argument without a size in its
//! number, `prctl`, `keyctl`), a page from the pointer is brought in.

/// How long a buffer is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Len {
    /// This many bytes.
    Bytes(usize),
    /// The value of argument i.
    Arg(u8),
    /// The value of argument i times this many bytes.
    ArgTimes(u8, usize),
    /// The value of argument i plus this many bytes (`msgsnd`).
    ArgPlus(u8, usize),
    /// The `u32` argument i points to (a `socklen_t *`).
    AtArg(u8),
    /// A bitmap of as many bits as argument i says, in longs (`select`'s
    /// sets, node masks).
    Bits(u8),
    /// A byte per page of the length in argument i (`mincore`).
    PagesOf(u8),
    /// Not known: a page from the pointer.
    Page,
    /// `ioctl`'s: the size in the request number (argument 1), else a page.
    Ioctl,
}

/// What the kernel does with an argument.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Buf {
    /// Reads this many bytes.
    Read(Len),
    /// Stores into (and may read) this many bytes.
    Write(Len),
    /// Reads a NUL-terminated string (a path, a name).
    Str,
    /// An array of `struct iovec` of argument `count`'s length, whose
    /// buffers it stores into (`store`) or reads.  The filter cannot see
    /// into the array: such calls are always trapped.
    Iov { count: u8, store: bool },
    /// A `struct msghdr` (its name, vector and control data).
    Msg { store: bool },
    /// An array of `struct mmsghdr` of argument `count`'s length.
    MMsg { count: u8, store: bool },
}

/// One system call: its number, name and buffer arguments (index, what).
#[derive(Debug)]
pub struct Call {
    pub nr: i64,
    /// For messages and the tests.
    #[allow(dead_code)]
    pub name: &'static str,
    pub args: &'static [(u8, Buf)],
}

#[cfg(test)]
impl Buf {
    /// The argument whose value is this buffer's length or count (a
    /// length the kernel reads through a pointer, `AtArg`, is not one):
    /// for the tests of the table and of every call (`tests/guest.rs`).
    pub fn length_arg(self) -> Option<u8> {
        match self {
            Buf::Read(l) | Buf::Write(l) => match l {
                Len::Arg(j) | Len::ArgTimes(j, _) | Len::ArgPlus(j, _) | Len::Bits(j) | Len::PagesOf(j) => {
                    Some(j)
                }
                _ => None,
            },
            Buf::Iov { count, .. } | Buf::MMsg { count, .. } => Some(count),
            _ => None,
        }
    }
}

/// The calls that set up IO the kernel's workers do later, into
/// buffers named then (`io_submit`'s, an io_uring's submission queue),
/// where no trap sees them: always trapped, and the first that succeeds
/// stops the process's paging (`guard::stop_paging`).
pub const UNPAGING: [i64; 2] = [libc::SYS_io_setup, libc::SYS_io_uring_setup];

impl Call {
    /// Whether the filter traps the call whatever its arguments: its
    /// buffers are behind a pointer it cannot follow, or it sets up IO
    /// into buffers named later ([`UNPAGING`]).
    pub fn always(&self) -> bool {
        UNPAGING.contains(&self.nr)
            || self
                .args
                .iter()
                .any(|(_, b)| matches!(b, Buf::Iov { .. } | Buf::Msg { .. } | Buf::MMsg { .. }))
    }
}

use Buf::*;
use Len::*;

const STAT: usize = 144;
const STATX: usize = 256;
const STATFS: usize = 120;
const TIMESPEC: usize = 16;
const TIMEVAL: usize = 16;
const ITIMERSPEC: usize = 32;
const ITIMERVAL: usize = 32;
const RLIMIT: usize = 16;
const RUSAGE: usize = 144;
const SIGINFO: usize = 128;
const SIGEVENT: usize = 64;
const TIMEX: usize = 208;
const KSIGACTION: usize = 32;
const EPOLL_EVENT: usize = 12;
const POLLFD: usize = 8;
const IO_EVENT: usize = 32;
const MQ_ATTR: usize = 64;
const IPC_DS: usize = 128;

macro_rules! calls {
    ($($nr:literal $name:ident [$($i:literal: $b:expr),*]),* $(,)?) => {
        /// The calls, by number.
        pub static CALLS: &[Call] = &[$(Call { nr: $nr, name: stringify!($name), args: &[$(($i, $b)),*] }),*];
    };
}

calls! {
    0 read [1: Write(Arg(2))],
    1 write [1: Read(Arg(2))],
    2 open [0: Str],
    4 stat [0: Str, 1: Write(Bytes(STAT))],
    5 fstat [1: Write(Bytes(STAT))],
    6 lstat [0: Str, 1: Write(Bytes(STAT))],
    7 poll [0: Write(ArgTimes(1, POLLFD))],
    13 rt_sigaction [1: Read(Bytes(KSIGACTION)), 2: Write(Bytes(KSIGACTION))],
    16 ioctl [2: Write(Ioctl)],
    17 pread64 [1: Write(Arg(2))],
    18 pwrite64 [1: Read(Arg(2))],
    19 readv [1: Iov { count: 2, store: true }],
    20 writev [1: Iov { count: 2, store: false }],
    21 access [0: Str],
    22 pipe [0: Write(Bytes(8))],
    23 select [1: Write(Bits(0)), 2: Write(Bits(0)), 3: Write(Bits(0)), 4: Write(Bytes(TIMEVAL))],
    27 mincore [2: Write(PagesOf(1))],
    31 shmctl [2: Write(Bytes(IPC_DS))],
    35 nanosleep [0: Read(Bytes(TIMESPEC)), 1: Write(Bytes(TIMESPEC))],
    36 getitimer [1: Write(Bytes(ITIMERVAL))],
    38 setitimer [1: Read(Bytes(ITIMERVAL)), 2: Write(Bytes(ITIMERVAL))],
    40 sendfile [2: Write(Bytes(8))],
    42 connect [1: Read(Arg(2))],
    43 accept [1: Write(AtArg(2)), 2: Write(Bytes(4))],
    44 sendto [1: Read(Arg(2)), 4: Read(Arg(5))],
    45 recvfrom [1: Write(Arg(2)), 4: Write(AtArg(5)), 5: Write(Bytes(4))],
    46 sendmsg [1: Msg { store: false }],
    47 recvmsg [1: Msg { store: true }],
    49 bind [1: Read(Arg(2))],
    51 getsockname [1: Write(AtArg(2)), 2: Write(Bytes(4))],
    52 getpeername [1: Write(AtArg(2)), 2: Write(Bytes(4))],
    53 socketpair [3: Write(Bytes(8))],
    54 setsockopt [3: Read(Arg(4))],
    55 getsockopt [3: Write(AtArg(4)), 4: Write(Bytes(4))],
    61 wait4 [1: Write(Bytes(4)), 3: Write(Bytes(RUSAGE))],
    63 uname [0: Write(Bytes(390))],
    65 semop [1: Read(ArgTimes(2, 6))],
    66 semctl [3: Write(Page)],
    69 msgsnd [1: Read(ArgPlus(2, 8))],
    70 msgrcv [1: Write(ArgPlus(2, 8))],
    71 msgctl [2: Write(Bytes(IPC_DS))],
    72 fcntl [2: Write(Page)],
    76 truncate [0: Str],
    78 getdents [1: Write(Arg(2))],
    79 getcwd [0: Write(Arg(1))],
    80 chdir [0: Str],
    82 rename [0: Str, 1: Str],
    83 mkdir [0: Str],
    84 rmdir [0: Str],
    85 creat [0: Str],
    86 link [0: Str, 1: Str],
    87 unlink [0: Str],
    88 symlink [0: Str, 1: Str],
    89 readlink [0: Str, 1: Write(Arg(2))],
    90 chmod [0: Str],
    92 chown [0: Str],
    94 lchown [0: Str],
    96 gettimeofday [0: Write(Bytes(TIMEVAL)), 1: Write(Bytes(8))],
    97 getrlimit [1: Write(Bytes(RLIMIT))],
    98 getrusage [1: Write(Bytes(RUSAGE))],
    99 sysinfo [0: Write(Bytes(112))],
    100 times [0: Write(Bytes(32))],
    101 ptrace [3: Write(Page)],
    103 syslog [1: Write(Arg(2))],
    115 getgroups [1: Write(ArgTimes(0, 4))],
    116 setgroups [1: Read(ArgTimes(0, 4))],
    118 getresuid [0: Write(Bytes(4)), 1: Write(Bytes(4)), 2: Write(Bytes(4))],
    120 getresgid [0: Write(Bytes(4)), 1: Write(Bytes(4)), 2: Write(Bytes(4))],
    125 capget [0: Write(Bytes(8)), 1: Write(Bytes(24))],
    126 capset [0: Write(Bytes(8)), 1: Read(Bytes(24))],
    127 rt_sigpending [0: Write(Arg(1))],
    128 rt_sigtimedwait [0: Read(Arg(3)), 1: Write(Bytes(SIGINFO)), 2: Read(Bytes(TIMESPEC))],
    129 rt_sigqueueinfo [2: Read(Bytes(SIGINFO))],
    130 rt_sigsuspend [0: Read(Arg(1))],
    132 utime [0: Str, 1: Read(Bytes(16))],
    133 mknod [0: Str],
    134 uselib [0: Str],
    136 ustat [1: Write(Bytes(32))],
    137 statfs [0: Str, 1: Write(Bytes(STATFS))],
    138 fstatfs [1: Write(Bytes(STATFS))],
    139 sysfs [1: Write(Page), 2: Write(Page)],
    142 sched_setparam [1: Read(Bytes(4))],
    143 sched_getparam [1: Write(Bytes(4))],
    144 sched_setscheduler [2: Read(Bytes(4))],
    148 sched_rr_get_interval [1: Write(Bytes(TIMESPEC))],
    154 modify_ldt [1: Write(Arg(2))],
    155 pivot_root [0: Str, 1: Str],
    156 _sysctl [0: Write(Page)],
    157 prctl [1: Write(Page), 2: Write(Page), 3: Write(Page), 4: Write(Page)],
    158 arch_prctl [1: Write(Bytes(8))],
    159 adjtimex [0: Write(Bytes(TIMEX))],
    160 setrlimit [1: Read(Bytes(RLIMIT))],
    161 chroot [0: Str],
    163 acct [0: Str],
    164 settimeofday [0: Read(Bytes(TIMEVAL)), 1: Read(Bytes(8))],
    165 mount [0: Str, 1: Str, 2: Str, 4: Write(Page)],
    166 umount2 [0: Str],
    167 swapon [0: Str],
    168 swapoff [0: Str],
    169 reboot [3: Read(Page)],
    170 sethostname [0: Read(Arg(1))],
    171 setdomainname [0: Read(Arg(1))],
    175 init_module [0: Read(Arg(1)), 2: Str],
    176 delete_module [0: Str],
    179 quotactl [1: Str, 3: Write(Page)],
    188 setxattr [0: Str, 1: Str, 2: Read(Arg(3))],
    189 lsetxattr [0: Str, 1: Str, 2: Read(Arg(3))],
    190 fsetxattr [1: Str, 2: Read(Arg(3))],
    191 getxattr [0: Str, 1: Str, 2: Write(Arg(3))],
    192 lgetxattr [0: Str, 1: Str, 2: Write(Arg(3))],
    193 fgetxattr [1: Str, 2: Write(Arg(3))],
    194 listxattr [0: Str, 1: Write(Arg(2))],
    195 llistxattr [0: Str, 1: Write(Arg(2))],
    196 flistxattr [1: Write(Arg(2))],
    197 removexattr [0: Str, 1: Str],
    198 lremovexattr [0: Str, 1: Str],
    199 fremovexattr [1: Str],
    201 time [0: Write(Bytes(8))],
    202 futex [0: Write(Bytes(4)), 3: Read(Bytes(TIMESPEC)), 4: Write(Bytes(4))],
    203 sched_setaffinity [2: Read(Arg(1))],
    204 sched_getaffinity [2: Write(Arg(1))],
    205 set_thread_area [0: Write(Bytes(16))],
    206 io_setup [1: Write(Bytes(8))],
    208 io_getevents [3: Write(ArgTimes(2, IO_EVENT)), 4: Read(Bytes(TIMESPEC))],
    210 io_cancel [1: Read(Bytes(64)), 2: Write(Bytes(IO_EVENT))],
    211 get_thread_area [0: Write(Bytes(16))],
    212 lookup_dcookie [1: Write(Arg(2))],
    217 getdents64 [1: Write(Arg(2))],
    220 semtimedop [1: Read(ArgTimes(2, 6)), 3: Read(Bytes(TIMESPEC))],
    222 timer_create [1: Read(Bytes(SIGEVENT)), 2: Write(Bytes(4))],
    223 timer_settime [2: Read(Bytes(ITIMERSPEC)), 3: Write(Bytes(ITIMERSPEC))],
    224 timer_gettime [1: Write(Bytes(ITIMERSPEC))],
    227 clock_settime [1: Read(Bytes(TIMESPEC))],
    228 clock_gettime [1: Write(Bytes(TIMESPEC))],
    229 clock_getres [1: Write(Bytes(TIMESPEC))],
    230 clock_nanosleep [2: Read(Bytes(TIMESPEC)), 3: Write(Bytes(TIMESPEC))],
    232 epoll_wait [1: Write(ArgTimes(2, EPOLL_EVENT))],
    233 epoll_ctl [3: Read(Bytes(EPOLL_EVENT))],
    235 utimes [0: Str, 1: Read(Bytes(2 * TIMEVAL))],
    237 mbind [3: Read(Bits(4))],
    238 set_mempolicy [1: Read(Bits(2))],
    239 get_mempolicy [0: Write(Bytes(4)), 1: Write(Bits(2))],
    240 mq_open [0: Str, 3: Read(Bytes(MQ_ATTR))],
    241 mq_unlink [0: Str],
    242 mq_timedsend [1: Read(Arg(2)), 4: Read(Bytes(TIMESPEC))],
    243 mq_timedreceive [1: Write(Arg(2)), 3: Write(Bytes(4)), 4: Read(Bytes(TIMESPEC))],
    244 mq_notify [1: Read(Bytes(SIGEVENT))],
    245 mq_getsetattr [1: Read(Bytes(MQ_ATTR)), 2: Write(Bytes(MQ_ATTR))],
    246 kexec_load [2: Read(ArgTimes(1, 32))],
    247 waitid [2: Write(Bytes(SIGINFO)), 4: Write(Bytes(RUSAGE))],
    248 add_key [0: Str, 1: Str, 2: Read(Arg(3))],
    249 request_key [0: Str, 1: Str, 2: Str],
    250 keyctl [1: Write(Page), 2: Write(Page), 3: Write(Page), 4: Write(Page)],
    254 inotify_add_watch [1: Str],
    256 migrate_pages [2: Read(Bits(1)), 3: Read(Bits(1))],
    257 openat [1: Str],
    258 mkdirat [1: Str],
    259 mknodat [1: Str],
    260 fchownat [1: Str],
    261 futimesat [1: Str, 2: Read(Bytes(2 * TIMEVAL))],
    262 newfstatat [1: Str, 2: Write(Bytes(STAT))],
    263 unlinkat [1: Str],
    264 renameat [1: Str, 3: Str],
    265 linkat [1: Str, 3: Str],
    266 symlinkat [0: Str, 2: Str],
    267 readlinkat [1: Str, 2: Write(Arg(3))],
    268 fchmodat [1: Str],
    269 faccessat [1: Str],
    270 pselect6 [1: Write(Bits(0)), 2: Write(Bits(0)), 3: Write(Bits(0)), 4: Write(Bytes(TIMESPEC)), 5: Read(Bytes(16))],
    271 ppoll [0: Write(ArgTimes(1, POLLFD)), 2: Write(Bytes(TIMESPEC)), 3: Read(Arg(4))],
    274 get_robust_list [1: Write(Bytes(8)), 2: Write(Bytes(8))],
    275 splice [1: Write(Bytes(8)), 3: Write(Bytes(8))],
    278 vmsplice [1: Iov { count: 2, store: false }],
    279 move_pages [2: Read(ArgTimes(1, 8)), 3: Read(ArgTimes(1, 4)), 4: Write(ArgTimes(1, 4))],
    280 utimensat [1: Str, 2: Read(Bytes(2 * TIMESPEC))],
    281 epoll_pwait [1: Write(ArgTimes(2, EPOLL_EVENT)), 4: Read(Arg(5))],
    282 signalfd [1: Read(Arg(2))],
    286 timerfd_settime [2: Read(Bytes(ITIMERSPEC)), 3: Write(Bytes(ITIMERSPEC))],
    287 timerfd_gettime [1: Write(Bytes(ITIMERSPEC))],
    288 accept4 [1: Write(AtArg(2)), 2: Write(Bytes(4))],
    289 signalfd4 [1: Read(Arg(2))],
    293 pipe2 [0: Write(Bytes(8))],
    295 preadv [1: Iov { count: 2, store: true }],
    296 pwritev [1: Iov { count: 2, store: false }],
    297 rt_tgsigqueueinfo [3: Read(Bytes(SIGINFO))],
    298 perf_event_open [0: Write(Page)],
    299 recvmmsg [1: MMsg { count: 2, store: true }, 4: Write(Bytes(TIMESPEC))],
    301 fanotify_mark [4: Str],
    302 prlimit64 [2: Read(Bytes(RLIMIT)), 3: Write(Bytes(RLIMIT))],
    303 name_to_handle_at [1: Str, 2: Write(Page), 3: Write(Bytes(4))],
    304 open_by_handle_at [1: Read(Page)],
    305 clock_adjtime [1: Write(Bytes(TIMEX))],
    307 sendmmsg [1: MMsg { count: 2, store: false }],
    309 getcpu [0: Write(Bytes(4)), 1: Write(Bytes(4))],
    310 process_vm_readv [1: Iov { count: 2, store: true }, 3: Read(ArgTimes(4, 16))],
    311 process_vm_writev [1: Iov { count: 2, store: false }, 3: Read(ArgTimes(4, 16))],
    312 kcmp [4: Read(Bytes(12))],
    313 finit_module [1: Str],
    314 sched_setattr [1: Read(Bytes(56))],
    315 sched_getattr [1: Write(Arg(2))],
    316 renameat2 [1: Str, 3: Str],
    317 seccomp [2: Read(Page)],
    318 getrandom [0: Write(Arg(1))],
    319 memfd_create [0: Str],
    320 kexec_file_load [3: Read(Arg(2))],
    321 bpf [1: Write(Arg(2))],
    326 copy_file_range [1: Write(Bytes(8)), 3: Write(Bytes(8))],
    327 preadv2 [1: Iov { count: 2, store: true }],
    328 pwritev2 [1: Iov { count: 2, store: false }],
    332 statx [1: Str, 4: Write(Bytes(STATX))],
    333 io_pgetevents [3: Write(ArgTimes(2, IO_EVENT)), 4: Read(Bytes(TIMESPEC)), 5: Read(Bytes(16))],
    424 pidfd_send_signal [2: Read(Bytes(SIGINFO))],
    425 io_uring_setup [1: Write(Bytes(120))],
    426 io_uring_enter [4: Read(Arg(5))],
    427 io_uring_register [2: Write(Page)],
    428 open_tree [1: Str],
    429 move_mount [1: Str, 3: Str],
    430 fsopen [0: Str],
    431 fsconfig [2: Str, 3: Read(Page)],
    433 fspick [1: Str],
    437 openat2 [1: Str, 2: Read(Arg(3))],
    439 faccessat2 [1: Str],
    441 epoll_pwait2 [1: Write(ArgTimes(2, EPOLL_EVENT)), 3: Read(Bytes(TIMESPEC)), 4: Read(Arg(5))],
    442 mount_setattr [1: Str, 3: Read(Arg(4))],
    443 quotactl_fd [3: Write(Page)],
    444 landlock_create_ruleset [0: Read(Arg(1))],
    445 landlock_add_rule [2: Read(Bytes(16))],
    449 futex_waitv [0: Read(ArgTimes(1, 24)), 3: Read(Bytes(TIMESPEC))],
    451 cachestat [1: Read(Bytes(16)), 2: Write(Bytes(32))],
    452 fchmodat2 [1: Str],
    455 futex_wait [0: Read(Bytes(4)), 4: Read(Bytes(TIMESPEC))],
    456 futex_requeue [0: Read(Bytes(48))],
    457 statmount [0: Read(Bytes(32)), 1: Write(Arg(2))],
    458 listmount [0: Read(Bytes(32)), 1: Write(ArgTimes(2, 8))],
    459 lsm_get_self_attr [1: Write(Page), 2: Write(Bytes(4))],
    460 lsm_set_self_attr [1: Read(Arg(2))],
    461 lsm_list_modules [0: Write(Page), 1: Write(Bytes(4))],
    463 setxattrat [1: Str, 3: Str, 4: Read(Arg(5))],
    464 getxattrat [1: Str, 3: Str, 4: Read(Arg(5))],
    465 listxattrat [1: Str, 3: Write(Arg(4))],
    466 removexattrat [1: Str, 3: Str],
    467 open_tree_attr [1: Str, 3: Read(Arg(4))],
    468 file_getattr [1: Str, 2: Write(Arg(3))],
    469 file_setattr [1: Str, 2: Read(Arg(3))],
}

/// The call of number `nr`, if it has buffers.
pub fn lookup(nr: i64) -> Option<&'static Call> {
    CALLS.binary_search_by_key(&nr, |c| c.nr).ok().map(|i| &CALLS[i])
}

/// `futex` operations that touch no memory: the filter lets them through
/// (a wake on a heap word is the common case of every unlock).
pub const FUTEX_NO_MEMORY: [u32; 2] = [libc::FUTEX_WAKE as u32, libc::FUTEX_WAKE_BITSET as u32];

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sorted_unique_and_within_six_arguments() {
        for w in CALLS.windows(2) {
            assert!(w[0].nr < w[1].nr, "{} before {}", w[0].name, w[1].name);
        }
        for c in CALLS {
            assert!(!c.args.is_empty(), "{}", c.name);
            for &(i, b) in c.args {
                assert!(i < 6, "{} argument {i}", c.name);
                let refs = b.length_arg().or(match b {
                    Buf::Read(Len::AtArg(j)) | Buf::Write(Len::AtArg(j)) => Some(j),
                    _ => None,
                });
                if let Some(j) = refs {
                    assert!(j < 6 && j != i, "{} argument {i} refers to {j}", c.name);
                }
            }
        }
    }

    /// The numbers are the kernel's, as libc names them.
    #[test]
    fn numbers_match_libc() {
        let named: &[(i64, &str)] = &[
            (libc::SYS_read, "read"),
            (libc::SYS_ioctl, "ioctl"),
            (libc::SYS_futex, "futex"),
            (libc::SYS_newfstatat, "newfstatat"),
            (libc::SYS_recvmmsg, "recvmmsg"),
            (libc::SYS_statx, "statx"),
            (libc::SYS_openat2, "openat2"),
            (libc::SYS_epoll_pwait2, "epoll_pwait2"),
            (libc::SYS_futex_waitv, "futex_waitv"),
            (libc::SYS_getrandom, "getrandom"),
            (libc::SYS_wait4, "wait4"),
        ];
        for &(nr, name) in named {
            assert_eq!(lookup(nr).map(|c| c.name), Some(name));
        }
        for name in [
            "rt_sigprocmask",
            "sigaltstack",
            "execve",
            "clone",
            "rt_sigreturn",
            "mmap",
            "process_madvise",
        ] {
            assert!(CALLS.iter().all(|c| c.name != name), "{name} must not be trapped");
        }
    }
}
