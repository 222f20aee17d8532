//! The IB data path's flow control and completion handling, as pure state machines
//! ([`SendFlow`], [`RecvFlow`]) that act only through the small [`Rdma`] trait: the verbs
//! edge implements it over a real queue pair, the unit tests over an in-memory double.
//!
//! The protocol (NCCL's, in its own words here):
//! - The sender owns a FIFO of [`FIFO_SLOTS`] clear-to-send slots, registered for remote
//!   writes; its address and rkey travel in the sender's connection info.
//! - `irecv` number `s` (from 1) first posts a receive work request (it will take the data's
//!   immediate), then RDMA-writes a [`CtsEntry`] (destination address, size, rkey, `s`) into
//!   slot `s mod FIFO_SLOTS` of the sender's FIFO.
//! - `isend` number `s` waits until its slot holds entry `s`, then RDMA-writes the data in
//!   pieces of at most [`MAX_WRITE`] bytes, the last with immediate data `s` (31 bits). When
//!   the sizes differ it writes nothing and sends the immediate with [`IMM_SIZE_MISMATCH`]
//!   set, so both sides fail the message instead of the receiver waiting for ever.
//! - Messages match in posting order on each side. At most [`FIFO_SLOTS`] receives are
//!   outstanding (a receiver never overwrites a slot its sender has not consumed: receive `s`
//!   is posted only after receive `s - FIFO_SLOTS` completed, which needs send `s -
//!   FIFO_SLOTS` to have read its slot); at most [`FIFO_SLOTS`] sends are outstanding.
//! - A request completes when all its work completions arrived, in whatever order the
//!   completion queue reports them (a receive also needs its CTS write's completion, which
//!   may come after the data). A failed completion fails the connection: the queue pair is
//!   in the error state and everything after it is flushed. Completion errors map onto
//!   `ncclRemoteError` (the peer or the fabric) or `ncclSystemError` (this side), naming the
//!   peer; a peer that closed its setup connection fails every outstanding request.

use std::collections::VecDeque;

use crate::error::{Error, Result};
use crate::transport::RequestId;
use crate::wire::{CtsEntry, CTS_BYTES};

/// Clear-to-send slots per connection (NCCL: 32 requests per communicator).
pub const FIFO_SLOTS: usize = 32;
/// Largest single RDMA write (verbs allow 2^31 bytes per work request).
pub const MAX_WRITE: usize = 1 << 30;
/// Immediate-data flag: the sender's size differed from the receiver's; no data was written.
pub const IMM_SIZE_MISMATCH: u32 = 1 << 31;
const IMM_SEQ_MASK: u32 = IMM_SIZE_MISMATCH - 1;

/// What a work request id says about its request (the low 40 bits are the message number).
const WR_DATA: u64 = 1;
const WR_CTS: u64 = 2;
const WR_RECV: u64 = 3;
const SEQ_BITS: u32 = 40;
const SEQ_MASK: u64 = (1 << SEQ_BITS) - 1;

fn wr_id(kind: u64, seq: u64) -> u64 {
    (kind << 56) | (seq & SEQ_MASK)
}

fn wr_kind(id: u64) -> u64 {
    id >> 56
}

/// The message number whose low bits are `low`, among those in `(newest - window, newest]`.
fn widen(low: u64, bits: u32, newest: u64) -> u64 {
    let mask = (1u64 << bits) - 1;
    let back = newest.wrapping_sub(low) & mask;
    newest.wrapping_sub(back)
}

/// Bytes of the last write of a `len`-byte message (the one with the immediate; a receive
/// completion reports its length).
pub fn last_piece(len: usize, max_write: usize) -> usize {
    if len == 0 {
        0
    } else {
        len - (len - 1) / max_write * max_write
    }
}

/// Where bytes of an RDMA write come from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WriteSource<'a> {
    /// Copied into the work request (small control messages: CTS entries).
    Inline(&'a [u8]),
    /// Registered memory.
    Registered { addr: u64, len: usize, lkey: u32 },
}

impl WriteSource<'_> {
    pub fn len(&self) -> usize {
        match self {
            WriteSource::Inline(b) => b.len(),
            WriteSource::Registered { len, .. } => *len,
        }
    }
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// Where an RDMA write lands in the peer's memory.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RemoteSeg {
    pub addr: u64,
    pub rkey: u32,
}

