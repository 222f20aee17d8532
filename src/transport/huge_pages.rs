//! Transparent huge pages under the buffers that peers reach by kernel copies.
//!
//! Ordinary buffers (malloc, stack, Fortran arrays) of a process are read and written by its
//! peers with `process_vm_readv`/`process_vm_writev` ([`super::peer_mem`]). For every call the
//! kernel looks up and pins each page of the range in the owner's page tables; with 4 KiB
//! pages that is 64 lookups per 256 KiB piece, per peer, and at 8 and 16 ranks those lookups,
//! not the copies, dominate (bench/results/malloc-allreduce-16core-2026-12-04.md: a malloc'd
//! 2 MiB all-reduce at 8 ranks took half the time on huge pages). So once such a buffer has
//! gone by kernel copies often enough (see below), its owner asks the kernel to back the 2 MiB
//! regions of it with huge pages (`madvise(MADV_COLLAPSE)`, Linux 6.1+), at most
//! [`REGIONS_PER_CALL`] per collective: the kernel copies each region into a huge page in
//! place, keeping the addresses and the contents, as its khugepaged thread does for any
//! process when transparent huge pages are `always` on.
//!
//! When: a buffer of at least [`LARGE_BYTES`] on any use after its first; any buffer (from
//! [`MIN_BYTES`], a slice of a larger array, say) once its uses have moved [`SMALL_CREDIT`]
//! bytes, because the collapse costs the owner about a millisecond per region (measured: 0.4-1.2
//! ms per 2 MiB region on the 2-core VM, 1.6-3.5 ms per 4 MiB on the 16-core host) and saves
//! 0.04-0.16 us per 4 KiB page per kernel copy (2 ranks, 2-core VM, slices of 64 MiB malloc'd
//! arrays, bench/results/slices-2core-2026-12-04.md: broadcast 128 KiB 10.8-11.5 -> 6.4-6.5
//! us, all-gather 512 KiB 28.4-31.2 -> 18.5-20.3 us): a 128 KiB slice repays it after some
//! hundred uses, a 64 MiB buffer after a few.
//!
//! Only private anonymous memory (what malloc, the stack and Fortran allocate) is touched, and
//! only whole regions inside the buffer's own mapping: never shared memory, files or other
//! mappings. A region that reaches past the buffer (either end of it, or all of it for a
//! buffer smaller than a region) is asked for only when at least half of its pages are
//! resident already, so the collapse at most doubles the memory that region uses; one found
//! sparser is looked at again only after more traffic (at least [`SMALL_CREDIT`] bytes and
//! eight uses, doubling each time it is found sparse). Best
//! effort: regions the kernel declines (pinned, say, or no huge page free) stay as they are;
//! older kernels, and hosts whose administrator set transparent huge pages to `never`, are
//! asked nothing.
//!
//! Side effects, bounded: the call that asks pays the kernel's copy of up to
//! [`REGIONS_PER_CALL`] regions (a buffer used once, as a temporary, never does); untouched
//! pages of a region reaching past the buffer become resident (at most as many as were
//! resident). `FERROCCL_HUGE_PAGES=0` turns it off.

use std::collections::{BTreeSet, HashMap};
use std::sync::{Mutex, OnceLock};

/// The size of a transparent huge page on x86-64 (PMD size); on kernels with another (arm64
/// with 64 KiB pages) the calls collapse nothing and cost a system call per region, once.
const HUGE_PAGE_BYTES: usize = 2 << 20;
/// Smallest buffer considered: smaller messages travel through the node area's slots, not by
/// kernel copies.
pub const MIN_BYTES: usize = 16 << 10;
/// A use of at least this many bytes asks for a buffer seen before.
const LARGE_BYTES: usize = 1 << 20;
/// Any buffer is asked for once its uses (the first one included) have moved this many bytes:
/// smaller ones after at least eight uses, so a region's collapse follows repeated traffic
/// through it.
const SMALL_CREDIT: usize = 8 << 20;
/// Buffers remembered between uses.
const REMEMBERED: usize = 1024;
/// Most regions remembered as asked for (128 GiB); the record starts afresh beyond.
const MAX_REGIONS: usize = 1 << 16;
/// Most regions asked for in one call (64 MiB): a large buffer is collapsed over several
/// collectives instead of stalling one, and its peers, for the kernel's copy of all of it.
const REGIONS_PER_CALL: usize = 32;

