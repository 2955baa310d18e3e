//! `uswap seccomp-profile`: a container runtime's default seccomp profile
//! with the two calls uswap needs allowed, and nothing else changed.
//!
//! Docker's and Podman's default profiles refuse `userfaultfd(2)` (Docker
//! by leaving it off its allow list, Podman with an explicit EPERM rule),
//! and so do containerd's and CRI-O's RuntimeDefault in Kubernetes.  uswap
//! cannot page without it.  Both allow `process_madvise` only with
//! CAP_SYS_PTRACE; uswap discards a reclaim batch with one (one TLB flush
//! for the batch), and without it range by range, correct but slower.
//! Everything else uswap does (mmap, ioctl on the descriptor, pidfd_open,
//! io_uring where allowed) the defaults already permit.
//!
//! Neither gives a container what the kernel does not already bound.
//! With `vm.unprivileged_userfaultfd=0` (the kernel's default) a process
//! without CAP_SYS_PTRACE in the initial namespace may open userfaultfd for
//! faults in user mode only (`UFFD_USER_MODE_ONLY`), which closed the
//! kernel-fault race windows exploits used it for.  `process_madvise` on
//! another process needs ptrace access to it and CAP_SYS_NICE, which the
//! engines do not grant by default: without them, a process may advise
//! only its own memory, as `madvise` does.
//!
//! The profiles it starts from are the runtimes' own files, verbatim, as
//! Debian 12 packages them (crates/uswap-cli/seccomp/README.md says from
//! where); `--from` takes any other, such as a newer runtime's.

use anyhow::{bail, Context, Result};
use serde_json::{json, Value};

/// The profiles built in: the runtime's default, byte for byte.
const DOCKER: &str = include_str!("../seccomp/docker-20.10.24.json");
const PODMAN: &str = include_str!("../seccomp/podman-4.3.1.json");

/// The calls uswap needs and the defaults refuse (the second without
/// CAP_SYS_PTRACE).
const SYSCALLS: [&str; 2] = ["userfaultfd", "process_madvise"];

#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum Runtime {
    /// Docker's default (moby 20.10.24); also the base for a Kubernetes
    /// Localhost profile.
    Docker,
    /// Podman's default (containers-common 0.50.1, Podman 4.3).
    Podman,
}

/// Print a container runtime's default seccomp profile with userfaultfd
/// and process_madvise allowed: the one change uswap needs in a container.
///
/// `uswap seccomp-profile docker > uswap-seccomp.json` on the host, then
/// `docker run --security-opt seccomp=uswap-seccomp.json IMAGE uswap run
/// -- PROGRAM`.
///
/// Podman takes the same option.  For Kubernetes, put the file on each node
/// under /var/lib/kubelet/seccomp/ and name it in the pod's
/// `securityContext.seccompProfile` (type Localhost).  The other way in
/// needs no profile: `--device /dev/userfaultfd`, which uswap opens when
/// the call is refused.
#[derive(clap::Args, Debug)]
pub struct SeccompArgs {
    /// Whose default to start from.
    #[arg(value_enum, default_value = "docker")]
    pub runtime: Runtime,
    /// Start from this profile instead (Docker's JSON format, which Podman,
    /// containerd and CRI-O read too), e.g. /usr/share/containers/seccomp.json.
    #[arg(long, value_name = "FILE")]
    pub from: Option<std::path::PathBuf>,
}

pub fn run(a: &SeccompArgs) -> Result<()> {
    let (text, what) = match &a.from {
        Some(path) => (
            std::fs::read_to_string(path).with_context(|| format!("cannot read {}", path.display()))?,
            path.display().to_string(),
        ),
        None => match a.runtime {
            Runtime::Docker => (DOCKER.to_owned(), "Docker's default profile".to_owned()),
            Runtime::Podman => (PODMAN.to_owned(), "Podman's default profile".to_owned()),
        },
    };
    let profile: Value =
        serde_json::from_str(&text).with_context(|| format!("{what} is not JSON; give a seccomp profile"))?;
    let allowed = allow_uswap(profile).with_context(|| format!("cannot change {what}"))?;
    println!("{}", pretty(&allowed, &text));
    Ok(())
}

/// `profile` as JSON indented as `like` is (the engines' files use tabs),
/// so that a diff against the original shows the change alone.
fn pretty(profile: &Value, like: &str) -> String {
    use serde::Serialize;
    let indent: String = like
        .lines()
        .nth(1)
        .map(|l| l.chars().take_while(|c| c.is_whitespace()).collect())
        .filter(|i: &String| !i.is_empty())
        .unwrap_or_else(|| "  ".into());
    let mut out = Vec::new();
    let mut ser = serde_json::Serializer::with_formatter(
        &mut out,
        serde_json::ser::PrettyFormatter::with_indent(indent.as_bytes()),
    );
    profile.serialize(&mut ser).expect("a JSON value serializes");
    String::from_utf8(out).expect("serde_json writes UTF-8")
}

/// `profile` with each of [`SYSCALLS`] allowed unconditionally.
pub fn allow_uswap(mut profile: Value) -> Result<Value> {
    for call in SYSCALLS {
        profile = allow(profile, call)?;
    }
    Ok(profile)
}

