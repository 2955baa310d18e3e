//! Eviction of small pages in batches: what the reclaimer does with the
//! victims the LRU gives it, paying one TLB flush per batch or per run of
//! neighbours instead of one per page.
//!
//! Every flush of this process's page tables is a cross-CPU shootdown as
//! soon as the program has a second thread, and on this machine kind one
//! costs about 12 us: per-page `UFFDIO_MOVE` paid it for every evicted
//! page.  A batch is taken apart by what each victim needs:
//!
//! - **Clean pages** (installed write-protected and never written since:
//!   their slot holds them, or they are zeros) are dropped where they are,
//!   the whole batch with one `process_madvise(MADV_DONTNEED)`: no copy,
//!   no IO, one flush.  This is safe because a clean page is
//!   write-protected: a write to it, by the program or by the kernel for a
//!   write pin (`O_DIRECT` reads, io_uring fixed buffers, RDMA all take
//!   their pins through a write fault), faults and waits on the claim the
//!   reclaimer holds, so nothing can land in the page between the check
//!   and the drop, and no device holds a write pin on it.  A read pin only
//!   reads a copy that equals the slot's.  A page the program discarded
//!   itself (not present, per `mincore`) reads as zeros: it becomes
//!   "never written", its slot freed.  A locked page (`mlock`: `EINVAL`)
//!   stays, unevictable.
//! - **Dirty pages** are soft-evicted into staging frames as before (the
//!   swap cache maps their new slots to the frames), but neighbours (pages
//!   next to each other in one region) go as one run, into neighbouring
//!   frames, with one `UFFDIO_MOVE`: the kernel clears a run's page-table
//!   entries under one flush (on this machine's Linux 6.18: 0.93 us a page
//!   for runs of 16, 0.29 for 64, 0.10 for 512, against 12-13 us a page
//!   one at a time; USERFAULTFD.md's probe, rerun).  A move still refuses
//!   a pinned page (`EBUSY`), a locked one (`EINVAL`) and a hole (`ENOENT`),
//!   and stops there: what moved is staged, the page that stopped it is
//!   dealt with alone, and the rest of the run goes on.  A dirty page may
//!   carry a write pin taken while it was writable, which is why dirty
//!   pages are moved, never dropped: only the move sees the pin.
//!
//! - **Sealed pages** (dirty, but write-protected since they came in from a
//!   compressed device that let its copy go: a sealed `PageWord`) go as clean
//!   ones do, in SIGBUS mode: copied into staging frames with
//!   `UFFDIO_COPY` (no flush), then dropped with the batch's one
//!   `process_madvise`; the same argument makes it safe (a write faults
//!   and waits on the claim; no write pin without a write fault).
//!
//! Scattered dirty victims still cost a flush each; the switch
//! `SwapBuilder::per_page_evict` restores per-page `UFFDIO_MOVE` for every
//! victim, clean ones included, to measure what batching gains.

use crate::pager::instance::inner::Inner;
use crate::pager::instance::page::{Kind, PageClaim, PageWord};
use crate::pager::instance::report;
use crate::pager::instance::staged;
use crate::swap_space::{SwapEntry, SwapError};
use crate::sys;
use crate::uffd::UffdError;
use crate::PAGE_SIZE;

const PAGE: u64 = PAGE_SIZE as u64;

/// Most victims one batch takes: the iovecs of one `process_madvise`.
pub(crate) const BATCH: usize = sys::DISCARD_BATCH;

/// What became of a batch of victims.
pub(crate) struct Outcome {
    /// Pages that left memory (dropped, or found discarded).
    pub gone: usize,
    /// Pages staged on probation: in memory, and off the charge for the
    /// dwell (`Budget`'s probation).
    pub probation: usize,
    /// Victims that stay resident, for the LRU: (id, refused by the
    /// kernel: pinned, locked).
    pub back: [(u32, bool); BATCH],
    pub nback: usize,
}

impl Outcome {
    pub fn new() -> Outcome {
        Outcome {
            gone: 0,
            probation: 0,
            back: [(0, false); BATCH],
            nback: 0,
        }
    }

