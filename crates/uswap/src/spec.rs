//! The swap spec: one string per swap device, the same for `uswap demo`,
//! the benches and `uswap run`.
//!
//! ```text
//! ram:SIZE                         pages kept whole in memory
//! file:PATH:SIZE[:grow][:plain]    a swap file (created private if missing),
//!                                  encrypted unless `:plain`; one it creates
//!                                  with `:grow` is allocated as it is
//!                                  written, up to SIZE, keeping the file
//!                                  system's reserve free
//! zram:SIZE[:lz4|zstd[:LEVEL]]     compressed in memory, at most SIZE of it
//! zram:SIZE[:CODEC],file:PATH:SIZE a tier: the store's oldest pages go to
//!                                  the file when it holds SIZE
//! nbd://HOST[:PORT]/EXPORT          an NBD export on another machine,
//! nbd+unix:///EXPORT?socket=PATH    encrypted unless `?plain` (`size=SIZE`:
//!                                  less than all of it)
//! zram:SIZE[:CODEC],nbd://...      a tier with the export behind
//! ```
//!
//! A swap file's pages are encrypted and authenticated (AES-256-GCM, a
//! key in memory only; `io/crypt.rs`); `:plain` writes them as they are,
//! for a file on storage already encrypted and trusted, or to measure
//! the cost.  SIZE takes binary suffixes (`512M`, `4G`, `65536`).  A compressed
//! device alone has SIZE / 4096 slots, as a zram disk of SIZE; in a tier
//! it has the file's.  The codec defaults to LZ4 (measured:
//! docs/history/PERFORMANCE-LOG.md, "Compressed RAM"); zstd's level to
//! [`Codec::ZSTD_DEFAULT_LEVEL`].  [`SwapDeviceSpec`]'s `Display` writes
//! the canonical form back, which parses to the same device.

use std::path::PathBuf;
use std::str::FromStr;

pub use crate::extent::ExtentMapKind;
pub use crate::io::nbd::target::{Endpoint, NbdTarget};
pub use crate::io::{Codec, CodecError, CompressedOptions, FileOptions};
use crate::PAGE_SIZE;

/// What the grammar says, for error messages.
const GRAMMAR: &str =
    "ram:SIZE, file:PATH:SIZE[:grow][:plain] (or file:DIR, a file there that grows), zram:SIZE[:lz4|zstd[:LEVEL]], nbd://HOST[:PORT]/EXPORT, nbd+unix:///EXPORT?socket=PATH, or a tier zram:SIZE[:CODEC],file:PATH:SIZE[:plain] or zram:SIZE[:CODEC],nbd...";

/// A swap spec that does not parse: one line, naming the spec, what is
/// wrong with it and what to write instead.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SpecError {
    /// Not one of the device kinds.
    #[error("swap spec {spec:?}: a swap device is {GRAMMAR}")]
    Kind {
        /// The spec as given.
        spec: String,
    },
    /// A size that does not parse, or is less than a page.
    #[error("swap spec {spec:?}: {size:?} is not a size of at least 4K; write e.g. 512M, 4G or 65536")]
    Size {
        /// The spec as given.
        spec: String,
        /// The part that should have been a size.
        size: String,
    },
    /// A file device without a path, or without a size.
    #[error("swap spec {spec:?}: write file:PATH:SIZE[:plain], e.g. file:/var/tmp/uswap.swap:8G")]
    File {
        /// The spec as given.
        spec: String,
    },
    /// A codec that is not lz4 or zstd.
    #[error("swap spec {spec:?}: {codec:?} is not a codec; write lz4, zstd or zstd:LEVEL (e.g. zstd:3)")]
    Codec {
        /// The spec as given.
        spec: String,
        /// The part that should have been a codec.
        codec: String,
    },
    /// A zstd level that is not a number in range.
    #[error("swap spec {spec:?}: zstd level {level:?} is not a level; give a number from -7 to 22 other than 0 (1 is the default)")]
    Level {
        /// The spec as given.
        spec: String,
        /// The part that should have been a zstd level.
        level: String,
    },
    /// A tier that is not a compressed device then a file.
    #[error(
        "swap spec {spec:?}: a tier is a compressed device and then a file or an NBD export, zram:SIZE[:CODEC],file:PATH:SIZE or zram:SIZE[:CODEC],nbd://HOST/EXPORT"
    )]
    Tier {
        /// The spec as given.
        spec: String,
    },
    /// An NBD URI that does not parse.
    #[error("swap spec {spec:?}: {what}")]
    Nbd {
        /// The spec as given.
        spec: String,
        /// What is wrong with it, and what to write.
        what: String,
    },
}

