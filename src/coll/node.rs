//! All-reduce, all-gather and broadcast among ranks that all live on this host, synchronised
//! through the node area (`transport::node_area`) instead of messages.
//!
//! - **One-shot** all-reduce (small messages, [`one_shot_max`]): every rank copies its input
//!   into its slot of the shared area and announces it; every rank then folds all inputs, in
//!   rank order, into its own result. One round instead of log2(n), and no rank waits for
//!   another's partial result.
//! - **Direct** (larger): every rank publishes where its buffers are; rank r reduces
//!   slice r of all inputs (in rank order) and writes the result into every rank's receive
//!   buffer. Buffers from ncclMemAlloc, or of ranks in this process, are read and written in
//!   place (no copy at all); others through their owner's slot (in rounds of a slot, each
//!   round's copy in overlapping the previous round's stragglers; a rank's own slice never
//!   enters its slot) or one kernel copy each way. Each rank reads and writes the message
//!   once, where a ring moves it twice.
//! - **Pull** all-gather and broadcast: every rank copies the blocks it lacks straight from
//!   the owners' send buffers into its own receive buffer (one copy per byte). Small
//!   all-gathers go one-shot instead, copying slots where an all-reduce folds them. A large
//!   2-process broadcast is copied by both: the receiver pulls chunks while the root pushes
//!   others.
//! - **Relay** all-gather (medium and large, [`default_relay_sizes`]): as a ring, each rank
//!   copies block me - k from its left neighbour's output one step after the neighbour got
//!   it, so each rank reads lines one core has just written, not every owner's at once.
//!
//! Both are state machines the executor polls (`progress` never blocks), so one thread can
//! drive the ranks of several communicators, and each rank folds the same inputs in the same
//! order, so every rank gets the same bits.

use super::reduce::{Pre, Reduction};
use crate::error::{Error, Result};
use crate::memcopy;
use crate::transport::node_area::{
    BufDesc, Counter, NodeArea, PeerBuf, RING_BYTES, RING_DEPTH, RING_GRANULE, RING_STRIDE, SMALL_BYTES,
    SMALL_RING_BYTES, TINY_BYTES, TINY_DEPTH,
};
use crate::transport::{huge_pages, peer_mem, share_heap};
use crate::wire::OpSig;

/// Largest message (bytes) the one-shot algorithm takes at `nranks` ranks; larger ones go
/// direct. One-shot synchronises once but every rank reads every input, which its owner has
/// just written (a cache-to-cache transfer per line); direct synchronises twice and moves
/// each byte once. So the crossover falls with the rank count, and rises when ranks share
/// cores (each synchronisation then waits for the scheduler). Measured (us, one-shot against
/// direct, ferroccl-bench under mpirun with ncclMemAlloc buffers):
/// - 2 ranks, 2 cores: 256 B 0.95/1.44, 512 B 1.04/1.44, 1 KiB 1.59/1.52, 2 KiB 2.12/1.52
/// - 4 ranks, 2 cores: 2 KiB 8.9/11.5, 8 KiB 17/11.7
/// - 8 ranks, 16 cores: 256 B 2.1/2.7, 512 B 2.6/2.5, 1 KiB 3.6/2.7, 16 KiB 28/4.1
/// - 16 ranks, 16 cores: 256 B 3.2/4.1, 512 B 4.5/4.5, 1 KiB 7.5/4.8
///
/// With malloc'd buffers (direct then goes through the slots) and one-shot announcing its
/// input with its Arrived mark, 2 ranks on the 2-core VM (us, min of 4-6 x 20 sweeps of 5000
/// calls): all-reduce 2 KiB 0.52-0.54 against 0.61, 4 KiB 0.71-0.77 against 0.69;
/// reduce-scatter of 2 KiB blocks 0.46 against 0.66; all-gather of 2 KiB blocks 0.50 against
/// 0.48; with ncclMemAlloc buffers all-reduce 2 KiB 0.60 against 0.62.
pub fn one_shot_max(nranks: usize, oversubscribed: bool) -> usize {
    match (oversubscribed, nranks) {
        (true, _) => 4 << 10,
        (false, 0..=2) => 2 << 10,
        (false, _) => 512,
    }
}
/// Largest broadcast (bytes) that goes one-shot at `nranks` ranks: the root copies it into
/// one of its slots and returns without waiting for the receivers (it waits only to reuse
/// a slot they have not left: up to [`TINY_DEPTH`] operations ahead through tiny slots,
/// [`RING_DEPTH`] through ring slots, one through the data slots), as Open MPI's root returns
/// once its eager message is queued. Two ranks with a core each take it up to the data slots'
/// one-shot limit: measured on the 2-core VM, 2 ranks, malloc'd buffers (us, min of 3 runs of
/// 1000 calls, one-shot against the tree over the shared-memory transport, Open MPI 4.1 in
/// brackets): 2 KiB 0.27 against 0.63 (0.54), 8 KiB 0.65 against 1.59 (3.14); from 32 KiB the
/// receiver's single copy wins (32 KiB 4.8 through the slot against 4.2, 128 KiB 18 against
/// 11.4). Ranks
/// sharing cores keep the all-reduce's limit: 4 ranks on 2 cores, 8 KiB took 3.6 one-shot
/// against 2.0 by the tree.
pub fn broadcast_one_shot_max(nranks: usize, oversubscribed: bool) -> usize {
    match (oversubscribed, nranks) {
        (false, 0..=2) => ONE_SHOT_INPUT_MAX,
        _ => one_shot_max(nranks, oversubscribed),
    }
}
/// Largest whole input a one-shot operation puts in a slot (a reduce-scatter's is all its
/// blocks).
pub const ONE_SHOT_INPUT_MAX: usize = SMALL_BYTES;
/// Broadcasts of at least this many bytes go through the node area (every rank copies the
/// root's buffer); smaller ones take the tree, whose single hop per rank is as fast.
pub const BROADCAST_DIRECT_MIN: usize = 32 << 10;
/// [`BROADCAST_DIRECT_MIN`] when ranks outnumber cores: there the receivers' copies of the
/// root's buffer queue for the cores, while the tree's hops overlap. Measured on the 2-core VM,
/// 4 ranks, malloc'd buffers, six alternating launches of 1000 calls (us, tree against the node
/// area, Open MPI 4.1 in brackets): 32 KiB 4.3-6.8 against 7.5-9.4 (7.4-9.0), in every launch;
/// 64 KiB 10.2-11.0 or 20.7-22.1 (half the launches) against 10.8-13.0 (10.6-15.9).
pub const BROADCAST_DIRECT_MIN_OVERSUBSCRIBED: usize = 64 << 10;

/// Smallest broadcast (bytes) that goes through the node area rather than the tree.
pub fn broadcast_direct_min(oversubscribed: bool) -> usize {
    if oversubscribed {
        BROADCAST_DIRECT_MIN_OVERSUBSCRIBED
    } else {
        BROADCAST_DIRECT_MIN
    }
}
/// [`NodeOp::with_stage_max`] for "through the slots at every size".
pub const STAGE_MAX: usize = usize::MAX;

/// Up to which message size (as nccl-tests counts it: all-gathers and reduce-scatters by
/// all ranks' blocks) a rank passes buffers its peers cannot map through its slots; above
/// it, peers reach them with kernel copies (process_vm_readv/writev, one per piece and peer).
/// Slots cost two extra local copies, kernel copies a system call per piece and peer, so
/// slots win while messages are small or ranks many.
///
/// On the 16-core host with reused malloc'd buffers (bench/results/stage-rule-16core-2026-12-05.md,
/// us, kernel copies vs slots): a broadcast's receivers all read the root's buffer at once, which
/// pays only where that buffer is on huge pages (2 MiB regions and up): 8 ranks in a 32 MiB
/// buffer 512 KiB 25-38 vs 103-105, 2 MiB 183-269 vs 472-514, 8 MiB 728-1080 vs 1908-2075, but
/// in a 512 KiB one (4 KiB pages) 128 KiB 76-105 and 512 KiB 309-434 (slots about 24 and 100);
/// 16 ranks 512 KiB 518-591 vs 93-112, 2 MiB 745-824 vs 473-709, 8 MiB 1579-1774 vs 2215-2607.
/// Reduce-scatter: 2 ranks 32 KiB 5.7 vs 7.2-8.5 (2 MiB 263-304 vs 278-315); 8 ranks 512 KiB
/// 100-120 vs 145-181. All-gather at 8 ranks came out mixed in two runs (512 KiB 45 vs 67, then
/// 61-111 vs 47-67); a later run of alternating launches on a 16-core host (round 98,
/// bench/results/gpu-round98-2026-12-06.md; us, kernel copies vs slots) found kernel copies
/// faster at every size from 128 KiB: 128 KiB 15.7-29.1 vs 25.3-26.4 (two of three), 256 KiB
/// 20.9-44.1 vs 41.8-50.7, 1 MiB 62-137 vs 172-242, 4 MiB 295-540 vs 747-1009, 16 MiB
/// 2139-2802 vs 2827-3929 (five of five), and slots up to 64 KiB (32 KiB 7.5-8.6 vs 11.3-17.7).
/// That run reused its inputs, so every peer found them in its own cache from the call before.
/// With inputs rewritten before each call, as an application's are (round 132,
/// bench/results/ag-stage-rule-2026-12-06.md, us, kernel copies vs slots, two alternations),
/// slots win at 3-8 ranks from 128 KiB to 4 MiB in most cells (4 ranks at 1 MiB mixed): 8 ranks 128 KiB 39-41 vs 24-25, 1 MiB
/// 205-226 vs 173, 4 MiB 888-901 vs 765-794; 4 ranks 256 KiB 51-56 vs 41-45. Up to 1 MiB they
/// stay ahead of Open MPI with reused inputs too (8 ranks 1 MiB 169-171 vs 200); above it
/// reused inputs read in place win by 2x (4 MiB 347-359 vs 754-765, Open MPI 706), so 1 MiB.
///
/// Before huge pages (bench/results/malloc-buffers-16core-2026-12-04/crossover.txt), slots of
/// 256 KiB and 1 MiB against kernel copies, in us, slots vs kernel copies:
/// - all-reduce: 2 ranks even (64 KiB 18 vs 13.5, 16 MiB 4112 vs 4400); 8 ranks 64 KiB 32 vs
///   46, 256 KiB 117 vs 117, 1 MiB 440 vs 398; 16 ranks 64 KiB 45 vs 81, 256 KiB 195 vs 167.
/// - reduce-scatter: 2 ranks slots never worse; 8 ranks 256 KiB 83 vs 90, 1 MiB 282 vs 283,
///   4 MiB 1194 vs 867; 16 ranks 64 KiB 36 vs 56, 256 KiB 126 vs 114.
/// - all-gather: 2 ranks 16 KiB 3.2 vs 3.9, 64 KiB 7.4 vs 5.2; 8 ranks slots always (64 MiB
///   13.1 ms vs 18.3); 16 ranks 256 KiB 30 vs 48, 1 MiB 186 vs 200, 4 MiB 816 vs 716.
/// - broadcast: 2 ranks, one kernel copy beats two copies (slots 2 MiB 298 vs 225, 8 MiB 1153
///   vs 866), and from [`SPLIT_MIN`] root and receiver share it; more ranks read the root's
///   slot at once, 2x Open MPI at 16 ranks.
///
/// On the 2-core VM, since peers reach reused buffers on huge pages
/// (bench/results/stage-crossover-2core-2026-12-05.md, three runs each, us, slots vs kernel
/// copies): a 2-rank all-reduce 8 KiB 2.1-2.4 vs 2.7-3.1, 32 KiB 6.1-6.4 vs 4.1-4.2, 2 MiB
/// 258-271 vs 210-216, 8 MiB 1059-1110 vs 934-1011, 32 MiB 6459-6951 vs 6888-7318 (16 cores:
/// 64 KiB 18 vs 13.5, above), a 2-rank reduce-scatter 2 MiB 213-239 vs 172-185; 4 ranks on the
/// 2 cores (`oversubscribed`) kernel copies win from 512 KiB for all-reduce (184-195 vs 136-166),
/// all-gather and reduce-scatter, slots up to 32-128 KiB, and a broadcast's receivers copy the
/// root's buffer faster from 32 KiB (128 KiB 21-23 vs 10-15, 8 MiB 1637-1694 vs 1114-1194).
/// (Before huge pages, slots won every cell there by up to 3x:
/// malloc-buffers-2core-2026-12-04.md.)
///
/// All of the above reused their inputs. The rules now follow inputs rewritten before every
/// call, as an application's are, and keep reused ones at or above Open MPI
/// (bench/results/ag-stage-rule-2026-12-06.md, rounds 132-134 and the AMD 2-core VM, median
/// us, kernel copies vs slots): 2 ranks on the VM, where a kernel copy costs 1.3-5x a memcpy
/// (`ag-stage-rule/vm/kernel_copy_cost.txt`), slots are 1.5-3x faster at 32-128 KiB for
/// the all-reduce and reduce-scatter with either input and for the all-gather with fresh
/// ones; above, the gain shrinks or turns (all-gather 512 KiB 49.4 vs 54.8 fresh). On the 16-core host (rounds 133-134) 2-rank all-gathers gain 1.3-2x with
/// fresh inputs up to 512 KiB (128 KiB 24.9 vs 14.6) and lose 2x with reused ones, still
/// above Open MPI (512 KiB 48 us, Open MPI 54.7); a 2-rank all-reduce gains 1.1-1.25x fresh and loses
/// 1.1-1.6x reused, and from 256 KiB slots sometimes stall (reused 256 KiB 35-72, Open MPI
/// 64): 128 KiB; a 2-rank reduce-scatter gains nothing fresh at 32-64 KiB while reused it
/// falls to Open MPI's level (64 KiB 11-15 vs 13.7): kept at 16 KiB. Reduce-scatter at 4-16
/// ranks, fresh, 512 KiB 184-246 / 348-432 vs 114-199 / 202-300 (4-8 / 16 ranks), reused
/// 0.6-1.0x, 2-5x Open MPI either way.
pub fn default_stage_max(coll: &NodeColl, nranks: usize, oversubscribed: bool) -> usize {
    if oversubscribed {
        return match coll {
            NodeColl::Broadcast { .. } => 0,
            NodeColl::Gather { .. } => STAGE_MAX,
            _ => 128 << 10,
        };
    }
    match (coll, nranks) {
        (NodeColl::AllReduce(_), _) => 128 << 10,
        (NodeColl::ReduceScatter(_), 0..=2) => 16 << 10,
        (NodeColl::ReduceScatter(_), _) => 512 << 10,
        (NodeColl::AllGather, 0..=2) => 512 << 10,
        (NodeColl::AllGather, _) => 1 << 20,
        (NodeColl::Broadcast { .. }, 0..=2) => 0,
        (NodeColl::Broadcast { .. }, 3..=8) => 1 << 20,
        (NodeColl::Broadcast { .. }, _) => 4 << 20,
        (NodeColl::Gather { .. }, _) => STAGE_MAX,
    }
}
/// The all-gathers (sizes of the whole message, both bounds included) a rank offers to relay
/// ([`NodeOp::relay`]), by whether its peers map its buffers (ncclMemAlloc memory, ranks in
/// one process) or reach them by kernel copies. Every rank must offer for a relay to happen.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RelaySizes {
    pub mapped: (usize, usize),
    pub unmapped: (usize, usize),
}

impl RelaySizes {
    pub const NEVER: RelaySizes = RelaySizes { mapped: (usize::MAX, 0), unmapped: (usize::MAX, 0) };

    /// Every all-gather of at least `min` bytes, whatever the buffers.
    pub fn from_min(min: usize) -> RelaySizes {
        RelaySizes { mapped: (min, usize::MAX), unmapped: (min, usize::MAX) }
    }

    fn contains(&self, mapped: bool, size: usize) -> bool {
        let (lo, hi) = if mapped { self.mapped } else { self.unmapped };
        (lo..=hi).contains(&size)
    }
}

/// Which all-gathers go by relay at `nranks` ranks. With inputs rewritten before every call,
/// Open MPI's ring beat both the pull by kernel copies and the pull of `ncclMemAlloc` inputs
/// in place from 2 MiB on the 16-core host (round 132, 8 ranks: 323 us against 451 and 408):
/// where each rank reads from mattered, not the copy. The relay reads as a ring does. Measured
/// there (bench/results/ag-relay-2026-12-07.md, round 136, three alternations, median us at
/// 4 / 8 / 16 ranks, fresh inputs unless said):
/// - malloc'd, 2 MiB: relay 271 / 247 / 456 against the pull's 475 / 459 / 665 (Open MPI 388 /
///   448 / 595); 8 MiB 809 / 973 / 2791 against 929 / 1407 / 2856; 16 MiB mixed (8 ranks 3016
///   against 2418). Reused inputs: 0.89-1.62x the pull's time, above Open MPI. Up to 1 MiB the
///   slots stay ([`default_stage_max`]; relaying from 1 MiB lost at 16 ranks, 274 against 187).
/// - ncclMemAlloc, fresh: 512 KiB 55 / 50 / 65 against the pull's 94 / 88 / 104, 2 MiB 241 /
///   193 / 280 against 402 / 382 / 553; 256 KiB 28 / 27 against 49 / 45 at 4 / 8 ranks but 48
///   against 54 at 16 (slower in two alternations of three), so 16 ranks start at 512 KiB.
///   Reused inputs favour the pull 1.7-4.1x at 256 KiB-1 MiB, the relay still above Open MPI;
///   at 8 MiB and 16 ranks only level with it (2638 against 2678): mapped buffers stop at 4 MiB.
///   Ranks in one process read each other's buffers with the same plain loads: the same rule.
///
/// - 3 ranks (rounds 139-140, the relay against the default, median us): malloc'd fresh 2
///   MiB 212 / 340 (r140) and 203 / 269 (r139), 4 MiB 371 / 459, 8 MiB 735 / 787; reused
///   1.01-1.18x the default's time, 3-4x Open MPI's speed; relayed from 256 KiB instead of
///   slots it lost fresh (255 KiB 46.8 / 21.4, 1 MiB 107 / 97). ncclMemAlloc fresh 256 KiB-4
///   MiB 0.54-0.91x the pull's time (255 KiB 24.2 / 39.2), 8 MiB level (745 / 725). The same
///   ranges, but a whole message of three blocks falls just short of a power of two (nccl-tests'
///   2 MiB is 2097120 bytes), so the lower bounds sit halfway to the size below: 192 KiB and
///   1.5 MiB.
///
/// Not measured beyond 16 (a step per rank: smaller steps, a longer chain), or with ranks
/// sharing cores (the chain waits for every descheduled rank): none relays there.
pub fn default_relay_sizes(nranks: usize, oversubscribed: bool) -> RelaySizes {
    if oversubscribed || !(3..=16).contains(&nranks) {
        return RelaySizes::NEVER;
    }
    let (mapped_min, unmapped_min) = match nranks {
        3 => (192 << 10, 3 << 19),
        4..=8 => (256 << 10, 2 << 20),
        _ => (512 << 10, 2 << 20),
    };
    RelaySizes { mapped: (mapped_min, 4 << 20), unmapped: (unmapped_min, 8 << 20) }
}
/// Bytes reduced at a time: the partial result and one input stay in cache.
const PIECE: usize = 64 << 10;
/// Up to which size, above [`default_stage_max`], a rank's buffer still goes through its
/// slot unless it is on huge pages ([`huge_pages::on_huge_pages`]): kernel copies pay only
/// there. Broadcasts at 3-8 ranks on the 16-core host (bench/results/bcast-root-return/
/// round106-kc.txt and round107-exp.txt, us, six launches): 2 MiB by kernel copies in a 32
/// MiB buffer (huge pages) 201-256 against 513-590 through slots, but in a 2 MiB malloc'd
/// array (4 KiB pages) 247-1738 against 465-577 (Open MPI 1273-1343). At 16 ranks the
/// receivers' staggered reads ([`STAGGER_MIN_RANKS`]) keep kernel copies at least as fast as
/// slots either way (8 MiB array 1628-2348 against 2409-2785): no such range there.
///
/// Ranks sharing cores ([`OVERSUBSCRIBED_OFF_HUGE_MAX`]) stage every collective's buffers off
/// huge pages up to 2 MiB.
///
/// Two ranks with a core each stage them where a kernel copy of 4 KiB pages is slow on this
/// machine (`small_page_copies_slow`, [`peer_mem::small_page_kernel_copies_slow`]): all-reduces
/// up to 2 MiB, reduce-scatters up to 256 KiB. The machines measured disagree
/// (bench/results/app-arrays-2026-12-07.md, each size in its own malloc'd array, us, kernel
/// copies against slots): on the AMD 2-core VM, where such a copy takes 4.3x a memcpy,
/// all-reduce 256 KiB 55-59 / 38-46, 1 MiB 231-239 / 149-167, 2 MiB 334-347 / 252-259, 4 MiB
/// 551-666 / 612-715, reduce-scatter 64 KiB 11-12 / 7, 256 KiB 37-41 / 23-24, 512 KiB-2 MiB
/// mixed; on the 16-core Intel host (1.8x a memcpy; rounds 143-144) all-reduce 1 MiB 108-185 /
/// 154-236 and 2 MiB 267-353 / 325-387, kernel copies faster at 2 MiB in four launches of
/// four. At 8 and 16 ranks the host gained nothing consistent from slots; no other machine
/// was measured there, so those keep the rules above whatever the copies cost.
pub fn default_stage_off_huge_max(
    coll: &NodeColl,
    nranks: usize,
    oversubscribed: bool,
    small_page_copies_slow: bool,
) -> usize {
    match (coll, nranks) {
        _ if oversubscribed => default_stage_max(coll, nranks, true).max(OVERSUBSCRIBED_OFF_HUGE_MAX),
        (NodeColl::Broadcast { .. }, 3..=8) => 4 << 20,
        (NodeColl::AllReduce(_), 2) if small_page_copies_slow => 2 << 20,
        (NodeColl::ReduceScatter(_), 2) if small_page_copies_slow => 256 << 10,
        _ => default_stage_max(coll, nranks, oversubscribed),
    }
}
/// [`default_stage_off_huge_max`] when ranks outnumber cores, for every collective. In an
/// application-sized array (a glibc mmapped chunk of exactly the message, on 4 KiB pages, which
/// never gets huge pages: no whole 2 MiB region of its own) a kernel copy pins and looks up
/// every 4 KiB page, CPU time the ranks sharing cores pay in turn, while slots cost two copies
/// in cache. Measured on the AMD 2-core VM, 4 ranks, each size in its own malloc'd array, two
/// launches (bench/results/app-arrays-2026-12-07.md, us, kernel copies against slots, Open MPI
/// in brackets): all-reduce 256 KiB 200-266 / 127-128 (274-332), 1 MiB 961-1063 / 385-440
/// (878-1493), 4 MiB 1694-2627 / 2059-2745; reduce-scatter 512 KiB 229-244 / 84-115, 2 MiB
/// 734-1415 / 359-692; all-gather 1 MiB 369-466 / 165-226 (380-439), 4 MiB 666-733 /
/// 1096-1336; broadcast 128 KiB 44-78 / 24-57 (50-69), 2 MiB 389-630 / 324-477, 4 MiB mixed.
/// Kernel copies were below Open MPI in 1 MiB arrays (all-reduce, all-gather) and in 64-128
/// KiB ones (broadcast). Buffers on huge pages (a benchmark's, sized for its largest message)
/// keep kernel copies, as measured before.
pub const OVERSUBSCRIBED_OFF_HUGE_MAX: usize = 2 << 20;