/// A buffer's enclosing regions, as seen by the record.
struct SeenBuffer {
    /// Bytes its uses have moved so far (since it was last deferred).
    moved: usize,
    /// Bytes its uses must move before it is asked for again: [`SMALL_CREDIT`], more after
    /// each deferral.
    needed: usize,
    /// Times some of its regions were found too sparse to ask for.
    deferrals: u32,
    /// Nothing more to ask for it.
    done: bool,
    /// The record's use count at its last use: the buffers unused longest are forgotten first.
    last_use: u64,
}

/// What this process has asked for.
#[derive(Default)]
struct CollapseRecord {
    /// By enclosing range.
    seen: HashMap<(usize, usize), SeenBuffer>,
    /// Start of every region asked for, so that a buffer that grows (nccl-tests' sweep over
    /// prefixes of one buffer) asks only for its new regions. A region freed and mapped
    /// again stays here: it is not asked for again (slower, never wrong).
    asked: BTreeSet<usize>,
    /// Start of every region the kernel collapsed on our asking (a subset of `asked`): where
    /// peers' kernel copies find huge pages. Like `asked`, a region freed and mapped again
    /// stays here (its kernel copies are then as slow as before it was collapsed, never wrong).
    collapsed: BTreeSet<usize>,
    /// Uses recorded.
    uses: u64,
}

fn process_record() -> &'static Mutex<CollapseRecord> {
    static RECORD: OnceLock<Mutex<CollapseRecord>> = OnceLock::new();
    RECORD.get_or_init(|| Mutex::new(CollapseRecord::default()))
}

fn enabled() -> bool {
    static ON: OnceLock<bool> = OnceLock::new();
    *ON.get_or_init(|| crate::env::get_bool("FERROCCL_HUGE_PAGES"))
}

/// Whether to ask at all: not where the administrator turned transparent huge pages off
/// (`never`, which MADV_COLLAPSE would otherwise override), and only if the kernel knows the
/// advice (Linux 6.1+, built with transparent huge pages): asked once with an empty range,
/// which the kernel answers after checking the advice and before looking at any mapping.
fn supported() -> bool {
    static KNOWN: OnceLock<bool> = OnceLock::new();
    *KNOWN.get_or_init(|| {
        let setting = std::fs::read_to_string("/sys/kernel/mm/transparent_hugepage/enabled").unwrap_or_default();
        if setting.contains("[never]") {
            log::info!(target: "SHM", "SHM: transparent huge pages are off on this host ([never]): buffers keep their pages");
            return false;
        }
        // SAFETY: a zero-length range (page-aligned start) touches no memory.
        let rc = unsafe { libc::madvise(HUGE_PAGE_BYTES as *mut libc::c_void, 0, libc::MADV_COLLAPSE) };
        if rc != 0 {
            log::info!(target: "SHM", "SHM: this kernel does not collapse memory into huge pages (MADV_COLLAPSE)");
        }
        rc == 0
    })
}

/// The 2 MiB-aligned range enclosing `addr..addr + len`, or `None` when it is too short.
fn enclosing_huge_range(addr: usize, len: usize) -> Option<(usize, usize)> {
    if len < MIN_BYTES {
        return None;
    }
    let start = addr & !(HUGE_PAGE_BYTES - 1);
    let end = addr.checked_add(len)?.checked_next_multiple_of(HUGE_PAGE_BYTES)?;
    Some((start, end))
}

