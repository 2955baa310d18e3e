//! A swap device on another machine: an NBD export (`nbd://HOST/EXPORT`,
//! `nbd+unix:///EXPORT?socket=PATH`), served by what users already run
//! for remote blocks (`nbdkit`, `qemu-nbd`, `nbd-server`).
//!
//! From the ground up: `target.rs` (the URI), `wire.rs` (the protocol),
//! `conn.rs` (a socket); this file is the store.
//!
//! **Connections.**  Several when the server says its connections see
//! one another's writes (`NBD_FLAG_CAN_MULTI_CONN`), else one: a page
//! written on one connection and read on another must come back as
//! written.  A call takes a connection whole (the first free one, else
//! waits for one), sends all its requests (a run longer than the
//! server's largest payload is several, in flight together), then reads
//! their replies, in whatever order the server sends them: each cookie
//! names its piece.  So the stream is never shared mid-request, and a
//! read's data lands straight in the caller's buffer.  Nothing on this
//! path allocates; the fault path calls it from a SIGBUS handler or a
//! handler thread alike.
//!
//! **A lost server** (DESIGN.md, "The remote tier"): a connection that
//! fails (closed, reset, a timeout, a reply that is not the one asked
//! for) is dropped, never read on, and made again.  A read, whose page
//! is only on the server, retries, backing off from 10 ms to 1 s, until
//! the device's deadline (`deadline=`, 60 s by default) has passed since
//! its first failure; then it fails with `EHOSTDOWN` and the pager
//! poisons the page (its access gets SIGBUS, the reason on stderr).  A write tries a new
//! connection once and then fails with `ETIMEDOUT`, an error that may
//! pass: the pager keeps the page staged and writes it later, backing
//! off (a fault never waits out a deadline to make room), and a tier's
//! store keeps its pages meanwhile.  An error the server returns for one
//! request (`EIO`, `ENOSPC`) is that request's, as a disk's would be, and
//! the connection stays.
//!
//! **Freed slots are trimmed** (`NBD_CMD_TRIM`, zram's slot-free notice
//! for a server): a freed slot is queued, and the next write call sends
//! the queue's trims ahead of its own requests, so that a server with
//! thin storage (nbdkit's memory and file plugins, a sparse image) lets
//! the space go.  A trim must never land after a write of the same slot
//! allocated again: a write first cancels the queued trims of its own
//! slots, and waits while one of them is in flight (sent, not answered).
//! The queue is bounded; a trim that does not fit is dropped, which
//! costs the server space, never data.
//!
//! **Encrypted** as swap files are (`crypt.rs`): the server stores
//! AES-256-GCM ciphertext, each slot's nonce and tag kept here, so it can
//! neither read a page nor change, move or replay one unnoticed.
//!
//! **Forked children** share the export with their parent, as they
//! share a swap file: a child reads its parent's slots over connections
//! of its own (made on its first call; the parent's sockets are never
//! used by two processes), and writes none (its seals would repeat its
//! parent's nonces), so its dirty pages stay resident (`forked`).

mod conn;
#[cfg(test)]
pub(crate) mod server;
pub mod target;
#[cfg(test)]
mod tests;
pub(crate) mod wire;

use std::io;
use std::net::ToSocketAddrs;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use conn::{Address, Conn};
use target::{Endpoint, NbdTarget};
use wire::{Export, Stream};

use super::crypt::Sealer;
use super::device::{BackendKind, IoDevice, PageStore};
use super::error::IoError;
use crate::stats::Registry;
use crate::sys::monotonic_ns;
use crate::PAGE_SIZE;

/// The most connections a device opens (when the server allows several).
pub const MAX_CONNECTIONS: usize = 4;
/// Requests of one call in flight at once.
const MAX_PIECES: usize = 64;
/// How long one wait on the server (a connect, a send, a reply) may take
/// before the connection counts as lost.
const WAIT: Duration = Duration::from_secs(5);
/// How long a call goes on trying a lost server, from its first failure,
/// before it fails (the default deadline).
pub const DEADLINE: Duration = Duration::from_secs(60);