/// A byte count with binary suffixes.
pub fn parse_size(s: &str) -> Option<u64> {
    parse_size::Config::new().with_binary().parse_size(s).ok()
}

fn size(spec: &str, s: &str) -> Result<u64, SpecError> {
    parse_size(s)
        .filter(|&b| b >= PAGE_SIZE as u64)
        .ok_or_else(|| SpecError::Size {
            spec: spec.into(),
            size: s.into(),
        })
}

fn file(spec: &str, rest: &str) -> Result<FileOptions, SpecError> {
    let (rest, encrypt) = match rest.strip_suffix(":plain") {
        Some(r) => (r, false),
        None => (rest, true),
    };
    let (rest, grow) = match rest.strip_suffix(":grow") {
        Some(r) => (r, true),
        None => (rest, false),
    };
    let (path, bytes) = rest
        .rsplit_once(':')
        .filter(|(p, _)| !p.is_empty())
        .ok_or_else(|| SpecError::File { spec: spec.into() })?;
    Ok(
        FileOptions::new(PathBuf::from(path), size(spec, bytes)? / PAGE_SIZE as u64)
            .encrypt(encrypt)
            .grow(grow),
    )
}

fn zram(spec: &str, rest: &str) -> Result<CompressedOptions, SpecError> {
    let mut parts = rest.splitn(3, ':');
    let limit = size(spec, parts.next().unwrap_or(""))?;
    let codec = match (parts.next(), parts.next()) {
        (None, _) | (Some("lz4"), None) => Codec::Lz4,
        (Some("zstd"), None) => Codec::Zstd {
            level: Codec::ZSTD_DEFAULT_LEVEL,
        },
        (Some("zstd"), Some(l)) => {
            let level = l
                .parse::<i32>()
                .ok()
                .filter(|l| (-7..=22).contains(l) && *l != 0)
                .ok_or_else(|| SpecError::Level {
                    spec: spec.into(),
                    level: l.into(),
                })?;
            Codec::Zstd { level }
        }
        (Some(c), more) => {
            return Err(SpecError::Codec {
                spec: spec.into(),
                codec: more.map_or(c.to_string(), |m| format!("{c}:{m}")),
            })
        }
    };
    Ok(CompressedOptions::new(limit).codec(codec))
}

/// A swap device of an instance; parsed from a swap spec string
/// (`"zram:1G:lz4,file:/var/tmp/t.swap:8G"`, see [`crate::spec`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SwapDeviceSpec {
    /// RAM: like the ram disks of the seeds' tests.
    Ram {
        /// Its size, whole pages.
        bytes: u64,
        /// Higher is used first; equal priorities take turns.
        priority: i32,
    },
    /// A file or block device (`O_DIRECT` by default).
    File {
        /// Where, how large, and how it is opened.
        options: FileOptions,
        /// Higher is used first; equal priorities take turns.
        priority: i32,
    },
    /// Compressed in memory (zram), maybe with a file behind (a tier).
    Compressed {
        /// Its size, codec, and the file behind it if any.
        options: CompressedOptions,
        /// Higher is used first; equal priorities take turns.
        priority: i32,
    },
    /// An NBD export, on another machine or behind a local socket.
    Remote {
        /// Where, how much of it, and whether pages are encrypted.
        target: NbdTarget,
        /// Higher is used first; equal priorities take turns.
        priority: i32,
    },
}

fn nbd(spec: &str, uri: &str) -> Result<NbdTarget, SpecError> {
    NbdTarget::parse(uri).map_err(|what| SpecError::Nbd {
        spec: spec.into(),
        what,
    })
}

impl SwapDeviceSpec {
    /// A RAM device of `bytes` (whole pages), priority 0.
    pub fn ram(bytes: u64) -> Self {
        SwapDeviceSpec::Ram { bytes, priority: 0 }
    }

    /// A file device, priority 0.
    pub fn file(options: FileOptions) -> Self {
        SwapDeviceSpec::File { options, priority: 0 }
    }

    /// A compressed device, priority 0.
    pub fn compressed(options: CompressedOptions) -> Self {
        SwapDeviceSpec::Compressed { options, priority: 0 }
    }

    /// An NBD device, priority 0.
    pub fn nbd(target: NbdTarget) -> Self {
        SwapDeviceSpec::Remote { target, priority: 0 }
    }

