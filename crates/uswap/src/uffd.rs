//! A thin wrapper over userfaultfd(2): the kernel facility the pager serves
//! page faults with.
//!
//! The `userfaultfd` crate lacks `UFFDIO_MOVE`, `UFFDIO_POISON` and
//! `UFFDIO_COPY_MODE_WP`, and Debian 12's headers predate them, so the
//! ioctl numbers and structures are defined here from the kernel's uapi
//! (`include/uapi/linux/userfaultfd.h`, Linux 6.8+).  Every call is one
//! ioctl on the descriptor; none allocates, so all of them may be used on
//! the fault path, signal handlers included.  Errors carry the raw errno:
//! the fault path tells `EEXIST` (already resolved: a duplicate fault),
//! `EAGAIN` (the address space changed under us: retry) and `EBUSY`
//! (`UFFDIO_MOVE` met a shared or pinned page: fall back to copying) apart.

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};

/// The API version `UFFDIO_API` speaks.
const UFFD_API: u64 = 0xAA;

// ioctl numbers: _IOWR(0xAA, nr, size) = 0xC000_0000 | size << 16 | 0xAA << 8 | nr.
const fn iowr(nr: u64, size: u64) -> u64 {
    0xC000_0000 | (size << 16) | (0xAA << 8) | nr
}
const fn ior(nr: u64, size: u64) -> u64 {
    0x8000_0000 | (size << 16) | (0xAA << 8) | nr
}
const UFFDIO_API: u64 = iowr(0x3F, 24);
const UFFDIO_REGISTER: u64 = iowr(0x00, 32);
const UFFDIO_UNREGISTER: u64 = ior(0x01, 16);
const UFFDIO_WAKE: u64 = ior(0x02, 16);
const UFFDIO_COPY: u64 = iowr(0x03, 40);
const UFFDIO_ZEROPAGE: u64 = iowr(0x04, 32);
const UFFDIO_MOVE: u64 = iowr(0x05, 40);
const UFFDIO_WRITEPROTECT: u64 = iowr(0x06, 24);
const UFFDIO_POISON: u64 = iowr(0x08, 32);
/// `/dev/userfaultfd`'s ioctl that makes a new descriptor: _IO(0xAA, 0).
const USERFAULTFD_IOC_NEW: u64 = 0xAA00;

const REGISTER_MODE_MISSING: u64 = 1;
const REGISTER_MODE_WP: u64 = 2;
const COPY_MODE_DONTWAKE: u64 = 1;
const COPY_MODE_WP: u64 = 2;
const MOVE_MODE_DONTWAKE: u64 = 1;
const MOVE_MODE_ALLOW_SRC_HOLES: u64 = 2;
const WRITEPROTECT_MODE_WP: u64 = 1;
const WRITEPROTECT_MODE_DONTWAKE: u64 = 2;

/// `uffd_msg.event` of a page fault.
const UFFD_EVENT_PAGEFAULT: u8 = 0x12;
/// Page-fault flags in `uffd_msg`.
const PAGEFAULT_FLAG_WRITE: u64 = 1;
const PAGEFAULT_FLAG_WP: u64 = 2;

/// userfaultfd features (`UFFD_FEATURE_*`), as a bit set.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct Features(pub u64);

impl Features {
    /// Write-protect faults are reported (`PAGEFAULT_FLAG_WP`).
    pub const PAGEFAULT_FLAG_WP: Features = Features(1 << 0);
    /// Faults raise SIGBUS in the faulting thread instead of waiting for a
    /// handler thread.
    pub const SIGBUS: Features = Features(1 << 7);
    /// Fault messages carry the faulting thread's id.
    pub const THREAD_ID: Features = Features(1 << 8);
    /// Write-protect works on not yet populated anonymous memory.
    pub const WP_UNPOPULATED: Features = Features(1 << 13);
    /// `UFFDIO_POISON`.
    pub const POISON: Features = Features(1 << 14);
    /// `UFFDIO_MOVE`.
    pub const MOVE: Features = Features(1 << 16);