/// Freed slots queued for `NBD_CMD_TRIM`, at most this many runs.
const TRIM_QUEUE: usize = 64;

/// The longest run one trim covers: 256 MiB, well inside its 32-bit
/// length.
const MAX_TRIM_PAGES: u64 = 1 << 16;

/// The cookies of trims: above every piece's.
const TRIM_COOKIE: u64 = 1 << 32;
const _: () = assert!(TRIM_QUEUE <= 64 && MAX_PIECES <= 64);

/// The trims queued and in flight: runs of slots, `(first, pages)`.
struct Trims {
    pending: [(u64, u64); TRIM_QUEUE],
    npending: usize,
    inflight: [(u64, u64); TRIM_QUEUE],
    ninflight: usize,
}

fn overlaps((a, n): (u64, u64), first: u64, pages: u64) -> bool {
    a < first + pages && first < a + n
}

/// One connection slot: the connection (none until made, or after it
/// failed) and the process that made it.
struct Slot {
    conn: Option<Conn>,
    pid: i32,
}

/// An NBD export as a page store.
pub(crate) struct NbdStore {
    target: NbdTarget,
    addr: Address,
    export: Export,
    slots: u64,
    sealer: Option<Sealer>,
    /// The connections; a call holds one whole.
    conns: Box<[Mutex<Slot>]>,
    /// Where the next call starts looking for a free connection.
    next: AtomicUsize,
    deadline: Duration,
    /// Freed slots to trim, when the server takes trims.
    trims: Mutex<Trims>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

fn getpid() -> i32 {
    rustix::process::getpid().as_raw_nonzero().get()
}

/// Sleep `ms` milliseconds (a signal handler may call this: nanosleep is
/// async-signal-safe).
fn nap(ms: u64) {
    let ts = rustix::thread::Timespec {
        tv_sec: (ms / 1000) as _,
        tv_nsec: ((ms % 1000) * 1_000_000) as _,
    };
    let _ = rustix::thread::nanosleep(&ts);
}

impl NbdStore {
    /// A free connection's slot, else the one this call waits for.
    fn take(&self) -> MutexGuard<'_, Slot> {
        let n = self.conns.len();
        let start = self.next.fetch_add(1, Ordering::Relaxed);
        for i in 0..n {
            if let Ok(g) = self.conns[(start + i) % n].try_lock() {
                return g;
            }
        }
        lock(&self.conns[start % n])
    }

