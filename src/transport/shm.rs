//! Shared-memory transport between ranks on one host (processes or threads).
//!
//! Each directed connection owns one segment: a lock-free single-producer single-consumer FIFO
//! of fixed-size slots. The sender copies each message into slots; the receiver copies or
//! reduces straight from the slot into the destination (no staging copy).
//!
//! Large messages (at least `DIRECT_MIN` bytes) take a single-copy path when the receiver can
//! read the sender's memory: the sender publishes only the buffer's address in a slot, the
//! receiver copies or reduces straight from it (a plain read between threads of one process,
//! `process_vm_readv` between processes) and acknowledges, which completes the send. Whether
//! cross-process reads work (ptrace policy, seccomp) is probed once per connection.
//!
//! Segments are memfd files, never named in /dev/shm: the sender passes the descriptor to the
//! receiver over an abstract Unix socket (SCM_RIGHTS), so a crash at any moment leaves nothing
//! behind. That socket stays open as a liveness signal: when the peer process dies it hangs
//! up, and the waiting side fails with ncclRemoteError instead of spinning forever.

use std::collections::VecDeque;
use std::io::{self, IoSlice, IoSliceMut};
use std::mem::MaybeUninit;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::os::linux::net::SocketAddrExt;
use std::os::unix::net::{SocketAddr as UnixAddr, UnixListener, UnixStream};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use rustix::event::{PollFd, PollFlags};
use rustix::fs::MemfdFlags;
use rustix::mm::{MapFlags, ProtFlags};
use rustix::net::{
    RecvAncillaryBuffer, RecvAncillaryMessage, RecvFlags, SendAncillaryBuffer, SendAncillaryMessage, SendFlags,
};

use super::peer_mem::read_remote;
use super::socket::{ConnKind, Hello, HELLO_BYTES};
use super::{
    ConnectorId, MemRegion, Net, NetHandle, NetListener, NetRecv, NetSend, OpSig, RecvOp, RequestId, WaitHint,
};
use crate::error::{Error, Result};

/// Bytes of payload per slot, and slots per connection (4 MiB per direction, as NCCL_BUFFSIZE).
const SLOT_BYTES: usize = 256 << 10;
const SLOTS: usize = 16;
const HEADER_BYTES: usize = 4096;
const SLOT_HEADER: usize = 64;
const SEGMENT_BYTES: usize = HEADER_BYTES + SLOTS * (SLOT_HEADER + SLOT_BYTES);
/// Idle progress calls between looks at the clock, and the least time between liveness
/// checks of the peer: a dead peer is noticed within about `LIVENESS_PERIOD` of waiting,
/// however slowly the waiting loop turns (it sleeps once it has spun for a while, and a
/// loaded machine stretches every sleep), at the cost of one clock read per 64 idle polls.
const CLOCK_EVERY: u32 = 64;
const LIVENESS_PERIOD: Duration = Duration::from_millis(100);
/// Messages from this size on use the single-copy path where available.
const DIRECT_MIN: usize = 64 << 10;
/// Bytes read per `process_vm_readv` piece when reducing (fits in cache with its operands).
const DIRECT_PIECE: usize = 256 << 10;
/// Slot header flag: the slot holds a descriptor (address, pid) instead of data.
const FLAG_DIRECT: u64 = 1;
/// Slot header words: message length, offset of this piece, piece length, flags (the low
/// half; the high half holds the sending call's `OpSig`), direct address, the slot's
/// publication number (written last), then inline payload.
const HDR_SEQ: usize = 5;
const HDR_INLINE: usize = 6;
/// Pieces of at most this many bytes travel inside the slot header's cache line, so a small
/// message costs the receiver one cache-line transfer.
const INLINE_BYTES: usize = SLOT_HEADER - HDR_INLINE * 8;
/// Segment header offsets (bytes): sender's pid and probe address, the receiver's verdict on
/// reading them (0 = not yet known), and the count of completed direct messages.
const OFF_SENDER_PID: usize = 128;
const OFF_PROBE_ADDR: usize = 136;
const OFF_CAN_DIRECT: usize = 192;
const OFF_DIRECT_DONE: usize = 256;
const CAN_DIRECT_YES: u64 = 1;
const CAN_DIRECT_NO: u64 = 2;
/// What the receiver reads back from the sender's memory to prove it can.
static PROBE: u64 = 0x4665_7272_6f43_434c;

/// A mapped FIFO segment.
struct Segment {
    base: *mut u8,
    _fd: OwnedFd,
}

// SAFETY: the mapping is shared memory whose cross-thread accesses go through atomics (head,
// tail) and the slot protocol; the pointer itself may move between threads.
unsafe impl Send for Segment {}

