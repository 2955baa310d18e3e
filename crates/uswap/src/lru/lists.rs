//! The two lists and their per-CPU batches: adding, activating,
//! deactivating and removing pages (see the module documentation in
//! `mod.rs`).

use crate::stats::{CounterId, LockId};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;

use crossbeam_utils::CachePadded;

use crate::index_list::IndexLists;
use crate::percpu::{possible_cpus, PerCpu};
use crate::stats::{Counter, Registry, StatMutex};
use crate::table::{self, TableError};

/// A page: an index into the pager's frame table, `0..capacity`.
pub type PageId = u32;

/// The largest batch an [`LruBatch::Pages`] may ask for.
pub const MAX_BATCH: usize = 64;

/// The default batch size: the kernel's folio batch since 6.9.
pub const DEFAULT_BATCH: usize = 31;

/// How operations reach the LRU lock.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LruBatch {
    /// One LRU lock acquisition per operation: the behaviour before seed 002.
    Unbatched,
    /// Per-CPU batches of this many pages (1..=`MAX_BATCH`), each drained
    /// under one LRU lock acquisition when full.  31 is the kernel's size
    /// since 6.9, 15 the seed-era `PAGEVEC_SIZE`.
    Pages(usize),
}

impl Default for LruBatch {
    fn default() -> Self {
        LruBatch::Pages(DEFAULT_BATCH)
    }
}

/// The configuration of an [`Lru`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LruConfig {
    /// Pages the LRU can hold: page ids are `0..capacity`.
    pub capacity: u32,
    /// Batching of add / activate / deactivate.
    pub batch: LruBatch,
    /// Per-CPU batch slots (CPUs beyond share slots modulo this count).
    pub cpus: usize,
    /// The aligned window of page ids a victim takes its cold neighbours
    /// from ([`LruConfig::neighbours`]); 1: the victim alone.
    pub neighbours: u32,
}

impl LruConfig {
    /// `capacity` pages, default batching, one batch slot per possible CPU.
    pub fn new(capacity: u32) -> Self {
        LruConfig {
            capacity,
            batch: LruBatch::default(),
            cpus: possible_cpus(),
            neighbours: 1,
        }
    }

    /// Isolate with each victim the pages of its aligned window of `n`
    /// page ids (a power of two, 1 to 512) that are on the inactive list
    /// and unreferenced, as cold as the victim by what the LRU knows: the
    /// pager moves neighbours out with one `UFFDIO_MOVE`, one TLB flush
    /// for the run.  1 (the default here): the victim alone, as the
    /// kernel's `shrink_inactive_list`.
    pub fn neighbours(mut self, n: u32) -> Self {
        self.neighbours = n;
        self
    }

    /// Set the batching.
    pub fn batch(mut self, batch: LruBatch) -> Self {
        self.batch = batch;
        self
    }

    /// Set the number of per-CPU batch slots.
    pub fn cpus(mut self, cpus: usize) -> Self {
        self.cpus = cpus;
        self
    }
}

/// Why an `LruConfig` was rejected.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum LruError {
    #[error("LRU capacity must be at least one page")]
    /// A capacity of no pages.
    ZeroCapacity,
    #[error("LRU batch must be between 1 and {MAX_BATCH} pages, got {0}")]
    /// A batch size out of range, as given.
    BadBatch(usize),
    #[error("LRU needs at least one per-CPU batch slot")]
    /// No per-CPU batch slots.
    ZeroCpus,
    /// A neighbour window that is not a power of two from 1 to 512.
    #[error("LRU neighbour window must be a power of two from 1 to 512, got {0}")]
    BadNeighbours(u32),
    /// Its tables could not be allocated.
    #[error(transparent)]
    Table(#[from] TableError),
}

// Page word: flags in the low 32 bits, generation in the high 32 bits.
pub(super) const LRU: u64 = 1 << 0;
pub(super) const ACTIVE: u64 = 1 << 1;
pub(super) const REFERENCED: u64 = 1 << 2;
pub(super) const ADD_QUEUED: u64 = 1 << 3;
/// An activation is waiting in some CPU's batch.
pub(super) const ACT_QUEUED: u64 = 1 << 4;
/// A deactivation is waiting in some CPU's batch.
pub(super) const DEACT_QUEUED: u64 = 1 << 5;
pub(super) const FLAGS: u64 = 0xffff_ffff;
pub(super) const GEN_SHIFT: u32 = 32;