/// What a work completion reports (the verbs edge translates `ibv_wc` into this).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Completion {
    pub wr_id: u64,
    /// `ibv_wc_status`: 0 is success.
    pub status: u32,
    pub vendor_err: u32,
    /// For receives: the immediate data and bytes written.
    pub recv: Option<(u32, u32)>,
}

impl Completion {
    pub fn ok(wr_id: u64) -> Completion {
        Completion { wr_id, status: 0, vendor_err: 0, recv: None }
    }
}

/// The queue pair and completion queue a flow drives.
pub trait Rdma {
    /// Posts a signaled RDMA write of `src` to `dst`, with immediate data when `imm` is set.
    fn post_write(&mut self, wr_id: u64, src: WriteSource<'_>, dst: RemoteSeg, imm: Option<u32>) -> Result<()>;
    /// Posts a receive work request (for a write with immediate; it takes no bytes).
    fn post_recv(&mut self, wr_id: u64) -> Result<()>;
    /// Appends the completions that arrived since the last call.
    fn poll(&mut self, out: &mut Vec<Completion>) -> Result<()>;
    /// The sender's CTS FIFO slot `slot`, as the peer last wrote it.
    fn fifo_slot(&self, slot: usize) -> [u8; CTS_BYTES];
    /// True once the peer closed its side (its setup connection ended).
    fn peer_closed(&mut self) -> bool;
}

/// `ibv_wc_status` names, for messages.
pub fn wc_status_name(status: u32) -> &'static str {
    match status {
        0 => "success",
        1 => "local length error",
        2 => "local QP operation error",
        3 => "local EE context operation error",
        4 => "local protection error",
        5 => "work request flushed",
        6 => "memory window bind error",
        7 => "bad response",
        8 => "local access error",
        9 => "remote invalid request",
        10 => "remote access error",
        11 => "remote operation error",
        12 => "transport retry counter exceeded",
        13 => "RNR retry counter exceeded",
        14 => "local RDD violation",
        15 => "remote invalid RD request",
        16 => "remote aborted",
        17 => "invalid EE context number",
        18 => "invalid EE context state",
        19 => "fatal error",
        20 => "response timeout",
        21 => "general error",
        22 => "tag matching error",
        23 => "tag matching rendezvous incomplete",
        _ => "unknown status",
    }
}

/// Maps a failed completion onto NCCL's codes: the peer's side or the fabric between
/// (`ncclRemoteError`), or this side (`ncclSystemError`). `what` names the operation.
pub fn completion_error(c: &Completion, what: &str, peer: &str) -> Error {
    let msg = format!(
        "NET/IB : {what} to/from {peer} failed: completion status {} ({}), vendor error {:#x}",
        c.status,
        wc_status_name(c.status),
        c.vendor_err
    );
    match c.status {
        // Remote side, or the path to it: the peer died, its memory went away, it refused.
        5 | 7 | 9 | 10 | 11 | 12 | 13 | 15 | 16 | 20 => Error::remote(msg),
        _ => Error::system(msg, std::io::Error::other("RDMA work completion error")),
    }
}

fn peer_closed_error(peer: &str, waiting: usize) -> Error {
    Error::remote(format!("NET/IB : connection with {peer} closed by the peer with {waiting} request(s) outstanding"))
}

fn size_mismatch(peer: &str, sent: Option<u64>, posted: u64) -> Error {
    let sent = sent.map(|s| format!("{s} bytes")).unwrap_or_else(|| "a different size".into());
    Error::invalid_usage(format!(
        "message size mismatch: peer {peer} sent {sent}, {posted} were posted (do the ranks' calls match?)"
    ))
}

#[derive(Debug)]
enum SendState {
    /// Waiting for its CTS.
    Waiting,
    /// Cleared to send to `dst`: pieces `0..next` of `pieces` posted, `pending` of them
    /// not completed yet.
    Writing {
        dst: RemoteSeg,
        next: usize,
        pieces: usize,
        pending: usize,
    },
    Done,
    Failed(Error),
}

#[derive(Debug)]
struct SendReq {
    seq: u64,
    addr: u64,
    len: usize,
    lkey: u32,
    state: SendState,
    reported: bool,
}

/// The sending half's state: requests in posting order (message numbers `first_seq..`).
pub struct SendFlow {
    peer: String,
    reqs: VecDeque<SendReq>,
    /// Message number of `reqs[0]`.
    first_seq: u64,
    /// Next message number to post.
    next_seq: u64,
    /// Send-queue entries posted and not yet completed, and the queue's size.
    sq_used: usize,
    sq_depth: usize,
    max_write: usize,
    failed: Option<Error>,
    closed: bool,
    /// Completions polled (progress marks).
    completions: u64,
    scratch: Vec<Completion>,
}