    /// Make the slot's connection if it has none (or only its parent's,
    /// in a forked child).
    fn connected<'a>(&self, slot: &'a mut Slot) -> io::Result<&'a mut Conn> {
        let me = getpid();
        if slot.pid != me {
            // The parent's socket: closing this process's copy leaves the
            // parent's connection as it was.
            slot.conn = None;
            slot.pid = me;
        }
        if slot.conn.is_none() {
            let mut c = Conn::connect(&self.addr, WAIT)?;
            let e = wire::handshake(&mut c, &self.target.export).map_err(|e| match e {
                wire::HandshakeError::Io(e) => e,
                _ => io::Error::from_raw_os_error(libc::EPROTO),
            })?;
            if e.size < self.export.size || e.flags != self.export.flags {
                // Another export under the same name now: its slots are
                // not the ones written.
                return Err(io::Error::from_raw_os_error(libc::ESTALE));
            }
            slot.conn = Some(c);
        }
        Ok(slot.conn.as_mut().expect("connected above"))
    }

    /// Run `io` on a connection, making it again and retrying while the
    /// server is lost: until the deadline when `patient` (a read), else
    /// once (a write).  Given up, the error is `EHOSTDOWN` for a read (the
    /// server is taken for gone: the pager poisons the page) and
    /// `ETIMEDOUT` for a write (an error that may pass: the pager keeps the
    /// page and tries again later).  `io` returns
    /// the server's own error for a request as `Ok(Err(errno))`, which is
    /// final.
    fn call(
        &self,
        patient: bool,
        mut io: impl FnMut(&mut Conn) -> io::Result<Result<(), i32>>,
    ) -> Result<(), io::Error> {
        let deadline = if patient { self.deadline.as_nanos() as u64 } else { 0 };
        let mut first_failure = 0u64;
        let mut tries = 0;
        let mut backoff = 10u64;
        let mut slot = self.take();
        loop {
            let result = match self.connected(&mut slot) {
                Ok(c) => io(c),
                Err(e) => Err(e),
            };
            match result {
                Ok(Ok(())) => return Ok(()),
                Ok(Err(errno)) => return Err(io::Error::from_raw_os_error(errno)),
                Err(_) => {
                    // The stream is lost: never read on.  The first retry
                    // makes this slot's connection again (another slot's
                    // may be as stale, after a server's restart); later
                    // ones back off, the slot let go meanwhile.
                    slot.conn = None;
                    tries += 1;
                    let now = monotonic_ns();
                    if first_failure == 0 {
                        first_failure = now;
                    }
                    if now - first_failure >= deadline && tries >= 2 {
                        let errno = if patient { libc::EHOSTDOWN } else { libc::ETIMEDOUT };
                        return Err(io::Error::from_raw_os_error(errno));
                    }
                    if tries >= 2 {
                        drop(slot);
                        nap(backoff);
                        backoff = (backoff * 2).min(1000);
                        slot = self.take();
                    }
                }
            }
        }
    }

    /// The pieces of a run of `len` bytes at byte `at`: each at most the
    /// server's largest payload, whole pages.
    fn piece_len(&self) -> usize {
        let max = (self.export.max_payload as usize).max(PAGE_SIZE);
        (max / PAGE_SIZE * PAGE_SIZE).min(32 << 20)
    }

    /// Read `buf` from byte `at`, pipelined.
    fn read_at(&self, at: u64, buf: &mut [u8]) -> Result<(), io::Error> {
        let piece = self.piece_len();
        self.call(true, |c| {
            for (k, batch) in buf.chunks_mut(piece * MAX_PIECES).enumerate() {
                let base = at + (k * piece * MAX_PIECES) as u64;
                let n = batch.len().div_ceil(piece);
                for i in 0..n {
                    let len = piece.min(batch.len() - i * piece);
                    let h = wire::request(wire::CMD_READ, i as u64, base + (i * piece) as u64, len as u32);
                    c.send_all(&h)?;
                }
                let mut seen = 0u64;
                let mut failed = None;
                for _ in 0..n {
                    let mut h = [0u8; wire::REPLY_LEN];
                    c.recv_exact(&mut h)?;
                    let i = cookie_of(&h, n, seen)?;
                    seen |= 1 << i;
                    match wire::reply(&h, i as u64)? {
                        0 => {
                            let len = piece.min(batch.len() - i * piece);
                            c.recv_exact(&mut batch[i * piece..i * piece + len])?;
                        }
                        e => failed = failed.or(Some(wire::errno(e))),
                    }
                }
                if let Some(errno) = failed {
                    return Ok(Err(errno));
                }
            }
            Ok(Ok(()))
        })
    }

    /// Before slots `first..first + pages` are written: cancel their
    /// queued trims, and wait out one in flight (a trim answered after the
    /// write would erase it).
    fn clear_trims(&self, first: u64, pages: u64) {
        if !self.export.trims() {
            return;
        }
        loop {
            let mut t = lock(&self.trims);
            let mut i = 0;
            while i < t.npending {
                let (a, n) = t.pending[i];
                if !overlaps((a, n), first, pages) {
                    i += 1;
                    continue;
                }
                // Keep the parts of the run outside the write.
                let left = (a, first.saturating_sub(a).min(n));
                let end = a + n;
                let right = (first + pages, end.saturating_sub(first + pages));
                t.npending -= 1;
                let last = t.npending;
                t.pending[i] = t.pending[last];
                for part in [left, right] {
                    if part.1 > 0 && t.npending < TRIM_QUEUE {
                        let k = t.npending;
                        t.pending[k] = part;
                        t.npending += 1;
                    }
                }
            }
            let busy = t.inflight[..t.ninflight].iter().any(|&r| overlaps(r, first, pages));
            drop(t);
            if !busy {
                return;
            }
            rustix::thread::sched_yield();
        }
    }

    /// Take the queued trims to send, unless a batch is in flight.
    fn take_trims(&self, out: &mut [(u64, u64); TRIM_QUEUE]) -> usize {
        if !self.export.trims() {
            return 0;
        }
        let mut t = lock(&self.trims);
        if t.ninflight > 0 || t.npending == 0 {
            return 0;
        }
        let n = t.npending;
        let pending = t.pending;
        t.inflight[..n].copy_from_slice(&pending[..n]);
        t.ninflight = n;
        t.npending = 0;
        out[..n].copy_from_slice(&pending[..n]);
        n
    }

    /// Write `buf` at byte `at`, pipelined, with the queued trims ahead.
    fn write_at(&self, at: u64, buf: &[u8]) -> Result<(), io::Error> {
        let page = PAGE_SIZE as u64;
        self.clear_trims(at / page, buf.len() as u64 / page);
        let mut trims = [(0u64, 0u64); TRIM_QUEUE];
        let ntrims = self.take_trims(&mut trims);
        let result = self.write_with_trims(at, buf, &trims[..ntrims]);
        if ntrims > 0 {
            // Answered, or lost with their connection: either way no
            // longer in flight.
            lock(&self.trims).ninflight = 0;
        }
        result
    }

    fn write_with_trims(&self, at: u64, buf: &[u8], trims: &[(u64, u64)]) -> Result<(), io::Error> {
        let piece = self.piece_len();
        let page = PAGE_SIZE as u64;
        let mut first_try = true;
        self.call(false, |c| {
            // The trims go ahead of the writes, on the first try only (a
            // connection lost since took them with it, or not: a trim is
            // advice).  Their errors are the server's business.
            let nt = if first_try { trims.len() } else { 0 };
            first_try = false;
            for (j, &(first, pages)) in trims[..nt].iter().enumerate() {
                let h = wire::request(wire::CMD_TRIM, TRIM_COOKIE + j as u64, first * page, (pages * page) as u32);
                c.send_all(&h)?;
            }
            let mut trims_seen = 0u64;
            for (k, batch) in buf.chunks(piece * MAX_PIECES).enumerate() {
                let base = at + (k * piece * MAX_PIECES) as u64;
                let n = batch.len().div_ceil(piece);
                for (i, data) in batch.chunks(piece).enumerate() {
                    let h = wire::request(wire::CMD_WRITE, i as u64, base + (i * piece) as u64, data.len() as u32);
                    c.send_all(&h)?;
                    c.send_all(data)?;
                }
                let mut seen = 0u64;
                let mut failed = None;
                let replies = n + if k == 0 { nt } else { 0 };
                for _ in 0..replies {
                    let mut h = [0u8; wire::REPLY_LEN];
                    c.recv_exact(&mut h)?;
                    let cookie = u64::from_be_bytes(h[8..16].try_into().unwrap());
                    if let Some(j) = cookie.checked_sub(TRIM_COOKIE) {
                        if k != 0 || j >= nt as u64 || trims_seen & (1 << j) != 0 {
                            return Err(io::Error::from_raw_os_error(libc::EPROTO));
                        }
                        trims_seen |= 1 << j;
                        wire::reply(&h, cookie)?;
                        continue;
                    }
                    let i = cookie_of(&h, n, seen)?;
                    seen |= 1 << i;
                    if let e @ 1.. = wire::reply(&h, i as u64)? {
                        failed = failed.or(Some(wire::errno(e)));
                    }
                }
                if let Some(errno) = failed {
                    return Ok(Err(errno));
                }
            }
            Ok(Ok(()))
        })
    }
}

