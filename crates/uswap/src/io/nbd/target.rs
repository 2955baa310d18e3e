//! Where an NBD export is, and how uswap is asked for one: the NBD URI
//! (the NBD project's `uri.md`, which qemu, nbdkit and libnbd share),
//! with uswap's own query parameters.
//!
//! ```text
//! nbd://HOST[:PORT]/[EXPORT][?size=SIZE][&deadline=TIME][&plain]
//! nbd+unix:///[EXPORT]?socket=PATH[&size=SIZE][&deadline=TIME][&plain]
//! ```
//!
//! The port defaults to 10809; the export to the server's default
//! (the empty name).  `size` uses less of the export than its whole
//! (binary suffixes, whole pages); `deadline` is how long a lost server
//! is waited for before its pages are given up (`30`, `30s`, `500ms`;
//! default 60 s); `plain` writes pages as they are, not encrypted.  The export name and the socket path are percent-decoded.
//! TLS (`nbds://`) is refused with the way to have it: uswap's pages are
//! sealed with AES-256-GCM whatever the transport, and a local nbdkit
//! re-exports a TLS server on a Unix socket (README, "Swap to another
//! machine").

use std::path::PathBuf;

use percent_encoding::{percent_decode_str, utf8_percent_encode, AsciiSet, CONTROLS};

/// The default NBD port.
pub const DEFAULT_PORT: u16 = 10809;

/// What the written form escapes in an export name or socket path: what
/// would end it, or read as the start of an escape.
const ESCAPE: &AsciiSet = &CONTROLS
    .add(b' ')
    .add(b'%')
    .add(b'?')
    .add(b'#')
    .add(b'&')
    .add(b'=');

/// Where the server listens.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Endpoint {
    /// TCP: a host name or address (resolved when the device is made), a
    /// port.
    Tcp {
        /// A name or address; an IPv6 address without its brackets.
        host: String,
        /// The port.
        port: u16,
    },
    /// A Unix domain socket.
    Unix {
        /// The socket's path.
        path: PathBuf,
    },
}

/// An NBD export, and what uswap does with it: parsed from a URI
/// ([`NbdTarget::parse`]), written back canonical by `Display`.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct NbdTarget {
    /// Where the server is.
    pub endpoint: Endpoint,
    /// The export's name ("" for the server's default).
    pub export: String,
    /// Bytes of the export to use, whole pages; `None`: all of it.
    pub size: Option<u64>,
    /// How long a lost server is waited for (`None`: the default, 60 s).
    pub deadline: Option<std::time::Duration>,
    /// Encrypt pages (the default).
    pub encrypt: bool,
}

/// A deadline as written: `30`, `30s` or `500ms`.
fn parse_deadline(v: &str) -> Option<std::time::Duration> {
    let ms = if let Some(ms) = v.strip_suffix("ms") {
        ms.parse::<u64>().ok()?
    } else {
        v.strip_suffix('s').unwrap_or(v).parse::<u64>().ok()?.checked_mul(1000)?
    };
    (ms > 0).then(|| std::time::Duration::from_millis(ms))
}

/// Whether `s` starts like an NBD URI (the spec parser's question).
pub fn is_uri(s: &str) -> bool {
    ["nbd://", "nbd+unix://", "nbds://", "nbds+unix://"]
        .iter()
        .any(|p| s.starts_with(p))
}

fn decode(s: &str, what: &str) -> Result<String, String> {
    percent_decode_str(s)
        .decode_utf8()
        .map(|c| c.into_owned())
        .map_err(|_| format!("the {what} is not UTF-8 once its %-escapes are decoded"))
}

