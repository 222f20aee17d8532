//! Point-to-point between device buffers of ranks whose GPUs reach each other (the same GPU,
//! or peer access over NVLink or PCIe): the copying rank's stream copies straight between the
//! two buffers, through CUDA IPC when the ranks are processes of their own and by address when
//! they are threads of one process, instead of staging both ends through host memory and a
//! socket or shared-memory link.
//!
//! The streams are ordered by two flags per pair in the receiver's inbox, a host page each
//! rank makes on its first such call and its senders map and register with CUDA. The sender
//! copies (pushes) between GPUs; on one GPU the lower rank of the pair copies, pulling when it
//! is the receiver ([`sender_copies`]):
//!
//! ```text
//! receiver stream:  ready[s] = k                                        wait delivered[s] >= k
//! sender stream:                wait ready[s] >= k   copy   delivered[s] = k
//! ```
//!
//! where k counts the pair's messages in that direction (the same on both sides: NCCL matches
//! a pair's sends and receives in call order). Before queuing, each pair of ranks exchanges
//! one host message per direction per group: the process id, its inbox page, and for every
//! send and receive of the group between the two, the buffer's export and byte count. Each
//! side checks the other's numbers of sends and receives and their sizes, so a mismatch fails
//! on both sides instead of overrunning a buffer or waiting for ever. A pair where either rank
//! could not export a buffer is staged on both sides. Every rank queues its pairs' flag writes
//! first, then its copies, then its waits ([`Turn`]), so two ranks sending to each other never
//! wait on each other. Ranks that are threads of one process on different GPUs are ordered
//! the same way (each GPU has a context, and hardware queues, of its own). Rank threads that
//! share a GPU share its context's hardware queues, on which a queued wait holds up whatever is
//! submitted after it; they keep the staged path, unless FERROCCL_PEER_PATH_ON_ONE_GPU is set
//! (to run this path on a one-GPU machine), in which case they take the turns together
//! ([`in_turns`], `local_order`), so that every wait is submitted after the flag write it waits
//! for. Taking turns waits on the host for the mates of the group, so there each rank's
//! sends and receives with a mate must be grouped alike on both sides.
//!
//! Which sends and receives take this path depends only on what both ranks of a pair agree on
//! (their GPUs and what each reaches, their processes, device buffers, NCCL_P2P_DISABLE), each
//! decided on its own, so the two always choose alike; the rest of a group keeps its path.

use std::collections::HashMap;
use std::mem::ManuallyDrop;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};

use super::local_order::LocalOrder;
use super::{CollOp, OpRequest};
use crate::comm::Comm;
use crate::cuda::ipc;
use crate::cuda::memory::Registered;
use crate::cuda::stream::{Event, FlagOp, Stream};
use crate::error::{Error, Result};
use crate::transport::peer_mem::{self, PeerMaps, SharedRef};

/// Bytes of a source's line in an inbox: ready, then delivered (u32 each).
const LINE_BYTES: usize = 8;
/// The exchange header: pid (4), status (1: this rank could not export one of the pair's
/// buffers), 3 zero bytes, the inbox page's fd (i32), this rank's sends to the peer and
/// receives from it (u16 each), the page's serial and size, the pid namespace (with the pid,
/// which process this is), and the turns this rank has counted with the peer
/// ([`MateTurns`]).
const HEADER_BYTES: usize = 48;
/// One buffer in the exchange: its export, then its byte count.
const ENTRY_BYTES: usize = ipc::EXPORT_BYTES + 8;

/// The GPU address of word `word` (0: ready, 1: delivered or consumed) of source `source`'s
/// line in an inbox whose GPU address is `inbox`.
fn word_addr(inbox: u64, source: usize, word: usize) -> u64 {
    inbox + (source * LINE_BYTES + 4 * word) as u64
}

/// A group's operations, with their communicators.
type Ops = Vec<(Arc<Comm>, OpRequest)>;

/// Whether the pair (this rank, `peer`) of `comm` moves device buffers directly: GPUs that
/// reach each other both ways (one GPU reaches itself), one host, not two threads of one
/// process on one GPU (unless FERROCCL_PEER_PATH_ON_ONE_GPU, see the module doc), and
/// NCCL_P2P_DISABLE unset.
fn pair_applies(comm: &Comm, peer: usize) -> bool {
    let (me, them) = (&comm.peers[comm.rank], &comm.peers[peer]);
    peer != comm.rank
        && comm.node_area
        && me.gpu.bus != 0
        && them.gpu.bus != 0
        && me.gpu.reach.contains(&them.gpu.bus)
        && them.gpu.reach.contains(&me.gpu.bus)
        && (!shares_context(comm, peer) || crate::env::get_bool("FERROCCL_PEER_PATH_ON_ONE_GPU"))
        && !crate::env::get_bool("NCCL_P2P_DISABLE")
}

/// Splits a group's operations into those this path takes and the rest, call order kept in
/// each. Each send or receive is decided on its own, from what both ranks of its pair agree on
/// ([`pair_applies`]), never from the rest of the group, so the two ranks always choose alike:
/// device buffers, outside graph capture (a captured copy would replay its capture's sequence
/// numbers; under capture they take the staged path, `captured`). Sends to this rank
/// itself are plain copies, taken when the communicator's group holds as many receives from
/// itself, all on one stream.
pub fn split(ops: Ops) -> Result<(Ops, Ops)> {
    if !ops.iter().any(|(_, r)| r.mem.is_device() && matches!(r.op, CollOp::Send { .. } | CollOp::Recv { .. })) {
        return Ok((Vec::new(), ops));
    }
    let mut capturing: Vec<(Stream, bool)> = Vec::new();
    let mut take = Vec::with_capacity(ops.len());
    for (c, r) in &ops {
        let p2p = r.mem.is_device() && matches!(r.op, CollOp::Send { .. } | CollOp::Recv { .. });
        let qualifies = p2p
            && match r.op {
                CollOp::Send { peer } | CollOp::Recv { peer } if peer == c.rank => self_copies_apply(&ops, c),
                CollOp::Send { peer } | CollOp::Recv { peer } => pair_applies(c, peer),
                _ => false,
            };
        let captured = if qualifies {
            match capturing.iter().find(|(s, _)| *s == r.stream) {
                Some(&(_, k)) => k,
                None => {
                    let k = r.stream.is_capturing()?;
                    capturing.push((r.stream, k));
                    k
                }
            }
        } else {
            false
        };
        take.push(qualifies && !captured);
    }
    let mut taken = take.into_iter();
    Ok(ops.into_iter().partition(|_| taken.next().unwrap_or(false)))
}

