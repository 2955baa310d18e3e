//! Page codecs of the compressed device: LZ4 and zstd, through their C
//! libraries (`lz4-sys`, `zstd-sys`, the bindings the `lz4` and `zstd`
//! crates are built on), with every context made up front.
//!
//! Why the C libraries and not a pure-Rust codec: both calls must be
//! allocation-free.  Decompression runs in the fault path, which may be a
//! SIGBUS handler; compression runs in reclaim, which may be a faulting
//! thread's direct reclaim, in the same handler.  `lz4_flex` allocates its
//! 8 KiB hash table on every compression; LZ4's `LZ4_compress_fast_extState`
//! takes a state we own, and zstd takes contexts whose memory comes from
//! an allocator we hand it (`ZSTD_customMem`), counted, so a test proves
//! that a warmed-up context never allocates again ([`c_allocations`]).
//!
//! Contexts are few and shared: a [`Contexts`] holds one per possible CPU
//! and a thread takes its CPU's, or the first free one, or waits on its
//! CPU's.  A compression takes a few microseconds: contention is rare and
//! short.

use std::cell::Cell;
use std::ffi::{c_char, c_int, c_void};
use std::sync::{Mutex, MutexGuard, PoisonError};

use crate::PAGE_SIZE;

// LZ4's state-taking compressor, in `lz4.h` since 1.7 and built into the
// static library `lz4-sys` links; `lz4-sys` does not declare it.
extern "C" {
    fn LZ4_sizeofState() -> c_int;
    fn LZ4_initStream(state: *mut c_void, size: usize) -> *mut c_void;
    // In lz4.h's static-linking section (exported since 1.9): compresses
    // with a state `LZ4_initStream` prepared, resetting only what it must
    // instead of clearing all 16 KiB of it, which cost a tenth of a page's
    // compression.
    fn LZ4_compress_fast_extState_fastReset(
        state: *mut c_void,
        src: *const c_char,
        dst: *mut c_char,
        src_size: c_int,
        dst_capacity: c_int,
        acceleration: c_int,
    ) -> c_int;
}

/// Which compressor a compressed device uses.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
pub enum Codec {
    /// LZ4 at acceleration 1 (zram's and zswap's usual choice).
    Lz4,
    /// zstd at a level: 1 (fast) to 19; negative levels trade ratio for
    /// speed.
    Zstd {
        /// The level.
        level: i32,
    },
}

impl Codec {
    /// zstd's level when none is given, by `uswap bench codec`
    /// (docs/history/PERFORMANCE-LOG.md, "Compressed RAM"): level 1 stores the
    /// benches' text pages in 0.63x of LZ4's bytes, at 2.5x LZ4's
    /// compression time and 4x its decompression; level 3 saves 2% more
    /// bytes for 1.3x level 1's time, level 9 5% more for 6x.
    pub const ZSTD_DEFAULT_LEVEL: i32 = 1;

    /// The codec's name as the swap spec writes it (`lz4`, `zstd:3`).
    pub fn name(&self) -> String {
        match self {
            Codec::Lz4 => "lz4".into(),
            Codec::Zstd { level } => format!("zstd:{level}"),
        }
    }

    /// Whether the codec gives up on a page that does not compress about
    /// as fast as a look at a sample of its bytes would tell (`uswap bench
    /// codec --data random`: LZ4 0.75 us, zstd -3 1.05 us, -1 1.3 us;
    /// levels 1, 3 and 9 2.6, 3.6 and 15 us).  For such a codec the sample
    /// check costs more than it saves: it reads every cache line of a
    /// page the codec then reads again, on every page, where most pages
    /// compress (xz -9 on compressed RAM, the check off: 22.0 s against
    /// 23.4 s, 13.6 user CPU-seconds against 15.2, three runs each).
    pub fn gives_up_fast(&self) -> bool {
        match self {
            Codec::Lz4 => true,
            Codec::Zstd { level } => *level < 1,
        }
    }
}

impl std::fmt::Display for Codec {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.name())
    }
}

