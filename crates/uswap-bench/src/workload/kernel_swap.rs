//! Kernel swap for side-by-side runs: a memory cgroup with the workload's
//! budget and a kernel swap device (zram0 or a swap file), set up before one
//! worker run and torn down after it, on errors and Ctrl-C too.
//!
//! Each run gets its own fresh swap: were zram and the swap file both on at
//! once, the kernel would fill the higher-priority one first and a
//! "kernel-file" run would really be a zram run.  Setting up costs well
//! under a second (reset zram or fallocate a file, write a swap header,
//! swapon), and swapoff after the worker has exited has nothing to read
//! back.
//!
//! What is torn down is only what this module made: the cgroup it created,
//! the swap it switched on, zram0 only if it found it unused and set it up,
//! the swap file it created.  Drop order does the teardown, so a `?` or a
//! panic between setup and teardown cleans up as well; Ctrl-C is turned
//! into an error by [`interrupted`] so that it takes the same path.

use std::ffi::CString;
use std::fs;
use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::Once;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};

/// Where the cgroup v1 memory controller is mounted.
pub const MEMCG_ROOT: &str = "/sys/fs/cgroup/memory";
/// The zram device kernel-zram runs use.
pub const ZRAM: &str = "zram0";
/// The cgroups this module creates are named `PREFIX<pid>-<n>`.
const CGROUP_PREFIX: &str = "uswap-bench-";
/// The swap file kernel-file runs create in the swap directory.
pub const SWAP_FILE_NAME: &str = "uswap-bench-kernel.swap";

const PAGE: usize = uswap::PAGE_SIZE;

static INTERRUPTED: AtomicBool = AtomicBool::new(false);

/// Catch SIGINT and SIGTERM from here on: they set a flag that the run
/// loops poll ([`interrupted`]), so that they stop the worker and tear the
/// kernel swap down instead of leaving it behind.
pub fn catch_interrupts() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        // If a handler is already set (a test harness), ours is not needed.
        let _ = ctrlc::set_handler(|| INTERRUPTED.store(true, Ordering::SeqCst));
    });
}

/// An error once Ctrl-C (or SIGTERM) arrived.
pub fn interrupted() -> Result<()> {
    if INTERRUPTED.load(Ordering::SeqCst) {
        bail!("interrupted; what the run had set up (worker, kernel swap, cgroup, swap files) was removed");
    }
    Ok(())
}

/// Which kernel swap device a run uses.
#[derive(Clone, Debug)]
pub enum KernelDevice {
    /// `/dev/zram0`, compressed RAM, with this compressor (None: the
    /// device's current one).
    Zram { bytes: u64, algorithm: Option<String> },
    /// A swap file created in this directory.
    File { dir: PathBuf, bytes: u64 },
    /// A swap file, as `File`, with zswap in front of it.
    Zswap { dir: PathBuf, bytes: u64, zswap: Zswap },
}

/// Where zswap's settings are.
pub const ZSWAP_PARAMS: &str = "/sys/module/zswap/parameters";

/// zswap's settings for a kernel-zswap run.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Zswap {
    /// Its compressor (`lz4`, `lzo`, `zstd`).
    pub compressor: String,
    /// Its pool's limit, in percent of RAM (zswap's only unit).
    pub max_pool_percent: u32,
}

impl Zswap {
    /// The pool limit in percent of RAM closest below `bytes` (at least
    /// 1%), and the bytes that is: a uswap store given the same bytes
    /// has the same limit.
    pub fn pool_for(bytes: u64) -> (u32, u64) {
        let total = mem_total().unwrap_or(bytes * 100).max(1);
        let pct = ((bytes as u128 * 100 / total as u128) as u32).clamp(1, 100);
        (pct, total * pct as u64 / 100)
    }
}

/// MemTotal, in bytes.
pub fn mem_total() -> Option<u64> {
    meminfo("MemTotal:")
}

/// A line of /proc/meminfo (`key` with its colon), in bytes.
pub fn meminfo(key: &str) -> Option<u64> {
    let s = fs::read_to_string("/proc/meminfo").ok()?;
    let kb: u64 = s
        .lines()
        .find_map(|l| l.strip_prefix(key))?
        .trim()
        .trim_end_matches("kB")
        .trim()
        .parse()
        .ok()?;
    Some(kb << 10)
}

