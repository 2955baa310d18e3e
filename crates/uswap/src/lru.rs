//! The LRU of one swap instance: which resident pages to evict.
//!
//! Two intrusive doubly linked lists, *inactive* and *active*, over a node
//! array indexed by [`PageId`], with per-CPU batches of pending operations
//! in front of the one LRU lock, after `mm/swap.c` (seed 002: "batch
//! activate_page() to reduce lock contention"; today's `cpu_fbatches`).
//!
//! - [`Lru::add`] (`lru_cache_add`) queues a page in the calling CPU's *add*
//!   batch; when the batch is full it is moved onto the lists under one LRU
//!   lock acquisition (`folio_batch_move_lru`).
//! - [`Lru::activate`] (`folio_activate`) queues an inactive page in the
//!   *activate* batch.  A page still waiting in an add batch is instead
//!   flagged active, so that the add puts it on the active list directly
//!   (what `mark_page_accessed` does with `PageActive`).
//! - [`Lru::deactivate`] (`lru_deactivate`) queues an active page in the
//!   *deactivate* batch.
//! - [`Lru::shrink_inactive`] and [`Lru::age_active`] are
//!   `shrink_inactive_list` and `shrink_active_list` with the referenced bit
//!   as the second chance.
//!
//! [`LruBatch::Unbatched`] is the behaviour before seed 002: every add,
//! activate and deactivate takes the LRU lock itself.
//!
//! After construction no operation allocates: links are `u32` indices into
//! preallocated arrays and each batch is a fixed array of [`MAX_BATCH`]
//! entries (only [`Lru::check_invariants`], a test aid, allocates).
//!
//! # Page state and locking
//!
//! Every page has one atomic word: flag bits in the low half and a
//! *generation* in the high half.
//!
//! | bit          | meaning                                              | changed by |
//! |--------------|------------------------------------------------------|------------|
//! | `LRU`        | linked on one of the two lists                       | LRU lock holder only |
//! | `ACTIVE`     | with `LRU`: on the active list; with `ADD_QUEUED`: to be added to the active list | LRU lock holder when `LRU`; lock-free CAS when `ADD_QUEUED` |
//! | `REFERENCED` | accessed since last scanned (second chance)          | set lock-free; cleared by scans, deactivation, removal |
//! | `ADD_QUEUED` | waiting in some CPU's add batch                      | set by `add` (CAS from absent); cleared by `remove` (CAS) or by the add drain (CAS, under the LRU lock) |
//!
//! Every change is a compare-and-swap on the whole word, so concurrent
//! changes to different bits are never lost and each transition is decided
//! on the state it replaces.  A page is *absent* when neither `LRU` nor
//! `ADD_QUEUED` is set, and then all its flags are clear.
//!
//! The generation is bumped whenever a page leaves the LRU (`remove`,
//! isolation by `shrink_inactive`).  Batch entries carry the generation
//! they were queued under, and a drain skips an entry whose page has left
//! (and maybe come back) since: an `activate` that preceded a `remove`
//! never applies to the page's next residency.  Safety does not rest on the
//! generation: a drain re-checks the flags under the LRU lock, so a stale
//! entry can at worst act on a page in the state it expects.
//!
//! Lock order: a CPU's batch lock may be held while taking nothing else
//! (entries are copied out and the batch lock released before the LRU lock
//! is taken); the LRU lock is never held while taking a batch lock.

use crate::stats::{CounterId, LockId};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;

use crossbeam_utils::CachePadded;

use crate::index_list::{IndexLists, NIL};
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
}