/// Whether `comm`'s sends to itself in the group each have their receive: as many of each,
/// all device buffers on one stream.
fn self_copies_apply(ops: &Ops, comm: &Arc<Comm>) -> bool {
    let me = comm.rank;
    let mine: Vec<&OpRequest> = ops
        .iter()
        .filter(|(c, r)| {
            Arc::ptr_eq(c, comm) && matches!(r.op, CollOp::Send { peer } | CollOp::Recv { peer } if peer == me)
        })
        .map(|(_, r)| r)
        .collect();
    let sends = mine.iter().filter(|r| matches!(r.op, CollOp::Send { .. })).count();
    sends * 2 == mine.len() && mine.iter().all(|r| r.mem.is_device() && r.stream == mine[0].stream)
}

/// One rank's inbox: a shared host page, registered with CUDA.
struct Inbox {
    /// Dropped (unregistered) before `memory` is unmapped: declared first.
    registration: Registered,
    memory: *mut u8,
    shared: SharedRef,
}

impl Drop for Inbox {
    fn drop(&mut self) {
        peer_mem::free_shared(self.memory);
    }
}

/// A receiver's inbox, mapped into this process and registered.
struct PeerInbox {
    registration: Registered,
    #[allow(dead_code)] // the mapping, unmapped when dropped (after the registration)
    maps: PeerMaps,
    /// Which of the peer's pages this is (a rank's inbox never changes; checked all the same).
    serial: u64,
    /// The page's address in this process (the host's view of what the streams poll).
    base: *mut u8,
}

/// This rank's state for the path, per communicator, made on its first use.
pub struct P2pState {
    inner: ManuallyDrop<Inner>,
}

struct Inner {
    inbox: Inbox,
    peers: Mutex<HashMap<usize, PeerInbox>>,
    /// Messages queued to each rank, and from each rank.
    sent: Mutex<Vec<u32>>,
    received: Mutex<Vec<u32>>,
    /// Recorded after the last group on each stream used: at destroy, whether streams are
    /// through with the pages.
    last: Mutex<Vec<(Stream, Event)>>,
    /// Whether the first send or receive with a process mate was logged.
    mates_logged: std::sync::atomic::AtomicBool,
}

// SAFETY: the pages are shared memory that streams and peers access through flag operations;
// the rest is owned and behind mutexes.
unsafe impl Send for P2pState {}
// SAFETY: as above.
unsafe impl Sync for P2pState {}

impl Drop for P2pState {
    fn drop(&mut self) {
        let through = self.inner.last.lock().unwrap_or_else(|p| p.into_inner()).iter().all(|(_, e)| e.is_complete());
        if through {
            // SAFETY: dropped once, here.
            unsafe { ManuallyDrop::drop(&mut self.inner) };
        }
        // Otherwise a stream may still wait on a page: keep them (a page each) rather than
        // unregister memory a stream polls.
    }
}

impl P2pState {
    fn new(nranks: usize) -> Result<P2pState> {
        let len = (nranks * LINE_BYTES).next_multiple_of(4096);
        let memory = peer_mem::alloc_shared(len)?;
        let made = (|| {
            let shared =
                peer_mem::locate(memory as usize, len).ok_or_else(|| Error::internal("inbox page not located"))?;
            // SAFETY: the page is mapped until Inbox::drop, after the registration is dropped.
            let registration = unsafe { Registered::new(memory, len)? };
            Ok::<_, Error>((shared, registration))
        })();
        let (shared, registration) = match made {
            Ok(v) => v,
            Err(e) => {
                peer_mem::free_shared(memory);
                return Err(e);
            }
        };
        Ok(P2pState {
            inner: ManuallyDrop::new(Inner {
                inbox: Inbox { registration, memory, shared },
                peers: Mutex::new(HashMap::new()),
                sent: Mutex::new(vec![0; nranks]),
                received: Mutex::new(vec![0; nranks]),
                last: Mutex::new(Vec::new()),
                mates_logged: Default::default(),
            }),
        })
    }

    /// The GPU address of source `s`'s ready (0) or delivered (1) word in this rank's inbox.
    fn own_flag(&self, s: usize, word: usize) -> u64 {
        word_addr(self.inner.inbox.registration.device_ptr(), s, word)
    }

    /// The GPU address of this rank's ready (0) or delivered (1) word in `peer`'s inbox,
    /// mapping it on first use.
    fn peer_flag(&self, me: usize, peer: usize, pid: u32, page: &SharedRef, word: usize) -> Result<u64> {
        let mut peers = self.inner.peers.lock().unwrap_or_else(|p| p.into_inner());
        if peers.get(&peer).is_some_and(|p| p.serial != page.serial) {
            return Err(Error::internal(format!("rank {peer}'s point-to-point inbox changed")));
        }
        if (me + 1) * LINE_BYTES > page.size as usize {
            return Err(Error::remote(format!("rank {peer}'s point-to-point page is too small")));
        }
        if let std::collections::hash_map::Entry::Vacant(slot) = peers.entry(peer) {
            let mut maps = PeerMaps::default();
            let base = maps.resolve(pid, page).ok_or_else(|| {
                Error::invalid_usage(format!(
                    "cannot map rank {peer}'s point-to-point page (pid {pid}; see the SHM log line)"
                ))
            })?;
            // SAFETY: `maps` keeps the mapping for as long as the PeerInbox, which drops the
            // registration first (field order).
            let registration = unsafe { Registered::new(base, page.size as usize)? };
            slot.insert(PeerInbox { registration, maps, serial: page.serial, base });
        }
        Ok(word_addr(peers[&peer].registration.device_ptr(), me, word))
    }
}

/// `ncclCommAbort`: moves every flag this rank's streams may wait on far ahead. The flags live
/// in host pages, so the host writes them: no stream is involved, which a stream waiting on a
/// peer that will not come could hold up (it may share a hardware queue with any other).
pub fn release_streams(comm: &Comm) {
    let Some(st) = comm.with_layer_state(|s: &mut super::LayerState| s.p2p.clone()) else { return };
    // A wait is a cyclic comparison: half the number space ahead passes every queued one.
    let ahead = |k: u32| k.wrapping_add(1 << 30);
    let sent = st.inner.sent.lock().unwrap_or_else(|p| p.into_inner()).clone();
    let received = st.inner.received.lock().unwrap_or_else(|p| p.into_inner()).clone();
    let peers = st.inner.peers.lock().unwrap_or_else(|p| p.into_inner());
    // Both words of a line: ready (or buffer ready) and delivered (or consumed).
    let release = |line: *mut u8, k: u32| {
        for word in 0..2 {
            // SAFETY: `line` is a source's line in a mapped inbox page (LINE_BYTES, 4-aligned,
            // inside the page: checked before the page was mapped, which is kept as long as
            // the state), accessed only atomically.
            unsafe { (*(line.add(4 * word) as *const AtomicU32)).store(k, Ordering::Release) };
        }
    };
    for (from, &k) in received.iter().enumerate().filter(|(_, &k)| k != 0) {
        release(st.inner.inbox.memory.wrapping_add(from * LINE_BYTES), ahead(k));
    }
    for (to, inbox) in peers.iter() {
        release(inbox.base.wrapping_add(comm.rank * LINE_BYTES), ahead(sent[*to]));
    }
}