impl SendFlow {
    /// `sq_depth`: the queue pair's send queue size (at least one message's writes).
    pub fn new(peer: impl Into<String>, sq_depth: usize) -> SendFlow {
        SendFlow {
            peer: peer.into(),
            reqs: VecDeque::new(),
            first_seq: 1,
            next_seq: 1,
            sq_used: 0,
            sq_depth: sq_depth.max(1),
            max_write: MAX_WRITE,
            failed: None,
            closed: false,
            completions: 0,
            scratch: Vec::new(),
        }
    }

    /// Splits messages into writes of at most `n` bytes (default [`MAX_WRITE`]; the
    /// receiver must use the same).
    pub fn with_max_write(mut self, n: usize) -> SendFlow {
        self.max_write = n.clamp(1, MAX_WRITE);
        self
    }

    fn check(&self) -> Result<()> {
        match &self.failed {
            Some(e) => Err(e.duplicate()),
            None => Ok(()),
        }
    }

    /// Queues the send of `len` bytes at `addr` (registered with `lkey`); `None` when
    /// [`FIFO_SLOTS`] sends are outstanding already.
    pub fn post(&mut self, addr: u64, len: usize, lkey: u32) -> Result<Option<RequestId>> {
        self.check()?;
        if self.closed {
            return Err(peer_closed_error(&self.peer, 0));
        }
        if self.reqs.len() >= FIFO_SLOTS {
            return Ok(None);
        }
        let seq = self.next_seq;
        self.next_seq += 1;
        self.reqs.push_back(SendReq { seq, addr, len, lkey, state: SendState::Waiting, reported: false });
        Ok(Some(RequestId(seq)))
    }

    fn find(&mut self, seq: u64) -> Option<&mut SendReq> {
        let i = seq.checked_sub(self.first_seq)?;
        self.reqs.get_mut(usize::try_from(i).ok()?)
    }

    fn fail(&mut self, e: Error) {
        if self.failed.is_none() {
            log::warn!(target: "NET", "{e}");
            self.failed = Some(e);
        }
    }

    /// Handles completions, notices a closed peer, and writes every message whose CTS arrived.
    pub fn progress(&mut self, rdma: &mut dyn Rdma) -> Result<()> {
        // Closure is sampled before polling: whatever the peer did before it closed is in
        // the completion queue by then, so only requests it truly left unfinished fail.
        let closing = !self.closed && rdma.peer_closed();
        let mut done = std::mem::take(&mut self.scratch);
        done.clear();
        let polled = rdma.poll(&mut done);
        for c in &done {
            self.on_completion(c);
        }
        self.scratch = done;
        polled?;
        if closing {
            self.closed = true;
            let waiting =
                self.reqs.iter().filter(|r| matches!(r.state, SendState::Waiting | SendState::Writing { .. })).count();
            if waiting > 0 {
                self.fail(peer_closed_error(&self.peer, waiting));
            }
        }
        if self.failed.is_none() {
            self.write_ready(rdma);
        }
        Ok(())
    }

    fn on_completion(&mut self, c: &Completion) {
        self.completions += 1;
        if wr_kind(c.wr_id) != WR_DATA || c.recv.is_some() {
            let e = Error::internal(format!(
                "NET/IB : unexpected completion {:#x} on the send side of {}",
                c.wr_id, self.peer
            ));
            return self.fail(e);
        }
        self.sq_used = self.sq_used.saturating_sub(1);
        let seq = widen(c.wr_id & SEQ_MASK, SEQ_BITS, self.next_seq.saturating_sub(1));
        if c.status != 0 {
            let e = completion_error(c, &format!("RDMA write of message {seq}"), &self.peer);
            if let Some(r) = self.find(seq) {
                r.state = SendState::Failed(e.duplicate());
            }
            return self.fail(e);
        }
        let peer = self.peer.clone();
        match self.find(seq) {
            Some(r) => match &mut r.state {
                SendState::Writing { next, pieces, pending, .. } if *pending > 0 => {
                    *pending -= 1;
                    if *pending == 0 && *next == *pieces {
                        r.state = SendState::Done;
                    }
                }
                _ => {
                    let e = Error::internal(format!(
                        "NET/IB : completion for message {seq} to {peer}, which has no writes outstanding"
                    ));
                    self.fail(e)
                }
            },
            None => self.fail(Error::internal(format!("NET/IB : completion for unknown message {seq} to {peer}"))),
        }
    }

