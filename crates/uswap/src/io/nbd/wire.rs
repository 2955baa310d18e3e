//! The NBD protocol as uswap speaks it (the NBD project's `proto.md`):
//! the fixed-newstyle handshake, one `NBD_OPT_GO` with the block-size
//! constraints asked for, and transmission with simple replies.
//!
//! Simple replies only: uswap reads whole pages, so it has no use for
//! structured replies (sparse reads, block status), and a simple reply is
//! a fixed 16-byte header then, for a read that worked, exactly the bytes
//! asked for, which a reader with a preallocated buffer can take without
//! parsing chunks.  Every request carries a cookie; a reply whose cookie
//! or magic is not the one expected means the stream is lost (a server
//! bug or a torn connection), and the connection is dropped, never read
//! on.
//!
//! Nothing here allocates: requests are encoded into a fixed 28-byte
//! header and replies decoded from a fixed 16-byte one, and the handshake
//! (which a fault may run, making a lost connection again, or a forked
//! child's first) builds its option on the stack and reads option
//! replies into a fixed buffer, skipping what does not fit.

use std::io;

/// `NBDMAGIC`: the server's first eight bytes.
const INIT_MAGIC: u64 = 0x4e42_444d_4147_4943;
/// `IHAVEOPT`: newstyle negotiation, and the prefix of every option.
const OPTS_MAGIC: u64 = 0x4948_4156_454f_5054;
/// Before every option reply.
const REPLY_MAGIC: u64 = 0x0003_e889_0455_65a9;
/// Before every request.
const REQUEST_MAGIC: u32 = 0x2560_9513;
/// Before every simple reply.
const SIMPLE_REPLY_MAGIC: u32 = 0x6744_6698;

/// Server handshake flags.
const FLAG_FIXED_NEWSTYLE: u16 = 1 << 0;
const FLAG_NO_ZEROES: u16 = 1 << 1;
/// Client flags.
const FLAG_C_FIXED_NEWSTYLE: u32 = 1 << 0;
const FLAG_C_NO_ZEROES: u32 = 1 << 1;

/// Options.
const OPT_ABORT: u32 = 2;
const OPT_GO: u32 = 7;
/// Option replies.
const REP_ACK: u32 = 1;
const REP_INFO: u32 = 3;
const REP_FLAG_ERROR: u32 = 1 << 31;
/// Information types.
const INFO_EXPORT: u16 = 0;
const INFO_BLOCK_SIZE: u16 = 3;

/// Transmission flags (of the export).
pub(super) const TFLAG_READ_ONLY: u16 = 1 << 1;
pub(super) const TFLAG_SEND_TRIM: u16 = 1 << 5;
pub(super) const TFLAG_CAN_MULTI_CONN: u16 = 1 << 8;

/// Commands.
pub(super) const CMD_READ: u16 = 0;
pub(super) const CMD_WRITE: u16 = 1;
pub(super) const CMD_DISC: u16 = 2;
pub(super) const CMD_TRIM: u16 = 4;

/// A request header's bytes.
pub(super) const REQUEST_LEN: usize = 28;
/// A simple reply header's bytes.
pub(super) const REPLY_LEN: usize = 16;

/// What the server said of the export in `NBD_OPT_GO`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Export {
    /// Its size in bytes.
    pub size: u64,
    /// Its transmission flags.
    pub flags: u16,
    /// The smallest block the server accepts (1 when it said nothing).
    pub min_block: u32,
    /// The largest payload of one request (32 MiB, the protocol's
    /// default, when it said nothing).
    pub max_payload: u32,
}

impl Export {
    /// Whether the export takes writes.
    pub fn writable(&self) -> bool {
        self.flags & TFLAG_READ_ONLY == 0
    }
    /// Whether the server takes `NBD_CMD_TRIM`.
    pub fn trims(&self) -> bool {
        self.flags & TFLAG_SEND_TRIM != 0
    }
    /// Whether several connections see one another's writes
    /// (`NBD_FLAG_CAN_MULTI_CONN`): only then does uswap open more than one.
    pub fn multi_conn(&self) -> bool {
        self.flags & TFLAG_CAN_MULTI_CONN != 0
    }
}