    fn keep(&mut self, id: u32, refused: bool) {
        self.back[self.nback] = (id, refused);
        self.nback += 1;
    }

    fn settle(&mut self, id: u32, how: Evicted) {
        match how {
            Evicted::Gone | Evicted::Dropped(_) => self.gone += 1,
            Evicted::Probation => self.probation += 1,
            Evicted::InMemory => {}
            Evicted::Not => self.keep(id, false),
            Evicted::Refused => self.keep(id, true),
        }
    }
}

/// What became of one victim of eviction.
pub(crate) enum Evicted {
    /// Gone from memory with nothing left to discard.
    Gone,
    /// Moved to staging, still in memory.
    InMemory,
    /// Moved to staging on probation: in memory, and off the charge for
    /// the dwell.
    Probation,
    /// Dropped outright (clean, never written: zeros); its frame is to be
    /// discarded and returned.
    Dropped(u32),
    /// Not now (busy, no slot, no frame).
    Not,
    /// `UFFDIO_MOVE` refused it: pinned, locked or read-only.
    Refused,
}

/// Evict the small pages `ids` (at most [`BATCH`], fresh from the LRU) as
/// one batch.
pub(crate) fn evict(inner: &Inner, ids: &[u32], out: &mut Outcome) {
    debug_assert!(ids.len() <= BATCH);
    let mut claims: [Option<PageClaim<'_>>; BATCH] = [const { None }; BATCH];
    let (mut clean, mut nclean) = ([0u8; BATCH], 0);
    let (mut dirty, mut ndirty) = ([0u8; BATCH], 0);
    let (mut sealed, mut nsealed) = ([0u8; BATCH], 0);
    // Copying a sealed page out reads it through UFFDIO_COPY, which must
    // fail (SIGBUS mode: EFAULT) rather than wait for a handler thread if
    // the program discarded the page meanwhile: that thread would wait for
    // the claim this reclaimer holds.
    let copy_sealed = inner.uffd().features().contains(crate::uffd::Features::SIGBUS);
    for (i, &id) in ids.iter().enumerate().take(BATCH) {
        let st = &inner.states()[id as usize];
        let w = st.load();
        if !w.is(Kind::Resident) || w.is_busy() {
            out.keep(id, false);
            continue;
        }
        let is_dirty = w.is_dirty();
        if is_dirty && w.slot().is_none() && inner.no_free_slots() {
            // Nowhere to write it: do not move it out just to move it back.
            inner.counters().swap_full.inc();
            out.keep(id, false);
            continue;
        }
        let Some(claim) = st.try_claim(w) else {
            out.keep(id, false);
            continue;
        };
        if inner.pinned(id) {
            // A system call is using it (`Region::pin`): back, active.
            drop(claim);
            out.keep(id, true);
            continue;
        }
        // The word may have changed between the load and the claim only
        // by the claim itself: try_claim compares against `w`.
        claims[i] = Some(claim);
        if is_dirty && w.is_sealed() && copy_sealed {
            sealed[nsealed] = i as u8;
            nsealed += 1;
        } else if is_dirty {
            dirty[ndirty] = i as u8;
            ndirty += 1;
        } else {
            clean[nclean] = i as u8;
            nclean += 1;
        }
    }
    drop_clean(inner, ids, &mut claims, &clean[..nclean], out);
    stage_sealed(inner, ids, &mut claims, &sealed[..nsealed], out);
    let dirty = &mut dirty[..ndirty];
    dirty.sort_unstable_by_key(|&i| ids[i as usize]);
    let mut k = 0;
    while k < dirty.len() {
        let mut end = k + 1;
        while end < dirty.len() && neighbours(inner, ids[dirty[end - 1] as usize], ids[dirty[end] as usize]) {
            end += 1;
        }
        stage_run(inner, ids, &mut claims, &dirty[k..end], out);
        k = end;
    }
}

/// Whether page `b` follows page `a` in memory, in the same region (ids
/// of a region are consecutive, and so are its pages).
fn neighbours(inner: &Inner, a: u32, b: u32) -> bool {
    let addr = |id: u32| inner.addrs().get(id);
    b == a + 1 && addr(a) != 0 && addr(b) == addr(a) + PAGE
}

/// Drop the clean victims `idx` (indices into `ids` and `claims`) where
/// they are: one `process_madvise` for all of them.
fn drop_clean(
    inner: &Inner,
    ids: &[u32],
    claims: &mut [Option<PageClaim<'_>>; BATCH],
    idx: &[u8],
    out: &mut Outcome,
) {
    let mut ranges = [(0u64, 0usize); BATCH];
    let mut which = [0u8; BATCH];
    let mut n = 0;
    for &i in idx {
        let addr = inner.addrs().get(ids[i as usize]);
        let claim = claims[i as usize].take().expect("claimed");
        if !sys::page_mapped(addr) {
            // The program discarded (or unmapped) it: zeros now.
            discarded(inner, claim);
            out.gone += 1;
            continue;
        }
        claims[i as usize] = Some(claim);
        ranges[n] = (addr, PAGE_SIZE);
        which[n] = i;
        n += 1;
    }
    if n == 0 {
        return;
    }
    if !inner.discarder().discard(ranges[..n].iter().copied()) {
        // No process_madvise here, or a page would not go (process_madvise
        // stops at the first refusal): one by one, to find which.
        for (j, range) in ranges[..n].iter_mut().enumerate() {
            // SAFETY: a clean page we hold the claim of: its contents are
            // on its slot (or are zeros), and nothing can write it while
            // the claim is held (it is write-protected; see above).
            let Err(err) = (unsafe { sys::discard_pages(range.0, PAGE_SIZE) }) else {
                continue;
            };
            let i = which[j] as usize;
            let claim = claims[i].take().expect("claimed");
            match err.raw_os_error() {
                Some(libc::ENOMEM) => {
                    discarded(inner, claim);
                    out.gone += 1;
                }
                errno => {
                    drop(claim);
                    inner.unevictable(range.0, errno);
                    out.keep(ids[i], true);
                }
            }
            range.1 = 0;
        }
    }
    for (j, range) in ranges[..n].iter().enumerate() {
        if range.1 == 0 {
            continue;
        }
        let claim = claims[which[j] as usize].take().expect("claimed");
        let next = match claim.found().slot() {
            Some(e) => PageWord::of(Kind::Swapped)
                .with_slot(e)
                .with_shadow(inner.workingset().shadow()),
            None => PageWord::NEVER,
        };
        inner.counters().evict_clean.inc();
        inner.counters().evictions.inc();
        inner.budget().uncharge(1);
        claim.commit(next);
        out.gone += 1;
    }
}

/// Soft-evict the sealed victims `idx` (dirty, but write-protected since
/// they went in: a sealed `PageWord`) the way clean ones go: each is copied
/// into a staging frame with `UFFDIO_COPY` (which installs a page there,
/// no flush), cached under a fresh slot, and then all are dropped from the
/// region with one `process_madvise`: one flush for the batch, where
/// moving them costs one each.  Safe as dropping a clean page is: a write
/// would fault and wait on the claim, so the copy is the page.  A page the
/// program discarded meanwhile fails the copy (`EFAULT`) and reads zeros.
fn stage_sealed(
    inner: &Inner,
    ids: &[u32],
    claims: &mut [Option<PageClaim<'_>>; BATCH],
    idx: &[u8],
    out: &mut Outcome,
) {
    let pool = &inner.frames().staging;
    let mut copied = [(0u8, 0u32, SwapEntry::NONE); BATCH];
    let mut ranges = [(0u64, 0usize); BATCH];
    let mut n = 0;
    for &i in idx {
        let id = ids[i as usize];
        let addr = inner.addrs().get(id);
        let claim = claims[i as usize].take().expect("claimed");
        let Some(f) = pool.get() else {
            // No frame: writeback frees some; try later.
            drop(claim);
            out.keep(id, false);
            continue;
        };
        let e = match inner.alloc_slot() {
            Ok(e) => e,
            Err(err) => {
                if matches!(err, SwapError::Full { .. }) {
                    inner.counters().swap_full.inc();
                }
                pool.put(f);
                drop(claim);
                out.keep(id, false);
                continue;
            }
        };
        if let Err((_, err)) = inner.copy(pool.addr(f), addr as *const u8, PAGE, false) {
            inner.free_slot(e);
            pool.put(f);
            if err.errno() == Some(libc::EFAULT) {
                // Not there: the program discarded it.
                discarded(inner, claim);
                out.gone += 1;
            } else {
                drop(claim);
                out.keep(id, false);
            }
            continue;
        }
        let handle = staged::handle(f);
        if inner.backing().swap_cache.add(e, handle).is_err() {
            debug_assert!(false, "slot {e:?} already in the swap cache");
            inner.free_slot(e);
            inner.discard_frames(&[f]);
            drop(claim);
            out.keep(id, false);
            continue;
        }
        claims[i as usize] = Some(claim);
        copied[n] = (i, f, e);
        ranges[n] = (addr, PAGE_SIZE);
        n += 1;
    }
    if n == 0 {
        return;
    }
    // Dropped together; where that fails, one by one to find which.
    let all = inner.discarder().discard(ranges[..n].iter().copied());
    for j in 0..n {
        let (i, f, e) = copied[j];
        let claim = claims[i as usize].take().expect("claimed");
        if !all {
            // SAFETY: a sealed page we hold the claim of, whose contents
            // are in frame `f` now; nothing writes it while the claim is
            // held (write-protected, see above).
            if let Err(err) = unsafe { sys::discard_pages(ranges[j].0, PAGE_SIZE) } {
                inner.backing().swap_cache.delete(e);
                inner.free_slot(e);
                inner.discard_frames(&[f]);
                if err.raw_os_error() == Some(libc::ENOMEM) {
                    discarded(inner, claim);
                    out.gone += 1;
                } else {
                    drop(claim);
                    inner.unevictable(ranges[j].0, err.raw_os_error());
                    out.keep(ids[i as usize], true);
                }
                copied[j].2 = SwapEntry::NONE;
                continue;
            }
        }
        inner.counters().evict_copies.inc();
        staged(inner, claim, e, out);
    }
    enqueue_run(
        inner,
        copied[..n]
            .iter()
            .filter(|c| c.2 != SwapEntry::NONE)
            .map(|&(i, _, e)| (ids[i as usize], e)),
    );
}

/// Soft-evict the dirty victims `idx`, neighbours in one region, in
/// order: one `UFFDIO_MOVE` into as many neighbouring staging frames.
fn stage_run(
    inner: &Inner,
    ids: &[u32],
    claims: &mut [Option<PageClaim<'_>>; BATCH],
    idx: &[u8],
    out: &mut Outcome,
) {
    let n = idx.len();
    let pool = &inner.frames().staging;
    let Some(f0) = pool.get_run(n as u32) else {
        if n > 1 {
            // No run of frames that long (writeback is behind): halves.
            let half = n / 2;
            stage_run(inner, ids, claims, &idx[..half], out);
            stage_run(inner, ids, claims, &idx[half..], out);
        } else {
            // No frame at all: writeback frees some; try later.
            drop(claims[idx[0] as usize].take());
            out.keep(ids[idx[0] as usize], false);
        }
        return;
    };
    let frame = |j: usize| f0 + j as u32;
    // A fresh slot for each (the old one, if any, is stale), cached under
    // its frame: a touch from now on finds the page in the swap cache.
    let mut slots = [SwapEntry::NONE; BATCH];
    let mut m = 0;
    while m < n {
        let e = match inner.alloc_slot() {
            Ok(e) => e,
            Err(err) => {
                if matches!(err, SwapError::Full { .. }) {
                    inner.counters().swap_full.inc();
                }
                break;
            }
        };
        let handle = staged::handle(frame(m));
        if inner.backing().swap_cache.add(e, handle).is_err() {
            // The slot is fresh: it cannot be cached already.
            debug_assert!(false, "slot {e:?} already in the swap cache");
            inner.free_slot(e);
            break;
        }
        slots[m] = e;
        m += 1;
    }
    // What got no slot stays resident.
    for j in m..n {
        pool.put(frame(j));
        drop(claims[idx[j] as usize].take());
        out.keep(ids[idx[j] as usize], false);
    }
    let addr = |j: usize| inner.addrs().get(ids[idx[j] as usize]);
    let mut s = 0;
    while s < m {
        inner.counters().evict_moves.inc();
        let tried = inner.move_out(pool.addr(frame(s)), addr(s), (m - s) as u64 * PAGE);
        let (k, err) = match tried {
            Ok(()) => (m - s, None),
            Err((moved, err)) => ((moved / PAGE) as usize, Some(err)),
        };
        for j in s..s + k {
            staged(
                inner,
                claims[idx[j] as usize].take().expect("claimed"),
                slots[j],
                out,
            );
        }
        // On the ring together, so writeback finds them as one run.
        enqueue_run(inner, (s..s + k).map(|j| (ids[idx[j] as usize], slots[j])));
        s += k;
        let Some(mut err) = err else {
            break;
        };
        if k == 0 && m - s > 1 {
            // Refused before anything moved: a run can be refused whole
            // (it spans two mappings the program made of one region) where
            // its first page alone would move.
            inner.counters().evict_moves.inc();
            match inner.move_out(pool.addr(frame(s)), addr(s), PAGE) {
                Ok(()) => {
                    staged(
                        inner,
                        claims[idx[s] as usize].take().expect("claimed"),
                        slots[s],
                        out,
                    );
                    enqueue(inner, ids[idx[s] as usize], slots[s]);
                    s += 1;
                    continue;
                }
                Err((_, e)) => err = e,
            }
        }
        let claim_s = claims[idx[s] as usize].as_ref().expect("claimed");
        if err.errno() == Some(libc::EBUSY) && !claim_s.found().is_sealed() && inner.shared_after_fork() {
            // Shared since a fork: the rest of the run goes out in place,
            // into the frames and slots it has (`stage_shared`), or, where
            // that fails, is made this process's own and comes back next
            // pass (`unshare`).
            let rest = s..m;
            if stage_shared(inner, ids, claims, idx, rest.clone(), f0, &slots, out) {
                return;
            }
            for j in rest {
                inner.backing().swap_cache.delete(slots[j]);
                inner.free_slot(slots[j]);
                pool.put(frame(j));
                drop(claims[idx[j] as usize].take());
                out.keep(ids[idx[j] as usize], false);
            }
            unshare(inner, addr(s), (m - s) as u64 * PAGE);
            return;
        }
        // Page `s` will not move: undo its slot and frame, and say why.
        inner.backing().swap_cache.delete(slots[s]);
        inner.free_slot(slots[s]);
        let claim = claims[idx[s] as usize].take().expect("claimed");
        let how = not_moved(inner, claim, frame(s), addr(s), err);
        out.settle(ids[idx[s] as usize], how);
        s += 1;
    }
}

/// Stage the claimed victims `idx[run]` (neighbours, in order, a slot
/// each in `slots` and frames from `f0` on, cached already) where they
/// are, though a fork shares them with another process: `UFFDIO_MOVE`
/// refuses a page that is not this process's alone.
///
/// A forked child holds every page its parent had resident at the fork,
/// shared, and so does the parent: made each process's own first (the
/// write fault `unshare` takes), each such page was copied by the kernel
/// before it could go out, a copy that then moved out (two flushes).  The
/// kernel swaps such a page out in place, writing it once and dropping
/// each mapping; so does this, in this process: the run is
/// write-protected (a write to it now waits on the claims), copied into
/// its staging frames (`UFFDIO_COPY`), and this process's mapping dropped
/// in one `process_madvise` (one flush), the other process's copy left as
/// it is.  Returns false when the protection, the copy or the drop fails,
/// the run as it was in its region and its frames empty again (a frame
/// given back holding a copy would refuse the next page moved into it,
/// `EEXIST`): the caller unshares as before.
#[allow(clippy::too_many_arguments)]
fn stage_shared(
    inner: &Inner,
    ids: &[u32],
    claims: &mut [Option<PageClaim<'_>>; BATCH],
    idx: &[u8],
    run: std::ops::Range<usize>,
    f0: u32,
    slots: &[SwapEntry; BATCH],
    out: &mut Outcome,
) -> bool {
    let pool = &inner.frames().staging;
    let n = run.len() as u64;
    let at = inner.addrs().get(ids[idx[run.start] as usize]);
    let f1 = f0 + run.start as u32;
    let to = pool.addr(f1);
    // The frames `f1..f1 + k` emptied again: the caller returns them as
    // free, and a free staging frame holds no page (frames.rs).
    let empty = |k: u64| {
        let frames: [u32; BATCH] = std::array::from_fn(|j| f1 + j as u32);
        pool.discard_batch(&frames[..k as usize]);
    };
    if inner.uffd().writeprotect(at, n * PAGE, true, false).is_err() {
        return false;
    }
    let unprotect = || {
        let _ = inner.uffd().writeprotect(at, n * PAGE, false, true);
    };
    if let Err((done, _)) = inner.copy(to, at as *const u8, n * PAGE, false) {
        empty(done.div_ceil(PAGE));
        unprotect();
        return false;
    }
    if !inner
        .discarder()
        .discard(std::iter::once((at, (n * PAGE) as usize)))
    {
        // SAFETY: the claimed pages of this run, whose contents are in
        // their frames now; nothing writes them while the claims are held
        // (write-protected above).
        if unsafe { sys::discard_pages(at, (n * PAGE) as usize) }.is_err() {
            // madvise stops at the first mapping that refuses (a run the
            // program split with mlock): the pages before it are gone
            // from the region, and come back from their frames.
            for j in 0..n {
                let page = at + j * PAGE;
                if !sys::page_mapped(page) {
                    let _ = inner.put_in(page, pool.addr(f1 + j as u32), PAGE);
                }
            }
            empty(n);
            unprotect();
            return false;
        }
    }
    for j in run.clone() {
        inner.counters().evict_copies.inc();
        inner.counters().evict_shared.inc();
        staged(
            inner,
            claims[idx[j] as usize].take().expect("claimed"),
            slots[j],
            out,
        );
    }
    enqueue_run(inner, run.map(|j| (ids[idx[j] as usize], slots[j])));
    true
}

/// Make the dirty pages `[addr, addr + len)` (unclaimed) this process's
/// own again, so that `UFFDIO_MOVE` takes them.
///
/// A fork shares every private page with the child and clears the
/// kernel's mark that a page is this process's alone (`PageAnonExclusive`),
/// which `UFFDIO_MOVE` requires (`EBUSY` otherwise); the mark does not come
/// back when the child exits or execs, only at the next write fault, which
/// copies the page if the child still maps it and keeps it if not.  A
/// parent that forks once (`system`, a shell's command) kept every dirty
/// page it had then resident, over the budget, until it wrote each again.
/// `MADV_POPULATE_WRITE` takes that write fault for the whole run in one
/// call, as a write of the program's would, without touching the bytes.
/// The pages are not claimed meanwhile: a page the program discarded
/// since is a fault like any other (served, or EFAULT in SIGBUS mode),
/// and one a device has pinned for writing is the process's own already
/// (the kernel unshares before it pins), stays refused by the next move,
/// and is reported then.
///
/// In handler-thread mode a page that is gone would be a userfault that
/// waits for a handler thread, this one perhaps (a fault's direct
/// reclaim): only the runs of pages that are there are unshared
/// (`Inner::for_present_runs`); the rest are faults of the program's own.
fn unshare(inner: &Inner, addr: u64, len: u64) {
    inner.counters().evict_unshared.inc();
    inner.for_present_runs(addr, len, |at, n| {
        // SAFETY: advice on pages of a region, which leaves their contents
        // as they are (a write fault that writes nothing).
        let _ =
            unsafe { rustix::mm::madvise(at as *mut _, n as usize, rustix::mm::Advice::LinuxPopulateWrite) };
    });
}

/// A dirty page is in its staging frame now, cached under slot `e`; the
/// caller puts it on the staged ring.
fn staged(inner: &Inner, claim: PageClaim<'_>, e: SwapEntry, out: &mut Outcome) {
    let w = claim.found();
    // Its old slot (if any) holds an older copy.
    if let Some(o) = w.slot() {
        inner.free_slot(o);
    }
    inner.counters().staged.inc();
    if inner.budget().stage() {
        out.probation += 1;
    }
    claim.commit(
        PageWord::of(Kind::Staged)
            .dirty()
            .with_slot(e)
            .with_shadow(inner.workingset().shadow()),
    );
}

/// The program discarded (`MADV_DONTNEED`) or unmapped the claimed
/// resident page: its memory is gone already, and it reads as zeros.
fn discarded(inner: &Inner, claim: PageClaim<'_>) {
    if let Some(o) = claim.found().slot() {
        inner.free_slot(o);
    }
    inner.counters().discarded.inc();
    inner.budget().uncharge(1);
    claim.commit(PageWord::NEVER);
}

/// Staging frame `f` refused the page at `addr` (`EEXIST`): it was handed
/// out holding a page, which no free frame may (frames.rs).  Given back,
/// it refused every page moved into it after; it is set aside instead,
/// never handed out again (one frame less in the pool), and the first of
/// an instance is said with where the page was: a populated free frame is
/// a uswap bug whose cause is not known (docs/RELIABILITY.md), and a page
/// missing from its region here is the sign its sightings share.
fn frame_held_a_page(inner: &Inner, f: u32, addr: u64) {
    inner.counters().unevictable.inc();
    let region = if sys::page_mapped(addr) {
        "in its region"
    } else {
        "missing from its region"
    };
    report::once(
        &inner.reports().full_frame,
        format_args!(
            "uswap: staging frame {f} was handed out holding a page (UFFDIO_MOVE into it failed with EEXIST) as the page at {addr:#x}, {region}, went out; the frame is set aside. This is a uswap bug: please report this line (docs/RELIABILITY.md)"
        ),
    );
}

/// `UFFDIO_MOVE` would not move page `addr` (claimed) out into staging
/// frame `f`, taken for it: the frame goes back to the pool, or is set
/// aside if it refused the page for holding one (`EEXIST`), and the page
/// stays.
pub(crate) fn not_moved(inner: &Inner, claim: PageClaim<'_>, f: u32, addr: u64, err: UffdError) -> Evicted {
    if err.errno() == Some(libc::EEXIST) {
        frame_held_a_page(inner, f, addr);
        drop(claim);
        return Evicted::Not;
    }
    inner.frames().staging.put(f);
    refused(inner, claim, addr, err)
}

/// `UFFDIO_MOVE` would not move page `addr` out (claimed; nothing else
/// changed yet).  See the reclaim module's documentation for what each
/// refusal means.
pub(crate) fn refused(inner: &Inner, claim: PageClaim<'_>, addr: u64, err: UffdError) -> Evicted {
    match err.errno() {
        Some(libc::ENOENT) => {
            discarded(inner, claim);
            Evicted::Gone
        }
        errno => {
            drop(claim);
            inner.unevictable(addr, errno);
            Evicted::Refused
        }
    }
}

/// Whether `(id, slot)` is a live ring entry (`staged::live`).
pub(crate) fn live(inner: &Inner, id: u32, slot: u64) -> bool {
    staged::live(inner.states(), id, slot)
}

/// Put a staged page on the ring (its state says staged already, so the
/// entry is live when anyone can pop it).
pub(crate) fn enqueue(inner: &Inner, id: u32, e: SwapEntry) {
    enqueue_run(inner, std::iter::once((id, e)));
}

/// Put staged pages on the ring, in order, under one hold of its lock.
fn enqueue_run(inner: &Inner, pages: impl Iterator<Item = (u32, SwapEntry)>) {
    inner.backing().staged.lock().enqueue(inner.states(), pages);
}