impl Segment {
    fn create() -> Result<Segment> {
        let fd = rustix::fs::memfd_create(c"ferroccl-shm", MemfdFlags::CLOEXEC)
            .map_err(|e| Error::system("memfd_create", e.into()))?;
        rustix::fs::ftruncate(&fd, SEGMENT_BYTES as u64)
            .map_err(|e| Error::system("ftruncate shared segment", e.into()))?;
        Self::map(fd)
    }

    fn map(fd: OwnedFd) -> Result<Segment> {
        match rustix::fs::fstat(&fd) {
            Ok(st) if st.st_size as usize >= SEGMENT_BYTES => {}
            _ => return Err(Error::remote("shared segment from peer has the wrong size")),
        }
        // SAFETY: a new shared read-write mapping (no address hint) of a file we hold, of at
        // least SEGMENT_BYTES bytes; it stays until Drop unmaps it.
        let base = unsafe {
            rustix::mm::mmap(
                std::ptr::null_mut(),
                SEGMENT_BYTES,
                ProtFlags::READ | ProtFlags::WRITE,
                MapFlags::SHARED,
                &fd,
                0,
            )
        }
        .map_err(|e| Error::system("mmap shared segment", e.into()))?;
        Ok(Segment { base: base as *mut u8, _fd: fd })
    }

    fn tail(&self) -> &AtomicU64 {
        // SAFETY: offset 64 is inside the mapping, aligned, and only accessed atomically.
        unsafe { &*(self.base.add(64) as *const AtomicU64) }
    }

    /// A u64 field of the segment header, accessed atomically by both sides.
    fn word(&self, offset: usize) -> &AtomicU64 {
        debug_assert!(offset % 8 == 0 && offset + 8 <= HEADER_BYTES);
        // SAFETY: offset is inside the header page, 8-aligned, and only accessed atomically.
        unsafe { &*(self.base.add(offset) as *const AtomicU64) }
    }

    /// The publication number of FIFO position `i` (slot `i % SLOTS`): the sender stores
    /// `i + 1` there last when it fills that position. The segment starts zeroed and every
    /// position has its own number, so the slot's previous use never matches. The receiver
    /// polls it instead of a shared head counter, so a message costs it one cache-line
    /// transfer, not two.
    fn seq(&self, i: u64) -> &AtomicU64 {
        let (hdr, _) = self.slot(i);
        // SAFETY: word HDR_SEQ of a slot header: inside the mapping, 8-aligned, and only ever
        // accessed atomically by both sides.
        unsafe { &*(hdr.add(HDR_SEQ) as *const AtomicU64) }
    }

    /// Makes FIFO position `i` visible to the receiver (after its header and payload).
    fn publish(&self, i: u64) {
        self.seq(i).store(i + 1, Ordering::Release);
    }

    /// Where a piece of `piece` bytes at FIFO position `i` lives: inside the header's cache
    /// line when it fits, else the slot's payload area.
    fn piece_at(&self, i: u64, piece: usize) -> *mut u8 {
        let (hdr, data) = self.slot(i);
        if piece <= INLINE_BYTES {
            hdr.wrapping_add(HDR_INLINE) as *mut u8
        } else {
            data
        }
    }

    /// Slot `i`: (header pointer, payload pointer).
    fn slot(&self, i: u64) -> (*mut u64, *mut u8) {
        let off = HEADER_BYTES + (i as usize % SLOTS) * (SLOT_HEADER + SLOT_BYTES);
        // SAFETY: off + SLOT_HEADER + SLOT_BYTES <= SEGMENT_BYTES by construction.
        unsafe { (self.base.add(off) as *mut u64, self.base.add(off + SLOT_HEADER)) }
    }
}

impl Drop for Segment {
    fn drop(&mut self) {
        // SAFETY: base/len are the mapping made in `map`, unmapped once.
        let _ = unsafe { rustix::mm::munmap(self.base as *mut std::ffi::c_void, SEGMENT_BYTES) };
    }
}

/// Applies a whole direct message: straight from the sender's memory within one process,
/// through `process_vm_readv` (into the destination for copies, piecewise staging otherwise)
/// between processes.
fn direct_read(pid: u32, addr: u64, dst: MemRegion, op: &RecvOp, staging: &mut Vec<u8>) -> Result<()> {
    let len = dst.len();
    if pid == std::process::id() {
        // SAFETY: the sender's buffer is live and unwritten until we acknowledge (its send
        // request completes only then), and it lies in this process.
        let src = unsafe { std::slice::from_raw_parts(addr as usize as *const u8, len) };
        return super::apply_recv_op(dst, op, 0, src);
    }
    if let RecvOp::Copy = op {
        // SAFETY: MemRegion's contract: the destination is ours alone until completion.
        let out = unsafe { std::slice::from_raw_parts_mut(dst.ptr(), len) };
        return read_remote(pid, addr, out);
    }
    staging.resize(DIRECT_PIECE.min(len), 0);
    let mut off = 0;
    while off < len {
        let n = DIRECT_PIECE.min(len - off);
        read_remote(pid, addr + off as u64, &mut staging[..n])?;
        super::apply_recv_op(dst, op, off, &staging[..n])?;
        off += n;
    }
    Ok(())
}

