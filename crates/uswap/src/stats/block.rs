//! The statistics block: every number an instance keeps, in one mapping
//! that `uswap stat` can read from another process.
//!
//! Layout: a [`Head`] (who the instance is, its gauges, its pressure
//! clock, its recent events) and then one [`Shard`] per CPU (its
//! counters, lock sites and fault latency histogram).  CPU-major, so a
//! CPU's counters are contiguous and two CPUs never write one cache line:
//! the whole of an instance's statistics on two CPUs is 4.2 KiB (two
//! pages mapped), where a padded line (128 bytes) per counter and lock
//! site per CPU was 22 KiB.
//!
//! Every word is an atomic, written with relaxed stores and adds by the
//! pager and read with relaxed loads by anyone: the reader takes no lock
//! the pager takes and the pager never waits for a reader (crosvm's
//! lesson: a status query must never stall paging).  A reader sees each
//! word whole; counters read while they move are each exact at some
//! instant, not all at one.
//!
//! The mapping is a file in the user's directory (`live.rs`) when the
//! instance publishes, else anonymous memory: the pager's code is the
//! same either way.  A forked child gets a block of its own (its own
//! file, at the same address, `reopen_here`), with its counters from
//! zero and its levels as they were: a tree's rows add up.

use std::fs::File;
use std::io;
use std::os::fd::AsFd;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicI32, AtomicI64, AtomicU64, Ordering};
use std::sync::Mutex;

use rustix::mm::{self, MapFlags, ProtFlags};

use super::snapshot::{
    DeviceLevel, Event, Events, Latency, Pressure, PressureLine, Stats, EVENT_RING, LATENCY_BUCKETS,
};
use super::table::{layout_hash, Counters, EventKind, Gauges, LockStats, Locks};

pub(super) const MAGIC: u64 = u64::from_le_bytes(*b"uswapst1");
/// Bytes of the command line kept.
pub const COMMAND_BYTES: usize = 128;
/// Swap devices whose levels are kept.
pub const MAX_DEVICES: usize = 8;
/// CPUs with a shard of their own at most: more share by CPU number.
const MAX_SHARDS: usize = 256;

/// A stall clock word: threads stalled now (top 16 bits) and when the
/// first of them began (microseconds of CLOCK_MONOTONIC, low 48 bits:
/// nine years of uptime).
pub(super) const STALL_SHIFT: u32 = 48;
pub(super) const STALL_MASK: u64 = (1 << STALL_SHIFT) - 1;

#[repr(C)]
pub(crate) struct EventSlot {
    /// `2i + 1` while event `i` is written, `2i + 2` once it is.
    seq: AtomicU64,
    unix_ns: AtomicU64,
    kind: AtomicU64,
    value: AtomicU64,
}

