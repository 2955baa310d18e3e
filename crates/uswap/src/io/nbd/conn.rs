//! One connection to an NBD server: a socket of uswap's own (placed
//! above the program's descriptors, `descriptors.rs`), its timeouts, and
//! whole sends and receives.
//!
//! System calls go through rustix, never libc's wrappers: under `uswap
//! run` the preload library interposes some of libc's, and a page's IO
//! must not meet the program's own guards.  Sends use `MSG_NOSIGNAL`: a
//! server gone must be an error here, never a SIGPIPE for a program that
//! did not ask for one.  The address was resolved when the device was
//! made, so that a connection made again from a fault allocates nothing
//! and asks no resolver.

use std::io;
use std::net::SocketAddr;
use std::os::fd::AsFd;
use std::time::Duration;

use rustix::net::{self, AddressFamily, RecvFlags, SendFlags, SocketAddrUnix, SocketType};

use super::wire::Stream;
use crate::descriptors::Placed;

/// How long a receive polls the socket before it sleeps in the kernel:
/// a reply comes in tens of microseconds, and a thread that slept must be
/// woken by it, a cross-CPU wake-up that costs microseconds on this
/// machine kind.  Measured (`bench fault --variants swapin-nbd`, nbdkit's
/// memory plugin on a Unix socket): 45.8 us a fault sleeping at once,
/// 35.6 us polling 20 us first, 37.1 us polling 30 us.
const REPLY_SPIN_NS: u64 = 25_000;

/// A resolved server address.
pub(crate) enum Address {
    Tcp(SocketAddr),
    Unix(SocketAddrUnix),
}

/// One connection: the socket, in transmission once the handshake is
/// done.
pub(crate) struct Conn {
    sock: Placed,
}

impl Conn {
    /// Connect to `addr`; every wait (the connect, a send, a receive)
    /// gives up after `timeout` with `EAGAIN`/`ETIMEDOUT`.
    pub fn connect(addr: &Address, timeout: Duration) -> io::Result<Conn> {
        let family = match addr {
            Address::Tcp(SocketAddr::V4(_)) => AddressFamily::INET,
            Address::Tcp(SocketAddr::V6(_)) => AddressFamily::INET6,
            Address::Unix(_) => AddressFamily::UNIX,
        };
        let fd = net::socket_with(family, SocketType::STREAM, net::SocketFlags::CLOEXEC, None)?;
        // SO_SNDTIMEO bounds connect() too on Linux: a host that does not
        // answer fails in `timeout`, not in the kernel's two minutes.
        net::sockopt::set_socket_timeout(&fd, net::sockopt::Timeout::Send, Some(timeout))?;
        net::sockopt::set_socket_timeout(&fd, net::sockopt::Timeout::Recv, Some(timeout))?;
        match addr {
            Address::Tcp(a) => {
                net::connect(&fd, a)?;
                // A page's request is one small write then a wait for its
                // reply: Nagle would hold it for the previous reply's ACK.
                net::sockopt::set_tcp_nodelay(&fd, true)?;
            }
            Address::Unix(a) => net::connect(&fd, a)?,
        }
        Ok(Conn { sock: Placed::new(fd) })
    }
}

impl Stream for Conn {
    fn send_all(&mut self, mut buf: &[u8]) -> io::Result<()> {
        while !buf.is_empty() {
            match net::send(self.sock.as_fd(), buf, SendFlags::NOSIGNAL) {
                Ok(0) => return Err(io::Error::from_raw_os_error(libc::ECONNRESET)),
                Ok(n) => buf = &buf[n..],
                Err(rustix::io::Errno::INTR) => {}
                Err(e) => return Err(e.into()),
            }
        }
        Ok(())
    }

    fn recv_exact(&mut self, mut buf: &mut [u8]) -> io::Result<()> {
        let start = crate::sys::monotonic_ns();
        while !buf.is_empty() {
            // Polled for REPLY_SPIN_NS, then a receive that sleeps.
            let polling = crate::sys::monotonic_ns() - start < REPLY_SPIN_NS;
            let flags = if polling { RecvFlags::DONTWAIT } else { RecvFlags::empty() };
            match net::recv(self.sock.as_fd(), &mut *buf, flags) {
                // The server closed the connection.
                Ok((0, _)) => return Err(io::Error::from_raw_os_error(libc::ECONNRESET)),
                Ok((n, _)) => buf = &mut buf[n..],
                Err(rustix::io::Errno::AGAIN) if polling => std::hint::spin_loop(),
                Err(rustix::io::Errno::INTR) => {}
                Err(e) => return Err(e.into()),
            }
        }
        Ok(())
    }
}
