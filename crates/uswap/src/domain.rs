//! A budget domain: one memory budget over a tree of processes, each paged
//! by an instance of its own.
//!
//! A memory cgroup holds every process of a tree under one limit, whatever
//! each does.  `uswap run` does the same with a domain.  Its supervisor
//! (`uswap run` itself, the program's parent) creates it: a small shared
//! memory file (a memfd) holding the budget and a slot per member.  Every
//! process of the tree that pages (every image that loads the preload
//! library) joins it, opening the memfd through `/proc/<supervisor>/fd/<n>`,
//! which the environment names ([`crate::run_env::DOMAIN`]); a forked child
//! takes a slot of its own.  A member's instance publishes what it holds
//! (its resident pages, how many faults it has served) from its background
//! reclaimer, every millisecond, and reads back its share: the resident
//! pages it may hold, which becomes its instance's budget
//! (`Budget::share`).
//!
//! The supervisor's [`Arbiter`] divides the budget, every couple of
//! milliseconds, from what the members hold: each member is charged its
//! resident pages and its other anonymous memory (uswap's own tables and
//! frames, a compressed store, what the program maps outside the heap:
//! `/proc/PID/statm`), so that the budget holds the tree's anonymous
//! memory as a cgroup's limit would.  While the members hold less than the
//! budget, each may grow by what is left ([`shares`]).  Past it, the
//! budget is water-filled: a level such that the members charged under it
//! keep what they hold and those over it are cut to it, so reclaim falls
//! on the members furthest over an even share; a member that has taken no
//! fault for a second (its pages are the tree's coldest) counts an eighth
//! of an active one.  A member over its share reclaims its own pages in
//! its own process, as it does under its own budget: no fault waits on
//! another process, and no process ever touches another's memory.
//! The budget is kept within a tick of the arbiter: between two ticks the
//! members may together grow past it by what they fault in.
//!
//! The budget is a promise here too, as a cgroup's limit is, for what
//! uswap keeps in memory by its own choice: a compressed store charged to
//! the budget whose pages do not compress enough to fit.  When the
//! members' stores alone hold more than the budget, its overrun and a
//! fixed overhead ([`OOM_SLACK`]) for [`OOM_AFTER`] on end, no reclaim
//! can bring the tree back, and the arbiter names the member whose store
//! is largest, and the supervisor kills it, as a memory cgroup would kill
//! a task of a group whose zswap pool cannot fit.  The rest of what a
//! member holds besides its resident pages (each process's memory outside
//! its heap: an interpreter's data, thread stacks, uswap's own tables;
//! memory mapped where uswap does not page) is charged too, so the shares
//! leave room for it, but it never kills: it is what every process costs,
//! and a kill takes nothing back that the next process does not pay
//! again.  Past the bound it is said once ([`Arbiter::take_unpaged`]).
//! Resident pages a member cannot evict are uswap's limit, not the
//! program's overrun (the dirty pages of a forked child that may not
//! write its parent's swap file): they never count toward the bound.
//!
//! Members leave at their end: the arbiter finds a slot whose process is
//! gone (or a zombie, or another process under a reused pid: the slot
//! holds the process's start time) and frees it.  An image that `exec`s
//! takes a new slot; the old image's, under the same pid, is freed first.