/// Why a handshake failed, for the device's one-line error.
#[derive(Debug)]
pub(crate) enum HandshakeError {
    /// The socket failed (closed, timed out).
    Io(io::Error),
    /// The server is not an NBD server, or speaks an older protocol.
    NotNbd(&'static str),
    /// The server refused `NBD_OPT_GO`: its error and the start of its
    /// message.
    Refused {
        code: u32,
        message: [u8; MESSAGE],
        len: usize,
    },
    /// An export name longer than the protocol's 4096 bytes.
    NameTooLong,
}

/// The most of a refusal's message kept.
const MESSAGE: usize = 200;
/// The longest export name the protocol allows.
const MAX_NAME: usize = 4096;

impl From<io::Error> for HandshakeError {
    fn from(e: io::Error) -> Self {
        HandshakeError::Io(e)
    }
}

impl std::fmt::Display for HandshakeError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            HandshakeError::Io(e) => write!(f, "the handshake failed: {e}"),
            HandshakeError::NotNbd(what) => write!(f, "not an NBD server that speaks fixed newstyle: {what}"),
            HandshakeError::NameTooLong => write!(f, "the export name is over {MAX_NAME} bytes"),
            HandshakeError::Refused { code, message, len } => {
                let message = String::from_utf8_lossy(&message[..*len]);
                let name = match code & !REP_FLAG_ERROR {
                    1 => "unsupported option (the server is too old for NBD_OPT_GO)",
                    2 => "refused by the server's policy",
                    3 => "invalid request",
                    4 => "not supported on the server's platform",
                    5 => "the server requires TLS",
                    6 => "no such export",
                    7 => "the server is shutting down",
                    8 => "the server requires block-size negotiation",
                    9 => "too big",
                    _ => "refused",
                };
                write!(f, "the server refused the export: {name}")?;
                if !message.is_empty() {
                    write!(f, " ({message})")?;
                }
                Ok(())
            }
        }
    }
}

/// The byte stream of one connection, as the handshake and transmission
/// see it: both directions whole or an error.
pub(crate) trait Stream {
    /// Send all of `buf`.
    fn send_all(&mut self, buf: &[u8]) -> io::Result<()>;
    /// Receive exactly `buf.len()` bytes.
    fn recv_exact(&mut self, buf: &mut [u8]) -> io::Result<()>;
}

fn u16_at(b: &[u8], at: usize) -> u16 {
    u16::from_be_bytes([b[at], b[at + 1]])
}
fn u32_at(b: &[u8], at: usize) -> u32 {
    u32::from_be_bytes(b[at..at + 4].try_into().unwrap())
}
fn u64_at(b: &[u8], at: usize) -> u64 {
    u64::from_be_bytes(b[at..at + 8].try_into().unwrap())
}