thread_local! {
    /// Allocations the C libraries have made through us on this thread:
    /// zstd contexts allocate through [`counted_alloc`].  Const-initialised,
    /// so counting allocates nothing.
    static C_ALLOCATIONS: Cell<u64> = const { Cell::new(0) };
}

/// Allocations zstd has made through this module on the calling thread
/// (see `C_ALLOCATIONS`); a test takes it around warmed-up calls.
pub fn c_allocations() -> u64 {
    C_ALLOCATIONS.with(Cell::get)
}

unsafe extern "C" fn counted_alloc(_opaque: *mut c_void, size: usize) -> *mut c_void {
    let _ = C_ALLOCATIONS.try_with(|c| c.set(c.get() + 1));
    // SAFETY: plain malloc; zstd frees it through `counted_free`.
    unsafe { libc::malloc(size) }
}

unsafe extern "C" fn counted_free(_opaque: *mut c_void, p: *mut c_void) {
    // SAFETY: `p` came from `counted_alloc` (malloc) or is null.
    unsafe { libc::free(p) }
}

fn custom_mem() -> zstd_sys::ZSTD_customMem {
    zstd_sys::ZSTD_customMem {
        customAlloc: Some(counted_alloc),
        customFree: Some(counted_free),
        opaque: std::ptr::null_mut(),
    }
}

/// One compressor's and one decompressor's state.
struct Context {
    /// LZ4's compression state (`LZ4_sizeofState` bytes, 8-aligned).
    lz4: Box<[u64]>,
    /// zstd's contexts, null for LZ4.
    cctx: *mut zstd_sys::ZSTD_CCtx,
    dctx: *mut zstd_sys::ZSTD_DCtx,
}

// SAFETY: the raw contexts are owned by this value and used by one thread
// at a time (each `Context` sits behind a mutex in `Contexts`).
unsafe impl Send for Context {}

impl Drop for Context {
    fn drop(&mut self) {
        // SAFETY: created by ZSTD_create*_advanced (or null, which the
        // free functions accept), freed once here.
        unsafe {
            zstd_sys::ZSTD_freeCCtx(self.cctx);
            zstd_sys::ZSTD_freeDCtx(self.dctx);
        }
    }
}

/// Why a codec's contexts could not be made.
#[derive(Debug, thiserror::Error)]
pub enum CodecError {
    /// A zstd level out of range.
    #[error("zstd level {level} is out of range: give {min}..={max} (1 is the default; negative levels are faster, higher ones smaller)")]
    Level {
        /// The level.
        level: i32,
        /// The lowest level.
        min: i32,
        /// The highest level.
        max: i32,
    },
    /// The C library could not make a context (out of memory).
    #[error("cannot make a {codec} context: out of memory")]
    NoMemory {
        /// The codec's name.
        codec: &'static str,
    },
}

/// The contexts of one codec, one per possible CPU.
pub struct Contexts {
    codec: Codec,
    slots: Box<[crossbeam_utils::CachePadded<Mutex<Context>>]>,
}

impl std::fmt::Debug for Contexts {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Contexts")
            .field("codec", &self.codec)
            .field("contexts", &self.slots.len())
            .finish()
    }
}

impl Contexts {
    /// Contexts for `codec`, each warmed up with a page of text so that
    /// its memory is allocated now, not on the fault path.
    pub fn new(codec: Codec) -> Result<Contexts, CodecError> {
        if let Codec::Zstd { level } = codec {
            // SAFETY: pure queries.
            let (min, max) = unsafe { (zstd_sys::ZSTD_minCLevel(), zstd_sys::ZSTD_maxCLevel()) };
            if level < min || level > max || level == 0 {
                return Err(CodecError::Level { level, min, max });
            }
        }
        let n = crate::percpu::possible_cpus().max(1);
        let mut slots = Vec::with_capacity(n);
        for _ in 0..n {
            slots.push(crossbeam_utils::CachePadded::new(Mutex::new(Self::context(
                codec,
            )?)));
        }
        let contexts = Contexts {
            codec,
            slots: slots.into_boxed_slice(),
        };
        let mut warm = vec![0u8; PAGE_SIZE];
        for (i, b) in warm.iter_mut().enumerate() {
            *b = b"uswap warms its codec contexts up "[i % 34] ^ (i / 97) as u8;
        }
        let mut out = vec![0u8; PAGE_SIZE];
        let mut back = vec![0u8; PAGE_SIZE];
        for slot in contexts.slots.iter() {
            let mut c = slot.lock().unwrap_or_else(PoisonError::into_inner);
            let n = Self::compress_with(codec, &mut c, &warm, &mut out).expect("text compresses");
            assert!(
                Self::decompress_with(codec, &mut c, &out[..n], &mut back),
                "{codec}: warm-up round trip"
            );
        }
        Ok(contexts)
    }