use std::fs::{File, OpenOptions};
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::fs::OpenOptionsExt;
use std::sync::atomic::{AtomicI32, AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use crate::sys::{start_time, SharedMapping};
use crate::PAGE_SIZE;

/// Members at once at most: more than a tree runs at a time (`make -j`
/// of a few dozen jobs runs a few hundred processes at most).
pub const SLOTS: usize = 1024;
/// A member's share is never cut below this many pages (1 MiB): room for
/// an eviction batch to go out while the next faults come in.
pub const MIN_SHARE: u64 = 256;
/// A member that took no fault for this long is idle: its pages are the
/// coldest in the tree.
pub const IDLE_AFTER: Duration = Duration::from_secs(1);
/// An active member's weight in the water-filling; an idle one's is 1.
const ACTIVE_WEIGHT: u64 = 8;
/// How often the arbiter reads the members' other memory from /proc and
/// looks for members that are gone.
const LOOK_EVERY: Duration = Duration::from_millis(50);

/// A member that took a fault this lately reclaims at its faults
/// (`Demand::faulting`).
const FAULTING_WITHIN: Duration = Duration::from_millis(100);

/// What the tree may hold past its budget and overrun before the arbiter
/// calls it out of memory: the members' fixed costs (uswap's tables and
/// frames in each process, a few hundred KiB a member) and what faults bring
/// in between two ticks; the bound the tests hold the tree to
/// (docs/DESIGN.md, "The process tree").
pub const OOM_SLACK: u64 = (16 << 20) / PAGE_SIZE as u64;
/// How often, at most, the arbiter reads every member's `smaps` to
/// confirm memory past the bound: read every tick, a dozen Python
/// processes' took the supervisor a CPU of this machine's two.
const CONFIRM_EVERY: Duration = Duration::from_secs(1);
/// How long the tree must stay past that bound: longer than a burst of
/// faults between the members' reclaim passes, or a member's memory read
/// from /proc before it let go of it.
pub const OOM_AFTER: Duration = Duration::from_secs(2);

const MAGIC: u64 = u64::from_le_bytes(*b"uswapdm1");

#[repr(C, align(64))]
struct Header {
    magic: AtomicU64,
    /// The budget, in pages.
    budget: AtomicU64,
    /// The last claim's number (see `Slot::claim`).
    claims: AtomicU64,
    /// What the members the arbiter has not seen yet may hold between
    /// them (0: the whole budget, before the arbiter's first look): the
    /// newcomers' part of the room the tree leaves ([`shares`]).  Each
    /// takes half of what is left of it ([`Member::share`]).  A process
    /// just started (a compiler `make` runs, a spawned pool worker) took
    /// the whole budget until its first share, a tenth of a second of
    /// allocation past the tree's bound; then each took the whole room,
    /// and two pool workers spawned together held it twice (60 MiB of a
    /// 40 MiB tree, whose bound is 60).
    newcomer: AtomicU64,
    /// Bumped at each change of the budget from outside (`uswap ctl`): a
    /// member that takes no fault and runs no reclaimer (an idle one, in
    /// SIGBUS mode) looks at it from its allocations, one load
    /// ([`budget_changed`]), and starts its reclaimer to follow.
    generation: AtomicU64,
    /// How long the pages a cut of a member's share takes dwell on
    /// probation before they are written, in milliseconds (0: none, a
    /// cut is followed at once): `--budget auto`'s interval while its
    /// controller drives the budget (`Budget`'s probation).
    dwell_ms: AtomicU64,
}

/// The `generation` word of the first domain this process joined, in a
/// mapping of the domain's first page of its own that is never unmapped
/// (so that a load from `malloc` can never meet an unmapped page, whatever
/// becomes of the member); null before a join.  A forked child inherits
/// the mapping and the word.
static GENERATION: std::sync::atomic::AtomicPtr<AtomicU64> = std::sync::atomic::AtomicPtr::new(std::ptr::null_mut());
/// The generation this process last acted on.
static SEEN: AtomicU64 = AtomicU64::new(0);

/// Whether the domain's budget was changed from outside since the last
/// call that returned true: one load while it was not.  Allocation-free
/// and lock-free (called from `uswap run`'s `malloc`).
pub fn budget_changed() -> bool {
    let p = GENERATION.load(Ordering::Acquire);
    if p.is_null() {
        return false;
    }
    // SAFETY: `p` points into a mapping that is never unmapped (`join`).
    let g = unsafe { &*p }.load(Ordering::Relaxed);
    SEEN.load(Ordering::Relaxed) != g && SEEN.swap(g, Ordering::Relaxed) != g
}

/// One member.  `pid` is the slot's lock: a process takes a free slot by
/// setting it from 0, fills the rest, and sets `start` last; the slot is
/// freed in the other order.  A reader (the arbiter) skips a slot whose
/// `start` is 0: being taken or freed.
#[repr(C, align(64))]
struct Slot {
    pid: AtomicI32,
    /// The process's start time (`/proc/PID/stat`'s 22nd field, clock
    /// ticks since boot): the pid reused by another process is not it.
    start: AtomicU64,
    /// Resident pages of its instance (staged ones included): published.
    resident: AtomicU64,
    /// Faults its instance has served: published.
    faults: AtomicU64,
    /// Its share, in pages; 0 until the arbiter gives one (the instance
    /// keeps its own budget meanwhile).  Written by the arbiter.
    limit: AtomicU64,
    /// Its anonymous memory outside its instance's resident pages, in
    /// pages, at the arbiter's last look.  Written by the arbiter.
    other: AtomicU64,
    /// Pages its RAM devices hold: published, and not charged (a RAM
    /// device saves no memory; it is there to measure the pager, and
    /// charging it would only squeeze the pages it cannot save).
    ram: AtomicU64,
    /// Pages its compressed stores hold: published; charged unless the
    /// arbiter leaves stores outside the budget
    /// ([`Arbiter::store_outside`]).
    store: AtomicU64,
    /// Which claim holds it: a process that held it before (an image
    /// before an `exec`, whose `Member` may yet be dropped) has another.
    claim: AtomicU64,
    /// Pages of its resident ones staged (in frames outside its heap):
    /// published, for the count at each page's share.
    staged: AtomicU64,
    /// Its heap, the largest region of its instance `[lo, hi)` (0, 0: none
    /// yet): published, and left out of its other memory when the arbiter
    /// counts that at its share (`charge::anon_pages_outside`).
    heap_lo: AtomicU64,
    heap_hi: AtomicU64,
    /// 1 while no reclaimer of its runs (its threads start on need):
    /// it keeps what it holds, whatever its share, until it faults past
    /// its low watermark again.  Published with the levels.
    fixed: AtomicU64,
    /// Nanoseconds its threads waited in uswap, "some" (its statistics'
    /// `stall_some_ns`): published, for `--budget auto`'s pressure.
    stall_ns: AtomicU64,
    /// Pages it brought back from swap, and staged pages it took back
    /// (swap-cache hits): published, the share of its stall that a lower
    /// budget caused.
    swapins: AtomicU64,
    hits: AtomicU64,
    /// Of its staged pages, those on probation (off its charge for the
    /// current dwell): published, and left out of its charge.
    probation: AtomicU64,
}

#[repr(C)]
struct Shared {
    header: Header,
    slots: [Slot; SLOTS],
}

/// A domain could not be made or joined.
#[derive(Debug, thiserror::Error)]
pub enum DomainError {
    #[error("cannot make the budget domain's shared memory: {0}")]
    Create(#[source] io::Error),
    #[error("{value:?}: not a budget domain (PID:FD)")]
    Malformed { value: String },
    #[error("cannot open the budget domain at {path}: {source} (the process tree's supervisor, `uswap run`, has ended, or this process may not read its descriptors)")]
    Open {
        path: String,
        #[source]
        source: io::Error,
    },
    #[error("{path} is not a budget domain")]
    NotADomain { path: String },
    #[error("the budget domain is full: {SLOTS} processes of the tree page at once")]
    Full,
}

fn shared(map: &SharedMapping) -> &Shared {
    debug_assert!(map.len() >= std::mem::size_of::<Shared>());
    // SAFETY: the mapping is at least a `Shared` long, page-aligned, and
    // lives as long as the borrow; every field is an atomic, for which the
    // file's zeros (or any bytes another member wrote) are valid values.
    unsafe { &*(map.as_ptr() as *const Shared) }
}

pub mod auto;
mod charge;

use charge::{anon_pages, anon_pages_outside};

/// What a member's instance holds, as it publishes it
/// ([`Member::publish`]).
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct Holding {
    /// Resident pages, staged ones included.
    pub resident: usize,
    /// Of them, staged.
    pub staged: usize,
    /// Of the staged, on probation: off its charge for the dwell.
    pub probation: usize,
    /// Faults served.
    pub faults: u64,
    /// Pages its RAM devices and its compressed stores hold.
    pub ram: u64,
    pub store: u64,
    /// Nanoseconds its threads stalled ("some"), pages it swapped in, and
    /// staged pages it touched (swap-cache hits).
    pub stall_ns: u64,
    pub swapins: u64,
    pub hits: u64,
    /// A reclaimer of its runs, which takes its resident pages down to a
    /// share cut below them (else they stay: `Demand`'s `fixed`).
    pub reclaims: bool,
}

/// A process's membership of a domain (`SwapBuilder::domain`).
pub struct Member {
    map: SharedMapping,
    /// Its slot; `usize::MAX` while it has none.
    slot: AtomicUsize,
    /// Its claim's number, which its slot holds while it is its.
    claim: AtomicU64,
    /// Its heap `[lo, hi)` as published (`publish_heap`).
    heap: (AtomicU64, AtomicU64),
}

impl Member {
    /// Join the domain `value` names (`PID:FD`, the supervisor's memfd, as
    /// [`Arbiter::env_value`] writes it).
    pub fn join(value: &str) -> Result<Member, DomainError> {
        let malformed = || DomainError::Malformed {
            value: value.to_string(),
        };
        let (pid, fd) = value.trim().split_once(':').ok_or_else(malformed)?;
        let pid: u32 = pid.parse().map_err(|_| malformed())?;
        let fd: u32 = fd.parse().map_err(|_| malformed())?;
        let path = format!("/proc/{pid}/fd/{fd}");
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .custom_flags(libc::O_CLOEXEC)
            .open(&path)
            .map_err(|source| DomainError::Open {
                path: path.clone(),
                source,
            })?;
        let size = std::mem::size_of::<Shared>();
        let not = || DomainError::NotADomain { path: path.clone() };
        if file.metadata().map_err(|_| not())?.len() < size as u64 {
            return Err(not());
        }
        let map = SharedMapping::new(&file, size).map_err(|source| DomainError::Open {
            path: path.clone(),
            source,
        })?;
        if shared(&map).header.magic.load(Ordering::Acquire) != MAGIC {
            return Err(not());
        }
        if GENERATION.load(Ordering::Acquire).is_null() {
            // The header alone, mapped again and leaked (see GENERATION).
            if let Ok(page) = SharedMapping::new(&file, PAGE_SIZE) {
                let header = page.as_ptr() as *const Header;
                std::mem::forget(page);
                // SAFETY: the header is at the start of the file, and the
                // mapping (a page, more than a `Header`) is never unmapped.
                let word = unsafe { &(*header).generation } as *const AtomicU64 as *mut AtomicU64;
                SEEN.store(shared(&map).header.generation.load(Ordering::Relaxed), Ordering::Relaxed);
                GENERATION.store(word, Ordering::Release);
            }
        }
        let m = Member {
            map,
            slot: AtomicUsize::new(usize::MAX),
            claim: AtomicU64::new(0),
            heap: (AtomicU64::new(0), AtomicU64::new(0)),
        };
        m.claim()?;
        Ok(m)
    }

    fn shared(&self) -> &Shared {
        shared(&self.map)
    }

    /// Take a slot for this process.  A slot its pid holds already is an
    /// earlier image's (before an `exec`): freed first.
    fn claim(&self) -> Result<(), DomainError> {
        // SAFETY: getpid has no preconditions.
        let me = unsafe { libc::getpid() };
        let start = start_time(me).map_or(1, |s| s.0.max(1));
        for s in &self.shared().slots {
            if s.pid.load(Ordering::Relaxed) == me {
                free(s, me);
            }
        }
        for (i, s) in self.shared().slots.iter().enumerate() {
            if s.pid
                .compare_exchange(0, me, Ordering::Acquire, Ordering::Relaxed)
                .is_ok()
            {
                let claim = self.shared().header.claims.fetch_add(1, Ordering::Relaxed) + 1;
                s.claim.store(claim, Ordering::Relaxed);
                self.claim.store(claim, Ordering::Relaxed);
                s.resident.store(0, Ordering::Relaxed);
                s.faults.store(0, Ordering::Relaxed);
                s.limit.store(0, Ordering::Relaxed);
                s.other.store(0, Ordering::Relaxed);
                s.ram.store(0, Ordering::Relaxed);
                s.store.store(0, Ordering::Relaxed);
                s.staged.store(0, Ordering::Relaxed);
                s.probation.store(0, Ordering::Relaxed);
                s.fixed.store(1, Ordering::Relaxed);
                s.stall_ns.store(0, Ordering::Relaxed);
                s.swapins.store(0, Ordering::Relaxed);
                s.hits.store(0, Ordering::Relaxed);
                // A forked child maps its parent's heap where it was.
                s.heap_lo.store(self.heap.0.load(Ordering::Relaxed), Ordering::Relaxed);
                s.heap_hi.store(self.heap.1.load(Ordering::Relaxed), Ordering::Relaxed);
                s.start.store(start, Ordering::Release);
                self.slot.store(i, Ordering::Relaxed);
                return Ok(());
            }
        }
        self.slot.store(usize::MAX, Ordering::Relaxed);
        Err(DomainError::Full)
    }

    /// In a forked child: a slot of its own (the parent keeps its).
    pub(crate) fn rejoin(&self) -> Result<(), DomainError> {
        self.claim()
    }

    fn mine(&self) -> Option<&Slot> {
        let s = self.shared().slots.get(self.slot.load(Ordering::Relaxed))?;
        // SAFETY: getpid has no preconditions.
        let me = unsafe { libc::getpid() };
        (s.pid.load(Ordering::Relaxed) == me
            && s.claim.load(Ordering::Relaxed) == self.claim.load(Ordering::Relaxed))
        .then_some(s)
    }

    /// Say what this member's instance holds ([`Holding`]).
    pub(crate) fn publish(&self, h: &Holding) {
        if let Some(s) = self.mine() {
            s.stall_ns.store(h.stall_ns, Ordering::Relaxed);
            s.swapins.store(h.swapins, Ordering::Relaxed);
            s.hits.store(h.hits, Ordering::Relaxed);
            s.fixed.store(u64::from(!h.reclaims), Ordering::Relaxed);
            s.probation.store(h.probation as u64, Ordering::Relaxed);
            s.resident.store(h.resident as u64, Ordering::Relaxed);
            s.staged.store(h.staged as u64, Ordering::Relaxed);
            s.faults.store(h.faults, Ordering::Relaxed);
            s.ram.store(h.ram, Ordering::Relaxed);
            s.store.store(h.store, Ordering::Relaxed);
        }
    }

    /// How long a cut of this member's share puts its pages on probation
    /// (`Budget`'s), as the supervisor set it: None for none.
    pub(crate) fn dwell(&self) -> Option<Duration> {
        let ms = self.shared().header.dwell_ms.load(Ordering::Relaxed);
        (ms > 0).then(|| Duration::from_millis(ms))
    }

    /// Say where this member's heap is (its instance's largest region):
    /// kept for the slot a forked child takes.
    pub(crate) fn publish_heap(&self, lo: u64, hi: u64) {
        if hi - lo <= self.heap.1.load(Ordering::Relaxed) - self.heap.0.load(Ordering::Relaxed) {
            return;
        }
        self.heap.0.store(lo, Ordering::Relaxed);
        self.heap.1.store(hi, Ordering::Relaxed);
        if let Some(s) = self.mine() {
            s.heap_lo.store(lo, Ordering::Relaxed);
            s.heap_hi.store(hi, Ordering::Relaxed);
        }
    }

    /// This member's share in pages, once the arbiter has given one.
    ///
    /// Only the arbiter's.  A member once also capped its own growth at
    /// the room the others left it between ticks (the budget less their
    /// published charges): it held a spawn pool's peak lower, but in a
    /// chain of processes each waiting for the next (CPython's
    /// `TestForkAwareThreadLock`: five spawned generations) the idle
    /// parents held the budget, the newest process got no room, and the
    /// chain missed its 30-second joins.  The arbiter's water-filling
    /// gives a newcomer its share out of what the idle hold.
    ///
    /// Before the arbiter has seen it, a member takes half of what is left
    /// of the newcomers' part ([`Header::newcomer`]) and keeps it in its
    /// slot until the arbiter's share replaces it: the processes that
    /// start within one tick cannot hold more than that part together.
    pub(crate) fn share(&self) -> Option<usize> {
        let mine = self.mine()?;
        let l = mine.limit.load(Ordering::Relaxed);
        if l != 0 {
            return Some(l.max(MIN_SHARE) as usize);
        }
        let pool = &self.shared().header.newcomer;
        let mut taken = 0;
        // The pool is 0 before the arbiter's first look: the whole budget
        // then, as nothing else can hold any of it yet.
        let _ = pool.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |left| {
            taken = left.div_ceil(2);
            (left != 0).then_some(left - taken)
        });
        if taken == 0 {
            return None;
        }
        let taken = taken.max(MIN_SHARE);
        // The arbiter's share, if it came meanwhile, wins.
        let l = match mine
            .limit
            .compare_exchange(0, taken, Ordering::Relaxed, Ordering::Relaxed)
        {
            Ok(_) => taken,
            Err(arbiters) => arbiters,
        };
        Some(l.max(MIN_SHARE) as usize)
    }

    /// The domain's budget in pages.
    pub fn budget_pages(&self) -> u64 {
        self.shared().header.budget.load(Ordering::Relaxed)
    }
}

impl Drop for Member {
    fn drop(&mut self) {
        // SAFETY: getpid has no preconditions.
        let me = unsafe { libc::getpid() };
        if let Some(s) = self.mine() {
            free(s, me);
        }
    }
}

/// Free `s`, held by `pid`: the other fields first, `start` 0 so that
/// readers skip it, the pid last.
fn free(s: &Slot, pid: i32) {
    s.start.store(0, Ordering::Release);
    s.claim.store(0, Ordering::Relaxed);
    s.limit.store(0, Ordering::Relaxed);
    s.resident.store(0, Ordering::Relaxed);
    s.other.store(0, Ordering::Relaxed);
    let _ = s
        .pid
        .compare_exchange(pid, 0, Ordering::Release, Ordering::Relaxed);
}

/// What the arbiter weighs of one member.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Demand {
    /// Resident pages of its instance.
    pub resident: u64,
    /// Its other anonymous pages.
    pub other: u64,
    /// Whether it took a fault lately.
    pub active: bool,
    /// Whether it keeps what it holds whatever its share (no reclaimer of
    /// its runs: an idle process whose threads start on need).
    pub fixed: bool,
    /// Whether it took a fault in the last `FAULTING_WITHIN`: one that
    /// does reclaims at its faults, reclaimer or not.
    pub faulting: bool,
}

