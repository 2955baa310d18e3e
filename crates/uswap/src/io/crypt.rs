//! Encrypted and authenticated slots: what a file device writes is
//! AES-256-GCM, under a key that never leaves this process's memory.
//!
//! A swap file holds a copy of a process's memory (its keys, passwords,
//! data); the kernel leaves protecting it to dm-crypt set up by hand,
//! OpenBSD encrypts swap by default.  So does uswap: every file device
//! has a [`Sealer`], and every page written to one is sealed on its way:
//!
//! - **The key** is 256 random bits (`getrandom`) drawn when the device
//!   is made, expanded into AES round keys in a page of its own that is
//!   locked in memory where `RLIMIT_MEMLOCK` allows, left out of core
//!   dumps (`MADV_DONTDUMP`), and zeroed before it is unmapped.  It is
//!   never written anywhere.  A forked child inherits it (memory, copied
//!   on write) and can read its parent's slots; nothing else can.
//! - **The nonce** of a write is a per-device counter, bumped for every
//!   page sealed: no two writes under one key share a nonce, which is
//!   what GCM's secrecy and integrity rest on.  Only the process that made
//!   the device seals (a forked child's copy of the counter would repeat
//!   its parent's nonces; the pager never lets a child write its parent's
//!   file, and a seal from another process is refused here as well).
//! - **Associated data** is the slot number: a block copied to another
//!   slot fails the check, and a block copied to another device fails it
//!   under that device's own key.
//! - **Per slot, in memory**, the nonce counter and the 16-byte tag of
//!   its last write (24 bytes a slot, 0.6% of the swap, committed as
//!   used).  A block on disk must match both: an older block put back
//!   (replayed) carries an older nonce's tag and fails, as does any
//!   flipped bit.  A slot freed forgets both ([`Sealer::forget`]): its
//!   block can never be read back, by anyone, which is how freed slots
//!   are scrubbed (the ciphertext left on disk is noise without the key,
//!   and the key is zeroed when the device goes).
//!
//! A page that fails its check is zeroed in the buffer and the read
//! fails with [`IoError::Integrity`]; the pager poisons the page (its
//! access gets SIGBUS, the reason goes to stderr), as for a failing disk.
//! Nothing ever reads back wrong data.
//!
//! Writes seal into a bounce buffer (the caller's page is left as it
//! was): a small pool of 2 MiB slabs per device for the synchronous
//! path, taken per CPU, and the io_uring writer's own buffer for queued
//! writeback (`uring.rs`).  Neither path allocates.  AES-GCM by ring
//! (VAES and carry-less multiply on this CPU): 0.5-0.8 us a 4 KiB page
//! sealed, against 1.7-2.2 us for ChaCha20-Poly1305 and 2.0 / 4.8 us for
//! RustCrypto's AES-GCM / XChaCha20 (measured side by side; DESIGN.md).

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use ring::aead::{Aad, LessSafeKey, Nonce, Tag, UnboundKey, AES_256_GCM};
use ring::rand::{SecureRandom, SystemRandom};

use super::error::IoError;
use crate::percpu;
use crate::sys::Mapping;
use crate::PAGE_SIZE;

/// Pages in one bounce slab: a synchronous write goes out in pieces of
/// at most this many pages (one `pwrite` each).  A 2 MB unit's worth: cut
/// into 64 KiB pieces, a unit's write waited on 32 disk round trips and
/// ran at a third of plaintext's speed (0.69 against 2.04 GB/s,
/// seq-write --units 2m).  A slab is committed only as far as a write
/// reaches into it: 4 KiB writes use its first page.
pub(crate) const SLAB_PAGES: usize = 512;

/// Where the key lives: one page of its own, locked where the limits
/// allow, out of core dumps, zeroed before it is unmapped.
struct KeyPage {
    page: Mapping,
}

// The expanded key must fit the page.
const _: () = assert!(std::mem::size_of::<LessSafeKey>() <= PAGE_SIZE / 2);