/// Who the instance is, its levels, its pressure clock and its events.
#[repr(C, align(64))]
pub(crate) struct Head {
    /// Set last, when the rest is written: a reader skips a block
    /// without it.
    pub(super) magic: AtomicU64,
    pub(super) layout: AtomicU64,
    pub(super) shards: AtomicU64,
    pub(super) len: AtomicU64,
    pub(super) pid: AtomicU64,
    pub(super) parent: AtomicU64,
    /// The process's start time (`/proc/PID/stat`'s 22nd field): a pid
    /// reused by another process is not this one.
    pub(super) start: AtomicU64,
    /// The process tree's supervisor (`uswap run`), 0 for none.
    pub(super) group: AtomicU64,
    pub(super) born_unix_ns: AtomicU64,
    /// 0 handler threads, 1 SIGBUS, 2 SIGBUS for user-mode faults only.
    pub(super) mode: AtomicU64,
    pub(super) command: [AtomicU64; COMMAND_BYTES / 8],
    /// PSI "some": threads stalled in uswap now, and since when.
    pub(super) some: AtomicU64,
    /// PSI "full": 1 << 48 | since, while every thread is stalled.
    pub(super) full: AtomicU64,
    /// Averages of the stalled share of wall time, as f64 bits: some
    /// over 10, 60 and 300 s, then full.
    pub(super) avg: [AtomicU64; 6],
    pub(super) events_head: AtomicU64,
    pub(super) event_counts: [AtomicU64; EventKind::ALL.len()],
    pub(super) events: [EventSlot; EVENT_RING],
    pub(super) gauges: [AtomicI64; Gauges::LEN],
    /// Per swap device: its kind (1 ram, 2 file, 3 compressed; 0 none),
    /// its slots, and those in use.
    pub(super) devices: [[AtomicU64; 3]; MAX_DEVICES],
    /// When a thread of each bucket of thread ids (`tid % 64`) last
    /// began to wait in uswap, in microseconds of CLOCK_MONOTONIC: the
    /// threads that touch swapped memory, PSI's non-idle tasks for
    /// "full".  Not /proc/self/task: reading it from the reclaimer would
    /// open descriptors at the program's lowest free numbers, under it.
    pub(super) active: [AtomicU64; ACTIVE_BUCKETS],
    /// The pid of a reader (`uswap gdb`, `uswap gcore`) that asks the
    /// process to bring its memory in and keep it there while it lives;
    /// 0 for none.  Written by the reader, read by the reclaimer.
    pub(super) hold_by: AtomicU64,
    /// The pid whose request the process has met (its memory is in and
    /// held), 0 for none.  Written by the process.
    pub(super) held_for: AtomicU64,
}

/// Buckets of thread ids for [`Head::active`].
pub(super) const ACTIVE_BUCKETS: usize = 64;

/// One CPU's counters, lock sites and latency buckets.
#[repr(C, align(64))]
pub(crate) struct Shard {
    counters: [AtomicU64; Counters::LEN],
    /// Acquisitions, contended, wait_ns.
    locks: [[AtomicU64; 3]; Locks::LEN],
    latency: [AtomicU64; LATENCY_BUCKETS],
}

/// Who an instance is, as its block says.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct Identity {
    /// Its process.
    pub pid: i32,
    /// That process's parent.
    pub parent: i32,
    /// The supervisor of its tree (`uswap run`), 0 when alone.
    pub group: i32,
    /// The process's start time, in clock ticks since boot.
    pub start: u64,
    /// When the instance began (or its process forked), ns since the epoch.
    pub born_unix_ns: u64,
    /// "handler", "sigbus" or "sigbus-user".
    pub mode: &'static str,
    /// Its command line (cut at 128 bytes).
    pub command: String,
}

/// The identity fields an instance writes into its block at start.
#[derive(Clone, Debug, Default)]
pub struct Label {
    /// The supervisor of its tree, 0 when alone.
    pub group: i32,
    /// 0 handler threads, 1 SIGBUS, 2 SIGBUS for user-mode faults only.
    pub mode: u64,
}

/// A CLOCK_MONOTONIC reading, in microseconds (async-signal-safe: the vDSO).
#[inline]
pub(crate) fn monotonic_us() -> u64 {
    crate::sys::monotonic_ns() / 1000
}

use crate::sys::realtime_ns;

fn shard_count() -> usize {
    crate::percpu::possible_cpus().next_power_of_two().min(MAX_SHARDS)
}

pub(super) fn block_len(shards: usize) -> usize {
    let raw = std::mem::size_of::<Head>() + shards * std::mem::size_of::<Shard>();
    raw.next_multiple_of(crate::PAGE_SIZE)
}

/// The block's memory and, when published, its file.
pub(crate) struct Block {
    pub(super) addr: *mut u8,
    pub(super) len: usize,
    pub(super) shards: usize,
    /// The file it is published as, and the directory, or None.  Taken
    /// only to publish, to unpublish and in a forked child.
    pub(super) file: Mutex<Option<(PathBuf, PathBuf)>>,
    /// The process that made (or reopened) the block: only it unlinks.
    pub(super) owner: AtomicI32,
    /// Totals at the last pressure average, and when (the updater's own).
    pub(super) last_avg: Mutex<(u64, u64, u64)>,
}