impl Demand {
    fn charged(&self) -> u64 {
        self.resident + self.other
    }

    /// Whether nothing takes its pages out now: no reclaimer of its
    /// runs, and it takes no faults (which would reclaim).  Not `active`,
    /// which lasts a second: a compiler driver of `make -j2` faults as
    /// it starts, then waits for its compiler the rest of its short life,
    /// active all of it, its share cut under pages nothing took out.
    fn kept(&self) -> bool {
        self.fixed && !self.faulting
    }

    /// Its weight in the split of the room under the budget: whether it
    /// grows now.
    fn growth_weight(&self) -> u64 {
        if self.faulting {
            ACTIVE_WEIGHT
        } else {
            1
        }
    }

    fn weight(&self) -> u64 {
        if self.active {
            ACTIVE_WEIGHT
        } else {
            1
        }
    }
}

/// The weight of the members the arbiter has not seen yet, together, in
/// the split of the room: one faulting member's (a spawned pool worker,
/// a compiler, faults from its first instruction).
const NEWCOMER_WEIGHT: u64 = ACTIVE_WEIGHT;

/// The members' shares (resident pages each may hold) of `budget` pages,
/// and the newcomers' part (the header's `newcomer`).
///
/// While they are charged no more than the budget, what is left (the room)
/// is split between the members by weight: a faulting member's is
/// `ACTIVE_WEIGHT`, another's 1, so that members growing at once cannot
/// hold more than the budget between two ticks.  (Each once took the
/// whole room, and two pool workers growing together held it twice.)  A
/// process alone, or faulting beside idle ones, takes all or most of it,
/// as before.  The newcomers' part is what one more faulting member's
/// would be, at most the room, and each newcomer takes half of what is
/// left of it: the tree may pass its budget by that part between two
/// ticks, and no more.  Past it, the level `L` such that the members' charges, each
/// capped at `weight * L`, fill the budget.  A member over its cap is cut
/// to it (its share is the cap less its other memory); one under it keeps
/// all it holds and may grow by its part of what the cuts leave.  So
/// reclaim falls on those furthest over their share, idle ones (weight 1
/// to an active one's 8) first.  Never under [`MIN_SHARE`].
pub fn shares(budget: u64, members: &[Demand]) -> (Vec<u64>, u64) {
    let total: u64 = members.iter().map(Demand::charged).sum();
    if total <= budget {
        let room = budget - total;
        let weights: u64 = members.iter().map(Demand::growth_weight).sum::<u64>().max(1);
        let part = |w: u64| (room as u128 * w as u128 / weights as u128).min(room as u128) as u64;
        let each = members
            .iter()
            .map(|m| (m.resident + part(m.growth_weight())).max(MIN_SHARE))
            .collect();
        return (each, part(NEWCOMER_WEIGHT));
    }
    // Past the budget, a member that cannot reclaim now (`fixed`, and
    // idle: one that faults reclaims at its own faults) keeps what it
    // holds, and the others divide what it leaves: a share cut under an
    // idle process's pages that nothing takes out would leave the tree
    // over its budget by them (a pool's parent, idle while its workers
    // run, held 11 MiB of a 40 MiB tree that way).
    if members.iter().any(Demand::kept) {
        let held: u64 = members.iter().filter(|m| m.kept()).map(Demand::charged).sum();
        let rest: Vec<Demand> = members.iter().filter(|m| !m.kept()).copied().collect();
        let (theirs, newcomer) = shares(budget.saturating_sub(held), &rest);
        let mut theirs = theirs.into_iter();
        let each = members
            .iter()
            .map(|m| {
                if m.kept() {
                    m.resident.max(MIN_SHARE)
                } else {
                    theirs.next().expect("a share for each")
                }
            })
            .collect();
        return (each, newcomer);
    }
    let filled = |level: u64| -> u64 {
        members
            .iter()
            .map(|m| m.charged().min(m.weight().saturating_mul(level)))
            .sum()
    };
    // The largest level whose fill is within the budget: filled(0) = 0,
    // and at `budget` every member's cap passes its charge (total >
    // budget), so the search ends between.
    let (mut lo, mut hi) = (0u64, budget);
    while lo < hi {
        let mid = lo + (hi - lo).div_ceil(2);
        if filled(mid) <= budget {
            lo = mid;
        } else {
            hi = mid - 1;
        }
    }
    // A member over its cap is cut to it.  One under it keeps what it
    // holds and grows only by its part (by weight) of what the cuts leave
    // under the budget, less than a level's step: its cap is room the
    // budget does not have.  Given the cap, two pool workers under it
    // while an idle member (weight 1) was cut to a level of 4 MiB had
    // shares of 32 MiB each, and grew into them together: a 40 MiB tree
    // held 61 MiB.
    let cap = |m: &Demand| m.weight().saturating_mul(lo);
    let uncut = |m: &&Demand| m.charged() <= cap(m);
    let spare = budget.saturating_sub(filled(lo));
    let weights: u64 = members.iter().filter(uncut).map(Demand::weight).sum::<u64>().max(1);
    let each = members
        .iter()
        .map(|m| {
            let share = if uncut(&m) {
                m.resident + (spare as u128 * m.weight() as u128 / weights as u128) as u64
            } else {
                cap(m).saturating_sub(m.other)
            };
            share.max(MIN_SHARE)
        })
        .collect();
    // No room: a newcomer's share is the floor until the arbiter's first.
    (each, MIN_SHARE)
}

