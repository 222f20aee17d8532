//! Transparent huge pages under the buffers that peers reach by kernel copies.
//!
//! Ordinary buffers (malloc, stack, Fortran arrays) of a process are read and written by its
//! peers with `process_vm_readv`/`process_vm_writev` ([`super::peer_mem`]). For every call the
//! kernel looks up and pins each page of the range in the owner's page tables; with 4 KiB
//! pages that is 64 lookups per 256 KiB piece, per peer, and at 8 and 16 ranks those lookups,
//! not the copies, dominate (bench/results/malloc-allreduce-16core-2026-12-04.md: a malloc'd
//! 2 MiB all-reduce at 8 ranks took half the time on huge pages). So the second time such a
//! buffer of at least [`MIN_BYTES`] goes by kernel copies, its owner asks the kernel to back
//! the 2 MiB regions it touches with huge pages (`madvise(MADV_COLLAPSE)`, Linux 6.1+): the
//! kernel copies each region into a huge page in place, keeping the addresses, the contents
//! and the memory private and anonymous, as its khugepaged thread does for any process when
//! transparent huge pages are `always` on. Best effort: regions the kernel declines (not
//! anonymous, pinned, no huge page free) stay as they are; older kernels, and hosts whose
//! administrator set transparent huge pages to `never`, are asked nothing.
//!
//! Side effects, bounded: the second use pays the kernel's copy of those regions (about a
//! memcpy of them; a buffer used once, as a temporary, never does); the two regions at the ends of a buffer may reach past it into the same
//! mapping, and pages there that were never touched become resident (at most 4 MiB per
//! buffer). `FERROCCL_HUGE_PAGES=0` turns it off.

use std::collections::{BTreeSet, VecDeque};
use std::sync::{Mutex, OnceLock};

/// The size of a transparent huge page on x86-64 and most aarch64 kernels (PMD size).
const HUGE: usize = 2 << 20;
/// Smallest buffer worth it: below this the kernel copies of a collective are few, and the
/// enclosing regions would be mostly other memory.
pub const MIN_BYTES: usize = 1 << 20;
/// Ranges seen, newest last (a buffer is asked for on its second use).
const REMEMBERED: usize = 64;
/// Most regions remembered as asked for (128 GiB); the record starts afresh beyond.
const MAX_REGIONS: usize = 1 << 16;

/// What this process has asked for.
#[derive(Default)]
struct Record {
    /// Buffers' enclosing regions, as first seen.
    seen: VecDeque<(usize, usize)>,
    /// Start of every region asked for, so that a buffer that grows (nccl-tests' sweep over
    /// prefixes of one buffer) asks only for its new regions. A region freed and mapped
    /// again stays here: it is not asked for again (slower, never wrong).
    asked: BTreeSet<usize>,
}

/// Whether to ask at all: not where the administrator turned transparent huge pages off
/// (`never`, which MADV_COLLAPSE would otherwise override), and only if the kernel knows the
/// advice (Linux 6.1+): asked once with an empty range, which the kernel answers after
/// checking the advice and before looking at any mapping. A failure later means the region
/// was not eligible (not anonymous memory, say), not this.
fn supported() -> bool {
    static KNOWN: OnceLock<bool> = OnceLock::new();
    *KNOWN.get_or_init(|| {
        let setting = std::fs::read_to_string("/sys/kernel/mm/transparent_hugepage/enabled").unwrap_or_default();
        if setting.contains("[never]") {
            log::info!(target: "SHM", "SHM: transparent huge pages are off on this host ([never]): buffers keep their pages");
            return false;
        }
        // SAFETY: a zero-length range (page-aligned start) touches no memory.
        let rc = unsafe { libc::madvise(HUGE as *mut libc::c_void, 0, libc::MADV_COLLAPSE) };
        if rc != 0 {
            log::info!(target: "SHM", "SHM: this kernel does not collapse memory into huge pages (MADV_COLLAPSE)");
        }
        rc == 0
    })
}

fn record() -> std::sync::MutexGuard<'static, Record> {
    static RECORD: OnceLock<Mutex<Record>> = OnceLock::new();
    RECORD.get_or_init(|| Mutex::new(Record::default())).lock().unwrap_or_else(|e| e.into_inner())
}

fn enabled() -> bool {
    static ON: OnceLock<bool> = OnceLock::new();
    *ON.get_or_init(|| crate::env::get_bool("FERROCCL_HUGE_PAGES"))
}

/// The 2 MiB-aligned regions that `addr..addr + len` touches, or `None` when it is too short.
fn regions(addr: usize, len: usize) -> Option<(usize, usize)> {
    if len < MIN_BYTES {
        return None;
    }
    let start = addr & !(HUGE - 1);
    let end = addr.checked_add(len)?.checked_next_multiple_of(HUGE)?;
    Some((start, end))
}