impl KeyPage {
    /// A fresh random key, expanded in place.
    fn new() -> Result<KeyPage, std::io::Error> {
        let page = Mapping::new(PAGE_SIZE, PAGE_SIZE)?;
        page.exclude_from_dumps();
        // Best effort: RLIMIT_MEMLOCK may be 0 for this user.  Unlocked,
        // the key page could reach kernel swap if that is on.
        page.lock();
        let base = page.as_ptr();
        // The raw key in the page's upper half, for the instant it takes
        // to expand it.
        // SAFETY: the upper half of our own fresh mapping, nobody else's.
        let raw = unsafe { std::slice::from_raw_parts_mut(base.add(PAGE_SIZE / 2), 32) };
        SystemRandom::new()
            .fill(raw)
            .map_err(|_| std::io::Error::other("getrandom failed"))?;
        let key = UnboundKey::new(&AES_256_GCM, raw).expect("a 32-byte key is an AES-256 key");
        // SAFETY: the lower half of the page is ours, page-aligned (more
        // than LessSafeKey's alignment) and large enough (asserted).
        unsafe { std::ptr::write(base.cast::<LessSafeKey>(), LessSafeKey::new(key)) };
        scrub(raw);
        Ok(KeyPage { page })
    }

    fn key(&self) -> &LessSafeKey {
        // SAFETY: written in `new`, dropped only in `drop`.
        unsafe { &*self.page.as_ptr().cast::<LessSafeKey>() }
    }
}

impl Drop for KeyPage {
    fn drop(&mut self) {
        let base = self.page.as_ptr();
        // SAFETY: the key written in `new`; no reference to it outlives
        // `&mut self`.  Then the whole page is ours to overwrite.
        unsafe {
            std::ptr::drop_in_place(base.cast::<LessSafeKey>());
            scrub(std::slice::from_raw_parts_mut(base, PAGE_SIZE));
        }
    }
}

/// Zero `bytes` in a way the compiler may not drop as a dead store.
fn scrub(bytes: &mut [u8]) {
    for b in bytes.iter_mut() {
        // SAFETY: a valid, exclusive byte.
        unsafe { std::ptr::write_volatile(b, 0) };
    }
    std::sync::atomic::compiler_fence(Ordering::SeqCst);
}

/// Page-aligned slabs to seal into, for the synchronous write path.
struct Bounce {
    slabs: Mapping,
    busy: Box<[AtomicBool]>,
}

/// A slab taken from a [`Bounce`]; given back on drop.
struct Slab<'a> {
    bounce: &'a Bounce,
    i: usize,
}

impl Bounce {
    fn new(n: usize) -> Result<Bounce, std::io::Error> {
        Ok(Bounce {
            slabs: Mapping::new(n * SLAB_PAGES * PAGE_SIZE, PAGE_SIZE)?,
            busy: (0..n).map(|_| AtomicBool::new(false)).collect(),
        })
    }

    /// A free slab, starting with this CPU's pair.  Every holder is a
    /// thread in the middle of one write, which gives its slab back
    /// before it could wait on anything, so the wait here is short.
    fn take(&self) -> Slab<'_> {
        let n = self.busy.len();
        let start = percpu::current_cpu() * 2 % n;
        loop {
            for k in 0..n {
                let i = (start + k) % n;
                if !self.busy[i].load(Ordering::Relaxed) && !self.busy[i].swap(true, Ordering::Acquire) {
                    return Slab { bounce: self, i };
                }
            }
            std::thread::yield_now();
        }
    }
}

impl Slab<'_> {
    fn bytes(&mut self) -> &mut [u8] {
        let len = SLAB_PAGES * PAGE_SIZE;
        // SAFETY: slab `i` of the mapping, ours alone while `busy[i]`.
        unsafe { std::slice::from_raw_parts_mut(self.bounce.slabs.as_ptr().add(self.i * len), len) }
    }
}

impl Drop for Slab<'_> {
    fn drop(&mut self) {
        self.bounce.busy[self.i].store(false, Ordering::Release);
    }
}

/// One file device's key, nonces and per-slot seals.
pub struct Sealer {
    key: KeyPage,
    /// The process that made the device, the only one that may seal.
    owner: i32,
    /// The next nonce; 0 is never used (it marks a slot with no seal).
    next: AtomicU64,
    /// Per slot: its nonce, then its tag's two halves.  Written by the
    /// slot's owner before its block goes to disk and read by the owner
    /// after; the pager's hand-over of the slot orders the two.  Atomic,
    /// so that a caller breaking that contract reads a wrong seal (an
    /// integrity error), never undefined behaviour.
    seals: Box<[AtomicU64]>,
    bounce: Bounce,
}

impl Sealer {
    /// A sealer for `slots` slots, with a fresh key.
    pub fn new(slots: u64) -> Result<Sealer, IoError> {
        let map_err = |source| IoError::Mmap {
            what: "an encrypted swap file (its key and bounce buffers)",
            source,
        };
        let n = usize::try_from(slots)
            .ok()
            .and_then(|s| s.checked_mul(3))
            .ok_or(IoError::ZeroSize)?;
        Ok(Sealer {
            key: KeyPage::new().map_err(map_err)?,
            owner: std::process::id() as i32,
            next: AtomicU64::new(1),
            seals: crate::table::zeroed(n, "the seals of an encrypted swap file")?,
            bounce: Bounce::new((2 * percpu::possible_cpus()).clamp(2, 128)).map_err(map_err)?,
        })
    }

