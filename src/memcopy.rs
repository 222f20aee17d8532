//! Byte copies that keep memory speed whatever the page offsets of their two buffers.
//!
//! glibc's `memcpy` moves blocks from a few KiB up to its non-temporal threshold with
//! `rep movsb`. AMD Zen cores run `rep movsb` 15-30 times slower when the destination lies a few
//! bytes past the source modulo 4 KiB, and Debian 12's glibc (2.36) steps around that only on
//! Intel CPUs. Measured on an AMD EPYC VM (bench/results/unaligned-copies-2026-12-07.md): 128 KiB
//! in 2.3 us, or 37-74 us with the destination 1-15 bytes past the source; a loop of vector
//! loads and stores takes 2.5 us at every distance. ferroccl copies between the caller's buffers
//! and its own (slots, staging) and between the caller's send and receive buffers, and a caller's
//! buffer may start anywhere: an array section `a(2:n)` of doubles is 8 bytes past its array's
//! 16-byte alignment, and the 2-rank all-reduce of such floats took 2-4x its aligned time.
//! Which distances are slow depends on the CPU and its microcode (1-15 bytes on one EPYC VM,
//! 1-31 on another, none on Intel), and the loop costs 10-20% at some distances where `memcpy`
//! is fine, and at 1 MiB and more, where glibc has left `rep movsb` for non-temporal stores. So
//! each distance of 1-63 bytes is measured once per process and size class, the first time a
//! copy meets it (`loop_pays`), and [`copy`] takes the loop only where it measured faster.
//! `FERROCCL_MEMCOPY=loop` or `memcpy` forces one way (tests, and a CPU that measures wrong).

use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::OnceLock;

/// Destinations up to this many bytes past their source, modulo [`PAGE_BYTES`], are measured
/// (glibc's own rule for Intel CPUs, where it avoids `rep movsb`, stops at 63).
const SHORT_DISTANCE_MAX: usize = 63;
const PAGE_BYTES: usize = 4096;
/// Copies shorter than this never reach `rep movsb` (glibc's threshold is at least 2 KiB).
const LOOP_MIN: usize = 2048;

/// The distance modulo a page from `src` to `dst` when a `memcpy` of `len` bytes between them
/// may meet the slow `rep movsb`, else `None`. `rep movsb` is x86's: elsewhere, always `None`.
fn short_distance(src: *const u8, dst: *const u8, len: usize) -> Option<usize> {
    let distance = (dst as usize).wrapping_sub(src as usize) % PAGE_BYTES;
    let candidate = cfg!(target_arch = "x86_64") && len >= LOOP_MIN && (1..=SHORT_DISTANCE_MAX).contains(&distance);
    candidate.then_some(distance)
}

/// Copies of at least this many bytes are measured apart from smaller ones: glibc leaves
/// `rep movsb` for non-temporal stores at a threshold set by the cache size (between 768 KiB
/// and 1 MiB on the 2-core VM, where a 768 KiB copy 8 bytes ahead took 241 us against 17).
const LARGE_MIN: usize = 1 << 20;
/// Bytes each measurement copies, per size class: small ones inside every `rep movsb` range
/// seen; large ones at the class's smallest size, so that a threshold above it shows (memcpy
/// does not get faster per byte as copies grow past it).
const PROBE_BYTES: [usize; 2] = [64 << 10, LARGE_MIN];

/// Per size class and distance: [`UNMEASURED`], [`MEMCPY`] or [`LOOP`].
static CHOICE: [[AtomicU8; SHORT_DISTANCE_MAX + 1]; 2] =
    [const { [const { AtomicU8::new(UNMEASURED) }; SHORT_DISTANCE_MAX + 1] }; 2];
const UNMEASURED: u8 = 0;
const MEMCPY: u8 = 1;
const LOOP: u8 = 2;
/// The loop is taken where `memcpy` takes this many times its time or more: a copy a little
/// slower either way is not worth a wrong guess from a noisy measurement.
const LOOP_GAIN_MIN: f64 = 1.3;