// SAFETY: the block's memory is atomics only, shared by design; the
// pointer is to a mapping the block owns for its life.
unsafe impl Send for Block {}
// SAFETY: as above.
unsafe impl Sync for Block {}

impl Block {
    /// The pid of the reader asking for the memory to be held in, 0 for
    /// none.
    pub(crate) fn hold_asked(&self) -> i32 {
        self.head().hold_by.load(Ordering::Acquire) as i32
    }

    /// Say the memory is in and held for reader `pid` (0: let go).
    pub(crate) fn set_held_for(&self, pid: i32) {
        self.head().held_for.store(pid as u32 as u64, Ordering::Release);
    }

    /// A block in anonymous memory (private: a forked child has a copy).
    pub(crate) fn anonymous() -> io::Result<Block> {
        let shards = shard_count();
        let len = block_len(shards);
        let p = map_private(len)?;
        crate::sys::remember_memory(p as u64, len as u64);
        let b = Block::at(p.cast(), len, shards);
        b.stamp(&Label::default());
        Ok(b)
    }

    /// A block published as a new file in `dir` (mode 0600), named for
    /// this process: `PID-N.stats`, N counting the instances this image
    /// made.  A file of that name left by an earlier image of this pid
    /// (before an `exec`) or by a dead process is replaced.
    pub(crate) fn published(dir: &Path, label: &Label) -> io::Result<Block> {
        let shards = shard_count();
        let len = block_len(shards);
        let (file, path) = create_file(dir, len)?;
        let p = map_shared(&file, len, None)?;
        let b = Block::at(p, len, shards);
        *b.file.lock().unwrap_or_else(|e| e.into_inner()) = Some((path, dir.to_path_buf()));
        b.stamp(label);
        Ok(b)
    }

    pub(super) fn at(addr: *mut u8, len: usize, shards: usize) -> Block {
        Block {
            addr,
            len,
            shards,
            file: Mutex::new(None),
            // SAFETY: getpid has no preconditions.
            owner: AtomicI32::new(unsafe { libc::getpid() }),
            last_avg: Mutex::new((0, 0, monotonic_us())),
        }
    }

    /// Write who this process is, and the magic last.
    fn stamp(&self, label: &Label) {
        let h = self.head();
        // SAFETY: getpid and getppid have no preconditions.
        let (pid, parent) = unsafe { (libc::getpid(), libc::getppid()) };
        h.layout.store(layout_hash(), Ordering::Relaxed);
        h.shards.store(self.shards as u64, Ordering::Relaxed);
        h.len.store(self.len as u64, Ordering::Relaxed);
        h.pid.store(pid as u64, Ordering::Relaxed);
        h.parent.store(parent as u64, Ordering::Relaxed);
        h.start
            .store(crate::sys::start_time(pid).map_or(0, |s| s.0), Ordering::Relaxed);
        h.group.store(label.group as u64, Ordering::Relaxed);
        h.mode.store(label.mode, Ordering::Relaxed);
        h.born_unix_ns.store(realtime_ns(), Ordering::Relaxed);
        let mut cmd = [0u8; COMMAND_BYTES];
        read_command(pid, &mut cmd);
        for (w, chunk) in h.command.iter().zip(cmd.chunks_exact(8)) {
            w.store(
                u64::from_ne_bytes(chunk.try_into().expect("8 bytes")),
                Ordering::Relaxed,
            );
        }
        h.magic.store(MAGIC, Ordering::Release);
    }

    /// Say which mode the instance serves faults in, and its group.
    pub(crate) fn label(&self, label: &Label) {
        let h = self.head();
        h.group.store(label.group as u64, Ordering::Relaxed);
        h.mode.store(label.mode, Ordering::Relaxed);
    }

    #[inline]
    pub(crate) fn head(&self) -> &Head {
        // SAFETY: the mapping starts with a Head (page-aligned, at least
        // `len` long) and lives as long as `self`; all-zero bytes, or any a
        // writer left, are valid atomics.
        unsafe { &*(self.addr as *const Head) }
    }