/// FERROCCL_SHM_DIRECT, read once.
fn direct_enabled() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| crate::env::get_bool("FERROCCL_SHM_DIRECT"))
}

/// Whether this process can read the sender's memory (same process, or process_vm_readv).
fn probe_sender(seg: &Segment) -> bool {
    let pid = seg.word(OFF_SENDER_PID).load(Ordering::Relaxed) as u32;
    let addr = seg.word(OFF_PROBE_ADDR).load(Ordering::Relaxed);
    if pid == std::process::id() {
        return true;
    }
    let mut got = [0u8; 8];
    read_remote(pid, addr, &mut got).is_ok() && u64::from_ne_bytes(got) == PROBE
}

fn take_done(done: &mut Vec<(u64, usize)>, id: u64) -> Option<usize> {
    let i = done.iter().position(|&(d, _)| d == id)?;
    Some(done.swap_remove(i).1)
}

/// The abstract socket name a rank listens on for shared-memory setup.
fn socket_name(magic: u64, rank: usize, pid: u32) -> String {
    format!("ferroccl-shm-{magic:016x}-{rank}-{pid}")
}

/// Shared memory provider for peers on this host.
pub struct ShmNet {
    pid: u32,
    /// The owning communicator's abort flag: ends the connect retries early.
    interrupt: Option<crate::interrupt::Interrupt>,
}

impl ShmNet {
    pub fn new() -> ShmNet {
        ShmNet { pid: std::process::id(), interrupt: None }
    }

    /// A provider whose connect retries give up once `interrupt` is set.
    pub fn with_interrupt(interrupt: crate::interrupt::Interrupt) -> ShmNet {
        ShmNet { pid: std::process::id(), interrupt: Some(interrupt) }
    }
}

impl Default for ShmNet {
    fn default() -> Self {
        Self::new()
    }
}

/// Handle = the listening socket's abstract name.
impl Net for ShmNet {
    fn name(&self) -> &'static str {
        "SHM"
    }

    fn describe(&self) -> String {
        format!("memfd segments, {SLOTS} x {} KiB slots per connection", SLOT_BYTES >> 10)
    }

    fn listen(&self, comm_magic: u64) -> Result<(NetHandle, Box<dyn NetListener>)> {
        // The rank is not known here; the caller names the socket with `listen_rank`.
        let _ = comm_magic;
        Err(Error::internal("ShmNet::listen needs the rank: use listen_rank"))
    }

    fn connect(&self, handle: &[u8], me: ConnectorId) -> Result<Box<dyn NetSend>> {
        let name = std::str::from_utf8(handle).map_err(|_| Error::internal("bad shm handle"))?;
        let addr = UnixAddr::from_abstract_name(name).map_err(|e| Error::system("abstract socket name", e))?;
        let deadline = Instant::now() + super::socket::setup_timeout();
        let sock = loop {
            match UnixStream::connect_addr(&addr) {
                Ok(s) => break s,
                Err(e) if Instant::now() < deadline && e.kind() == io::ErrorKind::ConnectionRefused => {
                    if let Some(i) = &self.interrupt {
                        i.check(&format!("connect to shared-memory peer @{name}"))?;
                    }
                    std::thread::sleep(Duration::from_millis(5));
                }
                Err(e) => return Err(Error::system(format!("connect to shared-memory peer @{name}"), e)),
            }
        };
        sock.set_read_timeout(Some(super::socket::setup_timeout())).map_err(|e| Error::system("SO_RCVTIMEO", e))?;
        let seg = Segment::create()?;
        seg.word(OFF_SENDER_PID).store(std::process::id() as u64, Ordering::Relaxed);
        seg.word(OFF_PROBE_ADDR).store(&PROBE as *const u64 as u64, Ordering::Relaxed);
        let hello = Hello { magic: me.comm_magic, kind: ConnKind::Data, rank: me.rank, extra: me.channel };
        // No acknowledgement is awaited (the peer maps the segment when it next accepts, and
        // waiting here could deadlock two ranks connecting to each other); the descriptor in
        // flight keeps the segment alive even if this process dies first.
        send_with_fd(&sock, &hello.encode(), seg._fd.as_fd())?;
        sock.set_nonblocking(true).map_err(|e| Error::system("O_NONBLOCK", e))?;
        let _ = self.pid;
        Ok(Box::new(ShmSend {
            seg,
            sock,
            queue: VecDeque::new(),
            next_id: 0,
            done: Vec::new(),
            idle: Idle::new(),
            direct_sent: 0,
            head: 0,
            tail_seen: 0,
        }))
    }
}