    /// Posts the writes of cleared messages, oldest first, while the send queue has room.
    /// A message's writes all go before the next message's (the receiver matches the
    /// immediates in order).
    fn write_ready(&mut self, rdma: &mut dyn Rdma) {
        let slots = FIFO_SLOTS as u64;
        for i in 0..self.reqs.len() {
            let (seq, len) = (self.reqs[i].seq, self.reqs[i].len);
            match self.reqs[i].state {
                SendState::Waiting => {}
                SendState::Writing { next, pieces, .. } if next < pieces => {
                    if !self.post_pieces(rdma, i) {
                        return;
                    }
                    continue;
                }
                _ => continue,
            }
            let raw = rdma.fifo_slot(((seq - 1) % slots) as usize);
            let cts = match CtsEntry::decode(&raw) {
                Ok(c) => c,
                Err(e) => return self.fail(e.context(&format!("NET/IB : CTS FIFO written by {}", self.peer))),
            };
            if cts.seq != seq {
                // An older entry (or none yet) is still in the slot: not cleared to send.
                if cts.seq == 0 || (cts.seq < seq && (seq - cts.seq) % slots == 0) {
                    return;
                }
                return self.fail(Error::remote(format!(
                    "NET/IB : CTS FIFO slot for message {seq} holds message {} from {}: protocol error",
                    cts.seq, self.peer
                )));
            }
            let dst = RemoteSeg { addr: cts.addr, rkey: cts.rkey };
            if cts.size != len as u64 {
                if self.sq_used >= self.sq_depth {
                    return;
                }
                let e = size_mismatch(&self.peer, Some(len as u64), cts.size).context("NET/IB");
                self.reqs[i].state = SendState::Failed(e.duplicate());
                // Tell the receiver (nothing is written), then fail this side; the connection
                // is unusable afterwards, as in NCCL.
                let flag = Some((seq as u32) & IMM_SEQ_MASK | IMM_SIZE_MISMATCH);
                if rdma.post_write(wr_id(WR_DATA, seq), WriteSource::Inline(&[]), dst, flag).is_ok() {
                    self.sq_used += 1;
                }
                return self.fail(e);
            }
            let pieces = len.div_ceil(self.max_write).max(1);
            self.reqs[i].state = SendState::Writing { dst, next: 0, pieces, pending: 0 };
            if !self.post_pieces(rdma, i) {
                return;
            }
        }
    }

    /// Posts what fits of request `i`'s remaining pieces; true when all are posted.
    fn post_pieces(&mut self, rdma: &mut dyn Rdma, i: usize) -> bool {
        let (seq, addr, len, lkey) = {
            let r = &self.reqs[i];
            (r.seq, r.addr, r.len, r.lkey)
        };
        let SendState::Writing { dst, mut next, pieces, mut pending } = self.reqs[i].state else {
            return true;
        };
        let mut result = Ok(());
        while next < pieces && self.sq_used < self.sq_depth {
            let off = next * self.max_write;
            let n = (len - off.min(len)).min(self.max_write);
            let src = WriteSource::Registered { addr: addr + off as u64, len: n, lkey };
            let to = RemoteSeg { addr: dst.addr + off as u64, rkey: dst.rkey };
            let imm = (next + 1 == pieces).then_some((seq as u32) & IMM_SEQ_MASK);
            if let Err(e) = rdma.post_write(wr_id(WR_DATA, seq), src, to, imm) {
                result = Err(e);
                break;
            }
            self.sq_used += 1;
            next += 1;
            pending += 1;
        }
        self.reqs[i].state = SendState::Writing { dst, next, pieces, pending };
        match result {
            Ok(()) => next == pieces,
            Err(e) => {
                self.fail(e);
                false
            }
        }
    }

    /// `Some(bytes)` once request `req` is complete (its memory may be reused and its
    /// registration released); an error when it or the connection failed. A request reported
    /// complete is forgotten.
    pub fn test(&mut self, req: RequestId) -> Result<Option<usize>> {
        let seq = req.0;
        let failed = self.failed.as_ref().map(Error::duplicate);
        let Some(r) = self.find(seq) else {
            return Err(Error::internal(format!("NET/IB : test of unknown send request {seq}")));
        };
        match &r.state {
            SendState::Done => {
                r.reported = true;
                let len = r.len;
                while self.reqs.front().is_some_and(|r| r.reported) {
                    self.reqs.pop_front();
                    self.first_seq += 1;
                }
                Ok(Some(len))
            }
            SendState::Failed(e) => Err(e.duplicate()),
            _ => match failed {
                Some(e) => Err(e),
                None => Ok(None),
            },
        }
    }