/// Run the fixed-newstyle handshake for `export` and enter transmission.
// The error is 212 bytes by design: a refusal's message is kept in place
// so that a handshake made again from a fault allocates nothing; it is
// returned once per connection at most.
#[allow(clippy::result_large_err)]
pub(crate) fn handshake(s: &mut impl Stream, export: &str) -> Result<Export, HandshakeError> {
    let mut hello = [0u8; 18];
    s.recv_exact(&mut hello)?;
    if u64_at(&hello, 0) != INIT_MAGIC {
        return Err(HandshakeError::NotNbd("no NBDMAGIC greeting"));
    }
    if u64_at(&hello, 8) != OPTS_MAGIC {
        return Err(HandshakeError::NotNbd("an oldstyle server (no IHAVEOPT); run it in newstyle mode"));
    }
    let server = u16_at(&hello, 16);
    if server & FLAG_FIXED_NEWSTYLE == 0 {
        return Err(HandshakeError::NotNbd("the server does not offer fixed newstyle"));
    }
    let mut client = FLAG_C_FIXED_NEWSTYLE;
    if server & FLAG_NO_ZEROES != 0 {
        client |= FLAG_C_NO_ZEROES;
    }
    s.send_all(&client.to_be_bytes())?;

    // NBD_OPT_GO: the export's name, then one information request, for
    // its block sizes (a server that has constraints then states them).
    let name = export.as_bytes();
    if name.len() > MAX_NAME {
        return Err(HandshakeError::NameTooLong);
    }
    let mut opt = [0u8; 16 + 4 + MAX_NAME + 4];
    let mut at = 0;
    for piece in [
        &OPTS_MAGIC.to_be_bytes()[..],
        &OPT_GO.to_be_bytes(),
        &((4 + name.len() + 2 + 2) as u32).to_be_bytes(),
        &(name.len() as u32).to_be_bytes(),
        name,
        &1u16.to_be_bytes(),
        &INFO_BLOCK_SIZE.to_be_bytes(),
    ] {
        opt[at..at + piece.len()].copy_from_slice(piece);
        at += piece.len();
    }
    s.send_all(&opt[..at])?;

    let mut size = None;
    let mut flags = 0u16;
    let mut min_block = 1u32;
    let mut max_payload = 32u32 << 20;
    loop {
        let mut head = [0u8; 20];
        s.recv_exact(&mut head)?;
        if u64_at(&head, 0) != REPLY_MAGIC {
            return Err(HandshakeError::NotNbd("an option reply without its magic"));
        }
        let ty = u32_at(&head, 12);
        let len = u32_at(&head, 16) as usize;
        if len > 1 << 20 {
            return Err(HandshakeError::NotNbd("an option reply over 1 MiB"));
        }
        // What fits is kept (every reply uswap reads is a few bytes); the
        // rest is read and dropped.
        let mut buf = [0u8; 256];
        let keep = len.min(buf.len());
        s.recv_exact(&mut buf[..keep])?;
        let mut rest = len - keep;
        while rest > 0 {
            let mut skip = [0u8; 256];
            let n = rest.min(skip.len());
            s.recv_exact(&mut skip[..n])?;
            rest -= n;
        }
        let data = &buf[..keep];
        if ty & REP_FLAG_ERROR != 0 {
            let mut message = [0u8; MESSAGE];
            let n = keep.min(MESSAGE);
            message[..n].copy_from_slice(&data[..n]);
            return Err(HandshakeError::Refused {
                code: ty,
                message,
                len: n,
            });
        }
        let len = keep;
        match ty {
            REP_ACK => break,
            REP_INFO if len >= 2 => match u16_at(data, 0) {
                INFO_EXPORT if len >= 12 => {
                    size = Some(u64_at(data, 2));
                    flags = u16_at(data, 10);
                }
                INFO_BLOCK_SIZE if len >= 14 => {
                    min_block = u32_at(data, 2).max(1);
                    max_payload = u32_at(data, 10);
                }
                _ => {}
            },
            _ => {}
        }
    }
    let size = size.ok_or(HandshakeError::NotNbd("NBD_OPT_GO ended without the export's size"))?;
    Ok(Export {
        size,
        flags,
        min_block,
        max_payload,
    })
}

/// Leave negotiation without an export (a probe that asked the wrong
/// question): `NBD_OPT_ABORT`.  Best effort.
#[allow(dead_code)]
pub(crate) fn abort(s: &mut impl Stream) {
    let mut opt = [0u8; 16];
    opt[..8].copy_from_slice(&OPTS_MAGIC.to_be_bytes());
    opt[8..12].copy_from_slice(&OPT_ABORT.to_be_bytes());
    let _ = s.send_all(&opt);
}