fn state(comm: &Arc<Comm>) -> Result<Arc<P2pState>> {
    if let Some(s) = comm.with_layer_state(|s: &mut super::LayerState| s.p2p.clone()) {
        return Ok(s);
    }
    let s = Arc::new(P2pState::new(comm.nranks)?);
    comm.with_layer_state(|st: &mut super::LayerState| st.p2p = Some(s.clone()));
    Ok(s)
}

/// The peer of a send or receive.
fn peer_of(req: &OpRequest) -> usize {
    match req.op {
        CollOp::Send { peer } | CollOp::Recv { peer } => peer,
        _ => usize::MAX,
    }
}

/// Queues a group's sends and receives that [`split`] chose. Returns those to stage instead:
/// the pairs of ranks in different processes where either rank could not export a buffer
/// (memory CUDA IPC cannot share, such as a stream-ordered pool's), which both ranks of the
/// pair learn from the exchange and so stage alike; and the first error, if any. A pair whose
/// groups do not match is refused on both sides without touching the group's other pairs,
/// whose staged part still comes back, as it does for the other communicators of the group.
/// Several communicators in one group (one thread driving several ranks) are submitted each
/// from a thread of its own, as their exchanges wait for each other.
pub fn submit_all(direct: Ops) -> (Ops, Option<Error>) {
    let per_comm = super::by_communicator(direct);
    let submitted: Vec<(Arc<Comm>, Result<Submitted>)> = if per_comm.len() == 1 {
        let (comm, reqs) = &per_comm[0];
        vec![(comm.clone(), submit(comm, reqs))]
    } else {
        let comms: Vec<Arc<Comm>> = per_comm.iter().map(|(c, _)| c.clone()).collect();
        comms.into_iter().zip(super::one_gpu::on_own_threads(per_comm, submit)).collect()
    };
    let mut back = Vec::new();
    let mut first_error = None;
    for (comm, s) in submitted {
        match s {
            Ok(s) => {
                back.extend(s.staged.into_iter().map(|r| (comm.clone(), r)));
                if let Some(e) = s.error {
                    first_error.get_or_insert(e);
                }
            }
            Err(e) => {
                first_error.get_or_insert(e);
            }
        }
    }
    (back, first_error)
}

/// What [`submit`] leaves to the caller.
struct Submitted {
    /// Requests to stage (both sides of their pairs stage them).
    staged: Vec<OpRequest>,
    /// The first error of this communicator's part: a pair refused (groups that do not match)
    /// or a failure to queue.
    error: Option<Error>,
}

/// One communicator's part of [`submit_all`].
fn submit(comm: &Arc<Comm>, reqs: &[OpRequest]) -> Result<Submitted> {
    // A failure here is reported after the exchange: skipping it would leave the peers to
    // match this group's messages with the next group's.
    let to_self = copy_to_self(comm.rank, reqs).err();
    let reqs: Vec<OpRequest> = reqs.iter().filter(|r| peer_of(r) != comm.rank).copied().collect();
    if reqs.is_empty() {
        return Ok(Submitted { staged: Vec::new(), error: to_self });
    }
    let mut peers: Vec<usize> = reqs.iter().map(peer_of).collect();
    peers.sort_unstable();
    peers.dedup();
    let st = state(comm)?;
    let mates: Vec<usize> = peers.iter().copied().filter(|&p| same_process(comm, p)).collect();
    if !mates.is_empty() && !st.inner.mates_logged.swap(true, std::sync::atomic::Ordering::Relaxed) {
        log::info!(
            target: "P2P",
            "P2P/direct: device sends and receives with ranks {mates:?}, threads of this process, copy between \
             the buffers by address"
        );
    }
    // Mates on this rank's GPU take turns (only with FERROCCL_PEER_PATH_ON_ONE_GPU).
    let order = peers.iter().any(|&p| shares_context(comm, p)).then(|| LocalOrder::device_p2p(comm)).flatten();
    let timed = log::log_enabled!(target: "P2P", log::Level::Trace).then(std::time::Instant::now);
    let exchanged = match exchange(comm, &st, &reqs, &peers, order.as_deref()) {
        Ok(x) => x,
        Err(e) => {
            // Mates whose part of the exchange went through must not wait for this rank's turns:
            // count them (on from this side's counts) and publish at once.
            let sharing: Vec<(usize, u64)> =
                peers.iter().filter(|&&p| shares_context(comm, p)).map(|&p| (p, 0)).collect();
            drop(MateTurns::start(order, &sharing));
            return Err(e);
        }
    };
    let exchange_time = timed.map(|t| t.elapsed());
    // A peer that the init data showed as a thread of this process but whose pid namespace
    // differs (containers sharing a host name) described its buffers by address, which only
    // the same process can use: staged, and no turns (both sides see the same namespaces).
    let impostor = |p: usize, m: &[u8]| same_process(comm, p) && !is_this_process(m);
    // Counted once the exchange is in, from the larger of both sides' counts (see MateTurns).
    let turn_mates: Vec<(usize, u64)> = peers
        .iter()
        .zip(&exchanged.messages)
        .filter(|&(&p, m)| shares_context(comm, p) && !impostor(p, m))
        .map(|(&p, m)| (p, u64::from_le_bytes(m[40..48].try_into().expect("8 bytes"))))
        .collect();
    let turns = MateTurns::start(order, &turn_mates);
    // Pairs whose groups do not match: refused on both sides. Pairs where either side could
    // not export, or that are not one process after all: staged on both sides.
    let mut refused: Vec<usize> = Vec::new();
    let mut first_refusal: Option<Error> = None;
    let mut unshared: Vec<usize> = Vec::new();
    for ((&p, m), (&unexported, mismatch)) in
        peers.iter().zip(&exchanged.messages).zip(exchanged.unexported.iter().zip(exchanged.mismatched))
    {
        if let Some(e) = mismatch {
            log::warn!(target: "P2P", "device send/receive: {e}");
            first_refusal.get_or_insert(e);
            refused.push(p);
        } else if impostor(p, m) {
            log::info!(target: "P2P", "device send/receive with rank {p}: same pid, another pid namespace; staged");
            unshared.push(p);
        } else if unexported || m[4] != 0 {
            log::info!(target: "P2P", "device send/receive with rank {p}: a buffer cannot be shared through CUDA IPC; staged");
            unshared.push(p);
        }
    }
    let staged: Vec<OpRequest> = reqs.iter().filter(|r| unshared.contains(&peer_of(r))).copied().collect();
    let direct: Vec<OpRequest> =
        reqs.iter().filter(|r| !unshared.contains(&peer_of(r)) && !refused.contains(&peer_of(r))).copied().collect();
    let result = queue(comm, &st, &direct, &peers, &exchanged.messages, turns.as_ref());
    if let (Some(t), Some(x)) = (timed, exchange_time) {
        log::trace!(
            target: "P2P",
            "device send/receive: {} requests with {} peers, exchange {} us, queue {} us",
            reqs.len(),
            peers.len(),
            x.as_micros(),
            (t.elapsed() - x).as_micros()
        );
    }
    let mut last = st.inner.last.lock().unwrap_or_else(|p| p.into_inner());
    for stream in direct.iter().map(|r| r.stream) {
        if !last.iter().any(|(s, _)| *s == stream) {
            last.push((stream, Event::create()?));
        }
        last.iter().find(|(s, _)| *s == stream).expect("added above").1.record(stream)?;
    }
    // The staged pairs come back even when this rank's queuing failed: their peers stage them.
    Ok(Submitted { staged, error: to_self.or(first_refusal).or(result.err()) })
}