    /// No features.
    pub const NONE: Features = Features(0);

    /// Both sets.
    pub const fn with(self, other: Features) -> Features {
        Features(self.0 | other.0)
    }

    /// Whether every feature of `other` is in `self`.
    pub const fn contains(self, other: Features) -> bool {
        self.0 & other.0 == other.0
    }

    /// The name and first kernel of each single feature bit uswap uses.
    fn describe(bit: u64) -> (&'static str, &'static str) {
        match bit {
            1 => ("write-protect faults (UFFD_FEATURE_PAGEFAULT_FLAG_WP)", "5.7"),
            0x80 => ("SIGBUS delivery (UFFD_FEATURE_SIGBUS)", "4.14"),
            0x100 => ("thread ids in fault messages (UFFD_FEATURE_THREAD_ID)", "4.14"),
            0x2000 => (
                "write-protect of unpopulated memory (UFFD_FEATURE_WP_UNPOPULATED)",
                "6.4",
            ),
            0x4000 => ("UFFDIO_POISON (UFFD_FEATURE_POISON)", "6.6"),
            0x1_0000 => ("UFFDIO_MOVE (UFFD_FEATURE_MOVE)", "6.8"),
            _ => ("an unnamed userfaultfd feature", "a newer kernel"),
        }
    }
}

/// Why userfaultfd could not be set up or a call failed.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum UffdError {
    /// Neither the syscall nor /dev/userfaultfd would give a descriptor
    /// that serves faults the kernel takes too, which was asked for
    /// (handler-thread mode).
    #[error("handler-thread mode serves faults the kernel takes on region memory (read(2) into it, say), which userfaultfd allows only with privilege: run as root, set `sysctl vm.unprivileged_userfaultfd=1`, or give this user read-write access to /dev/userfaultfd; or use SIGBUS mode (`--mode sigbus`), which any user may")]
    Permission,
    /// Not even a descriptor for user-mode faults (`UFFD_USER_MODE_ONLY`,
    /// which any user may open on Linux 5.11+) was given.
    #[error("userfaultfd is refused to this process even for user-mode faults (errno {errno}): {}", .confinement.fix())]
    UserModeRefused {
        /// The errno.
        errno: i32,
        /// What refused it, as far as can be told, and so the fix.
        confinement: Confinement,
    },
    /// The kernel has no userfaultfd at all.
    #[error("this kernel has no userfaultfd (built without CONFIG_USERFAULTFD); uswap needs Linux 6.8 or newer with it")]
    Unsupported,
    /// A feature uswap needs is missing.
    #[error("this kernel lacks {name}, which uswap needs; it first appeared in Linux {since}")]
    MissingFeature {
        /// The feature's name.
        name: &'static str,
        /// The first kernel that has it.
        since: &'static str,
    },
    /// An ioctl failed.
    #[error("{op} failed: {}", io::Error::from_raw_os_error(*.errno))]
    Ioctl {
        /// The ioctl.
        op: &'static str,
        /// The errno.
        errno: i32,
    },
}

/// Where a process runs whose `userfaultfd` call was refused: what
/// decides the fix.  Container runtimes refuse the call in their default
/// seccomp profiles (moby's, Podman's); none of them refuses the open of
/// `/dev/userfaultfd`, which gives the same descriptor (Linux 6.1+), so
/// the device passed in is the fix that needs no profile of one's own.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Confinement {
    /// A Docker container (`/.dockerenv`).
    Docker,
    /// A Podman container (`/run/.containerenv`).
    Podman,
    /// A Kubernetes pod (its service-account mount or environment).
    Kubernetes,
    /// Another container (`container=` in the environment).
    Container,
    /// No container seen, but a seccomp filter on this process.
    Filtered,
    /// Neither: a security module, or an old kernel.
    Unknown,
}

