//! What a member's process holds besides its heap's resident pages, read
//! from `/proc`: the charge the arbiter adds to its resident pages.

/// A process's anonymous resident pages: `/proc/PID/statm`'s resident
/// less its shared (file and shmem) pages.  Cheap (one small file): read
/// every look.  A page a fork shares counts in full in every process that
/// maps it.
pub(super) fn anon_pages(pid: i32) -> Option<u64> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/statm")).ok()?;
    let mut f = text.split_whitespace().skip(1).map(|v| v.parse::<u64>().ok());
    let (resident, shared) = (f.next()??, f.next()??);
    Some(resident.saturating_sub(shared))
}

/// A process's anonymous pages outside its heap `[lo, hi)` (0, 0: it has
/// none published), each at its proportional share (`smaps`' `Pss`, for
/// the anonymous part of each mapping): a page a fork shares between two
/// processes counts half in each, so that the tree's sum is the memory it
/// holds, as a memory cgroup charges it.  uswap's own tables, copied at a
/// fork and shared until written, counted whole in every forked worker of
/// a Python `Pool`, and the tree was killed for memory it did not hold.
/// Dearer than `statm` (the whole `smaps`): read only to confirm a tree
/// that looks past its bound.
pub(super) fn anon_pages_outside(pid: i32, lo: u64, hi: u64) -> Option<u64> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/smaps")).ok()?;
    let mut kb = 0.0f64;
    let mut inside = false;
    let (mut rss, mut pss) = (0u64, 0u64);
    let mut add = |inside: bool, rss: u64, pss: u64, anon: u64| {
        if !inside && rss > 0 {
            kb += pss as f64 * anon.min(rss) as f64 / rss as f64;
        }
    };
    for line in text.lines() {
        if let Some(v) = line.strip_prefix("Rss:") {
            rss = field_kb(v);
        } else if let Some(v) = line.strip_prefix("Pss:") {
            pss = field_kb(v);
        } else if let Some(v) = line.strip_prefix("Anonymous:") {
            add(inside, rss, pss, field_kb(v));
        } else if let Some((range, _)) = line.split_once(' ') {
            if let Some((a, b)) = range.split_once('-') {
                if let (Ok(a), Ok(b)) = (u64::from_str_radix(a, 16), u64::from_str_radix(b, 16)) {
                    inside = a >= lo && b <= hi && hi > lo;
                    (rss, pss) = (0, 0);
                }
            }
        }
    }
    Some((kb / (crate::PAGE_SIZE as f64 / 1024.0)) as u64)
}

/// A `smaps` field's kB.
fn field_kb(v: &str) -> u64 {
    v.split_whitespace().next().and_then(|n| n.parse().ok()).unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A process's anonymous memory, at its share: a private mapping of
    /// 8 MiB written whole counts 8 MiB, none of it when it is the heap
    /// left out; shared with a forked child, it counts half.  Measured in
    /// a child of the test (the harness's other threads allocate).
    #[test]
    fn shared_pages_count_at_their_share() {
        // SAFETY: fork in a test; the child runs only the code below and
        // leaves by `_exit`.
        let child = unsafe { libc::fork() };
        if child == 0 {
            let ok = std::panic::catch_unwind(measure).unwrap_or(false);
            // SAFETY: ends the child at once.
            unsafe { libc::_exit(if ok { 0 } else { 1 }) };
        }
        let mut status = 0;
        // SAFETY: the child forked above.
        unsafe { libc::waitpid(child, &mut status, 0) };
        assert!(libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0, "the measuring child said why");
    }

    fn measure() -> bool {
        let len = 8 << 20;
        // SAFETY: a fresh private anonymous mapping of our own.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        assert_ne!(p, libc::MAP_FAILED);
        // SAFETY: the mapping just made.
        unsafe { std::ptr::write_bytes(p.cast::<u8>(), 1, len) };
        // SAFETY: getpid has no preconditions.
        let me = unsafe { libc::getpid() };
        let (lo, hi) = (p as u64, p as u64 + len as u64);
        let pages = (len / crate::PAGE_SIZE) as u64;
        let all = anon_pages_outside(me, 0, 0).unwrap();
        let without = anon_pages_outside(me, lo, hi).unwrap();
        if all < without + pages - 16 {
            eprintln!("all {all}, without the mapping {without}: {pages} pages apart?");
            return false;
        }
        // SAFETY: fork; the grandchild only sleeps and is killed.
        let grandchild = unsafe { libc::fork() };
        if grandchild == 0 {
            loop {
                // SAFETY: pause has no preconditions.
                unsafe { libc::pause() };
            }
        }
        std::thread::sleep(std::time::Duration::from_millis(200));
        let shared = anon_pages_outside(me, 0, 0).unwrap();
        // SAFETY: the grandchild forked above.
        unsafe {
            libc::kill(grandchild, libc::SIGKILL);
            libc::waitpid(grandchild, std::ptr::null_mut(), 0);
        }
        if shared > all - pages / 3 {
            eprintln!("shared with a child: {shared} of {all}; {pages} pages shared should count half");
            return false;
        }
        true
    }
}
