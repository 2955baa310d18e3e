//! Published statistics: the directory each user's instances publish
//! their blocks in, and how `uswap stat` and `uswap top` find them.
//!
//! The directory is `$USWAP_RUNTIME_DIR` when set, else
//! `$XDG_RUNTIME_DIR/uswap`, else `/tmp/uswap-$UID`: made mode 0700,
//! and used only if it is a directory (not a link), this user's, and
//! open to nobody else; a block in it is `PID-N.stats`, mode 0600.  So a
//! process of another user is not readable, and no other user can plant
//! a file where an instance reads or writes.
//!
//! An instance removes its file as it ends (`Swap`'s drop, or at exit
//! under `uswap run`).  One killed with SIGKILL cannot: its file stays
//! until a reader finds it stale and removes it.  Stale: its process is
//! gone, is another process under a reused pid (the block keeps its
//! start time), or no longer maps the file (it `exec`ed an image uswap
//! does not page).

use std::io;
use std::os::unix::fs::{DirBuilderExt, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

use super::{Identity, MappedBlock, Stats};

/// The environment variable that names the directory outright.
pub const DIR_ENV: &str = "USWAP_RUNTIME_DIR";

/// What goes wrong finding or reading published statistics.
#[derive(Debug, thiserror::Error)]
pub enum LiveError {
    /// The directory could not be made or read.
    #[error("{path}: {source}")]
    Io {
        /// The directory.
        path: PathBuf,
        /// Why.
        source: io::Error,
    },
    /// It is not a directory of this user's alone.
    #[error("{path} is {what}: uswap keeps statistics only in a directory of this user's that no one else may open; remove it, or set {DIR_ENV} to another")]
    Unsafe {
        /// The directory.
        path: PathBuf,
        /// What is wrong with it.
        what: String,
    },
}

/// The directory this user's instances publish in (not made here).
pub fn directory() -> PathBuf {
    // SAFETY: geteuid has no preconditions.
    directory_for(|name| std::env::var_os(name), unsafe { libc::geteuid() })
}

/// The directory a process with environment `var` and user `uid`
/// publishes in: `uswap gdb` finds another user's process's by its
/// `/proc/PID/environ` and its uid.
pub fn directory_for(var: impl Fn(&str) -> Option<std::ffi::OsString>, uid: u32) -> PathBuf {
    if let Some(d) = var(DIR_ENV).filter(|d| !d.is_empty()) {
        return PathBuf::from(d);
    }
    if let Some(x) = var("XDG_RUNTIME_DIR").filter(|d| !d.is_empty()) {
        let x = PathBuf::from(x);
        if x.is_absolute() && x.is_dir() {
            return x.join("uswap");
        }
    }
    PathBuf::from(format!("/tmp/uswap-{uid}"))
}

/// Check that `dir` is this user's alone: a directory, not a link, owned
/// by this user, mode 0700 or less.
pub fn check(dir: &Path) -> Result<(), LiveError> {
    let meta = std::fs::symlink_metadata(dir).map_err(|source| LiveError::Io {
        path: dir.to_path_buf(),
        source,
    })?;
    let unsafe_dir = |what: String| LiveError::Unsafe {
        path: dir.to_path_buf(),
        what,
    };
    if meta.file_type().is_symlink() {
        return Err(unsafe_dir("a symbolic link".into()));
    }
    if !meta.is_dir() {
        return Err(unsafe_dir("not a directory".into()));
    }
    // SAFETY: geteuid has no preconditions.
    let me = unsafe { libc::geteuid() };
    if meta.uid() != me {
        return Err(unsafe_dir(format!(
            "owned by user {}, not by you ({me})",
            meta.uid()
        )));
    }
    let mode = meta.permissions().mode() & 0o777;
    if mode & 0o077 != 0 {
        return Err(unsafe_dir(format!("mode {mode:o}, open to others")));
    }
    Ok(())
}

/// The directory, made (mode 0700) if missing and checked.
pub fn ensure_directory() -> Result<PathBuf, LiveError> {
    let dir = directory();
    match std::fs::DirBuilder::new().mode(0o700).create(&dir) {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
        Err(source) => return Err(LiveError::Io { path: dir, source }),
    }
    check(&dir)?;
    Ok(dir)
}

/// One published instance, mapped.
pub struct Entry {
    /// Its file.
    pub path: PathBuf,
    /// Who it is.
    pub identity: Identity,
    block: MappedBlock,
}

impl Entry {
    /// Its statistics now: read from its block, no call into it.
    pub fn stats(&self) -> Stats {
        self.block.stats()
    }

    /// Whether its process is still there and still maps this block.
    pub fn alive(&self) -> bool {
        alive(&self.identity, &self.path)
    }
}

/// Whether the process `id` names still runs (not another under its pid,
/// not a zombie) and maps `path`.
fn alive(id: &Identity, path: &Path) -> bool {
    match crate::sys::start_time(id.pid) {
        Some((start, state)) if start == id.start && state != b'Z' && state != b'X' => {}
        _ => return false,
    }
    let Ok(maps) = std::fs::read_to_string(format!("/proc/{}/maps", id.pid)) else {
        // Not ours to read (another user's, or not dumpable): it runs.
        return true;
    };
    let name = path.to_string_lossy();
    maps.lines().any(|l| l.ends_with(&*name))
}

/// Every live instance published in `dir`, by pid; stale files (their
/// process gone, or no longer mapping them) are removed on the way, and
/// files that are not blocks are left alone.
pub fn scan(dir: &Path) -> Result<Vec<Entry>, LiveError> {
    check(dir)?;
    let dir = std::fs::canonicalize(dir).map_err(|source| LiveError::Io {
        path: dir.to_path_buf(),
        source,
    })?;
    let rd = std::fs::read_dir(&dir).map_err(|source| LiveError::Io {
        path: dir.clone(),
        source,
    })?;
    let mut out = Vec::new();
    for ent in rd.flatten() {
        let path = ent.path();
        // `uswap run`'s control socket, `ctl-PID.sock` (`uswap ctl`), and
        // its auto budget's state, `auto-PID.state`, left by a supervisor
        // killed outright: removed with the statistics of its tree.
        if let Some(pid) = path
            .file_name()
            .and_then(|n| n.to_str())
            .and_then(|n| {
                n.strip_prefix("ctl-")
                    .and_then(|n| n.strip_suffix(".sock"))
                    .or_else(|| n.strip_prefix("auto-")?.strip_suffix(".state"))
            })
            .and_then(|p| p.parse::<i32>().ok())
        {
            if crate::sys::start_time(pid).is_none() {
                let _ = std::fs::remove_file(&path);
            }
            continue;
        }
        if path.extension().is_none_or(|e| e != "stats") {
            continue;
        }
        let block = match MappedBlock::open(&path) {
            Ok(Some(b)) => b,
            // Being written (its magic not yet set), cut short, or of
            // another build: left alone unless its process is gone.
            Ok(None) => {
                let pid = path
                    .file_stem()
                    .and_then(|s| s.to_str())
                    .and_then(|s| s.split('-').next())
                    .and_then(|p| p.parse::<i32>().ok());
                if pid.is_some_and(|p| crate::sys::start_time(p).is_none()) {
                    let _ = std::fs::remove_file(&path);
                }
                continue;
            }
            Err(_) => continue,
        };
        let identity = block.identity();
        if !alive(&identity, &path) {
            let _ = std::fs::remove_file(&path);
            continue;
        }
        out.push(Entry {
            path,
            identity,
            block,
        });
    }
    out.sort_by_key(|e| (e.identity.pid, e.identity.born_unix_ns));
    Ok(out)
}

/// Remove every block of the tree `group` (its supervisor's pid) whose
/// process is gone: the supervisor's last act, for members it outlived
/// that could not remove their own (killed, or left through a raw
/// `exit_group` that runs no exit handlers, as Go programs do).  Returns
/// what each said last, oldest first, so that `uswap run --stats` can
/// show them.
pub fn remove_group(dir: &Path, group: i32) -> Vec<(Identity, Stats)> {
    let mut removed = Vec::new();
    for (path, b) in blocks_in(dir, "") {
        let id = b.identity();
        if id.group == group && !alive(&id, &path) {
            let _ = std::fs::remove_file(&path);
            removed.push((id, b.stats()));
        }
    }
    removed.sort_by_key(|(id, _)| (id.pid, id.born_unix_ns));
    removed
}

/// The complete blocks in `dir` whose file names begin with `prefix`,
/// each with its path; files that are not blocks, or not yet whole, are
/// passed over.
fn blocks_in<'a>(dir: &Path, prefix: &'a str) -> impl Iterator<Item = (PathBuf, MappedBlock)> + 'a {
    std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .filter(move |ent| {
            ent.file_name()
                .to_str()
                .is_some_and(|n| n.starts_with(prefix) && n.ends_with(".stats"))
        })
        .filter_map(|ent| {
            let path = ent.path();
            MappedBlock::open(&path).ok().flatten().map(|b| (path, b))
        })
}