#[inline]
pub(super) fn gen_of(word: u64) -> u32 {
    (word >> GEN_SHIFT) as u32
}

/// The word of a page that has just left the LRU: no flags, next generation.
#[inline]
pub(super) fn departed(word: u64) -> u64 {
    (gen_of(word).wrapping_add(1) as u64) << GEN_SHIFT
}

pub(super) const INACTIVE_LIST: usize = 0;
pub(super) const ACTIVE_LIST: usize = 1;

#[inline]
pub(super) fn list_of(word: u64) -> usize {
    if word & ACTIVE != 0 {
        ACTIVE_LIST
    } else {
        INACTIVE_LIST
    }
}

/// The two lists (`INACTIVE_LIST`, `ACTIVE_LIST`), protected by the LRU
/// lock, links committed as pages are first linked.
///
/// Invariant whenever the lock is free: a page is linked on list `l` iff
/// its word has `LRU` set and `list_of(word) == l`; an unlinked page has
/// both links `NIL`.
pub(super) type Lists = IndexLists<2>;

/// One queued operation: the page and the generation it was queued under.
#[derive(Clone, Copy, Debug, Default)]
pub(super) struct Entry {
    pub(super) page: u32,
    pub(super) gen: u32,
}

/// A fixed-size batch of entries (`folio_batch`).
#[derive(Clone, Copy)]
struct Fbatch {
    nr: usize,
    entries: [Entry; MAX_BATCH],
}

impl Fbatch {
    const EMPTY: Fbatch = Fbatch {
        nr: 0,
        entries: [Entry { page: 0, gen: 0 }; MAX_BATCH],
    };

    #[inline]
    fn as_slice(&self) -> &[Entry] {
        &self.entries[..self.nr]
    }

    /// Move the contents out, leaving this batch empty.
    #[inline]
    fn take(&mut self) -> Fbatch {
        let out = *self;
        self.nr = 0;
        out
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    Add,
    Activate,
    Deactivate,
}

/// One CPU's batches (`cpu_fbatches`), behind the per-CPU lock.
///
/// The batch lock protects only the arrays and their counts.  Entries are
/// hints: each is validated against its page's word under the LRU lock
/// when applied.  A page with `ADD_QUEUED` set has (at least) one entry
/// with its current generation in some CPU's add batch, or is being
/// applied by a drain that copied it out.
pub(super) struct Batches {
    add: Fbatch,
    activate: Fbatch,
    deactivate: Fbatch,
}

impl Batches {
    fn get_mut(&mut self, kind: Kind) -> &mut Fbatch {
        match kind {
            Kind::Add => &mut self.add,
            Kind::Activate => &mut self.activate,
            Kind::Deactivate => &mut self.deactivate,
        }
    }
}

pub(super) struct Counters {
    pub(super) add: Arc<Counter>,
    pub(super) activate: Arc<Counter>,
    pub(super) deactivate: Arc<Counter>,
    pub(super) drain: Arc<Counter>,
    pub(super) rotated: Arc<Counter>,
    pub(super) isolated: Arc<Counter>,
    pub(super) remove: Arc<Counter>,
}

/// The active and inactive lists of one swap instance.  See the module
/// documentation for the locking design.
///
/// Page ids must be below the capacity; every method panics otherwise.
pub struct Lru {
    pub(super) capacity: u32,
    /// Batch size, 0 for unbatched.
    pub(super) batch: usize,
    /// The window a victim's cold neighbours are taken from; 1: none.
    pub(super) neighbours: u32,
    /// One word per page: flags and generation (see module docs).
    pub(super) pages: Box<[AtomicU64]>,
    /// The LRU lock (site "lru").  On its own cache line: it is written on
    /// every acquisition, and must not drag the read-mostly fields around
    /// it (the batch and page-table pointers every `activate` reads) from
    /// CPU to CPU.
    pub(super) lists: CachePadded<StatMutex<Lists>>,
    /// Copies of `Lists::len`, written under the LRU lock, read lock-free;
    /// padded for the same reason.
    pub(super) nr: CachePadded<[AtomicUsize; 2]>,
    /// Per-CPU batches (site "lru_batch"); unused when unbatched.
    pub(super) cpu: PerCpu<StatMutex<Batches>>,
    pub(super) counters: Counters,
}

impl std::fmt::Debug for Lru {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Lru")
            .field("capacity", &self.capacity)
            .field("batch", &self.batch_mode())
            .field("nr_active", &self.nr_active())
            .field("nr_inactive", &self.nr_inactive())
            .finish()
    }
}