/// Most bytes the root and the receiver of a shared broadcast copy ([`NodeOp::shared_copy`])
/// take at a time: a system call per chunk costs little next to its copy, and the one left
/// last keeps one side waiting briefly. Measured on the 2-core VM (2 ranks, us per 2 / 8 /
/// 32 MiB out of place): 128 KiB 131 / 688 / 4970, 256 KiB 119 / 682 / 5379, 1 MiB 131 /
/// 576 / 5203; 16 and 64 KiB slower from 512 KiB on.
const SPLIT_CHUNK: usize = 256 << 10;
/// Smallest 2-process broadcast whose copy the root and the receiver share, in halves below
/// two [`SPLIT_CHUNK`]s ([`split_chunk`]). Measured on the 2-core VM with malloc'd buffers,
/// three launches, us out of place / in place, the receiver's one kernel copy against two
/// halves: 64 KiB 7.1 / 7.1 against 6.4 / 5.7, 128 KiB 11.5 / 11.4 against 9.8-10.0 / 8.1,
/// 256 KiB 20.4-23.8 / 20.3-20.9 against 17.4-19.0 / 12.4-13.7; 32 KiB no faster (4.8 / 4.8
/// against 4.8-4.9 / 4.6-4.7), quarters and eighths slower at every size (a system call each).
/// ncclMemAlloc buffers (plain loads and stores), two launches: in place 64 KiB 1.5 -> 1.15,
/// 128 KiB 2.7 -> 1.8, 256 KiB 5.0-5.6 -> 3.0-3.3; out of place even (1.55 -> 1.62, 2.9 ->
/// 2.77, 5.1 -> 5.3-5.5).
const SPLIT_MIN: usize = 64 << 10;
/// [`PIECE`] for an all-reduce whose inputs or outputs are reached by kernel copies (one
/// system call per piece and peer). Measured on the 2-core VM, all-reduce with
/// FERROCCL_NODE_STAGE_MAX=0 (min of 3 runs, us, 64 against 256 KiB): 2 ranks 512 KiB 97/58,
/// 2 MiB 304/260, 8 MiB 2791/2111; 4 ranks 1 MiB 649/481, 4 MiB 2989/2540. Not for
/// reduce-scatter (reads only): there 2 ranks took longer with it (1 MiB 104/137).
/// Larger pieces for two ranks split the hosts (bench/results/staged-tls-2026-12-06.md, us,
/// 256 KiB / 1 MiB): the 16-core Intel host (round 129, three alternations) 2 MiB 268-271 /
/// 321-359, 4 MiB 532-545 / 624-713, 8 MiB 1070-1158 / 1263-1424, 16 MiB 2316-2417 /
/// 2629-3095, every launch; the AMD EPYC 2-core VM (twelve alternations over two sessions)
/// 4 MiB 345-505 / 285-430, 1 MiB faster in 11 of 12, 8-16 MiB mixed. The larger gain and
/// the larger machine decide: every rank count takes 256 KiB.
const REMOTE_PIECE: usize = 256 << 10;
/// Most bytes each rank reduces per round of an all-reduce through slots (its slice of the
/// round). Smaller rounds synchronise more often; larger ones leave the cache between a
/// piece's copy in, its reduction by a peer and its copy out. Measured on the 16-core host,
/// malloc'd buffers, slots of 256 KiB against 1 MiB
/// (bench/results/malloc-buffers-16core-2026-12-04/crossover.txt, us): 2 ranks (slices of
/// 128 against 512 KiB) 1 MiB 212/245, 4 MiB 870/1017, 16 MiB 4112/4243; 8 ranks (slices of
/// 32 against 128 KiB) the other way, 4 MiB 2277/1830. On the 2-core VM 2 ranks are even
/// (4 MiB 343/402, 8 MiB 1157/919, noisy). Reduce-scatter rounds stay a slot: they do not
/// overlap, and on the VM slices of 128 KiB took 1.6-1.8x the time at 1-4 MiB.
const ROUND_SLICE: usize = 128 << 10;
/// Out-of-place messages from this size on are written out with non-temporal stores: they do
/// not fit in cache anyway, and a normal store first reads each destination line (a third
/// memory stream). In place, the destination lines were just read, so normal stores win.
/// Measured on the 2-core VM (an Intel one), 2 ranks: +10-30% out of place from 32 MiB, nothing
/// at 8 MiB (still in the last-level cache), and in place 2x slower with streaming. Two ranks
/// start at 32 MiB: at 16 MiB streaming lost on both machines measured since (ms, streaming
/// against not; round 115, bench/results/page-offset-2026-12-06.md): the Intel 16-core host
/// 4.1-5.2 against 3.5-3.6, the AMD 2-core VM 2.7-3.1 against 2.4-2.5 (at 32-64 MiB even).
/// At 16 ranks it won there (9.5-10.0 against 10.5-12.3), at 8 the two overlapped.
fn stream_min(nranks: usize) -> usize {
    if nranks <= 2 {
        32 << 20
    } else {
        16 << 20
    }
}