    pub(crate) fn shard(&self, i: usize) -> &Shard {
        debug_assert!(i < self.shards);
        // SAFETY: shard `i < shards` lies within the mapping, after the
        // head, aligned (both are multiples of 64 bytes).
        unsafe { &*(self.addr.add(std::mem::size_of::<Head>()) as *const Shard).add(i) }
    }

    /// The shard of the calling thread's CPU.
    #[inline]
    pub(crate) fn here(&self) -> &Shard {
        self.shard(crate::percpu::current_cpu() & (self.shards - 1))
    }

    #[inline]
    pub(crate) fn count(&self, idx: u16, n: u64) {
        self.here().counters[idx as usize].fetch_add(n, Ordering::Relaxed);
    }

    #[inline]
    pub(crate) fn gauge(&self, idx: u16) -> &AtomicI64 {
        &self.head().gauges[idx as usize]
    }

    #[inline]
    pub(crate) fn lock_acquired(&self, idx: u16, waited_ns: Option<u64>) {
        let l = &self.here().locks[idx as usize];
        l[0].fetch_add(1, Ordering::Relaxed);
        if let Some(ns) = waited_ns {
            l[1].fetch_add(1, Ordering::Relaxed);
            l[2].fetch_add(ns, Ordering::Relaxed);
        }
    }

    #[inline]
    pub(crate) fn counter_total(&self, idx: u16) -> u64 {
        (0..self.shards)
            .map(|i| self.shard(i).counters[idx as usize].load(Ordering::Relaxed))
            .sum()
    }

    pub(crate) fn lock_total(&self, idx: u16) -> LockStats {
        let mut t = LockStats::default();
        for i in 0..self.shards {
            let l = &self.shard(i).locks[idx as usize];
            t.acquisitions += l[0].load(Ordering::Relaxed);
            t.contended += l[1].load(Ordering::Relaxed);
            t.wait_ns += l[2].load(Ordering::Relaxed);
        }
        t
    }

    /// A fault served in `ns`: its latency bucket.
    #[inline]
    pub(crate) fn latency(&self, ns: u64) {
        let b = ((64 - ns.leading_zeros()) as usize).min(LATENCY_BUCKETS - 1);
        self.here().latency[b].fetch_add(1, Ordering::Relaxed);
    }

    /// Set device `i`'s levels: its kind (1 ram, 2 file, 3 compressed),
    /// slots and slots in use.
    pub(crate) fn device(&self, i: usize, kind: u64, total: u64, used: u64) {
        if let Some(d) = self.head().devices.get(i) {
            d[0].store(kind, Ordering::Relaxed);
            d[1].store(total, Ordering::Relaxed);
            d[2].store(used, Ordering::Relaxed);
        }
    }

    /// Note an event: its count, and its place in the ring of recent ones.
    /// Async-signal-safe.
    pub(crate) fn event(&self, kind: EventKind, value: u64) {
        let h = self.head();
        h.event_counts[kind as usize].fetch_add(1, Ordering::Relaxed);
        let i = h.events_head.fetch_add(1, Ordering::AcqRel);
        let slot = &h.events[(i % EVENT_RING as u64) as usize];
        slot.seq.store(2 * i + 1, Ordering::Release);
        slot.unix_ns.store(realtime_ns(), Ordering::Relaxed);
        slot.kind.store(kind as u64, Ordering::Relaxed);
        slot.value.store(value, Ordering::Relaxed);
        slot.seq.store(2 * i + 2, Ordering::Release);
    }

