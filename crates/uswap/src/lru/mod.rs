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

mod lists;
mod shrink;

pub use lists::{Lru, LruBatch, LruConfig, LruError, PageId, DEFAULT_BATCH, MAX_BATCH};