impl Lru {
    /// An empty LRU for pages `0..config.capacity`, reporting to `registry`.
    pub fn new(config: LruConfig, registry: &Registry) -> Result<Lru, LruError> {
        if config.capacity == 0 {
            return Err(LruError::ZeroCapacity);
        }
        let batch = match config.batch {
            LruBatch::Unbatched => 0,
            LruBatch::Pages(n) if (1..=MAX_BATCH).contains(&n) => n,
            LruBatch::Pages(n) => return Err(LruError::BadBatch(n)),
        };
        if config.cpus == 0 {
            return Err(LruError::ZeroCpus);
        }
        if !config.neighbours.is_power_of_two() || config.neighbours > 512 {
            return Err(LruError::BadNeighbours(config.neighbours));
        }
        let cap = config.capacity as usize;
        let batch_site = registry.lock_site(LockId::LRU_BATCH);
        // Unbatched instances never touch the batches: keep one slot.
        let slots = if batch == 0 { 1 } else { config.cpus };
        Ok(Lru {
            capacity: config.capacity,
            batch,
            neighbours: config.neighbours,
            pages: table::zeroed(cap, "LRU page words")?,
            lists: CachePadded::new(StatMutex::new(
                Lists::new_lazy(cap, "LRU links")?,
                registry.lock_site(LockId::LRU),
            )),
            nr: CachePadded::new([AtomicUsize::new(0), AtomicUsize::new(0)]),
            cpu: PerCpu::new(slots, |_| {
                StatMutex::new(
                    Batches {
                        add: Fbatch::EMPTY,
                        activate: Fbatch::EMPTY,
                        deactivate: Fbatch::EMPTY,
                    },
                    batch_site.clone(),
                )
            }),
            counters: Counters {
                add: registry.counter(CounterId::LRU_ADD),
                activate: registry.counter(CounterId::LRU_ACTIVATE),
                deactivate: registry.counter(CounterId::LRU_DEACTIVATE),
                drain: registry.counter(CounterId::LRU_DRAIN),
                rotated: registry.counter(CounterId::LRU_ROTATED),
                isolated: registry.counter(CounterId::LRU_ISOLATED),
                remove: registry.counter(CounterId::LRU_REMOVE),
            },
        })
    }

    /// Pages this LRU can hold.
    pub fn capacity(&self) -> u32 {
        self.capacity
    }

    /// The batching this LRU was built with.
    pub fn batch_mode(&self) -> LruBatch {
        if self.batch == 0 {
            LruBatch::Unbatched
        } else {
            LruBatch::Pages(self.batch)
        }
    }

    #[inline]
    pub(super) fn word(&self, page: PageId) -> &AtomicU64 {
        &self.pages[page as usize]
    }

    /// Copy the list lengths out for lock-free readers; call before
    /// releasing the LRU lock after changing the lists.
    #[inline]
    pub(super) fn publish(&self, l: &Lists) {
        self.nr[INACTIVE_LIST].store(l.len(INACTIVE_LIST), Ordering::Relaxed);
        self.nr[ACTIVE_LIST].store(l.len(ACTIVE_LIST), Ordering::Relaxed);
    }