/// The members' counts, summed ([`Arbiter::activity`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Activity {
    /// Nanoseconds their threads waited in uswap ("some").
    pub stall_ns: u64,
    /// Faults served.
    pub faults: u64,
    /// Of them, pages brought back from swap, and staged pages taken back
    /// (swap-cache hits).
    pub swapins: u64,
    pub hits: u64,
}

/// One member as the arbiter last saw it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MemberView {
    pub pid: i32,
    /// Resident pages of its instance, less those on probation.
    pub resident: u64,
    /// Its other anonymous pages (at the last look).
    pub other: u64,
    /// Its share in pages (0: none given yet).
    pub share: u64,
}

/// What the arbiter remembers of a slot between ticks.
#[derive(Clone, Copy)]
struct Seen {
    pid: i32,
    start: u64,
    faults: u64,
    active_at: Instant,
}

/// A domain, made by the tree's supervisor, and the loop that divides its
/// budget.
pub struct Arbiter {
    map: SharedMapping,
    file: File,
    seen: Vec<Option<Seen>>,
    last_look: Option<Instant>,
    /// Pages the tree may hold past its budget (the overrun); `u64::MAX`:
    /// no bound.
    overrun: u64,
    /// Since when the tree has held more than its bound, on end.
    over_since: Option<Instant>,
    /// Whether the members' compressed stores are left out of the
    /// budget, as a memory cgroup leaves out kernel zram's memory.
    store_outside: bool,
    /// The tree's memory uswap cannot page past the bound, said once:
    /// (what it held, the bound), until taken.
    unpaged: Option<(u64, u64)>,
    unpaged_said: bool,
    /// The members' other memory as `smaps` confirmed it last, and when
    /// ([`CONFIRM_EVERY`]).
    confirmed: Option<(Instant, u64)>,
}

