//! How bytes move between ranks.
//!
//! [`Net`] is shaped like NCCL's `ncclNet_t` (listen / connect / accept / isend / irecv / test)
//! so the socket transport, InfiniBand verbs and external plugins sit behind one table. None of
//! its calls block for long: `accept` and `isend`/`irecv` return `None` for "try again", `test`
//! polls. Buffers are raw memory regions ([`MemRegion`]) because they may be user memory that
//! the executor keeps alive and unaliased for the life of the request; later, device memory.
//!
//! [`links`] keeps one communicator's connections per peer and chooses the transport for each
//! peer (network today; shared memory and P2P come first in the priority order later).

pub mod links;
pub mod netif;
pub mod socket;
pub mod socket_net;

use std::os::fd::RawFd;

use crate::error::Result;

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
    /// Posts a send of the whole region; `None` if the connection cannot take more now.
    fn isend(&mut self, data: MemRegion) -> Result<Option<RequestId>>;
    /// `Some(bytes)` once the request is complete (its region may be reused).
    fn test(&mut self, req: RequestId) -> Result<Option<usize>>;
    fn wait_hint(&self) -> Option<WaitHint>;
    /// "NET/Socket/0" and the like, for the Channel log lines.
    fn via(&self) -> String;
}

/// Receiving half of a connection.
pub trait NetRecv: Send {
    /// Posts a receive of exactly `data.len()` bytes (a different size from the peer is an error).
    fn irecv(&mut self, data: MemRegion) -> Result<Option<RequestId>>;
    fn test(&mut self, req: RequestId) -> Result<Option<usize>>;
    fn wait_hint(&self) -> Option<WaitHint>;
}