    fn nonce(n: u64) -> Nonce {
        let mut b = [0u8; 12];
        b[..8].copy_from_slice(&n.to_le_bytes());
        Nonce::assume_unique_for_key(b)
    }

    /// Seal the pages of `src` for slots `offset..` into `dst` (same
    /// length), recording each slot's nonce and tag.
    pub fn seal(&self, offset: u64, src: &[u8], dst: &mut [u8]) -> Result<(), IoError> {
        debug_assert_eq!(src.len(), dst.len());
        if rustix::process::getpid().as_raw_nonzero().get() != self.owner {
            return Err(IoError::Write {
                offset,
                source: std::io::Error::other(
                    "a forked child may not write its parent's encrypted swap file (its nonces would repeat)",
                ),
            });
        }
        let pages = src.len() / PAGE_SIZE;
        let first = self.next.fetch_add(pages as u64, Ordering::Relaxed);
        for (i, (s, d)) in src
            .chunks_exact(PAGE_SIZE)
            .zip(dst.chunks_exact_mut(PAGE_SIZE))
            .enumerate()
        {
            let slot = offset + i as u64;
            let n = first + i as u64;
            d.copy_from_slice(s);
            let tag = self
                .key
                .key()
                .seal_in_place_separate_tag(Self::nonce(n), Aad::from(slot.to_le_bytes()), d)
                .expect("a page is far below GCM's length limit");
            let t = tag.as_ref();
            let at = slot as usize * 3;
            self.seals[at + 1].store(u64::from_le_bytes(t[..8].try_into().unwrap()), Ordering::Relaxed);
            self.seals[at + 2].store(u64::from_le_bytes(t[8..].try_into().unwrap()), Ordering::Relaxed);
            self.seals[at].store(n, Ordering::Release);
        }
        Ok(())
    }

    /// Write `buf` to slots `offset..` sealed, through a bounce slab:
    /// `write(slot, sealed pages)` for each piece of at most
    /// [`SLAB_PAGES`] pages.
    pub fn write_sealed(
        &self,
        offset: u64,
        buf: &[u8],
        mut write: impl FnMut(u64, &[u8]) -> Result<(), IoError>,
    ) -> Result<(), IoError> {
        let mut slab = self.bounce.take();
        for (k, piece) in buf.chunks(SLAB_PAGES * PAGE_SIZE).enumerate() {
            let at = offset + (k * SLAB_PAGES) as u64;
            let dst = &mut slab.bytes()[..piece.len()];
            self.seal(at, piece, dst)?;
            write(at, dst)?;
        }
        Ok(())
    }

    /// Check and decrypt, in place, the pages read from slots `offset..`
    /// into `buf`.  A page that fails is zeroed and named in the error.
    pub fn open(&self, offset: u64, buf: &mut [u8]) -> Result<(), IoError> {
        for (i, page) in buf.chunks_exact_mut(PAGE_SIZE).enumerate() {
            let slot = offset + i as u64;
            let at = slot as usize * 3;
            let n = self.seals[at].load(Ordering::Acquire);
            let mut t = [0u8; 16];
            t[..8].copy_from_slice(&self.seals[at + 1].load(Ordering::Relaxed).to_le_bytes());
            t[8..].copy_from_slice(&self.seals[at + 2].load(Ordering::Relaxed).to_le_bytes());
            let opened = n != 0
                && self
                    .key
                    .key()
                    .open_in_place_separate_tag(
                        Self::nonce(n),
                        Aad::from(slot.to_le_bytes()),
                        Tag::from(t),
                        page,
                        0..,
                    )
                    .is_ok();
            if !opened {
                // Whatever the failed open left there is not the page.
                page.fill(0);
                return Err(IoError::Integrity {
                    offset: slot,
                    sealed: n != 0,
                });
            }
        }
        Ok(())
    }

    /// Slots `offset..offset + pages` were freed: forget their seals, so
    /// their blocks can never be read back.
    pub fn forget(&self, offset: u64, pages: u64) {
        for slot in offset..offset + pages {
            let at = slot as usize * 3;
            self.seals[at].store(0, Ordering::Release);
            self.seals[at + 1].store(0, Ordering::Relaxed);
            self.seals[at + 2].store(0, Ordering::Relaxed);
        }
    }
}