impl Record {
    /// The runs of regions of `start..end` to ask for now: none on a buffer's first use, then
    /// those not asked for before (marked asked).
    fn regions_to_ask(&mut self, start: usize, end: usize) -> Vec<(usize, usize)> {
        if !self.seen.iter().any(|&(s, e)| s <= start && end <= e) {
            if self.seen.len() == REMEMBERED {
                self.seen.pop_front();
            }
            self.seen.push_back((start, end));
            return Vec::new();
        }
        if self.asked.len() + (end - start) / HUGE > MAX_REGIONS {
            self.asked.clear();
        }
        let mut runs: Vec<(usize, usize)> = Vec::new();
        for r in (start..end).step_by(HUGE) {
            if !self.asked.insert(r) {
                continue;
            }
            match runs.last_mut() {
                Some(run) if run.1 == r => run.1 = r + HUGE,
                _ => runs.push((r, r + HUGE)),
            }
        }
        runs
    }
}

/// Asks the kernel, from a buffer's second use on and once per region, to back this
/// process's buffer `addr..addr + len` with huge pages because peers are about to reach it by
/// kernel copies. Never fails: the buffer works the same either way.
pub fn prepare_for_kernel_copies(addr: usize, len: usize) {
    if !enabled() || !supported() {
        return;
    }
    let Some((start, end)) = regions(addr, len) else { return };
    let runs = record().regions_to_ask(start, end);
    for (lo, hi) in runs {
        let t0 = std::time::Instant::now();
        let mut result = collapse(lo, hi);
        if result == Err(libc::ENOMEM) {
            // The run reaches past the mapping: keep to the regions inside the buffer.
            let inner = (lo.max(addr.next_multiple_of(HUGE)), hi.min((addr + len) & !(HUGE - 1)));
            result = if inner.0 < inner.1 { collapse(inner.0, inner.1) } else { Ok(()) };
        }
        match result {
            Ok(()) => log::info!(
                target: "SHM",
                "SHM: {} bytes at {lo:#x} now on huge pages for peers' kernel copies ({} us; FERROCCL_HUGE_PAGES)",
                hi - lo,
                t0.elapsed().as_micros()
            ),
            Err(e) => log::debug!(
                target: "SHM",
                "SHM: huge pages for {} bytes at {lo:#x}: {}",
                hi - lo,
                std::io::Error::from_raw_os_error(e)
            ),
        }
    }
}

/// `madvise(start, end - start, MADV_COLLAPSE)`; the errno on failure.
fn collapse(start: usize, end: usize) -> Result<(), i32> {
    // SAFETY: MADV_COLLAPSE changes how the range is backed, never its contents or addresses
    // (the kernel copies each region under its locks, as khugepaged does in the background),
    // and the kernel checks the range itself; no Rust reference depends on the backing.
    let rc = unsafe { libc::madvise(start as *mut libc::c_void, end - start, libc::MADV_COLLAPSE) };
    if rc == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error().raw_os_error().unwrap_or(libc::EIO))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn regions_enclose_the_buffer_in_whole_huge_pages() {
        assert_eq!(regions(0x1000, MIN_BYTES - 1), None);
        assert_eq!(regions(HUGE + 16, 2 * HUGE), Some((HUGE, 4 * HUGE)));
        assert_eq!(regions(HUGE, HUGE), Some((HUGE, 2 * HUGE)));
        assert_eq!(regions(usize::MAX - HUGE, HUGE), None);
    }

    #[test]
    fn a_buffer_is_asked_for_on_its_second_use_and_only_its_new_regions_after() {
        let mut rec = Record::default();
        let base = 64 * HUGE;
        assert!(rec.regions_to_ask(base, base + 2 * HUGE).is_empty(), "first use");
        assert_eq!(rec.regions_to_ask(base, base + 2 * HUGE), vec![(base, base + 2 * HUGE)]);
        assert!(rec.regions_to_ask(base, base + HUGE).is_empty(), "inside a buffer asked for");
        // The buffer grows: first use of the larger range, then only the new regions.
        assert!(rec.regions_to_ask(base, base + 5 * HUGE).is_empty());
        assert_eq!(rec.regions_to_ask(base, base + 5 * HUGE), vec![(base + 2 * HUGE, base + 5 * HUGE)]);
        assert!(rec.regions_to_ask(base, base + 5 * HUGE).is_empty());
    }

    #[test]
    fn collapsing_keeps_contents() {
        // An anonymous private mapping like a malloc'd mmapped chunk, filled before.
        let len = 3 * HUGE;
        let v: Vec<u64> = (0..(len / 8) as u64).map(|i| i.wrapping_mul(0x9e37_79b9_7f4a_7c15)).collect();
        let addr = v.as_ptr() as usize;
        prepare_for_kernel_copies(addr + 8, len - 16);
        prepare_for_kernel_copies(addr + 8, len - 16);
        assert!(v.iter().enumerate().all(|(i, &x)| x == (i as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15)));
        if enabled() && supported() {
            let (start, _) = regions(addr + 8, len - 16).unwrap();
            assert!(record().asked.contains(&start));
        }
    }
}