impl ShmNet {
    /// Listens on this rank's abstract socket; the handle is its name.
    pub fn listen_rank(&self, comm_magic: u64, rank: usize) -> Result<(NetHandle, Box<dyn NetListener>)> {
        let name = socket_name(comm_magic, rank, self.pid);
        let addr = UnixAddr::from_abstract_name(&name).map_err(|e| Error::system("abstract socket name", e))?;
        let listener = UnixListener::bind_addr(&addr).map_err(|e| Error::system(format!("bind @{name}"), e))?;
        listener.set_nonblocking(true).map_err(|e| Error::system("O_NONBLOCK", e))?;
        Ok((name.into_bytes(), Box::new(ShmListener { listener, magic: comm_magic })))
    }

    /// The handle a peer with `pid` listens on.
    pub fn peer_handle(comm_magic: u64, rank: usize, pid: u32) -> NetHandle {
        socket_name(comm_magic, rank, pid).into_bytes()
    }
}

struct ShmListener {
    listener: UnixListener,
    magic: u64,
}

impl NetListener for ShmListener {
    fn accept(&mut self) -> Result<Option<(ConnectorId, Box<dyn NetRecv>)>> {
        loop {
            let sock = match self.listener.accept() {
                Ok((s, _)) => s,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(None),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(Error::system("accept shared-memory peer", e)),
            };
            // The connector sends hello and descriptor in one message right after connecting.
            sock.set_read_timeout(Some(Duration::from_secs(5))).map_err(|e| Error::system("SO_RCVTIMEO", e))?;
            let (hello, fd) = match recv_with_fd(&sock) {
                Ok(v) => v,
                Err(e) => {
                    log::info!(target: "SHM", "SHM: dropped setup connection: {e}");
                    continue;
                }
            };
            let hello = match Hello::decode(&hello, self.magic) {
                Ok(h) if h.kind == ConnKind::Data => h,
                Ok(_) | Err(_) => {
                    log::info!(target: "SHM", "SHM: dropped setup connection with a wrong magic or kind");
                    continue;
                }
            };
            let seg = match Segment::map(fd) {
                Ok(s) => s,
                Err(e) => {
                    log::info!(target: "SHM", "SHM: dropped setup from rank {}: {e}", hello.rank);
                    continue;
                }
            };
            sock.set_nonblocking(true).map_err(|e| Error::system("O_NONBLOCK", e))?;
            let verdict = if direct_enabled() && probe_sender(&seg) { CAN_DIRECT_YES } else { CAN_DIRECT_NO };
            seg.word(OFF_CAN_DIRECT).store(verdict, Ordering::Release);
            let id = ConnectorId { comm_magic: hello.magic, rank: hello.rank, channel: hello.extra };
            let recv = ShmRecv {
                seg,
                sock,
                staging: Vec::new(),
                queue: VecDeque::new(),
                next_id: 0,
                done: Vec::new(),
                idle: Idle::new(),
            };
            return Ok(Some((id, Box::new(recv))));
        }
    }

    fn wait_hint(&self) -> Option<WaitHint> {
        Some(WaitHint { fd: self.listener.as_raw_fd(), readable: true, writable: false })
    }
}

fn send_with_fd(sock: &UnixStream, data: &[u8], fd: BorrowedFd<'_>) -> Result<()> {
    let fds = [fd];
    let mut space = [MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(1))];
    let mut control = SendAncillaryBuffer::new(&mut space);
    if !control.push(SendAncillaryMessage::ScmRights(&fds)) {
        return Err(Error::internal("SCM_RIGHTS message does not fit its buffer"));
    }
    let n = rustix::net::sendmsg(sock, &[IoSlice::new(data)], &mut control, SendFlags::NOSIGNAL)
        .map_err(|e| Error::system("sendmsg (shared-memory setup)", e.into()))?;
    if n != data.len() {
        let short = io::Error::new(io::ErrorKind::WriteZero, format!("sent {n} of {} bytes", data.len()));
        return Err(Error::system("sendmsg (shared-memory setup)", short));
    }
    Ok(())
}