impl Confinement {
    /// What this process can see of its confinement.
    pub fn detect() -> Confinement {
        let exists = |p: &str| std::path::Path::new(p).exists();
        if exists("/.dockerenv") {
            Confinement::Docker
        } else if exists("/run/.containerenv") {
            Confinement::Podman
        } else if std::env::var_os("KUBERNETES_SERVICE_HOST").is_some()
            || exists("/var/run/secrets/kubernetes.io")
        {
            Confinement::Kubernetes
        } else if std::env::var_os("container").is_some() {
            Confinement::Container
        } else if std::fs::read_to_string("/proc/self/status")
            .is_ok_and(|s| s.lines().any(|l| l.starts_with("Seccomp:") && l.trim_end().ends_with('2')))
        {
            Confinement::Filtered
        } else {
            Confinement::Unknown
        }
    }

    /// The one-line fix for a refused `userfaultfd`.
    pub fn fix(self) -> String {
        let runtime = |cmd: &str, name: &str, base: &str| {
            format!(
                "this is a {name} container, whose default seccomp profile refuses the call; pass the device in, `{cmd} run --device /dev/userfaultfd ...` (uswap opens it instead; for a user other than root in the container, make it readable and writable by that user on the host), or allow the call: `uswap seccomp-profile {base} > uswap-seccomp.json` on the host, then `{cmd} run --security-opt seccomp=uswap-seccomp.json ...`"
            )
        };
        match self {
            Confinement::Docker => runtime("docker", "Docker", "docker"),
            Confinement::Podman => runtime("podman", "Podman", "podman"),
            Confinement::Kubernetes => "this is a Kubernetes pod, whose seccomp profile (RuntimeDefault) refuses the call; on each node, `uswap seccomp-profile docker > /var/lib/kubelet/seccomp/uswap.json`, and give the pod `securityContext: {seccompProfile: {type: Localhost, localhostProfile: uswap.json}}` (or pass /dev/userfaultfd in through a device plugin: uswap opens it instead)".into(),
            Confinement::Container => "this is a container whose seccomp profile refuses the call; pass /dev/userfaultfd in as a device (uswap opens it instead), or allow the call: `uswap seccomp-profile --from ITS-PROFILE.json` prints the profile with it allowed".into(),
            Confinement::Filtered => "a seccomp filter on this process refuses the call; give this user read-write access to /dev/userfaultfd (uswap opens it instead), or allow the call in the filter (`uswap seccomp-profile --from PROFILE.json` does it to a profile in Docker's format)".into(),
            Confinement::Unknown => "a security module forbids it, or the kernel is older than 5.11; run as root, set `sysctl vm.unprivileged_userfaultfd=1`, or give this user read-write access to /dev/userfaultfd".into(),
        }
    }
}

/// Whether a failed COPY or MOVE should be tried again: `EAGAIN` is the
/// kernel's word for "the page tables changed under me" (a folio being
/// split or locked, `mmap_changing`), transient by nature.  Bounded, so a
/// persistent `EAGAIN` reaches the caller instead of spinning forever.
fn again(e: &UffdError, tries: &mut u32) -> bool {
    const MAX_TRIES: u32 = 1000;
    if !matches!(
        e,
        UffdError::Ioctl {
            errno: libc::EAGAIN,
            ..
        }
    ) || *tries >= MAX_TRIES
    {
        return false;
    }
    *tries += 1;
    std::thread::yield_now();
    true
}

impl UffdError {
    /// The errno of a failed ioctl.
    pub fn errno(&self) -> Option<i32> {
        match self {
            UffdError::Ioctl { errno, .. } => Some(*errno),
            _ => None,
        }
    }
}

#[repr(C)]
#[derive(Default)]
struct UffdioApi {
    api: u64,
    features: u64,
    ioctls: u64,
}

#[repr(C)]
#[derive(Default, Clone, Copy)]
struct UffdioRange {
    start: u64,
    len: u64,
}