    /// Everything, read now.
    pub(crate) fn snapshot(&self, some_id: u16, full_id: u16) -> Stats {
        let mut c = [0u64; Counters::LEN];
        let mut l = [LockStats::default(); Locks::LEN];
        let mut lat = [0u64; LATENCY_BUCKETS];
        for i in 0..self.shards {
            let s = self.shard(i);
            for (t, w) in c.iter_mut().zip(&s.counters) {
                *t += w.load(Ordering::Relaxed);
            }
            for (t, w) in l.iter_mut().zip(&s.locks) {
                t.acquisitions += w[0].load(Ordering::Relaxed);
                t.contended += w[1].load(Ordering::Relaxed);
                t.wait_ns += w[2].load(Ordering::Relaxed);
            }
            for (t, w) in lat.iter_mut().zip(&s.latency) {
                *t += w.load(Ordering::Relaxed);
            }
        }
        let h = self.head();
        let mut g = [0u64; Gauges::LEN];
        for (t, w) in g.iter_mut().zip(&h.gauges) {
            *t = w.load(Ordering::Relaxed).max(0) as u64;
        }
        let (some, full) = self.stall_totals(some_id, full_id);
        // The open stall is in the totals; the counters keep closed ones.
        c[some_id as usize] = some;
        c[full_id as usize] = full;
        let avg = |i: usize| f64::from_bits(h.avg[i].load(Ordering::Relaxed)) * 100.0;
        let line = |k: usize, total_ns: u64| PressureLine {
            avg10: avg(k * 3),
            avg60: avg(k * 3 + 1),
            avg300: avg(k * 3 + 2),
            total_us: total_ns / 1000,
        };
        Stats {
            counters: Counters::from_words(&c),
            gauges: Gauges::from_words(&g),
            locks: Locks::from_sites(&l),
            fault_latency: Latency { buckets: lat },
            pressure: Pressure {
                some: line(0, some),
                full: line(1, full),
            },
            events: self.events(),
            devices: h
                .devices
                .iter()
                .filter(|d| d[0].load(Ordering::Relaxed) != 0)
                .map(|d| DeviceLevel {
                    kind: match d[0].load(Ordering::Relaxed) {
                        1 => "ram",
                        2 => "file",
                        4 => "nbd",
                        _ => "compressed",
                    },
                    slots: d[1].load(Ordering::Relaxed),
                    used: d[2].load(Ordering::Relaxed),
                })
                .collect(),
        }
    }

    fn events(&self) -> Events {
        let h = self.head();
        let counts = EventKind::ALL
            .iter()
            .map(|k| (*k, h.event_counts[*k as usize].load(Ordering::Relaxed)))
            .collect();
        let end = h.events_head.load(Ordering::Acquire);
        let mut recent = Vec::new();
        for i in end.saturating_sub(EVENT_RING as u64)..end {
            let slot = &h.events[(i % EVENT_RING as u64) as usize];
            let seq = slot.seq.load(Ordering::Acquire);
            let (unix_ns, kind, value) = (
                slot.unix_ns.load(Ordering::Relaxed),
                slot.kind.load(Ordering::Relaxed),
                slot.value.load(Ordering::Relaxed),
            );
            // Written whole, and not overwritten by a later event since.
            if seq != 2 * i + 2 || slot.seq.load(Ordering::Acquire) != seq {
                continue;
            }
            if let Some(kind) = EventKind::from_u8(kind as u8) {
                recent.push(Event { kind, unix_ns, value });
            }
        }
        Events { counts, recent }
    }

    /// Who the block says it is.
    pub(crate) fn identity(&self) -> Identity {
        let h = self.head();
        let mut cmd = Vec::with_capacity(COMMAND_BYTES);
        for w in &h.command {
            cmd.extend_from_slice(&w.load(Ordering::Relaxed).to_ne_bytes());
        }
        let end = cmd.iter().position(|&b| b == 0).unwrap_or(cmd.len());
        Identity {
            pid: h.pid.load(Ordering::Relaxed) as i32,
            parent: h.parent.load(Ordering::Relaxed) as i32,
            group: h.group.load(Ordering::Relaxed) as i32,
            start: h.start.load(Ordering::Relaxed),
            born_unix_ns: h.born_unix_ns.load(Ordering::Relaxed),
            mode: match h.mode.load(Ordering::Relaxed) {
                0 => "handler",
                1 => "sigbus",
                _ => "sigbus-user",
            },
            command: String::from_utf8_lossy(&cmd[..end]).into_owned(),
        }
    }

    /// The file this block is published as, if it is.
    pub(crate) fn path(&self) -> Option<PathBuf> {
        self.file
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .as_ref()
            .map(|(p, _)| p.clone())
    }

