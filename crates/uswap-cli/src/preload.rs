//! The library `uswap run` names in `LD_PRELOAD`.
//!
//! The workspace's builds put `libuswap_preload.so` beside `uswap`, and
//! that file is used when it is there (a debug build then runs its own
//! debug library).  Otherwise the copy carried inside `uswap` (build.rs)
//! is installed as a file, because the loader of every process of the
//! tree must open it by path, across every `exec`, whatever descriptors a
//! program closes and whatever user it turns into: a memfd named through
//! /proc/self/fd would be gone in the first child of a program that
//! closes what it did not open (Python's subprocess does), and a copy
//! under a 0700 directory could not be read by a child that drops to
//! another user.
//!
//! So the file goes in `uswap-preload-UID/` (not `uswap-UID/`, the
//! statistics directory's fallback, which is 0700) under the first of $TMPDIR, /tmp,
//! /var/tmp and /dev/shm that any user may enter and that is not mounted
//! noexec, named by a hash of its bytes: runs of the same build share it,
//! runs of different builds do not collide.  The directory must be this
//! user's and writable by no one else (a directory another user made
//! first is passed over, never used), and the file is written under a
//! temporary name and renamed into place, so that a run that starts while
//! another writes it never loads half a library.  It is kept afterwards:
//! a daemon the program left behind may exec after `uswap run` ends.

use anyhow::{bail, Context, Result};
use std::io::Write;
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

/// The preload library's file name.
const LIBRARY: &str = "libuswap_preload.so";

/// The library carried inside this executable; empty when it was built
/// with `USWAP_EMBED_PRELOAD=0`.
static EMBEDDED: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/libuswap_preload.so"));

/// The library's path: beside this executable, else the carried copy,
/// installed where every process of the run can load it.
pub fn library() -> Result<PathBuf> {
    let exe = std::env::current_exe().context("finding this executable")?;
    let beside = exe.with_file_name(LIBRARY);
    if beside.exists() {
        return Ok(beside);
    }
    if EMBEDDED.is_empty() {
        bail!(
            "{LIBRARY} is not beside {} and this uswap carries none (built with USWAP_EMBED_PRELOAD=0): build it with `cargo build --release` (it lands beside uswap), or build uswap without that variable",
            exe.display()
        );
    }
    install(EMBEDDED)
}

/// Install `bytes` as the library under the first base directory that
/// will do; why each did not, when none does.
fn install(bytes: &[u8]) -> Result<PathBuf> {
    let name = format!("libuswap_preload-{:016x}.so", fnv1a(bytes));
    let uid = rustix::process::geteuid().as_raw();
    let bases = std::env::var_os("TMPDIR")
        .map(PathBuf::from)
        .into_iter()
        .chain(["/tmp", "/var/tmp", "/dev/shm"].map(PathBuf::from));
    let mut why = Vec::new();
    for base in bases {
        match install_in(&base, uid, &name, bytes) {
            Ok(path) => return Ok(path),
            Err(e) => why.push(format!("{}: {e:#}", base.display())),
        }
    }
    bail!(
        "no directory to put the preload library in that every process of the run may load it from ({}): set TMPDIR to a directory any user may enter (mode 0755) on a file system not mounted noexec",
        why.join("; ")
    )
}

fn install_in(base: &Path, uid: u32, name: &str, bytes: &[u8]) -> Result<PathBuf> {
    let meta = std::fs::metadata(base).context("not there")?;
    if !meta.is_dir() {
        bail!("not a directory");
    }
    // A child that turns into another user loads the library too.
    if meta.mode() & 0o001 == 0 {
        bail!("other users may not enter it (mode {:04o})", meta.mode() & 0o7777);
    }
    let vfs = rustix::fs::statvfs(base).context("statvfs")?;
    if vfs.f_flag.contains(rustix::fs::StatVfsMountFlags::NOEXEC) {
        bail!("mounted noexec: the loader could not map a library from it");
    }
    let dir = base.join(format!("uswap-preload-{uid}"));
    match std::fs::DirBuilder::new().mode(0o755).create(&dir) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
        Err(e) => return Err(e).with_context(|| format!("making {}", dir.display())),
    }
    // Whoever made it: only a directory of this user's that no one else
    // may write is used (symlink_metadata: a link is not followed).
    let d = std::fs::symlink_metadata(&dir).with_context(|| format!("{}", dir.display()))?;
    if !d.is_dir() || d.uid() != uid {
        bail!(
            "{} is not this user's directory (owner {}): another user made it first; remove it",
            dir.display(),
            d.uid()
        );
    }
    if d.mode() & 0o7777 != 0o755 {
        // Made under a umask, or changed: what the loaders need.
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755))
            .with_context(|| format!("chmod 0755 {}", dir.display()))?;
    }
    let path = dir.join(name);
    if let Ok(f) = std::fs::symlink_metadata(&path) {
        if f.is_file() && f.uid() == uid && f.mode() & 0o022 == 0 && f.len() == bytes.len() as u64 {
            return Ok(path);
        }
        // Not what this user wrote: replaced below.
    }
    let temp = dir.join(format!(".{name}.{}", std::process::id()));
    let _ = std::fs::remove_file(&temp);
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o644)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(&temp)
        .with_context(|| format!("creating {}", temp.display()))?;
    let written = f
        .write_all(bytes)
        .and_then(|()| f.set_permissions(std::fs::Permissions::from_mode(0o644)))
        .and_then(|()| std::fs::rename(&temp, &path));
    if let Err(e) = written {
        let _ = std::fs::remove_file(&temp);
        return Err(e).with_context(|| format!("writing {}", path.display()));
    }
    Ok(path)
}