    /// `lru_cache_add`: page `page` becomes resident and joins the inactive
    /// list (the active list if [`Lru::activate`] is called while it waits
    /// in the add batch).  Returns false, doing nothing, when the page is
    /// already on or queued for the LRU.
    pub fn add(&self, page: PageId) -> bool {
        let w = self.word(page);
        if w.load(Ordering::Relaxed) & (LRU | ADD_QUEUED) != 0 {
            return false;
        }
        if self.batch == 0 {
            let mut l = self.lists.lock();
            let claimed = w.fetch_update(Ordering::AcqRel, Ordering::Acquire, |x| {
                (x & (LRU | ADD_QUEUED) == 0).then_some((x & !FLAGS) | LRU)
            });
            if claimed.is_err() {
                return false;
            }
            l.push_head(INACTIVE_LIST, page);
            self.publish(&l);
            drop(l);
            self.counters.add.inc();
            return true;
        }
        let Ok(old) = w.fetch_update(Ordering::AcqRel, Ordering::Acquire, |x| {
            (x & (LRU | ADD_QUEUED) == 0).then_some((x & !FLAGS) | ADD_QUEUED)
        }) else {
            return false;
        };
        self.counters.add.inc();
        self.queue(
            Kind::Add,
            Entry {
                page,
                gen: gen_of(old),
            },
        );
        true
    }

    /// `activate_page`: move an inactive page to the head of the active
    /// list, through the per-CPU activate batch.  A page waiting in an add
    /// batch is flagged to be added active.  No-op (no lock) when the page
    /// is already active, already queued for activation, or not on the LRU.
    ///
    /// The last request wins: an activation cancels a deactivation of the
    /// same page still waiting in a batch (and vice versa), so a page
    /// deactivated by soft eviction and touched before the batch drained
    /// ends up active, as the touch says it should.
    pub fn activate(&self, page: PageId) {
        self.move_request(page, Kind::Activate);
    }

    /// `lru_deactivate`: move an active page to the head of the inactive
    /// list (clearing its referenced bit), through the per-CPU deactivate
    /// batch.  A page waiting in an add batch loses its active flag.  No-op
    /// when the page is not active, already queued for deactivation, or not
    /// on the LRU.  Cancels a pending activation (see [`Lru::activate`]).
    pub fn deactivate(&self, page: PageId) {
        self.move_request(page, Kind::Deactivate);
    }

    /// Record an activation or deactivation and, when it is news, queue it
    /// in this CPU's batch (or apply it at once, unbatched).
    fn move_request(&self, page: PageId, kind: Kind) {
        if self.request(page, kind) {
            let e = Entry {
                page,
                gen: gen_of(self.word(page).load(Ordering::Acquire)),
            };
            if self.batch == 0 {
                self.apply(kind, &[e]);
            } else {
                self.queue(kind, e);
            }
        }
    }

    /// Record an activation or deactivation request in the page word.
    /// Returns true when the caller must queue an entry for it: the page
    /// is on the LRU, on the other list, and had no such request pending.
    /// The word's generation cannot change while the page stays on the LRU
    /// unless it leaves it, after which a queued entry is stale anyway.
    fn request(&self, page: PageId, kind: Kind) -> bool {
        let (want, mine, other) = match kind {
            Kind::Activate => (ACTIVE, ACT_QUEUED, DEACT_QUEUED),
            Kind::Deactivate => (0, DEACT_QUEUED, ACT_QUEUED),
            Kind::Add => unreachable!("adds are not requests"),
        };
        let w = self.word(page);
        let mut x = w.load(Ordering::Acquire);
        loop {
            let new = if x & ADD_QUEUED != 0 {
                // Not linked yet: the add will link it on the list asked for.
                let y = if want == ACTIVE {
                    x | ACTIVE
                } else {
                    x & !(ACTIVE | REFERENCED)
                };
                if y == x {
                    return false;
                }
                y
            } else if x & LRU == 0 {
                return false;
            } else if x & other != 0 {
                // Cancel the opposite request still waiting in a batch.
                x & !other
            } else if x & ACTIVE == want || x & mine != 0 {
                return false;
            } else {
                x | mine
            };
            match w.compare_exchange_weak(x, new, Ordering::AcqRel, Ordering::Acquire) {
                Ok(_) if new & mine != 0 && x & ADD_QUEUED == 0 => return true,
                // A cancelled opposite request: the page may already be
                // where we want it; look again.
                Ok(_) if x & other != 0 => x = new,
                Ok(_) => return false,
                Err(now) => x = now,
            }
        }
    }