    /// In a forked child: a block of its own, at the same address (the
    /// handles the pager holds point into it), with its levels as they
    /// were and its counters, lock sites, latency, stall clock and events
    /// from zero.  Published: a new file for this pid, mapped over the
    /// inherited one; if that fails the child keeps a private copy, and
    /// says nothing (its parent's file stays its parent's).  Called with
    /// the child's one thread.
    pub(crate) fn reopen_here(&self) {
        // SAFETY: getpid has no preconditions.
        let pid = unsafe { libc::getpid() };
        // Not waited for: held by a thread of the parent's at the fork
        // (a `published_path` call), it stays held here, where that
        // thread does not exist.  The child then keeps a private copy.
        let mut held = self.file.try_lock();
        let dir = match held.as_deref_mut() {
            Ok(f) => f.take().map(|(_, d)| d),
            Err(_) => {
                let _ = self.privatize();
                None
            }
        };
        if let Some(dir) = dir {
            // A private copy first: the inherited mapping is the parent's
            // file, which the child must not write.
            if self.privatize().is_err() {
                return;
            }
            if let Ok((f, path)) = create_file(&dir, self.len) {
                let moved = map_shared(&f, self.len, None).and_then(|p| self.move_over(p));
                if moved.is_ok() {
                    if let Ok(f) = held.as_deref_mut() {
                        *f = Some((path, dir));
                    }
                } else {
                    let _ = std::fs::remove_file(&path);
                }
            }
        }
        drop(held);
        self.owner.store(pid, Ordering::Relaxed);
        for i in 0..self.shards {
            let s = self.shard(i);
            s.counters.iter().for_each(|w| w.store(0, Ordering::Relaxed));
            s.locks
                .iter()
                .flatten()
                .for_each(|w| w.store(0, Ordering::Relaxed));
            s.latency.iter().for_each(|w| w.store(0, Ordering::Relaxed));
        }
        let h = self.head();
        h.some.store(0, Ordering::Relaxed);
        h.full.store(0, Ordering::Relaxed);
        h.avg.iter().for_each(|w| w.store(0, Ordering::Relaxed));
        h.events_head.store(0, Ordering::Relaxed);
        h.event_counts.iter().for_each(|w| w.store(0, Ordering::Relaxed));
        h.events.iter().for_each(|e| e.seq.store(0, Ordering::Relaxed));
        h.active.iter().for_each(|t| t.store(0, Ordering::Relaxed));
        if let Ok(mut last) = self.last_avg.try_lock() {
            *last = (0, 0, monotonic_us());
        }
        let label = Label {
            group: h.group.load(Ordering::Relaxed) as i32,
            mode: h.mode.load(Ordering::Relaxed),
        };
        self.stamp(&label);
    }

    /// Replace the mapping with a private anonymous copy of itself.
    fn privatize(&self) -> io::Result<()> {
        self.move_over(map_private(self.len)?)
    }

    /// Copy the block into `p`, a fresh mapping of `len` bytes of ours,
    /// and move that mapping over the block's address (`MREMAP_FIXED`
    /// replaces the old one in one step): every handle stays valid.  On
    /// failure `p` is unmapped and the block is as it was.
    fn move_over(&self, p: *mut u8) -> io::Result<()> {
        // SAFETY: both mappings are `len` bytes and ours; `p` is fresh,
        // and is moved over our own block's address.
        let moved = unsafe {
            std::ptr::copy_nonoverlapping(self.addr, p, self.len);
            mm::mremap_fixed(
                p.cast(),
                self.len,
                self.len,
                mm::MremapFlags::MAYMOVE,
                self.addr.cast(),
            )
        };
        if let Err(e) = moved {
            // SAFETY: the fresh mapping, not moved.
            let _ = unsafe { mm::munmap(p.cast(), self.len) };
            return Err(e.into());
        }
        Ok(())
    }

