//! The guard's seccomp filter, in classic BPF: for each system call of
//! the table, trap (SIGSYS) when one of its buffer arguments points into
//! the guarded range, or always for the calls whose buffers hide behind a
//! vector, unless the call comes from the guard's own `syscall`
//! instruction; let everything else through.
//!
//! The guarded range is whole 4 GiB blocks (`[lo << 32, hi << 32)`), so
//! that a pointer is tested on its upper 32 bits alone: two compares an
//! argument.  The calls are found by a binary search on the number, so
//! that a call the table does not hold (most calls a program makes:
//! `mmap`, `close`, `getpid`) costs the filter about ten instructions.
//!
//! Classic BPF jumps forward only, and a conditional jump at most 255
//! instructions: every branch of the search goes through a pair of
//! unconditional jumps (32-bit offsets) placed right after its compare.

use super::table::{Call, FUTEX_NO_MEMORY};

/// One instruction, as the kernel's `struct sock_filter`.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Insn {
    pub code: u16,
    pub jt: u8,
    pub jf: u8,
    pub k: u32,
}

const LD_W_ABS: u16 = (libc::BPF_LD | libc::BPF_W | libc::BPF_ABS) as u16;
const JEQ_K: u16 = (libc::BPF_JMP | libc::BPF_JEQ | libc::BPF_K) as u16;
const JGE_K: u16 = (libc::BPF_JMP | libc::BPF_JGE | libc::BPF_K) as u16;
const JA: u16 = (libc::BPF_JMP | libc::BPF_JA) as u16;
const AND_K: u16 = (libc::BPF_ALU | libc::BPF_AND | libc::BPF_K) as u16;
const RET_K: u16 = (libc::BPF_RET | libc::BPF_K) as u16;

/// `struct seccomp_data` offsets.
const NR: u32 = 0;
const ARCH: u32 = 4;
const IP_LO: u32 = 8;
const IP_HI: u32 = 12;
fn arg_hi(i: u8) -> u32 {
    16 + 8 * u32::from(i) + 4
}
fn arg_lo(i: u8) -> u32 {
    16 + 8 * u32::from(i)
}

const AUDIT_ARCH_X86_64: u32 = 0xc000_003e;
/// `FUTEX_CMD_MASK`: the operation without its private and clock flags.
const FUTEX_CMD_MASK: u32 = !(libc::FUTEX_PRIVATE_FLAG | libc::FUTEX_CLOCK_REALTIME) as u32;

/// What the filter answers.
pub const ALLOW: u32 = libc::SECCOMP_RET_ALLOW;
/// A trap with the guard's mark in the data (the SIGSYS's `si_errno`),
/// so that its handler tells its own traps from another filter's.
pub const fn trap() -> u32 {
    libc::SECCOMP_RET_TRAP | MARK as u32
}
pub const MARK: u16 = 0x7573;

/// The program: instructions, with jump targets as labels until `build`.
struct Asm {
    out: Vec<Insn>,
    /// (instruction index, label) of unconditional jumps to patch.
    fixups: Vec<(usize, usize)>,
    labels: Vec<Option<usize>>,
}

impl Asm {
    fn label(&mut self) -> usize {
        self.labels.push(None);
        self.labels.len() - 1
    }
    fn here(&mut self, l: usize) {
        self.labels[l] = Some(self.out.len());
    }
    fn emit(&mut self, code: u16, jt: u8, jf: u8, k: u32) {
        self.out.push(Insn { code, jt, jf, k });
    }
    fn jump(&mut self, l: usize) {
        self.fixups.push((self.out.len(), l));
        self.emit(JA, 0, 0, 0);
    }
    fn build(mut self) -> Vec<Insn> {
        for &(at, l) in &self.fixups {
            let to = self.labels[l].expect("every label placed");
            self.out[at].k = (to - at - 1) as u32;
        }
        self.out
    }
}

/// The filter for pointers in `[lo << 32, hi << 32)`, letting calls made
/// from `allowed_ip` (the address after the guard's `syscall`) through.
pub fn program(calls: &[Call], lo: u32, hi: u32, allowed_ip: u64) -> Vec<Insn> {
    let mut a = Asm {
        out: Vec::new(),
        fixups: Vec::new(),
        labels: Vec::new(),
    };
    let allow = a.label();
    let trap_l = a.label();
    // Calls with the same buffer arguments share their checks: one block
    // per set of argument positions (and one for futex, one for the calls
    // always trapped), which the search's leaves jump to.
    let mut groups: Vec<(Vec<u8>, bool, usize)> = Vec::new();
    let group_of: Vec<usize> = calls
        .iter()
        .map(|c| {
            let key: Vec<u8> = if c.always() {
                vec![]
            } else {
                c.args.iter().map(|&(i, _)| i).collect()
            };
            let futex = c.nr == libc::SYS_futex;
            match groups.iter().position(|(k, f, _)| *k == key && *f == futex) {
                Some(g) => g,
                None => {
                    let l = a.label();
                    groups.push((key, futex, l));
                    groups.len() - 1
                }
            }
        })
        .collect();
    // Another architecture's calls (the 32-bit ABI's numbers differ):
    // not ours to judge.
    a.emit(LD_W_ABS, 0, 0, ARCH);
    a.emit(JEQ_K, 1, 0, AUDIT_ARCH_X86_64);
    a.jump(allow);
    // The number stays in A through the whole search.
    a.emit(LD_W_ABS, 0, 0, NR);
    let labels: Vec<usize> = group_of.iter().map(|&g| groups[g].2).collect();
    search(&mut a, calls, &labels, allow);
    for (key, futex, l) in &groups {
        a.here(*l);
        if key.is_empty() {
            a.jump(trap_l);
            continue;
        }
        if *futex {
            futex_checks(&mut a, lo, hi, allow, trap_l);
            continue;
        }
        for &i in key {
            check(&mut a, i, lo, hi, trap_l);
        }
        a.jump(allow);
    }
    // Where a trap would be, the guard's own call is let through: the
    // instruction pointer is read only here, so that for a number the
    // table does not hold the answer depends on the number alone, and the
    // kernel caches it (its seccomp action cache: no filter runs at all
    // for `getpid` or `mmap`).
    a.here(trap_l);
    a.emit(LD_W_ABS, 0, 0, IP_LO);
    a.emit(JEQ_K, 0, 3, allowed_ip as u32);
    a.emit(LD_W_ABS, 0, 0, IP_HI);
    a.emit(JEQ_K, 0, 1, (allowed_ip >> 32) as u32);
    a.jump(allow);
    a.emit(RET_K, 0, 0, trap());
    a.here(allow);
    a.emit(RET_K, 0, 0, ALLOW);
    a.build()
}

