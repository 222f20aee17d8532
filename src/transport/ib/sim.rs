//! An in-memory double of one reliable-connected queue pair between two endpoints, for the
//! unit tests of the flow-control and completion logic (there is no RDMA hardware here).
//!
//! RDMA writes really copy bytes between the tests' buffers, checked against the regions each
//! side exposed (a bad rkey or range gives the writer a remote access error, as a real HCA
//! would). Writes land in posting order, as on a real RC queue pair; what a test can reorder
//! is the completion queue: completions can be held back and released in any order. It can
//! also fail the next write with a given status, hold writes in flight, and close a side.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard};

use super::flow::{Completion, Rdma, RemoteSeg, WriteSource};
use crate::error::{Error, Result};
use crate::wire::CTS_BYTES;

/// Where the sender's FIFO lives in the double's address space, and its rkey.
pub const FIFO_BASE: u64 = 0x5100_0000;
pub const FIFO_RKEY: u32 = 0xf1f0;

struct Write {
    wr_id: u64,
    data: Vec<u8>,
    dst: RemoteSeg,
    imm: Option<u32>,
}

#[derive(Default)]
struct Side {
    cq: Vec<Completion>,
    /// Completions held back by `hold_completions`.
    held: Vec<Completion>,
    hold_completions: bool,
    recvs: VecDeque<u64>,
    fifo: Vec<[u8; CTS_BYTES]>,
    /// rkey -> (address, length) of memory the peer may write.
    regions: HashMap<u32, (u64, usize)>,
    closed: bool,
    /// Writes posted and not completed, and the most allowed (the send queue's size).
    sq_used: usize,
    sq_depth: usize,
    rq_depth: usize,
    /// Fails this side's next write with this status.
    fail_next: Option<u32>,
    writes_posted: usize,
}

#[derive(Default)]
struct State {
    sides: [Side; 2],
    /// Writes in flight (posted, not landed) while `hold_writes` is set.
    in_flight: VecDeque<(usize, Write)>,
    hold_writes: bool,
    /// Regions registered fabric-wide (consulted after a side's own).
    shared_regions: Option<Regions>,
}

/// rkey -> (address, length), shared by every queue pair of a simulated fabric.
pub type Regions = Arc<Mutex<HashMap<u32, (u64, usize)>>>;

/// The shared wire; [`Sim::end`] gives each side its [`Rdma`].
#[derive(Clone)]
pub struct Sim(Arc<Mutex<State>>);

/// One side of the queue pair (side 0 is the sender in the tests).
pub struct SimEnd {
    side: usize,
    sim: Sim,
}

impl Sim {
    pub fn new(sq_depth: usize, rq_depth: usize, fifo_slots: usize) -> Sim {
        let mut st = State::default();
        for s in st.sides.iter_mut() {
            s.sq_depth = sq_depth;
            s.rq_depth = rq_depth;
        }
        st.sides[0].fifo = vec![[0; CTS_BYTES]; fifo_slots];
        Sim(Arc::new(Mutex::new(st)))
    }