fn recv_with_fd(sock: &UnixStream) -> Result<([u8; HELLO_BYTES], OwnedFd)> {
    let mut data = [0u8; HELLO_BYTES];
    let mut space = [MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(1))];
    let mut control = RecvAncillaryBuffer::new(&mut space);
    // MSG_CMSG_CLOEXEC keeps received descriptors private to this process.
    let got = rustix::net::recvmsg(
        sock,
        &mut [IoSliceMut::new(&mut data)],
        &mut control,
        RecvFlags::CMSG_CLOEXEC | RecvFlags::WAITALL,
    )
    .map_err(|e| Error::system("recvmsg (shared-memory setup)", e.into()))?;
    // The first descriptor is ours; any others close when the buffer drops.
    let fd = control.drain().find_map(|m| match m {
        RecvAncillaryMessage::ScmRights(mut fds) => fds.next(),
        _ => None,
    });
    let fd = fd.ok_or_else(|| Error::remote("shared-memory setup message without a descriptor"))?;
    if got.bytes != HELLO_BYTES {
        return Err(Error::remote("short shared-memory setup message"));
    }
    Ok((data, fd))
}

/// The idle count of a connection and when its peer was last checked.
struct Idle {
    polls: u32,
    checked: Option<Instant>,
}

impl Idle {
    fn new() -> Idle {
        Idle { polls: 0, checked: None }
    }
}

/// Counts progress calls that moved nothing while work waits, and checks, every
/// `LIVENESS_PERIOD` of such waiting, that the peer is still alive.
fn note_idle(moved: bool, waiting: bool, idle: &mut Idle, sock: &UnixStream) -> Result<()> {
    if moved {
        idle.polls = 0;
        idle.checked = None;
    } else if waiting {
        idle.polls = idle.polls.wrapping_add(1);
        if idle.polls % CLOCK_EVERY == 0 {
            let now = Instant::now();
            match idle.checked {
                Some(t) if now.duration_since(t) < LIVENESS_PERIOD => {}
                Some(_) => {
                    idle.checked = Some(now);
                    check_alive(sock)?;
                }
                // The wait's start: the first check comes a period later.
                None => idle.checked = Some(now),
            }
        }
    }
    Ok(())
}

/// Errors when the peer's end of the setup socket has gone (the peer process exited).
fn check_alive(sock: &UnixStream) -> Result<()> {
    let mut pfd = [PollFd::new(sock, PollFlags::IN)];
    let n = super::poll_ms(&mut pfd, 0);
    if n > 0 && pfd[0].revents().intersects(PollFlags::HUP | PollFlags::ERR | PollFlags::IN) {
        return Err(Error::remote("shared-memory peer exited (its connection hung up)"));
    }
    Ok(())
}

struct SendReq {
    id: u64,
    region: MemRegion,
    sig: OpSig,
    sent: usize,
    /// At least one slot was published (a zero-length message still takes one).
    started: bool,
}

struct ShmSend {
    seg: Segment,
    sock: UnixStream,
    queue: VecDeque<SendReq>,
    next_id: u64,
    /// Completed requests not yet reported by `test` (few: requests complete in order).
    done: Vec<(u64, usize)>,
    idle: Idle,
    /// Direct messages published so far (the receiver counts those it completed).
    direct_sent: u64,
    /// Slots published so far (only the sender needs it: the receiver polls slot numbers).
    head: u64,
    /// The receiver's tail as last read: reloaded only when the FIFO looks full, so the
    /// sender does not pull the receiver's cache line on every message.
    tail_seen: u64,
}

/// Whether slot `head` may be filled; `tail_seen` is the sender's copy of the receiver's tail.
fn slot_free(seg: &Segment, head: u64, tail_seen: &mut u64) -> bool {
    if head - *tail_seen < SLOTS as u64 {
        return true;
    }
    *tail_seen = seg.tail().load(Ordering::Acquire);
    head - *tail_seen < SLOTS as u64
}