/// `profile` with `call` allowed unconditionally: taken out of every rule
/// that refuses it or allows it only on a condition (a rule left with no
/// calls goes), and added as a rule of its own unless one already allows
/// it without condition.  The rest of the profile is kept as it was, in
/// its order.
fn allow(mut profile: Value, call: &str) -> Result<Value> {
    let Some(rules) = profile.get_mut("syscalls").and_then(Value::as_array_mut) else {
        bail!("it has no \"syscalls\" list: not a seccomp profile in Docker's format");
    };
    let mut allowed = false;
    rules.retain_mut(|rule| {
        let allows = rule.get("action").and_then(Value::as_str) == Some("SCMP_ACT_ALLOW");
        // A condition (arguments, capabilities, kernel, architecture) makes
        // the rule's verdict partial: such an allow is not enough, and
        // such a refusal must not stand before the unconditional allow.
        let conditional = ["args", "includes", "excludes"]
            .iter()
            .any(|k| rule.get(*k).is_some_and(|v| !is_empty(v)));
        // Docker's old format names one call per rule ("name").
        if rule.get("name").and_then(Value::as_str) == Some(call) {
            allowed |= allows && !conditional;
            return allows && !conditional;
        }
        let Some(names) = rule.get_mut("names").and_then(Value::as_array_mut) else {
            return true;
        };
        if !names.iter().any(|n| n == call) {
            return true;
        }
        if allows && !conditional {
            allowed = true;
            return true;
        }
        names.retain(|n| n != call);
        !names.is_empty()
    });
    if !allowed {
        rules.push(json!({
            "names": [call],
            "action": "SCMP_ACT_ALLOW",
            "comment": format!("uswap: {}", why(call)),
        }));
    }
    Ok(profile)
}

/// Why uswap's profile allows `call`, for the rule's comment.
fn why(call: &str) -> &'static str {
    match call {
        "userfaultfd" => "paging in user space needs userfaultfd; without CAP_SYS_PTRACE the kernel grants it for user-mode faults only (vm.unprivileged_userfaultfd=0)",
        _ => "a reclaim batch is discarded with one process_madvise; without CAP_SYS_NICE the kernel lets a process advise only its own memory",
    }
}

fn is_empty(v: &Value) -> bool {
    match v {
        Value::Null => true,
        Value::Array(a) => a.is_empty(),
        Value::Object(o) => o.values().all(is_empty),
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The calls a profile lets through unconditionally, and those it
    /// names in a refusal.
    fn verdicts(p: &Value) -> (Vec<String>, Vec<String>) {
        let (mut allow, mut refuse) = (vec![], vec![]);
        for rule in p["syscalls"].as_array().unwrap() {
            let plain = ["args", "includes", "excludes"]
                .iter()
                .all(|k| rule.get(*k).is_none_or(is_empty));
            let names = rule["names"]
                .as_array()
                .unwrap()
                .iter()
                .map(|n| n.as_str().unwrap().to_owned());
            match (rule["action"].as_str().unwrap(), plain) {
                ("SCMP_ACT_ALLOW", true) => allow.extend(names),
                ("SCMP_ACT_ALLOW", false) => {}
                _ => refuse.extend(names),
            }
        }
        (allow, refuse)
    }

    #[test]
    fn the_built_in_defaults_refuse_them_and_the_result_allows_them_and_changes_nothing_else() {
        for base in [DOCKER, PODMAN] {
            let before: Value = serde_json::from_str(base).unwrap();
            let after = allow_uswap(before.clone()).unwrap();
            let (allow0, refuse0) = verdicts(&before);
            let (allow1, refuse1) = verdicts(&after);
            for call in SYSCALLS {
                assert!(
                    !allow0.iter().any(|n| n == call),
                    "the default already allows {call}"
                );
                assert!(allow1.iter().any(|n| n == call), "{call}");
                assert!(!refuse1.iter().any(|n| n == call), "{call}");
            }
            // Every other call keeps its verdict.
            let others = |v: &[String]| {
                v.iter()
                    .filter(|n| !SYSCALLS.contains(&n.as_str()))
                    .cloned()
                    .collect::<Vec<_>>()
            };
            assert_eq!(others(&allow0), others(&allow1));
            assert_eq!(others(&refuse0), others(&refuse1));
            for key in ["defaultAction", "defaultErrnoRet", "archMap"] {
                assert_eq!(before.get(key), after.get(key), "{key} changed");
            }
            // Twice is once.
            assert_eq!(allow_uswap(after.clone()).unwrap(), after);
        }
    }

    #[test]
    fn the_shipped_profiles_are_what_the_command_prints() {
        for (base, shipped) in [
            (DOCKER, include_str!("../../../deploy/seccomp/docker.json")),
            (PODMAN, include_str!("../../../deploy/seccomp/podman.json")),
        ] {
            let made = pretty(&allow_uswap(serde_json::from_str(base).unwrap()).unwrap(), base);
            assert_eq!(
                made.trim_end(),
                shipped.trim_end(),
                "deploy/seccomp/ is stale: remake it with `uswap seccomp-profile docker > deploy/seccomp/docker.json` (and podman)"
            );
        }
    }

    #[test]
    fn a_refusal_shared_with_other_calls_keeps_them() {
        let p = json!({"defaultAction": "SCMP_ACT_ALLOW", "syscalls": [
            {"names": ["userfaultfd", "kexec_load"], "action": "SCMP_ACT_ERRNO"},
            {"names": ["userfaultfd"], "action": "SCMP_ACT_ALLOW", "includes": {"caps": ["CAP_SYS_PTRACE"]}},
        ]});
        let after = allow_uswap(p).unwrap();
        let (allow, refuse) = verdicts(&after);
        assert_eq!(refuse, ["kexec_load"]);
        assert_eq!(allow, SYSCALLS);
    }

    #[test]
    fn something_that_is_not_a_profile_is_refused_with_the_reason() {
        let e = allow_uswap(json!({"defaultAction": "SCMP_ACT_ALLOW"})).unwrap_err();
        assert!(e.to_string().contains("no \"syscalls\" list"), "{e}");
    }
}