impl CollapseRecord {
    /// The regions of `start..end` (enclosing a buffer of `len` bytes) to ask for now: none
    /// until the buffer qualifies (a use of [`LARGE_BYTES`] after the first use, or uses that
    /// moved the credit needed), then up to [`REGIONS_PER_CALL`] of those not asked for before
    /// (marked asked); `None` when every region was asked for already.
    fn regions_to_ask(&mut self, start: usize, end: usize, len: usize) -> Option<Vec<usize>> {
        // A buffer (or part of one) all asked for already: nothing to track.
        if (start..end).step_by(HUGE_PAGE_BYTES).all(|r| self.asked.contains(&r)) {
            return None;
        }
        self.uses += 1;
        let uses = self.uses;
        let key = (start, end);
        let Some(buf) = self.seen.get_mut(&key) else {
            if self.seen.len() >= REMEMBERED {
                self.forget_older_half();
            }
            let seen = SeenBuffer { moved: len, needed: SMALL_CREDIT, deferrals: 0, done: false, last_use: uses };
            self.seen.insert(key, seen);
            return Some(Vec::new());
        };
        buf.last_use = uses;
        buf.moved = buf.moved.saturating_add(len);
        let large_again = len >= LARGE_BYTES && buf.deferrals == 0;
        if buf.done || !(large_again || buf.moved >= buf.needed) {
            return Some(Vec::new());
        }
        let missing: Vec<usize> = (start..end).step_by(HUGE_PAGE_BYTES).filter(|r| !self.asked.contains(r)).collect();
        if missing.len() > MAX_REGIONS {
            // Larger than the record: never asked for.
            buf.done = true;
            return Some(Vec::new());
        }
        if self.asked.len() + missing.len() > MAX_REGIONS {
            self.asked.clear();
            self.collapsed.clear();
            self.seen.values_mut().for_each(|b| b.done = false);
        }
        let now: Vec<usize> = missing.iter().copied().take(REGIONS_PER_CALL).collect();
        if let Some(buf) = self.seen.get_mut(&key) {
            buf.done = now.len() == missing.len();
        }
        self.asked.extend(&now);
        Some(now)
    }

    /// `regions` of the buffer enclosed by `start..end` (of `len` bytes) were not asked for
    /// after all (mostly not resident yet): they are looked at again once the buffer's uses
    /// have moved at least [`SMALL_CREDIT`] and eight uses' worth of bytes more, twice that
    /// after each further deferral, so a sparse region costs a residency check now and then,
    /// not per call.
    fn defer(&mut self, start: usize, end: usize, len: usize, regions: &[usize]) {
        for r in regions {
            self.asked.remove(r);
        }
        if let Some(buf) = self.seen.get_mut(&(start, end)) {
            let deferrals = buf.deferrals.saturating_add(1);
            let needed = SMALL_CREDIT.max(len.saturating_mul(8)).saturating_mul(1 << (deferrals - 1).min(16));
            *buf = SeenBuffer { moved: 0, needed, deferrals, done: false, ..*buf };
        }
    }

    /// Forgets the half of the remembered buffers unused longest: one pass per
    /// [`REMEMBERED`] / 2 new buffers, not one per new buffer.
    fn forget_older_half(&mut self) {
        let mut last: Vec<u64> = self.seen.values().map(|b| b.last_use).collect();
        let mid = last.len() / 2;
        let (_, &mut median, _) = last.select_nth_unstable(mid);
        self.seen.retain(|_, b| b.last_use > median);
    }
}

/// Whether at least half of the 2 MiB region at `region` (aligned) is resident: asking for
/// it then at most doubles the memory it takes.
fn mostly_resident(region: usize) -> bool {
    // SAFETY: sysconf reads a constant of the system.
    let page = usize::try_from(unsafe { libc::sysconf(libc::_SC_PAGESIZE) }).unwrap_or(4096).max(1);
    let mut pages = vec![0u8; HUGE_PAGE_BYTES.div_ceil(page)];
    // SAFETY: mincore only reads the page tables of the range (page-aligned start) and writes
    // one byte per page into `pages`, which holds that many.
    let rc = unsafe { libc::mincore(region as *mut libc::c_void, HUGE_PAGE_BYTES, pages.as_mut_ptr()) };
    rc == 0 && pages.iter().filter(|&&p| p & 1 != 0).count() * 2 >= pages.len()
}