/// FERROCCL_MEMCOPY: `Some(LOOP)` or `Some(MEMCPY)` when forced, `None` to measure.
fn forced() -> Option<u8> {
    static FORCED: OnceLock<Option<u8>> = OnceLock::new();
    *FORCED.get_or_init(|| match crate::env::get_str("FERROCCL_MEMCOPY").as_deref() {
        Some("loop") => Some(LOOP),
        Some("memcpy") => Some(MEMCPY),
        None | Some("auto") | Some("") => None,
        Some(other) => {
            log::warn!(target: "INIT", "FERROCCL_MEMCOPY={other} is none of auto, loop, memcpy: measuring (auto)");
            None
        }
    })
}

/// Whether the vector loop beats `memcpy` for `len` bytes at this distance on this CPU:
/// measured the first time for the size class (the best of three copies each way: about 10 us
/// for small copies, or 150 us where `memcpy` is slow; about 0.2-5 ms for large ones), then
/// remembered. Threads racing on a first measurement each measure; either answer stands.
fn loop_pays(distance: usize, len: usize) -> bool {
    if let Some(way) = forced() {
        return way == LOOP;
    }
    let class = usize::from(len >= LARGE_MIN);
    match CHOICE[class][distance].load(Ordering::Relaxed) {
        MEMCPY => false,
        LOOP => true,
        _ => {
            let pays = measure_loop_gain(distance, PROBE_BYTES[class]) >= LOOP_GAIN_MIN;
            CHOICE[class][distance].store(if pays { LOOP } else { MEMCPY }, Ordering::Relaxed);
            log::debug!(target: "INIT", "copies of {} bytes, {distance} bytes ahead of their source modulo 4 KiB: {}",
                if class == 1 { "1 MiB and more" } else { "2 KiB-1 MiB" },
                if pays { "vector loop (memcpy measured slow)" } else { "memcpy" });
            pays
        }
    }
}

/// `memcpy`'s time over the loop's for `bytes` at `distance`.
fn measure_loop_gain(distance: usize, bytes: usize) -> f64 {
    let src = vec![0x5au8; bytes];
    let mut dst = vec![0u8; bytes + PAGE_BYTES];
    let from = src.as_ptr();
    let at = (from as usize + distance).wrapping_sub(dst.as_ptr() as usize) % PAGE_BYTES;
    let to = dst[at..].as_mut_ptr();
    let best = |f: &dyn Fn()| {
        (0..3)
            .map(|_| {
                let t = std::time::Instant::now();
                f();
                t.elapsed()
            })
            .min()
            .unwrap_or_default()
    };
    // SAFETY: `to` has bytes + PAGE_BYTES - at > bytes bytes of `dst` after it (at < a page),
    // `from` the `bytes` of `src`; two vectors, disjoint.
    let with_memcpy = best(&|| unsafe { std::ptr::copy_nonoverlapping(from, std::hint::black_box(to), bytes) });
    // SAFETY: as above.
    let with_loop = best(&|| unsafe { vector_copy(from, std::hint::black_box(to), bytes) });
    with_memcpy.as_secs_f64() / with_loop.as_secs_f64().max(1e-9)
}

/// `dst.copy_from_slice(src)`, at memory speed at every distance between the two.
///
/// # Panics
/// When the lengths differ, as `copy_from_slice` does.
pub fn copy(dst: &mut [u8], src: &[u8]) {
    assert_eq!(dst.len(), src.len(), "copy between slices of different lengths");
    // SAFETY: two slices, one of them mutable, cannot overlap; both hold src.len() bytes.
    unsafe { copy_bytes(src.as_ptr(), dst.as_mut_ptr(), src.len()) }
}

/// `std::ptr::copy(src, dst, len)` (memmove), at memory speed at every distance. Disjoint
/// ranges at a short distance may take the vector loop; overlapping ones (the caller's send and
/// receive buffers in place, or a caller breaking NCCL's in-place rule) always go to memmove,
/// as glibc's memcpy on x86-64 would treat them too.
///
/// # Safety
/// As for `std::ptr::copy`: `src` readable and `dst` writable for `len` bytes.
pub unsafe fn copy_bytes(src: *const u8, dst: *mut u8, len: usize) {
    if (src as usize).abs_diff(dst as usize) < len {
        // SAFETY: the caller's contract; memmove allows overlap.
        unsafe { std::ptr::copy(src, dst, len) };
    } else if short_distance(src, dst, len).is_some_and(|d| loop_pays(d, len)) {
        // SAFETY: the caller's contract, and the ranges are disjoint.
        unsafe { vector_copy(src, dst, len) };
    } else {
        // SAFETY: the caller's contract, and the ranges are disjoint.
        unsafe { std::ptr::copy_nonoverlapping(src, dst, len) };
    }
}