/// The group's sends to this rank itself, each copied into the matching receive (the k-th send
/// to itself matches its k-th receive from itself, as NCCL matches them).
fn copy_to_self(me: usize, reqs: &[OpRequest]) -> Result<()> {
    let sends = reqs.iter().filter(|r| r.op == CollOp::Send { peer: me });
    let recvs = reqs.iter().filter(|r| r.op == CollOp::Recv { peer: me });
    for (s, r) in sends.zip(recvs) {
        let (sent, expected) = (s.count * s.dtype.size(), r.count * r.dtype.size());
        if sent != expected {
            return Err(Error::invalid_usage(format!(
                "ncclSend of {sent} bytes to this rank itself matched a receive of {expected} bytes"
            )));
        }
        if sent > 0 && !std::ptr::eq(s.send, r.recv) {
            // SAFETY: both are this rank's live device buffers of `sent` bytes (NCCL's rules),
            // used in stream order.
            unsafe { r.stream.copy(r.recv, s.send, sent)? };
        }
    }
    Ok(())
}

/// This rank's sends to `peer` and receives from it in the group.
fn counts(reqs: &[OpRequest], peer: usize) -> (usize, usize) {
    let sends = reqs.iter().filter(|r| r.op == CollOp::Send { peer }).count();
    (sends, reqs.iter().filter(|r| peer_of(r) == peer).count() - sends)
}

/// This rank's message to `peer`: its sends to the peer, then its receives from it.
fn entries_for(reqs: &[OpRequest], peer: usize) -> impl Iterator<Item = &OpRequest> {
    let sends = reqs.iter().filter(move |r| r.op == CollOp::Send { peer });
    let recvs = reqs.iter().filter(move |r| r.op == CollOp::Recv { peer });
    sends.chain(recvs)
}

/// What [`exchange`] returns, per peer of the group (in `peers` order).
struct Exchanged {
    /// The peer's message.
    messages: Vec<Vec<u8>>,
    /// Whether this rank failed to export one of the pair's buffers.
    unexported: Vec<bool>,
    /// Why the pair's groups do not match, if they do not.
    mismatched: Vec<Option<Error>>,
}

/// Sends every peer of the group this rank's message and receives theirs (host point-to-point,
/// one group). A pair where this rank fails to export a buffer still exchanges, telling the
/// peer. The header's counts of sends and receives are checked against this rank's own, per
/// peer, so that a pair whose groups do not match fails on both sides before anything of it
/// is queued, while the group's other pairs go ahead.
fn exchange(
    comm: &Arc<Comm>,
    st: &P2pState,
    reqs: &[OpRequest],
    peers: &[usize],
    order: Option<&LocalOrder>,
) -> Result<Exchanged> {
    let mut unexported = Vec::with_capacity(peers.len());
    let mut mine = Vec::with_capacity(peers.len());
    let mut theirs = Vec::with_capacity(peers.len());
    for &p in peers {
        let mut m = vec![0u8; HEADER_BYTES];
        m[..4].copy_from_slice(&std::process::id().to_le_bytes());
        let page = &st.inner.inbox.shared;
        m[8..12].copy_from_slice(&page.fd.to_le_bytes());
        m[16..24].copy_from_slice(&page.serial.to_le_bytes());
        m[24..32].copy_from_slice(&page.size.to_le_bytes());
        m[32..40].copy_from_slice(&pid_namespace().to_le_bytes());
        m[40..48].copy_from_slice(&order.map_or(0, |o| o.counted_with(p)).to_le_bytes());
        let (sends, recvs) = counts(reqs, p);
        m[12..14].copy_from_slice(&(sends as u16).to_le_bytes());
        m[14..16].copy_from_slice(&(recvs as u16).to_le_bytes());
        let mut failed = false;
        for req in entries_for(reqs, p) {
            let mut e = [0u8; ENTRY_BYTES];
            let bytes = req.count * req.dtype.size();
            let buf = if matches!(req.op, CollOp::Send { .. }) { req.send } else { req.recv as *const u8 };
            if bytes > 0 && same_process(comm, p) {
                ipc::local(buf).encode(&mut e[..ipc::EXPORT_BYTES]);
            } else if bytes > 0 {
                match ipc::export(buf) {
                    Ok(x) => x.encode(&mut e[..ipc::EXPORT_BYTES]),
                    Err(err) => {
                        log::info!(target: "P2P", "device send/receive with rank {p}: {err}");
                        m[4] = 1;
                        failed = true;
                    }
                }
            }
            e[ipc::EXPORT_BYTES..].copy_from_slice(&(bytes as u64).to_le_bytes());
            m.extend_from_slice(&e);
        }
        // The peer's message lists the peer's sends to this rank (this rank's receives from
        // it) and its receives from this rank (this rank's sends to it).
        let expect = reqs.iter().filter(|r| peer_of(r) == p).count();
        theirs.push(vec![0u8; HEADER_BYTES + expect * ENTRY_BYTES]);
        mine.push(m);
        unexported.push(failed);
    }
    // A device call's exchange: a peer that passed host buffers to its matching call is told so
    // by the signature instead of being matched against these bytes.
    let host = super::one_gpu::host_request;
    let mut host_reqs = Vec::with_capacity(2 * peers.len());
    for ((&p, m), t) in peers.iter().zip(&mine).zip(theirs.iter_mut()) {
        host_reqs.push(host(CollOp::Send { peer: p }, m.as_ptr(), std::ptr::null_mut(), m.len()));
        host_reqs.push(host(CollOp::Recv { peer: p }, std::ptr::null(), t.as_mut_ptr(), t.len()));
    }
    let timed = log::log_enabled!(target: "P2P", log::Level::Trace).then(std::time::Instant::now);
    super::run(&[(comm.clone(), host_reqs)])?;
    if let Some(t) = timed {
        log::trace!(target: "P2P", "device send/receive: host messages {} us", t.elapsed().as_micros());
    }
    let mismatched = peers
        .iter()
        .zip(&theirs)
        .map(|(&p, t)| {
            let their = |a: usize| u16::from_le_bytes([t[a], t[a + 1]]) as usize;
            let (sends, recvs) = counts(reqs, p);
            ((their(12), their(14)) != (recvs, sends)).then(|| {
                Error::invalid_usage(format!(
                    "this rank's group has {sends} sends to rank {p} and {recvs} receives from it; rank {p}'s has \
                     {} receives from this rank and {} sends to it",
                    their(14),
                    their(12)
                ))
            })
        })
        .collect();
    Ok(Exchanged { messages: theirs, unexported, mismatched })
}