/// Asks the kernel, once the buffer qualifies (module notes), to back this process's buffer at
/// `addr` (`len` bytes) with huge pages because peers are about to reach it by kernel copies. Never
/// fails: the buffer works the same either way. Returns the bytes the kernel collapsed.
pub fn prepare_for_kernel_copies(addr: usize, len: usize) -> usize {
    if !enabled() || !supported() {
        return 0;
    }
    // Buffers this thread found all asked for recently: no lock on the common path of a
    // buffer used over and over (a region asked for again later, after the record starts
    // afresh, is not: slower, never wrong).
    thread_local! {
        static ALL_ASKED: std::cell::Cell<[(usize, usize); 4]> = const { std::cell::Cell::new([(0, 0); 4]) };
    }
    let Some(range) = enclosing_huge_range(addr, len) else { return 0 };
    if ALL_ASKED.with(|a| a.get().contains(&range)) {
        return 0;
    }
    let Some(collapsed) = prepare_with(process_record(), addr, len) else {
        ALL_ASKED.with(|a| {
            let mut v = a.get();
            v.rotate_right(1);
            v[0] = range;
            a.set(v);
        });
        return 0;
    };
    collapsed
}

/// Whether every 2 MiB region under `addr..addr + len` of this process was collapsed into a
/// huge page on our asking ([`prepare_for_kernel_copies`]), so that peers' kernel copies of
/// it pin a page per region instead of one per 4 KiB. Regions the kernel made huge by itself
/// are not known here (false: the caller then picks the path that needs no huge pages).
pub fn on_huge_pages(addr: usize, len: usize) -> bool {
    on_huge_pages_in(process_record(), addr, len)
}

fn on_huge_pages_in(record: &Mutex<CollapseRecord>, addr: usize, len: usize) -> bool {
    let Some((start, end)) = enclosing_huge_range(addr, len) else { return false };
    let record = record.lock().unwrap_or_else(|e| e.into_inner());
    (start..end).step_by(HUGE_PAGE_BYTES).all(|r| record.collapsed.contains(&r))
}

/// [`prepare_for_kernel_copies`] with the record given (tests keep their own): the bytes
/// collapsed, or `None` when every region of the buffer was asked for already.
fn prepare_with(record: &Mutex<CollapseRecord>, addr: usize, len: usize) -> Option<usize> {
    let Some((start, end)) = enclosing_huge_range(addr, len) else { return Some(0) };
    let record = || record.lock().unwrap_or_else(|e| e.into_inner());
    let regions = record().regions_to_ask(start, end, len)?;
    if regions.is_empty() {
        return Some(0);
    }
    // Whole regions inside the buffer's own mapping, and only private anonymous memory.
    let Some((map_start, map_end)) = super::share_heap::private_anonymous_mapping(addr) else {
        log::debug!(target: "SHM", "SHM: the buffer at {addr:#x} is not private anonymous memory: its pages stay");
        return Some(0);
    };
    let t0 = std::time::Instant::now();
    let mut collapsed = 0;
    // A region reaching past the buffer may hold other data or nothing yet: only when mostly
    // in use already (else looked at again later).
    let within_buffer = |r: usize| addr <= r && r + HUGE_PAGE_BYTES <= addr + len;
    let (inside, sparse): (Vec<usize>, Vec<usize>) = regions
        .into_iter()
        .filter(|&r| map_start <= r && r + HUGE_PAGE_BYTES <= map_end)
        .partition(|&r| within_buffer(r) || mostly_resident(r));
    if !sparse.is_empty() {
        record().defer(start, end, len, &sparse);
    }
    for (lo, count) in runs(&inside, per_region_calls()) {
        match collapse(lo, count) {
            Ok(()) => {
                collapsed += count;
                record().collapsed.extend((0..count).map(|k| lo + k * HUGE_PAGE_BYTES));
            }
            // The mapping refuses huge pages (MADV_NOHUGEPAGE, PR_SET_THP_DISABLE), or none can
            // be had now: the other regions would fare the same.
            Err(e @ (libc::EINVAL | libc::ENOMEM | libc::EAGAIN)) => {
                log::debug!(target: "SHM", "SHM: huge pages at {lo:#x}: {}", std::io::Error::from_raw_os_error(e));
                break;
            }
            Err(e) => {
                log::debug!(target: "SHM", "SHM: huge pages at {lo:#x}: {}", std::io::Error::from_raw_os_error(e))
            }
        }
    }
    if collapsed > 0 {
        log::info!(
            target: "SHM",
            "SHM: {} bytes of the buffer at {addr:#x} now on huge pages for peers' kernel copies ({} us; FERROCCL_HUGE_PAGES)",
            collapsed * HUGE_PAGE_BYTES,
            t0.elapsed().as_micros()
        );
    }
    Some(collapsed * HUGE_PAGE_BYTES)
}