    /// Remove the published file (the process is leaving); the memory
    /// stays until the block drops.
    pub(crate) fn unpublish(&self) {
        // SAFETY: getpid has no preconditions.
        if self.owner.load(Ordering::Relaxed) != unsafe { libc::getpid() } {
            return;
        }
        if let Some((path, _)) = self.file.lock().unwrap_or_else(|e| e.into_inner()).take() {
            let _ = std::fs::remove_file(path);
        }
    }
}

impl Drop for Block {
    fn drop(&mut self) {
        self.unpublish();
        crate::sys::forget_memory(self.addr as u64);
        // SAFETY: our own mapping; every handle into it held an Arc to us.
        let _ = unsafe { mm::munmap(self.addr.cast(), self.len) };
    }
}

/// Instances this image has published: the N of `PID-N.stats`.
static SERIAL: AtomicU64 = AtomicU64::new(0);

/// Make this process's next block file in `dir`, `len` bytes of zeros.
fn create_file(dir: &Path, len: usize) -> io::Result<(File, PathBuf)> {
    use std::os::unix::fs::OpenOptionsExt;
    // SAFETY: getpid has no preconditions.
    let pid = unsafe { libc::getpid() };
    super::live::forget_earlier_images(dir, pid);
    let n = SERIAL.fetch_add(1, Ordering::Relaxed);
    let path = dir.join(format!("{pid}-{n}.stats"));
    let open = || {
        std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .mode(0o600)
            .custom_flags(libc::O_CLOEXEC | libc::O_NOFOLLOW)
            .open(&path)
    };
    let file = match open() {
        Ok(f) => f,
        // Left by an image of this pid before an `exec` (its serials
        // began at 0 too) or a process long dead: not a live one's,
        // as a live process has another pid.
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {
            std::fs::remove_file(&path)?;
            open()?
        }
        Err(e) => return Err(e),
    };
    file.set_len(len as u64)?;
    Ok((file, path))
}

/// `len` bytes of fresh private anonymous memory.
fn map_private(len: usize) -> io::Result<*mut u8> {
    // SAFETY: a fresh mapping at an address of the kernel's choosing.
    let p = unsafe {
        mm::mmap_anonymous(
            std::ptr::null_mut(),
            len,
            ProtFlags::READ | ProtFlags::WRITE,
            MapFlags::PRIVATE,
        )
    }?;
    Ok(p.cast())
}

pub(super) fn map_shared(file: &File, len: usize, prot_read_only: Option<()>) -> io::Result<*mut u8> {
    let prot = match prot_read_only {
        Some(()) => ProtFlags::READ,
        None => ProtFlags::READ | ProtFlags::WRITE,
    };
    // SAFETY: a fresh mapping of our file at an address of the kernel's
    // choosing.
    let p = unsafe { mm::mmap(std::ptr::null_mut(), len, prot, MapFlags::SHARED, file.as_fd(), 0) }?;
    Ok(p.cast())
}

/// The process's command line, NULs between arguments made spaces, into
/// `out` (cut, NUL-padded).
fn read_command(pid: i32, out: &mut [u8; COMMAND_BYTES]) {
    let Ok(raw) = std::fs::read(format!("/proc/{pid}/cmdline")) else {
        return;
    };
    let n = raw.len().min(COMMAND_BYTES - 1);
    for (o, &b) in out.iter_mut().zip(&raw[..n]) {
        *o = if b == 0 { b' ' } else { b };
    }
    let end = out[..n].iter().rposition(|&b| b != b' ').map_or(0, |i| i + 1);
    out[end..].iter_mut().for_each(|b| *b = 0);
}

impl Block {
    /// Stalled time so far, an open stall included: (some, full) in ns.
    pub(super) fn stall_totals(&self, some_id: u16, full_id: u16) -> (u64, u64) {
        let h = self.head();
        let now = monotonic_us() & STALL_MASK;
        let open = |w: u64| {
            if w >> STALL_SHIFT == 0 {
                0
            } else {
                now.saturating_sub(w & STALL_MASK) * 1000
            }
        };
        let some = self.counter_total(some_id) + open(h.some.load(Ordering::Relaxed));
        let full = self.counter_total(full_id) + open(h.full.load(Ordering::Relaxed));
        (some, full)
    }
}