/// Whether `peer` is a thread of this rank's process (as the ranks' init data tell; the
/// exchange confirms it with the pid namespace before an address is used).
fn same_process(comm: &Comm, peer: usize) -> bool {
    let (me, them) = (&comm.peers[comm.rank], &comm.peers[peer]);
    me.pid == them.pid && me.host_hash == them.host_hash
}

/// Whether `peer` is a thread of this rank's process on the same GPU: one context, whose
/// hardware queues their streams share.
fn shares_context(comm: &Comm, peer: usize) -> bool {
    same_process(comm, peer) && comm.peers[comm.rank].gpu.bus == comm.peers[peer].gpu.bus
}

/// This process's pid namespace (the inode of /proc/self/ns/pid; 0 where unreadable): with the
/// pid, which process a peer is, also between containers that share a host name and boot.
fn pid_namespace() -> u64 {
    static NS: std::sync::OnceLock<u64> = std::sync::OnceLock::new();
    *NS.get_or_init(|| {
        use std::os::unix::fs::MetadataExt;
        std::fs::metadata("/proc/self/ns/pid").map_or(0, |m| m.ino())
    })
}

/// Whether the peer whose message is `msg` is this very process.
fn is_this_process(msg: &[u8]) -> bool {
    let pid = u32::from_le_bytes(msg[..4].try_into().expect("4 bytes"));
    let ns = u64::from_le_bytes(msg[32..40].try_into().expect("8 bytes"));
    pid == std::process::id() && ns == pid_namespace()
}

/// Reads entry `i` of a peer's message: the export (if the buffer is not empty) and bytes.
fn entry(msg: &[u8], i: usize) -> Result<(Option<ipc::Export>, usize)> {
    let e = &msg[HEADER_BYTES + i * ENTRY_BYTES..][..ENTRY_BYTES];
    let bytes = u64::from_le_bytes(e[ipc::EXPORT_BYTES..].try_into().expect("8 bytes")) as usize;
    if bytes == 0 {
        return Ok((None, 0));
    }
    let x =
        ipc::Export::decode(&e[..ipc::EXPORT_BYTES]).ok_or_else(|| Error::remote("bad buffer export from a peer"))?;
    Ok((Some(x), bytes))
}

/// Which rank of a pair copies: ranks on different GPUs push (the sender writes across the
/// link, as posted writes are what NVLink and PCIe do best); ranks sharing a GPU leave both
/// directions to the lower rank, so that with two processes only one context has copies to
/// run: processes that share a GPU without MPS take turns on it, and a second context with
/// work queued costs a time slice (measured: 290 us per 8-byte send and receive when both
/// ranks copied).
fn sender_copies(comm: &Comm, sender: usize, receiver: usize) -> bool {
    pushes(comm.peers[sender].gpu.bus, comm.peers[receiver].gpu.bus, sender, receiver)
}

/// [`sender_copies`] from the two ranks' GPUs (PCI locations) and numbers.
fn pushes(sender_gpu: u64, receiver_gpu: u64, sender: usize, receiver: usize) -> bool {
    sender_gpu != receiver_gpu || sender < receiver
}

/// What one send or receive of this rank does on its stream.
struct Step {
    /// Index of the request.
    i: usize,
    peer: usize,
    /// This rank runs the copy (push for a send, pull for a receive).
    copies: bool,
    /// The pair's line: `first` is the word the copier waits on (written by the other rank
    /// first), `second` the word the copier writes after the copy (the other rank waits on it).
    first: u64,
    second: u64,
}