impl NbdTarget {
    /// Parse an NBD URI; the error says what is wrong, for the spec's
    /// one line.
    pub fn parse(uri: &str) -> Result<NbdTarget, String> {
        if uri.starts_with("nbds") {
            return Err("TLS (nbds://) is not in uswap's NBD client (pages are sealed with AES-256-GCM before they leave anyway): for TLS on the wire run a local proxy, `nbdkit --unix SOCK nbd hostname=HOST tls=require ...`, and give nbd+unix:///?socket=SOCK".into());
        }
        let (unix, rest) = if let Some(r) = uri.strip_prefix("nbd+unix://") {
            (true, r)
        } else if let Some(r) = uri.strip_prefix("nbd://") {
            (false, r)
        } else {
            return Err("an NBD URI starts nbd:// or nbd+unix://".into());
        };
        let (rest, query) = match rest.split_once('?') {
            Some((r, q)) => (r, Some(q)),
            None => (rest, None),
        };
        let (authority, path) = match rest.find('/') {
            Some(i) => (&rest[..i], &rest[i + 1..]),
            None => (rest, ""),
        };
        let export = decode(path, "export name")?;
        let mut socket = None;
        let mut size = None;
        let mut deadline = None;
        let mut encrypt = true;
        for kv in query.unwrap_or("").split('&').filter(|kv| !kv.is_empty()) {
            let (k, v) = match kv.split_once('=') {
                Some((k, v)) => (k, Some(v)),
                None => (kv, None),
            };
            match (k, v) {
                ("socket", Some(v)) if unix => socket = Some(PathBuf::from(decode(v, "socket path")?)),
                ("socket", _) => {
                    return Err("socket=PATH belongs to nbd+unix:///EXPORT?socket=PATH".into())
                }
                ("size", Some(v)) => {
                    // Binary suffixes, as the swap spec's sizes (`spec::parse_size`).
                    let b = parse_size::Config::new()
                        .with_binary()
                        .parse_size(v)
                        .ok()
                        .filter(|&b| b >= crate::PAGE_SIZE as u64)
                        .ok_or_else(|| format!("size={v} is not a size of at least 4K"))?;
                    size = Some(b / crate::PAGE_SIZE as u64 * crate::PAGE_SIZE as u64);
                }
                ("deadline", Some(v)) => {
                    deadline = Some(parse_deadline(v).ok_or_else(|| {
                        format!("deadline={v} is not a time; write e.g. deadline=30s or deadline=500ms")
                    })?)
                }
                ("plain", None) => encrypt = false,
                _ => {
                    return Err(format!(
                        "{kv:?} is not a parameter uswap knows: socket=PATH (nbd+unix), size=SIZE, deadline=TIME, plain"
                    ))
                }
            }
        }
        let endpoint = if unix {
            if !authority.is_empty() {
                return Err("nbd+unix:// has no host: write nbd+unix:///EXPORT?socket=PATH".into());
            }
            Endpoint::Unix {
                path: socket.ok_or("nbd+unix:// needs ?socket=PATH")?,
            }
        } else {
            let (host, port) = if let Some(v6) = authority.strip_prefix('[') {
                let (h, after) = v6.split_once(']').ok_or("an IPv6 host is written [ADDRESS]")?;
                (h, after.strip_prefix(':'))
            } else {
                match authority.rsplit_once(':') {
                    Some((h, p)) => (h, Some(p)),
                    None => (authority, None),
                }
            };
            if host.is_empty() {
                return Err("nbd:// needs a host: nbd://HOST[:PORT]/EXPORT".into());
            }
            let port = match port {
                None => DEFAULT_PORT,
                Some(p) => p
                    .parse::<u16>()
                    .ok()
                    .filter(|&p| p != 0)
                    .ok_or_else(|| format!("{p:?} is not a port"))?,
            };
            Endpoint::Tcp {
                host: host.to_string(),
                port,
            }
        };
        Ok(NbdTarget {
            endpoint,
            export,
            size,
            deadline,
            encrypt,
        })
    }
}