/// Check that kernel swap runs can be set up here, with one line saying
/// what is missing and what to do.  Also removes empty cgroups left by an
/// earlier run that was killed before it could clean up.
pub fn preflight(devices: &[&KernelDevice]) -> Result<()> {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        bail!("kernel swap backends need root (swapon, zram and memory cgroups); run as root, or use --backend uswap");
    }
    let swaps = fs::read_to_string("/proc/swaps").context("reading /proc/swaps")?;
    if let Some(line) = swaps.lines().nth(1) {
        let name = line.split_whitespace().next().unwrap_or(line);
        bail!(
            "another swap is already active ({name}); the kernel runs need the machine's only swap to be theirs: `swapoff {name}` first{}",
            if name.contains("zram") || name.ends_with(SWAP_FILE_NAME) {
                format!(" (it looks left by an interrupted uswap bench; then also {})", leftover_hint(name))
            } else {
                String::new()
            }
        );
    }
    if !Path::new(MEMCG_ROOT).join("memory.limit_in_bytes").exists() {
        bail!("the cgroup v1 memory controller is not mounted at {MEMCG_ROOT}; mount it (`mount -t cgroup -o memory none {MEMCG_ROOT}`) to run kernel swap with a budget");
    }
    remove_stale_cgroups();
    for d in devices {
        match d {
            KernelDevice::Zram { .. } => {
                let dir = Path::new("/sys/block").join(ZRAM);
                if !dir.exists() {
                    bail!("no /sys/block/{ZRAM}: load the zram module (`modprobe zram`) for --backend kernel-zram");
                }
                let size = read_trim(&dir.join("disksize"))?;
                if size != "0" {
                    bail!("{ZRAM} is already set up (disksize {size}) and may be in use; if nothing uses it, reset it with `echo 1 > /sys/block/{ZRAM}/reset`");
                }
            }
            KernelDevice::File { dir, .. } | KernelDevice::Zswap { dir, .. } => {
                if matches!(d, KernelDevice::Zswap { .. })
                    && !Path::new(ZSWAP_PARAMS).join("enabled").exists()
                {
                    bail!("this kernel has no zswap ({ZSWAP_PARAMS} is missing): build it with CONFIG_ZSWAP, or leave kernel-zswap out");
                }
                let path = dir.join(SWAP_FILE_NAME);
                if path.exists() {
                    bail!(
                        "{} exists, left by an interrupted uswap bench; remove it (`rm {}`) and run again",
                        path.display(),
                        path.display()
                    );
                }
                if !dir.is_dir() {
                    bail!("--swap-dir {} is not a directory", dir.display());
                }
            }
        }
    }
    Ok(())
}

fn leftover_hint(name: &str) -> String {
    if name.contains("zram") {
        format!("`echo 1 > /sys/block/{ZRAM}/reset`")
    } else {
        format!("`rm {name}`")
    }
}

/// Remove `uswap-bench-<pid>-*` cgroups whose creator is gone and which
/// hold no task: left by a run killed with SIGKILL.
fn remove_stale_cgroups() {
    let Ok(entries) = fs::read_dir(MEMCG_ROOT) else {
        return;
    };
    for e in entries.flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        let Some(rest) = name.strip_prefix(CGROUP_PREFIX) else {
            continue;
        };
        let pid: Option<u32> = rest.split('-').next().and_then(|p| p.parse().ok());
        let alive = pid.is_some_and(|p| Path::new(&format!("/proc/{p}")).exists());
        let empty = fs::read_to_string(e.path().join("cgroup.procs")).is_ok_and(|s| s.trim().is_empty());
        if !alive && empty {
            let _ = fs::remove_dir(e.path());
        }
    }
}

fn read_trim(p: &Path) -> Result<String> {
    Ok(fs::read_to_string(p)
        .with_context(|| format!("reading {}", p.display()))?
        .trim()
        .to_string())
}

fn write_str(p: &Path, v: &str) -> Result<()> {
    fs::write(p, v).with_context(|| format!("writing {v:?} to {}", p.display()))
}

/// A memory cgroup, with a limit or without, removed on drop.
#[derive(Debug)]
pub struct MemCgroup {
    path: PathBuf,
}