    /// Requests queued or in flight (not yet forgotten).
    pub fn outstanding(&self) -> usize {
        self.reqs.len()
    }

    /// Grows as completions arrive.
    pub fn progress_mark(&self) -> u64 {
        self.completions
    }
}

#[derive(Debug)]
enum RecvState {
    /// Receive work request and CTS not posted yet.
    Queued,
    /// Posted; waiting for the CTS write's completion and/or the data.
    Posted {
        cts_done: bool,
        data: Option<u32>,
    },
    Done,
    Failed(Error),
}

#[derive(Debug)]
struct RecvReq {
    seq: u64,
    addr: u64,
    len: usize,
    rkey: u32,
    state: RecvState,
    reported: bool,
}

/// The receiving half's state.
pub struct RecvFlow {
    peer: String,
    /// The sender's FIFO (from its connection info).
    fifo: RemoteSeg,
    reqs: VecDeque<RecvReq>,
    first_seq: u64,
    next_seq: u64,
    sq_used: usize,
    sq_depth: usize,
    max_write: usize,
    failed: Option<Error>,
    closed: bool,
    completions: u64,
    scratch: Vec<Completion>,
}

impl RecvFlow {
    pub fn new(peer: impl Into<String>, fifo: RemoteSeg, sq_depth: usize) -> RecvFlow {
        RecvFlow {
            peer: peer.into(),
            fifo,
            reqs: VecDeque::new(),
            first_seq: 1,
            next_seq: 1,
            sq_used: 0,
            sq_depth: sq_depth.max(1),
            max_write: MAX_WRITE,
            failed: None,
            closed: false,
            completions: 0,
            scratch: Vec::new(),
        }
    }

    /// As [`SendFlow::with_max_write`].
    pub fn with_max_write(mut self, n: usize) -> RecvFlow {
        self.max_write = n.clamp(1, MAX_WRITE);
        self
    }

    fn check(&self) -> Result<()> {
        match &self.failed {
            Some(e) => Err(e.duplicate()),
            None => Ok(()),
        }
    }

    fn fail(&mut self, e: Error) {
        if self.failed.is_none() {
            log::warn!(target: "NET", "{e}");
            self.failed = Some(e);
        }
    }

    /// Queues a receive of exactly `len` bytes into `addr` (registered for remote writes
    /// with `rkey`); `None` when [`FIFO_SLOTS`] receives are outstanding already.
    pub fn post(&mut self, addr: u64, len: usize, rkey: u32) -> Result<Option<RequestId>> {
        self.check()?;
        if self.closed {
            return Err(peer_closed_error(&self.peer, 0));
        }
        if self.reqs.len() >= FIFO_SLOTS {
            return Ok(None);
        }
        let seq = self.next_seq;
        self.next_seq += 1;
        self.reqs.push_back(RecvReq { seq, addr, len, rkey, state: RecvState::Queued, reported: false });
        Ok(Some(RequestId(seq)))
    }

    fn find(&mut self, seq: u64) -> Option<&mut RecvReq> {
        let i = seq.checked_sub(self.first_seq)?;
        self.reqs.get_mut(usize::try_from(i).ok()?)
    }

    pub fn progress(&mut self, rdma: &mut dyn Rdma) -> Result<()> {
        // As on the send side: closure sampled first, then the completions drained.
        let closing = !self.closed && rdma.peer_closed();
        let mut done = std::mem::take(&mut self.scratch);
        done.clear();
        let polled = rdma.poll(&mut done);
        for c in &done {
            self.on_completion(c);
        }
        self.scratch = done;
        polled?;
        if closing {
            self.closed = true;
            let waiting =
                self.reqs.iter().filter(|r| matches!(r.state, RecvState::Queued | RecvState::Posted { .. })).count();
            if waiting > 0 {
                self.fail(peer_closed_error(&self.peer, waiting));
            }
        }
        if self.failed.is_none() {
            self.post_queued(rdma);
        }
        Ok(())
    }