/// The tree's compressed stores held more than its budget, overrun and
/// [`OOM_SLACK`] for [`OOM_AFTER`]: `pid`, the member whose store is
/// largest, is to be killed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct OutOfMemory {
    pub pid: i32,
    /// Its compressed store, and the tree's stores, in pages.
    pub charge: u64,
    pub total: u64,
    /// The bound passed (budget, overrun and slack), in pages.
    pub bound: u64,
}

impl Arbiter {
    /// A domain of `budget` bytes.
    pub fn create(budget: u64) -> Result<Arbiter, DomainError> {
        // SAFETY: a name in a C string; flags the kernel checks.
        let fd = unsafe { libc::memfd_create(c"uswap-domain".as_ptr(), libc::MFD_CLOEXEC) };
        if fd < 0 {
            return Err(DomainError::Create(io::Error::last_os_error()));
        }
        // SAFETY: a descriptor just made, ours alone.
        let file = File::from(unsafe { OwnedFd::from_raw_fd(fd) });
        let size = std::mem::size_of::<Shared>();
        file.set_len(size as u64).map_err(DomainError::Create)?;
        let map = SharedMapping::new(&file, size).map_err(DomainError::Create)?;
        let s = shared(&map);
        s.header
            .budget
            .store(budget / PAGE_SIZE as u64, Ordering::Relaxed);
        s.header.magic.store(MAGIC, Ordering::Release);
        Ok(Arbiter {
            map,
            file,
            seen: vec![None; SLOTS],
            last_look: None,
            overrun: u64::MAX,
            over_since: None,
            store_outside: false,
            unpaged: None,
            unpaged_said: false,
            confirmed: None,
        })
    }