impl ShmSend {
    fn progress(&mut self) -> Result<()> {
        let mut moved = false;
        while let Some(req) = self.queue.front_mut() {
            let len = req.region.len();
            let direct = len >= DIRECT_MIN && self.seg.word(OFF_CAN_DIRECT).load(Ordering::Acquire) == CAN_DIRECT_YES;
            if direct {
                if !req.started {
                    let head = self.head;
                    if !slot_free(&self.seg, self.head, &mut self.tail_seen) {
                        break;
                    }
                    let (hdr, _) = self.seg.slot(head);
                    // SAFETY: the slot is free (see below); the receiver reads it only after
                    // head is published with Release.
                    unsafe {
                        hdr.write(len as u64);
                        hdr.add(1).write(0);
                        hdr.add(2).write(0);
                        hdr.add(3).write(FLAG_DIRECT | u64::from(req.sig.0) << 32);
                        hdr.add(4).write(req.region.ptr() as u64);
                    }
                    self.seg.publish(head);
                    self.head = head + 1;
                    req.started = true;
                    self.direct_sent += 1;
                    req.sent = self.direct_sent as usize; // the ack number this request waits for
                    moved = true;
                }
                // Complete once the receiver has read the buffer (it counts in order).
                if self.seg.word(OFF_DIRECT_DONE).load(Ordering::Acquire) < req.sent as u64 {
                    break;
                }
                let req = self.queue.pop_front().expect("front exists");
                self.done.push((req.id, len));
                moved = true;
                continue;
            }
            loop {
                let head = self.head;
                if !slot_free(&self.seg, self.head, &mut self.tail_seen) {
                    break;
                }
                let piece = (len - req.sent).min(SLOT_BYTES);
                let (hdr, _) = self.seg.slot(head);
                let dst = self.seg.piece_at(head, piece);
                // SAFETY: the slot is free (fewer than SLOTS unconsumed, tail loaded with
                // Acquire), so the receiver does not touch it until we publish its number;
                // the region is readable for the request's life (MemRegion contract); an
                // inline piece fits in the header's last INLINE_BYTES bytes.
                unsafe {
                    if piece > 0 {
                        crate::memcopy::copy_bytes(req.region.ptr().add(req.sent), dst, piece);
                    }
                    hdr.write(len as u64);
                    hdr.add(1).write(req.sent as u64);
                    hdr.add(2).write(piece as u64);
                    hdr.add(3).write(u64::from(req.sig.0) << 32);
                }
                self.seg.publish(head);
                self.head = head + 1;
                req.sent += piece;
                req.started = true;
                moved = true;
                if req.sent >= len {
                    break;
                }
            }
            if !req.started || req.sent < len {
                break;
            }
            let req = self.queue.pop_front().expect("front exists");
            self.done.push((req.id, len));
        }
        note_idle(moved, !self.queue.is_empty(), &mut self.idle, &self.sock)
    }
}

impl NetSend for ShmSend {
    fn isend(&mut self, data: MemRegion, sig: OpSig) -> Result<Option<RequestId>> {
        let id = self.next_id;
        self.next_id += 1;
        self.queue.push_back(SendReq { id, region: data, sig, sent: 0, started: false });
        self.progress()?;
        Ok(Some(RequestId(id)))
    }

    fn test(&mut self, req: RequestId) -> Result<Option<usize>> {
        if let Some(n) = take_done(&mut self.done, req.0) {
            return Ok(Some(n));
        }
        self.progress()?;
        Ok(take_done(&mut self.done, req.0))
    }

    /// Slots the receiver freed and direct messages it read: move only while the peer does.
    fn progress_mark(&self) -> u64 {
        self.seg.tail().load(Ordering::Relaxed).wrapping_add(self.seg.word(OFF_DIRECT_DONE).load(Ordering::Relaxed))
    }

    fn wait_hint(&self) -> Option<WaitHint> {
        None
    }

    fn via(&self) -> String {
        "SHM/direct".into()
    }
}

struct RecvReq {
    id: u64,
    region: MemRegion,
    op: RecvOp,
    sig: OpSig,
    got: usize,
    started: bool,
}

struct ShmRecv {
    seg: Segment,
    sock: UnixStream,
    /// Pieces read from another process before reducing them.
    staging: Vec<u8>,
    queue: VecDeque<RecvReq>,
    next_id: u64,
    /// Completed requests not yet reported by `test` (few: requests complete in order).
    done: Vec<(u64, usize)>,
    idle: Idle,
}