#[repr(C)]
#[derive(Default)]
struct UffdioRegister {
    range: UffdioRange,
    mode: u64,
    ioctls: u64,
}

/// `uffdio_copy` and `uffdio_move` have the same layout.
#[repr(C)]
#[derive(Default)]
struct UffdioCopy {
    dst: u64,
    src: u64,
    len: u64,
    mode: u64,
    result: i64,
}

/// `uffdio_zeropage` and `uffdio_poison` have the same layout.
#[repr(C)]
#[derive(Default)]
struct UffdioRangeOp {
    range: UffdioRange,
    mode: u64,
    result: i64,
}

#[repr(C)]
#[derive(Default)]
struct UffdioWriteprotect {
    range: UffdioRange,
    mode: u64,
}

#[repr(C)]
#[derive(Clone, Copy)]
struct UffdMsg {
    event: u8,
    reserved1: u8,
    reserved2: u16,
    reserved3: u32,
    /// For a page fault: flags, address, thread id.
    arg: [u64; 3],
}

/// What a handler thread reads from the descriptor.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Event {
    /// A fault at `address` (not page aligned): `write` when a write
    /// caused it, `wp` when it hit a write-protected page, `thread` the
    /// faulting thread when `THREAD_ID` is on.
    PageFault {
        address: u64,
        write: bool,
        wp: bool,
        thread: u32,
    },
    /// Another event (fork, remap, remove, unmap) that uswap does not ask for.
    Other(u8),
}

/// How a range is registered.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RegisterMode {
    /// Report faults on missing pages.
    pub missing: bool,
    /// Report write faults on write-protected pages.
    pub wp: bool,
}

/// One userfaultfd descriptor.  Closing it unregisters every range, after
/// which evicted pages would read back as zeros: whoever owns a `Uffd` must
/// outlive every region registered with it.
#[derive(Debug)]
pub struct Uffd {
    fd: OwnedFd,
    /// What the kernel offers (UFFDIO_API reports every feature it has).
    features: Features,
    /// What was asked for, and so is on for this descriptor.
    wanted: Features,
    nonblocking: bool,
    user_mode_only: bool,
}

/// `userfaultfd(2)`'s flag for a descriptor that handles user-mode faults
/// only (Linux 5.11): allowed to any user, whatever
/// `vm.unprivileged_userfaultfd` says.
const UFFD_USER_MODE_ONLY: i32 = 1;

/// Which faults a descriptor must be able to serve.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Reach {
    /// Faults the kernel takes on registered memory too (`read(2)` into
    /// it): needs privilege (root, `vm.unprivileged_userfaultfd=1`, or
    /// access to /dev/userfaultfd).  Handler-thread mode.
    KernelFaults,
    /// User-mode faults are enough: without the privilege, a descriptor
    /// opened with `UFFD_USER_MODE_ONLY`.  SIGBUS mode, which serves only
    /// the faulting thread's own accesses anyway (a fault the kernel takes
    /// on a missing page fails its system call with `EFAULT` either way).
    UserFaults,
}

fn errno() -> i32 {
    io::Error::last_os_error().raw_os_error().unwrap_or(libc::EIO)
}

impl Uffd {
    /// Open a descriptor and negotiate `wanted` features; every one must be
    /// there, or the error names the first missing one and the kernel that
    /// has it.  `nonblocking` is for handler threads that poll (a blocking
    /// uffd under epoll reports POLLERR).
    pub fn open(wanted: Features, nonblocking: bool) -> Result<Uffd, UffdError> {
        Self::open_reaching(wanted, nonblocking, Reach::KernelFaults)
    }