impl Drop for NbdStore {
    /// Say goodbye (`NBD_CMD_DISC`) on this process's connections, so the
    /// server ends them at once rather than on a read error.
    fn drop(&mut self) {
        let me = getpid();
        for m in self.conns.iter() {
            let mut slot = lock(m);
            if slot.pid != me {
                continue;
            }
            if let Some(c) = slot.conn.as_mut() {
                let _ = c.send_all(&wire::request(wire::CMD_DISC, 0, 0, 0));
            }
        }
    }
}

/// The piece a reply is for: its cookie, which must name one of the `n`
/// requests in flight and not one already answered.
fn cookie_of(h: &[u8; wire::REPLY_LEN], n: usize, seen: u64) -> io::Result<usize> {
    let cookie = u64::from_be_bytes(h[8..16].try_into().unwrap());
    match usize::try_from(cookie) {
        Ok(i) if i < n && seen & (1 << i) == 0 => Ok(i),
        _ => Err(io::Error::from_raw_os_error(libc::EPROTO)),
    }
}

impl PageStore for NbdStore {
    fn kind(&self) -> BackendKind {
        BackendKind::Remote
    }

    fn write(&self, offset: u64, buf: &[u8]) -> Result<(), IoError> {
        let fail = |source| IoError::Write { offset, source };
        match &self.sealer {
            Some(s) => s.write_sealed(offset, buf, |at, sealed| {
                self.write_at(at * PAGE_SIZE as u64, sealed).map_err(|source| IoError::Write { offset: at, source })
            }),
            None => self.write_at(offset * PAGE_SIZE as u64, buf).map_err(fail),
        }
    }