/// Trap when argument `i`'s upper half is in `[lo, hi)`, else go on to
/// the next instruction.
fn check(a: &mut Asm, i: u8, lo: u32, hi: u32, trap_l: usize) {
    // Below the range, or at or past its end: on; else in it: trap.
    a.emit(LD_W_ABS, 0, 0, arg_hi(i));
    a.emit(JGE_K, 0, 2, lo);
    a.emit(JGE_K, 1, 0, hi);
    a.jump(trap_l);
}

/// `futex`'s checks, by operation: a wake touches no memory; the word
/// (argument 0) is read by every other; the timeout (argument 3) is one
/// only for the waits (for a requeue it is a count); the second word
/// (argument 4) is read only by the requeues and `FUTEX_WAKE_OP`.  A
/// register the caller left unset (a futex call with four arguments) is
/// not taken for a pointer.
fn futex_checks(a: &mut Asm, lo: u32, hi: u32, allow: usize, trap_l: usize) {
    let op = |a: &mut Asm| {
        a.emit(LD_W_ABS, 0, 0, arg_lo(1));
        a.emit(AND_K, 0, 0, FUTEX_CMD_MASK);
    };
    op(a);
    for o in FUTEX_NO_MEMORY {
        a.emit(JEQ_K, 0, 1, o);
        a.jump(allow);
    }
    check(a, 0, lo, hi, trap_l);
    for (uses, arg) in [(&FUTEX_TIMEOUT[..], 3u8), (&FUTEX_SECOND_WORD[..], 4u8)] {
        let yes = a.label();
        let next = a.label();
        op(a);
        for &o in uses {
            a.emit(JEQ_K, 0, 1, o);
            a.jump(yes);
        }
        a.jump(next);
        a.here(yes);
        check(a, arg, lo, hi, trap_l);
        a.here(next);
    }
    a.jump(allow);
}

/// `futex` operations whose argument 3 is a timeout.
const FUTEX_TIMEOUT: [u32; 5] = [0, 9, 6, 13, 11]; // WAIT, WAIT_BITSET, LOCK_PI, LOCK_PI2, WAIT_REQUEUE_PI
/// `futex` operations that read a second word (argument 4).
const FUTEX_SECOND_WORD: [u32; 5] = [3, 4, 5, 11, 12]; // REQUEUE, CMP_REQUEUE, WAKE_OP, WAIT_REQUEUE_PI, CMP_REQUEUE_PI

/// Binary search over `calls` (sorted by number), the number in A; a
/// call found jumps to its group's checks (`labels[i]`), any other
/// number is let through.
fn search(a: &mut Asm, calls: &[Call], labels: &[usize], allow: usize) {
    if calls.len() == 1 {
        a.emit(JEQ_K, 0, 1, calls[0].nr as u32);
        a.jump(labels[0]);
        a.jump(allow);
        return;
    }
    let mid = calls.len() / 2;
    let right = a.label();
    a.emit(JGE_K, 0, 1, calls[mid].nr as u32);
    a.jump(right);
    search(a, &calls[..mid], &labels[..mid], allow);
    a.here(right);
    search(a, &calls[mid..], &labels[mid..], allow);
}

/// Run `prog` on a `seccomp_data` as the kernel would: for the tests.
#[cfg(test)]
pub fn run(prog: &[Insn], nr: i32, ip: u64, args: [u64; 6]) -> u32 {
    let mut data = [0u32; 16];
    data[0] = nr as u32;
    data[1] = AUDIT_ARCH_X86_64;
    data[2] = ip as u32;
    data[3] = (ip >> 32) as u32;
    for (i, v) in args.iter().enumerate() {
        data[4 + 2 * i] = *v as u32;
        data[5 + 2 * i] = (v >> 32) as u32;
    }
    let (mut acc, mut pc) = (0u32, 0usize);
    loop {
        let i = prog[pc];
        pc += 1;
        match i.code {
            LD_W_ABS => acc = data[i.k as usize / 4],
            AND_K => acc &= i.k,
            JEQ_K => pc += usize::from(if acc == i.k { i.jt } else { i.jf }),
            JGE_K => pc += usize::from(if acc >= i.k { i.jt } else { i.jf }),
            JA => pc += i.k as usize,
            RET_K => return i.k,
            other => panic!("unexpected instruction {other:#x}"),
        }
    }
}