/// A request header: `cmd` at byte `offset`, `len` bytes, `cookie`.
pub(super) fn request(cmd: u16, cookie: u64, offset: u64, len: u32) -> [u8; REQUEST_LEN] {
    let mut h = [0u8; REQUEST_LEN];
    h[..4].copy_from_slice(&REQUEST_MAGIC.to_be_bytes());
    // Command flags 0: no FUA (swap needs no durability past the
    // process), no DF (simple replies).
    h[6..8].copy_from_slice(&cmd.to_be_bytes());
    h[8..16].copy_from_slice(&cookie.to_be_bytes());
    h[16..24].copy_from_slice(&offset.to_be_bytes());
    h[24..28].copy_from_slice(&len.to_be_bytes());
    h
}

/// A simple reply's header: its error (0 or an NBD errno) for `cookie`;
/// `EPROTO` where the header is not a simple reply to that request.
pub(super) fn reply(h: &[u8; REPLY_LEN], cookie: u64) -> Result<u32, io::Error> {
    if u32_at(h, 0) != SIMPLE_REPLY_MAGIC || u64_at(h, 8) != cookie {
        return Err(io::Error::from_raw_os_error(libc::EPROTO));
    }
    Ok(u32_at(h, 4))
}

/// The local errno for an NBD error value (the protocol's values are
/// Linux's for the ones it names); anything else is `EIO`.
pub(super) fn errno(nbd: u32) -> i32 {
    match nbd as i32 {
        e @ (libc::EPERM | libc::EIO | libc::ENOMEM | libc::EINVAL | libc::ENOSPC | libc::EOVERFLOW) => e,
        libc::ENOTSUP => libc::ENOTSUP,
        libc::ESHUTDOWN => libc::ESHUTDOWN,
        _ => libc::EIO,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A scripted peer: what the server sends, and what the client sent.
    struct Script {
        from_server: std::collections::VecDeque<u8>,
        sent: Vec<u8>,
    }

    impl Stream for Script {
        fn send_all(&mut self, buf: &[u8]) -> io::Result<()> {
            self.sent.extend_from_slice(buf);
            Ok(())
        }
        fn recv_exact(&mut self, buf: &mut [u8]) -> io::Result<()> {
            if self.from_server.len() < buf.len() {
                return Err(io::Error::from(io::ErrorKind::UnexpectedEof));
            }
            for b in buf.iter_mut() {
                *b = self.from_server.pop_front().unwrap();
            }
            Ok(())
        }
    }

    fn option_reply(ty: u32, data: &[u8]) -> Vec<u8> {
        let mut v = REPLY_MAGIC.to_be_bytes().to_vec();
        v.extend_from_slice(&OPT_GO.to_be_bytes());
        v.extend_from_slice(&ty.to_be_bytes());
        v.extend_from_slice(&(data.len() as u32).to_be_bytes());
        v.extend_from_slice(data);
        v
    }

    fn greeting(flags: u16) -> Vec<u8> {
        let mut v = INIT_MAGIC.to_be_bytes().to_vec();
        v.extend_from_slice(&OPTS_MAGIC.to_be_bytes());
        v.extend_from_slice(&flags.to_be_bytes());
        v
    }

    #[test]
    fn go_reads_the_export_and_its_block_sizes() {
        let mut server = greeting(FLAG_FIXED_NEWSTYLE | FLAG_NO_ZEROES);
        let mut export = INFO_EXPORT.to_be_bytes().to_vec();
        export.extend_from_slice(&(8u64 << 30).to_be_bytes());
        export.extend_from_slice(&(TFLAG_SEND_TRIM | TFLAG_CAN_MULTI_CONN | 1).to_be_bytes());
        server.extend(option_reply(REP_INFO, &export));
        let mut bs = INFO_BLOCK_SIZE.to_be_bytes().to_vec();
        for v in [512u32, 4096, 1 << 20] {
            bs.extend_from_slice(&v.to_be_bytes());
        }
        server.extend(option_reply(REP_INFO, &bs));
        server.extend(option_reply(REP_INFO, &[0, 9, 1, 2, 3]));
        server.extend(option_reply(REP_ACK, &[]));
        let mut s = Script {
            from_server: server.into(),
            sent: Vec::new(),
        };
        let e = handshake(&mut s, "swap").unwrap();
        assert_eq!(e.size, 8 << 30);
        assert!(e.trims() && e.multi_conn() && e.writable());
        assert_eq!((e.min_block, e.max_payload), (512, 1 << 20));
        // Client flags, then NBD_OPT_GO naming "swap" and asking for
        // NBD_INFO_BLOCK_SIZE.
        assert_eq!(&s.sent[..4], &(FLAG_C_FIXED_NEWSTYLE | FLAG_C_NO_ZEROES).to_be_bytes());
        assert_eq!(u64_at(&s.sent, 4), OPTS_MAGIC);
        assert_eq!(u32_at(&s.sent, 12), OPT_GO);
        assert_eq!(u32_at(&s.sent, 16), 4 + 4 + 2 + 2);
        assert_eq!(&s.sent[24..28], b"swap");
        assert_eq!(u16_at(&s.sent, 28), 1);
        assert_eq!(u16_at(&s.sent, 30), INFO_BLOCK_SIZE);
    }

    #[test]
    fn refusals_and_strangers_are_named() {
        let mut server = greeting(FLAG_FIXED_NEWSTYLE);
        server.extend(option_reply(REP_FLAG_ERROR | 6, b"no export 'x'"));
        let mut s = Script {
            from_server: server.into(),
            sent: Vec::new(),
        };
        let e = handshake(&mut s, "x").unwrap_err().to_string();
        assert!(e.contains("no such export") && e.contains("no export 'x'"), "{e}");

        let mut s = Script {
            from_server: b"HTTP/1.1 400 Bad Request\r\n".to_vec().into(),
            sent: Vec::new(),
        };
        let e = handshake(&mut s, "").unwrap_err().to_string();
        assert!(e.contains("not an NBD server"), "{e}");

        let mut s = Script {
            from_server: greeting(0).into(),
            sent: Vec::new(),
        };
        let e = handshake(&mut s, "").unwrap_err().to_string();
        assert!(e.contains("fixed newstyle"), "{e}");

        // The connection ends mid-handshake.
        let mut s = Script {
            from_server: greeting(FLAG_FIXED_NEWSTYLE).into(),
            sent: Vec::new(),
        };
        let e = handshake(&mut s, "").unwrap_err().to_string();
        assert!(e.contains("handshake failed"), "{e}");
    }

    #[test]
    fn requests_and_replies_round_trip() {
        let h = request(CMD_WRITE, 0xfeed, 4096 * 7, 8192);
        assert_eq!(u32_at(&h, 0), REQUEST_MAGIC);
        assert_eq!(u16_at(&h, 4), 0);
        assert_eq!(u16_at(&h, 6), CMD_WRITE);
        assert_eq!(u64_at(&h, 8), 0xfeed);
        assert_eq!(u64_at(&h, 16), 4096 * 7);
        assert_eq!(u32_at(&h, 24), 8192);
        let mut r = [0u8; REPLY_LEN];
        r[..4].copy_from_slice(&SIMPLE_REPLY_MAGIC.to_be_bytes());
        r[4..8].copy_from_slice(&5u32.to_be_bytes());
        r[8..16].copy_from_slice(&0xfeedu64.to_be_bytes());
        assert_eq!(reply(&r, 0xfeed).unwrap(), 5);
        assert_eq!(errno(5), libc::EIO);
        assert_eq!(errno(28), libc::ENOSPC);
        assert_eq!(errno(12345), libc::EIO);
        assert_eq!(reply(&r, 0xbeef).unwrap_err().raw_os_error(), Some(libc::EPROTO));
        r[0] = 0;
        assert!(reply(&r, 0xfeed).is_err());
    }
}