    /// Bound the tree at its budget and `pages` more (and [`OOM_SLACK`]):
    /// past it for [`OOM_AFTER`], [`tick`](Self::tick) names a member to
    /// kill.  Unbounded until set.
    pub fn overrun(mut self, pages: u64) -> Arbiter {
        self.overrun = pages;
        self
    }

    /// Leave the memory of the members' compressed stores out of the
    /// budget (and of the out-of-memory bound), as a memory cgroup leaves
    /// out kernel zram's: the budget then holds resident pages and what
    /// else uswap cannot page, and each store may add up to its own
    /// limit.  Off (charged) until set.
    pub fn store_outside(mut self, on: bool) -> Arbiter {
        self.store_outside = on;
        self
    }

    /// What a member joins with ([`Member::join`]): this process's pid
    /// and the memfd's descriptor.
    pub fn env_value(&self) -> String {
        format!("{}:{}", std::process::id(), self.file.as_raw_fd())
    }

    /// The budget in pages.
    pub fn budget_pages(&self) -> u64 {
        shared(&self.map).header.budget.load(Ordering::Relaxed)
    }

    /// Change the budget to `pages`, live (`uswap ctl`): the next tick
    /// divides the new budget, and each member's reclaimer takes its
    /// resident set to its new share from its next pass.  Never below
    /// [`MIN_SHARE`].
    pub fn set_budget(&self, pages: u64) {
        let h = &shared(&self.map).header;
        h.budget.store(pages.max(MIN_SHARE), Ordering::Relaxed);
        h.generation.fetch_add(1, Ordering::Release);
    }