    /// As [`open`](Self::open), for faults of `reach`: with
    /// [`Reach::UserFaults`] a process without the privilege for kernel
    /// faults gets a user-mode-only descriptor
    /// ([`user_mode_only`](Self::user_mode_only)).
    pub fn open_reaching(wanted: Features, nonblocking: bool, reach: Reach) -> Result<Uffd, UffdError> {
        let flags = libc::O_CLOEXEC | if nonblocking { libc::O_NONBLOCK } else { 0 };
        let (fd, user_mode_only) = Self::open_fd(flags, reach)?;
        // SAFETY: `fd` is a fresh descriptor this function owns.
        let fd = crate::descriptors::place(unsafe { OwnedFd::from_raw_fd(fd) });
        let mut api = UffdioApi {
            api: UFFD_API,
            features: wanted.0,
            ioctls: 0,
        };
        // SAFETY: UFFDIO_API reads and writes a `uffdio_api`, which `api` is.
        if unsafe { libc::ioctl(fd.as_raw_fd(), UFFDIO_API as _, &mut api) } < 0 {
            // EINVAL: a requested feature is unknown to this kernel.  Ask
            // again with none to learn which.
            let e = errno();
            let probe = Self::probe_features()?;
            let missing = wanted.0 & !probe.0;
            if missing != 0 {
                let (name, since) = Features::describe(missing & missing.wrapping_neg());
                return Err(UffdError::MissingFeature { name, since });
            }
            return Err(UffdError::Ioctl {
                op: "UFFDIO_API",
                errno: e,
            });
        }
        let missing = wanted.0 & !api.features;
        if missing != 0 {
            let (name, since) = Features::describe(missing & missing.wrapping_neg());
            return Err(UffdError::MissingFeature { name, since });
        }
        Ok(Uffd {
            fd,
            features: Features(api.features),
            wanted,
            nonblocking,
            user_mode_only,
        })
    }

    /// Whether this process may open a descriptor that serves the
    /// kernel's faults too ([`Reach::KernelFaults`]): root,
    /// `vm.unprivileged_userfaultfd=1`, or access to /dev/userfaultfd.
    pub fn kernel_faults_allowed() -> bool {
        match Self::open_fd(libc::O_CLOEXEC, Reach::KernelFaults) {
            Ok((fd, _)) => {
                // SAFETY: a descriptor just opened, ours to close.
                unsafe { libc::close(fd) };
                true
            }
            Err(_) => false,
        }
    }

    /// In a forked child: the inherited descriptor speaks for the
    /// parent's memory.  Open one for this process with the same features
    /// and reach, and put it under the same descriptor number, so that
    /// everything holding this value now acts on the child's memory.
    /// Nothing is registered with the new one yet.
    pub fn reopen_here(&self) -> Result<(), UffdError> {
        let reach = if self.user_mode_only {
            Reach::UserFaults
        } else {
            Reach::KernelFaults
        };
        let fresh = Self::open_reaching(self.wanted, self.nonblocking, reach)?;
        // The descriptor this value owns replaced by a duplicate of the
        // fresh one (which closes as `fresh` drops), close-on-exec.
        crate::descriptors::dup_onto(fresh.raw_fd(), self.fd.as_raw_fd()).map_err(|e| UffdError::Ioctl {
            op: "dup3",
            errno: e.raw_os_error().unwrap_or(libc::EBADF),
        })
    }

    /// A new descriptor, and whether it is user-mode only: the syscall,
    /// then /dev/userfaultfd (both serve kernel faults too), then, where
    /// `reach` allows, the syscall for user-mode faults only.
    fn open_fd(flags: i32, reach: Reach) -> Result<(RawFd, bool), UffdError> {
        // SAFETY: the syscall takes only flags and returns a new fd or -1.
        let fd = unsafe { libc::syscall(libc::SYS_userfaultfd, flags) } as RawFd;
        if fd >= 0 {
            return Ok((fd, false));
        }
        let first = errno();
        if let Some(fd) = Self::open_dev(flags)? {
            return Ok((fd, false));
        }
        if first == libc::ENOSYS {
            // No such call, or a filter that says so (a seccomp profile
            // may refuse with ENOSYS): the device was the other way in.
            return Err(match Confinement::detect() {
                Confinement::Unknown => UffdError::Unsupported,
                confinement => UffdError::UserModeRefused {
                    errno: first,
                    confinement,
                },
            });
        }
        if reach == Reach::KernelFaults {
            return Err(UffdError::Permission);
        }
        // SAFETY: as above.
        let fd = unsafe { libc::syscall(libc::SYS_userfaultfd, flags | UFFD_USER_MODE_ONLY) } as RawFd;
        if fd < 0 {
            return Err(UffdError::UserModeRefused {
                errno: errno(),
                confinement: Confinement::detect(),
            });
        }
        Ok((fd, true))
    }