    fn context(codec: Codec) -> Result<Context, CodecError> {
        match codec {
            Codec::Lz4 => {
                // SAFETY: a pure query.
                let size = unsafe { LZ4_sizeofState() } as usize;
                let mut lz4 = vec![0u64; size.div_ceil(8)].into_boxed_slice();
                // SAFETY: `size` bytes, 8-aligned, ours.
                let ok = unsafe { LZ4_initStream(lz4.as_mut_ptr().cast(), size) };
                if ok.is_null() {
                    return Err(CodecError::NoMemory { codec: "lz4" });
                }
                Ok(Context {
                    lz4,
                    cctx: std::ptr::null_mut(),
                    dctx: std::ptr::null_mut(),
                })
            }
            Codec::Zstd { .. } => {
                // SAFETY: creation with our counted allocator; null on
                // failure, checked.
                let (cctx, dctx) = unsafe {
                    (
                        zstd_sys::ZSTD_createCCtx_advanced(custom_mem()),
                        zstd_sys::ZSTD_createDCtx_advanced(custom_mem()),
                    )
                };
                let c = Context {
                    lz4: Box::new([]),
                    cctx,
                    dctx,
                };
                if cctx.is_null() || dctx.is_null() {
                    return Err(CodecError::NoMemory { codec: "zstd" });
                }
                Ok(c)
            }
        }
    }

    /// The codec these contexts run.
    pub fn codec(&self) -> Codec {
        self.codec
    }

    /// This CPU's context, or any free one, or this CPU's when it frees.
    fn take(&self) -> MutexGuard<'_, Context> {
        let n = self.slots.len();
        let home = crate::percpu::current_cpu() % n;
        for i in 0..n {
            if let Ok(g) = self.slots[(home + i) % n].try_lock() {
                return g;
            }
        }
        self.slots[home].lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Compress the page `src` into `dst`; the compressed length, or
    /// `None` when it does not fit in `dst` (the page does not compress
    /// that well).  Allocation-free.
    pub fn compress(&self, src: &[u8], dst: &mut [u8]) -> Option<usize> {
        let mut c = self.take();
        Self::compress_with(self.codec, &mut c, src, dst)
    }

    /// Decompress `src` into the page `dst`; false when `src` is not a
    /// page this codec made (a corrupt store).  Allocation-free.
    pub fn decompress(&self, src: &[u8], dst: &mut [u8]) -> bool {
        let mut c = self.take();
        Self::decompress_with(self.codec, &mut c, src, dst)
    }

    fn compress_with(codec: Codec, c: &mut Context, src: &[u8], dst: &mut [u8]) -> Option<usize> {
        match codec {
            Codec::Lz4 => {
                // SAFETY: the state is LZ4_sizeofState() bytes, 8-aligned,
                // initialised by LZ4_initStream and used for nothing but
                // this call; src and dst are valid for their lengths; LZ4
                // writes at most `dst.len()` bytes and returns 0 when they
                // do not suffice.
                let n = unsafe {
                    LZ4_compress_fast_extState_fastReset(
                        c.lz4.as_mut_ptr().cast(),
                        src.as_ptr().cast(),
                        dst.as_mut_ptr().cast(),
                        src.len() as c_int,
                        dst.len() as c_int,
                        1,
                    )
                };
                (n > 0).then_some(n as usize)
            }
            Codec::Zstd { level } => {
                // SAFETY: a live context of ours, used by this thread
                // alone (the guard); zstd writes at most `dst.len()` bytes
                // and returns an error code when they do not suffice.
                let n = unsafe {
                    zstd_sys::ZSTD_compressCCtx(
                        c.cctx,
                        dst.as_mut_ptr().cast(),
                        dst.len(),
                        src.as_ptr().cast(),
                        src.len(),
                        level,
                    )
                };
                // SAFETY: a pure query.
                (unsafe { zstd_sys::ZSTD_isError(n) } == 0).then_some(n)
            }
        }
    }