impl ShmRecv {
    fn progress(&mut self) -> Result<()> {
        let mut moved = false;
        while let Some(req) = self.queue.front_mut() {
            let len = req.region.len();
            loop {
                let tail = self.seg.tail().load(Ordering::Relaxed);
                if self.seg.seq(tail).load(Ordering::Acquire) != tail + 1 {
                    break;
                }
                let (hdr, _) = self.seg.slot(tail);
                // SAFETY: the slot's number (Acquire) says the sender published it, and it
                // will not touch it until we advance tail.
                let (msg_len, offset, piece, flags, addr) = unsafe {
                    (
                        hdr.read() as usize,
                        hdr.add(1).read() as usize,
                        hdr.add(2).read() as usize,
                        hdr.add(3).read(),
                        hdr.add(4).read(),
                    )
                };
                // The calls first: a different count or root usually changes the size too,
                // and the signature says why.
                req.sig.check_labelled(OpSig((flags >> 32) as u32), "this rank", "the peer")?;
                if flags & 0xffff_ffff == FLAG_DIRECT {
                    if msg_len != len || req.started {
                        return Err(Error::invalid_usage(format!(
                            "message size mismatch: peer sent {msg_len} bytes, {len} were posted (do the ranks' calls match?)"
                        )));
                    }
                    let pid = self.seg.word(OFF_SENDER_PID).load(Ordering::Relaxed) as u32;
                    direct_read(pid, addr, req.region, &req.op, &mut self.staging)?;
                    self.seg.tail().store(tail + 1, Ordering::Release);
                    self.seg.word(OFF_DIRECT_DONE).fetch_add(1, Ordering::Release);
                    req.got = len;
                    req.started = true;
                    moved = true;
                    break;
                }
                if msg_len != len {
                    return Err(Error::invalid_usage(format!(
                        "message size mismatch: peer sent {msg_len} bytes, {len} were posted (do the ranks' calls match?)"
                    )));
                }
                if offset != req.got || piece > SLOT_BYTES || offset + piece > len {
                    return Err(Error::remote("corrupt shared-memory slot header"));
                }
                let src = self.seg.piece_at(tail, piece) as *const u8;
                // SAFETY: the published slot holds `piece` bytes written by the sender, where
                // `piece_at` says.
                let incoming = unsafe { std::slice::from_raw_parts(src, piece) };
                super::apply_recv_op(req.region, &req.op, offset, incoming)?;
                self.seg.tail().store(tail + 1, Ordering::Release);
                req.got += piece;
                req.started = true;
                moved = true;
                if req.got >= len {
                    break;
                }
            }
            if !req.started || req.got < len {
                break;
            }
            let req = self.queue.pop_front().expect("front exists");
            self.done.push((req.id, len));
        }
        note_idle(moved, !self.queue.is_empty(), &mut self.idle, &self.sock)
    }
}

impl NetRecv for ShmRecv {
    fn irecv(&mut self, data: MemRegion, sig: OpSig) -> Result<Option<RequestId>> {
        self.irecv_op(data, RecvOp::Copy, sig)
    }

    fn irecv_op(&mut self, data: MemRegion, op: RecvOp, sig: OpSig) -> Result<Option<RequestId>> {
        let id = self.next_id;
        self.next_id += 1;
        self.queue.push_back(RecvReq { id, region: data, op, sig, got: 0, started: false });
        self.progress()?;
        Ok(Some(RequestId(id)))
    }

    fn reduces_on_arrival(&self) -> bool {
        true
    }

    fn test(&mut self, req: RequestId) -> Result<Option<usize>> {
        if let Some(n) = take_done(&mut self.done, req.0) {
            return Ok(Some(n));
        }
        self.progress()?;
        Ok(take_done(&mut self.done, req.0))
    }

    /// Slots consumed: moves only while the sender publishes.
    fn progress_mark(&self) -> u64 {
        self.seg.tail().load(Ordering::Relaxed)
    }

    fn wait_hint(&self) -> Option<WaitHint> {
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A connected (send, receive) pair within this process.
    fn pair(magic: u64) -> (Box<dyn NetSend>, Box<dyn NetRecv>) {
        let net = ShmNet::new();
        let (handle, mut listener) = net.listen_rank(magic, 1).unwrap();
        let send = net.connect(&handle, ConnectorId { comm_magic: magic, rank: 0, channel: 0 }).unwrap();
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            if let Some((id, recv)) = listener.accept().unwrap() {
                assert_eq!(id.rank, 0);
                return (send, recv);
            }
            assert!(Instant::now() < deadline, "no connection");
        }
    }

    #[test]
    fn fifo_carries_inline_and_slot_pieces_in_order_across_wraparound() {
        let (mut send, mut recv) = pair(0x5eed_0001);
        // Sizes straddle the inline limit and the slot size; 3 x SLOTS messages wrap the FIFO
        // several times (each slot number is used more than once).
        let sizes = [0, 1, 8, INLINE_BYTES - 1, INLINE_BYTES, INLINE_BYTES + 1, 64, 4096, SLOT_BYTES + 3];
        for round in 0..3 * SLOTS {
            let len = sizes[round % sizes.len()];
            let data: Vec<u8> = (0..len).map(|i| (i * 31 + round * 7) as u8).collect();
            let mut out = vec![0xeeu8; len];
            // SAFETY: both buffers outlive their requests (waited for below).
            let (src, dst) =
                unsafe { (MemRegion::new(data.as_ptr() as *mut u8, len), MemRegion::new(out.as_mut_ptr(), len)) };
            let sr = send.isend(src, OpSig::NONE).unwrap().unwrap();
            let rr = recv.irecv(dst, OpSig::NONE).unwrap().unwrap();
            let (mut sent, mut received) = (None, None);
            while sent.is_none() || received.is_none() {
                sent = sent.or(send.test(sr).unwrap());
                received = received.or(recv.test(rr).unwrap());
            }
            assert_eq!((sent, received), (Some(len), Some(len)));
            assert_eq!(out, data, "message {round} of {len} bytes");
        }
    }