/// FNV-1a, 64 bits: a name for the library's bytes (not a defence: the
/// directory's owner and mode are that).
fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, &b| {
        (h ^ b as u64).wrapping_mul(0x0000_0100_0000_01b3)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn base() -> tempfile::TempDir {
        let t = tempfile::tempdir().unwrap();
        std::fs::set_permissions(t.path(), std::fs::Permissions::from_mode(0o1777)).unwrap();
        t
    }

    #[test]
    fn installs_once_readable_by_all_and_reuses_it() {
        let t = base();
        let uid = rustix::process::geteuid().as_raw();
        let p = install_in(t.path(), uid, "lib-1.so", b"library").unwrap();
        assert_eq!(std::fs::read(&p).unwrap(), b"library");
        let m = std::fs::metadata(&p).unwrap();
        assert_eq!(m.mode() & 0o7777, 0o644);
        assert_eq!(
            std::fs::metadata(p.parent().unwrap()).unwrap().mode() & 0o7777,
            0o755
        );
        let ino = m.ino();
        let again = install_in(t.path(), uid, "lib-1.so", b"library").unwrap();
        assert_eq!(
            (again.clone(), std::fs::metadata(&again).unwrap().ino()),
            (p, ino)
        );
        // No temporary file left behind.
        assert_eq!(std::fs::read_dir(again.parent().unwrap()).unwrap().count(), 1);
    }

    #[test]
    fn a_file_of_the_wrong_size_is_replaced() {
        let t = base();
        let uid = rustix::process::geteuid().as_raw();
        let p = install_in(t.path(), uid, "lib.so", b"old").unwrap();
        std::fs::write(&p, b"truncated library").unwrap();
        let p = install_in(t.path(), uid, "lib.so", b"library").unwrap();
        assert_eq!(std::fs::read(&p).unwrap(), b"library");
    }

    #[test]
    fn a_directory_that_is_not_this_users_or_others_cannot_enter_is_refused() {
        let t = base();
        let uid = rustix::process::geteuid().as_raw();
        // The directory of another uid (as one made by another user first
        // looks to this one).
        std::fs::create_dir(t.path().join(format!("uswap-preload-{}", uid + 1))).unwrap();
        let e = install_in(t.path(), uid + 1, "lib.so", b"x").unwrap_err();
        if uid != u32::MAX - 1 {
            assert!(format!("{e:#}").contains("another user made it first"), "{e:#}");
        }
        let private = tempfile::tempdir().unwrap();
        std::fs::set_permissions(private.path(), std::fs::Permissions::from_mode(0o700)).unwrap();
        let e = install_in(private.path(), uid, "lib.so", b"x").unwrap_err();
        assert!(format!("{e:#}").contains("other users may not enter it"), "{e:#}");
    }

    #[test]
    fn a_symlink_in_place_of_the_directory_is_not_followed() {
        let t = base();
        let uid = rustix::process::geteuid().as_raw();
        let elsewhere = tempfile::tempdir().unwrap();
        std::os::unix::fs::symlink(elsewhere.path(), t.path().join(format!("uswap-preload-{uid}"))).unwrap();
        let e = install_in(t.path(), uid, "lib.so", b"x").unwrap_err();
        assert!(format!("{e:#}").contains("not this user's directory"), "{e:#}");
        assert_eq!(std::fs::read_dir(elsewhere.path()).unwrap().count(), 0);
    }
}