/// Copies with vector loads and stores, 128 bytes a step (AVX2 where the CPU has it, SSE2
/// otherwise); the tail, under 128 bytes, by `memcpy`, which moves that little with vector
/// registers too. Four stores of a vector each per step: a loop that stored its whole step at
/// once could be turned back into a `memcpy` call by the compiler.
///
/// # Safety
/// `src` readable and `dst` writable for `len` bytes, the two ranges disjoint.
#[cfg(target_arch = "x86_64")]
unsafe fn vector_copy(src: *const u8, dst: *mut u8, len: usize) {
    let body = len / STEP * STEP;
    if std::arch::is_x86_feature_detected!("avx2") {
        // SAFETY: the CPU has AVX2; the ranges as the caller guarantees.
        unsafe { steps_avx2(src, dst, body) };
    } else {
        // SAFETY: SSE2 is part of x86-64; the ranges as the caller guarantees.
        unsafe { steps_sse2(src, dst, body) };
    }
    // SAFETY: the last len - body bytes of both ranges.
    unsafe { std::ptr::copy_nonoverlapping(src.add(body), dst.add(body), len - body) };
}

#[cfg(not(target_arch = "x86_64"))]
unsafe fn vector_copy(src: *const u8, dst: *mut u8, len: usize) {
    // SAFETY: the caller's contract. (`rep movsb` is x86's; other CPUs' memcpy has no such case.)
    unsafe { std::ptr::copy_nonoverlapping(src, dst, len) };
}

const STEP: usize = 128;

/// # Safety
/// AVX2 present; `src` readable and `dst` writable for `body` bytes (a multiple of [`STEP`]),
/// disjoint.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn steps_avx2(src: *const u8, dst: *mut u8, body: usize) {
    use std::arch::x86_64::{__m256i, _mm256_loadu_si256, _mm256_storeu_si256};
    let mut i = 0;
    while i < body {
        // SAFETY: i + STEP <= body, within both ranges; unaligned loads and stores.
        unsafe {
            let (s, d) = (src.add(i) as *const __m256i, dst.add(i) as *mut __m256i);
            let (a, b, c, e) = (
                _mm256_loadu_si256(s),
                _mm256_loadu_si256(s.add(1)),
                _mm256_loadu_si256(s.add(2)),
                _mm256_loadu_si256(s.add(3)),
            );
            _mm256_storeu_si256(d, a);
            _mm256_storeu_si256(d.add(1), b);
            _mm256_storeu_si256(d.add(2), c);
            _mm256_storeu_si256(d.add(3), e);
        }
        i += STEP;
    }
}