impl std::fmt::Display for NbdTarget {
    /// The canonical URI: parses back to the same target.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let export = utf8_percent_encode(&self.export, ESCAPE);
        let mut sep = '?';
        match &self.endpoint {
            Endpoint::Tcp { host, port } if host.contains(':') => write!(f, "nbd://[{host}]:{port}/{export}")?,
            Endpoint::Tcp { host, port } => write!(f, "nbd://{host}:{port}/{export}")?,
            Endpoint::Unix { path } => {
                let p = path.to_string_lossy();
                write!(f, "nbd+unix:///{export}?socket={}", utf8_percent_encode(&p, ESCAPE))?;
                sep = '&';
            }
        }
        if let Some(s) = self.size {
            write!(f, "{sep}size={s}")?;
            sep = '&';
        }
        if let Some(d) = self.deadline {
            let ms = d.as_millis();
            if ms % 1000 == 0 {
                write!(f, "{sep}deadline={}s", ms / 1000)?;
            } else {
                write!(f, "{sep}deadline={ms}ms")?;
            }
            sep = '&';
        }
        if !self.encrypt {
            write!(f, "{sep}plain")?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn the_forms_people_write_parse() {
        let t = NbdTarget::parse("nbd://example.com/swap").unwrap();
        assert_eq!(
            t.endpoint,
            Endpoint::Tcp {
                host: "example.com".into(),
                port: DEFAULT_PORT
            }
        );
        assert_eq!((t.export.as_str(), t.size, t.encrypt), ("swap", None, true));
        let t = NbdTarget::parse("nbd://10.0.0.2:10810").unwrap();
        assert_eq!(t.export, "");
        assert!(matches!(t.endpoint, Endpoint::Tcp { port: 10810, .. }));
        let t = NbdTarget::parse("nbd://[::1]:7000/a%20b?size=1G&plain").unwrap();
        assert_eq!(
            t.endpoint,
            Endpoint::Tcp {
                host: "::1".into(),
                port: 7000
            }
        );
        assert_eq!((t.export.as_str(), t.size, t.encrypt), ("a b", Some(1 << 30), false));
        let t = NbdTarget::parse("nbd+unix:///?socket=/run/nbd%20x.sock").unwrap();
        assert_eq!(
            t.endpoint,
            Endpoint::Unix {
                path: "/run/nbd x.sock".into()
            }
        );
        assert_eq!(t.to_string(), "nbd+unix:///?socket=/run/nbd%20x.sock");
        let t = NbdTarget::parse("nbd://h/e?deadline=90").unwrap();
        assert_eq!(t.deadline, Some(std::time::Duration::from_secs(90)));
        assert_eq!(t.to_string(), "nbd://h:10809/e?deadline=90s");
        let t = NbdTarget::parse("nbd://h/e?deadline=250ms").unwrap();
        assert_eq!(t.deadline, Some(std::time::Duration::from_millis(250)));
    }

    #[test]
    fn wrong_uris_say_what_to_write() {
        for (uri, says) in [
            ("nbds://h/e", "TLS"),
            ("nbd+unix:///e", "needs ?socket=PATH"),
            ("nbd+unix://host/e?socket=/s", "has no host"),
            ("nbd:///e", "needs a host"),
            ("nbd://h:0/e", "is not a port"),
            ("nbd://h:99999/e", "is not a port"),
            ("nbd://h/e?socket=/s", "belongs to nbd+unix"),
            ("nbd://h/e?size=12", "not a size"),
            ("nbd://h/e?tls=on", "not a parameter"),
            ("nbd://h/e?deadline=0", "not a time"),
            ("nbd://h/e?deadline=soon", "not a time"),
            ("nbd://[::1/e", "[ADDRESS]"),
            ("nbd://h/%ff", "UTF-8"),
        ] {
            let e = NbdTarget::parse(uri).unwrap_err();
            assert!(e.contains(says), "{uri}: {e}");
        }
    }

    proptest! {
        #[test]
        fn the_canonical_form_parses_back(
            unix in any::<bool>(),
            host in prop_oneof![Just("h".to_string()), Just("::1".to_string()), "[a-z][a-z0-9.-]{0,12}"],
            port in 1u16..,
            export in ".{0,12}",
            path in "/[^\u{0}]{1,16}",
            pages in proptest::option::of(1u64..1 << 30),
            deadline_ms in proptest::option::of(1u64..1 << 40),
            encrypt in any::<bool>(),
        ) {
            let t = NbdTarget {
                endpoint: if unix { Endpoint::Unix { path: path.into() } } else { Endpoint::Tcp { host, port } },
                export,
                size: pages.map(|p| p * crate::PAGE_SIZE as u64),
                deadline: deadline_ms.map(std::time::Duration::from_millis),
                encrypt,
            };
            let s = t.to_string();
            prop_assert_eq!(NbdTarget::parse(&s), Ok(t), "{}", s);
        }
    }
}
