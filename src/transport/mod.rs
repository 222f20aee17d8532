//! How bytes move between ranks.
//!
//! [`Net`] is shaped like NCCL's `ncclNet_t` (listen / connect / accept / isend / irecv / test)
//! so the socket transport, InfiniBand verbs and external plugins sit behind one table. None of
//! its calls block for long: `accept` and `isend`/`irecv` return `None` for "try again", `test`
//! polls. Buffers are raw memory regions ([`MemRegion`]) because they may be user memory that
//! the executor keeps alive and unaliased for the life of the request; later, device memory.
//!
//! [`tier`] holds the transport tiers in NCCL's shape and order (P2P, SHM, NET: the first whose
//! `can_connect` holds wins, per peer, once at setup); [`net_select`] picks the network of the
//! NET tier at run time (IB when present and built, else sockets; `NCCL_NET`). [`links`] keeps
//! one communicator's connections per peer over the tier chosen for it.
//!
//! [`ib`] is the InfiniBand/RoCE network (verbs behind the `ib` feature; its logic is pure and
//! tested without hardware). Also here: [`socket`] (TCP building blocks the bootstrap uses
//! too), [`socket_net`], [`shm`], [`node_area`], [`peer_mem`], [`huge_pages`], [`netif`], and
//! [`exchange`] (the all-gather transports need from the bootstrap, as a trait, so that they
//! sit below it). Byte layouts are `wire`'s,
//! reductions applied on receipt are `reduce`'s.

pub mod exchange;
pub mod huge_pages;
pub mod ib;
pub mod links;
pub mod net_select;
pub mod netif;
pub mod node_area;
pub mod peer_mem;
pub mod share_heap;
pub mod shm;
pub mod socket;
pub mod socket_net;
pub mod tier;

use std::os::fd::RawFd;

use crate::error::Result;
pub use crate::wire::OpSig;

/// A region of memory a request reads or writes.
#[derive(Clone, Copy, Debug)]
pub struct MemRegion {
    ptr: *mut u8,
    len: usize,
}

// SAFETY: a MemRegion is only an address; whoever creates one guarantees (see `new`) that the
// memory stays valid and unaliased while requests use it, from whichever thread progresses them.
unsafe impl Send for MemRegion {}

impl MemRegion {
    /// # Safety
    /// `ptr..ptr+len` must stay valid (and, for receives, not be read or written by anyone
    /// else) until every request using this region has completed or its connection is dropped.
    pub unsafe fn new(ptr: *mut u8, len: usize) -> MemRegion {
        MemRegion { ptr, len }
    }
    pub fn len(&self) -> usize {
        self.len
    }
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
    pub fn ptr(&self) -> *mut u8 {
        self.ptr
    }
}

/// Identifies one posted request on its connection.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct RequestId(pub u64);

/// What a progress loop should wait on when nothing moves.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct WaitHint {
    pub fd: RawFd,
    pub readable: bool,
    pub writable: bool,
}

/// poll(2) over `fds` for at most `ms` milliseconds: the number of descriptors with events,
/// 0 on timeout or error (EINTR included; callers look again).
pub fn poll_ms(fds: &mut [rustix::event::PollFd<'_>], ms: i64) -> usize {
    let timeout = rustix::event::Timespec { tv_sec: ms / 1000, tv_nsec: (ms % 1000) * 1_000_000 };
    rustix::event::poll(fds, Some(&timeout)).unwrap_or(0)
}

/// Opaque per-listener address a peer needs to connect (NCCL: <= 128 bytes).
pub type NetHandle = Vec<u8>;

/// Identifies the connecting side to the acceptor.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ConnectorId {
    pub comm_magic: u64,
    pub rank: u32,
    pub channel: u32,
}

/// A network provider (`ncclNet_t`).
pub trait Net: Send + Sync {
    /// Name as NCCL logs it ("Socket", "IB").
    fn name(&self) -> &'static str;
    /// A line describing the device, for `NET/<name> : Using ...`.
    fn describe(&self) -> String;
    /// Starts listening; the handle goes to peers through the bootstrap.
    fn listen(&self, comm_magic: u64) -> Result<(NetHandle, Box<dyn NetListener>)>;
    /// Connects to a peer's handle. May block briefly (bounded by the bootstrap timeout).
    fn connect(&self, handle: &[u8], me: ConnectorId) -> Result<Box<dyn NetSend>>;
}