/// # Safety
/// As [`steps_avx2`], without the AVX2 requirement.
#[cfg(target_arch = "x86_64")]
unsafe fn steps_sse2(src: *const u8, dst: *mut u8, body: usize) {
    use std::arch::x86_64::{__m128i, _mm_loadu_si128, _mm_storeu_si128};
    let mut i = 0;
    while i < body {
        // SAFETY: i + STEP <= body, within both ranges; unaligned loads and stores.
        unsafe {
            let (s, d) = (src.add(i) as *const __m128i, dst.add(i) as *mut __m128i);
            for k in (0..8).step_by(4) {
                let (a, b, c, e) = (
                    _mm_loadu_si128(s.add(k)),
                    _mm_loadu_si128(s.add(k + 1)),
                    _mm_loadu_si128(s.add(k + 2)),
                    _mm_loadu_si128(s.add(k + 3)),
                );
                _mm_storeu_si128(d.add(k), a);
                _mm_storeu_si128(d.add(k + 1), b);
                _mm_storeu_si128(d.add(k + 2), c);
                _mm_storeu_si128(d.add(k + 3), e);
            }
        }
        i += STEP;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pattern(len: usize) -> Vec<u8> {
        (0..len).map(|i| (i * 131 + i / 251) as u8).collect()
    }

    /// Every distance around the short window and every length around the loop's limits and
    /// its step, both ways the copy goes: the bytes arrive exactly, and nothing past them moves.
    #[test]
    fn copies_are_exact_at_every_distance_and_length() {
        let src_room = pattern(3 * PAGE_BYTES + 512);
        for src_off in [0usize, 3, 16, 100] {
            for distance in (0..=70).chain([4095, 4096, 4097, 4100]) {
                for len in [
                    0,
                    1,
                    127,
                    LOOP_MIN - 1,
                    LOOP_MIN,
                    LOOP_MIN + 1,
                    LOOP_MIN + 127,
                    LOOP_MIN + 128,
                    2 * PAGE_BYTES + 77,
                ] {
                    let src = &src_room[src_off..src_off + len];
                    let mut dst_room = vec![0xEEu8; 4 * PAGE_BYTES + 512];
                    // Destination `distance` bytes past the source modulo a page.
                    let base = dst_room.as_ptr() as usize;
                    let want = (src.as_ptr() as usize + distance) % PAGE_BYTES;
                    let at = (want + PAGE_BYTES - base % PAGE_BYTES) % PAGE_BYTES;
                    copy(&mut dst_room[at..at + len], src);
                    assert_eq!(&dst_room[at..at + len], src, "src_off {src_off} distance {distance} len {len}");
                    assert!(dst_room[..at].iter().chain(&dst_room[at + len..]).all(|&b| b == 0xEE));
                    // The loop itself, whichever way this CPU's distances were measured.
                    dst_room.fill(0xEE);
                    // SAFETY: `at + len` lies within dst_room; src is another vector's slice.
                    unsafe { vector_copy(src.as_ptr(), dst_room[at..].as_mut_ptr(), len) };
                    assert_eq!(&dst_room[at..at + len], src, "loop: src_off {src_off} distance {distance} len {len}");
                    assert!(dst_room[..at].iter().chain(&dst_room[at + len..]).all(|&b| b == 0xEE));
                }
            }
        }
    }

    #[test]
    fn only_long_copies_a_few_bytes_ahead_are_candidates() {
        let p = 0x10_0000 as *const u8;
        assert_eq!(short_distance(p, p.wrapping_add(8), LOOP_MIN), Some(8));
        assert_eq!(short_distance(p, p.wrapping_add(PAGE_BYTES + 63), 1 << 20), Some(63));
        assert_eq!(short_distance(p, p.wrapping_add(8), LOOP_MIN - 1), None);
        assert_eq!(short_distance(p, p, 1 << 20), None);
        assert_eq!(short_distance(p, p.wrapping_add(64), 1 << 20), None);
        assert_eq!(short_distance(p.wrapping_add(8), p, 1 << 20), None, "a destination behind its source is fine");
    }

    /// A distance is measured once per size class and its choice kept; the copies are exact
    /// either way (above).
    #[test]
    fn each_distance_is_measured_once_and_remembered() {
        assert!(measure_loop_gain(8, 4096) > 0.0);
        if forced().is_some() {
            return;
        }
        let first = loop_pays(40, LOOP_MIN);
        assert_ne!(CHOICE[0][40].load(Ordering::Relaxed), UNMEASURED);
        assert_eq!(CHOICE[1][40].load(Ordering::Relaxed), UNMEASURED, "large copies are measured apart");
        assert_eq!(loop_pays(40, LOOP_MIN), first);
    }

    /// Overlapping ranges come out as memmove would, at a distance the loop would otherwise
    /// take.
    #[test]
    fn overlapping_ranges_are_moved_not_smeared() {
        let mut room = pattern(3 * PAGE_BYTES);
        let want: Vec<u8> = room[..2 * PAGE_BYTES].to_vec();
        // SAFETY: both ranges lie inside `room`.
        unsafe { copy_bytes(room.as_ptr(), room.as_mut_ptr().add(8), 2 * PAGE_BYTES) };
        assert_eq!(&room[8..8 + 2 * PAGE_BYTES], &want[..]);
    }

    #[test]
    #[should_panic(expected = "different lengths")]
    fn slices_of_different_lengths_are_refused() {
        copy(&mut [0u8; 4], &[0u8; 5]);
    }
}