    fn read(&self, offset: u64, buf: &mut [u8]) -> Result<(), IoError> {
        self.read_at(offset * PAGE_SIZE as u64, buf)
            .map_err(|source| IoError::Read { offset, source })?;
        match &self.sealer {
            Some(s) => s.open(offset, buf),
            None => Ok(()),
        }
    }

    fn has_file(&self) -> bool {
        // Outside the process, shared with a forked child as a file is.
        true
    }

    fn sealer(&self) -> Option<&Sealer> {
        self.sealer.as_ref()
    }

    fn slot_freed(&self, offset: u64, pages: u64) {
        if let Some(s) = &self.sealer {
            s.forget(offset, pages);
        }
        if self.export.trims() {
            let mut t = lock(&self.trims);
            let n = t.npending;
            match n.checked_sub(1).map(|l| t.pending[l]) {
                // Runs of neighbours freed in order become one trim, of at
                // most MAX_TRIM_PAGES (its length is a u32 of bytes).
                Some((a, p)) if a + p == offset && p + pages <= MAX_TRIM_PAGES => t.pending[n - 1].1 += pages,
                _ if n < TRIM_QUEUE => {
                    t.pending[n] = (offset, pages);
                    t.npending += 1;
                }
                // Full: dropped (the server keeps the block, no more).
                _ => {}
            }
        }
    }

    fn wants_slot_freed(&self) -> bool {
        self.sealer.is_some() || self.export.trims()
    }

    fn describe(&self, d: &mut std::fmt::DebugStruct<'_, '_>) {
        d.field("target", &self.target.to_string())
            .field("export_bytes", &self.export.size)
            .field("connections", &self.conns.len())
            .field("encrypted", &self.sealer.is_some());
    }
}

/// Resolve the target's address once, at set-up.
fn resolve(t: &NbdTarget) -> Result<Address, String> {
    match &t.endpoint {
        Endpoint::Unix { path } => rustix::net::SocketAddrUnix::new(path.as_path())
            .map(Address::Unix)
            .map_err(|e| format!("the socket path: {e}")),
        Endpoint::Tcp { host, port } => (host.as_str(), *port)
            .to_socket_addrs()
            .map_err(|e| format!("cannot resolve {host}: {e}"))?
            .next()
            .map(Address::Tcp)
            .ok_or_else(|| format!("{host} has no address")),
    }
}

/// Connect to `t` once and read its export (no device made): what `uswap
/// run` asks before it starts the program, so that a wrong URI or a
/// server that is not there is one line, not a program killed later.
pub fn probe(t: &NbdTarget) -> Result<u64, IoError> {
    let (_, _, e) = open(t)?;
    Ok(e.size)
}