impl LruConfig {
    /// `capacity` pages, default batching, one batch slot per possible CPU.
    pub fn new(capacity: u32) -> Self {
        LruConfig {
            capacity,
            batch: LruBatch::default(),
            cpus: possible_cpus(),
        }
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
    /// Its tables could not be allocated.
    #[error(transparent)]
    Table(#[from] TableError),
}

// Page word: flags in the low 32 bits, generation in the high 32 bits.
const LRU: u64 = 1 << 0;
const ACTIVE: u64 = 1 << 1;
const REFERENCED: u64 = 1 << 2;
const ADD_QUEUED: u64 = 1 << 3;
/// An activation is waiting in some CPU's batch.
const ACT_QUEUED: u64 = 1 << 4;
/// A deactivation is waiting in some CPU's batch.
const DEACT_QUEUED: u64 = 1 << 5;
const FLAGS: u64 = 0xffff_ffff;
const GEN_SHIFT: u32 = 32;

#[inline]
fn gen_of(word: u64) -> u32 {
    (word >> GEN_SHIFT) as u32
}

/// The word of a page that has just left the LRU: no flags, next generation.
#[inline]
fn departed(word: u64) -> u64 {
    (gen_of(word).wrapping_add(1) as u64) << GEN_SHIFT
}

const INACTIVE_LIST: usize = 0;
const ACTIVE_LIST: usize = 1;

#[inline]
fn list_of(word: u64) -> usize {
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
type Lists = IndexLists<2>;

/// One queued operation: the page and the generation it was queued under.
#[derive(Clone, Copy, Debug, Default)]
struct Entry {
    page: u32,
    gen: u32,
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
struct Batches {
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

struct Counters {
    add: Arc<Counter>,
    activate: Arc<Counter>,
    deactivate: Arc<Counter>,
    drain: Arc<Counter>,
    rotated: Arc<Counter>,
    isolated: Arc<Counter>,
    remove: Arc<Counter>,
}

/// The active and inactive lists of one swap instance.  See the module
/// documentation for the locking design.
///
/// Page ids must be below the capacity; every method panics otherwise.
pub struct Lru {
    capacity: u32,
    /// Batch size, 0 for unbatched.
    batch: usize,
    /// One word per page: flags and generation (see module docs).
    pages: Box<[AtomicU64]>,
    /// The LRU lock (site "lru").  On its own cache line: it is written on
    /// every acquisition, and must not drag the read-mostly fields around
    /// it (the batch and page-table pointers every `activate` reads) from
    /// CPU to CPU.
    lists: CachePadded<StatMutex<Lists>>,
    /// Copies of `Lists::len`, written under the LRU lock, read lock-free;
    /// padded for the same reason.
    nr: CachePadded<[AtomicUsize; 2]>,
    /// Per-CPU batches (site "lru_batch"); unused when unbatched.
    cpu: PerCpu<StatMutex<Batches>>,
    counters: Counters,
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
        let cap = config.capacity as usize;
        let batch_site = registry.lock_site(LockId::LRU_BATCH);
        // Unbatched instances never touch the batches: keep one slot.
        let slots = if batch == 0 { 1 } else { config.cpus };
        Ok(Lru {
            capacity: config.capacity,
            batch,
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
    fn word(&self, page: PageId) -> &AtomicU64 {
        &self.pages[page as usize]
    }

    /// Copy the list lengths out for lock-free readers; call before
    /// releasing the LRU lock after changing the lists.
    #[inline]
    fn publish(&self, l: &Lists) {
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

    /// `shrink_inactive_list`: drain all batches, then scan up to
    /// `nr_to_scan` pages from the inactive tail.  A referenced page gets a
    /// second chance (bit cleared, moved to the active head); an
    /// unreferenced page is isolated (leaves the LRU) and written to
    /// `victims`.  Scanning stops early when `victims` is full or the
    /// inactive list is empty.  Returns the number isolated.
    pub fn shrink_inactive(&self, nr_to_scan: usize, victims: &mut [PageId]) -> usize {
        self.drain_all();
        self.shrink_inactive_drained(nr_to_scan, victims)
    }

    /// [`Lru::shrink_inactive`] draining only the calling CPU's batches,
    /// as the kernel's reclaim does (`lru_add_drain`, not `_all`): draining
    /// every CPU's batch on every reclaim pass would flush them a page or
    /// two at a time and undo seed 002's batching.  Pages still in other
    /// CPUs' batches are not seen; a caller that finds nothing should
    /// fall back to [`Lru::shrink_inactive`].
    pub fn shrink_inactive_local(&self, nr_to_scan: usize, victims: &mut [PageId]) -> usize {
        self.drain_local();
        self.shrink_inactive_drained(nr_to_scan, victims)
    }

    fn shrink_inactive_drained(&self, nr_to_scan: usize, victims: &mut [PageId]) -> usize {
        let mut l = self.lists.lock();
        let (mut isolated, mut rotated, mut scanned) = (0, 0u64, 0);
        while scanned < nr_to_scan && isolated < victims.len() {
            let Some(page) = l.tail(INACTIVE_LIST) else {
                break;
            };
            scanned += 1;
            let old = self
                .word(page)
                .fetch_update(Ordering::AcqRel, Ordering::Acquire, |x| {
                    Some(if x & REFERENCED != 0 {
                        (x & !REFERENCED) | ACTIVE
                    } else {
                        departed(x)
                    })
                })
                .expect("closure always updates");
            l.unlink(INACTIVE_LIST, page);
            if old & REFERENCED != 0 {
                l.push_head(ACTIVE_LIST, page);
                rotated += 1;
            } else {
                victims[isolated] = page;
                isolated += 1;
            }
        }
        self.publish(&l);
        drop(l);
        self.counters.rotated.add(rotated);
        self.counters.isolated.add(isolated as u64);
        isolated
    }

    /// `shrink_active_list`: drain all batches, then scan up to
    /// `nr_to_scan` pages (at most the active list's length, so each page
    /// once) from the active tail.  A referenced page has its bit cleared
    /// and rotates to the active head; an unreferenced one moves to the
    /// inactive head.  Returns the pages deactivated.
    pub fn age_active(&self, nr_to_scan: usize) -> usize {
        self.drain_all();
        let mut l = self.lists.lock();
        let n = nr_to_scan.min(l.len(ACTIVE_LIST));
        let (mut rotated, mut deactivated) = (0u64, 0usize);
        for _ in 0..n {
            let page = l
                .tail(ACTIVE_LIST)
                .expect("n is at most the active list's length");
            let old = self
                .word(page)
                .fetch_update(Ordering::AcqRel, Ordering::Acquire, |x| {
                    Some(if x & REFERENCED != 0 {
                        x & !REFERENCED
                    } else {
                        x & !ACTIVE
                    })
                })
                .expect("closure always updates");
            l.unlink(ACTIVE_LIST, page);
            if old & REFERENCED != 0 {
                l.push_head(ACTIVE_LIST, page);
                rotated += 1;
            } else {
                l.push_head(INACTIVE_LIST, page);
                deactivated += 1;
            }
        }
        self.publish(&l);
        drop(l);
        self.counters.rotated.add(rotated);
        self.counters.deactivate.add(deactivated as u64);
        deactivated
    }

    /// Pages on the active list (batched operations not yet drained are
    /// not counted).
    pub fn nr_active(&self) -> usize {
        self.nr[ACTIVE_LIST].load(Ordering::Relaxed)
    }

    /// Pages on the inactive list.
    pub fn nr_inactive(&self) -> usize {
        self.nr[INACTIVE_LIST].load(Ordering::Relaxed)
    }

    /// Whether the page is on the active list.
    pub fn is_active(&self, page: PageId) -> bool {
        self.word(page).load(Ordering::Acquire) & (LRU | ACTIVE) == LRU | ACTIVE
    }

    /// Whether the page is on one of the lists (a page still waiting in an
    /// add batch is not yet; see [`Lru::is_resident`]).
    pub fn on_lru(&self, page: PageId) -> bool {
        self.word(page).load(Ordering::Acquire) & LRU != 0
    }

    /// Whether the page is on or queued for the LRU.
    pub fn is_resident(&self, page: PageId) -> bool {
        self.word(page).load(Ordering::Acquire) & (LRU | ADD_QUEUED) != 0
    }

    /// Whether the page's referenced bit is set.
    pub fn is_referenced(&self, page: PageId) -> bool {
        self.word(page).load(Ordering::Acquire) & REFERENCED != 0
    }

    /// Quiescent consistency check (drains first): both lists well formed
    /// (links agree, no cycles, lengths match the counts), every page's
    /// flags match its list membership, no page on both lists, no page
    /// left queued.  Allocates; not for hot paths.
    pub fn check_invariants(&self) -> Result<(), String> {
        self.drain_all();
        let l = self.lists.lock();
        let cap = self.capacity as usize;
        let mut seen = vec![u8::MAX; cap];
        for (list, name) in [(INACTIVE_LIST, "inactive"), (ACTIVE_LIST, "active")] {
            let n = l
                .check(list, |page| {
                    let p = page as usize;
                    if seen[p] != u8::MAX {
                        return Err(format!("page {page} linked twice (second time on {name})"));
                    }
                    seen[p] = list as u8;
                    let w = self.pages[p].load(Ordering::Acquire);
                    // After a drain no request is pending: every queued
                    // entry was applied (clearing its flag) or found stale.
                    if w & LRU == 0 || w & (ADD_QUEUED | ACT_QUEUED | DEACT_QUEUED) != 0 || list_of(w) != list
                    {
                        return Err(format!(
                            "page {page} on the {name} list has flags {:#x}",
                            w & FLAGS
                        ));
                    }
                    Ok(())
                })
                .map_err(|e| format!("{name} {e}"))?;
            let published = self.nr[list].load(Ordering::Relaxed);
            if published != n {
                return Err(format!("{name} list: published length {published} but {n} nodes"));
            }
        }
        for (p, &s) in seen.iter().enumerate() {
            if s != u8::MAX {
                continue;
            }
            let w = self.pages[p].load(Ordering::Acquire);
            if w & FLAGS != 0 {
                return Err(format!(
                    "page {p} on no list has flags {:#x}{}",
                    w & FLAGS,
                    if w & ADD_QUEUED != 0 {
                        " (queued for add after a drain: lost)"
                    } else {
                        ""
                    }
                ));
            }
            if l.prev(p as u32) != NIL || l.next(p as u32) != NIL {
                return Err(format!("page {p} on no list has links"));
            }
        }
        Ok(())
    }

    /// The lists, head first (drains first).  For tests.
    #[cfg(test)]
    fn lists_snapshot(&self) -> (Vec<PageId>, Vec<PageId>) {
        self.drain_all();
        let l = self.lists.lock();
        let walk = |list: usize| l.iter(list).collect::<Vec<_>>();
        (walk(INACTIVE_LIST), walk(ACTIVE_LIST))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::collections::VecDeque;

    const MODES: [LruBatch; 4] = [
        LruBatch::Pages(31),
        LruBatch::Pages(15),
        LruBatch::Pages(1),
        LruBatch::Unbatched,
    ];

    fn lru(capacity: u32, batch: LruBatch) -> (Lru, Arc<Registry>) {
        let reg = Registry::new();
        let lru = Lru::new(LruConfig::new(capacity).batch(batch), &reg).unwrap();
        (lru, reg)
    }

    #[test]
    fn lru_is_send_sync() {
        fn check<T: Send + Sync>() {}
        check::<Lru>();
    }

    #[test]
    fn lru_config_validation() {
        let reg = Registry::new();
        assert_eq!(
            Lru::new(LruConfig::new(0), &reg).unwrap_err(),
            LruError::ZeroCapacity
        );
        for bad in [0, MAX_BATCH + 1] {
            assert_eq!(
                Lru::new(LruConfig::new(8).batch(LruBatch::Pages(bad)), &reg).unwrap_err(),
                LruError::BadBatch(bad)
            );
        }
        assert_eq!(
            Lru::new(LruConfig::new(8).cpus(0), &reg).unwrap_err(),
            LruError::ZeroCpus
        );
        let l = Lru::new(LruConfig::new(8).batch(LruBatch::Pages(MAX_BATCH)), &reg).unwrap();
        assert_eq!(l.batch_mode(), LruBatch::Pages(MAX_BATCH));
        assert_eq!(LruConfig::new(8).batch, LruBatch::Pages(31));
        assert!(LruConfig::new(8).cpus >= 1);
    }

    #[test]
    fn lru_add_goes_inactive_after_drain() {
        for mode in MODES {
            let (l, reg) = lru(16, mode);
            assert!(l.add(3));
            assert!(l.is_resident(3));
            assert!(!l.add(3), "double add must be refused");
            l.drain_all();
            assert!(l.on_lru(3) && !l.is_active(3));
            assert_eq!((l.nr_inactive(), l.nr_active()), (1, 0));
            assert_eq!(reg.snapshot().counters.lru_add, 1);
            l.check_invariants().unwrap();
        }
    }

    #[test]
    fn lru_batched_add_waits_for_drain_or_full_batch() {
        // One batch slot, so the thread's CPU does not matter.
        let reg = Registry::new();
        let l = Lru::new(LruConfig::new(64).batch(LruBatch::Pages(4)).cpus(1), &reg).unwrap();
        for p in 0..3 {
            l.add(p);
        }
        assert_eq!(l.nr_inactive(), 0, "three adds sit in the batch");
        assert!(!l.on_lru(0));
        l.add(3);
        assert_eq!(l.nr_inactive(), 4, "the fourth fills and flushes it");
        assert_eq!(reg.snapshot().counters.lru_drain, 1);
        // Flushed in order: the last added is at the head.
        assert_eq!(l.lists_snapshot().0, vec![3, 2, 1, 0]);
    }

    #[test]
    fn lru_activate_moves_to_active() {
        for mode in MODES {
            let (l, reg) = lru(16, mode);
            for p in 0..4 {
                l.add(p);
            }
            l.drain_all();
            l.activate(1);
            l.activate(2);
            l.activate(2);
            l.drain_all();
            assert!(l.is_active(1) && l.is_active(2) && !l.is_active(0));
            assert_eq!((l.nr_inactive(), l.nr_active()), (2, 2));
            assert_eq!(l.lists_snapshot(), (vec![3, 0], vec![2, 1]));
            assert_eq!(reg.snapshot().counters.lru_activate, 2);
            // Absent pages: no-op.
            l.activate(9);
            l.drain_all();
            assert!(!l.on_lru(9));
            l.check_invariants().unwrap();
        }
    }

    #[test]
    fn lru_activate_while_queued_for_add_adds_active() {
        let (l, _reg) = lru(16, LruBatch::Pages(31));
        l.add(5);
        l.activate(5);
        l.drain_all();
        assert!(l.is_active(5));
        // And deactivate while queued undoes it.
        l.add(6);
        l.activate(6);
        l.deactivate(6);
        l.drain_all();
        assert!(l.on_lru(6) && !l.is_active(6));
        l.check_invariants().unwrap();
    }

    #[test]
    fn lru_last_request_wins_while_batched() {
        for mode in MODES {
            let (lru, _) = lru(64, mode);
            for p in 0..8 {
                lru.add(p);
            }
            lru.drain_all();
            lru.activate(1);
            lru.drain_all();
            // Deactivate then activate before any drain: stays active.
            lru.deactivate(1);
            lru.activate(1);
            // Activate then deactivate before any drain: stays inactive.
            lru.activate(2);
            lru.deactivate(2);
            // Cancel and re-request: one move, no double queueing.
            lru.activate(3);
            lru.deactivate(3);
            lru.activate(3);
            lru.drain_all();
            assert!(lru.is_active(1), "{mode:?}");
            assert!(!lru.is_active(2), "{mode:?}");
            assert!(lru.is_active(3), "{mode:?}");
            assert_eq!(lru.nr_active(), 2);
            lru.check_invariants().unwrap();
        }
    }

    #[test]
    fn lru_deactivate_moves_to_inactive_head() {
        for mode in MODES {
            let (l, _reg) = lru(16, mode);
            for p in 0..4 {
                l.add(p);
                l.activate(p);
            }
            l.drain_all();
            assert_eq!(l.nr_active(), 4);
            l.mark_referenced(2);
            l.deactivate(2);
            l.deactivate(7); // absent: no-op
            l.drain_all();
            assert!(!l.is_active(2) && l.on_lru(2));
            assert!(!l.is_referenced(2), "deactivation clears referenced");
            assert_eq!(l.lists_snapshot(), (vec![2], vec![3, 1, 0]));
            l.check_invariants().unwrap();
        }
    }

    /// A batch removal equals removing one by one: linked pages unlinked,
    /// queued adds withdrawn, absent pages skipped, under one acquisition.
    #[test]
    fn lru_remove_batch() {
        for mode in MODES {
            let (l, reg) = lru(32, mode);
            for p in 0..10 {
                l.add(p);
            }
            l.drain_all();
            l.activate(3);
            l.drain_all();
            for p in 10..13 {
                l.add(p); // queued (batched modes) or linked
            }
            let before = reg.snapshot();
            assert_eq!(l.remove_batch(&[0, 3, 5, 11, 20, 21]), 4, "{mode:?}");
            let acq = reg.snapshot().since(&before).locks.lru.acquisitions;
            assert_eq!(acq, 1, "{mode:?}: one lock acquisition");
            for p in [0, 3, 5, 11] {
                assert!(!l.on_lru(p), "{mode:?}: {p}");
            }
            l.drain_all();
            assert!(!l.on_lru(11), "{mode:?}: the withdrawn add stays withdrawn");
            assert_eq!(l.nr_active() + l.nr_inactive(), 9, "{mode:?}");
            l.check_invariants().unwrap();
            // Removed pages can come back.
            assert!(l.add(3));
        }
    }

    /// Pin the calling thread to `cpu`.
    fn pin(cpu: usize) {
        // SAFETY: a zeroed cpu_set_t is a valid empty set; CPU_SET and
        // sched_setaffinity only read and write it.
        unsafe {
            let mut set: libc::cpu_set_t = std::mem::zeroed();
            libc::CPU_SET(cpu, &mut set);
            assert_eq!(libc::sched_setaffinity(0, std::mem::size_of_val(&set), &set), 0);
        }
    }

    /// The local shrink drains only this CPU's batch: pages another CPU
    /// has batched stay there (the kernel's `lru_add_drain`), and the full
    /// shrink finds them.
    #[test]
    fn lru_local_shrink_leaves_other_cpus_batches() {
        let cpus = crate::percpu::possible_cpus();
        let (l, _) = lru(64, LruBatch::Pages(31));
        std::thread::scope(|s| {
            s.spawn(|| {
                pin(0);
                for p in 0..5 {
                    l.add(p);
                }
                let mut v = [0; 16];
                assert_eq!(l.shrink_inactive_local(16, &mut v), 5, "its own batch is drained");
                if cpus < 2 {
                    return;
                }
                std::thread::scope(|s2| {
                    s2.spawn(|| {
                        pin(1);
                        for p in 10..15 {
                            l.add(p);
                        }
                    });
                });
                assert_eq!(l.shrink_inactive_local(16, &mut v), 0, "CPU 1's batch is not");
                assert_eq!(l.shrink_inactive(16, &mut v), 5, "the full shrink drains it");
                assert_eq!(&v[..5], &[10, 11, 12, 13, 14]);
                l.check_invariants().unwrap();
            });
        });
    }

    #[test]
    fn lru_shrink_gives_referenced_pages_a_second_chance() {
        for mode in MODES {
            let (l, reg) = lru(16, mode);
            for p in 0..6 {
                l.add(p);
            }
            // Inactive, head first: 5 4 3 2 1 0; page 0 is the tail.
            l.mark_referenced(0);
            l.mark_referenced(2);
            let mut victims = [0; 8];
            let n = l.shrink_inactive(4, &mut victims);
            assert_eq!(&victims[..n], &[1, 3], "{mode:?}");
            assert!(l.is_active(0) && l.is_active(2));
            assert!(!l.is_referenced(0) && !l.is_referenced(2));
            assert!(!l.on_lru(1) && !l.is_resident(1));
            assert_eq!(l.lists_snapshot(), (vec![5, 4], vec![2, 0]));
            let s = reg.snapshot();
            assert_eq!(s.counters.lru_rotated, 2);
            assert_eq!(s.counters.lru_isolated, 2);
            // Victims buffer bounds the isolation.
            let n = l.shrink_inactive(100, &mut victims[..1]);
            assert_eq!((n, victims[0]), (1, 4));
            // An isolated page can come back.
            assert!(l.add(1));
            l.check_invariants().unwrap();
            assert!(!l.remove(4), "isolated pages are off the LRU");
        }
    }

    #[test]
    fn lru_age_active() {
        for mode in MODES {
            let (l, reg) = lru(16, mode);
            for p in 0..4 {
                l.add(p);
                l.activate(p);
            }
            // Active, head first: 3 2 1 0.
            l.mark_referenced(0);
            l.mark_referenced(3);
            assert_eq!(l.age_active(100), 2, "{mode:?}");
            // 0 rotated first, then 1 and 2 deactivated, then 3 rotated.
            assert_eq!(l.lists_snapshot(), (vec![2, 1], vec![3, 0]));
            assert!(!l.is_referenced(0) && !l.is_referenced(3));
            assert_eq!(reg.snapshot().counters.lru_rotated, 2);
            assert_eq!(l.age_active(1), 1);
            assert_eq!(l.lists_snapshot(), (vec![0, 2, 1], vec![3]));
            assert_eq!(l.age_active(0), 0);
            l.check_invariants().unwrap();
        }
    }

    #[test]
    fn lru_remove_of_page_still_in_a_batch() {
        for mode in MODES {
            let (l, reg) = lru(16, mode);
            // Queued for add, then removed: the stale entry is skipped.
            l.add(1);
            assert!(l.remove(1));
            assert!(!l.remove(1));
            l.drain_all();
            assert!(!l.on_lru(1));
            // Queued for activation, removed, re-added: the old activation
            // does not apply to the new residency.
            l.add(2);
            l.drain_all();
            l.activate(2);
            assert!(l.remove(2));
            assert!(l.add(2));
            l.drain_all();
            assert!(l.on_lru(2) && !l.is_active(2), "{mode:?}");
            // Removed and re-added while the add is queued: linked once.
            l.add(3);
            assert!(l.remove(3));
            assert!(l.add(3));
            l.drain_all();
            assert!(l.on_lru(3));
            assert_eq!(l.nr_inactive(), 2);
            l.check_invariants().unwrap();
            assert_eq!(reg.snapshot().counters.lru_remove, 3);
        }
    }

    #[test]
    fn lru_capacity_edges() {
        for mode in MODES {
            let (l, _reg) = lru(1, mode);
            assert!(l.add(0));
            l.activate(0);
            l.drain_all();
            assert!(l.is_active(0));
            assert_eq!(l.age_active(5), 1);
            let mut v = [PageId::MAX; 2];
            assert_eq!(l.shrink_inactive(5, &mut v), 1);
            assert_eq!(v[0], 0);
            assert_eq!(l.shrink_inactive(5, &mut v), 0);
            l.check_invariants().unwrap();

            let cap = 1000;
            let (l, _reg) = lru(cap, mode);
            let last = cap - 1;
            assert!(l.add(last));
            assert!(l.add(0));
            l.activate(last);
            l.drain_all();
            assert!(l.is_active(last));
            assert!(l.remove(last));
            assert!(l.add(last));
            l.drain_all();
            assert_eq!(l.lists_snapshot(), (vec![last, 0], vec![]));
            l.check_invariants().unwrap();
        }
    }

    #[test]
    #[should_panic]
    fn lru_page_beyond_capacity_panics() {
        let (l, _reg) = lru(4, LruBatch::Pages(31));
        l.add(4);
    }

    // ---- Model test ----------------------------------------------------

    #[derive(Clone, Copy, Debug, PartialEq, Eq)]
    enum St {
        Absent,
        Queued { active: bool },
        Inactive,
        Active,
    }

    /// The reference model: two deques (front = head), per-page state, and
    /// the batched semantics spelt out: each kind of operation waits in its
    /// own batch of `batch` entries (0: applied at once), tagged with the
    /// page's generation; a full batch is applied alone; a drain applies
    /// adds, then deactivations, then activations.
    struct Model {
        batch: usize,
        st: Vec<St>,
        referenced: Vec<bool>,
        /// A request waiting in a batch (the ACT_QUEUED / DEACT_QUEUED bits).
        intent: Vec<Option<Kind>>,
        gen: Vec<u32>,
        inactive: VecDeque<PageId>,
        active: VecDeque<PageId>,
        add: Vec<(PageId, u32)>,
        activate: Vec<(PageId, u32)>,
        deactivate: Vec<(PageId, u32)>,
    }

    impl Model {
        fn new(capacity: usize, batch: usize) -> Self {
            Model {
                batch,
                st: vec![St::Absent; capacity],
                referenced: vec![false; capacity],
                intent: vec![None; capacity],
                gen: vec![0; capacity],
                inactive: VecDeque::new(),
                active: VecDeque::new(),
                add: Vec::new(),
                activate: Vec::new(),
                deactivate: Vec::new(),
            }
        }

        fn take(list: &mut VecDeque<PageId>, p: PageId) {
            let i = list.iter().position(|&x| x == p).expect("on list");
            list.remove(i);
        }

        fn apply(&mut self, kind: Kind, (p, g): (PageId, u32)) {
            let i = p as usize;
            if self.gen[i] != g {
                return;
            }
            match (kind, self.st[i]) {
                (Kind::Add, St::Queued { active }) => {
                    if active {
                        self.active.push_front(p);
                        self.st[i] = St::Active;
                    } else {
                        self.inactive.push_front(p);
                        self.st[i] = St::Inactive;
                    }
                }
                (Kind::Activate, st) if self.intent[i] == Some(Kind::Activate) => {
                    self.intent[i] = None;
                    if st == St::Inactive {
                        Self::take(&mut self.inactive, p);
                        self.active.push_front(p);
                        self.st[i] = St::Active;
                    }
                }
                (Kind::Deactivate, st) if self.intent[i] == Some(Kind::Deactivate) => {
                    self.intent[i] = None;
                    self.referenced[i] = false;
                    if st == St::Active {
                        Self::take(&mut self.active, p);
                        self.inactive.push_front(p);
                        self.st[i] = St::Inactive;
                    }
                }
                _ => {}
            }
        }

        fn queue(&mut self, kind: Kind, p: PageId) {
            let e = (p, self.gen[p as usize]);
            if self.batch == 0 {
                return self.apply(kind, e);
            }
            let b = match kind {
                Kind::Add => &mut self.add,
                Kind::Activate => &mut self.activate,
                Kind::Deactivate => &mut self.deactivate,
            };
            b.push(e);
            if b.len() == self.batch {
                let full = std::mem::take(b);
                for e in full {
                    self.apply(kind, e);
                }
            }
        }

        fn drain(&mut self) {
            for e in std::mem::take(&mut self.add) {
                self.apply(Kind::Add, e);
            }
            for e in std::mem::take(&mut self.deactivate) {
                self.apply(Kind::Deactivate, e);
            }
            for e in std::mem::take(&mut self.activate) {
                self.apply(Kind::Activate, e);
            }
        }

        fn add(&mut self, p: PageId) -> bool {
            if self.st[p as usize] != St::Absent {
                return false;
            }
            if self.batch == 0 {
                self.inactive.push_front(p);
                self.st[p as usize] = St::Inactive;
            } else {
                self.st[p as usize] = St::Queued { active: false };
                self.queue(Kind::Add, p);
            }
            true
        }

        /// The last request wins: a pending opposite request is cancelled,
        /// and a request is queued only when the page is on the other list
        /// with no request of its kind pending.
        fn request(&mut self, p: PageId, kind: Kind) {
            let i = p as usize;
            let (want, other) = match kind {
                Kind::Activate => (St::Active, Kind::Deactivate),
                _ => (St::Inactive, Kind::Activate),
            };
            match self.st[i] {
                St::Queued { .. } => {
                    let active = want == St::Active;
                    self.st[i] = St::Queued { active };
                    if !active {
                        self.referenced[i] = false;
                    }
                    return;
                }
                St::Absent => return,
                _ => {}
            }
            if self.intent[i] == Some(other) {
                self.intent[i] = None;
            }
            if self.st[i] == want || self.intent[i] == Some(kind) {
                return;
            }
            self.intent[i] = Some(kind);
            self.queue(kind, p);
        }

        fn activate(&mut self, p: PageId) {
            self.request(p, Kind::Activate)
        }

        fn deactivate(&mut self, p: PageId) {
            self.request(p, Kind::Deactivate)
        }

        fn mark_referenced(&mut self, p: PageId) {
            if self.st[p as usize] != St::Absent {
                self.referenced[p as usize] = true;
            }
        }

        fn depart(&mut self, p: PageId) {
            let i = p as usize;
            self.st[i] = St::Absent;
            self.referenced[i] = false;
            self.intent[i] = None;
            self.gen[i] = self.gen[i].wrapping_add(1);
        }

        fn remove(&mut self, p: PageId) -> bool {
            match self.st[p as usize] {
                St::Absent => return false,
                St::Inactive => Self::take(&mut self.inactive, p),
                St::Active => Self::take(&mut self.active, p),
                St::Queued { .. } => {}
            }
            self.depart(p);
            true
        }

        fn shrink(&mut self, nr_to_scan: usize, room: usize) -> Vec<PageId> {
            self.drain();
            let mut victims = Vec::new();
            let mut scanned = 0;
            while scanned < nr_to_scan && victims.len() < room {
                let Some(p) = self.inactive.pop_back() else {
                    break;
                };
                scanned += 1;
                if self.referenced[p as usize] {
                    self.referenced[p as usize] = false;
                    self.active.push_front(p);
                    self.st[p as usize] = St::Active;
                } else {
                    self.depart(p);
                    victims.push(p);
                }
            }
            victims
        }

        fn age(&mut self, nr_to_scan: usize) -> usize {
            self.drain();
            let mut deactivated = 0;
            for _ in 0..nr_to_scan.min(self.active.len()) {
                let p = self.active.pop_back().unwrap();
                if self.referenced[p as usize] {
                    self.referenced[p as usize] = false;
                    self.active.push_front(p);
                } else {
                    self.inactive.push_front(p);
                    self.st[p as usize] = St::Inactive;
                    deactivated += 1;
                }
            }
            deactivated
        }
    }

    const MODEL_PAGES: u32 = 64;

    #[derive(Clone, Debug)]
    enum Op {
        Add(PageId),
        Activate(PageId),
        Deactivate(PageId),
        MarkReferenced(PageId),
        Remove(PageId),
        Drain,
        Shrink(usize, usize),
        Age(usize),
    }

    fn op() -> impl Strategy<Value = Op> {
        let page = 0..MODEL_PAGES;
        prop_oneof![
            6 => page.clone().prop_map(Op::Add),
            5 => page.clone().prop_map(Op::Activate),
            2 => page.clone().prop_map(Op::Deactivate),
            3 => page.clone().prop_map(Op::MarkReferenced),
            2 => page.prop_map(Op::Remove),
            1 => Just(Op::Drain),
            1 => (0..24usize, 0..12usize).prop_map(|(n, r)| Op::Shrink(n, r)),
            1 => (0..24usize).prop_map(Op::Age),
        ]
    }

    fn run_model(mode: LruBatch, ops: &[Op]) -> Result<(), TestCaseError> {
        let reg = Registry::new();
        // One batch slot: the thread may migrate between CPUs, and the
        // model's batch-fill timing must be the implementation's.
        let l = Lru::new(LruConfig::new(MODEL_PAGES).batch(mode).cpus(1), &reg).unwrap();
        let batch = match mode {
            LruBatch::Unbatched => 0,
            LruBatch::Pages(n) => n,
        };
        let mut m = Model::new(MODEL_PAGES as usize, batch);
        let mut victims = [0; 16];
        for (i, op) in ops.iter().enumerate() {
            match *op {
                Op::Add(p) => prop_assert_eq!(l.add(p), m.add(p), "op {}: {:?}", i, op),
                Op::Activate(p) => {
                    l.activate(p);
                    m.activate(p);
                }
                Op::Deactivate(p) => {
                    l.deactivate(p);
                    m.deactivate(p);
                }
                Op::MarkReferenced(p) => {
                    l.mark_referenced(p);
                    m.mark_referenced(p);
                }
                Op::Remove(p) => prop_assert_eq!(l.remove(p), m.remove(p), "op {}: {:?}", i, op),
                Op::Drain => {
                    l.drain_all();
                    m.drain();
                }
                Op::Shrink(n, room) => {
                    let got = l.shrink_inactive(n, &mut victims[..room]);
                    let want = m.shrink(n, room);
                    prop_assert_eq!(&victims[..got], &want[..], "op {}: {:?}", i, op);
                }
                Op::Age(n) => prop_assert_eq!(l.age_active(n), m.age(n), "op {}: {:?}", i, op),
            }
            // The applied state is visible without draining.
            for p in 0..MODEL_PAGES {
                let st = m.st[p as usize];
                prop_assert_eq!(
                    l.on_lru(p),
                    matches!(st, St::Inactive | St::Active),
                    "op {}: {:?}: page {} on_lru",
                    i,
                    op,
                    p
                );
                prop_assert_eq!(l.is_active(p), st == St::Active, "op {}: page {}", i, p);
                prop_assert_eq!(l.is_resident(p), st != St::Absent);
                prop_assert_eq!(l.is_referenced(p), m.referenced[p as usize]);
            }
            prop_assert_eq!(l.nr_active(), m.active.len());
            prop_assert_eq!(l.nr_inactive(), m.inactive.len());
            if matches!(op, Op::Drain | Op::Shrink(..) | Op::Age(..)) {
                prop_assert_eq!(l.check_invariants(), Ok(()));
            }
        }
        l.drain_all();
        m.drain();
        let (inactive, active) = l.lists_snapshot();
        prop_assert_eq!(inactive, m.inactive.iter().copied().collect::<Vec<_>>());
        prop_assert_eq!(active, m.active.iter().copied().collect::<Vec<_>>());
        prop_assert_eq!(l.check_invariants(), Ok(()));
        Ok(())
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(192))]

        #[test]
        fn lru_model_batch_31(ops in prop::collection::vec(op(), 1..400)) {
            run_model(LruBatch::Pages(31), &ops)?;
        }

        #[test]
        fn lru_model_batch_15(ops in prop::collection::vec(op(), 1..400)) {
            run_model(LruBatch::Pages(15), &ops)?;
        }

        #[test]
        fn lru_model_batch_1(ops in prop::collection::vec(op(), 1..400)) {
            run_model(LruBatch::Pages(1), &ops)?;
        }

        #[test]
        fn lru_model_unbatched(ops in prop::collection::vec(op(), 1..400)) {
            run_model(LruBatch::Unbatched, &ops)?;
        }
    }

    // ---- Concurrency stress --------------------------------------------

    /// xorshift64*: a tiny deterministic generator per thread.
    struct Rng(u64);
    impl Rng {
        fn next(&mut self) -> u64 {
            self.0 ^= self.0 >> 12;
            self.0 ^= self.0 << 25;
            self.0 ^= self.0 >> 27;
            self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
        }
    }

    const STRESS_PAGES: u32 = 1024;
    const STRESS_THREADS: usize = 8;
    /// Operations per worker thread (7 workers + 1 reclaimer).
    const STRESS_OPS: usize = 150_000;

    /// 7 workers hammer overlapping pages (every page is reachable from
    /// every thread) with activate / deactivate / mark_referenced /
    /// remove + re-add / drain_local; one reclaimer shrinks and ages,
    /// re-adding most of its victims.  Ownership: a page is owned by the
    /// LRU while resident; whoever removes or isolates it owns it until
    /// re-adding it.  So the final resident set is known exactly.
    fn stress(mode: LruBatch) {
        let reg = Registry::new();
        let l = Lru::new(LruConfig::new(STRESS_PAGES).batch(mode), &reg).unwrap();
        for p in 0..STRESS_PAGES {
            assert!(l.add(p));
        }
        l.drain_all();
        let (held, ops): (Vec<Vec<PageId>>, Vec<u64>) = std::thread::scope(|s| {
            let handles: Vec<_> = (0..STRESS_THREADS)
                .map(|t| {
                    let l = &l;
                    s.spawn(move || {
                        let mut rng = Rng(0x9E37_79B9_7F4A_7C15 ^ ((t as u64 + 1) * 0x1234_5678_9abc));
                        let mut held: Vec<PageId> = Vec::new();
                        let mut ops = 0u64;
                        if t == 0 {
                            let mut victims = [0; 32];
                            for i in 0..STRESS_OPS / 8 {
                                if i % 3 == 0 {
                                    l.age_active(48);
                                } else {
                                    let n = l.shrink_inactive(48, &mut victims);
                                    held.extend_from_slice(&victims[..n]);
                                }
                                // Re-add all but a few of the victims.
                                while held.len() > 8 {
                                    let p = held.swap_remove(rng.next() as usize % held.len());
                                    assert!(l.add(p), "owned page {p} refused");
                                    ops += 1;
                                }
                                ops += 1;
                            }
                        } else {
                            for _ in 0..STRESS_OPS {
                                let r = rng.next();
                                let p = ((r >> 16) % STRESS_PAGES as u64) as PageId;
                                match r % 32 {
                                    0..=9 => l.activate(p),
                                    10..=15 => l.deactivate(p),
                                    16..=23 => l.mark_referenced(p),
                                    24..=26 => {
                                        if l.remove(p) {
                                            held.push(p);
                                        }
                                    }
                                    27..=29 => {
                                        if let Some(q) = held.pop() {
                                            assert!(l.add(q), "owned page {q} refused");
                                            // Touch it right away, racing its add.
                                            if r & (1 << 40) != 0 {
                                                l.activate(q);
                                            }
                                        }
                                    }
                                    30 => l.drain_local(),
                                    _ => {
                                        l.is_active(p);
                                        l.on_lru(p);
                                    }
                                }
                                ops += 1;
                            }
                        }
                        (held, ops)
                    })
                })
                .collect();
            handles
                .into_iter()
                .map(|h| h.join().expect("stress thread panicked"))
                .unzip()
        });
        let total_ops: u64 = ops.iter().sum();
        assert!(total_ops >= 1_000_000, "only {total_ops} ops");
        l.drain_all();
        l.check_invariants().unwrap_or_else(|e| panic!("{mode:?}: {e}"));
        let mut out = vec![false; STRESS_PAGES as usize];
        for &p in held.iter().flatten() {
            assert!(!out[p as usize], "{mode:?}: page {p} owned by two threads");
            out[p as usize] = true;
        }
        let nr_out = out.iter().filter(|&&o| o).count();
        for p in 0..STRESS_PAGES {
            assert_eq!(
                l.on_lru(p),
                !out[p as usize],
                "{mode:?}: page {p} resident mismatch"
            );
            assert!(l.is_resident(p) == l.on_lru(p), "page {p} still queued");
        }
        assert_eq!(
            l.nr_active() + l.nr_inactive(),
            STRESS_PAGES as usize - nr_out,
            "{mode:?}"
        );
        // Every page that joined the LRU left it or is still there.
        let s = reg.snapshot();
        assert_eq!(
            s.counters.lru_add - s.counters.lru_remove - s.counters.lru_isolated,
            (STRESS_PAGES as usize - nr_out) as u64,
            "{mode:?}: {s:?}"
        );
        assert!(s.counters.lru_isolated > 0 && s.counters.lru_remove > 0);
        assert!(s.counters.lru_activate > 0 && s.counters.lru_deactivate > 0);
    }

    #[test]
    fn lru_stress_batch_31() {
        stress(LruBatch::Pages(31));
    }

    #[test]
    fn lru_stress_batch_15() {
        stress(LruBatch::Pages(15));
    }

    #[test]
    fn lru_stress_batch_1() {
        stress(LruBatch::Pages(1));
    }

    #[test]
    fn lru_stress_unbatched() {
        stress(LruBatch::Unbatched);
    }
}