    fn decompress_with(codec: Codec, c: &mut Context, src: &[u8], dst: &mut [u8]) -> bool {
        match codec {
            Codec::Lz4 => {
                // SAFETY: LZ4's safe decoder reads at most `src.len()` and
                // writes at most `dst.len()` bytes, whatever `src` holds.
                let n = unsafe {
                    lz4_sys::LZ4_decompress_safe(
                        src.as_ptr().cast(),
                        dst.as_mut_ptr().cast(),
                        src.len() as c_int,
                        dst.len() as c_int,
                    )
                };
                n as usize == dst.len()
            }
            Codec::Zstd { .. } => {
                // SAFETY: as for compression: bounded reads and writes.
                let n = unsafe {
                    zstd_sys::ZSTD_decompressDCtx(
                        c.dctx,
                        dst.as_mut_ptr().cast(),
                        dst.len(),
                        src.as_ptr().cast(),
                        src.len(),
                    )
                };
                n == dst.len()
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn text_page(seed: u64) -> Vec<u8> {
        let words = [
            "swap ", "cluster ", "slot ", "extent ", "the ", "page ", "of ", "trunk ",
        ];
        let mut s = Vec::with_capacity(PAGE_SIZE);
        let mut x = seed | 1;
        while s.len() < PAGE_SIZE {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            s.extend_from_slice(words[(x % 8) as usize].as_bytes());
        }
        s.truncate(PAGE_SIZE);
        s
    }

    #[test]
    fn every_codec_round_trips_text_and_refuses_what_does_not_fit() {
        for codec in [
            Codec::Lz4,
            Codec::Zstd { level: 1 },
            Codec::Zstd { level: 5 },
            Codec::Zstd { level: -3 },
        ] {
            let cx = Contexts::new(codec).unwrap();
            let page = text_page(7);
            let mut out = vec![0u8; PAGE_SIZE];
            let n = cx.compress(&page, &mut out).unwrap();
            assert!(n < PAGE_SIZE / 2, "{codec}: text took {n} bytes");
            let mut back = vec![0u8; PAGE_SIZE];
            assert!(cx.decompress(&out[..n], &mut back), "{codec}");
            assert_eq!(back, page, "{codec}");
            // A corrupt page is refused, not a crash.
            let mut bad = out[..n].to_vec();
            bad.truncate(n / 2);
            assert!(!cx.decompress(&bad, &mut back), "{codec}: half a page decoded");
            // Random bytes do not fit in half a page.
            let mut x = 0x1234_5678u64;
            let random: Vec<u8> = (0..PAGE_SIZE)
                .map(|_| {
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    (x >> 24) as u8
                })
                .collect();
            assert_eq!(cx.compress(&random, &mut out[..PAGE_SIZE / 2]), None, "{codec}");
        }
    }

    #[test]
    fn bad_zstd_levels_are_refused_in_one_line() {
        let e = Contexts::new(Codec::Zstd { level: 99 }).unwrap_err().to_string();
        assert!(e.contains("zstd level 99 is out of range"), "{e}");
        assert!(!e.contains('\n'));
        assert!(Contexts::new(Codec::Zstd { level: 0 }).is_err());
    }

    #[test]
    fn warmed_up_zstd_contexts_never_allocate() {
        let cx = Contexts::new(Codec::Zstd { level: 3 }).unwrap();
        let mut out = vec![0u8; PAGE_SIZE];
        let mut back = vec![0u8; PAGE_SIZE];
        let before = c_allocations();
        for seed in 0..200 {
            let page = text_page(seed);
            let n = cx.compress(&page, &mut out).unwrap();
            assert!(cx.decompress(&out[..n], &mut back));
            assert_eq!(back, page);
        }
        assert_eq!(c_allocations(), before, "zstd allocated after warm-up");
    }
}