    /// As [`Sim::new`], resolving rkeys in `regions` as well.
    pub fn with_regions(sq_depth: usize, rq_depth: usize, fifo_slots: usize, regions: Regions) -> Sim {
        let sim = Sim::new(sq_depth, rq_depth, fifo_slots);
        sim.lock().shared_regions = Some(regions);
        sim
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub fn end(&self, side: usize) -> SimEnd {
        SimEnd { side, sim: self.clone() }
    }

    /// Lets the peer of `side` write `len` bytes at `addr` with `rkey`.
    pub fn expose(&self, side: usize, rkey: u32, addr: u64, len: usize) {
        self.lock().sides[side].regions.insert(rkey, (addr, len));
    }

    pub fn hold_writes(&self, on: bool) {
        self.lock().hold_writes = on;
    }

    /// Lands the writes in flight, in posting order.
    pub fn land_all(&self) {
        let mut st = self.lock();
        while let Some((from, w)) = st.in_flight.pop_front() {
            land(&mut st, from, w);
        }
    }

    /// Writes in flight now.
    pub fn in_flight(&self) -> usize {
        self.lock().in_flight.len()
    }

    pub fn hold_completions(&self, side: usize, on: bool) {
        self.lock().sides[side].hold_completions = on;
    }

    /// Releases the held completions of `side` whose indices `order` lists, in that order;
    /// the others stay held.
    pub fn release_completions(&self, side: usize, order: impl Fn(usize) -> Vec<usize>) {
        let mut st = self.lock();
        let s = &mut st.sides[side];
        let held = std::mem::take(&mut s.held);
        let mut taken = vec![false; held.len()];
        for i in order(held.len()) {
            if i < held.len() && !taken[i] {
                taken[i] = true;
                s.cq.push(held[i]);
            }
        }
        s.held = held.into_iter().enumerate().filter(|(i, _)| !taken[*i]).map(|(_, c)| c).collect();
    }

    pub fn held_completions(&self, side: usize) -> usize {
        self.lock().sides[side].held.len()
    }

    pub fn fail_next_write(&self, side: usize, status: u32) {
        self.lock().sides[side].fail_next = Some(status);
    }

    pub fn close(&self, side: usize) {
        self.lock().sides[side].closed = true;
    }

    pub fn writes_posted(&self, side: usize) -> usize {
        self.lock().sides[side].writes_posted
    }

    /// Overwrites slot `slot` of the sender's FIFO (a misbehaving peer).
    pub fn scribble_fifo(&self, slot: usize, bytes: [u8; CTS_BYTES]) {
        self.lock().sides[0].fifo[slot] = bytes;
    }
}

fn complete(side: &mut Side, c: Completion) {
    if side.hold_completions {
        side.held.push(c);
    } else {
        side.cq.push(c);
    }
}

/// Lands one write from side `from` at its peer and completes it on both sides.
fn land(st: &mut State, from: usize, w: Write) {
    let to = 1 - from;
    let status = match st.sides[from].fail_next.take() {
        Some(status) => status,
        None if st.sides[to].closed => 12, // retry counter exceeded: nobody answers
        None => {
            let shared = st.shared_regions.as_ref().map(|r| r.lock().unwrap_or_else(|p| p.into_inner()).clone());
            deliver(&mut st.sides[to], &w, shared.as_ref())
        }
    };
    let done = Completion { wr_id: w.wr_id, status, vendor_err: if status == 0 { 0 } else { 0x81 }, recv: None };
    let s = &mut st.sides[from];
    s.sq_used -= 1;
    complete(s, done);
}

/// Applies a write to the receiving side; the writer's completion status.
fn deliver(to: &mut Side, w: &Write, shared: Option<&HashMap<u32, (u64, usize)>>) -> u32 {
    let len = w.data.len();
    if w.dst.rkey == FIFO_RKEY && !to.fifo.is_empty() {
        let off = w.dst.addr.wrapping_sub(FIFO_BASE) as usize;
        if len != CTS_BYTES || off % CTS_BYTES != 0 || off / CTS_BYTES >= to.fifo.len() {
            return 10;
        }
        to.fifo[off / CTS_BYTES].copy_from_slice(&w.data);
    } else if len > 0 || w.imm.is_none() {
        match to.regions.get(&w.dst.rkey).or_else(|| shared.and_then(|s| s.get(&w.dst.rkey))) {
            Some(&(base, size)) if w.dst.addr >= base && w.dst.addr + len as u64 <= base + size as u64 => {
                // SAFETY: the test exposed [base, base+size) as a live buffer it does not
                // touch while writes may land; the range is inside it (checked above).
                unsafe { std::ptr::copy_nonoverlapping(w.data.as_ptr(), w.dst.addr as *mut u8, len) };
            }
            _ => return 10, // remote access error
        }
    }
    if let Some(imm) = w.imm {
        let Some(recv) = to.recvs.pop_front() else {
            return 13; // receiver not ready, retries exhausted
        };
        complete(to, Completion { wr_id: recv, status: 0, vendor_err: 0, recv: Some((imm, len as u32)) });
    }
    0
}

impl Rdma for SimEnd {
    fn post_write(&mut self, wr_id: u64, src: WriteSource<'_>, dst: RemoteSeg, imm: Option<u32>) -> Result<()> {
        let mut st = self.sim.lock();
        let s = &mut st.sides[self.side];
        if s.sq_used >= s.sq_depth {
            return Err(Error::internal("sim: send queue overflow"));
        }
        s.sq_used += 1;
        s.writes_posted += 1;
        let data = match src {
            WriteSource::Inline(b) => b.to_vec(),
            // SAFETY: the flow passes registered memory the test keeps alive; the double
            // reads it when the write is posted rather than when it lands, which the tests
            // never tell apart (they do not change a buffer with a send outstanding).
            WriteSource::Registered { addr, len, .. } => unsafe {
                std::slice::from_raw_parts(addr as *const u8, len).to_vec()
            },
        };
        let w = Write { wr_id, data, dst, imm };
        if st.hold_writes {
            st.in_flight.push_back((self.side, w));
        } else {
            land(&mut st, self.side, w);
        }
        Ok(())
    }

    fn post_recv(&mut self, wr_id: u64) -> Result<()> {
        let mut st = self.sim.lock();
        let s = &mut st.sides[self.side];
        if s.recvs.len() >= s.rq_depth {
            return Err(Error::internal("sim: receive queue overflow"));
        }
        s.recvs.push_back(wr_id);
        Ok(())
    }

    fn poll(&mut self, out: &mut Vec<Completion>) -> Result<()> {
        out.append(&mut self.sim.lock().sides[self.side].cq);
        Ok(())
    }

    fn fifo_slot(&self, slot: usize) -> [u8; CTS_BYTES] {
        self.sim.lock().sides[self.side].fifo.get(slot).copied().unwrap_or([0; CTS_BYTES])
    }

    fn peer_closed(&mut self) -> bool {
        self.sim.lock().sides[1 - self.side].closed
    }
}