    /// A descriptor from /dev/userfaultfd; None when this user may not
    /// open it, or there is none.
    fn open_dev(flags: i32) -> Result<Option<RawFd>, UffdError> {
        let path = b"/dev/userfaultfd\0";
        // SAFETY: `path` is NUL-terminated.
        let dev = unsafe { libc::open(path.as_ptr().cast(), libc::O_RDWR | libc::O_CLOEXEC) };
        if dev < 0 {
            return Ok(None);
        }
        // SAFETY: USERFAULTFD_IOC_NEW takes the flags as its argument.
        let fd = unsafe { libc::ioctl(dev, USERFAULTFD_IOC_NEW as _, flags) };
        let e = errno();
        // SAFETY: `dev` is ours and closed once.
        unsafe { libc::close(dev) };
        if fd < 0 {
            if e == libc::EPERM || e == libc::EACCES {
                return Ok(None);
            }
            return Err(UffdError::Ioctl {
                op: "USERFAULTFD_IOC_NEW",
                errno: e,
            });
        }
        Ok(Some(fd))
    }

    /// The features this kernel offers (opens and closes a descriptor,
    /// user-mode only where that is all this process may have: the same
    /// features are offered).
    pub fn probe_features() -> Result<Features, UffdError> {
        let u = Uffd::open_reaching(Features::NONE, false, Reach::UserFaults)?;
        Ok(u.features)
    }

    /// Whether this descriptor serves user-mode faults only
    /// (`UFFD_USER_MODE_ONLY`): opened without the privilege for more.
    pub fn user_mode_only(&self) -> bool {
        self.user_mode_only
    }

    /// The features negotiated.
    pub fn features(&self) -> Features {
        self.features
    }

    /// Whether the descriptor was opened non-blocking.
    pub fn nonblocking(&self) -> bool {
        self.nonblocking
    }

    /// The raw descriptor (for poll).
    pub fn raw_fd(&self) -> RawFd {
        self.fd.as_raw_fd()
    }

    fn ioctl<T>(&self, op: &'static str, req: u64, arg: &mut T) -> Result<(), UffdError> {
        // SAFETY: every caller passes the structure that `req` reads and
        // writes, laid out as the kernel's (#[repr(C)] above).
        if unsafe { libc::ioctl(self.fd.as_raw_fd(), req as _, arg as *mut T) } < 0 {
            return Err(UffdError::Ioctl { op, errno: errno() });
        }
        Ok(())
    }

    /// Register `[addr, addr+len)` (page aligned) for `mode`.
    pub fn register(&self, addr: u64, len: u64, mode: RegisterMode) -> Result<(), UffdError> {
        let mut r = UffdioRegister {
            range: UffdioRange { start: addr, len },
            mode: if mode.missing { REGISTER_MODE_MISSING } else { 0 }
                | if mode.wp { REGISTER_MODE_WP } else { 0 },
            ioctls: 0,
        };
        self.ioctl("UFFDIO_REGISTER", UFFDIO_REGISTER, &mut r)
    }

