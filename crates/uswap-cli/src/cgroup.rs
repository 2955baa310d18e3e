//! The memory cgroup `uswap run` is in, and the limit it puts on the
//! process tree: a container's memory, or a `systemd-run -p MemoryMax=`
//! unit's.  `--budget 50%` is a share of that where there is one, not of
//! the machine's memory.
//!
//! Found as the kernel says: `/proc/self/mountinfo` gives where the
//! cgroup file systems are mounted (cgroup2, or the v1 hierarchy with the
//! `memory` controller) and which part of the hierarchy each mount shows;
//! `/proc/self/cgroup` gives this process's group.  The limit is the
//! smallest of the group's and its ancestors' (each holds its whole
//! subtree): `memory.max` in v2 ("max": none), `memory.limit_in_bytes` in
//! v1 (a page-rounded 2^63 - 1: none).

use std::path::{Path, PathBuf};

/// What is unlimited in v1: anything from 2^62 up (the kernel writes
/// `PAGE_COUNTER_MAX` pages, a little under 2^63).
const V1_UNLIMITED: u64 = 1 << 62;

/// The tightest memory limit on this process's cgroup and its ancestors,
/// with the file that sets it; None when none is set (or the files are
/// not there).
pub fn memory_limit() -> Option<(u64, String)> {
    let mountinfo = std::fs::read_to_string("/proc/self/mountinfo").ok()?;
    let groups = std::fs::read_to_string("/proc/self/cgroup").ok()?;
    let mut best: Option<(u64, String)> = None;
    for (dir, file) in group_dirs(&mountinfo, &groups) {
        for (limit, at) in limits_up(&dir, file) {
            if best.as_ref().is_none_or(|b| limit < b.0) {
                best = Some((limit, at));
            }
        }
    }
    best
}

/// This process's memory cgroup directories, each with the file holding
/// its limit: the v2 group's (`memory.max`) and the v1 memory
/// hierarchy's (`memory.limit_in_bytes`), where mounted.
fn group_dirs(mountinfo: &str, groups: &str) -> Vec<(PathBuf, &'static str)> {
    let mut out = Vec::new();
    for line in mountinfo.lines() {
        // ID PARENT MAJ:MIN ROOT MOUNTPOINT OPTIONS [OPTIONAL...] - TYPE SOURCE SUPER
        let Some((left, right)) = line.split_once(" - ") else {
            continue;
        };
        let left: Vec<&str> = left.split(' ').collect();
        let right: Vec<&str> = right.split(' ').collect();
        let (Some(root), Some(point), Some(fstype)) = (left.get(3), left.get(4), right.first()) else {
            continue;
        };
        let (want, file) = match *fstype {
            "cgroup2" => ("", "memory.max"),
            "cgroup" if right.get(2).is_some_and(|o| o.split(',').any(|o| o == "memory")) => {
                ("memory", "memory.limit_in_bytes")
            }
            _ => continue,
        };
        let Some(path) = group_path(groups, want) else {
            continue;
        };
        // The mount shows the hierarchy from `root` down.
        let Some(rel) = path.strip_prefix(root.trim_end_matches('/')) else {
            continue;
        };
        let dir = Path::new(&unescape(point)).join(rel.trim_start_matches('/'));
        if !out.iter().any(|(d, _)| d == &dir) {
            out.push((dir, file));
        }
    }
    out
}

/// This process's path in the hierarchy with `controller` (v1), or in the
/// unified one (v2: `controller` empty), from /proc/self/cgroup.
fn group_path<'a>(groups: &'a str, controller: &str) -> Option<&'a str> {
    groups.lines().find_map(|l| {
        let mut f = l.splitn(3, ':');
        let (_, ctl, path) = (f.next()?, f.next()?, f.next()?);
        let hit = if controller.is_empty() {
            ctl.is_empty()
        } else {
            ctl.split(',').any(|c| c == controller)
        };
        hit.then_some(path)
    })
}

/// Mountinfo escapes spaces and the like as `\040`.
fn unescape(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'\\' && i + 3 < b.len() && b[i + 1..i + 4].iter().all(|c| (b'0'..=b'7').contains(c)) {
            out.push((b[i + 1] - b'0') * 64 + (b[i + 2] - b'0') * 8 + (b[i + 3] - b'0'));
            i += 4;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// The limits set on `dir` and its ancestors, up to the mount point (the
/// first directory without the file).
fn limits_up(dir: &Path, file: &str) -> Vec<(u64, String)> {
    let mut out = Vec::new();
    let mut at = Some(dir);
    while let Some(d) = at {
        let f = d.join(file);
        let Ok(text) = std::fs::read_to_string(&f) else {
            break;
        };
        if let Some(limit) = parse_limit(&text) {
            out.push((limit, f.display().to_string()));
        }
        at = d.parent();
    }
    out
}

/// A limit file's value; None for "max" or v1's unlimited.
fn parse_limit(text: &str) -> Option<u64> {
    let t = text.trim();
    if t == "max" {
        return None;
    }
    t.parse::<u64>().ok().filter(|&v| v < V1_UNLIMITED)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_the_group_of_each_hierarchy() {
        let mountinfo = "\
25 1 0:22 / /sys/fs/cgroup rw - tmpfs tmpfs rw,mode=755
30 25 0:26 / /sys/fs/cgroup/memory rw,relatime shared:9 - cgroup cgroup rw,memory
31 25 0:27 / /sys/fs/cgroup/cpu rw - cgroup cgroup rw,cpu
35 25 0:30 / /sys/fs/cgroup/unified rw - cgroup2 cgroup2 rw
36 25 0:31 /docker/abc /mnt/my\\040cg rw - cgroup2 cgroup2 rw";
        let groups = "4:memory:/process_api/x\n1:cpu:/\n0::/docker/abc/inner\n";
        let dirs = group_dirs(mountinfo, groups);
        assert_eq!(
            dirs,
            vec![
                (
                    PathBuf::from("/sys/fs/cgroup/memory/process_api/x"),
                    "memory.limit_in_bytes"
                ),
                (
                    PathBuf::from("/sys/fs/cgroup/unified/docker/abc/inner"),
                    "memory.max"
                ),
                (PathBuf::from("/mnt/my cg/inner"), "memory.max"),
            ]
        );
    }

    #[test]
    fn unlimited_reads_as_none() {
        assert_eq!(parse_limit("max\n"), None);
        assert_eq!(parse_limit("9223372036854771712\n"), None);
        assert_eq!(parse_limit("4294967296\n"), Some(4 << 30));
        assert_eq!(parse_limit("garbage"), None);
    }
}