/// Queues the flag writes, the copies and the waits on the requests' streams, in [`Turn`]s
/// (each turn on every stream, streams in the order of their first request). The line of a pair (s -> d)
/// lives in d's inbox; with a push, d writes "buffer ready" and s "delivered"; with a pull, s
/// writes "buffer ready" and d "consumed". A failure still writes and waits the flags a peer's
/// stream waits on, so that no stream waits for ever.
fn queue(
    comm: &Arc<Comm>,
    st: &P2pState,
    reqs: &[OpRequest],
    peers: &[usize],
    messages: &[Vec<u8>],
    turns: Option<&MateTurns>,
) -> Result<()> {
    let me = comm.rank;
    let mut first_error: Option<Error> = None;
    let mut note = |e: Error| {
        log::warn!(target: "P2P", "device send/receive: {e}");
        first_error.get_or_insert(e);
    };
    // Sequence numbers of this group's messages, per request.
    let mut seq = vec![0u32; reqs.len()];
    {
        let mut sent = st.inner.sent.lock().unwrap_or_else(|p| p.into_inner());
        let mut received = st.inner.received.lock().unwrap_or_else(|p| p.into_inner());
        for (i, r) in reqs.iter().enumerate() {
            let counter = match r.op {
                CollOp::Send { peer } => &mut sent[peer],
                _ => &mut received[peer_of(r)],
            };
            *counter = counter.wrapping_add(1);
            seq[i] = *counter;
        }
    }
    let msg_of = |p: usize| &messages[peers.binary_search(&p).expect("a peer of the group")];
    let position = |i: usize| match_position(reqs, i);
    // The pairs' lines, mapping peers' inboxes where this rank's sends' lines live.
    let mut steps = Vec::with_capacity(reqs.len());
    for (i, r) in reqs.iter().enumerate() {
        let (peer, sending) = match r.op {
            CollOp::Send { peer } => (peer, true),
            _ => (peer_of(r), false),
        };
        let copies = if sending { sender_copies(comm, me, peer) } else { !sender_copies(comm, peer, me) };
        let line = if sending {
            let msg = msg_of(peer);
            let page = SharedRef {
                fd: i32::from_le_bytes(msg[8..12].try_into().expect("4 bytes")),
                serial: u64::from_le_bytes(msg[16..24].try_into().expect("8 bytes")),
                size: u64::from_le_bytes(msg[24..32].try_into().expect("8 bytes")),
                offset: 0,
            };
            let pid = u32::from_le_bytes(msg[..4].try_into().expect("4 bytes"));
            st.peer_flag(me, peer, pid, &page, 0).and_then(|w0| Ok((w0, st.peer_flag(me, peer, pid, &page, 1)?)))
        } else {
            Ok((st.own_flag(peer, 0), st.own_flag(peer, 1)))
        };
        match line {
            Ok((first, second)) => steps.push(Step { i, peer, copies, first, second }),
            // Without the receiver's page neither side's flags of this pair can be reached:
            // fail here; the peer's stream is released by its abort or destroy.
            Err(e) => note(e),
        }
    }
    // The sizes are checked on the waiting side too, so that both sides fail.
    for s in steps.iter().filter(|s| !s.copies) {
        let r = &reqs[s.i];
        match entry(msg_of(s.peer), position(s.i)) {
            Ok((_, theirs)) if theirs != r.count * r.dtype.size() => note(size_mismatch(r, s.peer, theirs)),
            Ok(_) => {}
            Err(e) => note(e),
        }
    }
    let mut streams: Vec<(Stream, Vec<&Step>)> = Vec::new();
    for s in &steps {
        let stream = reqs[s.i].stream;
        match streams.iter_mut().find(|(t, _)| *t == stream) {
            Some((_, on)) => on.push(s),
            None => streams.push((stream, vec![s])),
        }
    }
    let aborted = || comm.state() == crate::comm::CommState::Aborted;
    in_turns(turns, &aborted, |turn| {
        for (stream, on) in &streams {
            let (before, copies, after) = turn_work(turn, on, &seq);
            // Each a single batch of flag operations (a driver call each): in the copy turn the
            // other ranks wrote what the copies wait for first thing, so waiting for all before
            // the first copy costs nothing.
            stream.flag_ops(&before, false)?;
            for s in copies {
                if let Err(e) = copy(comm, &reqs[s.i], s.peer, msg_of(s.peer), position(s.i), *stream) {
                    note(e);
                }
            }
            stream.flag_ops(&after, false)?;
        }
        Ok(())
    })?;
    if let Some(e) = first_error {
        comm.set_async_error(&e);
        return Err(e);
    }
    Ok(())
}

/// The three turns in which a rank queues a group's sends and receives on its streams.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Turn {
    /// "Buffer ready" writes of the pairs the other rank copies for.
    Ready,
    /// The copies this rank runs: wait for the other side's buffer, copy, say so.
    Copy,
    /// Waits for the other ranks' copies.
    Wait,
}

/// What `turn` queues on one stream, for that stream's `steps` (with the group's sequence
/// numbers `seq`, by request): flag operations, the steps whose copies come next, and flag
/// operations after those copies.
fn turn_work<'a>(turn: Turn, steps: &[&'a Step], seq: &[u32]) -> (Vec<FlagOp>, Vec<&'a Step>, Vec<FlagOp>) {
    let (theirs, mine): (Vec<&Step>, Vec<&Step>) = steps.iter().partition(|s| !s.copies);
    match turn {
        Turn::Ready => (theirs.iter().map(|s| FlagOp::Write(s.first, seq[s.i])).collect(), Vec::new(), Vec::new()),
        Turn::Copy => (
            mine.iter().map(|s| FlagOp::WaitGeq(s.first, seq[s.i])).collect(),
            mine.clone(),
            mine.iter().map(|s| FlagOp::Write(s.second, seq[s.i])).collect(),
        ),
        Turn::Wait => (theirs.iter().map(|s| FlagOp::WaitGeq(s.second, seq[s.i])).collect(), Vec::new(), Vec::new()),
    }
}

/// A rank's turns with the ranks of its group that are threads of its process (its mates):
/// counted when the group starts, and published however the group ends, so that no mate
/// waits on the host for ever and every later group's counts stay in step.
struct MateTurns {
    order: Arc<LocalOrder>,
    /// (mate, count) reached by this group's ready writes, then by its copies.
    ready: Vec<(usize, u64)>,
    copied: Vec<(usize, u64)>,
}

impl MateTurns {
    /// The turns with `mates`, each with the count the mate had reached with this rank before
    /// the group (from its exchange header): both ranks of a pair count on from the larger of
    /// their two counts, so they agree even after one of them left a group early. `None` when
    /// the group has no mate (nothing to take turns with).
    fn start(order: Option<Arc<LocalOrder>>, mates: &[(usize, u64)]) -> Option<MateTurns> {
        let order = order.filter(|_| !mates.is_empty())?;
        let ready = order.count_from(mates.iter().copied());
        let copied = order.count_from(mates.iter().map(|&(p, _)| (p, 0)));
        Some(MateTurns { order, ready, copied })
    }
}

impl Drop for MateTurns {
    fn drop(&mut self) {
        // Publishing is idempotent (a maximum): what in_turns published stays as it is.
        self.order.publish_counts(&self.ready);
        self.order.publish_counts(&self.copied);
    }
}

/// Runs `submit` for each turn in order. With mates, a rank submits its copies only once each
/// mate of the group has submitted its ready writes, and its waits only once each has
/// submitted its copies: then every wait goes onto the shared hardware queues after the write
/// it waits for, and the earliest blocked wait can only be waiting for work submitted before
/// it, which no later wait holds up.
fn in_turns(
    turns: Option<&MateTurns>,
    aborted: &dyn Fn() -> bool,
    mut submit: impl FnMut(Turn) -> Result<()>,
) -> Result<()> {
    submit(Turn::Ready)?;
    if let Some(t) = turns {
        t.order.publish_counts(&t.ready);
        t.order.wait_counts_unless(aborted, &t.ready)?;
    }
    submit(Turn::Copy)?;
    if let Some(t) = turns {
        t.order.publish_counts(&t.copied);
        t.order.wait_counts_unless(aborted, &t.copied)?;
    }
    submit(Turn::Wait)
}