    /// The NBD export the device writes to, if any (an NBD device, or the
    /// export behind a compressed device).
    pub fn nbd_target(&self) -> Option<&NbdTarget> {
        match self {
            SwapDeviceSpec::Remote { target, .. } => Some(target),
            SwapDeviceSpec::Compressed { options, .. } => options.nbd_of(),
            _ => None,
        }
    }

    /// The same device with its NBD export's size set to `bytes` (what
    /// `uswap run` learns from the server before it starts the program,
    /// so that every process of the tree sees the same size).
    pub fn with_nbd_size(self, bytes: u64) -> Self {
        match self {
            SwapDeviceSpec::Remote { mut target, priority } => {
                target.size = Some(bytes);
                SwapDeviceSpec::Remote { target, priority }
            }
            SwapDeviceSpec::Compressed { options, priority } => match options.nbd_of().cloned() {
                Some(mut t) => {
                    t.size = Some(bytes);
                    SwapDeviceSpec::Compressed {
                        options: options.nbd(t),
                        priority,
                    }
                }
                None => SwapDeviceSpec::Compressed { options, priority },
            },
            d => d,
        }
    }

    /// The file the device writes to, if any (a file device, or the file
    /// behind a compressed device).
    pub fn file_options(&self) -> Option<&FileOptions> {
        match self {
            SwapDeviceSpec::Ram { .. } | SwapDeviceSpec::Remote { .. } => None,
            SwapDeviceSpec::File { options, .. } => Some(options),
            SwapDeviceSpec::Compressed { options, .. } => options.file_of(),
        }
    }

    /// The same device with its file's options changed by `f`.
    pub fn map_file(self, f: impl FnOnce(FileOptions) -> FileOptions) -> Self {
        match self {
            SwapDeviceSpec::File { options, priority } => SwapDeviceSpec::File {
                options: f(options),
                priority,
            },
            SwapDeviceSpec::Compressed { options, priority } => match options.file_of().cloned() {
                Some(file) => SwapDeviceSpec::Compressed {
                    options: options.file(f(file)),
                    priority,
                },
                None => SwapDeviceSpec::Compressed { options, priority },
            },
            d => d,
        }
    }

    /// The swap space the device gives, in bytes: its slots' pages (0 for
    /// an NBD export whose size is still the server's to say: see
    /// [`SwapDeviceSpec::with_nbd_size`]).
    pub fn bytes(&self) -> u64 {
        match self {
            SwapDeviceSpec::Ram { bytes, .. } => bytes / PAGE_SIZE as u64 * PAGE_SIZE as u64,
            SwapDeviceSpec::File { options, .. } => options.slots() * PAGE_SIZE as u64,
            SwapDeviceSpec::Compressed { options, .. } => options.slots() * PAGE_SIZE as u64,
            SwapDeviceSpec::Remote { target, .. } => target.size.unwrap_or(0),
        }
    }

    /// Set the priority (higher is used first).
    pub fn priority(self, p: i32) -> Self {
        match self {
            SwapDeviceSpec::Ram { bytes, .. } => SwapDeviceSpec::Ram { bytes, priority: p },
            SwapDeviceSpec::File { options, .. } => SwapDeviceSpec::File { options, priority: p },
            SwapDeviceSpec::Compressed { options, .. } => SwapDeviceSpec::Compressed { options, priority: p },
            SwapDeviceSpec::Remote { target, .. } => SwapDeviceSpec::Remote { target, priority: p },
        }
    }
}

impl FromStr for SwapDeviceSpec {
    type Err = SpecError;

    fn from_str(spec: &str) -> Result<Self, SpecError> {
        if let Some(i) = spec.find(",nbd") {
            let Some(z) = spec[..i].strip_prefix("zram:") else {
                return Err(SpecError::Tier { spec: spec.into() });
            };
            let options = zram(spec, z)?.nbd(nbd(spec, &spec[i + 1..])?);
            return Ok(SwapDeviceSpec::compressed(options));
        }
        if crate::io::nbd::target::is_uri(spec) {
            return Ok(SwapDeviceSpec::nbd(nbd(spec, spec)?));
        }
        if let Some((front, back)) = spec.split_once(",file:") {
            let Some(z) = front.strip_prefix("zram:") else {
                return Err(SpecError::Tier { spec: spec.into() });
            };
            let options = zram(spec, z)?.file(file(spec, back)?);
            return Ok(SwapDeviceSpec::compressed(options));
        }
        if spec.contains(',') {
            return Err(SpecError::Tier { spec: spec.into() });
        }
        if let Some(s) = spec.strip_prefix("ram:") {
            return Ok(SwapDeviceSpec::ram(size(spec, s)?));
        }
        if let Some(rest) = spec.strip_prefix("file:") {
            return Ok(SwapDeviceSpec::file(file(spec, rest)?));
        }
        if let Some(rest) = spec.strip_prefix("zram:") {
            return Ok(SwapDeviceSpec::compressed(zram(spec, rest)?));
        }
        Err(SpecError::Kind { spec: spec.into() })
    }
}

