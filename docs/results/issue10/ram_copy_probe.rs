// The probe behind the RAM store's copy (docs/PERFORMANCE.md, "RAM copies"):
// rustc --edition 2021 -O ram_copy_probe.rs -o /tmp/ram_copy_probe && /tmp/ram_copy_probe
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;
const PAGE: usize = 4096;
#[inline(never)]
fn words(dst: *mut u8, src: &[u8]) {
    for (i, w) in src.chunks_exact(8).enumerate() {
        let v = u64::from_ne_bytes(w.try_into().unwrap());
        let word = unsafe { AtomicU64::from_ptr(dst.add(8 * i).cast::<u64>()) };
        word.store(v, Ordering::Relaxed);
    }
}
#[inline(never)]
fn words_read(src: *const u8, dst: &mut [u8]) {
    for (i, w) in dst.chunks_exact_mut(8).enumerate() {
        let word = unsafe { AtomicU64::from_ptr(src.add(8 * i) as *mut u64) };
        w.copy_from_slice(&word.load(Ordering::Relaxed).to_ne_bytes());
    }
}
#[inline(never)]
unsafe fn movsb(dst: *mut u8, src: *const u8, len: usize) {
    unsafe { std::arch::asm!("rep movsb", inout("rcx") len => _, inout("rdi") dst => _, inout("rsi") src => _, options(nostack, preserves_flags)); }
}
fn main() {
    let n = 64 * 1024; // pages: 256 MiB
    let mut dev = vec![1u8; n * PAGE];
    let mut buf = vec![0u8; PAGE];
    let order: Vec<usize> = (0..n).map(|i| (i * 7919) % n).collect();
    for round in 0..3 {
        let t = Instant::now();
        for &p in &order { words(unsafe { dev.as_mut_ptr().add(p * PAGE) }, &buf); }
        let w1 = t.elapsed().as_nanos() as f64 / n as f64;
        let t = Instant::now();
        for &p in &order { unsafe { movsb(dev.as_mut_ptr().add(p * PAGE), buf.as_ptr(), PAGE) }; }
        let w2 = t.elapsed().as_nanos() as f64 / n as f64;
        let t = Instant::now();
        for &p in &order { words_read(unsafe { dev.as_ptr().add(p * PAGE) }, &mut buf); }
        let r1 = t.elapsed().as_nanos() as f64 / n as f64;
        let t = Instant::now();
        for &p in &order { unsafe { movsb(buf.as_mut_ptr(), dev.as_ptr().add(p * PAGE), PAGE) }; }
        let r2 = t.elapsed().as_nanos() as f64 / n as f64;
        println!("round {round}: write words {w1:.0} ns, movsb {w2:.0} ns; read words {r1:.0} ns, movsb {r2:.0} ns");
    }
    std::hint::black_box(&dev);
}