    /// Put the pages a cut of a member's share takes on probation for
    /// `dwell` (None: none): `--budget auto`, while its controller
    /// drives the budget.  Members follow at their next look; those that
    /// start afterwards set staging frames aside for it.
    pub fn set_dwell(&self, dwell: Option<Duration>) {
        let ms = dwell.map_or(0, |d| d.as_millis().max(1) as u64);
        shared(&self.map).header.dwell_ms.store(ms, Ordering::Relaxed);
    }

    /// The overrun in pages (`u64::MAX`: unbounded).
    pub fn overrun_pages(&self) -> u64 {
        self.overrun
    }

    /// Change the overrun, live.
    pub fn set_overrun(&mut self, pages: u64) {
        self.overrun = pages;
        self.over_since = None;
    }

    /// The members' activity, summed: what `--budget auto` takes its
    /// pressure and its floor from, as the difference between two calls
    /// (a member that leaves takes its counts with it: a difference below
    /// zero is taken as none).
    pub fn activity(&self) -> Activity {
        shared(&self.map)
            .slots
            .iter()
            .filter(|s| s.start.load(Ordering::Acquire) != 0 && s.pid.load(Ordering::Relaxed) != 0)
            .fold(Activity::default(), |a, s| Activity {
                stall_ns: a.stall_ns + s.stall_ns.load(Ordering::Relaxed),
                faults: a.faults + s.faults.load(Ordering::Relaxed),
                swapins: a.swapins + s.swapins.load(Ordering::Relaxed),
                hits: a.hits + s.hits.load(Ordering::Relaxed),
            })
    }

    /// What the members are charged now, in pages: their resident pages
    /// and their other anonymous memory (at the last look).
    pub fn charged(&self) -> (u64, u64) {
        self.members()
            .iter()
            .fold((0, 0), |(r, o), m| (r + m.resident, o + m.other))
    }