    /// Unregister a range.
    pub fn unregister(&self, addr: u64, len: u64) -> Result<(), UffdError> {
        let mut r = UffdioRange { start: addr, len };
        self.ioctl("UFFDIO_UNREGISTER", UFFDIO_UNREGISTER, &mut r)
    }

    /// Wake threads waiting on faults in a range.
    pub fn wake(&self, addr: u64, len: u64) -> Result<(), UffdError> {
        let mut r = UffdioRange { start: addr, len };
        self.ioctl("UFFDIO_WAKE", UFFDIO_WAKE, &mut r)
    }

    /// Install a copy of `len` bytes from `src` at the missing pages from
    /// `dst`, write-protected when `wp`.  Returns the bytes copied: short
    /// on `EAGAIN` (retry the rest).  `EEXIST` means a page is already
    /// there (a duplicate fault was served first).
    ///
    /// # Safety
    /// `src..src + len` must be readable.  `dst..dst + len` must lie in a
    /// range registered with this descriptor whose contents the caller
    /// owns: the pages that appear there are the caller's to put, and no
    /// one else's expectations of what they hold (a region's pager, say)
    /// are broken by them.
    pub unsafe fn copy(
        &self,
        dst: u64,
        src: *const u8,
        len: u64,
        wp: bool,
        wake: bool,
    ) -> Result<u64, UffdError> {
        let mut tries = 0;
        loop {
            let mut c = UffdioCopy {
                dst,
                src: src as u64,
                len,
                mode: if wp { COPY_MODE_WP } else { 0 } | if wake { 0 } else { COPY_MODE_DONTWAKE },
                result: 0,
            };
            match self.ioctl("UFFDIO_COPY", UFFDIO_COPY, &mut c) {
                Ok(()) => return Ok(c.result as u64),
                Err(_) if c.result > 0 => return Ok(c.result as u64),
                Err(e) if again(&e, &mut tries) => continue,
                Err(e) => return Err(e),
            }
        }
    }

    /// Map the zero page at missing pages (a never-written page: no IO, no
    /// memory).
    ///
    /// # Safety
    /// As [`Uffd::copy`] for `addr..addr + len`: the zeros that appear
    /// there are the caller's to put.
    pub unsafe fn zeropage(&self, addr: u64, len: u64, wake: bool) -> Result<(), UffdError> {
        let mut z = UffdioRangeOp {
            range: UffdioRange { start: addr, len },
            mode: if wake { 0 } else { COPY_MODE_DONTWAKE },
            result: 0,
        };
        self.ioctl("UFFDIO_ZEROPAGE", UFFDIO_ZEROPAGE, &mut z)
    }

    /// Move the pages at `src` to the missing pages at `dst` without
    /// copying (Linux 6.8).  Returns the bytes moved.  `EBUSY`: a page is
    /// shared (fork, KSM) or pinned: copy instead.  With
    /// `allow_src_holes`, missing source pages are skipped, not an error.
    ///
    /// # Safety
    /// Both ranges must be the caller's: the pages at `src` leave it (it
    /// reads as missing afterwards, faulting or zeros), so nothing may hold
    /// a reference into it or expect its contents to stay; and what
    /// appears at `dst` must be the caller's to put, as for
    /// [`Uffd::copy`].
    pub unsafe fn move_pages(
        &self,
        dst: u64,
        src: u64,
        len: u64,
        wake: bool,
        allow_src_holes: bool,
    ) -> Result<u64, UffdError> {
        let mut tries = 0;
        loop {
            let mut m = UffdioCopy {
                dst,
                src,
                len,
                mode: if wake { 0 } else { MOVE_MODE_DONTWAKE }
                    | if allow_src_holes {
                        MOVE_MODE_ALLOW_SRC_HOLES
                    } else {
                        0
                    },
                result: 0,
            };
            match self.ioctl("UFFDIO_MOVE", UFFDIO_MOVE, &mut m) {
                Ok(()) => return Ok(m.result as u64),
                Err(_) if m.result > 0 => return Ok(m.result as u64),
                Err(e) if again(&e, &mut tries) => continue,
                Err(e) => return Err(e),
            }
        }
    }