/// Consecutive regions as (first, count) runs, one call each: every call costs the kernel a
/// drain of every CPU's page lists, which waits for CPUs busy polling (milliseconds on a
/// 2-core host whose other core runs a peer). Each region alone where `per_region`.
fn runs(regions: &[usize], per_region: bool) -> Vec<(usize, usize)> {
    let mut out: Vec<(usize, usize)> = Vec::new();
    for &r in regions {
        match out.last_mut() {
            Some((lo, n)) if !per_region && *lo + *n * HUGE_PAGE_BYTES == r => *n += 1,
            _ => out.push((r, 1)),
        }
    }
    out
}

/// Linux 6.1 could collapse a range of several regions on past its end, to the end of the
/// mapping (fixed in 6.2 and in later 6.1 releases, which distributions' version strings do
/// not tell apart): there, one region per call.
fn per_region_calls() -> bool {
    static ONE: OnceLock<bool> = OnceLock::new();
    *ONE.get_or_init(|| {
        std::fs::read_to_string("/proc/sys/kernel/osrelease").map_or(true, |release| release.starts_with("6.1."))
    })
}

/// `madvise` of `count` regions from `lo` with MADV_COLLAPSE; the errno on failure.
fn collapse(lo: usize, count: usize) -> Result<(), i32> {
    // SAFETY: MADV_COLLAPSE changes how the range is backed, never its contents or addresses
    // (the kernel copies each region under its locks, as khugepaged does in the background),
    // and the kernel checks the range itself; no Rust reference depends on the backing.
    let rc = unsafe { libc::madvise(lo as *mut libc::c_void, count * HUGE_PAGE_BYTES, libc::MADV_COLLAPSE) };
    if rc == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error().raw_os_error().unwrap_or(libc::EIO))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const H: usize = HUGE_PAGE_BYTES;

    /// Asks for a whole buffer `start..end` (its regions exactly).
    fn ask(rec: &mut CollapseRecord, start: usize, end: usize) -> Vec<usize> {
        rec.regions_to_ask(start, end, end - start).unwrap_or_default()
    }

    /// [`prepare_for_kernel_copies`] with the test's own record: the process's record also
    /// holds regions of other tests' freed buffers, which a new mapping may reuse.
    fn prepare(record: &Mutex<CollapseRecord>, addr: usize, len: usize) -> usize {
        if supported() {
            prepare_with(record, addr, len).unwrap_or(0)
        } else {
            0
        }
    }

    #[test]
    fn enclosing_range_is_whole_huge_pages() {
        assert_eq!(enclosing_huge_range(0x1000, MIN_BYTES - 1), None);
        assert_eq!(enclosing_huge_range(H + 16, 2 * H), Some((H, 4 * H)));
        assert_eq!(enclosing_huge_range(H, H), Some((H, 2 * H)));
        assert_eq!(enclosing_huge_range(usize::MAX - H, H), None);
    }

    #[test]
    fn a_buffer_is_asked_for_on_its_second_use_and_only_its_new_regions_after() {
        let mut rec = CollapseRecord::default();
        let base = 64 * H;
        assert!(ask(&mut rec, base, base + 2 * H).is_empty(), "first use");
        assert_eq!(ask(&mut rec, base, base + 2 * H), vec![base, base + H]);
        assert!(ask(&mut rec, base, base + 2 * H).is_empty(), "asked once");
        assert!(ask(&mut rec, base, base + H).is_empty(), "inside a buffer asked for");
        assert_eq!(rec.seen.len(), 1, "a part of a buffer asked for is not remembered");
        // The buffer grows: first use of the larger range, then only the new regions.
        assert!(ask(&mut rec, base, base + 5 * H).is_empty());
        assert_eq!(ask(&mut rec, base, base + 5 * H), vec![base + 2 * H, base + 3 * H, base + 4 * H]);
        assert!(ask(&mut rec, base, base + 5 * H).is_empty());
    }

    #[test]
    fn a_small_buffer_is_asked_for_once_its_uses_moved_the_credit() {
        let mut rec = CollapseRecord::default();
        let region = 96 * H;
        let uses = SMALL_CREDIT / (128 << 10);
        // Any slices of the region (the caller passes its enclosing range): they share its credit.
        for k in 1..uses {
            assert_eq!(rec.regions_to_ask(region, region + H, 128 << 10), Some(vec![]), "use {k}");
        }
        assert_eq!(rec.regions_to_ask(region, region + H, 128 << 10), Some(vec![region]), "use {uses}");
        assert_eq!(rec.regions_to_ask(region, region + H, 128 << 10), None, "asked once");
    }

    #[test]
    fn a_large_buffer_is_asked_for_a_bounded_number_of_regions_per_call() {
        let mut rec = CollapseRecord::default();
        let (start, end) = (1 << 30, (1 << 30) + (REGIONS_PER_CALL * 2 + 3) * H);
        assert!(ask(&mut rec, start, end).is_empty());
        let mut all = Vec::new();
        loop {
            let now = ask(&mut rec, start, end);
            if now.is_empty() {
                break;
            }
            assert!(now.len() <= REGIONS_PER_CALL);
            all.extend(now);
        }
        assert_eq!(all, (start..end).step_by(H).collect::<Vec<_>>());
    }

    #[test]
    fn a_buffer_seen_once_is_remembered_across_many_others() {
        let mut rec = CollapseRecord::default();
        let first = 1usize << 40;
        assert!(ask(&mut rec, first, first + H).is_empty());
        for k in 0..REMEMBERED - 1 {
            let b = (1usize << 41) + k * 4 * H;
            assert!(ask(&mut rec, b, b + H).is_empty());
        }
        assert_eq!(ask(&mut rec, first, first + H), vec![first], "second use");
    }

    #[test]
    fn a_full_record_forgets_the_buffers_unused_longest() {
        let mut rec = CollapseRecord::default();
        let buffer = |k: usize| (1usize << 42) + k * 4 * H;
        for k in 0..REMEMBERED {
            assert!(ask(&mut rec, buffer(k), buffer(k) + H).is_empty());
        }
        // Buffer 1 used again (second use: asked for); then one buffer more than remembered.
        assert_eq!(ask(&mut rec, buffer(1), buffer(1) + H), vec![buffer(1)]);
        assert!(ask(&mut rec, buffer(REMEMBERED), buffer(REMEMBERED) + H).is_empty());
        assert!(rec.seen.len() <= REMEMBERED / 2 + 1, "{} remembered", rec.seen.len());
        // Buffer 0, unused longest, was forgotten: its next use counts as a first one.
        assert!(ask(&mut rec, buffer(0), buffer(0) + H).is_empty());
        assert_eq!(ask(&mut rec, buffer(0), buffer(0) + H), vec![buffer(0)]);
        // The newest buffers were kept: their second use asks.
        let newest = REMEMBERED - 1;
        assert_eq!(ask(&mut rec, buffer(newest), buffer(newest) + H), vec![buffer(newest)]);
    }

    #[test]
    fn deferred_regions_wait_for_more_traffic_whatever_the_size() {
        let mut rec = CollapseRecord::default();
        let base = 200 * H;
        assert!(ask(&mut rec, base, base + 2 * H).is_empty());
        assert_eq!(ask(&mut rec, base, base + 2 * H), vec![base, base + H]);
        rec.defer(base, base + 2 * H, 2 * H, &[base + H]);
        // At least SMALL_CREDIT and eight uses' worth.
        let uses = SMALL_CREDIT.max(8 * 2 * H).div_ceil(2 * H);
        for k in 1..uses {
            assert!(ask(&mut rec, base, base + 2 * H).is_empty(), "use {k} after deferring");
        }
        assert_eq!(ask(&mut rec, base, base + 2 * H), vec![base + H], "only the deferred region, again");
        // Found sparse again: twice as long.
        rec.defer(base, base + 2 * H, 2 * H, &[base + H]);
        for k in 1..2 * uses {
            assert!(ask(&mut rec, base, base + 2 * H).is_empty(), "use {k} after the second deferral");
        }
        assert_eq!(ask(&mut rec, base, base + 2 * H), vec![base + H]);
    }

    #[test]
    fn consecutive_regions_go_in_one_call_unless_one_per_call() {
        let regions = [4 * H, 5 * H, 6 * H, 9 * H];
        assert_eq!(runs(&regions, false), vec![(4 * H, 3), (9 * H, 1)]);
        assert_eq!(runs(&regions, true), vec![(4 * H, 1), (5 * H, 1), (6 * H, 1), (9 * H, 1)]);
    }

    /// A private anonymous mapping of `len` bytes (2 MiB-aligned) with inaccessible pages on
    /// both sides, so that the kernel cannot merge it with a neighbour that another test frees
    /// (which would split huge pages reaching into it). Unmapped when dropped.
    struct Fenced {
        base: *mut u8,
        total: usize,
        addr: *mut u8,
    }

    impl Fenced {
        fn new(len: usize) -> Fenced {
            let total = len + 2 * H + 2 * 4096;
            // SAFETY: a fresh anonymous mapping, ours alone.
            let base = unsafe {
                rustix::mm::mmap_anonymous(
                    std::ptr::null_mut(),
                    total,
                    rustix::mm::ProtFlags::empty(),
                    rustix::mm::MapFlags::PRIVATE,
                )
            }
            .expect("mmap") as *mut u8;
            let addr = (base as usize + 4096).next_multiple_of(H) as *mut u8;
            // SAFETY: addr..addr + len lies inside the mapping, at least a page from each end.
            unsafe {
                rustix::mm::mprotect(
                    addr.cast(),
                    len,
                    rustix::mm::MprotectFlags::READ | rustix::mm::MprotectFlags::WRITE,
                )
            }
            .expect("mprotect");
            Fenced { base, total, addr }
        }
    }

    impl Drop for Fenced {
        fn drop(&mut self) {
            // SAFETY: the mapping made in new, no longer referenced.
            let _ = unsafe { rustix::mm::munmap(self.base.cast(), self.total) };
        }
    }

    #[test]
    fn collapsing_keeps_contents_and_the_kernel_maps_huge_pages() {
        let len = 3 * H;
        let fenced = Fenced::new(len);
        // SAFETY: the fenced mapping holds len readable and writable bytes, used by this test only.
        let v = unsafe { std::slice::from_raw_parts_mut(fenced.addr as *mut u64, len / 8) };
        let value = |i: usize| (i as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15);
        v.iter_mut().enumerate().for_each(|(i, x)| *x = value(i));
        let addr = fenced.addr as usize;
        let record = Mutex::new(CollapseRecord::default());
        assert_eq!(prepare(&record, addr + 8, len - 16), 0, "first use");
        assert!(!on_huge_pages_in(&record, addr + 8, len - 16), "not asked for yet");
        let collapsed = prepare(&record, addr + 8, len - 16);
        assert!(v.iter().enumerate().all(|(i, &x)| x == value(i)));
        if collapsed == 0 {
            assert!(!on_huge_pages_in(&record, addr + 8, len - 16), "nothing collapsed, nothing on huge pages");
            eprintln!("huge pages not available here (disabled, old kernel or none free): contents checked only");
            return;
        }
        assert_eq!(collapsed, len, "every region of the mapping");
        assert!(on_huge_pages_in(&record, addr + 8, len - 16) && on_huge_pages_in(&record, addr + H, 1 << 20));
        assert!(
            !on_huge_pages_in(&record, addr + len - (1 << 20), 2 << 20),
            "a range reaching past the collapsed regions"
        );
        // The kernel's own account of the mapping.
        let smaps = std::fs::read_to_string("/proc/self/smaps").unwrap();
        let header = format!("{addr:x}-{:x} ", addr + len);
        let huge_kb = smaps
            .split_once(&header)
            .and_then(|(_, rest)| rest.lines().find(|l| l.starts_with("AnonHugePages:")))
            .and_then(|l| l.split_whitespace().nth(1))
            .and_then(|k| k.parse::<usize>().ok())
            .expect("the mapping in smaps");
        assert_eq!(huge_kb * 1024, len, "smaps: {huge_kb} kB on huge pages");
    }

    #[test]
    fn residency_is_read_from_the_page_tables() {
        let fenced = Fenced::new(H);
        assert!(!mostly_resident(fenced.addr as usize), "untouched");
        // SAFETY: the fenced mapping holds H writable bytes, used by this test only.
        unsafe { std::ptr::write_bytes(fenced.addr, 1, H / 2) };
        assert!(mostly_resident(fenced.addr as usize), "half written");
    }

    #[test]
    fn a_region_reaching_past_a_small_buffer_goes_only_when_mostly_in_use() {
        let fenced = Fenced::new(2 * H);
        let addr = fenced.addr as usize;
        let slice = 128 << 10;
        // Region 0 all in use; of region 1 only the slice that peers reach.
        // SAFETY: the fenced mapping holds 2H writable bytes, used by this test only.
        unsafe {
            std::ptr::write_bytes(fenced.addr, 1, H);
            std::ptr::write_bytes(fenced.addr.add(H + 8192), 2, slice);
        }
        if mostly_resident(addr + H) {
            eprintln!("the kernel backed the slice's whole region at once (huge pages `always`): nothing to test");
            return;
        }
        let record = Mutex::new(CollapseRecord::default());
        let uses = SMALL_CREDIT / slice;
        let (mut in_use, mut sparse) = (0, 0);
        for _ in 0..uses {
            in_use += prepare(&record, addr + 8192, slice);
            sparse += prepare(&record, addr + H + 8192, slice);
        }
        assert_eq!(sparse, 0, "a mostly empty region stays as it is");
        if in_use == 0 {
            eprintln!("huge pages not available here (disabled, old kernel or none free)");
            return;
        }
        assert_eq!(in_use, H, "the region in use, once");
        // The sparse region fills up: looked at again after more traffic, it goes too.
        // SAFETY: as above.
        unsafe { std::ptr::write_bytes(fenced.addr.add(H), 3, H / 2) };
        for _ in 0..uses {
            sparse += prepare(&record, addr + H + 8192, slice);
        }
        assert_eq!(sparse, H, "deferred, then asked for once half resident");
        // SAFETY: as above; reading what was written.
        let bytes = unsafe { std::slice::from_raw_parts(fenced.addr, 2 * H) };
        assert!(bytes[..H].iter().all(|&b| b == 1));
        assert!(bytes[H..H + H / 2].iter().all(|&b| b == 3));
        assert!(bytes[H + H / 2..].iter().all(|&b| b == 0));
    }

    #[test]
    fn only_private_anonymous_memory_qualifies() {
        let v = vec![1u8; 4 << 20];
        let (s, e) = super::super::share_heap::private_anonymous_mapping(v.as_ptr() as usize).expect("malloc'd");
        assert!(s <= v.as_ptr() as usize && v.as_ptr() as usize + v.len() <= e);
        let shared = super::super::peer_mem::alloc_shared(4 << 20).expect("shared memory");
        assert_eq!(super::super::share_heap::private_anonymous_mapping(shared as usize), None);
        super::super::peer_mem::free_shared(shared);
    }
}