/// Words of scratch for `bytes` of staging; with kernel copies in or out of it, room to place
/// them at the other end's page offset (`peer_mem::page_matched`).
fn scratch_words(bytes: usize, kernel_copies: bool) -> usize {
    (bytes + if kernel_copies { peer_mem::PAGE_MATCH_SLACK } else { 0 }).div_ceil(8)
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NodeAlgo {
    OneShot,
    Direct,
}

impl NodeAlgo {
    /// The algorithm for an all-reduce of `bytes` (or an all-gather of `bytes` per rank) over
    /// `nranks` ranks with a node area (more of them than cores when `oversubscribed`), if
    /// one; `one_shot_max` overrides [`one_shot_max`] (capped at the small slots' size).
    pub fn for_size(
        bytes: usize,
        nranks: usize,
        oversubscribed: bool,
        one_shot_max: Option<usize>,
    ) -> Option<NodeAlgo> {
        let limit = one_shot_max.unwrap_or_else(|| self::one_shot_max(nranks, oversubscribed)).min(SMALL_BYTES);
        match bytes {
            0 => None,
            b if b <= limit => Some(NodeAlgo::OneShot),
            _ => Some(NodeAlgo::Direct),
        }
    }

    /// The algorithm for a broadcast of `bytes`, if the node area takes it (otherwise the
    /// tree does); `one_shot_max` as for [`NodeAlgo::for_size`].
    pub fn for_broadcast(
        bytes: usize,
        nranks: usize,
        oversubscribed: bool,
        one_shot_max: Option<usize>,
    ) -> Option<NodeAlgo> {
        let one_shot_max =
            one_shot_max.unwrap_or_else(|| broadcast_one_shot_max(nranks, oversubscribed)).min(ONE_SHOT_INPUT_MAX);
        if bytes <= one_shot_max {
            Some(NodeAlgo::OneShot)
        } else if bytes >= broadcast_direct_min(oversubscribed) {
            Some(NodeAlgo::Direct)
        } else {
            None
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            NodeAlgo::OneShot => "node-oneshot",
            NodeAlgo::Direct => "node-direct",
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Phase {
    Start,
    /// Waiting until every rank is done with the slot this operation (one-shot) or round
    /// (direct and pull through slots) reuses.
    WaitSlot,
    WaitArrived,
    /// Direct: waiting until every rank has written its slice everywhere.
    WaitLeft,
    /// A broadcast root whose input went through its slot: waiting until every rank has
    /// announced the operation, to compare its call with theirs before it returns.
    WaitCalls,
    Done,
}

/// A round of a direct all-reduce that this rank has finished but not yet left behind.
#[derive(Clone, Copy, Debug)]
struct Drain {
    seq: u64,
    off: usize,
    len: usize,
}

/// The collectives that run through the node area.
#[derive(Clone, Copy, Debug)]
pub enum NodeColl {
    AllReduce(Reduction),
    /// Every rank copies every peer's block into its own receive buffer.
    AllGather,
    /// Every rank but the root copies the root's buffer.
    Broadcast {
        root: usize,
    },
    /// Every rank reduces its own block of all ranks' inputs into its receive buffer.
    ReduceScatter(Reduction),
    /// Every rank posts its block; the root copies them all into its receive buffer (one-shot
    /// only). The others wait for the root's announcement, so both sides compare calls.
    Gather {
        root: usize,
    },
}

impl NodeColl {
    /// The message as nccl-tests sizes it, from one rank's block: all ranks' blocks for an
    /// all-gather and a reduce-scatter. The staging limits bound this size.
    pub fn message_bytes(&self, block: usize, nranks: usize) -> usize {
        match self {
            NodeColl::AllGather | NodeColl::ReduceScatter(_) => block * nranks,
            _ => block,
        }
    }
}

/// One collective in progress.
pub struct NodeOp {
    coll: NodeColl,
    algo: NodeAlgo,
    send: *const u8,
    recv: *mut u8,
    /// Bytes of one rank's block (all-gather: of its input; the output holds nranks blocks).
    bytes: usize,
    seq: u64,
    phase: Phase,
    /// One-shot through tiny slots: ranks whose input was seen posted.
    ready: usize,
    /// Direct and pull: this rank's buffers that peers cannot map go through its slot when
    /// they hold at most this many bytes (else peers use kernel copies).
    stage_max: usize,
    /// Above `stage_max`, buffers of up to this many bytes that are not on huge pages go
    /// through the slot too ([`default_stage_off_huge_max`]).
    stage_off_huge_max: usize,
    stage_send: bool,
    stage_recv: bool,
    /// Direct and pull: offset of the current round's piece, and the rounds' piece size.
    off: usize,
    piece: usize,
    /// Direct all-reduce: the round whose result waits for every rank to leave it.
    draining: Option<Drain>,
    /// Shared broadcast copy: the root has copied its input to its own output.
    own_copied: bool,
    /// A broadcast root whose input goes through its slot: it has compared its call with
    /// every rank's.
    calls_checked: bool,
    /// The call's signature, announced in the area and compared with the peers'.
    sig: OpSig,
    /// The all-gathers this rank offers to relay ([`NodeOp::relay`]).
    relay_sizes: RelaySizes,
    /// A relayed all-gather: the step this rank is on next (1 to nranks - 1).
    relay_step: Option<usize>,
    /// This rank offered to relay (published its receive buffer for it).
    relay_offered: bool,
}

// SAFETY: carries the user's buffer addresses, valid until the operation completes (API
// contract), whichever thread progresses it.
unsafe impl Send for NodeOp {}

impl NodeOp {
    pub fn new(coll: NodeColl, algo: NodeAlgo, send: *const u8, recv: *mut u8, bytes: usize, sig: OpSig) -> NodeOp {
        NodeOp {
            coll,
            algo,
            send,
            recv,
            bytes,
            seq: 0,
            phase: Phase::Start,
            ready: 0,
            stage_max: STAGE_MAX,
            stage_off_huge_max: 0,
            stage_send: false,
            stage_recv: false,
            off: 0,
            piece: bytes,
            draining: None,
            own_copied: false,
            calls_checked: false,
            sig,
            relay_sizes: RelaySizes::NEVER,
            relay_step: None,
            relay_offered: false,
        }
    }

    /// Sets the largest buffer that goes through this rank's slot when peers cannot map it
    /// (default [`STAGE_MAX`]).
    pub fn with_stage_max(mut self, stage_max: usize) -> NodeOp {
        self.stage_max = stage_max;
        self
    }

    /// Sets the largest buffer that goes through this rank's slot when it is not on huge pages
    /// (no more than [`NodeOp::with_stage_max`]'s, which holds regardless, by default).
    pub fn with_stage_off_huge_max(mut self, max: usize) -> NodeOp {
        self.stage_off_huge_max = max;
        self
    }

    /// Sets the all-gathers this rank offers to relay (default: none).
    pub fn with_relay_sizes(mut self, sizes: RelaySizes) -> NodeOp {
        self.relay_sizes = sizes;
        self
    }

    /// Whether this rank offers to relay this operation, its buffers mapped by its peers
    /// ([`NodeOp::buffers_mapped`]) or not: an all-gather of a size it relays, at three or
    /// more ranks (at two, a relay is the pull).
    fn offers_relay(&self, nranks: usize, mapped: bool) -> bool {
        matches!(self.coll, NodeColl::AllGather)
            && nranks >= 3
            && self.relay_sizes.contains(mapped, self.bytes.saturating_mul(nranks))
    }

    /// [`NodeOp::offers_relay`] for this rank's buffers, asking where they live only for a size
    /// one kind or the other relays (the lookup takes the allocation registry's lock).
    fn offers_relay_here(&self, area: &NodeArea) -> bool {
        let n = area.nranks();
        (self.offers_relay(n, true) || self.offers_relay(n, false)) && self.offers_relay(n, self.buffers_mapped(area))
    }

    /// Whether peers read this rank's all-gather buffers in place: ranks in one process, or
    /// both buffers in memory peers map (ncclMemAlloc, a shared heap region).
    fn buffers_mapped(&self, area: &NodeArea) -> bool {
        let n = area.nranks();
        area.peers_share_address_space()
            || (peer_mem::locate(self.send as usize, self.bytes).is_some()
                && peer_mem::locate(self.recv as usize, n * self.bytes).is_some())
    }

    /// Numbers this operation (or round) and announces its call to the peers.
    fn start(&mut self, area: &mut NodeArea) {
        self.seq = area.next_seq();
        area.announce(self.seq, self.sig);
    }

    pub fn algo(&self) -> NodeAlgo {
        self.algo
    }

    pub fn is_done(&self) -> bool {
        self.phase == Phase::Done
    }

    /// The ranks this operation waits for now (for timeout messages; empty when it is not
    /// waiting on anyone).
    pub fn waiting_for(&self, area: &NodeArea) -> Vec<usize> {
        let in_len = match self.coll {
            NodeColl::ReduceScatter(_) => self.bytes * area.nranks(),
            _ => self.bytes,
        };
        let tiny = self.algo == NodeAlgo::OneShot && in_len <= TINY_BYTES;
        let ringed = self.algo == NodeAlgo::OneShot && in_len <= RING_BYTES;
        let behind = if tiny { area.behind_tiny(self.seq) } else { area.behind(Counter::Arrived, self.seq) };
        // A direct all-reduce first waits for the previous round's stragglers.
        if let (Some(d), Phase::WaitArrived | Phase::WaitLeft) = (self.draining, self.phase) {
            let late = area.behind(Counter::Left, d.seq);
            if !late.is_empty() {
                return late;
            }
        }
        if self.relay_step.is_some() && self.phase == Phase::WaitArrived {
            let left = (area.rank() + area.nranks() - 1) % area.nranks();
            return behind.into_iter().filter(|&r| r == left).collect();
        }
        match self.phase {
            // A direct operation first waits until its descriptor copy is free.
            Phase::Start if self.algo == NodeAlgo::Direct => area.behind(Counter::Left, area.descriptor_guard()),
            Phase::Start | Phase::Done => Vec::new(),
            Phase::WaitSlot => area.behind(Counter::Left, self.seq.saturating_sub(reuse_distance(tiny, ringed))),
            Phase::WaitArrived => match self.coll {
                // A root that shares the copy waits for the receiver's descriptor.
                NodeColl::Broadcast { root } if root == area.rank() => behind,
                NodeColl::Broadcast { root } => behind.into_iter().filter(|&r| r == root).collect(),
                NodeColl::Gather { root } if root != area.rank() => behind.into_iter().filter(|&r| r == root).collect(),
                _ => behind,
            },
            Phase::WaitLeft => area.behind(Counter::Left, self.seq),
            Phase::WaitCalls => behind,
        }
    }

    /// Advances as far as possible without waiting; `true` when something moved.
    pub fn progress(&mut self, area: &mut NodeArea, scratch: &mut Vec<u64>) -> Result<bool> {
        let before = (self.phase, self.seq);
        match (self.coll, self.algo) {
            (_, NodeAlgo::OneShot) => self.one_shot(area)?,
            (NodeColl::AllReduce(red), NodeAlgo::Direct) => self.direct(area, scratch, red)?,
            (NodeColl::AllGather, NodeAlgo::Direct) => self.pull(area, None)?,
            (NodeColl::Broadcast { root }, NodeAlgo::Direct) => self.pull(area, Some(root))?,
            (NodeColl::ReduceScatter(red), NodeAlgo::Direct) => self.reduce_scatter(area, scratch, red)?,
            (NodeColl::Gather { .. }, NodeAlgo::Direct) => {
                return Err(Error::internal("a node gather is one-shot only"));
            }
        }
        Ok((self.phase, self.seq) != before)
    }

    /// Each rank puts its input in its slot and builds its result from everybody's slots.
    /// Inputs of up to [`TINY_BYTES`] travel in a tiny slot, whose first line also says they
    /// are ready (about one line transfer per peer); larger ones in the slots, announced by
    /// the Arrived counter. All-reduce folds every slot, reduce-scatter its own block of every slot,
    /// all-gather copies every slot to its block (a gather's root alone), broadcast copies the
    /// root's (only the root posts). One synchronisation: the next writer of a slot waits for
    /// its readers.
    fn one_shot(&mut self, area: &mut NodeArea) -> Result<()> {
        let (me, n) = (area.rank(), area.nranks());
        // `watch`: the one rank whose slot this rank waits for (None: every rank's).
        let (in_len, watch, posts) = match self.coll {
            NodeColl::ReduceScatter(_) => (n * self.bytes, None, true),
            NodeColl::Broadcast { root } => (self.bytes, Some(root), root == me),
            NodeColl::Gather { root } if root != me => (self.bytes, Some(root), true),
            _ => (self.bytes, None, true),
        };
        // A reduce-scatter's own block only this rank reads: out of place it stays out of the
        // slot and is folded from the send buffer (in place it lies in the receive buffer,
        // which the fold overwrites before reaching it).
        let own_direct = matches!(self.coll, NodeColl::ReduceScatter(_))
            && !std::ptr::eq(self.recv as *const u8, self.send.wrapping_add(me * self.bytes));
        let tiny = in_len <= TINY_BYTES;
        // Small ring slots are interleaved (granules RING_STRIDE apart), the others contiguous.
        let small_ring = !tiny && in_len <= SMALL_RING_BYTES;
        let ring = !tiny && !small_ring && in_len <= RING_BYTES;
        // A rank that posts announces its call with its input: a store to the Arrived line at
        // the start would pull the line away from the peers polling it, and the post would
        // pull it again. Measured on the 2-core VM, 2 ranks (us, min of 6 x 20 sweeps):
        // all-reduce 64-512 B 0.26/0.27/0.29/0.33 announced at the start, 0.23/0.23/0.25/0.30
        // with the input. Not a reduce-scatter's: 256-1024 B (in all) took 0.23/0.25/0.26
        // with the input against 0.21/0.21/0.24 at the start.
        let early_announce = !posts || matches!(self.coll, NodeColl::ReduceScatter(_));
        let slot_of = |area: &NodeArea, r: usize, seq: u64| {
            if tiny {
                area.tiny_data(r, seq)
            } else if small_ring {
                area.small_ring_slot(r, seq)
            } else if ring {
                area.ring_slot(r, seq)
            } else {
                area.slot(r, seq)
            }
        };
        if self.phase == Phase::Done {
            return Ok(());
        }
        if self.phase == Phase::Start {
            self.seq = area.next_seq();
            if tiny || !early_announce {
                area.begin_tiny(self.seq, self.sig);
            } else {
                area.announce(self.seq, self.sig);
            }
            self.phase = if posts { Phase::WaitSlot } else { Phase::WaitArrived };
        }
        if self.phase == Phase::WaitSlot {
            // The slot last held an operation at or before seq - reuse: every rank must be done
            // reading it.
            if !area.all_reached(Counter::Left, self.seq.saturating_sub(reuse_distance(tiny, small_ring || ring)))? {
                return Ok(());
            }
            // SAFETY: our own slot, of TINY_BYTES (tiny), SMALL_RING_BYTES (small ring),
            // RING_BYTES (ring) or at least SMALL_BYTES >= in_len (for_size), which no rank
            // reads until we post it.
            unsafe { self.fill_slot(slot_of(area, me, self.seq), small_ring, in_len, own_direct, me, n)? };
            if tiny {
                area.post_tiny(self.seq);
            } else {
                if !early_announce {
                    area.announce(self.seq, self.sig);
                }
                area.mark(Counter::Arrived, self.seq);
            }
            self.phase = Phase::WaitArrived;
        }
        if self.phase == Phase::WaitArrived && watch == Some(me) {
            // A broadcast's root has posted: its result is its own input, which it takes from
            // its send buffer (in cache) rather than from the slot that the receivers are
            // pulling away.
            if !std::ptr::eq(self.send, self.recv) {
                // SAFETY: the caller's buffers, valid for `bytes` (API contract); out of place
                // they do not overlap (layout() copies the input otherwise).
                let (input, out) = unsafe {
                    (
                        std::slice::from_raw_parts(self.send, self.bytes),
                        std::slice::from_raw_parts_mut(self.recv, self.bytes),
                    )
                };
                memcopy::copy(out, input);
            }
            area.mark(Counter::Left, self.seq);
            self.phase = Phase::Done;
            return Ok(());
        }
        if self.phase == Phase::WaitArrived {
            // Tiny slots carry the signature in their first line (compared as each is seen);
            // small ones next to the Arrived counter just read.
            let arrived = match (watch, tiny) {
                (Some(r), true) => area.posted_tiny(r, self.seq)? && area.check_peer(r).map(|()| true)?,
                (Some(r), false) => {
                    area.reached(r, Counter::Arrived, self.seq)? && area.check_peer(r).map(|()| true)?
                }
                (None, true) => area.all_posted_tiny(self.seq, &mut self.ready)?,
                (None, false) => area.all_reached(Counter::Arrived, self.seq)? && area.check_peers().map(|()| true)?,
            };
            if !arrived {
                return Ok(());
            }
            if watch.is_none() {
                area.all_started(self.seq);
            }
            if matches!(self.coll, NodeColl::Gather { root } if root != me) {
                // Posted, and the root's call matches: nothing to receive.
                area.mark(Counter::Left, self.seq);
                self.phase = Phase::Done;
                return Ok(());
            }
            let out_len = match self.coll {
                NodeColl::AllGather | NodeColl::Gather { .. } => n * self.bytes,
                _ => self.bytes,
            };
            // SAFETY: the caller's receive buffer, ours alone until the operation completes
            // (an in-place input in it was copied to our slot before).
            let out = unsafe { std::slice::from_raw_parts_mut(self.recv, out_len) };
            // A small ring slot's input is gathered from its granules into `staged` (one at a
            // time).
            let mut staging = std::mem::MaybeUninit::<[u8; SMALL_RING_BYTES]>::uninit();
            let staged = staging.as_mut_ptr() as *mut u8;
            // Bytes [at, at + len) of rank r's input.
            let input_at = |r: usize, at: usize, len: usize| -> &[u8] {
                let slot = slot_of(area, r, self.seq);
                // SAFETY: rank r's slot holds this operation's input (posted or its Arrived
                // counter reached seq, with Release) and is not rewritten before we mark Left;
                // a small ring input is at most SMALL_RING_BYTES, all of which ring_gather
                // writes before the slice is made (and callers drop it before the next call).
                unsafe {
                    if small_ring {
                        ring_gather(slot, at, staged, len);
                        std::slice::from_raw_parts(staged, len)
                    } else {
                        std::slice::from_raw_parts(slot.add(at), len)
                    }
                }
            };
            match self.coll {
                NodeColl::AllReduce(red) | NodeColl::ReduceScatter(red) => {
                    // Reduce-scatter: our block of every rank's input.
                    let at = if in_len == self.bytes { 0 } else { me * self.bytes };
                    for r in 0..n {
                        if r == me && own_direct {
                            // SAFETY: our send buffer holds n blocks, and out of place our
                            // receive buffer does not overlap it (layout() copies the input
                            // otherwise).
                            let own = unsafe { std::slice::from_raw_parts(self.send.add(at), self.bytes) };
                            fold(&red, out, own, r == 0)?;
                            continue;
                        }
                        let input = input_at(r, at, self.bytes);
                        if r == 0 {
                            memcopy::copy(out, input);
                        } else {
                            red.accumulate(out, input)?;
                        }
                    }
                    red.finalize(out)?;
                }
                // Copies: a small ring slot's granules straight into the receive buffer.
                NodeColl::AllGather | NodeColl::Gather { .. } | NodeColl::Broadcast { .. } => {
                    let from = match self.coll {
                        NodeColl::Broadcast { root } => root..root + 1,
                        _ => 0..n,
                    };
                    for (k, r) in from.enumerate() {
                        let dst = &mut out[k * in_len..(k + 1) * in_len];
                        if small_ring {
                            // SAFETY: as for input_at; dst is the caller's receive buffer.
                            unsafe { ring_gather(slot_of(area, r, self.seq), 0, dst.as_mut_ptr(), in_len) };
                        } else {
                            memcopy::copy(dst, input_at(r, 0, in_len));
                        }
                    }
                }
            }
            area.mark(Counter::Left, self.seq);
            self.phase = Phase::Done;
        }
        Ok(())
    }

    /// A one-shot operation's input into this rank's slot (in granules for a small ring slot,
    /// `interleaved`), scaled by our own PreMulSum scalar (ranks' scalars differ); a
    /// reduce-scatter's own block left out when `own_direct`.
    ///
    /// # Safety
    /// `slot` must be this rank's slot for this operation, holding `in_len` bytes (as small
    /// ring granules when `interleaved`), read by no rank until we post it.
    unsafe fn fill_slot(
        &self,
        slot: *mut u8,
        interleaved: bool,
        in_len: usize,
        own_direct: bool,
        me: usize,
        n: usize,
    ) -> Result<()> {
        // SAFETY: the send buffer is the caller's, valid for `in_len` bytes, and cannot
        // overlap the shared slot.
        let input = unsafe { std::slice::from_raw_parts(self.send, in_len) };
        // (start, length) of what enters the slot: every block but our own, or all of it.
        let (count, step) = if own_direct { (n, self.bytes) } else { (1, in_len) };
        let ranges = (0..count).filter(|&q| !own_direct || q != me).map(|q| (q * step, step));
        let red = match self.coll {
            NodeColl::AllReduce(red) | NodeColl::ReduceScatter(red) if red.has_pre() => Some(red),
            _ => None,
        };
        for (at, len) in ranges {
            let data = &input[at..at + len];
            if interleaved {
                for (p, r) in ring_pieces(slot, at, len) {
                    // SAFETY: granule pieces of our small ring slot (caller's contract), each
                    // within one granule; data[r] is the matching part of the input.
                    unsafe {
                        std::ptr::copy_nonoverlapping(data[r.clone()].as_ptr(), p, r.len());
                        if let Some(red) = red {
                            // Granules are 128 B: whole elements.
                            red.prepare_in_place(std::slice::from_raw_parts_mut(p, r.len()))?;
                        }
                    }
                }
            } else {
                // SAFETY: the caller's contract: `in_len` bytes of slot, ours alone.
                let dst = unsafe { std::slice::from_raw_parts_mut(slot.add(at), len) };
                match red {
                    Some(red) => red.prepare(dst, data)?,
                    None => memcopy::copy(dst, data),
                }
            }
        }
        Ok(())
    }

    /// Publishes this rank's buffers for a direct or pull operation, choosing which travel
    /// through its slot: those its peers cannot map (private memory of a process, while
    /// some peer is another process) of at most `stage_max` bytes. Peers then read and
    /// write the slot with plain loads and stores instead of a system call per piece and
    /// peer, in rounds of a slot's size.
    fn publish_direct(&mut self, area: &mut NodeArea, send_len: usize, recv_len: usize, pre: Option<[u8; 8]>) {
        let size = self.coll.message_bytes(self.bytes, area.nranks());
        let unmappable = |d: &BufDesc, len: usize| len > 0 && d.shared.is_none() && !area.peers_share_address_space();
        // Staged for want of huge pages (kernel copies of 4 KiB pages are slow): still
        // prepared for kernel copies below, so that a buffer used again may get huge pages.
        let off_huge = |addr: *const u8, len: usize| {
            size > self.stage_max && size <= self.stage_off_huge_max && !huge_pages::on_huge_pages(addr as usize, len)
        };
        let stage = |d: &BufDesc, addr: *const u8, len: usize| {
            unmappable(d, len) && (size <= self.stage_max || off_huge(addr, len))
        };
        // Heap sharing only matters to peers in other processes. The receive buffer goes first:
        // an in-place all-gather's send buffer lies inside it.
        let share_heap = if area.peers_share_address_space() { None } else { share_heap::min_bytes() };
        let mut recv = BufDesc::of_sharing(self.recv, recv_len, share_heap);
        let mut send = BufDesc::of_sharing(self.send, send_len, share_heap);
        send.staged = stage(&send, self.send, send_len);
        // An all-gather's receive buffer is written by its owner alone (read by a relay's
        // neighbour in place, never through a slot).
        recv.staged = !matches!(self.coll, NodeColl::AllGather) && stage(&recv, self.recv, recv_len);
        let awaits_huge = |d: &BufDesc| d.staged && size > self.stage_max;
        // Peers in other processes reach the rest of our private buffers by kernel copies,
        // which pin every page they touch: fewer, larger pages make each copy cheaper.
        let (send_reached, recv_reached) = self.bytes_peers_reach(area, send_len, recv_len);
        // (Smaller messages leave at once: no ranges gathered for every small operation.)
        if !area.peers_share_address_space() && send_reached.max(recv_reached) >= huge_pages::MIN_BYTES {
            let send_range = ((!send.staged || awaits_huge(&send)) && send.shared.is_none())
                .then_some((self.send as usize, send_reached));
            let recv_range = ((!recv.staged || awaits_huge(&recv)) && recv.shared.is_none())
                .then_some((self.recv as usize, recv_reached));
            for (addr, len) in kernel_copy_ranges(send_range, recv_range) {
                huge_pages::prepare_for_kernel_copies(addr, len);
            }
        }
        self.stage_send = send.staged;
        self.stage_recv = recv.staged;
        area.publish(send, recv, pre, self.bytes, self.relay_offered);
        self.off = 0;
        // Our own first piece; fixed for all ranks once every rank has published.
        self.piece = if send.staged || recv.staged { self.staged_piece(area) } else { self.bytes };
    }

    /// How many bytes of this rank's send and receive buffers peers read and write (by kernel
    /// copies, when not staged): every collective's input but a broadcast receiver's; the
    /// outputs of an all-reduce (each rank writes its slice of the result everywhere) and of
    /// the receiver of a shared 2-process broadcast copy ([`NodeOp::split_copy`], which it
    /// publishes with no length: its owner never stages it), predicted here from the root's
    /// size limit, which is ours (a root that still stages its buffer for want of huge pages,
    /// [`default_stage_off_huge_max`], makes this preparation of our buffer useless, not
    /// wrong). The other outputs only their owner writes.
    fn bytes_peers_reach(&self, area: &NodeArea, send_len: usize, recv_len: usize) -> (usize, usize) {
        match self.coll {
            NodeColl::AllReduce(_) => (send_len, recv_len),
            NodeColl::Broadcast { root } if root == area.rank() => (send_len, 0),
            NodeColl::Broadcast { .. } => {
                let shared_copy = area.nranks() == 2 && self.bytes >= SPLIT_MIN && self.bytes > self.stage_max;
                (0, if shared_copy { self.bytes } else { 0 })
            }
            // A relay's neighbour reads the blocks this rank received (`recv_len` is 0 unless
            // it offers one).
            NodeColl::AllGather => (send_len, recv_len),
            // (A gather goes one-shot only, through slots: never reached here.)
            NodeColl::ReduceScatter(_) | NodeColl::Gather { .. } => (send_len, 0),
        }
    }

    /// Numbers the operation, publishes its buffers (and input scalar) and goes to its first
    /// round, once the descriptor copy it overwrites is no longer read (`false`: not yet).
    fn begin(&mut self, area: &mut NodeArea, send_len: usize, recv_len: usize, red: Option<Reduction>) -> Result<bool> {
        if !area.descriptor_free()? {
            return Ok(false);
        }
        self.start(area);
        let pre = match red.map(|r| r.pre) {
            Some(Pre::Mul(s)) => Some(s),
            _ => None,
        };
        self.publish_direct(area, send_len, recv_len, pre);
        self.phase = Phase::WaitSlot;
        Ok(true)
    }

    /// After a round of `len` bytes: starts the next round (`true`: run it at once) or, after
    /// the last, waits for every rank to leave.
    fn next_round(&mut self, area: &mut NodeArea, len: usize) -> bool {
        self.off += len;
        if self.off < self.bytes {
            self.start(area);
            self.phase = Phase::WaitSlot;
            return true;
        }
        self.phase = Phase::WaitLeft;
        false
    }

    /// Whether every rank announced this round, with matching calls; fixes the rounds' piece
    /// size on the first.
    fn all_arrived(&mut self, area: &mut NodeArea) -> Result<bool> {
        if !area.all_reached(Counter::Arrived, self.seq)? {
            return Ok(false);
        }
        area.check_peers()?;
        self.fix_piece(area, 0..area.nranks());
        Ok(true)
    }

    /// Bytes per round (of the message; of each block for a reduce-scatter, whose slot holds
    /// one piece of every block) when buffers go through slots: a slot's worth, but for an
    /// all-reduce at most [`ROUND_SLICE`] per rank.
    fn staged_piece(&self, area: &NodeArea) -> usize {
        let n = area.nranks();
        match self.coll {
            NodeColl::ReduceScatter(_) => area.slot_bytes() / n / 64 * 64,
            NodeColl::AllReduce(_) => area.slot_bytes().min(n * ROUND_SLICE),
            _ => area.slot_bytes(),
        }
        .max(64)
    }

    /// Phase WaitSlot of a round: once the slot of this round's parity is free, copies this
    /// rank's piece of its input into it (when staged) and announces the round.
    fn enter_round(&mut self, area: &mut NodeArea) -> Result<bool> {
        let staging = self.stage_send || self.stage_recv;
        // The slot of this parity last served operation seq - 2.
        if staging && !area.all_reached(Counter::Left, self.seq.saturating_sub(2))? {
            return Ok(false);
        }
        if self.stage_send {
            let len = self.piece.min(self.bytes - self.off);
            let slot = area.slot(area.rank(), self.seq);
            // A reduce-scatter's input is n blocks: this round's piece of each, side by side.
            let blocks = match self.coll {
                NodeColl::ReduceScatter(_) => area.nranks(),
                _ => 1,
            };
            // An all-reduce's own slice is read from the send buffer by this rank alone, and
            // its result written straight to the receive buffer: it stays out of the slot.
            let skip = match self.coll {
                NodeColl::AllReduce(red) => slice_of(len, red.dtype.size(), area.rank(), area.nranks()),
                _ => (0, 0),
            };
            for q in 0..blocks {
                // A reduce-scatter's own block likewise (only this rank reads it).
                if blocks > 1 && q == area.rank() {
                    continue;
                }
                for (from, to) in [(0, skip.0), (skip.1, len)] {
                    // SAFETY: our own slot (slot_bytes >= blocks * piece >= (q + 1) * len),
                    // free (above) and read by no rank until we mark Arrived; the send buffer
                    // holds blocks * bytes bytes, of which this reads block q's [off, off +
                    // len); it is not shared memory, so it cannot overlap the slot.
                    unsafe {
                        memcopy::copy_bytes(
                            self.send.add(q * self.bytes + self.off + from),
                            slot.add(q * len + from),
                            to.saturating_sub(from),
                        )
                    };
                }
            }
        }
        area.mark(Counter::Arrived, self.seq);
        self.phase = Phase::WaitArrived;
        Ok(true)
    }

    /// After the first round's arrivals every rank has published: rounds are a slot's size
    /// if any of `ranks` stages a buffer, else one round takes the whole message.
    fn fix_piece(&mut self, area: &NodeArea, ranks: impl Iterator<Item = usize> + Clone) {
        if self.off == 0 {
            let staged = ranks.clone().any(|r| area.peer_staged(r, 0) || area.peer_staged(r, 1));
            self.piece = if staged { self.staged_piece(area) } else { self.bytes };
        }
    }

    /// Where this round reads (`which == 0`) or writes rank r's data: its slot when staged,
    /// else its buffer at this round's offset.
    fn round_buf(&self, area: &mut NodeArea, r: usize, which: usize) -> PeerBuf {
        if area.peer_staged(r, which) {
            return PeerBuf::Direct(area.slot(r, self.seq));
        }
        match area.peer_buf(r, which, self.bytes) {
            // SAFETY (pointer arithmetic only): off < bytes, inside rank r's buffer.
            PeerBuf::Direct(p) => PeerBuf::Direct(p.wrapping_add(self.off)),
            PeerBuf::Remote { pid, addr } => PeerBuf::Remote { pid, addr: addr + self.off as u64 },
        }
    }

    /// A round: every rank announces its piece (copying it, but for its own slice, into its
    /// slot when staged), reduces its slice of all pieces (its own straight from its send
    /// buffer), writes the result into its own receive buffer and into every other rank's
    /// output (receive buffer, or slot in place of the input just read), and marks Left;
    /// staged ranks then copy the others' slices out of their slot. Rounds overlap: the next
    /// round's copy in comes before this round's copy out, so it hides the wait for this
    /// round's stragglers. Round k + 2 reuses round k's slots, which no peer writes before
    /// this rank announces round k + 2, after its copy out of round k.
    fn direct(&mut self, area: &mut NodeArea, scratch: &mut Vec<u64>, red: Reduction) -> Result<()> {
        if self.phase == Phase::Done {
            return Ok(());
        }
        if self.phase == Phase::Start && !self.begin(area, self.bytes, self.bytes, Some(red))? {
            return Ok(());
        }
        loop {
            if self.phase == Phase::WaitSlot && !self.enter_round(area)? {
                return Ok(());
            }
            if self.phase == Phase::WaitArrived {
                // The previous round first: its copy out must precede our next announcement.
                if !self.drain(area, red)? || !self.all_arrived(area)? {
                    return Ok(());
                }
                self.reduce_round(area, scratch, red)?;
                // Non-temporal stores are not ordered by the Release below: fence them first.
                store_fence();
                area.mark(Counter::Left, self.seq);
                let len = self.piece.min(self.bytes - self.off);
                self.draining = Some(Drain { seq: self.seq, off: self.off, len });
                if self.next_round(area, len) {
                    continue;
                }
            }
            // Peers write our receive buffer or slot, and read our send buffer, slot and
            // descriptor, until every rank has left the last round.
            if self.drain(area, red)? {
                self.phase = Phase::Done;
            }
            return Ok(());
        }
    }

    /// Finishes the round in `draining` once every rank has left it: copies the others'
    /// slices of its result out of our slot when our receive buffer is staged (our own
    /// slice went straight to it). `true` when no round is left to drain.
    fn drain(&mut self, area: &mut NodeArea, red: Reduction) -> Result<bool> {
        let Some(d) = self.draining else { return Ok(true) };
        if !area.all_reached(Counter::Left, d.seq)? {
            return Ok(false);
        }
        if self.stage_recv {
            let (lo, hi) = slice_of(d.len, red.dtype.size(), area.rank(), area.nranks());
            let slot = area.slot(area.rank(), d.seq);
            for (from, to) in [(0, lo), (hi, d.len)] {
                // SAFETY: our slot of round d.seq holds that round's result outside our own
                // slice (every rank wrote its slice and marked Left) and nobody writes it
                // before we announce round d.seq + 2; the receive buffer holds `bytes` >= off
                // + len bytes and is private memory, so it cannot overlap the slot.
                unsafe { memcopy::copy_bytes(slot.add(from), self.recv.add(d.off + from), to.saturating_sub(from)) };
            }
        }
        self.draining = None;
        Ok(true)
    }

    /// One round of the direct all-reduce: this rank reduces its slice of the round's piece
    /// of all inputs (in rank order) and writes it into every rank's output.
    fn reduce_round(&mut self, area: &mut NodeArea, scratch: &mut Vec<u64>, red: Reduction) -> Result<()> {
        let (me, n) = (area.rank(), area.nranks());
        let round_len = self.piece.min(self.bytes - self.off);
        // Our own input and output are in reach whatever we publish (and our own slice
        // never enters our slot).
        // SAFETY (pointer arithmetic only): off < bytes, inside our buffers.
        let own = |p: *mut u8| PeerBuf::Direct(p.wrapping_add(self.off));
        let inputs: Vec<PeerBuf> =
            (0..n).map(|r| if r == me { own(self.send as *mut u8) } else { self.round_buf(area, r, 0) }).collect();
        let outputs: Vec<PeerBuf> =
            (0..n).map(|r| if r == me { own(self.recv) } else { self.round_buf(area, r, 1) }).collect();
        let streaming: Vec<bool> = (0..n)
            .map(|r| self.bytes >= stream_min(n) && !area.peer_in_place(r) && (r == me || !area.peer_staged(r, 1)))
            .collect();
        // Each input is scaled by its own rank's PreMulSum scalar.
        let reductions: Vec<Reduction> =
            (0..n).map(|r| Reduction { pre: area.peer_pre_scalar(r).map_or(Pre::None, Pre::Mul), ..red }).collect();
        let (lo, hi) = slice_of(round_len, red.dtype.size(), me, n);
        // Sized to the slice: the executor hands over a cleared buffer each operation,
        // and zeroing a whole piece per small message costs more than the reduction.
        let remote = inputs.iter().any(|i| matches!(i, PeerBuf::Remote { .. }));
        let remote_output = outputs.iter().find_map(|o| match *o {
            PeerBuf::Remote { addr, .. } => Some(addr),
            PeerBuf::Direct(_) => None,
        });
        let kernel_copies = remote || remote_output.is_some();
        let piece = if kernel_copies { REMOTE_PIECE } else { PIECE };
        let words = scratch_words(piece.min(hi - lo), kernel_copies);
        let remote_inputs = inputs.iter().filter(|i| matches!(i, PeerBuf::Remote { .. })).count();
        let gather = remote && gathers_remote_inputs(n, piece.min(hi - lo));
        scratch.resize(words * (1 + if gather { remote_inputs } else { usize::from(remote) }), 0);
        // The accumulator is read into from input 0 when that is remote (start_fold; not
        // when the inputs are gathered first), else written out to the first remote output.
        let acc_partner = match inputs[0] {
            PeerBuf::Remote { addr, .. } if !gather => Some(addr),
            _ => remote_output,
        };
        let (acc_words, in_words) = scratch.split_at_mut(words);
        let acc_all = as_bytes_mut(acc_words);
        let staged_all = as_bytes_mut(in_words);
        // Out of place (and not streamed), our own receive buffer takes the result straight
        // from the reduction: one copy fewer.
        let into_recv = !std::ptr::eq(self.send, self.recv) && !streaming[me];
        let mut off = lo;
        while off < hi {
            let len = piece.min(hi - off);
            let acc: &mut [u8] = if into_recv {
                // SAFETY: our receive buffer holds `bytes` >= self.off + off + len bytes, and
                // slice [lo, hi) of it only this rank writes; out of place no input lies in it
                // (peers' buffers and slots are other memory, and layout() copies an input
                // that overlaps it other than in place).
                unsafe { std::slice::from_raw_parts_mut(self.recv.add(self.off + off), len) }
            } else if let Some(addr) = acc_partner {
                peer_mem::page_matched(acc_all, addr + off as u64, len)
            } else {
                &mut acc_all[..len]
            };
            // Peers' lines first, then the fold: warmed before the combine of inputs 0 and 1
            // rather than after it, 8 ranks on the 16-core host took (us, min of 3 alternating
            // launches, after / before) 16 KiB 12.3 / 10.9, 32 KiB 22.6 / 17.8, 64 KiB
            // 36.7 / 28.6, 128 KiB 65.4 / 53.4; 16 ranks even (bench/results/cache-sets-16core/r93).
            // SAFETY: as for fold_inputs below.
            unsafe { warm_inputs(&inputs, me, off, len) };
            if gather {
                // `words` words per remote input: a piece and its page slack.
                let gathered = gather_remote_inputs(&inputs, me, off, len, staged_all, words * 8)?;
                // SAFETY: as below for the inputs in reach; the gathered ones lie in
                // staged_all, which nothing touches until the fold is done.
                unsafe { fold_inputs(&gathered, &reductions, 0, acc, &mut [])? };
            } else {
                // SAFETY: rank r's send buffer (or ours, or rank r's slot) holds this round's
                // input from the round's start on (off + len <= round_len), and nobody writes
                // this slice of it before this rank does below.
                unsafe { fold_inputs(&inputs, &reductions, off, acc, staged_all)? };
            }
            red.finalize(acc)?;
            // Write the result into every rank's output, starting with the next rank so
            // that not every rank writes to rank 0 first.
            for k in 0..n {
                let r = (me + k) % n;
                if r == me && into_recv {
                    continue;
                }
                match outputs[r] {
                    // SAFETY: slice [lo, hi) of every output (receive buffer or slot) is written
                    // by this rank only, and read by nobody until all ranks mark Left. In place
                    // (or a staged rank's slot), it is also rank r's input for this slice,
                    // which only this rank reads, and it already did (for this piece) above.
                    PeerBuf::Direct(p) => unsafe { copy_out(acc, p.add(off), streaming[r]) },
                    PeerBuf::Remote { pid, addr } => write_remote(pid, addr + off as u64, acc)?,
                }
            }
            off += len;
        }
        Ok(())
    }

    /// Reduce-scatter: rank r reduces block r of every rank's input (in rank order) straight
    /// into its receive buffer (through scratch only in place or with kernel copies), reading
    /// each input byte once. Inputs that peers cannot map go through their owners' slots, a
    /// piece of every other block per round (its own block only its owner reads).
    fn reduce_scatter(&mut self, area: &mut NodeArea, scratch: &mut Vec<u64>, red: Reduction) -> Result<()> {
        let (me, n) = (area.rank(), area.nranks());
        if self.phase == Phase::Done {
            return Ok(());
        }
        // Only its owner writes a receive buffer: never staged.
        if self.phase == Phase::Start && !self.begin(area, n * self.bytes, 0, Some(red))? {
            return Ok(());
        }
        loop {
            if self.phase == Phase::WaitSlot && !self.enter_round(area)? {
                return Ok(());
            }
            if self.phase == Phase::WaitArrived {
                if !self.all_arrived(area)? {
                    return Ok(());
                }
                let len = self.piece.min(self.bytes - self.off);
                let inputs: Vec<PeerBuf> = (0..n)
                    .map(|r| {
                        if r == me {
                            // Our own block never enters our slot (enter_round).
                            // SAFETY (pointer arithmetic only): inside our send buffer of n blocks.
                            return PeerBuf::Direct(self.send.wrapping_add(me * self.bytes + self.off) as *mut u8);
                        }
                        if area.peer_staged(r, 0) {
                            // SAFETY (pointer arithmetic only): piece me of n in rank r's slot.
                            return PeerBuf::Direct(area.slot(r, self.seq).wrapping_add(me * len));
                        }
                        let at = me * self.bytes + self.off;
                        match area.peer_buf(r, 0, n * self.bytes) {
                            PeerBuf::Direct(p) => PeerBuf::Direct(p.wrapping_add(at)),
                            PeerBuf::Remote { pid, addr } => PeerBuf::Remote { pid, addr: addr + at as u64 },
                        }
                    })
                    .collect();
                let reductions: Vec<Reduction> = (0..n)
                    .map(|r| Reduction { pre: area.peer_pre_scalar(r).map_or(Pre::None, Pre::Mul), ..red })
                    .collect();
                let remote = inputs.iter().any(|i| matches!(i, PeerBuf::Remote { .. }));
                // In place, our receive buffer is our own input block: fold through scratch.
                let in_place = std::ptr::eq(self.recv as *const u8, self.send.wrapping_add(me * self.bytes));
                if !remote && !in_place {
                    // Straight into the receive buffer: no input lies in it (peers' buffers
                    // and slots are other memory; layout() copies any other overlapping input).
                    // SAFETY: our receive buffer holds `bytes` >= off + len bytes, ours alone.
                    let out = unsafe { std::slice::from_raw_parts_mut(self.recv.add(self.off), len) };
                    for (k, piece) in out.chunks_mut(PIECE).enumerate() {
                        // SAFETY: rank r's input (buffer or slot) holds this round's piece of
                        // our block and is not rewritten until every rank marks Left.
                        unsafe {
                            warm_inputs(&inputs, me, k * PIECE, piece.len());
                            fold_inputs(&inputs, &reductions, k * PIECE, piece, &mut [])?
                        };
                        red.finalize(piece)?;
                    }
                } else {
                    self.fold_via_scratch(&inputs, &reductions, scratch, len, remote, in_place, red)?;
                }
                area.mark(Counter::Left, self.seq);
                if self.next_round(area, len) {
                    continue;
                }
            }
            // Peers read our input until then. Staged, they read our slot and descriptor,
            // whose next writers wait for them (enter_round, begin): we need not.
            if self.stage_send {
                self.phase = Phase::Done;
                return Ok(());
            }
            return self.wait_left(area);
        }
    }

    /// A reduce-scatter round's `len` bytes of our block, folded piece by piece (inputs in
    /// other processes read through scratch): in place in scratch and then copied to the
    /// receive buffer (our own input block, still to be read), otherwise straight into it.
    #[allow(clippy::too_many_arguments)]
    fn fold_via_scratch(
        &self,
        inputs: &[PeerBuf],
        reductions: &[Reduction],
        scratch: &mut Vec<u64>,
        len: usize,
        remote: bool,
        in_place: bool,
        red: Reduction,
    ) -> Result<()> {
        // An accumulator only in place, staging only for kernel copies; either with room to
        // sit at its kernel copy's page offset (peer_mem::page_matched).
        let words = scratch_words(PIECE.min(len), remote);
        let acc_words = if in_place { words } else { 0 };
        scratch.resize(acc_words + if remote { words } else { 0 }, 0);
        let (acc_words, in_words) = scratch.split_at_mut(acc_words);
        let (acc_all, staged_all) = (as_bytes_mut(acc_words), as_bytes_mut(in_words));
        let mut off = 0;
        while off < len {
            let step = PIECE.min(len - off);
            let acc: &mut [u8] = if in_place {
                match inputs[0] {
                    // start_fold reads input 0 straight into the accumulator.
                    PeerBuf::Remote { addr, .. } => peer_mem::page_matched(acc_all, addr + off as u64, step),
                    PeerBuf::Direct(_) => &mut acc_all[..step],
                }
            } else {
                // SAFETY: our receive buffer holds `bytes` >= self.off + off + step bytes and
                // is ours alone; out of place no input lies in it (peers' buffers and slots
                // are other memory, and layout() copies any other overlapping input).
                unsafe { std::slice::from_raw_parts_mut(self.recv.add(self.off + off), step) }
            };
            // SAFETY: rank r's input (buffer or slot) holds this round's piece of our block
            // (off + step <= len) and is not rewritten until every rank marks Left.
            unsafe { fold_inputs(inputs, reductions, off, acc, staged_all)? };
            red.finalize(acc)?;
            if in_place {
                // SAFETY: our receive buffer holds `bytes` >= self.off + off + step bytes; in
                // place it is our own input block, which only this rank reads, and it already
                // did (for this piece) above.
                unsafe { memcopy::copy_bytes(acc.as_ptr(), self.recv.add(self.off + off), step) };
            }
            off += step;
        }
        Ok(())
    }

    /// All-gather (`root` None) and broadcast: each rank copies what it needs from its peers'
    /// send buffers (or, for buffers they cannot map, the owners' slots, in rounds of a slot's
    /// size) straight into its own receive buffer (one copy per byte, reading lines that stay
    /// clean and writing only local ones). A rank's send buffer is read until every reader
    /// marks Left; a broadcast's non-root ranks lend nothing, so they finish as soon as their
    /// copy is done.
    fn pull(&mut self, area: &mut NodeArea, root: Option<usize>) -> Result<()> {
        let (me, n) = (area.rank(), area.nranks());
        let block = self.bytes;
        if self.phase == Phase::Done {
            return Ok(());
        }
        if self.phase == Phase::Start {
            let send_len = if root.is_none_or(|r| r == me) { block } else { 0 };
            // The receive buffer is only ever written by its owner: never staged. A relay's
            // neighbour reads it whole.
            self.relay_offered = root.is_none() && block > 0 && self.offers_relay_here(area);
            let recv_len = if self.relay_offered { n * block } else { 0 };
            if !self.begin(area, send_len, recv_len, None)? {
                return Ok(());
            }
        }
        loop {
            if self.phase == Phase::WaitSlot && !self.enter_round(area)? {
                return Ok(());
            }
            if self.relay_step.is_some() {
                if self.relay(area)? {
                    self.relay_step = None;
                    // Our right neighbour reads our buffers until its last step.
                    area.mark(Counter::Left, self.seq);
                    self.phase = Phase::WaitLeft;
                    self.wait_left(area)?;
                }
                return Ok(());
            }
            if self.phase == Phase::WaitArrived {
                // Only the ranks read from need to have published.
                let published = match root {
                    None => area.all_reached(Counter::Arrived, self.seq)?,
                    Some(r) => area.reached(r, Counter::Arrived, self.seq)?,
                };
                if !published {
                    return Ok(());
                }
                match root {
                    None => area.check_peers()?,
                    Some(r) => area.check_peer(r)?,
                }
                match root {
                    None => self.fix_piece(area, 0..n),
                    Some(r) => self.fix_piece(area, r..r + 1),
                }
                // Every rank offered to relay and none stages its input: all decide alike from
                // the same descriptors.
                let relayed = self.relay_offered
                    && self.off == 0
                    && (0..n).all(|r| {
                        let d = area.descriptor(r);
                        d.relay && !d.send.staged
                    });
                if relayed {
                    self.copy_own_block(area);
                    self.relay_step = Some(1);
                    continue;
                }
                if let Some(r) = root.filter(|&r| self.split_copy(area, r)) {
                    if !self.shared_copy(area, r)? {
                        return Ok(());
                    }
                    // The root pushed into our receive buffer until it marks Left.
                    area.mark(Counter::Left, self.seq);
                    self.phase = Phase::WaitLeft;
                    self.wait_left(area)?;
                    if r == me && self.phase == Phase::Done {
                        area.check_peers()?;
                    }
                    return Ok(());
                }
                self.copy_round(area, root)?;
                area.mark(Counter::Left, self.seq);
                // A staged root compares calls in the first round in which every rank has
                // announced its own (each round announces the same call).
                let staged_root = root == Some(me) && self.stage_send;
                if staged_root && !self.calls_checked && area.all_reached(Counter::Arrived, self.seq)? {
                    area.check_peers()?;
                    self.calls_checked = true;
                }
                self.off += self.piece.min(block - self.off);
                if self.off < block {
                    self.start(area);
                    self.phase = Phase::WaitSlot;
                    continue;
                }
                // A sender waits for its readers, unless its input went through its slot: the
                // slot's and the descriptor's next writers wait for them (enter_round, begin).
                // A broadcast's root still compares its call with every receiver's, so a
                // staged root waits for their announcements instead (a root mismatch leaves
                // two roots, neither of which reads the other).
                let sends = root.is_none_or(|r| r == me);
                self.phase = match (sends && !self.stage_send, root == Some(me)) {
                    (true, _) => Phase::WaitLeft,
                    (false, true) if !self.calls_checked => Phase::WaitCalls,
                    _ => Phase::Done,
                };
            }
            if self.phase == Phase::WaitCalls {
                if area.all_reached(Counter::Arrived, self.seq)? {
                    area.check_peers()?;
                    self.calls_checked = true;
                    self.phase = Phase::Done;
                }
                return Ok(());
            }
            // Peers read our send buffer until then.
            self.wait_left(area)?;
            // A root learns only now whether the others took it for the root: compare with
            // every rank still on this operation (ranks already past it are not compared).
            if root == Some(me) && self.phase == Phase::Done {
                area.check_peers()?;
            }
            return Ok(());
        }
    }

    /// Whether this broadcast's copy is shared between root and receiver: two ranks in
    /// different processes, and the root's send buffer not staged. One copy by the receiver
    /// alone leaves the root idle; Open MPI pipelines a copy in by the root and a copy out
    /// by the receiver, so two cores copy. Decided from the root's published descriptor
    /// alone, which both ranks read and which stays put until the receiver has left, so
    /// both decide the same. Mapped (ncclMemAlloc) buffers gain too, copied with plain
    /// loads and stores (2-core VM, us, out of place / in place, alone against shared: 8 MiB
    /// 250 / 217 against 249 / 145, 128 MiB 15969 / 11558 against 12822 / 7786).
    fn split_copy(&self, area: &NodeArea, root: usize) -> bool {
        let send = area.descriptor(root).send;
        area.nranks() == 2 && !area.peers_share_address_space() && !send.staged && self.bytes >= SPLIT_MIN
    }

    /// A shared broadcast copy: root and receiver take chunks of the message in turn from a
    /// counter in the root's control block until none is left, so whichever copies faster
    /// copies more: the receiver pulls its chunks from the root's send buffer, the root
    /// pushes its chunks into the receiver's receive buffer. An out-of-place root first
    /// copies its input to its own output, meanwhile the receiver has the chunks to itself.
    /// (Copying each chunk taken to both outputs, so that the input is read once, measured
    /// slower: a second kernel copy per chunk costs more than the root's plain copy.)
    /// `false` while the root waits for the receiver's descriptor.
    fn shared_copy(&mut self, area: &mut NodeArea, root: usize) -> Result<bool> {
        let me = area.rank();
        let peer = 1 - me;
        if me == root {
            if !self.own_copied {
                if !std::ptr::eq(self.send, self.recv) {
                    // SAFETY: our send and receive buffers hold `bytes` bytes each; NCCL's
                    // in-place rule means they are the same or do not overlap.
                    unsafe { memcopy::copy_bytes(self.send, self.recv, self.bytes) };
                }
                self.own_copied = true;
            }
            if !area.reached(peer, Counter::Arrived, self.seq)? {
                return Ok(false);
            }
        }
        // The root writes into the receiver's buffer: both must have been called with the
        // same count, which the signatures compare only by digest.
        let theirs_len = area.descriptor(peer).block;
        if theirs_len != self.bytes as u64 {
            return Err(Error::invalid_usage(format!(
                "broadcast sizes differ: {} bytes on rank {me}, {theirs_len} on rank {peer}",
                self.bytes
            )));
        }
        let chunk = split_chunk(self.bytes);
        let chunks = self.bytes.div_ceil(chunk);
        // The receiver's receive buffer (root) or the root's send buffer (receiver).
        let theirs = area.peer_buf(peer, usize::from(me == root), self.bytes);
        while let Some(k) = area.claim(root, self.seq, chunks) {
            let off = k * chunk;
            let len = chunk.min(self.bytes - off);
            if me == root {
                // SAFETY: our send buffer holds `bytes` >= off + len bytes.
                copy_to(theirs, off, unsafe { std::slice::from_raw_parts(self.send.add(off), len) })?;
            } else {
                // SAFETY: our receive buffer holds `bytes` >= off + len bytes; chunk k of it
                // is written by this rank only (claims are unique).
                copy_from(theirs, off, unsafe { std::slice::from_raw_parts_mut(self.recv.add(off), len) })?;
            }
        }
        Ok(true)
    }

    /// One round of a pull: this round's piece of every source's block into our output.
    fn copy_round(&mut self, area: &mut NodeArea, root: Option<usize>) -> Result<()> {
        let (me, n) = (area.rank(), area.nranks());
        let block = self.bytes;
        let len = self.piece.min(block - self.off);
        // All-gather: every rank, starting after this one so that not all read rank 0 first.
        let sources = if root.is_some() { 1 } else { n };
        for k in 1..=sources {
            let r = root.unwrap_or((me + k) % n);
            let at = if root.is_some() { 0 } else { r * block };
            // SAFETY: the caller's receive buffer, ours alone until the operation completes
            // (block, or n blocks for an all-gather); `at + off + len` stays inside it.
            let dst = unsafe { self.recv.add(at + self.off) };
            if r == me {
                // In place (all-gather input already at its place, broadcast root with
                // send == recv): nothing to move.
                // SAFETY: our send buffer holds `block` >= off + len bytes.
                let src = unsafe { self.send.add(self.off) };
                if !std::ptr::eq(src, dst) {
                    // SAFETY: NCCL's in-place rule means our send buffer either is this block
                    // of the output or does not overlap it.
                    unsafe { memcopy::copy_bytes(src, dst, len) };
                }
                continue;
            }
            match self.round_buf(area, r, 0) {
                // SAFETY: rank r's send buffer (or slot) holds this round's piece and is not
                // rewritten until every reader marks Left; it cannot overlap our receive
                // buffer (another rank's memory, or the shared area).
                PeerBuf::Direct(p) => unsafe { memcopy::copy_bytes(p, dst, len) },
                PeerBuf::Remote { pid, addr } => {
                    // SAFETY: as above; the slice is our own receive block.
                    let out = unsafe { std::slice::from_raw_parts_mut(dst, len) };
                    if root.is_some() && n >= STAGGER_MIN_RANKS {
                        for piece in staggered_pieces(len, me, n) {
                            peer_mem::read_remote(pid, addr + piece.start as u64, &mut out[piece])?;
                        }
                    } else {
                        peer_mem::read_remote(pid, addr, out)?;
                    }
                }
            }
        }
        Ok(())
    }

    /// An all-gather's own block into its place in the output, unless it is there already (in
    /// place).
    fn copy_own_block(&self, area: &NodeArea) {
        let block = self.bytes;
        // SAFETY: the caller's receive buffer holds nranks blocks; block `rank` is this
        // rank's to write until the operation completes.
        let dst = unsafe { self.recv.add(area.rank() * block) };
        if !std::ptr::eq(self.send, dst) {
            // SAFETY: our send buffer holds `block` bytes; NCCL's in-place rule means it either
            // is this block of the output or does not overlap it.
            unsafe { memcopy::copy_bytes(self.send, dst, block) };
        }
    }

    /// A relayed all-gather: at step k (1 to n - 1) this rank copies block `me - k` from its
    /// left neighbour, which holds it once it has announced its step k - 1 (its own input,
    /// at step 1), and then announces step k. Each rank reads one neighbour only, lines that
    /// neighbour has just written, as a ring moves them (Open MPI's all-gather), where the
    /// pull has every rank read every owner's input at once. `true` once the last step is
    /// done; `false` while the left neighbour is behind.
    fn relay(&mut self, area: &mut NodeArea) -> Result<bool> {
        let (me, n) = (area.rank(), area.nranks());
        let block = self.bytes;
        let left = (me + n - 1) % n;
        while let Some(k) = self.relay_step.filter(|&k| k < n) {
            if !area.reached(left, Counter::Arrived, self.seq)? {
                return Ok(false);
            }
            let b = (me + n - k) % n;
            // Step 1 reads the neighbour's input, later ones what it received the step before.
            let (which, at) = if k == 1 { (0, 0) } else { (1, b * block) };
            // SAFETY: our receive buffer holds n blocks; block b is ours to write until the
            // operation completes, and no peer writes it (our right neighbour reads it only
            // after we announce this step).
            let out = unsafe { std::slice::from_raw_parts_mut(self.recv.add(b * block), block) };
            // The neighbour's input, or block b of its output, which it wrote before announcing
            // step k - 1 and keeps until every rank has left.
            copy_from(area.peer_buf(left, which, at + block), at, out)?;
            self.start(area);
            area.mark(Counter::Arrived, self.seq);
            self.relay_step = Some(k + 1);
        }
        Ok(true)
    }

    /// Phase WaitLeft: done once every rank has marked Left for this operation.
    fn wait_left(&mut self, area: &mut NodeArea) -> Result<()> {
        if self.phase == Phase::WaitLeft && area.all_reached(Counter::Left, self.seq)? {
            self.phase = Phase::Done;
        }
        Ok(())
    }
}

/// Ranks from which [`warm_inputs`] pays.
const WARM_MIN_RANKS: usize = 3;
/// Most bytes [`warm_inputs`] loads ahead of a fold: what stays in a core's L2 cache.
const WARM_MAX_BYTES: usize = 1 << 20;

/// Whether the other inputs of a fold of `len` bytes per input at `n` ranks fit the cache
/// bound that [`warm_inputs`] and [`gathers_remote_inputs`] share.
fn fold_inputs_fit_cache(n: usize, len: usize) -> bool {
    n >= WARM_MIN_RANKS && (n - 1) * len <= WARM_MAX_BYTES
}

/// Before a fold at three or more ranks with a core each, of at most [`WARM_MAX_BYTES`]:
/// loads one byte of every line of the other ranks' in-reach inputs (`len` bytes at `off`),
/// starting with rank `me + 1`'s, so that the lines come into this core's cache many at a
/// time (independent loads, where the fold streams one input after another) and ranks pull
/// from different owners at once instead of all from rank 0 first. The fold then reads them
/// in rank order from cache. Measured on the 16-core host with malloc'd buffers (inputs in the
/// owners' slots; bench/results/buffer-size-16core-2026-12-05.md, three launches each, min us
/// before / after): reduce-scatter 16 ranks 16 KiB 13.0 / 10.6, 32 KiB 21.2 / 16.1, 128 KiB
/// 57.0 / 50.3; 8 ranks 32 KiB 16.9 / 12.4, 128 KiB 35.9 / 31.8; all-reduce 16 ranks 32 KiB
/// 25.3 / 24.1, 128 KiB 72.7 / 69.0; 8 ranks 8 KiB 7.0 / 5.8. Ranks sharing cores gain
/// nothing (4 on the 2-core VM, seven launches: reduce-scatter 128 KiB 24.8 / 26.8, 512 KiB
/// 104.5 / 111.0), so they skip it.
///
/// # Safety
/// Every `PeerBuf::Direct` input must be readable for `off + len` bytes.
unsafe fn warm_inputs(inputs: &[PeerBuf], me: usize, off: usize, len: usize) {
    let n = inputs.len();
    if !fold_inputs_fit_cache(n, len) || n > crate::topo::usable_cores() {
        return;
    }
    if len == 0 {
        return;
    }
    let mut sum = 0u8;
    for k in 1..n {
        if let PeerBuf::Direct(p) = inputs[(me + k) % n] {
            // Every 64th byte, and the last: each line of the range at least once.
            for at in (off..off + len).step_by(64).chain(std::iter::once(off + len - 1)) {
                // SAFETY: inside the input (caller's contract); a volatile load so that the
                // compiler keeps every one.
                sum = sum.wrapping_add(unsafe { std::ptr::read_volatile(p.add(at)) });
            }
        }
    }
    std::hint::black_box(sum);
}

/// Whether a fold of `len` bytes per input at `n` ranks first gathers the inputs that kernel
/// copies bring ([`gather_remote_inputs`]): where [`warm_inputs`] warms the mapped ones.
/// Unit tests gather from 3 ranks whatever the cores, so that the 2-core CI machine runs this
/// path too. Only the direct all-reduce gathers, from [`GATHER_MIN_RANKS`]. Measured on the
/// 16-core H100 host, malloc'd buffers,
/// rounds 139-140 pooled (six launches, bench/results/ag-relay-2026-12-07.md), median us,
/// gathered against read in fold order: all-reduce 8 ranks 256 KiB 114 / 131 fresh, 78 / 88
/// reused, 1 MiB 432 / 492 and 349 / 349; 16 ranks 512 KiB 303 / 351 and 217 / 245, 1 MiB 604 /
/// 654 and 436 / 484: none slower beyond noise. The reduce-scatter was mixed (16 ranks reused
/// 1-4 MiB 1.16-1.31x slower, pooled; 8 ranks fresh 512 KiB 1.11x slower, 1-2 MiB
/// 0.88-0.91x): it reads in fold order.
fn gathers_remote_inputs(n: usize, len: usize) -> bool {
    let min_ranks = if cfg!(test) { WARM_MIN_RANKS } else { GATHER_MIN_RANKS };
    n >= min_ranks && fold_inputs_fit_cache(n, len) && (cfg!(test) || n <= crate::topo::usable_cores())
}

/// Fewest ranks whose all-reduce gathers ([`gathers_remote_inputs`]). Below, pieces of up to
/// [`REMOTE_PIECE`] pass the cache bound at every size, and round 142 (3-6 ranks, 256 KiB-16
/// MiB, two alternations) was mixed: fresh inputs 0.67-0.99x the time at 3 and 5 ranks but
/// 1.01-1.39x at 4 ranks 256 KiB-4 MiB; reused inputs 1.08-1.51x slower in 10 of 12 cells
/// from 2 MiB at 3-5 ranks (4 ranks 8 MiB 5651 against 3778 us, below Open MPI's 4640).
const GATHER_MIN_RANKS: usize = 8;

/// When rank `me` of `n` reads rank `r`'s input: rank me + 1 first, then me + 2, and so on,
/// so that at each turn every rank reads from a different owner.
fn read_turn(r: usize, me: usize, n: usize) -> usize {
    (r + n - me - 1) % n
}

/// The kernel-copy counterpart of [`warm_inputs`]: reads the `len` bytes at `off` of every
/// input in another process into a part of `room` of its own (`stride` bytes each, at least
/// `len + PAGE_MATCH_SLACK`, the read placed at its source's page offset) in [`read_turn`]
/// order, where the fold reads them in rank order: every rank then read from rank 0's process
/// first, and each `process_vm_readv` takes the owner's memory-map lock and pins its pages.
/// Returns the inputs to fold at offset 0, in rank order: the gathered ones as pointers into
/// `room` (valid while `room` is neither dropped nor written), the others moved by `off`.
/// The fold still runs in rank order, so the result's bits do not change.
fn gather_remote_inputs(
    inputs: &[PeerBuf],
    me: usize,
    off: usize,
    len: usize,
    room: &mut [u8],
    stride: usize,
) -> Result<Vec<PeerBuf>> {
    let n = inputs.len();
    let remote = inputs.iter().filter(|input| matches!(input, PeerBuf::Remote { .. })).count();
    let mut parts: Vec<(usize, u32, u64, &mut [u8])> = inputs
        .iter()
        .enumerate()
        .filter_map(|(r, input)| match *input {
            PeerBuf::Remote { pid, addr } => Some((r, pid, addr + off as u64)),
            PeerBuf::Direct(_) => None,
        })
        .zip(room.chunks_mut(stride))
        .map(|((r, pid, addr), part)| (r, pid, addr, part))
        .collect();
    assert_eq!(parts.len(), remote, "room holds a part per remote input");
    parts.sort_unstable_by_key(|&(r, ..)| read_turn(r, me, n));
    for (_, pid, addr, part) in parts.iter_mut() {
        peer_mem::read_remote(*pid, *addr, peer_mem::page_matched(part, *addr, len))?;
    }
    // Pointers only now, after the last write through the parts.
    parts.sort_unstable_by_key(|&(r, ..)| r);
    let mut parts = parts.into_iter();
    Ok(inputs
        .iter()
        .map(|input| match *input {
            PeerBuf::Direct(p) => PeerBuf::Direct(p.wrapping_add(off)),
            PeerBuf::Remote { .. } => {
                let (_, _, addr, part) = parts.next().expect("a part per remote input");
                PeerBuf::Direct(peer_mem::page_matched(part, addr, len).as_mut_ptr())
            }
        })
        .collect())
}

/// Starts a fold without first copying input 0 into `acc` when it has no scalar: input 0
/// and 1 combine in one pass (`acc = in0 (op) pre1(in1)`, the same operands in the same order
/// as folding them one by one) when input 0 is in reach, the second through `staging` if a
/// kernel copy brings it; an input 0 that a kernel copy brings lands straight in `acc`.
/// Returns the first input still to fold. With 2 ranks and malloc'd
/// buffers, the plain copy this saves was a quarter of a 2 MiB all-reduce's time (perf, 2-core
/// VM: `__memmove` 23%, the kernel copies 28%, the fold 14%).
///
/// # Safety
/// As [`fold_inputs`], its only caller.
unsafe fn start_fold(
    inputs: &[PeerBuf],
    reductions: &[Reduction],
    off: usize,
    acc: &mut [u8],
    staging: &mut [u8],
) -> Result<usize> {
    let len = acc.len();
    if inputs.len() < 2 || reductions[0].has_pre() {
        return Ok(0);
    }
    match (inputs[0], inputs[1]) {
        (PeerBuf::Direct(p0), second) => {
            // SAFETY: the caller's contract, for inputs 0 and 1.
            let a = unsafe { std::slice::from_raw_parts(p0.add(off), len) };
            let b: &[u8] = match second {
                // SAFETY: as above.
                PeerBuf::Direct(p1) => unsafe { std::slice::from_raw_parts(p1.add(off), len) },
                PeerBuf::Remote { pid, addr } => {
                    let staged = peer_mem::page_matched(staging, addr + off as u64, len);
                    peer_mem::read_remote(pid, addr + off as u64, staged)?;
                    staged
                }
            };
            reductions[1].combine(acc, a, b)?;
            Ok(2)
        }
        (PeerBuf::Remote { pid, addr }, _) => {
            peer_mem::read_remote(pid, addr + off as u64, acc)?;
            Ok(1)
        }
    }
}

/// Folds `acc.len()` bytes at `off` of every input into `acc`, in rank order (input 0 starts
/// the result, with input 1 in the same pass where [`start_fold`] can), reading inputs in other
/// processes through `staging`.
///
/// # Safety
/// Every `PeerBuf::Direct` input must be readable for `off + acc.len()` bytes and not written
/// while this runs; `staging` must hold at least `acc.len() + PAGE_MATCH_SLACK` bytes when any
/// input is remote (each read lands at its source's page offset, `peer_mem::page_matched`).
unsafe fn fold_inputs(
    inputs: &[PeerBuf],
    reductions: &[Reduction],
    off: usize,
    acc: &mut [u8],
    staging: &mut [u8],
) -> Result<()> {
    let len = acc.len();
    // SAFETY: the caller's contract, which is start_fold's.
    let first = unsafe { start_fold(inputs, reductions, off, acc, staging)? };
    for (r, input) in inputs.iter().enumerate().skip(first) {
        let piece: &[u8] = match *input {
            // SAFETY: the caller's contract.
            PeerBuf::Direct(p) => unsafe { std::slice::from_raw_parts(p.add(off), len) },
            PeerBuf::Remote { pid, addr } => {
                let staged = peer_mem::page_matched(staging, addr + off as u64, len);
                peer_mem::read_remote(pid, addr + off as u64, staged)?;
                staged
            }
        };
        fold(&reductions[r], acc, piece, r == 0)?;
    }
    Ok(())
}

/// Folds one input into the running result: `acc = pre(input)` for the first rank, else
/// `acc = acc (op) pre(input)`.
fn fold(red: &Reduction, acc: &mut [u8], input: &[u8], first: bool) -> Result<()> {
    if first {
        return red.prepare(acc, input);
    }
    if !red.has_pre() {
        return red.accumulate(acc, input);
    }
    // acc (op) pre(input), piecewise through a stack buffer.
    let mut buf = [0u64; 512];
    let step = buf.len() * 8;
    let mut off = 0;
    while off < acc.len() {
        let len = step.min(acc.len() - off);
        let tmp = &mut as_bytes_mut(&mut buf)[..len];
        red.prepare(tmp, &input[off..off + len])?;
        red.accumulate(&mut acc[off..off + len], tmp)?;
        off += len;
    }
    Ok(())
}

/// Copies `src` to `dst`, bypassing the cache when `streaming` (x86-64; a plain copy
/// elsewhere). Callers must [`store_fence`] before publishing the data.
///
/// # Safety
/// `dst` must be valid for `src.len()` bytes of writes and not overlap `src`.
unsafe fn copy_out(src: &[u8], dst: *mut u8, streaming: bool) {
    #[cfg(target_arch = "x86_64")]
    if streaming {
        use std::arch::x86_64::{__m128i, _mm_loadu_si128, _mm_stream_si128};
        // Plain copies up to the first 16-byte boundary of dst and after the last one.
        let head = dst.align_offset(16).min(src.len());
        let body = (src.len() - head) / 16 * 16;
        // SAFETY: all ranges lie within src and dst (caller's contract); the streaming stores
        // write 16-byte aligned addresses of dst; SSE2 is part of x86-64.
        unsafe {
            std::ptr::copy_nonoverlapping(src.as_ptr(), dst, head);
            let mut i = head;
            while i < head + body {
                let v = _mm_loadu_si128(src.as_ptr().add(i) as *const __m128i);
                _mm_stream_si128(dst.add(i) as *mut __m128i, v);
                i += 16;
            }
            std::ptr::copy_nonoverlapping(src.as_ptr().add(i), dst.add(i), src.len() - i);
        }
        return;
    }
    let _ = streaming;
    // SAFETY: the caller's contract.
    unsafe { memcopy::copy_bytes(src.as_ptr(), dst, src.len()) };
}

/// From this many ranks, broadcast receivers that read the root's buffer by kernel copies
/// start at different places ([`staggered_pieces`]). The kernel pins each page of a range
/// (an atomic on the page's count) while it copies it; receivers that all start at the front
/// pin the same pages at once and queue on those counts, most where the buffer is not on
/// huge pages. Measured on the 16-core host, 16 ranks, 8 MiB, malloc'd, us, one call for the
/// message against pieces of 256 KiB staggered, three alternations
/// (bench/results/bcast-root-return/round107-exp.txt): in an 8 MiB array 3868-4584 against
/// 2251-2792 (Open MPI 3324-3827 in round 106), in a 32 MiB one 1148-1961 against 993-1381,
/// 32 MiB 9875-10994 against 9177-10003. At 8 ranks neither wins (2 MiB in a 32 MiB buffer
/// 201-256 against 206-293, 8 MiB 860-1075 against 880-1322, 32 MiB 7402-9567 against
/// 7181-8371), so they keep one call.
const STAGGER_MIN_RANKS: usize = 9;
/// The pieces of a staggered read ([`STAGGER_MIN_RANKS`]); 1 MiB pieces measured slower at
/// 16 ranks (8 MiB array 2609-3696 us).
const STAGGER_PIECE: usize = 256 << 10;

/// The pieces, in order, in which rank `me` of `n` reads a message of `len` bytes that every
/// rank reads at once: [`STAGGER_PIECE`]s covering it once, starting with the one at `me`'s
/// share of the message and wrapping around, so that the readers start spread over it.
fn staggered_pieces(len: usize, me: usize, n: usize) -> impl Iterator<Item = std::ops::Range<usize>> {
    let pieces = len.div_ceil(STAGGER_PIECE);
    let first = me * pieces / n.max(1);
    (first..pieces).chain(0..first).map(move |k| k * STAGGER_PIECE..((k + 1) * STAGGER_PIECE).min(len))
}

/// The chunk a shared broadcast copy of `bytes` is taken in: halves (whole pages) up to
/// [`SPLIT_CHUNK`], so that root and receiver each copy one of a small message.
fn split_chunk(bytes: usize) -> usize {
    bytes.div_ceil(2).next_multiple_of(4096).min(SPLIT_CHUNK)
}

/// Bytes [at, at + len) of a small ring slot whose first granule is `slot`, piece by piece: each
/// piece's place in the slot (within one granule) and its range within those `len` bytes.
fn ring_pieces(slot: *mut u8, at: usize, len: usize) -> impl Iterator<Item = (*mut u8, std::ops::Range<usize>)> {
    let mut off = at;
    std::iter::from_fn(move || {
        if off >= at + len {
            return None;
        }
        let within = off % RING_GRANULE;
        let take = (RING_GRANULE - within).min(at + len - off);
        // Pointer arithmetic only: inside the slot for at + len <= SMALL_RING_BYTES.
        let p = slot.wrapping_add(off / RING_GRANULE * RING_STRIDE + within);
        let range = off - at..off - at + take;
        off += take;
        Some((p, range))
    })
}

/// Copies bytes [at, at + len) of the small ring slot whose first granule is `slot` to `out`.
///
/// # Safety
/// The slot must hold those bytes (at + len <= SMALL_RING_BYTES), posted and not rewritten while
/// this runs; `out` must be valid for `len` bytes of writes and not in the slot.
unsafe fn ring_gather(slot: *const u8, at: usize, out: *mut u8, len: usize) {
    for (p, r) in ring_pieces(slot as *mut u8, at, len) {
        // SAFETY: the caller's contract.
        unsafe { std::ptr::copy_nonoverlapping(p, out.add(r.start), r.len()) };
    }
}

/// Orders earlier non-temporal stores before later stores (a no-op off x86-64).
fn store_fence() {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: sfence has no operands and no memory-safety effects.
    unsafe {
        std::arch::x86_64::_mm_sfence()
    };
}

/// Operations between two uses of a slot: tiny slots go round [`TINY_DEPTH`], ring slots
/// (small or not) [`RING_DEPTH`], data slots alternate by parity.
fn reuse_distance(tiny: bool, ringed: bool) -> u64 {
    match (tiny, ringed) {
        (true, _) => TINY_DEPTH,
        (false, true) => RING_DEPTH,
        (false, false) => 2,
    }
}

/// Byte range of `rank`'s slice of a `bytes`-byte message: whole elements, in 64-byte
/// multiples where possible so that no two ranks write one cache line.
fn slice_of(bytes: usize, elem: usize, rank: usize, n: usize) -> (usize, usize) {
    let unit = 64usize.max(elem);
    let units = bytes.div_ceil(unit);
    let bound = |r: usize| ((units * r / n) * unit).min(bytes);
    (bound(rank), bound(rank + 1))
}

fn as_bytes_mut(words: &mut [u64]) -> &mut [u8] {
    // SAFETY: u64 storage viewed as bytes; same allocation and length in bytes.
    unsafe { std::slice::from_raw_parts_mut(words.as_mut_ptr() as *mut u8, words.len() * 8) }
}

/// The ranges (address, length) of this rank's buffers that peers reach by kernel copies,
/// empty ones left out and overlapping ones (in place) merged, so that a buffer counts once per
/// operation.
fn kernel_copy_ranges(send: Option<(usize, usize)>, recv: Option<(usize, usize)>) -> Vec<(usize, usize)> {
    let mut ranges: Vec<(usize, usize)> = [send, recv].into_iter().flatten().filter(|&(_, len)| len > 0).collect();
    if let [(a, la), (b, lb)] = ranges[..] {
        if a < b + lb && b < a + la {
            let start = a.min(b);
            ranges = vec![(start, (a + la).max(b + lb) - start)];
        }
    }
    ranges
}

/// Copies `out.len()` bytes at `off` of a peer's buffer into `out`.
fn copy_from(from: PeerBuf, off: usize, out: &mut [u8]) -> Result<()> {
    match from {
        // SAFETY: callers pass a peer buffer that holds off + out.len() bytes, not written
        // meanwhile, in another rank's memory (so not overlapping `out`).
        PeerBuf::Direct(p) => unsafe { memcopy::copy_bytes(p.add(off), out.as_mut_ptr(), out.len()) },
        PeerBuf::Remote { pid, addr } => peer_mem::read_remote(pid, addr + off as u64, out)?,
    }
    Ok(())
}

/// Copies `data` to `off` of a peer's buffer.
fn copy_to(to: PeerBuf, off: usize, data: &[u8]) -> Result<()> {
    match to {
        // SAFETY: callers pass a peer buffer that holds off + data.len() bytes, which only
        // this rank writes there meanwhile, in another rank's memory (so not overlapping
        // `data`).
        PeerBuf::Direct(p) => unsafe { memcopy::copy_bytes(data.as_ptr(), p.add(off), data.len()) },
        PeerBuf::Remote { pid, addr } => write_remote(pid, addr + off as u64, data)?,
    }
    Ok(())
}

/// Writes `data` at `addr` in process `pid` (the peer's receive buffer).
fn write_remote(pid: u32, addr: u64, data: &[u8]) -> Result<()> {
    let mut done = 0;
    while done < data.len() {
        let local = libc::iovec { iov_base: data[done..].as_ptr() as *mut libc::c_void, iov_len: data.len() - done };
        let remote = libc::iovec { iov_base: (addr as usize + done) as *mut libc::c_void, iov_len: data.len() - done };
        // SAFETY: `local` is our own readable buffer; the kernel checks the remote range.
        let n = unsafe { libc::process_vm_writev(pid as libc::pid_t, &local, 1, &remote, 1, 0) };
        if n <= 0 {
            return Err(Error::remote(format!("process_vm_writev to pid {pid}: {}", std::io::Error::last_os_error())));
        }
        done += n as usize;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// One 2 MiB region of this process, filled with `fill` and collapsed into a huge page on
    /// our asking where the kernel has one to give (`on_huge_pages` says whether it did);
    /// freed when dropped.
    struct CollapsedRegion(*mut u8);

    impl CollapsedRegion {
        const BYTES: usize = 2 << 20;

        fn layout() -> std::alloc::Layout {
            std::alloc::Layout::from_size_align(Self::BYTES, Self::BYTES).unwrap()
        }

        fn new(fill: u8) -> CollapsedRegion {
            // SAFETY: a non-zero size; freed in drop with the same layout.
            let p = unsafe { std::alloc::alloc(Self::layout()) };
            assert!(!p.is_null());
            // SAFETY: BYTES writable bytes at `p`.
            unsafe { std::ptr::write_bytes(p, fill, Self::BYTES) };
            // A buffer of 1 MiB and up is asked for on its second use.
            for _ in 0..2 {
                huge_pages::prepare_for_kernel_copies(p as usize, Self::BYTES);
            }
            CollapsedRegion(p)
        }

        fn on_huge_pages(&self, len: usize) -> bool {
            huge_pages::on_huge_pages(self.0 as usize, len)
        }
    }

    impl Drop for CollapsedRegion {
        fn drop(&mut self) {
            // SAFETY: allocated in new with this layout; its users are done with it.
            unsafe { std::alloc::dealloc(self.0, Self::layout()) };
        }
    }

    /// Runs `body(rank, area)` on a thread per area and waits for them all. A panic on any
    /// thread ends the test process: the other ranks would wait on the node area for ever (a
    /// peer thread that stops is no exited process), hanging the suite instead of failing it.
    fn on_rank_threads(areas: Vec<NodeArea>, body: impl Fn(usize, NodeArea) + Send + Sync + 'static) {
        let body = std::sync::Arc::new(body);
        let threads: Vec<_> = areas
            .into_iter()
            .enumerate()
            .map(|(me, area)| {
                let body = body.clone();
                std::thread::spawn(move || {
                    let run = std::panic::AssertUnwindSafe(|| body(me, area));
                    if let Err(panic) = std::panic::catch_unwind(run) {
                        let why = panic
                            .downcast_ref::<String>()
                            .map(String::as_str)
                            .or_else(|| panic.downcast_ref::<&str>().copied())
                            .unwrap_or("(no message)");
                        // Straight to stderr: the test harness drops what it captured on abort.
                        let line = format!("rank {me} panicked: {why}; its peers would wait for ever: aborting\n");
                        let _ = std::io::Write::write_all(&mut std::io::stderr(), line.as_bytes());
                        std::process::abort();
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
    }

    #[test]
    fn gathered_kernel_copy_inputs_fold_to_the_same_bits() {
        use crate::types::{BuiltinOp, DataType};
        let (n, off, floats) = (5, 3 * 4, 3000);
        // Values of many magnitudes, so that a different fold order would change the bits.
        let buffers: Vec<Vec<f32>> = (0..n)
            .map(|r| {
                (0..floats + 3)
                    .map(|i| ((i * 7919 + r * 104729) % 2003) as f32 * 10f32.powi((i % 9) as i32 - 4))
                    .collect()
            })
            .collect();
        let pid = std::process::id();
        let direct: Vec<PeerBuf> = buffers.iter().map(|b| PeerBuf::Direct(b.as_ptr() as *mut u8)).collect();
        // Per-rank scalars, as ncclRedOpCreatePreMulSum with a scalar in host memory gives.
        let pre_mul: Vec<Reduction> = (0..n)
            .map(|r| Reduction::pre_mul_sum(DataType::Float32, &(0.3f32 + r as f32).to_ne_bytes()).unwrap())
            .collect();
        let ops = [
            vec![Reduction::builtin(DataType::Float32, BuiltinOp::Sum, n); n],
            vec![Reduction::builtin(DataType::Float32, BuiltinOp::Avg, n); n],
            pre_mul,
        ];
        // (me, ranks reached only by kernel copies (of this very process)): input 0 remote or
        // not, me first, in the middle and last, every peer remote.
        let cases: [(usize, &[usize]); 4] = [(2, &[1, 3]), (4, &[0, 3]), (0, &[1, 2, 3, 4]), (3, &[0, 1, 2, 4])];
        for (me, remote) in cases {
            let inputs: Vec<PeerBuf> = buffers
                .iter()
                .enumerate()
                .map(|(r, b)| {
                    if remote.contains(&r) {
                        PeerBuf::Remote { pid, addr: b.as_ptr() as u64 }
                    } else {
                        PeerBuf::Direct(b.as_ptr() as *mut u8)
                    }
                })
                .collect();
            for len in [0, 4, 4 * 1023, 4 * floats] {
                for reductions in &ops {
                    let mut expected = vec![0u8; len];
                    let mut want_staging = vec![0u8; len + peer_mem::PAGE_MATCH_SLACK];
                    // SAFETY: every buffer holds off + len bytes and nothing writes them meanwhile.
                    unsafe { fold_inputs(&direct, reductions, off, &mut expected, &mut want_staging).unwrap() };
                    let stride = (len + peer_mem::PAGE_MATCH_SLACK).next_multiple_of(8);
                    let mut room = vec![0u8; remote.len() * stride];
                    let gathered = gather_remote_inputs(&inputs, me, off, len, &mut room, stride).unwrap();
                    assert!(gathered.iter().all(|g| matches!(g, PeerBuf::Direct(_))));
                    let mut got = vec![0u8; len];
                    // SAFETY: the gathered inputs lie in `room`, untouched since, the others
                    // in the buffers as above.
                    unsafe { fold_inputs(&gathered, reductions, 0, &mut got, &mut []).unwrap() };
                    assert_eq!(got, expected, "me {me}, remote {remote:?}, {len} bytes, {:?}", reductions[1]);
                }
            }
        }
        // Rank 2 of 5 reads rank 3 first and rank 1 last: at every turn the ranks read from
        // different owners.
        let order = |me: usize| {
            let mut ranks: Vec<usize> = (0..n).filter(|&r| r != me).collect();
            ranks.sort_by_key(|&r| read_turn(r, me, n));
            ranks
        };
        assert_eq!(order(2), [3, 4, 0, 1]);
        for turn in 0..n - 1 {
            let owners: std::collections::BTreeSet<usize> = (0..n).map(|me| order(me)[turn]).collect();
            assert_eq!(owners.len(), n, "turn {turn}");
        }
        assert!(gathers_remote_inputs(3, 256 << 10));
        assert!(!gathers_remote_inputs(2, 1024), "two ranks fold as they read");
        assert!(!gathers_remote_inputs(16, 128 << 10), "more than a core's L2 cache");
    }

    #[test]
    fn in_place_buffers_count_once_for_kernel_copies() {
        assert_eq!(kernel_copy_ranges(Some((100, 50)), Some((100, 50))), vec![(100, 50)]);
        assert_eq!(kernel_copy_ranges(Some((120, 10)), Some((100, 50))), vec![(100, 50)]);
        assert_eq!(kernel_copy_ranges(Some((100, 50)), Some((150, 50))), vec![(100, 50), (150, 50)]);
        assert_eq!(kernel_copy_ranges(Some((100, 50)), Some((300, 0))), vec![(100, 50)]);
        assert_eq!(kernel_copy_ranges(None, Some((300, 8))), vec![(300, 8)]);
    }

    /// Every byte range of a small ring slot lands in that slot's granules, nowhere else, and
    /// comes back whole; neighbouring slots' bytes stay as they were.
    #[test]
    fn small_ring_slots_interleave_without_overlap() {
        use crate::transport::node_area::SMALL_RING_RANK_BYTES;
        let depth = RING_DEPTH as usize;
        let mut region = vec![0u8; SMALL_RING_RANK_BYTES];
        let base = region.as_mut_ptr();
        for k in [0, 1, depth / 2, depth - 1] {
            for (at, len) in [(0, 1), (0, SMALL_RING_BYTES), (5, 200), (127, 2), (256, 256), (384, 1)] {
                region.fill(0xEE);
                let data: Vec<u8> = (0..len).map(|i| (i * 7 + k) as u8).collect();
                let slot = base.wrapping_add(k * RING_GRANULE);
                for (p, r) in ring_pieces(slot, at, len) {
                    // SAFETY: inside `region` (at + len <= SMALL_RING_BYTES, slot k < depth).
                    unsafe { std::ptr::copy_nonoverlapping(data[r.clone()].as_ptr(), p, r.len()) };
                }
                let mut back = vec![0u8; len];
                // SAFETY: as above; `back` holds len bytes.
                unsafe { ring_gather(slot, at, back.as_mut_ptr(), len) };
                assert_eq!(back, data, "slot {k} at {at} len {len}");
                let written = region.iter().filter(|&&b| b != 0xEE).count();
                let expected = data.iter().filter(|&&b| b != 0xEE).count();
                assert_eq!(written, expected, "slot {k} at {at} len {len} wrote elsewhere");
                for (off, &b) in region.iter().enumerate() {
                    let (granule, within) = (off / RING_STRIDE, off % RING_STRIDE);
                    let mine = within / RING_GRANULE == k;
                    let pos = granule * RING_GRANULE + within % RING_GRANULE;
                    if !(mine && (at..at + len).contains(&pos)) {
                        assert_eq!(b, 0xEE, "slot {k} at {at} len {len}: byte {off} changed");
                    }
                }
            }
        }
    }

    /// Every one-shot collective at the sizes around the small ring slots' edges (tiny, small
    /// ring, 4 KiB ring; granule boundaries), in and out of place, at 2-4 ranks, bit for bit:
    /// PreMulSum all-reduce (scaled per granule), int8 all-reduce, all-gather, gather and
    /// broadcast from every root (reduce-scatter: reduce_scatter_folds_in_rank_order_...).
    #[test]
    fn one_shot_collectives_are_exact_around_the_small_ring_slots() {
        use crate::transport::node_area::{areas_for_threads_with, SLOT_BYTES, SMALL_RING_BYTES, TINY_BYTES};
        use crate::types::{BuiltinOp, DataType};
        for n in [2usize, 3, 4] {
            on_rank_threads(areas_for_threads_with(n, SLOT_BYTES, false), move |me, mut area| {
                let mut scratch = Vec::new();
                let mut k = 0u64;
                // One operation, driven to completion on this rank's thread.
                let mut exec = |coll: NodeColl, send: *const u8, recv: *mut u8, bytes: usize| {
                    let mut op = NodeOp::new(coll, NodeAlgo::OneShot, send, recv, bytes, OpSig::NONE);
                    while !op.is_done() {
                        op.progress(&mut area, &mut scratch).unwrap();
                    }
                };
                // f32 PreMulSum: all-reduce and reduce-scatter; per-element bit exact.
                let value = |r: usize, i: usize, k: u64| {
                    ((i * 7 + k as usize * 13 + r * 5) % 101) as f32 * 0.37 + 1.0 / (r + 1) as f32
                };
                let scalar = |r: usize| 1.0f32 + 0.1 * r as f32;
                // Around each class boundary and granule edge (whole f32s).
                let f32_sizes = [4, 108, 112, 116, 124, 128, 132, 252, 256, 260, 380, 508, 512, 516, 1020, 1024];
                for bytes in f32_sizes {
                    let count = bytes / 4;
                    for in_place in [false, true] {
                        k += 1;
                        let red = Reduction::pre_mul_sum(DataType::Float32, &scalar(me).to_ne_bytes()).unwrap();
                        // all-reduce
                        let input: Vec<f32> = (0..count).map(|i| value(me, i, k)).collect();
                        let want: Vec<u32> = (0..count)
                            .map(|i| {
                                let t = |r: usize| value(r, i, k) * scalar(r);
                                (1..n).fold(t(0), |a, r| a + t(r)).to_bits()
                            })
                            .collect();
                        let mut out = if in_place { input.clone() } else { vec![f32::NAN; count] };
                        let send = if in_place { out.as_ptr() } else { input.as_ptr() } as *const u8;
                        exec(NodeColl::AllReduce(red), send, out.as_mut_ptr().cast(), bytes);
                        let got: Vec<u32> = out.iter().map(|v| v.to_bits()).collect();
                        assert!(got == want, "AR n {n} rank {me} bytes {bytes} in place {in_place}");
                    }
                }
                // Bytes: int8 sum all-reduce, all-gather, gather, broadcast at every length.
                let bv = |r: usize, i: usize, k: u64| (i as u64 * 31 + r as u64 * 7 + k * 3) as u8;
                let sum = Reduction::builtin(DataType::Int8, BuiltinOp::Sum, n);
                let byte_sizes = (TINY_BYTES - 2..=TINY_BYTES + 2)
                    .chain([127, 128, 129, 200, 255, 256, 257, 301, 383, 384, 385])
                    .chain(SMALL_RING_BYTES - 2..=SMALL_RING_BYTES + 2);
                for bytes in byte_sizes {
                    for in_place in [false, true] {
                        k += 1;
                        let input: Vec<u8> = (0..bytes).map(|i| bv(me, i, k)).collect();
                        let want: Vec<u8> =
                            (0..bytes).map(|i| (0..n).fold(0u8, |a, r| a.wrapping_add(bv(r, i, k)))).collect();
                        let mut out = if in_place { input.clone() } else { vec![0xAA; bytes] };
                        let send = if in_place { out.as_ptr() } else { input.as_ptr() };
                        exec(NodeColl::AllReduce(sum), send, out.as_mut_ptr(), bytes);
                        assert!(out == want, "AR8 n {n} rank {me} bytes {bytes}");
                        // all-gather
                        k += 1;
                        let input: Vec<u8> = (0..bytes).map(|i| bv(me, i, k)).collect();
                        let want: Vec<u8> = (0..n).flat_map(|r| (0..bytes).map(move |i| bv(r, i, k))).collect();
                        let mut out = vec![0xAA; n * bytes + 1];
                        if in_place {
                            out[me * bytes..(me + 1) * bytes].copy_from_slice(&input);
                        }
                        let send = if in_place { out[me * bytes..].as_ptr() } else { input.as_ptr() };
                        exec(NodeColl::AllGather, send, out.as_mut_ptr(), bytes);
                        assert!(
                            out[..n * bytes] == want[..] && out[n * bytes] == 0xAA,
                            "AG n {n} rank {me} bytes {bytes}"
                        );
                        for root in 0..n {
                            // broadcast
                            k += 1;
                            let input: Vec<u8> = (0..bytes).map(|i| bv(me, i, k)).collect();
                            let want: Vec<u8> = (0..bytes).map(|i| bv(root, i, k)).collect();
                            let mut out = if in_place && me == root { input.clone() } else { vec![0xAA; bytes] };
                            let send = if in_place || me != root { out.as_ptr() } else { input.as_ptr() };
                            exec(NodeColl::Broadcast { root }, send, out.as_mut_ptr(), bytes);
                            assert!(out == want, "BC n {n} rank {me} root {root} bytes {bytes}");
                            // gather
                            k += 1;
                            let input: Vec<u8> = (0..bytes).map(|i| bv(me, i, k)).collect();
                            let mut out = vec![0xAA; if me == root { n * bytes } else { 0 }];
                            if in_place && me == root {
                                out[me * bytes..(me + 1) * bytes].copy_from_slice(&input);
                            }
                            let send = if in_place && me == root { out[me * bytes..].as_ptr() } else { input.as_ptr() };
                            exec(NodeColl::Gather { root }, send, out.as_mut_ptr(), bytes);
                            if me == root {
                                let want: Vec<u8> = (0..n).flat_map(|r| (0..bytes).map(move |i| bv(r, i, k))).collect();
                                assert!(out == want, "GA n {n} rank {me} root {root} bytes {bytes}");
                            }
                        }
                    }
                }
            });
        }
    }

    #[test]
    fn slices_cover_the_message_once_in_whole_elements() {
        for &(bytes, elem, n) in &[(1000usize, 4usize, 3usize), (64, 8, 4), (1 << 20, 2, 16), (12, 4, 5)] {
            let mut next = 0;
            for r in 0..n {
                let (lo, hi) = slice_of(bytes, elem, r, n);
                assert_eq!(lo, next, "contiguous");
                assert!(hi >= lo && lo % elem == 0 && hi % elem == 0 || hi == bytes);
                next = hi;
            }
            assert_eq!(next, bytes);
        }
    }

    /// A one-shot all-reduce that rank 2 never joins: the waiting ranks name only rank 2,
    /// and their view of the area's progress moves exactly when a peer advances.
    #[test]
    fn waiting_ranks_and_progress_marks_of_a_stalled_operation() {
        use crate::transport::node_area::areas_for_threads;
        use crate::types::{BuiltinOp, DataType};
        let mut areas = areas_for_threads(3);
        let red = Reduction::builtin(DataType::Int64, BuiltinOp::Sum, 3);
        for tiny in [true, false] {
            let count = if tiny { 2 } else { 64 };
            let send: Vec<i64> = vec![1; count];
            let mut recv0: Vec<i64> = vec![0; count];
            let mut recv1: Vec<i64> = vec![0; count];
            let (mut a, mut b) = (Vec::new(), Vec::new());
            let mut op0 = NodeOp::new(
                NodeColl::AllReduce(red),
                NodeAlgo::OneShot,
                send.as_ptr().cast(),
                recv0.as_mut_ptr().cast(),
                count * 8,
                OpSig::NONE,
            );
            let mut op1 = NodeOp::new(
                NodeColl::AllReduce(red),
                NodeAlgo::OneShot,
                send.as_ptr().cast(),
                recv1.as_mut_ptr().cast(),
                count * 8,
                OpSig::NONE,
            );
            let before = areas[0].progress_mark();
            op0.progress(&mut areas[0], &mut a).unwrap();
            let after_own = areas[0].progress_mark();
            assert_ne!(after_own, before, "tiny {tiny}: posting moves the mark");
            assert_eq!(op0.waiting_for(&areas[0]), vec![1, 2], "tiny {tiny}");
            op1.progress(&mut areas[1], &mut b).unwrap();
            assert_ne!(areas[0].progress_mark(), after_own, "tiny {tiny}: rank 1's post is progress for rank 0");
            assert_eq!(op0.waiting_for(&areas[0]), vec![2], "tiny {tiny}");
            let still = areas[0].progress_mark();
            for _ in 0..100 {
                assert!(!op0.progress(&mut areas[0], &mut a).unwrap());
            }
            assert_eq!(areas[0].progress_mark(), still, "tiny {tiny}: nothing moved, the mark must not");
            // Let rank 2 catch up so the next round starts level.
            let mut recv2: Vec<i64> = vec![0; count];
            let mut op2 = NodeOp::new(
                NodeColl::AllReduce(red),
                NodeAlgo::OneShot,
                send.as_ptr().cast(),
                recv2.as_mut_ptr().cast(),
                count * 8,
                OpSig::NONE,
            );
            let mut c = Vec::new();
            while !(op0.is_done() && op1.is_done() && op2.is_done()) {
                op2.progress(&mut areas[2], &mut c).unwrap();
                op0.progress(&mut areas[0], &mut a).unwrap();
                op1.progress(&mut areas[1], &mut b).unwrap();
            }
            assert!(op0.waiting_for(&areas[0]).is_empty());
            assert!(recv0.iter().chain(&recv1).chain(&recv2).all(|&v| v == 3), "tiny {tiny}");
        }
    }

    /// Three ranks (threads) run one stream of node collectives through every path: tiny
    /// and small-slot one-shot and direct all-reduces (each rank scaling its input by its own
    /// PreMulSum scalar), all-gathers, broadcasts from every root, in and out of place,
    /// and reduce-scatters (PreMulSum), interleaved so that each kind follows each other.
    /// Integer results are exact whatever the order of the terms.
    #[test]
    fn mixed_stream_of_node_collectives_is_exact() {
        mixed_stream(crate::transport::node_area::areas_for_threads(3), |_| STAGE_MAX, |_| usize::MAX);
        // Every direct all-gather by relay.
        mixed_stream(crate::transport::node_area::areas_for_threads(3), |_| STAGE_MAX, |_| 0);
    }

    /// The same stream with buffers that peers cannot map (ranks as if in separate
    /// processes), through the smallest slots (many rounds per message): rank 0 never stages
    /// (peers read its memory in place, as they would ncclMemAlloc memory), rank 1 stages up
    /// to 4 KiB, rank 2 at every size, so every operation mixes staged and direct ranks.
    #[test]
    fn mixed_stream_through_slots_is_exact() {
        use crate::transport::node_area::{areas_for_threads_with, SMALL_BYTES};
        let areas = areas_for_threads_with(3, SMALL_BYTES, true);
        // Rank 2 stages at every size, so no all-gather relays: all fall back to the pull.
        mixed_stream(areas, |r| [0, 4096, STAGE_MAX][r], |_| 0);

        // Every rank staged, one slot a multiple of the pieces, one not, and one larger than
        // an all-reduce round (ROUND_SLICE per rank).
        for slot in [SMALL_BYTES, 5 * 4096, crate::transport::node_area::SLOT_BYTES] {
            mixed_stream(areas_for_threads_with(3, slot, true), |_| STAGE_MAX, |_| usize::MAX);
        }
    }

    /// The same stream with the buffers reached by kernel copies (process_vm_readv/writev, as
    /// between processes with malloc'd buffers): every rank at every size, then rank 1
    /// staging up to 4 KiB and rank 2 at every size while rank 0's buffers are read remotely.
    #[test]
    fn mixed_stream_by_kernel_copies_is_exact() {
        use crate::transport::node_area::{areas_for_threads_by_kernel_copies, SLOT_BYTES, SMALL_BYTES};
        mixed_stream(areas_for_threads_by_kernel_copies(3, SLOT_BYTES), |_| 0, |_| usize::MAX);
        mixed_stream(areas_for_threads_by_kernel_copies(3, SMALL_BYTES), |r| [0, 4096, STAGE_MAX][r], |_| usize::MAX);
        // Direct all-gathers by relay; then rank 1 declining it, so that none relays.
        mixed_stream(areas_for_threads_by_kernel_copies(3, SLOT_BYTES), |_| 0, |_| 0);
        mixed_stream(areas_for_threads_by_kernel_copies(3, SLOT_BYTES), |_| 0, |r| [0, usize::MAX, 0][r]);
    }

    /// All-gathers by relay, in and out of place, with buffers peers map (ranks in one process,
    /// or ncclMemAlloc memory) and reached by kernel copies: every block lands, and a relay
    /// takes a step per rank (its operation numbers advance by nranks, a pull's by one) unless
    /// one rank does not offer it, or its buffers are not of the kind its sizes name.
    #[test]
    fn relayed_all_gathers_are_exact() {
        use crate::transport::node_area::{areas_for_threads, areas_for_threads_by_kernel_copies, SLOT_BYTES};
        for (n, by_kernel_copies) in [(3, false), (5, false), (4, true)] {
            // Sizes for the other kind of buffers only: a pull (in the last all-gather).
            let other_kind = if by_kernel_copies {
                RelaySizes { mapped: (0, usize::MAX), unmapped: RelaySizes::NEVER.unmapped }
            } else {
                RelaySizes { mapped: RelaySizes::NEVER.mapped, unmapped: (0, usize::MAX) }
            };
            let areas =
                if by_kernel_copies { areas_for_threads_by_kernel_copies(n, SLOT_BYTES) } else { areas_for_threads(n) };
            on_rank_threads(areas, move |me, mut area| {
                let mut scratch = Vec::new();
                let mut last_seq = None;
                for (k, count) in [1usize, 1000, 70_000, 3, 5000, 600].into_iter().enumerate() {
                    let in_place = k % 2 == 1;
                    // Rank 1 declines the fifth (as if its FERROCCL_NODE_RELAY_MIN differed).
                    let declines = k == 4 && me == 1;
                    let sizes = match k {
                        5 => other_kind,
                        _ if declines => RelaySizes::NEVER,
                        _ => RelaySizes::from_min(0),
                    };
                    let value = |r: usize, i: usize| (k * 1_000_000 + r * 100_000 + i) as i64;
                    let input: Vec<i64> = (0..count).map(|i| value(me, i)).collect();
                    let mut out = vec![-1i64; n * count];
                    if in_place {
                        out[me * count..(me + 1) * count].copy_from_slice(&input);
                    }
                    let send = if in_place { out[me * count..].as_ptr() } else { input.as_ptr() };
                    let mut op = NodeOp::new(
                        NodeColl::AllGather,
                        NodeAlgo::Direct,
                        send.cast(),
                        out.as_mut_ptr().cast(),
                        count * 8,
                        OpSig::NONE,
                    )
                    .with_stage_max(0)
                    .with_relay_sizes(sizes);
                    while !op.is_done() {
                        op.progress(&mut area, &mut scratch).unwrap();
                    }
                    let wrong = (0..n * count).find(|&j| out[j] != value(j / count, j % count));
                    assert_eq!(wrong, None, "rank {me}, all-gather {k} of {n} x {count}");
                    if let Some(last) = last_seq {
                        let steps = if k >= 4 { 1 } else { n as u64 };
                        assert_eq!(op.seq - last, steps, "rank {me}, all-gather {k}: operation numbers used");
                    }
                    last_seq = Some(op.seq);
                }
            });
        }
    }

    #[test]
    fn staggered_pieces_cover_the_message_once_from_each_rank_s_share() {
        for len in [1, STAGGER_PIECE - 1, STAGGER_PIECE, 8 * STAGGER_PIECE + 5, 33 * STAGGER_PIECE] {
            for n in [1, 9, 16] {
                for me in 0..n {
                    let pieces: Vec<_> = staggered_pieces(len, me, n).collect();
                    let mut covered = vec![0u8; len];
                    pieces.iter().flat_map(|p| p.clone()).for_each(|i| covered[i] += 1);
                    assert!(covered.iter().all(|&c| c == 1), "len {len}, rank {me} of {n}");
                    let count = len.div_ceil(STAGGER_PIECE);
                    assert_eq!(pieces[0].start, me * count / n * STAGGER_PIECE, "len {len}, rank {me} of {n}");
                }
            }
        }
    }

    /// A broadcast root at 3-8 ranks passes a 2 MiB buffer through its slot while its pages
    /// are 4 KiB ones, and lets its receivers' kernel copies read it once the buffer was
    /// collapsed into huge pages on its asking (skipped, saying why, where the kernel has none
    /// to give). At 16 ranks the size alone decides.
    #[test]
    fn broadcast_roots_stage_buffers_off_huge_pages() {
        use crate::transport::node_area::{areas_for_threads_by_kernel_copies, SLOT_BYTES};
        let bytes = 2 << 20;
        let coll = NodeColl::Broadcast { root: 0 };
        let (max, off_huge) = (default_stage_max(&coll, 3, false), default_stage_off_huge_max(&coll, 3, false, false));
        assert!(max < bytes && bytes <= off_huge);
        assert_eq!(default_stage_off_huge_max(&coll, 16, false, true), default_stage_max(&coll, 16, false));
        let staged = |send: *const u8| {
            let mut areas = areas_for_threads_by_kernel_copies(3, SLOT_BYTES);
            let mut out = vec![0u8; bytes];
            let mut op = NodeOp::new(coll, NodeAlgo::Direct, send, out.as_mut_ptr(), bytes, OpSig::NONE)
                .with_stage_max(max)
                .with_stage_off_huge_max(off_huge);
            op.progress(&mut areas[0], &mut Vec::new()).unwrap();
            assert!(op.phase != Phase::Start, "the root published");
            op.stage_send
        };
        // A buffer the record does not know as huge (a freed one it collapsed for another test
        // may come back at the same address: kept alive, the next allocation lands elsewhere).
        let mut held = Vec::new();
        let plain = loop {
            let v = vec![7u8; bytes];
            if !huge_pages::on_huge_pages(v.as_ptr() as usize, bytes) {
                break v;
            }
            assert!(held.len() < 16, "no 4 KiB-page buffer found");
            held.push(v);
        };
        assert!(staged(plain.as_ptr()), "a 4 KiB-page buffer went by kernel copies");
        let huge = CollapsedRegion::new(7);
        if huge.on_huge_pages(bytes) {
            assert!(!staged(huge.0), "a buffer on huge pages went through the slot");
            assert!(staged(plain.as_ptr()), "the 4 KiB-page buffer still does");
        } else {
            eprintln!("huge pages not to be had here: only the 4 KiB-page case checked");
        }
    }

    /// Ranks sharing cores pass every collective's 4 KiB-page buffers through their slots up
    /// to [`OVERSUBSCRIBED_OFF_HUGE_MAX`] and leave larger ones to kernel copies; ranks with a
    /// core each keep the all-reduce's size limit alone.
    #[test]
    fn ranks_sharing_cores_stage_buffers_off_huge_pages() {
        use crate::transport::node_area::{areas_for_threads_by_kernel_copies, SLOT_BYTES};
        use crate::types::{BuiltinOp, DataType};
        let colls = [
            NodeColl::AllReduce(Reduction::builtin(DataType::Float32, BuiltinOp::Sum, 4)),
            NodeColl::ReduceScatter(Reduction::builtin(DataType::Float32, BuiltinOp::Sum, 4)),
            NodeColl::AllGather,
            NodeColl::Broadcast { root: 0 },
        ];
        for coll in colls {
            let (max, off_huge) =
                (default_stage_max(&coll, 4, true), default_stage_off_huge_max(&coll, 4, true, false));
            assert!(max < OVERSUBSCRIBED_OFF_HUGE_MAX && off_huge == OVERSUBSCRIBED_OFF_HUGE_MAX, "{coll:?}");
        }
        let coll = colls[0];
        assert_eq!(default_stage_off_huge_max(&coll, 4, false, true), default_stage_max(&coll, 4, false));
        // Rank 0's choice for its send buffer of an all-reduce of `bytes`, with the limits of
        // ranks sharing cores.
        let staged = |send: *const u8, bytes: usize| {
            let mut areas = areas_for_threads_by_kernel_copies(2, SLOT_BYTES);
            let mut out = vec![0u8; bytes];
            let mut op = NodeOp::new(coll, NodeAlgo::Direct, send, out.as_mut_ptr(), bytes, OpSig::NONE)
                .with_stage_max(default_stage_max(&coll, 2, true))
                .with_stage_off_huge_max(default_stage_off_huge_max(&coll, 2, true, false));
            op.progress(&mut areas[0], &mut Vec::new()).unwrap();
            assert!(op.phase != Phase::Start, "rank 0 published");
            op.stage_send
        };
        let plain = vec![1u8; 2 * OVERSUBSCRIBED_OFF_HUGE_MAX];
        for bytes in [256 << 10, OVERSUBSCRIBED_OFF_HUGE_MAX] {
            // (Unless another test collapsed this address range for itself meanwhile.)
            assert!(
                staged(plain.as_ptr(), bytes) || huge_pages::on_huge_pages(plain.as_ptr() as usize, bytes),
                "{bytes} bytes on 4 KiB pages went by kernel copies"
            );
        }
        assert!(
            !staged(plain.as_ptr(), 2 * OVERSUBSCRIBED_OFF_HUGE_MAX),
            "a message above the limit went through the slot"
        );
    }

    /// An all-reduce whose rank 0 passes its send buffer (4 KiB pages) through its slot while
    /// its receive buffer (collapsed into a huge page) is written by kernel copies, as the
    /// off-huge rule decides per buffer; rank 1 passes both of its buffers through its slot.
    /// Both ranks get the exact sums. (Skipped, saying why, where the kernel has no huge page to give.)
    #[test]
    fn all_reduce_with_one_buffer_staged_and_the_other_not_is_exact() {
        use crate::transport::node_area::{areas_for_threads_by_kernel_copies, SLOT_BYTES};
        use crate::types::{BuiltinOp, DataType};
        let bytes = 1 << 20;
        let count = bytes / 8;
        let huge = CollapsedRegion::new(0);
        if !huge.on_huge_pages(bytes) {
            eprintln!("huge pages not to be had here: the mixed case cannot be set up");
            return;
        }
        let input_of =
            move |r: usize| -> Vec<i64> { (0..count).map(|i| (i as i64 % 977) * (r as i64 + 1) - 5).collect() };
        let want: Vec<i64> = input_of(0).iter().zip(input_of(1)).map(|(a, b)| a + b).collect();
        let huge_addr = huge.0 as usize;
        let staged_flags = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let flags = staged_flags.clone();
        on_rank_threads(areas_for_threads_by_kernel_copies(2, SLOT_BYTES), move |me, mut area| {
            let red = Reduction::builtin(DataType::Int64, BuiltinOp::Sum, 2);
            let input = input_of(me);
            // Rank 0 receives into the huge page, rank 1 into a plain vector.
            let mut plain_out = vec![-1i64; count];
            let recv = if me == 0 { huge_addr as *mut u8 } else { plain_out.as_mut_ptr() as *mut u8 };
            let mut op = NodeOp::new(
                NodeColl::AllReduce(red),
                NodeAlgo::Direct,
                input.as_ptr() as *const u8,
                recv,
                bytes,
                OpSig::NONE,
            )
            .with_stage_max(128 << 10)
            .with_stage_off_huge_max(2 << 20);
            let mut scratch = Vec::new();
            while !op.is_done() {
                op.progress(&mut area, &mut scratch).unwrap();
            }
            // SAFETY: `recv` holds `count` i64 results (rank 0's huge page outlives the threads).
            let got = unsafe { std::slice::from_raw_parts(recv as *const i64, count) };
            if let Some(i) = (0..count).find(|&i| got[i] != want[i]) {
                panic!("rank {me}: element {i} is {} not {}", got[i], want[i]);
            }
            // (A freed buffer another test had collapsed may come back at one of these
            // addresses: each buffer is staged exactly when the record does not know it huge.)
            let huge = |p: *const u8| huge_pages::on_huge_pages(p as usize, bytes);
            flags.lock().unwrap().push((
                me,
                op.stage_send,
                !huge(input.as_ptr() as *const u8),
                op.stage_recv,
                !huge(recv),
            ));
        });
        let flags = staged_flags.lock().unwrap().clone();
        assert_eq!(flags.len(), 2);
        for (me, send_staged, send_plain, recv_staged, recv_plain) in flags {
            assert_eq!((send_staged, recv_staged), (send_plain, recv_plain), "rank {me}: (send, receive) staged");
            if me == 0 {
                assert!(!recv_staged, "rank 0's receive buffer is on a huge page");
            }
        }
    }

    /// Two ranks with a core each stage 4 KiB-page buffers of all-reduces (up to 2 MiB) and
    /// reduce-scatters (up to 256 KiB) only where kernel copies of such pages are slow; the
    /// other collectives, and every collective where they are not, keep their size limits.
    #[test]
    fn two_ranks_stage_off_huge_pages_only_where_kernel_copies_are_slow() {
        use crate::types::{BuiltinOp, DataType};
        let red = Reduction::builtin(DataType::Float32, BuiltinOp::Sum, 2);
        let (ar, rs) = (NodeColl::AllReduce(red), NodeColl::ReduceScatter(red));
        assert_eq!(default_stage_off_huge_max(&ar, 2, false, true), 2 << 20);
        assert_eq!(default_stage_off_huge_max(&rs, 2, false, true), 256 << 10);
        for coll in [ar, rs, NodeColl::AllGather, NodeColl::Broadcast { root: 1 }] {
            let max = default_stage_max(&coll, 2, false);
            assert_eq!(default_stage_off_huge_max(&coll, 2, false, false), max, "{coll:?}");
            assert!(default_stage_off_huge_max(&coll, 2, false, true) >= max, "{coll:?}");
        }
        for coll in [NodeColl::AllGather, NodeColl::Broadcast { root: 1 }] {
            assert_eq!(default_stage_off_huge_max(&coll, 2, false, true), default_stage_max(&coll, 2, false));
        }
    }

    /// Broadcasts by kernel copies at [`STAGGER_MIN_RANKS`] ranks (as processes, nothing
    /// staged): every receiver reads the root's buffer in staggered pieces, and gets it exactly,
    /// from every root, in and out of place.
    #[test]
    fn staggered_kernel_copy_broadcasts_are_exact() {
        use crate::transport::node_area::{areas_for_threads_by_kernel_copies, SLOT_BYTES};
        let n = STAGGER_MIN_RANKS;
        let count = (3 * STAGGER_PIECE + 1000) / 8;
        on_rank_threads(areas_for_threads_by_kernel_copies(n, SLOT_BYTES), move |me, mut area| {
            let mut scratch = Vec::new();
            // Checked after the last broadcast: a rank that stopped early would hang the others.
            let mut wrong_roots = Vec::new();
            for (k, root) in [0, n - 1, 4].into_iter().enumerate() {
                let value = |i: usize| (k * 10_000_000 + root * 100_000 + i) as i64;
                let input: Vec<i64> = (0..count).map(value).collect();
                let mut out = if me == root { input.clone() } else { vec![-1i64; count] };
                let in_place = k == 1;
                let send = if me != root {
                    std::ptr::null()
                } else if in_place {
                    out.as_ptr()
                } else {
                    input.as_ptr()
                };
                let mut op = NodeOp::new(
                    NodeColl::Broadcast { root },
                    NodeAlgo::Direct,
                    send.cast(),
                    out.as_mut_ptr().cast(),
                    count * 8,
                    OpSig::NONE,
                )
                .with_stage_max(0);
                while !op.is_done() {
                    op.progress(&mut area, &mut scratch).unwrap();
                }
                if !out.iter().enumerate().all(|(i, &v)| v == value(i)) {
                    wrong_roots.push(root);
                }
            }
            assert!(wrong_roots.is_empty(), "rank {me}: wrong data from roots {wrong_roots:?}");
        });
    }

    /// Reduce-scatters out of place and in place, one-shot and direct, through slots and not,
    /// with each rank's own PreMulSum scalar on f32 inputs: every rank's block has exactly
    /// the bits of the inputs folded in rank order (a rank's own block, which skips its
    /// slot out of place, included).
    #[test]
    fn reduce_scatter_folds_in_rank_order_in_and_out_of_place() {
        use crate::transport::node_area::{areas_for_threads_by_kernel_copies, areas_for_threads_with, SLOT_BYTES};
        use crate::types::DataType;
        let n = 3;
        let value =
            |r: usize, i: usize, k: usize| ((i * 7 + k * 13 + r * 5) % 101) as f32 * 0.37 + 1.0 / (r + 1) as f32;
        // Which ranks scale their input (PreMulSum): all, none, or all but rank 0 (whose input
        // then starts the fold in one pass with rank 1's, `start_fold`).
        let scaled = |variant: usize, r: usize| match variant {
            0 => true,
            1 => false,
            _ => r != 0,
        };
        let scalar = move |variant: usize, r: usize| if scaled(variant, r) { 1.0f32 + 0.1 * r as f32 } else { 1.0 };
        // Ranks as threads (buffers in reach), as processes through slots, as processes by
        // kernel copies (every input read and every output written remotely, the fold's
        // kernel-copy branches), and mixed: rank 1 through its slot, ranks 0 and 2 by kernel
        // copies, then rank 0 through its slot and the others by kernel copies.
        type StageRule = fn(usize) -> usize;
        let modes: [(&str, StageRule); 5] = [
            ("threads", |_| STAGE_MAX),
            ("slots", |_| STAGE_MAX),
            ("kernel copies", |_| 0),
            ("slot for rank 1", |r| if r == 1 { STAGE_MAX } else { 0 }),
            ("slot for rank 0", |r| if r == 0 { STAGE_MAX } else { 0 }),
        ];
        for (mode, (mode_name, stage_max)) in modes.into_iter().enumerate() {
            let areas = match mode {
                0 => areas_for_threads_with(n, SLOT_BYTES, false),
                1 => areas_for_threads_with(n, SLOT_BYTES, true),
                _ => areas_for_threads_by_kernel_copies(n, SLOT_BYTES),
            };
            on_rank_threads(areas, move |me, mut area| {
                let mut scratch = Vec::new();
                let mut k = 0;
                // 10, 21, 42: inputs of 120-504 B through the small ring slots; 43: 516 B, a ring slot.
                for count in [1usize, 3, 10, 12, 21, 42, 43, 100, 1000, 70_000, 300_000] {
                    for (variant, algo) in (0..3).flat_map(|v| [(v, NodeAlgo::OneShot), (v, NodeAlgo::Direct)]) {
                        if algo == NodeAlgo::OneShot && n * count * 4 > ONE_SHOT_INPUT_MAX {
                            continue;
                        }
                        let red = if scaled(variant, me) {
                            Reduction::pre_mul_sum(DataType::Float32, &scalar(variant, me).to_ne_bytes()).unwrap()
                        } else {
                            Reduction::builtin(DataType::Float32, crate::types::BuiltinOp::Sum, n)
                        };
                        for in_place in [false, true] {
                            k += 1;
                            let input: Vec<f32> = (0..n * count).map(|i| value(me, i, k)).collect();
                            let want: Vec<u32> = (0..count)
                                .map(|i| {
                                    let term = |r: usize| value(r, me * count + i, k) * scalar(variant, r);
                                    (1..n).fold(term(0), |acc, r| acc + term(r)).to_bits()
                                })
                                .collect();
                            let mut buf = input.clone();
                            let mut out = vec![f32::NAN; count];
                            let (send, recv) = if in_place {
                                (buf.as_ptr() as *const u8, buf[me * count..].as_mut_ptr() as *mut u8)
                            } else {
                                (input.as_ptr() as *const u8, out.as_mut_ptr() as *mut u8)
                            };
                            let coll = NodeColl::ReduceScatter(red);
                            let mut op = NodeOp::new(coll, algo, send, recv, count * 4, OpSig::NONE)
                                .with_stage_max(stage_max(me));
                            while !op.is_done() {
                                op.progress(&mut area, &mut scratch).unwrap();
                            }
                            let got = if in_place { &buf[me * count..(me + 1) * count] } else { &out[..] };
                            let got: Vec<u32> = got.iter().map(|v| v.to_bits()).collect();
                            assert!(
                                got == want,
                                "reduce-scatter: rank {me}, {count} elements, {algo:?}, scaled {variant}, in place \
                                 {in_place}, {mode_name}"
                            );
                            // The direct all-reduce folds the same way (`reduce_round`).
                            if algo != NodeAlgo::Direct {
                                continue;
                            }
                            k += 1;
                            let mut buf: Vec<f32> = (0..count).map(|i| value(me, i, k)).collect();
                            let input = buf.clone();
                            let want: Vec<u32> = (0..count)
                                .map(|i| {
                                    let term = |r: usize| value(r, i, k) * scalar(variant, r);
                                    (1..n).fold(term(0), |acc, r| acc + term(r)).to_bits()
                                })
                                .collect();
                            let mut out = vec![f32::NAN; count];
                            let (send, recv) = if in_place {
                                (buf.as_ptr() as *const u8, buf.as_mut_ptr() as *mut u8)
                            } else {
                                (input.as_ptr() as *const u8, out.as_mut_ptr() as *mut u8)
                            };
                            let mut op =
                                NodeOp::new(NodeColl::AllReduce(red), algo, send, recv, count * 4, OpSig::NONE)
                                    .with_stage_max(stage_max(me));
                            while !op.is_done() {
                                op.progress(&mut area, &mut scratch).unwrap();
                            }
                            let got = if in_place { &buf[..] } else { &out[..] };
                            let got: Vec<u32> = got.iter().map(|v| v.to_bits()).collect();
                            assert!(
                                got == want,
                                "all-reduce: rank {me}, {count} elements, scaled {variant}, in place {in_place}, \
                                 {mode_name}"
                            );
                        }
                    }
                }
            });
        }
    }

    fn mixed_stream(areas: Vec<NodeArea>, stage_max: fn(usize) -> usize, relay_min: fn(usize) -> usize) {
        use crate::types::DataType;
        let n = areas.len();
        // Elements (i64): tiny (<= 14: one or both lines of the slot), ring slots, small
        // slots, direct (several 64 KiB pieces per rank).
        let sizes = [1usize, 7, 8, 100, 2048, 1, 70_000, 5, 300_000, 2, 3, 5000, 1, 14, 15];
        let input_of = |r: usize, k: usize, count: usize| -> Vec<i64> {
            (0..count).map(|i| (i as i64 % 1000) * (r as i64 + 1) + k as i64).collect()
        };
        on_rank_threads(areas, move |me, mut area| {
            let mut scratch = Vec::new();
            for round in 0..3 {
                for (k, &count) in sizes.iter().enumerate() {
                    let k = k + round * sizes.len();
                    // Gathers are one-shot only.
                    let count = if k % 5 == 4 { count.min(ONE_SHOT_INPUT_MAX / 8) } else { count };
                    let bytes = count * 8;
                    let input = input_of(me, k, count);
                    let in_place = k % 2 == 1;
                    let (coll, algo, mut out, want): (NodeColl, NodeAlgo, Vec<i64>, Vec<i64>) = match k % 5 {
                        0 => {
                            let scalar = (me as i64 + 2).to_ne_bytes();
                            let red = Reduction::pre_mul_sum(DataType::Int64, &scalar).unwrap();
                            let all: Vec<Vec<i64>> = (0..n).map(|r| input_of(r, k, count)).collect();
                            let want = (0..count).map(|i| (0..n).map(|r| (r as i64 + 2) * all[r][i]).sum()).collect();
                            let algo = NodeAlgo::for_size(bytes, n, false, None).unwrap();
                            let out = if in_place { input.clone() } else { vec![-1; count] };
                            (NodeColl::AllReduce(red), algo, out, want)
                        }
                        1 => {
                            let mut out = vec![-1; n * count];
                            if in_place {
                                out[me * count..(me + 1) * count].copy_from_slice(&input);
                            }
                            let want = (0..n).flat_map(|r| input_of(r, k, count)).collect();
                            let algo = NodeAlgo::for_size(bytes, n, false, None).unwrap();
                            (NodeColl::AllGather, algo, out, want)
                        }
                        2 => {
                            let root = k % n;
                            let out = if in_place && me == root { input.clone() } else { vec![-1; count] };
                            let algo = NodeAlgo::for_size(bytes, n, false, None).unwrap();
                            (NodeColl::Broadcast { root }, algo, out, input_of(root, k, count))
                        }
                        4 => {
                            // Only the root receives (and may pass its block in place).
                            let root = (k / 5) % n;
                            let mut out = vec![-1; if me == root { n * count } else { 0 }];
                            if in_place && me == root {
                                out[me * count..(me + 1) * count].copy_from_slice(&input);
                            }
                            let want = if me == root {
                                (0..n).flat_map(|r| input_of(r, k, count)).collect()
                            } else {
                                Vec::new()
                            };
                            (NodeColl::Gather { root }, NodeAlgo::OneShot, out, want)
                        }
                        _ => {
                            // Each rank's input is n blocks; its result is the sum of block
                            // `me` of every input, scaled by the inputs' scalars.
                            let scalar = (me as i64 + 3).to_ne_bytes();
                            let red = Reduction::pre_mul_sum(DataType::Int64, &scalar).unwrap();
                            let all: Vec<Vec<i64>> = (0..n).map(|r| input_of(r, k, n * count)).collect();
                            let want = (0..count)
                                .map(|i| (0..n).map(|r| (r as i64 + 3) * all[r][me * count + i]).sum())
                                .collect();
                            let out = if in_place { input_of(me, k, n * count) } else { vec![-1; count] };
                            let algo = match NodeAlgo::for_size(bytes, n, false, None).unwrap() {
                                NodeAlgo::OneShot if n * bytes <= ONE_SHOT_INPUT_MAX => NodeAlgo::OneShot,
                                _ => NodeAlgo::Direct,
                            };
                            (NodeColl::ReduceScatter(red), algo, out, want)
                        }
                    };
                    let rs_input = input_of(me, k, n * count);
                    let send = match coll {
                        NodeColl::AllGather if in_place => out[me * count..].as_ptr(),
                        NodeColl::Gather { root } if in_place && root == me => out[me * count..].as_ptr(),
                        NodeColl::AllReduce(_) | NodeColl::Broadcast { .. } | NodeColl::ReduceScatter(_)
                            if in_place =>
                        {
                            out.as_ptr()
                        }
                        NodeColl::ReduceScatter(_) => rs_input.as_ptr(),
                        _ => input.as_ptr(),
                    } as *const u8;
                    // In-place reduce-scatter: the result is block `me` of the input.
                    let at = if matches!(coll, NodeColl::ReduceScatter(_)) && in_place { me * count } else { 0 };
                    let recv = out[at..].as_mut_ptr() as *mut u8;
                    let mut op = NodeOp::new(coll, algo, send, recv, bytes, OpSig::NONE)
                        .with_stage_max(stage_max(me))
                        .with_relay_sizes(RelaySizes::from_min(relay_min(me)));
                    while !op.is_done() {
                        op.progress(&mut area, &mut scratch).unwrap();
                    }
                    if let Some(i) = (0..want.len()).find(|&i| out[at + i] != want[i]) {
                        panic!(
                            "rank {me}, op {k} ({coll:?}, {count} elements, {algo:?}): element {i} is {} not {}",
                            out[at + i],
                            want[i]
                        );
                    }
                }
            }
        });
    }

    #[test]
    fn shared_copies_split_small_messages_in_halves_of_whole_pages() {
        assert_eq!(split_chunk(SPLIT_MIN), SPLIT_MIN / 2);
        assert_eq!(split_chunk(100_001), 53_248);
        assert_eq!(100_001_usize.div_ceil(split_chunk(100_001)), 2);
        assert_eq!(split_chunk(2 * SPLIT_CHUNK - 5), SPLIT_CHUNK);
        assert_eq!(split_chunk(2 * SPLIT_CHUNK), SPLIT_CHUNK);
        assert_eq!(split_chunk(64 << 20), SPLIT_CHUNK);
    }

    /// Two ranks that treat each other as separate processes broadcast buffers neither
    /// stages, so root and receiver share the copy by claimed chunks: every root, in and out
    /// of place, sizes that are no multiple of a chunk, back to back (the claim word is
    /// reused), and below the split size; each result must be exact.
    #[test]
    fn shared_broadcast_copy_is_exact() {
        use crate::transport::node_area::{areas_for_threads_with, SLOT_BYTES};
        let areas = areas_for_threads_with(2, SLOT_BYTES, true);
        let chunk = SPLIT_CHUNK;
        let sizes = [
            SPLIT_MIN,
            SPLIT_MIN + 1,
            100_001,
            5 * chunk + 3,
            1 << 22,
            2 * chunk - 5,
            3 * chunk - 1,
            SPLIT_MIN * 3 + 77,
        ];
        let input_of = |k: usize, len: usize| -> Vec<u8> { (0..len).map(|i| ((i * 31 + k * 7) % 251) as u8).collect() };
        on_rank_threads(areas, move |me, mut area| {
            let mut scratch = Vec::new();
            for (k, &len) in sizes.iter().cycle().take(4 * sizes.len()).enumerate() {
                let root = (k / 2) % 2;
                let in_place = k % 2 == 1;
                let input = input_of(k, len);
                let mut out = if in_place && me == root { input.clone() } else { vec![0xee; len] };
                let send = if in_place || me != root { out.as_ptr() } else { input.as_ptr() };
                let mut op = NodeOp::new(
                    NodeColl::Broadcast { root },
                    NodeAlgo::Direct,
                    send,
                    out.as_mut_ptr(),
                    len,
                    OpSig::NONE,
                )
                .with_stage_max(0);
                while !op.is_done() {
                    op.progress(&mut area, &mut scratch).unwrap();
                }
                if let Some(i) = (0..len).find(|&i| out[i] != input[i]) {
                    panic!("rank {me}, op {k} (root {root}, {len} bytes, in place {in_place}): byte {i} differs");
                }
            }
        });
    }

    /// A shared broadcast copy whose ranks were called with different sizes that the
    /// signatures do not tell apart (a digest collision, here no signature at all) fails both
    /// with ncclInvalidUsage before the root writes into the receiver's buffer.
    #[test]
    fn shared_broadcast_copy_refuses_different_sizes() {
        use crate::transport::node_area::{areas_for_threads_with, SLOT_BYTES};
        let mut areas = areas_for_threads_with(2, SLOT_BYTES, true);
        let lens = [SPLIT_MIN, SPLIT_MIN + 64];
        let input = vec![7u8; lens[1]];
        let mut outs = [vec![0u8; lens[1]], vec![0u8; lens[1]]];
        let mut ops: Vec<NodeOp> = (0..2)
            .map(|r| {
                let coll = NodeColl::Broadcast { root: 0 };
                NodeOp::new(coll, NodeAlgo::Direct, input.as_ptr(), outs[r].as_mut_ptr(), lens[r], OpSig::NONE)
                    .with_stage_max(0)
            })
            .collect();
        let mut scratch = Vec::new();
        let mut errs: [Option<Error>; 2] = [None, None];
        for _ in 0..1000 {
            for r in 0..2 {
                if errs[r].is_none() {
                    errs[r] = ops[r].progress(&mut areas[r], &mut scratch).err();
                }
            }
        }
        for (r, e) in errs.into_iter().enumerate() {
            let e = e.unwrap_or_else(|| panic!("rank {r} did not fail"));
            assert_eq!(e.code(), crate::error::ncclResult_t::ncclInvalidUsage, "rank {r}: {e}");
            assert!(e.to_string().contains("broadcast sizes differ"), "rank {r}: {e}");
        }
        assert!(outs[1].iter().all(|&b| b == 0), "nothing was copied");
    }

    /// Calls that differ fail both ranks with ncclInvalidUsage naming the difference: through
    /// tiny slots, small slots, direct and pull, and when the ranks chose different algorithms
    /// (which would otherwise wait for ever).
    #[test]
    fn mismatched_calls_are_refused() {
        use crate::transport::node_area::{areas_for_threads, areas_for_threads_with, SLOT_BYTES};
        use crate::types::{BuiltinOp, DataType};
        let red = Reduction::builtin(DataType::Int64, BuiltinOp::Sum, 2);
        let sig = |count: usize, root: usize| OpSig::new(1, 4, 1, root, count);
        // (algorithm, count, signature) of rank 0 and rank 1, and what the message must say (|-separated).
        type Side = (NodeColl, NodeAlgo, usize, OpSig);
        let cases: Vec<(Side, Side, &str)> = vec![
            (
                (NodeColl::AllReduce(red), NodeAlgo::OneShot, 2, sig(2, 0)),
                (NodeColl::AllReduce(red), NodeAlgo::OneShot, 2, OpSig::new(1, 4, 3, 0, 2)),
                "operator |sum on rank |max on rank ",
            ),
            (
                (NodeColl::AllReduce(red), NodeAlgo::OneShot, 64, sig(64, 0)),
                (NodeColl::AllReduce(red), NodeAlgo::OneShot, 64, sig(65, 0)),
                "counts differ|64 on rank |65 on rank ",
            ),
            (
                (NodeColl::AllReduce(red), NodeAlgo::Direct, 4096, sig(4096, 0)),
                (NodeColl::AllReduce(red), NodeAlgo::Direct, 4096, OpSig::new(1, 5, 1, 0, 4096)),
                "data type |int64 on rank |uint64 on rank ",
            ),
            // One-shot through ring slots (800 B) and data slots (8 KiB) announces its call
            // with its input: against each other, and against tiny slots.
            (
                (NodeColl::AllReduce(red), NodeAlgo::OneShot, 100, sig(100, 0)),
                (NodeColl::AllReduce(red), NodeAlgo::OneShot, 100, OpSig::new(1, 4, 3, 0, 100)),
                "operator |sum on rank |max on rank ",
            ),
            (
                (NodeColl::AllReduce(red), NodeAlgo::OneShot, 100, sig(100, 0)),
                (NodeColl::AllReduce(red), NodeAlgo::OneShot, 2, sig(2, 0)),
                "counts differ|100 on rank |2 on rank ",
            ),
            (
                (NodeColl::AllReduce(red), NodeAlgo::OneShot, 1024, sig(1024, 0)),
                (NodeColl::AllReduce(red), NodeAlgo::OneShot, 100, sig(100, 0)),
                "counts differ|1024 on rank |100 on rank ",
            ),
            (
                (NodeColl::AllReduce(red), NodeAlgo::OneShot, 2, sig(2, 0)),
                (NodeColl::AllReduce(red), NodeAlgo::Direct, 4096, sig(4096, 0)),
                // 4096's digest: its 12-bit groups 0x000 and 0x001 XORed.
                "counts differ|2 on rank |1 on rank ",
            ),
            (
                (NodeColl::Broadcast { root: 0 }, NodeAlgo::Direct, 4096, OpSig::new(2, 4, 0, 0, 4096)),
                (NodeColl::Broadcast { root: 1 }, NodeAlgo::Direct, 4096, OpSig::new(2, 4, 0, 1, 4096)),
                "root |0 on rank |1 on rank ",
            ),
            // The device path's per-call gather against a rank that passed host buffers, as
            // its root and as the other rank (both must be told).
            (
                (NodeColl::Gather { root: 0 }, NodeAlgo::OneShot, 25, OpSig::new(7, 0, 0, 0, 200).on_device()),
                (NodeColl::AllReduce(red), NodeAlgo::Direct, 4096, sig(4096, 0)),
                "device buffers on rank 0, host buffers on rank 1",
            ),
            (
                (NodeColl::AllReduce(red), NodeAlgo::OneShot, 25, sig(25, 0)),
                (NodeColl::Gather { root: 0 }, NodeAlgo::OneShot, 25, OpSig::new(7, 0, 0, 0, 200).on_device()),
                "host buffers on rank 0, device buffers on rank 1",
            ),
        ];
        // Broadcasts run twice: as threads (the root's buffer read in place) and as processes,
        // where the input goes through the root's slot and the root returns once every rank has
        // announced its call: a root mismatch leaves two roots, and both must be told.
        let runs = cases.into_iter().enumerate().flat_map(|(k, case)| {
            let twice = matches!(case.0 .0, NodeColl::Broadcast { .. });
            [(k, case, false)].into_iter().chain(twice.then_some((k, case, true)))
        });
        for (k, (a, b, want), as_processes) in runs {
            let mut areas =
                if as_processes { areas_for_threads_with(2, SLOT_BYTES, true) } else { areas_for_threads(2) };
            let send = vec![1i64; 4096];
            let (mut out0, mut out1) = (vec![0i64; 4096], vec![0i64; 4096]);
            let mut op0 = NodeOp::new(a.0, a.1, send.as_ptr().cast(), out0.as_mut_ptr().cast(), a.2 * 8, a.3);
            let mut op1 = NodeOp::new(b.0, b.1, send.as_ptr().cast(), out1.as_mut_ptr().cast(), b.2 * 8, b.3);
            let (mut s0, mut s1) = (Vec::new(), Vec::new());
            let (mut e0, mut e1) = (None, None);
            for _ in 0..100_000 {
                if e0.is_none() && !op0.is_done() {
                    e0 = op0.progress(&mut areas[0], &mut s0).err();
                }
                if e1.is_none() && !op1.is_done() {
                    e1 = op1.progress(&mut areas[1], &mut s1).err();
                }
                if (e0.is_some() || op0.is_done()) && (e1.is_some() || op1.is_done()) {
                    break;
                }
            }
            if [a.0, b.0].iter().any(|c| matches!(c, NodeColl::Gather { .. } | NodeColl::Broadcast { .. })) {
                assert!(e0.is_some() && e1.is_some(), "case {k}: only one rank saw the mismatch: {e0:?} {e1:?}");
            }
            let e = e0.or(e1).unwrap_or_else(|| panic!("case {k}: no rank saw the mismatch"));
            assert_eq!(e.code(), crate::error::ncclResult_t::ncclInvalidUsage, "case {k}: {e}");
            let msg = e.to_string();
            assert!(want.split('|').all(|w| msg.contains(w)), "case {k}: {msg} (expected {want})");
        }
    }

    /// A broadcast's root returns without waiting for its receivers: with the receivers
    /// idle it completes [`TINY_DEPTH`] one-shot broadcasts through tiny slots, [`RING_DEPTH`]
    /// through ring slots, small or not (two
    /// through the data slots), each reusing its send buffer at once, and the next one waits
    /// until a receiver has left the operation whose slot it needs. The receivers then get
    /// every value, none overwritten by a later one.
    #[test]
    fn broadcast_root_runs_ahead_until_a_slot_is_unconsumed() {
        use crate::transport::node_area::areas_for_threads;
        // Tiny (8 B), small ring (512 B), ring (800 B) and data slot (8000 B) inputs.
        for (count, ahead) in
            [(1usize, TINY_DEPTH as usize), (64, RING_DEPTH as usize), (100, RING_DEPTH as usize), (1000, 2)]
        {
            let mut areas = areas_for_threads(3);
            let mut scratch = Vec::new();
            let value = |k: usize, i: usize| (k * 1000 + i) as i64;
            let bcast = |send: *const u8, recv: *mut u8| {
                NodeOp::new(NodeColl::Broadcast { root: 1 }, NodeAlgo::OneShot, send, recv, count * 8, OpSig::NONE)
            };
            // The root: one send buffer, rewritten after every call; its outputs kept.
            let mut send = vec![0i64; count];
            let mut root_out = vec![vec![-1i64; count]; ahead + 1];
            for (k, out) in root_out.iter_mut().enumerate().take(ahead) {
                send.iter_mut().enumerate().for_each(|(i, v)| *v = value(k, i));
                let mut op = bcast(send.as_ptr().cast(), out.as_mut_ptr().cast());
                for _ in 0..3 {
                    op.progress(&mut areas[1], &mut scratch).unwrap();
                }
                assert!(op.is_done(), "{count} elements: the root waited at call {k} of {ahead}");
            }
            send.iter_mut().enumerate().for_each(|(i, v)| *v = value(ahead, i));
            let mut blocked = bcast(send.as_ptr().cast(), root_out[ahead].as_mut_ptr().cast());
            for _ in 0..1000 {
                blocked.progress(&mut areas[1], &mut scratch).unwrap();
            }
            assert!(!blocked.is_done(), "{count} elements: call {ahead} reused a slot nobody has left");
            assert_eq!(blocked.waiting_for(&areas[1]), vec![0, 2], "{count} elements");
            // Receivers catch up one operation at a time; the root's next call goes once both
            // have left its slot's previous operation.
            for k in 0..=ahead {
                for r in [0, 2] {
                    let mut out = vec![-1i64; count];
                    let mut op = bcast(std::ptr::null(), out.as_mut_ptr().cast());
                    while !op.is_done() {
                        op.progress(&mut areas[r], &mut scratch).unwrap();
                        blocked.progress(&mut areas[1], &mut scratch).unwrap();
                    }
                    let bad = (0..count).find(|&i| out[i] != value(k, i));
                    assert!(bad.is_none(), "{count} elements, rank {r}, call {k}: element {bad:?}");
                    if k == 0 && r == 0 {
                        // Rank 0 has left the operation whose slot the root needs, rank 2 not:
                        // the root waits for rank 2 alone (and says so).
                        assert!(!blocked.is_done(), "{count} elements: the root went before rank 2 left");
                        assert_eq!(blocked.waiting_for(&areas[1]), vec![2], "{count} elements");
                    }
                }
                if k == 0 {
                    assert!(blocked.is_done(), "{count} elements: the root still waits after its slot was left");
                }
            }
            for (k, out) in root_out.iter().enumerate() {
                assert!(out.iter().enumerate().all(|(i, &v)| v == value(k, i)), "{count} elements, root call {k}");
            }
        }
    }

    /// A rank whose all-gather or reduce-scatter input went through its slot returns without
    /// waiting for its readers, and may publish its next operation while a slow peer still
    /// reads the last one's descriptor. Scheduled by hand on one thread (3 ranks as processes,
    /// staged): ranks 0 and 2 finish a reduce-scatter that rank 1 has only joined, then a
    /// broadcast from rank 0, which rank 2 receives; rank 2's next operation, an all-gather
    /// whose input is not staged, would overwrite the reduce-scatter's descriptor and waits
    /// for rank 1 to leave it; rank 1 then reads the reduce-scatter's descriptors (not the
    /// broadcast's) and every result is exact.
    #[test]
    fn ranks_leaving_staged_operations_early_keep_their_descriptors_for_slow_peers() {
        use crate::transport::node_area::{areas_for_threads_with, SLOT_BYTES};
        let n = 3;
        let count = 6000usize;
        let bytes = count * 8;
        let mut areas = areas_for_threads_with(n, SLOT_BYTES, true);
        let mut scratch: Vec<Vec<u64>> = vec![Vec::new(); n];
        let value = |op: usize, r: usize, i: usize| (op * 1_000_000 + r * 10_000 + i) as i64;
        let sum = Reduction::builtin(crate::types::DataType::Int64, crate::types::BuiltinOp::Sum, n);
        // Reduce-scatter inputs (n blocks each), broadcast input (rank 0's), all-gather inputs.
        let rs_in: Vec<Vec<i64>> = (0..n).map(|r| (0..n * count).map(|i| value(0, r, i)).collect()).collect();
        let bc_in: Vec<i64> = (0..count).map(|i| value(1, 0, i)).collect();
        let ag_in: Vec<Vec<i64>> = (0..n).map(|r| (0..count).map(|i| value(2, r, i)).collect()).collect();
        let mut rs_out = vec![vec![-1i64; count]; n];
        let mut bc_out = vec![vec![-1i64; count]; n];
        let mut ag_out = vec![vec![-1i64; n * count]; n];
        let mut rs: Vec<NodeOp> = (0..n)
            .map(|r| {
                let (send, recv) = (rs_in[r].as_ptr().cast(), rs_out[r].as_mut_ptr().cast());
                NodeOp::new(NodeColl::ReduceScatter(sum), NodeAlgo::Direct, send, recv, bytes, OpSig::NONE)
            })
            .collect();
        let mut bc: Vec<NodeOp> = (0..n)
            .map(|r| {
                let send = if r == 0 { bc_in.as_ptr().cast() } else { std::ptr::null() };
                let recv = bc_out[r].as_mut_ptr().cast();
                NodeOp::new(NodeColl::Broadcast { root: 0 }, NodeAlgo::Direct, send, recv, bytes, OpSig::NONE)
            })
            .collect();
        // Rank 2's all-gather input is read in place (as if mapped): it needs no slot, only
        // its descriptor, which differs from its reduce-scatter one.
        let mut ag: Vec<NodeOp> = (0..n)
            .map(|r| {
                let (send, recv) = (ag_in[r].as_ptr().cast(), ag_out[r].as_mut_ptr().cast());
                let op = NodeOp::new(NodeColl::AllGather, NodeAlgo::Direct, send, recv, bytes, OpSig::NONE);
                if r == 2 {
                    op.with_stage_max(0)
                } else {
                    op
                }
            })
            .collect();
        let mut poll = |ops: &mut Vec<NodeOp>, r: usize, areas: &mut Vec<NodeArea>| {
            for _ in 0..100 {
                ops[r].progress(&mut areas[r], &mut scratch[r]).unwrap();
            }
            ops[r].is_done()
        };
        // Ranks 1 and 0 join the reduce-scatter (their inputs in their slots) and wait for rank 2.
        assert!(!poll(&mut rs, 1, &mut areas) && !poll(&mut rs, 0, &mut areas));
        // Rank 2 arrives, and it and rank 0 are done without waiting for rank 1 to read their slots.
        assert!(poll(&mut rs, 2, &mut areas) && poll(&mut rs, 0, &mut areas), "staged ranks waited for their readers");
        // The broadcast: rank 2 receives it; the root (staged) waits for rank 1 to call it.
        assert!(!poll(&mut bc, 0, &mut areas));
        assert!(poll(&mut bc, 2, &mut areas));
        assert!(!poll(&mut bc, 0, &mut areas));
        // Rank 2's all-gather would overwrite its reduce-scatter descriptor: it waits for rank 1.
        assert!(!poll(&mut ag, 2, &mut areas), "a descriptor was overwritten while rank 1 had to read it");
        assert_eq!(ag[2].waiting_for(&areas[2]), vec![1]);
        // Rank 1 reads the reduce-scatter's descriptors now.
        assert!(poll(&mut rs, 1, &mut areas));
        assert!(poll(&mut bc, 1, &mut areas) && poll(&mut bc, 0, &mut areas));
        while !(0..n).all(|r| ag[r].is_done()) {
            for r in 0..n {
                poll(&mut ag, r, &mut areas);
            }
        }
        for r in 0..n {
            let want_rs = (0..count).map(|i| (0..n).map(|q| rs_in[q][r * count + i]).sum::<i64>());
            assert!(rs_out[r].iter().copied().eq(want_rs), "reduce-scatter, rank {r}");
            assert_eq!(bc_out[r], bc_in, "broadcast, rank {r}");
            assert!(ag_out[r].iter().copied().eq(ag_in.iter().flatten().copied()), "all-gather, rank {r}");
        }
    }

    /// A broadcast root whose input went through its slot returns once every rank has
    /// announced the call, before any receiver copied: 3 ranks as processes, scheduled by hand
    /// on one thread. The receivers join a broadcast of two rounds and wait for the root; the
    /// root finishes it and poisons its send buffer; its next broadcast waits for the
    /// receivers (for the first's slot, and for their calls). The receivers then get both
    /// messages exactly.
    #[test]
    fn staged_broadcast_root_returns_before_its_receivers_copy() {
        use crate::transport::node_area::areas_for_threads_with;
        let n = 3;
        let slot = 16 << 10;
        let counts = [slot / 8 + 100, 1000]; // two rounds, then one
        let mut areas = areas_for_threads_with(n, slot, true);
        let mut scratch: Vec<Vec<u64>> = vec![Vec::new(); n];
        let value = |k: usize, i: usize| (k * 1_000_000 + i) as i64;
        let mut sends: Vec<Vec<i64>> = counts.iter().map(|&c| vec![0; c]).collect();
        let mut outs: Vec<Vec<Vec<i64>>> = counts.iter().map(|&c| vec![vec![-1; c]; n]).collect();
        let mut ops: Vec<Vec<NodeOp>> = (0..2)
            .map(|k| {
                (0..n)
                    .map(|r| {
                        let send = if r == 0 { sends[k].as_ptr().cast() } else { std::ptr::null() };
                        let recv = outs[k][r].as_mut_ptr().cast();
                        let coll = NodeColl::Broadcast { root: 0 };
                        NodeOp::new(coll, NodeAlgo::Direct, send, recv, counts[k] * 8, OpSig::NONE)
                    })
                    .collect()
            })
            .collect();
        let mut poll = |op: &mut NodeOp, r: usize, areas: &mut Vec<NodeArea>| {
            for _ in 0..100 {
                op.progress(&mut areas[r], &mut scratch[r]).unwrap();
            }
            op.is_done()
        };
        for (r, op) in ops[0].iter_mut().enumerate().skip(1) {
            assert!(!poll(op, r, &mut areas));
        }
        sends[0].iter_mut().enumerate().for_each(|(i, v)| *v = value(0, i));
        assert!(poll(&mut ops[0][0], 0, &mut areas), "the root waited for its receivers to copy");
        assert!(outs[0][0].iter().enumerate().all(|(i, &v)| v == value(0, i)), "root's own output");
        sends[0].fill(-7);
        // The second waits for the receivers: they have not left the first, nor called it.
        sends[1].iter_mut().enumerate().for_each(|(i, v)| *v = value(1, i));
        assert!(!poll(&mut ops[1][0], 0, &mut areas), "the root went on before its receivers called");
        assert_eq!(ops[1][0].waiting_for(&areas[0]), vec![1, 2]);
        while !(0..2).all(|k| (0..n).all(|r| ops[k][r].is_done())) {
            for k in 0..2 {
                let (earlier, later) = ops.split_at_mut(k);
                for (r, op) in later[0].iter_mut().enumerate() {
                    if !op.is_done() && earlier.last().is_none_or(|prev| prev[r].is_done()) {
                        poll(op, r, &mut areas);
                    }
                }
            }
        }
        for (k, outs) in outs.iter().enumerate() {
            for (r, out) in outs.iter().enumerate() {
                assert!(out.iter().enumerate().all(|(i, &v)| v == value(k, i)), "broadcast {k}, rank {r}");
            }
        }
    }

    /// Ranks driven in a random order, one poll at a time, through a stream of broadcasts
    /// from rotating roots (tiny, ring, data-slot one-shot and pull sizes, in and out of
    /// place) mixed with all-reduces: roots run ahead of their receivers, ranks run their
    /// calls at different times, and every value must arrive. A root poisons its send
    /// buffer as soon as its call returns, so any later read of it shows.
    #[test]
    fn interleaved_broadcasts_with_run_ahead_roots_are_exact() {
        use crate::transport::node_area::{areas_for_threads, areas_for_threads_with, SLOT_BYTES};
        use crate::types::{BuiltinOp, DataType};
        for (n, as_processes) in [(2, false), (2, true), (3, false), (4, true)] {
            let areas = if as_processes { areas_for_threads_with(n, SLOT_BYTES, true) } else { areas_for_threads(n) };
            interleaved_stream(areas, n, 0x9e37_79b9 + n as u64, DataType::Int64, BuiltinOp::Sum);
        }
    }

    fn interleaved_stream(
        mut areas: Vec<NodeArea>,
        n: usize,
        seed: u64,
        dtype: crate::types::DataType,
        op: crate::types::BuiltinOp,
    ) {
        // (elements, broadcast root or None for an all-reduce, in place)
        let bcast_max = broadcast_one_shot_max(n, false) / 8;
        // Stretches of 150 broadcasts from one root (which may get far ahead) alternate with
        // stretches where roots rotate and all-reduces come in between.
        let mut calls = Vec::new();
        for k in 0..900 {
            let stretch = k / 150;
            // One-shot sizes only where one root keeps going (a pull waits for its readers).
            let sizes = if stretch % 2 == 0 {
                [1usize, 6, 7, 100, 512, 3, 2, 1, 64]
            } else {
                [1, 6, 7, 100, 512, 513, bcast_max, 5000, 3]
            };
            // Sizes the tree would take (between one-shot and pull) become one-shot ones.
            let count = sizes[k % 9];
            let count = if count > bcast_max && count * 8 < broadcast_direct_min(false) { bcast_max } else { count };
            let root = if stretch % 2 == 0 { Some(stretch / 2 % n) } else { (k % 7 != 3).then_some((k / 2) % n) };
            calls.push((count, root, k % 5 == 1));
        }
        let value = |r: usize, k: usize, i: usize| (k as i64) << 32 | (r as i64) << 24 | i as i64;
        let red = Reduction::builtin(dtype, op, n);
        // Per rank and call: input and output buffers (kept to the end), and the operation.
        let mut inputs: Vec<Vec<Vec<i64>>> = vec![Vec::new(); n];
        let mut outputs: Vec<Vec<Vec<i64>>> = vec![Vec::new(); n];
        let mut current: Vec<Option<NodeOp>> = (0..n).map(|_| None).collect();
        let mut scratch: Vec<Vec<u64>> = vec![Vec::new(); n];
        let expected = |k: usize| -> Vec<i64> {
            let (count, root, _) = calls[k];
            match root {
                Some(root) => (0..count).map(|i| value(root, k, i)).collect(),
                None => (0..count).map(|i| (0..n).map(|q| value(q, k, i)).fold(0i64, i64::wrapping_add)).collect(),
            }
        };
        let mut rng = seed;
        let mut polls = 0u64;
        while (0..n).any(|r| outputs[r].len() < calls.len() || current[r].is_some()) {
            polls += 1;
            assert!(
                polls < 200_000_000,
                "stuck: ranks at calls {:?}",
                outputs.iter().map(Vec::len).collect::<Vec<_>>()
            );
            rng ^= rng << 13;
            rng ^= rng >> 7;
            rng ^= rng << 17;
            // One rank at a time is favoured for a stretch of polls, so that roots get far
            // ahead of their receivers (and the other way round).
            let favoured = (seed.wrapping_add(polls / 20_000) % n as u64) as usize;
            let r = if rng % 8 != 0 { favoured } else { (rng >> 8) as usize % n };
            if current[r].is_none() {
                let k = outputs[r].len();
                if k == calls.len() {
                    continue;
                }
                let (count, root, in_place) = calls[k];
                let input: Vec<i64> = (0..count).map(|i| value(r, k, i)).collect();
                let receives_only = root.is_some_and(|root| root != r);
                let mut out = if in_place && !receives_only { input.clone() } else { vec![-1; count] };
                let send = if in_place || receives_only { out.as_ptr() } else { input.as_ptr() } as *const u8;
                let (coll, algo) = match root {
                    Some(root) if count * 8 <= broadcast_one_shot_max(n, false) => {
                        (NodeColl::Broadcast { root }, NodeAlgo::OneShot)
                    }
                    Some(root) => (NodeColl::Broadcast { root }, NodeAlgo::Direct),
                    None => (NodeColl::AllReduce(red), NodeAlgo::for_size(count * 8, n, false, None).unwrap()),
                };
                current[r] = Some(NodeOp::new(coll, algo, send, out.as_mut_ptr().cast(), count * 8, OpSig::NONE));
                inputs[r].push(input);
                outputs[r].push(out);
            }
            let op = current[r].as_mut().unwrap();
            op.progress(&mut areas[r], &mut scratch[r]).unwrap();
            if op.is_done() {
                current[r] = None;
                let k = outputs[r].len() - 1;
                let want = expected(k);
                let bad = (0..want.len()).find(|&i| outputs[r][k][i] != want[i]);
                assert!(bad.is_none(), "{n} ranks, rank {r}, call {k} {:?}: element {bad:?}", calls[k]);
                // The root's input may be reused at once.
                inputs[r][k].iter_mut().for_each(|v| *v = -7);
            }
        }
        // Nothing wrote into a finished call's output afterwards.
        for (r, outs) in outputs.iter().enumerate() {
            for (k, out) in outs.iter().enumerate() {
                assert!(*out == expected(k), "{n} ranks, rank {r}, call {k}: changed after it returned");
            }
        }
    }

    #[test]
    fn relays_take_the_measured_sizes_by_buffer_kind() {
        let r = default_relay_sizes(8, false);
        assert!(r.contains(true, 256 << 10) && r.contains(true, 4 << 20) && !r.contains(true, 128 << 10));
        assert!(!r.contains(true, 8 << 20) && r.contains(false, 8 << 20) && !r.contains(false, 16 << 20));
        assert!(r.contains(false, 2 << 20) && !r.contains(false, 1 << 20));
        let r16 = default_relay_sizes(16, false);
        assert!(!r16.contains(true, 256 << 10) && r16.contains(true, 512 << 10));
        // Three ranks: the same sizes as nccl-tests makes them (a multiple of 3 x 16 bytes).
        let r3 = default_relay_sizes(3, false);
        assert!(r3.contains(true, 262128) && r3.contains(true, 4194288) && !r3.contains(true, 131040));
        assert!(r3.contains(false, 2097120) && r3.contains(false, 8388600) && !r3.contains(false, 1048560));
        for (n, oversubscribed) in [(2, false), (3, true), (8, true), (17, false)] {
            assert_eq!(default_relay_sizes(n, oversubscribed), RelaySizes::NEVER);
        }
        // A 1 MiB all-gather at 8 ranks: offered with mapped buffers only; never at two ranks.
        let op = |n: usize| {
            NodeOp::new(
                NodeColl::AllGather,
                NodeAlgo::Direct,
                std::ptr::null(),
                std::ptr::null_mut(),
                (1 << 20) / n,
                OpSig::NONE,
            )
            .with_relay_sizes(default_relay_sizes(8, false))
        };
        assert!(op(8).offers_relay(8, true) && !op(8).offers_relay(8, false));
        assert!(!op(2).offers_relay(2, true));
    }

    #[test]
    fn algorithm_follows_size() {
        for n in [2, 3, 4, 8, 16, 64] {
            for over in [false, true] {
                let max = one_shot_max(n, over);
                assert!(max <= SMALL_BYTES);
                assert_eq!(NodeAlgo::for_size(0, n, over, None), None);
                assert_eq!(NodeAlgo::for_size(8, n, over, None), Some(NodeAlgo::OneShot));
                assert_eq!(NodeAlgo::for_size(max, n, over, None), Some(NodeAlgo::OneShot));
                assert_eq!(NodeAlgo::for_size(max + 1, n, over, None), Some(NodeAlgo::Direct));
            }
            assert!(one_shot_max(n, true) >= one_shot_max(n, false));
        }
        // Two ranks with a core each: one-shot up to 2 KiB (malloc'd buffers go direct
        // through the slots, with two synchronisations).
        assert_eq!(NodeAlgo::for_size(2 << 10, 2, false, None), Some(NodeAlgo::OneShot));
        assert_eq!(NodeAlgo::for_size((2 << 10) + 8, 2, false, None), Some(NodeAlgo::Direct));
        // The override is capped at the small slots' size; 0 sends everything direct.
        assert_eq!(NodeAlgo::for_size(8, 2, false, Some(0)), Some(NodeAlgo::Direct));
        assert_eq!(NodeAlgo::for_size(SMALL_BYTES, 2, false, Some(1 << 30)), Some(NodeAlgo::OneShot));
        assert_eq!(NodeAlgo::for_size(SMALL_BYTES + 1, 2, false, Some(1 << 30)), Some(NodeAlgo::Direct));
        // Broadcasts: one-shot, then the tree, then the node area from 32 KiB, or from 64 KiB
        // when ranks share cores (their copies of the root's buffer queue for the cores).
        assert_eq!(NodeAlgo::for_broadcast(8, 4, true, None), Some(NodeAlgo::OneShot));
        assert_eq!(NodeAlgo::for_broadcast(16 << 10, 4, true, None), None);
        assert_eq!(NodeAlgo::for_broadcast(32 << 10, 4, true, None), None);
        assert_eq!(NodeAlgo::for_broadcast((64 << 10) - 4, 4, true, None), None);
        assert_eq!(NodeAlgo::for_broadcast(64 << 10, 4, true, None), Some(NodeAlgo::Direct));
        assert_eq!(NodeAlgo::for_broadcast(16 << 10, 8, false, None), None);
        assert_eq!(NodeAlgo::for_broadcast(32 << 10, 8, false, None), Some(NodeAlgo::Direct));
        assert_eq!(NodeAlgo::for_broadcast(SMALL_BYTES, 2, false, None), Some(NodeAlgo::OneShot));
        assert_eq!(NodeAlgo::for_broadcast(32 << 10, 2, false, None), Some(NodeAlgo::Direct));
        assert_eq!(NodeAlgo::for_broadcast(32 << 10, 2, false, Some(1 << 30)), Some(NodeAlgo::Direct));
    }
}