    /// Set the page's referenced bit (lock-free): the next scan gives it a
    /// second chance.  No-op for a page not on or queued for the LRU.
    #[inline]
    pub fn mark_referenced(&self, page: PageId) {
        let _ = self
            .word(page)
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |x| {
                (x & (LRU | ADD_QUEUED) != 0 && x & REFERENCED == 0).then_some(x | REFERENCED)
            });
    }

    /// The page leaves the LRU (unmapped or freed).  Entries for it still
    /// in batches become stale and are skipped.  Returns whether it was on
    /// or queued for the LRU.
    pub fn remove(&self, page: PageId) -> bool {
        let w = self.word(page);
        let mut x = w.load(Ordering::Acquire);
        loop {
            if x & ADD_QUEUED != 0 {
                // Not linked yet: withdraw the add (its entry goes stale).
                match w.compare_exchange_weak(x, departed(x), Ordering::AcqRel, Ordering::Acquire) {
                    Ok(_) => {
                        self.counters.remove.inc();
                        return true;
                    }
                    Err(now) => x = now,
                }
                continue;
            }
            if x & LRU == 0 {
                return false;
            }
            let mut l = self.lists.lock();
            // Under the lock a linked page stays linked; only its
            // referenced bit may still change.
            let now = w.load(Ordering::Acquire);
            if now & LRU == 0 {
                // Removed, isolated or re-queued meanwhile: decide again.
                drop(l);
                x = now;
                continue;
            }
            let old = w
                .fetch_update(Ordering::AcqRel, Ordering::Acquire, |y| Some(departed(y)))
                .expect("closure always updates");
            l.unlink(list_of(old), page);
            self.publish(&l);
            drop(l);
            self.counters.remove.inc();
            return true;
        }
    }

    /// `release_pages`: [`Lru::remove`] for many pages under one LRU lock
    /// acquisition (an unmap releases its pages this way in the kernel, in
    /// either batching mode).  Returns how many were on or queued for the
    /// LRU.
    pub fn remove_batch(&self, pages: &[PageId]) -> usize {
        if pages.is_empty() {
            return 0;
        }
        let mut l = self.lists.lock();
        let mut n = 0;
        for &page in pages {
            let w = self.word(page);
            let mut x = w.load(Ordering::Acquire);
            // Under the lock a linked page stays linked and a queued add
            // stays unlinked (draining takes the lock); only the
            // referenced bit, or a new add of an absent page, may race.
            while x & (LRU | ADD_QUEUED) != 0 {
                match w.compare_exchange_weak(x, departed(x), Ordering::AcqRel, Ordering::Acquire) {
                    Ok(_) => {
                        if x & LRU != 0 {
                            l.unlink(list_of(x), page);
                        }
                        n += 1;
                        break;
                    }
                    Err(now) => x = now,
                }
            }
        }
        self.publish(&l);
        drop(l);
        self.counters.remove.add(n as u64);
        n
    }

    /// Queue `e` in the calling CPU's batch of `kind`; if that fills the
    /// batch, move it onto the lists under one LRU lock acquisition.
    #[inline]
    fn queue(&self, kind: Kind, e: Entry) {
        let mut g = self.cpu.this().lock();
        let fb = g.get_mut(kind);
        fb.entries[fb.nr] = e;
        fb.nr += 1;
        if fb.nr < self.batch {
            return;
        }
        let full = fb.take();
        drop(g);
        self.counters.drain.inc();
        self.apply(kind, full.as_slice());
    }

    /// Apply a batch under one LRU lock acquisition
    /// (`folio_batch_move_lru`).
    fn apply(&self, kind: Kind, entries: &[Entry]) {
        if entries.is_empty() {
            return;
        }
        let mut l = self.lists.lock();
        let moved = self.apply_locked(&mut l, kind, entries);
        self.publish(&l);
        drop(l);
        match kind {
            Kind::Add | Kind::Activate => self.counters.activate.add(moved),
            Kind::Deactivate => self.counters.deactivate.add(moved),
        }
    }

    /// Apply entries with the LRU lock held.  Returns the pages activated
    /// (for adds: added to the active list) or deactivated.
    fn apply_locked(&self, l: &mut Lists, kind: Kind, entries: &[Entry]) -> u64 {
        let mut moved = 0;
        for e in entries {
            let w = self.word(e.page);
            let valid = |x: u64| gen_of(x) == e.gen;
            match kind {
                Kind::Add => {
                    let r = w.fetch_update(Ordering::AcqRel, Ordering::Acquire, |x| {
                        (valid(x) && x & (LRU | ADD_QUEUED) == ADD_QUEUED).then_some((x & !ADD_QUEUED) | LRU)
                    });
                    if let Ok(old) = r {
                        // ACTIVE can no longer change lock-free: LRU is set.
                        let list = list_of(old);
                        l.push_head(list, e.page);
                        moved += (list == ACTIVE_LIST) as u64;
                    }
                }
                Kind::Activate => {
                    // Only a request still pending counts: a cancelled one
                    // (or one a later request superseded) is skipped.
                    let r = w.fetch_update(Ordering::AcqRel, Ordering::Acquire, |x| {
                        (valid(x) && x & (LRU | ACT_QUEUED) == LRU | ACT_QUEUED)
                            .then_some((x & !ACT_QUEUED) | ACTIVE)
                    });
                    if let Ok(old) = r {
                        if old & ACTIVE == 0 {
                            l.unlink(INACTIVE_LIST, e.page);
                            l.push_head(ACTIVE_LIST, e.page);
                            moved += 1;
                        }
                    }
                }
                Kind::Deactivate => {
                    let r = w.fetch_update(Ordering::AcqRel, Ordering::Acquire, |x| {
                        (valid(x) && x & (LRU | DEACT_QUEUED) == LRU | DEACT_QUEUED)
                            .then_some(x & !(ACTIVE | REFERENCED | DEACT_QUEUED))
                    });
                    if let Ok(old) = r {
                        if old & ACTIVE != 0 {
                            l.unlink(ACTIVE_LIST, e.page);
                            l.push_head(INACTIVE_LIST, e.page);
                            moved += 1;
                        }
                    }
                }
            }
        }
        moved
    }

    /// Flush one slot's batches: adds, then deactivations, then
    /// activations (the kernel's `lru_add_drain_cpu` order), all under one
    /// LRU lock acquisition.
    fn drain_slot(&self, slot: &StatMutex<Batches>) {
        let mut g = slot.lock();
        if g.add.nr == 0 && g.activate.nr == 0 && g.deactivate.nr == 0 {
            return;
        }
        let add = g.add.take();
        let deactivate = g.deactivate.take();
        let activate = g.activate.take();
        drop(g);
        let flushed = [add.nr, deactivate.nr, activate.nr]
            .iter()
            .filter(|&&n| n > 0)
            .count();
        let mut l = self.lists.lock();
        let act_added = self.apply_locked(&mut l, Kind::Add, add.as_slice());
        let deact = self.apply_locked(&mut l, Kind::Deactivate, deactivate.as_slice());
        let act = self.apply_locked(&mut l, Kind::Activate, activate.as_slice());
        self.publish(&l);
        drop(l);
        self.counters.drain.add(flushed as u64);
        self.counters.activate.add(act_added + act);
        self.counters.deactivate.add(deact);
    }

    /// `lru_add_drain`: flush the calling CPU's batches.
    pub fn drain_local(&self) {
        if self.batch != 0 {
            self.drain_slot(self.cpu.this());
        }
    }

    /// `lru_add_drain_all`: flush every CPU's batches.  Every operation
    /// that returned before this call is on the lists when it returns.
    pub fn drain_all(&self) {
        if self.batch != 0 {
            for slot in self.cpu.iter() {
                self.drain_slot(slot);
            }
        }
    }

}

#[cfg(test)]
#[path = "tests.rs"]
mod tests;