/// Whether this image has looked for its earlier images' blocks.  Not a
/// `Once`: a fork while another thread ran it would leave the child's
/// copy running for ever.
static SWEPT: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Remove the blocks that earlier images of this process (the same pid
/// and start time: it ran them before an `exec`) left in `dir`.  An
/// image that `exec`s runs no exit handler, so its block stays; the new
/// image replaces only the file of its own name (`PID-0`), and a forked
/// child's (`PID-N`, its serials inherited) stayed, until the tree's end
/// showed it as a process that "ended without exit handlers": every
/// pyenv shim did.  Done once per image, by its first block: a block of
/// this process born before then is an earlier image's (another thread
/// of this image may make its own meanwhile, born after `now`).
pub(super) fn forget_earlier_images(dir: &Path, pid: i32) {
    let now = crate::sys::realtime_ns();
    if SWEPT.swap(true, std::sync::atomic::Ordering::Relaxed) {
        return;
    }
    let Some((start, _)) = crate::sys::start_time(pid) else {
        return;
    };
    let prefix = format!("{pid}-");
    for (path, b) in blocks_in(dir, &prefix) {
        let id = b.identity();
        if id.pid == pid && id.start == start && id.born_unix_ns < now {
            let _ = std::fs::remove_file(&path);
        }
    }
}