    /// The watchdog's marks: still while the peer does nothing (the sender's FIFO full), moving
    /// as soon as the receiver consumes.
    #[test]
    fn progress_marks_move_only_with_the_peer() {
        let (mut send, mut recv) = pair(0x5eed_0003);
        let len = 1024;
        let data = vec![5u8; len];
        let mut out = vec![0u8; len * 2 * SLOTS];
        let (send0, recv0) = (send.progress_mark(), recv.progress_mark());
        let sends: Vec<RequestId> = (0..2 * SLOTS)
            .map(|_| {
                // SAFETY: data outlives the requests (the test ends with them).
                send.isend(unsafe { MemRegion::new(data.as_ptr() as *mut u8, len) }, OpSig::NONE).unwrap().unwrap()
            })
            .collect();
        for r in &sends {
            let _ = send.test(*r).unwrap();
        }
        assert_eq!(send.progress_mark(), send0, "nothing consumed yet: the sender's mark must not move");
        assert_eq!(recv.progress_mark(), recv0);
        for (i, chunk) in out.chunks_mut(len).enumerate() {
            // SAFETY: out outlives the requests (waited for below).
            let r = recv.irecv(unsafe { MemRegion::new(chunk.as_mut_ptr(), len) }, OpSig::NONE).unwrap().unwrap();
            while recv.test(r).unwrap().is_none() {
                let _ = send.test(sends[i]).unwrap();
            }
        }
        assert!(recv.progress_mark() >= recv0 + 2 * SLOTS as u64, "the receiver consumed every slot");
        assert_ne!(send.progress_mark(), send0, "the sender saw its slots freed");
        assert!(out.iter().all(|&b| b == 5));
    }

    /// A message from a call of another signature fails the receive with ncclInvalidUsage
    /// naming the difference, before anything is written; an unsigned one is not compared.
    #[test]
    fn message_of_another_call_is_refused() {
        let (mut send, mut recv) = pair(0x5eed_0004);
        let data = [7u8; 8];
        let mut out = [0u8; 8];
        // SAFETY: both buffers outlive the requests (the test ends with them).
        let (src, dst) = unsafe { (MemRegion::new(data.as_ptr() as *mut u8, 8), MemRegion::new(out.as_mut_ptr(), 8)) };
        let (f32_sum, i32_sum) = (OpSig::new(1, 7, 1, 0, 2), OpSig::new(1, 2, 1, 0, 2));
        send.isend(src, i32_sum).unwrap();
        let err = match recv.irecv(dst, f32_sum) {
            Err(e) => e,
            Ok(Some(r)) => loop {
                match recv.test(r) {
                    Err(e) => break e,
                    Ok(Some(_)) => panic!("a receive completed with a message of another call"),
                    Ok(None) => {}
                }
            },
            Ok(None) => panic!("receive not posted"),
        };
        assert_eq!(err.code(), crate::error::ncclResult_t::ncclInvalidUsage);
        assert!(err.to_string().contains("data type float on this rank, int32 on the peer"), "{err}");
        assert_eq!(out, [0u8; 8], "nothing written");
    }

    #[test]
    fn inline_message_of_the_wrong_size_is_refused() {
        let (mut send, mut recv) = pair(0x5eed_0002);
        let data = [7u8; 8];
        let mut out = [0u8; 12];
        // SAFETY: both buffers outlive the requests (the test ends with them).
        let (src, dst) = unsafe { (MemRegion::new(data.as_ptr() as *mut u8, 8), MemRegion::new(out.as_mut_ptr(), 12)) };
        send.isend(src, OpSig::NONE).unwrap();
        let err = match recv.irecv(dst, OpSig::NONE) {
            Err(e) => e,
            Ok(Some(r)) => loop {
                match recv.test(r) {
                    Err(e) => break e,
                    Ok(Some(_)) => panic!("a 12-byte receive completed with 8 bytes"),
                    Ok(None) => {}
                }
            },
            Ok(None) => panic!("receive not posted"),
        };
        assert!(err.to_string().contains("size mismatch"), "{err}");
        assert_eq!(out, [0u8; 12], "nothing written");
    }
}