impl MemCgroup {
    /// Create a cgroup whose memory (not counting swap) is limited to
    /// `budget` bytes (None: not limited, only measured).
    pub fn create(budget: impl Into<Option<u64>>) -> Result<MemCgroup> {
        let budget = budget.into();
        static SEQ: AtomicU32 = AtomicU32::new(0);
        let name = format!(
            "{CGROUP_PREFIX}{}-{}",
            std::process::id(),
            SEQ.fetch_add(1, Ordering::Relaxed)
        );
        let path = Path::new(MEMCG_ROOT).join(name);
        fs::create_dir(&path).with_context(|| format!("creating the memory cgroup {}", path.display()))?;
        let cg = MemCgroup { path };
        if let Some(b) = budget {
            write_str(&cg.path.join("memory.limit_in_bytes"), &b.to_string())?;
        }
        Ok(cg)
    }

    /// The group's anonymous memory now (`total_rss` of `memory.stat`:
    /// anonymous pages and the swap cache, its processes and its
    /// children's), in bytes; 0 when unreadable.
    pub fn anon_bytes(&self) -> u64 {
        self.stat("total_rss")
    }

    /// OOM kills in the group (`oom_kill` of `memory.oom_control`).
    pub fn oom_kills(&self) -> u64 {
        fs::read_to_string(self.path.join("memory.oom_control"))
            .ok()
            .and_then(|t| {
                t.lines()
                    .find_map(|l| l.strip_prefix("oom_kill "))
                    .and_then(|v| v.trim().parse().ok())
            })
            .unwrap_or(0)
    }

    fn stat(&self, key: &str) -> u64 {
        memory_stat(&self.path, key)
    }

    /// The cgroup's directory; a process joins by writing its pid to
    /// `cgroup.procs` in it.
    pub fn path(&self) -> &Path {
        &self.path
    }
}

/// `key`'s value in the memory cgroup `group`'s `memory.stat`; 0 when
/// unreadable.
pub fn memory_stat(group: &Path, key: &str) -> u64 {
    fs::read_to_string(group.join("memory.stat"))
        .ok()
        .and_then(|t| {
            t.lines()
                .find_map(|l| l.strip_prefix(key)?.strip_prefix(' ').map(str::to_string))
                .and_then(|v| v.trim().parse().ok())
        })
        .unwrap_or(0)
}

