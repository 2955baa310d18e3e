//! One-line reports on stderr, from anywhere: the SIGBUS handler
//! included.  A line is formatted with `core::fmt` into a buffer on the
//! stack (no allocation) and written with one write(2), which is
//! async-signal-safe; a line longer than the buffer is cut.

use std::fmt::Write as _;
use std::sync::atomic::{AtomicBool, Ordering};

const LINE: usize = 512;

struct Line {
    buf: [u8; LINE],
    len: usize,
}

impl std::fmt::Write for Line {
    fn write_str(&mut self, s: &str) -> std::fmt::Result {
        let n = s.len().min(LINE - 1 - self.len);
        self.buf[self.len..self.len + n].copy_from_slice(&s.as_bytes()[..n]);
        self.len += n;
        Ok(())
    }
}

/// Write `args` and a newline to stderr.
pub fn line(args: std::fmt::Arguments<'_>) {
    let mut l = Line {
        buf: [0; LINE],
        len: 0,
    };
    // Line's write_str cannot fail; a cut line is still a line.
    let _ = l.write_fmt(args);
    l.buf[l.len] = b'\n';
    l.len += 1;
    // One write(2), so lines of several threads do not interleave; a
    // failed one (stderr closed) leaves nobody else to tell.  The system
    // call itself: a library preloaded into a program (`uswap run`) may
    // interpose libc's `write`, and a line may come from a signal handler.
    // SAFETY: writes our own stack buffer to stderr.
    unsafe { libc::syscall(libc::SYS_write, 2, l.buf.as_ptr(), l.len) };
}

/// Write the line only the first time `flag` is passed.
pub(crate) fn once(flag: &AtomicBool, args: std::fmt::Arguments<'_>) {
    if !flag.load(Ordering::Relaxed) && !flag.swap(true, Ordering::Relaxed) {
        line(args);
    }
}