/// Connect and handshake; the address, the first connection and the
/// export.
fn open(t: &NbdTarget) -> Result<(Address, Conn, Export), IoError> {
    let fail = |what: String| IoError::Nbd {
        target: t.to_string(),
        what,
    };
    let addr = resolve(t).map_err(fail)?;
    let mut c = Conn::connect(&addr, WAIT).map_err(|e| {
        fail(match &t.endpoint {
            Endpoint::Unix { path } => format!(
                "cannot connect: {e}; start the server there (e.g. `nbdkit --unix {} memory 8G`)",
                path.display()
            ),
            Endpoint::Tcp { port, .. } => format!(
                "cannot connect: {e}; start the server there (e.g. `nbdkit --port {port} memory 8G`) and check the firewall"
            ),
        })
    })?;
    let e = wire::handshake(&mut c, &t.export).map_err(|e| fail(e.to_string()))?;
    if !e.writable() {
        return Err(fail("the export is read-only; give uswap one it may write".into()));
    }
    if (e.max_payload as usize) < PAGE_SIZE {
        return Err(fail(format!(
            "the server takes at most {} bytes a request; uswap reads and writes whole {PAGE_SIZE}-byte pages",
            e.max_payload
        )));
    }
    if e.min_block as usize > PAGE_SIZE || !PAGE_SIZE.is_multiple_of(e.min_block as usize) {
        return Err(fail(format!(
            "the server's smallest block is {} bytes; uswap writes whole {PAGE_SIZE}-byte pages",
            e.min_block
        )));
    }
    Ok((addr, c, e))
}

impl IoDevice {
    /// A device on the NBD export `t`: all of it, or `t.size` bytes of it;
    /// encrypted unless `t.encrypt` is off.  Connects once, here: a server
    /// that is not there, an export too small or read-only is an error
    /// now, in one line.
    pub fn nbd(t: &NbdTarget, registry: &Registry) -> Result<IoDevice, IoError> {
        Self::nbd_with_deadline(t, t.deadline.unwrap_or(DEADLINE), registry)
    }

    /// [`IoDevice::nbd`] with a deadline for a lost server other than the
    /// target's (`deadline=`, else [`DEADLINE`]).
    pub fn nbd_with_deadline(t: &NbdTarget, deadline: Duration, registry: &Registry) -> Result<IoDevice, IoError> {
        let (addr, first, export) = open(t)?;
        let bytes = match t.size {
            Some(s) if s > export.size => {
                return Err(IoError::Nbd {
                    target: t.to_string(),
                    what: format!(
                        "the export is {} bytes, less than the {s} asked for; ask for less, or give the server a larger export",
                        export.size
                    ),
                })
            }
            Some(s) => s,
            None => export.size,
        };
        let slots = bytes / PAGE_SIZE as u64;
        if slots == 0 {
            return Err(IoError::ZeroSize);
        }
        let n = if export.multi_conn() { MAX_CONNECTIONS } else { 1 };
        let me = getpid();
        // The first connection is the one just made; the others are made
        // by their first call (the handshake allocates nothing), so a
        // process that never swaps (a shell's child under `uswap run`)
        // pays for one connection at start, not four.
        let mut first = Some(first);
        let conns = (0..n)
            .map(|_| {
                Mutex::new(Slot {
                    conn: first.take(),
                    pid: me,
                })
            })
            .collect();
        let sealer = if t.encrypt { Some(Sealer::new(slots)?) } else { None };
        let store = NbdStore {
            target: t.clone(),
            addr,
            export,
            slots,
            sealer,
            conns,
            next: AtomicUsize::new(0),
            deadline,
            trims: Mutex::new(Trims {
                pending: [(0, 0); TRIM_QUEUE],
                npending: 0,
                inflight: [(0, 0); TRIM_QUEUE],
                ninflight: 0,
            }),
        };
        debug_assert_eq!(store.slots, slots);
        Ok(IoDevice::with_store(slots, Box::new(store), registry))
    }
}