    /// Write-protect (`wp`) or unprotect a range.  Unprotecting wakes
    /// threads waiting on write-protect faults unless `wake` is false;
    /// protecting ignores `wake`.
    pub fn writeprotect(&self, addr: u64, len: u64, wp: bool, wake: bool) -> Result<(), UffdError> {
        let mut w = UffdioWriteprotect {
            range: UffdioRange { start: addr, len },
            // Protecting wakes nobody, and the kernel refuses DONTWAKE with
            // it (EINVAL): the flag only means something when unprotecting.
            mode: if wp {
                WRITEPROTECT_MODE_WP
            } else if wake {
                0
            } else {
                WRITEPROTECT_MODE_DONTWAKE
            },
        };
        self.ioctl("UFFDIO_WRITEPROTECT", UFFDIO_WRITEPROTECT, &mut w)
    }

    /// Mark missing pages poisoned: an access raises SIGBUS instead of
    /// reading zeros (Linux 6.6).  For pages whose swap-in failed.
    ///
    /// # Safety
    /// `addr..addr + len` must be the caller's, as for [`Uffd::copy`]:
    /// any access to it raises SIGBUS from now on.
    pub unsafe fn poison(&self, addr: u64, len: u64, wake: bool) -> Result<(), UffdError> {
        let mut p = UffdioRangeOp {
            range: UffdioRange { start: addr, len },
            mode: if wake { 0 } else { COPY_MODE_DONTWAKE },
            result: 0,
        };
        self.ioctl("UFFDIO_POISON", UFFDIO_POISON, &mut p)
    }

    /// Read one event; `Ok(None)` when a non-blocking descriptor has none.
    pub fn read_event(&self) -> Result<Option<Event>, UffdError> {
        let mut msg = std::mem::MaybeUninit::<UffdMsg>::uninit();
        let size = std::mem::size_of::<UffdMsg>();
        loop {
            // SAFETY: reads at most `size` bytes into `msg`.
            let n = unsafe { libc::read(self.fd.as_raw_fd(), msg.as_mut_ptr().cast(), size) };
            if n < 0 {
                match errno() {
                    libc::EINTR => continue,
                    libc::EAGAIN => return Ok(None),
                    e => {
                        return Err(UffdError::Ioctl {
                            op: "read(userfaultfd)",
                            errno: e,
                        })
                    }
                }
            }
            if n as usize != size {
                return Err(UffdError::Ioctl {
                    op: "read(userfaultfd)",
                    errno: libc::EIO,
                });
            }
            // SAFETY: the kernel filled all `size` bytes.
            let msg = unsafe { msg.assume_init() };
            if msg.event != UFFD_EVENT_PAGEFAULT {
                return Ok(Some(Event::Other(msg.event)));
            }
            let flags = msg.arg[0];
            return Ok(Some(Event::PageFault {
                address: msg.arg[1],
                write: flags & PAGEFAULT_FLAG_WRITE != 0,
                wp: flags & PAGEFAULT_FLAG_WP != 0,
                thread: msg.arg[2] as u32,
            }));
        }
    }

    /// Wait up to `timeout_ms` (-1: forever) for an event to read.
    pub fn poll(&self, timeout_ms: i32) -> Result<bool, UffdError> {
        let mut p = libc::pollfd {
            fd: self.fd.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        loop {
            // SAFETY: one valid pollfd.
            let n = unsafe { libc::poll(&mut p, 1, timeout_ms) };
            if n < 0 {
                if errno() == libc::EINTR {
                    continue;
                }
                return Err(UffdError::Ioctl {
                    op: "poll(userfaultfd)",
                    errno: errno(),
                });
            }
            return Ok(n > 0 && p.revents & libc::POLLIN != 0);
        }
    }
}

#[cfg(test)]
mod tests;