impl std::fmt::Display for SwapDeviceSpec {
    /// The canonical spec: sizes in bytes.  Priorities are not part of
    /// the grammar and are not written.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let file = |f: &mut std::fmt::Formatter<'_>, o: &FileOptions| {
            write!(f, "file:{}:{}", o.path().display(), o.slots() * PAGE_SIZE as u64)?;
            if o.grows() {
                f.write_str(":grow")?;
            }
            if !o.encrypts() {
                f.write_str(":plain")?;
            }
            Ok(())
        };
        match self {
            SwapDeviceSpec::Ram { bytes, .. } => write!(f, "ram:{bytes}"),
            SwapDeviceSpec::File { options, .. } => file(f, options),
            SwapDeviceSpec::Compressed { options, .. } => {
                write!(f, "zram:{}:{}", options.limit(), options.codec_of())?;
                if let Some(o) = options.file_of() {
                    f.write_str(",")?;
                    file(f, o)?;
                }
                if let Some(t) = options.nbd_of() {
                    write!(f, ",{t}")?;
                }
                Ok(())
            }
            SwapDeviceSpec::Remote { target, .. } => write!(f, "{target}"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn parse(s: &str) -> Result<SwapDeviceSpec, SpecError> {
        s.parse()
    }

    #[test]
    fn every_kind_of_device_parses() {
        assert_eq!(parse("ram:512M").unwrap(), SwapDeviceSpec::ram(512 << 20));
        assert_eq!(
            parse("file:/var/tmp/a:b.swap:4G").unwrap(),
            SwapDeviceSpec::file(FileOptions::new("/var/tmp/a:b.swap", 1 << 20))
        );
        assert_eq!(
            parse("file:/var/tmp/a.swap:4G:plain").unwrap(),
            SwapDeviceSpec::file(FileOptions::new("/var/tmp/a.swap", 1 << 20).encrypt(false))
        );
        assert!(parse("file:/x:1G").is_ok_and(|d| d.to_string() == "file:/x:1073741824"));
        assert!(
            parse("file:/x:1G:grow:plain").is_ok_and(|d| d.to_string() == "file:/x:1073741824:grow:plain")
        );
        assert!(parse("file:/x:1G:grow").is_ok_and(|d| d.to_string() == "file:/x:1073741824:grow"));
        assert_eq!(
            parse("zram:1G").unwrap(),
            SwapDeviceSpec::compressed(CompressedOptions::new(1 << 30))
        );
        assert_eq!(
            parse("zram:1G:zstd").unwrap(),
            SwapDeviceSpec::compressed(CompressedOptions::new(1 << 30).codec(Codec::Zstd {
                level: Codec::ZSTD_DEFAULT_LEVEL
            }))
        );
        assert_eq!(
            parse("zram:64M:zstd:-3").unwrap(),
            SwapDeviceSpec::compressed(CompressedOptions::new(64 << 20).codec(Codec::Zstd { level: -3 }))
        );
        assert_eq!(
            parse("zram:1G:lz4,file:/tmp/t.swap:8G").unwrap(),
            SwapDeviceSpec::compressed(
                CompressedOptions::new(1 << 30).file(FileOptions::new("/tmp/t.swap", 2 << 20))
            )
        );
        let remote = NbdTarget::parse("nbd://swaphost/pages").unwrap();
        assert_eq!(
            parse("nbd://swaphost/pages").unwrap(),
            SwapDeviceSpec::nbd(remote.clone())
        );
        assert_eq!(
            parse("nbd://swaphost/pages").unwrap().bytes(),
            0,
            "the server's to say"
        );
        assert_eq!(
            parse("nbd://swaphost/pages")
                .unwrap()
                .with_nbd_size(1 << 30)
                .to_string(),
            "nbd://swaphost:10809/pages?size=1073741824"
        );
        let tier = parse("zram:1G,nbd+unix:///?socket=/run/s&plain").unwrap();
        assert_eq!(
            tier,
            SwapDeviceSpec::compressed(
                CompressedOptions::new(1 << 30)
                    .nbd(NbdTarget::parse("nbd+unix:///?socket=/run/s&plain").unwrap())
            )
        );
        assert_eq!(
            tier.to_string(),
            "zram:1073741824:lz4,nbd+unix:///?socket=/run/s&plain"
        );
        assert_eq!(tier.with_nbd_size(8 << 20).bytes(), 8 << 20);
    }

    #[test]
    fn bad_specs_say_what_is_wrong_in_one_line() {
        let cases = [
            ("", "a swap device is"),
            ("disk:4G", "a swap device is"),
            ("ram:", "\"\" is not a size"),
            ("ram:lots", "\"lots\" is not a size"),
            ("ram:100", "\"100\" is not a size of at least 4K"),
            ("file:4G", "write file:PATH:SIZE"),
            ("file::4G", "write file:PATH:SIZE"),
            ("zram:1G:gzip", "\"gzip\" is not a codec"),
            ("zram:1G:lz4:9", "\"lz4:9\" is not a codec"),
            ("zram:1G:zstd:99", "zstd level \"99\""),
            ("zram:1G:zstd:0", "zstd level \"0\""),
            ("zram:1G:zstd:fast", "zstd level \"fast\""),
            (
                "ram:1G,file:/tmp/x:1G",
                "a tier is a compressed device and then a file",
            ),
            ("zram:1G,ram:1G", "a tier is"),
            ("zram:1G,file:/tmp/x", "write file:PATH:SIZE"),
            ("file:/tmp/x:plain", "write file:PATH:SIZE"),
            ("file:/tmp/x:1G:plainly", "is not a size"),
            ("nbds://h/e", "TLS"),
            ("nbd+unix:///e", "needs ?socket=PATH"),
            ("nbd://h/e?bogus", "not a parameter"),
            ("ram:1G,nbd://h/e", "a tier is"),
            ("zram:1G,nbd://", "needs a host"),
        ];
        for (spec, says) in cases {
            let e = parse(spec).unwrap_err().to_string();
            assert!(e.contains(says), "{spec:?}: {e}");
            assert!(e.starts_with(&format!("swap spec {spec:?}")), "{e}");
            assert!(!e.contains('\n'), "{e}");
        }
    }

    proptest! {
        /// Any string, and strings built from the grammar's own pieces,
        /// parse or give one line starting with the spec: never a panic.
        #[test]
        fn any_string_parses_or_says_why_in_one_line(
            s in prop_oneof![
                any::<String>(),
                proptest::collection::vec(
                    prop::sample::select(vec!["ram", "zram", "file", ":", ",", "lz4", "zstd", "-3", "0", "1G", "4K", "999999999999T", "/x", "", "file:", "plain"]),
                    0..8,
                ).prop_map(|v| v.concat()),
            ]
        ) {
            if let Err(e) = parse(&s) {
                let m = e.to_string();
                prop_assert!(!m.contains('\n') && m.starts_with("swap spec "), "{m}");
            }
        }

        #[test]
        fn the_canonical_form_parses_back_to_the_same_device(
            kind in 0..6u8,
            pages in 1u64..1 << 30,
            file_pages in 1u64..1 << 30,
            level in prop::sample::select(vec![-7, -1, 1, 3, 19, 22]),
            zstd in any::<bool>(),
            path in "/[a-z:._/]{1,20}",
            encrypt in any::<bool>(),
        ) {
            let bytes = pages * PAGE_SIZE as u64;
            let codec = if zstd { Codec::Zstd { level } } else { Codec::Lz4 };
            let fo = FileOptions::new(path.clone(), file_pages).encrypt(encrypt);
            let d = match kind {
                0 => SwapDeviceSpec::ram(bytes),
                1 => SwapDeviceSpec::file(fo),
                2 => SwapDeviceSpec::compressed(CompressedOptions::new(bytes).codec(codec)),
                3 => SwapDeviceSpec::compressed(CompressedOptions::new(bytes).codec(codec).file(fo)),
                k => {
                    let t = NbdTarget {
                        endpoint: Endpoint::Unix { path: path.into() },
                        export: "e".into(),
                        size: Some(file_pages * PAGE_SIZE as u64),
                        deadline: None,
                        encrypt,
                    };
                    if k == 4 {
                        SwapDeviceSpec::nbd(t)
                    } else {
                        SwapDeviceSpec::compressed(CompressedOptions::new(bytes).codec(codec).nbd(t))
                    }
                }
            };
            let written = d.to_string();
            prop_assert_eq!(parse(&written).unwrap(), d, "{}", written);
        }
    }
}