impl Drop for MemCgroup {
    fn drop(&mut self) {
        // The worker has been waited for, but what the program left
        // behind may still be in the group (a Python test's forkserver
        // and resource tracker, orphaned when regrtest's timeout ended
        // the worker): killed, as a cgroup's removal needs it empty.
        // rmdir can still see EBUSY for a moment while an exiting task is
        // being detached.  Its charges move to the parent: v1 allows
        // removing a cgroup that still has some.
        let deadline = Instant::now() + Duration::from_secs(5);
        let procs = self.path.join("cgroup.procs");
        while let Ok(text) = fs::read_to_string(&procs) {
            let pids: Vec<i32> = text.lines().filter_map(|l| l.trim().parse().ok()).collect();
            if pids.is_empty() || Instant::now() >= deadline {
                break;
            }
            for pid in pids {
                // SAFETY: a signal to a process of this group, which only
                // this benchmark's runs were put in.
                unsafe { libc::kill(pid, libc::SIGKILL) };
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        loop {
            match fs::remove_dir(&self.path) {
                Ok(()) => return,
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => return,
                Err(e) if Instant::now() >= deadline => {
                    eprintln!(
                        "warning: could not remove the memory cgroup {}: {e}; remove it with `rmdir {}`",
                        self.path.display(),
                        self.path.display()
                    );
                    return;
                }
                Err(_) => std::thread::sleep(Duration::from_millis(20)),
            }
        }
    }
}

/// The compressors zram0 offers, and the one it uses when none is set
/// (`comp_algorithm` reads `lzo [lzo-rle] lz4`: the bracketed one).
pub fn zram_algorithms() -> (Vec<String>, Option<String>) {
    let text =
        fs::read_to_string(Path::new("/sys/block").join(ZRAM).join("comp_algorithm")).unwrap_or_default();
    let mut current = None;
    let offered = text
        .split_whitespace()
        .map(|a| {
            let name = a.trim_matches(|c| c == '[' || c == ']').to_string();
            if a.starts_with('[') {
                current = Some(name.clone());
            }
            name
        })
        .collect();
    (offered, current)
}

/// The zram device's memory at its peak since it was set up
/// (`mem_used_max`, the fifth field of `mm_stat`), in bytes.
pub fn zram_peak_bytes() -> Option<u64> {
    let t = fs::read_to_string(Path::new("/sys/block").join(ZRAM).join("mm_stat")).ok()?;
    t.split_whitespace().nth(4)?.parse().ok()
}

/// A kernel swap device switched on for one run; switched off and torn
/// down on drop.
#[derive(Debug)]
pub struct KernelSwap {
    /// What swapon was given (the zram node or the swap file).
    path: PathBuf,
    swapped_on: bool,
    /// Set for zram: reset on teardown.
    zram: bool,
    /// Set for a swap file: deleted on teardown.
    created_file: bool,
    /// zswap's settings as they were, put back on teardown (after swapoff).
    zswap_was: Vec<(PathBuf, String)>,
}

impl KernelSwap {
    /// Set up `device` and switch it on.
    pub fn on(device: &KernelDevice) -> Result<KernelSwap> {
        let mut ks = match device {
            KernelDevice::Zram { bytes, algorithm } => {
                let dir = Path::new("/sys/block").join(ZRAM);
                let ks = KernelSwap {
                    path: Path::new("/dev").join(ZRAM),
                    swapped_on: false,
                    zram: true,
                    created_file: false,
                    zswap_was: Vec::new(),
                };
                // Reset first: the comp_algorithm and disksize can only be
                // set on an unconfigured device.  preflight saw it unused.
                write_str(&dir.join("reset"), "1")?;
                if let Some(a) = algorithm {
                    write_str(&dir.join("comp_algorithm"), a).with_context(|| {
                        format!(
                            "{ZRAM} does not offer the compressor {a:?}; it has: {}",
                            fs::read_to_string(dir.join("comp_algorithm"))
                                .unwrap_or_default()
                                .trim()
                        )
                    })?;
                }
                write_str(&dir.join("disksize"), &bytes.to_string())?;
                write_swap_header(&ks.path, *bytes, false)?;
                ks
            }
            KernelDevice::File { dir, bytes } | KernelDevice::Zswap { dir, bytes, .. } => {
                let mut ks = KernelSwap {
                    path: dir.join(SWAP_FILE_NAME),
                    swapped_on: false,
                    zram: false,
                    created_file: true,
                    zswap_was: Vec::new(),
                };
                if let KernelDevice::Zswap { zswap, .. } = device {
                    // Saved first, so that a failure half way restores
                    // what was changed.
                    for name in ["compressor", "max_pool_percent", "enabled"] {
                        let p = Path::new(ZSWAP_PARAMS).join(name);
                        ks.zswap_was.push((p.clone(), read_trim(&p)?));
                    }
                    let param = |name: &str| Path::new(ZSWAP_PARAMS).join(name);
                    if let Err(e) = write_str(&param("compressor"), &zswap.compressor) {
                        let offered: Vec<String> = fs::read_to_string("/proc/crypto")
                            .unwrap_or_default()
                            .lines()
                            .filter_map(|l| {
                                l.strip_prefix("name")?
                                    .split(':')
                                    .nth(1)
                                    .map(|n| n.trim().to_string())
                            })
                            .filter(|n| {
                                ["lz4", "lz4hc", "lzo", "lzo-rle", "zstd", "deflate", "842"]
                                    .contains(&n.as_str())
                            })
                            .collect();
                        bail!(
                            "zswap cannot use the compressor {:?} ({e:#}); this kernel's crypto API offers: {}; pass --zswap-compressor",
                            zswap.compressor,
                            offered.join(", ")
                        );
                    }
                    write_str(&param("max_pool_percent"), &zswap.max_pool_percent.to_string())?;
                    write_str(&param("enabled"), "Y")?;
                }
                write_swap_header(&ks.path, *bytes, true)?;
                ks
            }
        };
        let c = CString::new(ks.path.as_os_str().as_encoded_bytes()).context("swap path has a NUL byte")?;
        // SAFETY: `c` is a valid NUL-terminated path; flags 0 (no
        // priority, no discard).
        if unsafe { libc::swapon(c.as_ptr(), 0) } != 0 {
            let e = std::io::Error::last_os_error();
            let hint = if e.raw_os_error() == Some(libc::EINVAL) && !ks.zram {
                ": the file system may not support swap files (tmpfs, or btrfs without nocow); pass --swap-dir on ext4 or xfs"
            } else {
                ""
            };
            bail!("swapon {}: {e}{hint}", ks.path.display());
        }
        ks.swapped_on = true;
        Ok(ks)
    }
}

impl Drop for KernelSwap {
    fn drop(&mut self) {
        if self.swapped_on {
            let c = CString::new(self.path.as_os_str().as_encoded_bytes()).expect("checked at swapon");
            // SAFETY: as at swapon.
            if unsafe { libc::swapoff(c.as_ptr()) } != 0 {
                eprintln!(
                    "warning: swapoff {} failed: {}; run `swapoff {}`",
                    self.path.display(),
                    std::io::Error::last_os_error(),
                    self.path.display()
                );
                return;
            }
        }
        if self.zram {
            // The block device can stay busy for a moment after swapoff.
            let reset = Path::new("/sys/block").join(ZRAM).join("reset");
            let deadline = Instant::now() + Duration::from_secs(5);
            while let Err(e) = fs::write(&reset, "1") {
                if Instant::now() >= deadline {
                    eprintln!(
                        "warning: could not reset {ZRAM}: {e}; run `echo 1 > {}`",
                        reset.display()
                    );
                    break;
                }
                std::thread::sleep(Duration::from_millis(20));
            }
        }
        // zswap's settings back as they were (its pool is empty once
        // swapoff has read every page back).
        for (p, v) in self.zswap_was.iter().rev() {
            if let Err(e) = fs::write(p, v) {
                eprintln!(
                    "warning: could not put {v:?} back in {}: {e}; write it there by hand",
                    p.display()
                );
            }
        }
        if self.created_file {
            if let Err(e) = fs::remove_file(&self.path) {
                if e.kind() != std::io::ErrorKind::NotFound {
                    eprintln!("warning: could not remove {}: {e}", self.path.display());
                }
            }
        }
    }
}

/// Write a version-1 swap header (what mkswap writes) for `bytes` of swap
/// at the start of `path`; when `create`, make `path` a new file of that
/// size first, allocated (swapon refuses files with holes).
///
/// The header is `union swap_header` of include/linux/swap.h: after 1024
/// boot bytes, `version = 1`, `last_page`, `nr_badpages = 0`, then a UUID
/// and label (left zero), and the magic "SWAPSPACE2" in the last ten bytes
/// of the first page.
pub fn write_swap_header(path: &Path, bytes: u64, create: bool) -> Result<()> {
    let pages = bytes / PAGE as u64;
    if pages < 10 {
        bail!("a swap of {bytes} bytes is too small: give at least 40 KiB");
    }
    let last_page = u32::try_from(pages - 1).context("swap larger than 2^32 pages")?;
    let mut header = vec![0u8; PAGE];
    header[1024..1028].copy_from_slice(&1u32.to_ne_bytes());
    header[1028..1032].copy_from_slice(&last_page.to_ne_bytes());
    header[PAGE - 10..].copy_from_slice(b"SWAPSPACE2");
    let mut opts = fs::OpenOptions::new();
    opts.write(true);
    if create {
        opts.create_new(true).mode(0o600);
    }
    let mut f = opts
        .open(path)
        .with_context(|| format!("opening {} for the swap header", path.display()))?;
    if create {
        let len = (pages * PAGE as u64) as libc::off_t;
        // SAFETY: a valid open descriptor; allocates [0, len).
        let r = unsafe { libc::posix_fallocate(std::os::fd::AsRawFd::as_raw_fd(&f), 0, len) };
        if r != 0 {
            let e = std::io::Error::from_raw_os_error(r);
            let _ = fs::remove_file(path);
            bail!(
                "allocating {} bytes for the swap file {}: {e}",
                len,
                path.display()
            );
        }
    }
    f.write_all(&header)
        .and_then(|()| f.sync_all())
        .with_context(|| format!("writing the swap header to {}", path.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn swap_header_layout() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("s");
        write_swap_header(&p, 1 << 20, true).unwrap();
        let b = fs::read(&p).unwrap();
        assert_eq!(b.len(), 1 << 20);
        assert_eq!(&b[PAGE - 10..PAGE], b"SWAPSPACE2");
        assert_eq!(u32::from_ne_bytes(b[1024..1028].try_into().unwrap()), 1);
        assert_eq!(u32::from_ne_bytes(b[1028..1032].try_into().unwrap()), 255);
        assert!(b[1032..PAGE - 10].iter().all(|&x| x == 0));
        // It refuses to overwrite an existing file.
        assert!(write_swap_header(&p, 1 << 20, true).is_err());
        assert!(write_swap_header(&dir.path().join("t"), 4096, true)
            .unwrap_err()
            .to_string()
            .contains("too small"));
    }
}