/// The index of request `i`'s match in its peer's message: the peer lists its sends to this
/// rank, then its receives from it, each in call order (as [`entries_for`] writes them).
fn match_position(reqs: &[OpRequest], i: usize) -> usize {
    let r = &reqs[i];
    let same_kind_before = reqs[..i].iter().filter(|q| q.op == r.op).count();
    match r.op {
        // A send's match is the peer's receive, listed after the peer's sends to this rank, as
        // many as this rank's receives from it.
        CollOp::Send { peer } => reqs.iter().filter(|q| q.op == CollOp::Recv { peer }).count() + same_kind_before,
        _ => same_kind_before,
    }
}

fn size_mismatch(r: &OpRequest, peer: usize, theirs: usize) -> Error {
    let bytes = r.count * r.dtype.size();
    match r.op {
        CollOp::Send { .. } => Error::invalid_usage(format!(
            "ncclSend of {bytes} bytes to rank {peer} matched a receive of {theirs} bytes"
        )),
        _ => {
            Error::invalid_usage(format!("ncclRecv of {bytes} bytes from rank {peer} matched a send of {theirs} bytes"))
        }
    }
}

/// The copy of request `r` with `peer`, whose message `msg` describes the other end at
/// `position`: into the receiver's buffer (a send) or out of the sender's (a receive).
fn copy(comm: &Comm, r: &OpRequest, peer: usize, msg: &[u8], position: usize, stream: Stream) -> Result<()> {
    if msg[4] != 0 {
        return Err(Error::remote(format!("rank {peer} could not export its buffer (see its log)")));
    }
    let (export, theirs) = entry(msg, position)?;
    let bytes = r.count * r.dtype.size();
    if theirs != bytes {
        return Err(size_mismatch(r, peer, theirs));
    }
    let Some(export) = export else { return Ok(()) };
    let pid = u32::from_le_bytes(msg[..4].try_into().expect("4 bytes"));
    let other = if export.handle == ipc::Handle::Local {
        if !is_this_process(msg) {
            return Err(Error::remote(format!(
                "rank {peer} passed its buffer's address as a thread of this process, but it is another process \
                 (pid {pid} in another pid namespace)"
            )));
        }
        // A process mate's buffer: on another device, the stream's context must map that
        // device's memory for the copy to go across the link.
        let dev = comm.peers[peer].cuda_dev;
        if dev != comm.cuda_dev {
            crate::cuda::driver::enable_peer_access_from(stream.context()?, dev)?;
        }
        export.addr as *mut u8
    } else {
        ipc::open(pid, &export)?
    };
    let (dst, src) = match r.op {
        CollOp::Send { .. } => (other, r.send),
        _ => (r.recv, other as *const u8),
    };
    // SAFETY: `other` is the peer's live buffer of `bytes` bytes (exported for this call and
    // kept until its stream passes its wait on this pair's second flag, written after this
    // copy); this rank's buffer holds as many (NCCL's rules).
    unsafe { stream.copy(dst, src, bytes) }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cuda::memory::MemKind;

    fn req(op: CollOp) -> OpRequest {
        OpRequest {
            op,
            send: std::ptr::null(),
            recv: std::ptr::null_mut(),
            count: 1,
            dtype: crate::types::DataType::Float32,
            reduction: None,
            mem: MemKind::Host,
            stream: Stream(0),
            pre_device: None,
            device_call: true,
        }
    }

    /// Two ranks' groups whose messages must pair up: each request's match position in the
    /// peer's message must name the peer's request of the opposite kind with the same rank
    /// among its kind, whatever the call order on either side.
    #[test]
    fn every_request_finds_its_match_in_the_peers_message() {
        use CollOp::{Recv, Send};
        // Rank 0 and rank 1, with sends and receives between them interleaved differently,
        // and a third rank's traffic mixed in on rank 0's side.
        let rank0 = [Recv { peer: 1 }, Send { peer: 1 }, Send { peer: 2 }, Send { peer: 1 }, Recv { peer: 1 }];
        let rank1 = [Send { peer: 0 }, Send { peer: 0 }, Recv { peer: 0 }, Recv { peer: 0 }];
        let reqs0: Vec<OpRequest> = rank0.iter().map(|&op| req(op)).collect();
        let reqs1: Vec<OpRequest> = rank1.iter().map(|&op| req(op)).collect();
        // Each side's message to the other, as entries_for writes it: (kind, index among kind).
        let message = |reqs: &[OpRequest], peer: usize| -> Vec<(bool, usize)> {
            let mut sends = 0;
            let mut recvs = 0;
            entries_for(reqs, peer)
                .map(|r| match r.op {
                    Send { .. } => {
                        sends += 1;
                        (true, sends - 1)
                    }
                    _ => {
                        recvs += 1;
                        (false, recvs - 1)
                    }
                })
                .collect()
        };
        let (from0, from1) = (message(&reqs0, 1), message(&reqs1, 0));
        assert_eq!(from0.len(), from1.len(), "both messages describe the pair's four transfers");
        for (mine, theirs, peer) in [(&reqs0, &from1, 1), (&reqs1, &from0, 0)] {
            let mut nth = std::collections::HashMap::new();
            for (i, r) in mine.iter().enumerate() {
                if peer_of(r) != peer {
                    continue;
                }
                let k = nth.entry(matches!(r.op, Send { .. })).or_insert(0);
                let (their_kind_is_send, their_index) = theirs[match_position(mine, i)];
                assert_eq!(their_kind_is_send, !matches!(r.op, Send { .. }), "request {i} matched the same kind");
                assert_eq!(their_index, *k, "request {i} matched the {their_index}th of its kind, not the {k}th");
                *k += 1;
            }
        }
    }

    /// A GPU whose streams all feed one hardware queue (CUDA_DEVICE_MAX_CONNECTIONS=1, the
    /// worst case for ranks that are threads of one process): it runs what the ranks submit
    /// strictly in submission order, a wait holding up everything behind it.
    #[derive(Default)]
    struct OneQueue {
        items: Mutex<std::collections::VecDeque<Item>>,
    }

    enum Item {
        Flag(FlagOp),
        /// A message copied from rank `from` to rank `to` (its `seq`-th).
        Copy {
            from: usize,
            to: usize,
            seq: u32,
        },
    }

    impl OneQueue {
        fn push(&self, item: Item) {
            self.items.lock().unwrap().push_back(item);
        }

        /// Runs the queue until it is empty once `submitted()` says nothing more will come
        /// (the copies it ran, in order), or until its head is a wait that nothing left to
        /// submit can satisfy (a deadlock: `Err`).
        fn run(&self, submitted: impl Fn() -> bool) -> std::result::Result<Vec<(usize, usize, u32)>, String> {
            let mut flags: HashMap<u64, u32> = HashMap::new();
            let mut copies = Vec::new();
            loop {
                let all_in = submitted();
                let mut items = self.items.lock().unwrap();
                let Some(head) = items.front() else {
                    if all_in {
                        return Ok(copies);
                    }
                    drop(items);
                    std::thread::yield_now();
                    continue;
                };
                let passed = match head {
                    Item::Flag(FlagOp::Write(a, v)) => {
                        flags.insert(*a, *v);
                        true
                    }
                    Item::Flag(FlagOp::WaitGeq(a, v)) => {
                        (flags.get(a).copied().unwrap_or(0).wrapping_sub(*v) as i32) >= 0
                    }
                    Item::Flag(FlagOp::WaitEq(a, v)) => flags.get(a) == Some(v),
                    Item::Copy { from, to, seq } => {
                        copies.push((*from, *to, *seq));
                        true
                    }
                };
                if passed {
                    items.pop_front();
                } else if all_in {
                    return Err(format!("the queue's head waits for ever ({} items behind it)", items.len() - 1));
                } else {
                    drop(items);
                    std::thread::yield_now();
                }
            }
        }
    }

    /// `n` ranks, threads of one process on one GPU, each running `groups` groups of sends to
    /// and receives from `peers(rank)` (every pair both ways) through the queuing of this path
    /// (steps, turns, each turn's work) onto [`OneQueue`]. `delay` holds a rank back before a
    /// group. Returns the queue's verdict.
    fn one_queue_run(
        n: usize,
        groups: u32,
        peers: fn(usize, usize) -> Vec<usize>,
        take_turns: bool,
        delay: fn(usize, u32) -> std::time::Duration,
    ) -> std::result::Result<Vec<(usize, usize, u32)>, String> {
        let gpu = Arc::new(OneQueue::default());
        let done = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let orders = crate::coll::local_order::ranks_of_one_process(&(0..n).collect::<Vec<_>>(), n);
        let inbox = |rank: usize| (rank as u64 + 1) << 16;
        let ranks: Vec<_> = orders
            .into_iter()
            .enumerate()
            .map(|(me, order)| {
                let (gpu, done, order) = (gpu.clone(), done.clone(), Arc::new(order));
                std::thread::spawn(move || {
                    let gpu_bus = 1u64 << 48;
                    for g in 0..groups {
                        std::thread::sleep(delay(me, g));
                        // Each peer: a send to it, then a receive from it.
                        let mut steps = Vec::new();
                        let mut sending = Vec::new();
                        for p in peers(me, n) {
                            for send in [true, false] {
                                let copies = if send {
                                    pushes(gpu_bus, gpu_bus, me, p)
                                } else {
                                    !pushes(gpu_bus, gpu_bus, p, me)
                                };
                                let (owner, source) = if send { (p, me) } else { (me, p) };
                                let (first, second) =
                                    (word_addr(inbox(owner), source, 0), word_addr(inbox(owner), source, 1));
                                steps.push(Step { i: steps.len(), peer: p, copies, first, second });
                                sending.push(send);
                            }
                        }
                        let seq = vec![g + 1; steps.len()];
                        let mates: Vec<(usize, u64)> = peers(me, n).into_iter().map(|p| (p, 0)).collect();
                        let turns = if take_turns { MateTurns::start(Some(order.clone()), &mates) } else { None };
                        let on: Vec<&Step> = steps.iter().collect();
                        in_turns(turns.as_ref(), &|| false, |turn| {
                            let (before, copies, after) = turn_work(turn, &on, &seq);
                            before.into_iter().for_each(|f| gpu.push(Item::Flag(f)));
                            for s in copies {
                                let (from, to) = if sending[s.i] { (me, s.peer) } else { (s.peer, me) };
                                gpu.push(Item::Copy { from, to, seq: seq[s.i] });
                            }
                            after.into_iter().for_each(|f| gpu.push(Item::Flag(f)));
                            Ok(())
                        })
                        .expect("turns never fail here");
                    }
                    done.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                })
            })
            .collect();
        let verdict = gpu.run(|| done.load(std::sync::atomic::Ordering::SeqCst) == n);
        for r in ranks {
            r.join().unwrap();
        }
        verdict
    }

    /// Ranks that are threads of one process share the hardware queues: a rank that queues its
    /// wait for a copy before the copying mate has queued that copy stops the queue for good.
    /// Taking turns makes every pattern and timing go through; without turns, a mate late by a
    /// few milliseconds is enough to stop it (the model can fail).
    #[test]
    fn mates_sharing_one_hardware_queue_never_wait_on_each_other() {
        use std::time::Duration;
        let ring = |me: usize, n: usize| {
            let mut p = vec![(me + 1) % n, (me + n - 1) % n];
            p.dedup();
            p
        };
        let everyone = |me: usize, n: usize| (0..n).filter(|&p| p != me).collect();
        let late_rank0 = |me: usize, _g: u32| Duration::from_millis(if me == 0 { 20 } else { 0 });
        // Pseudo-random holds, different per rank and group.
        let jitter = |me: usize, g: u32| Duration::from_micros(((me as u64 * 7919 + g as u64 * 104_729) % 997) * 3);

        let e = one_queue_run(2, 1, ring, false, late_rank0).expect_err("without turns the late copier is waited for");
        assert!(e.contains("waits for ever"), "{e}");

        for (n, peers, delay, groups) in [
            (2, ring as fn(usize, usize) -> Vec<usize>, late_rank0 as fn(usize, u32) -> Duration, 3),
            (3, ring, late_rank0, 3),
            (3, ring, jitter, 20),
            (4, everyone, late_rank0, 3),
            (4, everyone, jitter, 20),
        ] {
            let copies = one_queue_run(n, groups, peers, true, delay).unwrap_or_else(|e| panic!("{n} ranks: {e}"));
            // Every message of every group, exactly once.
            let mut want: Vec<(usize, usize, u32)> = (0..n)
                .flat_map(|me| peers(me, n).into_iter().map(move |p| (me, p)))
                .flat_map(|(from, to)| (1..=groups).map(move |g| (from, to, g)))
                .collect();
            let mut got = copies.clone();
            want.sort_unstable();
            got.sort_unstable();
            assert_eq!(got, want, "{n} ranks: the messages copied");
        }
    }

    #[test]
    fn on_one_gpu_the_lower_rank_copies_and_between_gpus_the_sender() {
        let (a, b) = (1 << 48 | 0x19 << 8, 1 << 48 | 0x3b << 8);
        assert!(pushes(a, a, 0, 1), "one GPU: rank 0 pushes what it sends to rank 1");
        assert!(!pushes(a, a, 1, 0), "one GPU: rank 0 pulls what rank 1 sends it");
        assert!(pushes(a, b, 1, 0) && pushes(b, a, 0, 1), "two GPUs: each sender pushes");
    }
}