    fn on_completion(&mut self, c: &Completion) {
        self.completions += 1;
        let kind = wr_kind(c.wr_id);
        let newest = self.next_seq.saturating_sub(1);
        let seq = widen(c.wr_id & SEQ_MASK, SEQ_BITS, newest);
        if kind == WR_CTS {
            self.sq_used = self.sq_used.saturating_sub(1);
        }
        if c.status != 0 {
            let what = if kind == WR_CTS { "clear-to-send write" } else { "receive" };
            let e = completion_error(c, &format!("{what} of message {seq}"), &self.peer);
            if let Some(r) = self.find(seq) {
                r.state = RecvState::Failed(e.duplicate());
            }
            return self.fail(e);
        }
        let peer = self.peer.clone();
        let max_write = self.max_write;
        let Some(r) = self.find(seq) else {
            return self.fail(Error::internal(format!("NET/IB : completion for unknown message {seq} from {peer}")));
        };
        let (len, rseq) = (r.len, r.seq);
        let RecvState::Posted { cts_done, data } = &mut r.state else {
            return self.fail(Error::internal(format!(
                "NET/IB : completion for message {seq} from {peer}, which is not posted"
            )));
        };
        match (kind, c.recv) {
            (WR_CTS, None) => *cts_done = true,
            (WR_RECV, Some((imm, bytes))) => {
                if imm & IMM_SEQ_MASK != (rseq as u32) & IMM_SEQ_MASK {
                    let e = Error::remote(format!(
                        "NET/IB : message {} from {peer} arrived where message {rseq} was expected: protocol error",
                        imm & IMM_SEQ_MASK
                    ));
                    return self.fail(e);
                }
                if imm & IMM_SIZE_MISMATCH != 0 || bytes as usize != last_piece(len, max_write) {
                    // A bad length without the flag: the sender wrote a different size.
                    let sent = (imm & IMM_SIZE_MISMATCH == 0 && len <= max_write).then_some(bytes as u64);
                    let e = size_mismatch(&peer, sent, len as u64).context("NET/IB");
                    r.state = RecvState::Failed(e.duplicate());
                    return self.fail(e);
                }
                *data = Some(bytes);
            }
            _ => {
                return self.fail(Error::internal(format!(
                    "NET/IB : unexpected completion {:#x} on the receive side of {peer}",
                    c.wr_id
                )))
            }
        }
        if let RecvState::Posted { cts_done: true, data: Some(_) } = r.state {
            r.state = RecvState::Done;
        }
    }

    /// Posts receive work requests and CTS writes for queued receives, in order.
    fn post_queued(&mut self, rdma: &mut dyn Rdma) {
        let slots = FIFO_SLOTS as u64;
        for i in 0..self.reqs.len() {
            if !matches!(self.reqs[i].state, RecvState::Queued) {
                continue;
            }
            if self.sq_used >= self.sq_depth {
                return;
            }
            let r = &self.reqs[i];
            let cts = CtsEntry { addr: r.addr, size: r.len as u64, rkey: r.rkey, seq: r.seq };
            let seq = r.seq;
            let slot_addr = self.fifo.addr + ((seq - 1) % slots) * CTS_BYTES as u64;
            let posted = rdma.post_recv(wr_id(WR_RECV, seq)).and_then(|()| {
                rdma.post_write(
                    wr_id(WR_CTS, seq),
                    WriteSource::Inline(&cts.encode()),
                    RemoteSeg { addr: slot_addr, rkey: self.fifo.rkey },
                    None,
                )
            });
            match posted {
                Ok(()) => {
                    self.sq_used += 1;
                    self.reqs[i].state = RecvState::Posted { cts_done: false, data: None };
                }
                Err(e) => return self.fail(e),
            }
        }
    }

    /// `Some(bytes)` once receive `req` holds its data.
    pub fn test(&mut self, req: RequestId) -> Result<Option<usize>> {
        let seq = req.0;
        let failed = self.failed.as_ref().map(Error::duplicate);
        let Some(r) = self.find(seq) else {
            return Err(Error::internal(format!("NET/IB : test of unknown receive request {seq}")));
        };
        match &r.state {
            RecvState::Done => {
                r.reported = true;
                let len = r.len;
                self.retire();
                Ok(Some(len))
            }
            RecvState::Failed(e) => Err(e.duplicate()),
            _ => match failed {
                Some(e) => Err(e),
                None => Ok(None),
            },
        }
    }

    fn retire(&mut self) {
        while self.reqs.front().is_some_and(|r| r.reported) {
            self.reqs.pop_front();
            self.first_seq += 1;
        }
    }

    pub fn outstanding(&self) -> usize {
        self.reqs.len()
    }

    pub fn progress_mark(&self) -> u64 {
        self.completions
    }
}

#[cfg(test)]
mod tests;