/// The accepting side of a [`Net`].
pub trait NetListener: Send {
    /// A new receive connection and who made it, or `None` if none is waiting.
    fn accept(&mut self) -> Result<Option<(ConnectorId, Box<dyn NetRecv>)>>;
    fn wait_hint(&self) -> Option<WaitHint>;
}

/// Sending half of a connection.
pub trait NetSend: Send {
    /// Posts a send of the whole region made by a call of signature `sig` (which travels with
    /// it, for the receiver to compare); `None` if the connection cannot take more now.
    fn isend(&mut self, data: MemRegion, sig: OpSig) -> Result<Option<RequestId>>;
    /// `Some(bytes)` once the request is complete (its region may be reused).
    fn test(&mut self, req: RequestId) -> Result<Option<usize>>;
    fn wait_hint(&self) -> Option<WaitHint>;
    /// A number that grows as data leaves (bytes, slots or pieces; only changes matter): tells
    /// the no-progress watchdog that a long request is still moving.
    fn progress_mark(&self) -> u64 {
        0
    }
    /// "NET/Socket/0" and the like, for the Channel log lines.
    fn via(&self) -> String;
}

/// What a receive does with the arriving bytes, for transports that can apply it as data
/// lands (shared memory reduces straight from its slots into the destination).
#[derive(Clone, Copy, Debug)]
pub enum RecvOp {
    /// `dst = incoming`.
    Copy,
    /// `dst = incoming (op) pre(local)`; `local` may be `dst` itself.
    Combine { local: MemRegion, reduction: crate::reduce::Reduction },
    /// `dst = dst (op) incoming`.
    Accumulate { reduction: crate::reduce::Reduction },
}

/// Applies `op` to bytes `[offset, offset + incoming.len())` of a receive into `dst`.
pub fn apply_recv_op(dst: MemRegion, op: &RecvOp, offset: usize, incoming: &[u8]) -> Result<()> {
    let len = incoming.len();
    if offset + len > dst.len() {
        return Err(crate::error::Error::internal("receive piece outside its destination"));
    }
    if len == 0 {
        return Ok(());
    }
    // SAFETY: MemRegion's contract: dst is ours alone until the request completes; the piece
    // lies inside it (checked above).
    let d = unsafe { std::slice::from_raw_parts_mut(dst.ptr().add(offset), len) };
    match op {
        RecvOp::Copy => {
            crate::memcopy::copy(d, incoming);
            Ok(())
        }
        RecvOp::Accumulate { reduction } => reduction.accumulate(d, incoming),
        RecvOp::Combine { local, reduction } => {
            if std::ptr::eq(local.ptr(), dst.ptr()) {
                reduction.combine_in_place(d, incoming)
            } else {
                // SAFETY: local is a live region of the same length, disjoint from dst (the
                // executor checks overlap before posting).
                let l = unsafe { std::slice::from_raw_parts(local.ptr().add(offset) as *const u8, len) };
                reduction.combine(d, incoming, l)
            }
        }
    }
}

/// Receiving half of a connection.
pub trait NetRecv: Send {
    /// Posts a receive of exactly `data.len()` bytes (a different size from the peer is an
    /// error) for a call of signature `sig`: a message sent by a call of another signature
    /// fails the request with `ncclInvalidUsage` naming the difference.
    fn irecv(&mut self, data: MemRegion, sig: OpSig) -> Result<Option<RequestId>>;
    /// Posts a receive that applies `op` as the bytes arrive (only where
    /// [`NetRecv::reduces_on_arrival`] is true; others stage and reduce at completion).
    fn irecv_op(&mut self, data: MemRegion, op: RecvOp, sig: OpSig) -> Result<Option<RequestId>> {
        match op {
            RecvOp::Copy => self.irecv(data, sig),
            _ => Err(crate::error::Error::internal("this transport cannot reduce on arrival")),
        }
    }
    /// Whether `irecv_op` takes reductions.
    fn reduces_on_arrival(&self) -> bool {
        false
    }
    fn test(&mut self, req: RequestId) -> Result<Option<usize>>;
    fn wait_hint(&self) -> Option<WaitHint>;
    /// As [`NetSend::progress_mark`], for arriving data.
    fn progress_mark(&self) -> u64 {
        0
    }
}