    /// One tick: every [`LOOK_EVERY`], free the slots of processes that
    /// are gone and read the members' other memory; then give each member
    /// its share.  Some when the tree has been past its bound for
    /// [`OOM_AFTER`]: the member to kill.
    pub fn tick(&mut self, now: Instant) -> Option<OutOfMemory> {
        let look = self.last_look.is_none_or(|t| now.duration_since(t) >= LOOK_EVERY);
        if look {
            self.last_look = Some(now);
        }
        let s = shared(&self.map);
        let mut idx = Vec::new();
        let mut demand = Vec::new();
        for (i, slot) in s.slots.iter().enumerate() {
            let start = slot.start.load(Ordering::Acquire);
            let pid = slot.pid.load(Ordering::Relaxed);
            if start == 0 || pid == 0 {
                self.seen[i] = None;
                continue;
            }
            let faults = slot.faults.load(Ordering::Relaxed);
            let seen = match self.seen[i] {
                Some(v) if v.pid == pid && v.start == start => v,
                _ => Seen {
                    pid,
                    start,
                    faults,
                    active_at: now,
                },
            };
            let seen = if faults != seen.faults {
                Seen {
                    faults,
                    active_at: now,
                    ..seen
                }
            } else {
                seen
            };
            self.seen[i] = Some(seen);
            let resident = slot.resident.load(Ordering::Relaxed);
            // Pages on probation are staged (resident, so not in its
            // other memory either) and off the charge for their dwell.
            let probation = slot.probation.load(Ordering::Relaxed).min(resident);
            if look {
                match start_time(pid) {
                    Some((st, state)) if st.max(1) == start && state != b'Z' && state != b'X' => {
                        if let Some(anon) = anon_pages(pid) {
                            let mut uncharged = slot.ram.load(Ordering::Relaxed);
                            if self.store_outside {
                                uncharged += slot.store.load(Ordering::Relaxed);
                            }
                            slot.other.store(
                                anon.saturating_sub(resident + uncharged),
                                Ordering::Relaxed,
                            );
                        }
                    }
                    // Gone: killed, or ended without dropping its member.
                    _ => {
                        free(slot, pid);
                        self.seen[i] = None;
                        continue;
                    }
                }
            }
            idx.push(i);
            demand.push(Demand {
                fixed: slot.fixed.load(Ordering::Relaxed) != 0,
                resident: resident - probation,
                other: slot.other.load(Ordering::Relaxed),
                active: now.duration_since(seen.active_at) < IDLE_AFTER,
                faulting: now.duration_since(seen.active_at) < FAULTING_WITHIN,
            });
        }
        // Memory no member can reclaim, alone past the bound: resident
        // pages never count (those a member cannot evict are uswap's
        // limit), nor do the floors of the members' shares (a forked
        // child's, a pool of workers', would tip a tree of small
        // processes over: a worker of Python's Pool killed holding its
        // queue's lock hung the pool).
        let other: u64 = demand.iter().map(|d| d.other).sum();
        let budget = self.budget_pages();
        let bound = budget.saturating_add(self.overrun).saturating_add(OOM_SLACK);

        // What the bound kills for: the compressed stores uswap keeps in
        // memory and charges to the budget, not the rest of what it
        // cannot page.  A store that cannot fit is uswap's choice to keep
        // pages in memory, as kernel zswap's pool is, and a memory cgroup
        // of the same limit kills for that too.  The rest (each
        // interpreter's data and bss, thread stacks, uswap's own tables)
        // is what every process costs: at 24M, a tree of a dozen Python
        // processes held 70 MiB of it, and killing the largest, 9 MiB,
        // only made the next process pay it again.  That is left as it
        // is and said once (`take_unpaged`).
        let store_of = |i: usize| {
            if self.store_outside {
                0
            } else {
                s.slots[i].store.load(Ordering::Relaxed)
            }
        };
        let stored: u64 = idx.iter().map(|&i| store_of(i)).sum();
        // Outside the stores (counted in `other` when charged).
        let unpaged = other.saturating_sub(stored);
        if unpaged > bound && !self.unpaged_said {
            // Past the bound by `statm`, which counts a page a fork shares
            // in every process that maps it: confirmed at each page's
            // share (`charge::anon_pages_outside`) before it is said, at
            // most every [`CONFIRM_EVERY`].
            let confirmed = match self.confirmed {
                Some((at, v)) if now.duration_since(at) < CONFIRM_EVERY => v,
                _ => {
                    let v = self.confirm_outside(&idx);
                    self.confirmed = Some((now, v));
                    v
                }
            };
            let unpaged = confirmed.saturating_sub(stored);
            if unpaged > bound {
                self.unpaged_said = true;
                self.unpaged = Some((unpaged, bound));
            }
        }
        let verdict = if stored > bound {
            let since = *self.over_since.get_or_insert(now);
            let largest = idx
                .iter()
                .map(|&i| (s.slots[i].pid.load(Ordering::Relaxed), store_of(i)))
                .max_by_key(|&(_, st)| st);
            match largest {
                Some((pid, charge)) if now.duration_since(since) >= OOM_AFTER => {
                    self.over_since = None;
                    Some(OutOfMemory {
                        pid,
                        charge,
                        total: stored,
                        bound,
                    })
                }
                _ => None,
            }
        } else {
            self.over_since = None;
            None
        };
        let (each, newcomer) = shares(budget, &demand);
        for (i, share) in idx.into_iter().zip(each) {
            s.slots[i].limit.store(share, Ordering::Relaxed);
        }
        s.header.newcomer.store(newcomer.max(MIN_SHARE), Ordering::Relaxed);
        verdict
    }

    /// The members' other memory, each page at its share (`smaps`'
    /// proportional count outside the heap), for [`tick`](Self::tick)'s
    /// line: statm counts a page a fork shares in every process.
    fn confirm_outside(&self, idx: &[usize]) -> u64 {
        let s = shared(&self.map);
        idx.iter()
            .map(|&i| {
                let slot = &s.slots[i];
                let pid = slot.pid.load(Ordering::Relaxed);
                let (lo, hi) = (slot.heap_lo.load(Ordering::Relaxed), slot.heap_hi.load(Ordering::Relaxed));
                // Staged pages are counted as resident already.
                let mut uncharged = slot.ram.load(Ordering::Relaxed) + slot.staged.load(Ordering::Relaxed);
                if self.store_outside {
                    uncharged += slot.store.load(Ordering::Relaxed);
                }
                match anon_pages_outside(pid, lo, hi) {
                    Some(shared) if hi > lo => shared.saturating_sub(uncharged),
                    // No heap said, or gone meanwhile: as statm had it.
                    _ => slot.other.load(Ordering::Relaxed),
                }
            })
            .sum()
    }

    /// Once per tree, the first time its memory uswap cannot page passed
    /// budget + overrun + slack: (what it held, the bound), in pages.
    pub fn take_unpaged(&mut self) -> Option<(u64, u64)> {
        self.unpaged.take()
    }

    /// The members now.
    pub fn members(&self) -> Vec<MemberView> {
        shared(&self.map)
            .slots
            .iter()
            .filter(|s| s.start.load(Ordering::Acquire) != 0)
            .map(|s| MemberView {
                pid: s.pid.load(Ordering::Relaxed),
                resident: s
                    .resident
                    .load(Ordering::Relaxed)
                    .saturating_sub(s.probation.load(Ordering::Relaxed)),
                other: s.other.load(Ordering::Relaxed),
                share: s.limit.load(Ordering::Relaxed),
            })
            .filter(|m| m.pid != 0)
            .collect()
    }
}

#[cfg(test)]
mod tests;

impl std::fmt::Debug for Member {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Member")
            .field("slot", &self.slot.load(Ordering::Relaxed))
            .finish()
    }
}
