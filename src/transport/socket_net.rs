//! The socket transport: one TCP connection per direction and peer, non-blocking, each
//! message framed as a 16-byte header (magic, reserved, length) followed by the bytes.
//!
//! Requests queue per connection and complete in order; progress happens inside `isend`,
//! `irecv` and `test`, so whichever thread polls drives the wire (the caller for host
//! buffers, a proxy thread later for device buffers).
//!
//! With encryption every connection is TLS (the connecting side is the client): the hello
//! travels inside TLS after the handshake, as in NCCL. Handshakes never run on the progress
//! loop's time: the connecting side's handshake advances inside `isend`/`test` without
//! blocking, and each listener has an acceptor thread that multiplexes pending server
//! handshakes and hellos with poll(), so neither a slow or hostile client nor a peer that is
//! busy elsewhere can stall the progress loop (TLS needs both ends to take part: an acceptor
//! that only ran inside the progress loop would leave a connecting peer waiting while this
//! rank waits on something else). Failed peers are logged and dropped; the listener goes on.

use std::collections::{HashMap, VecDeque};
use std::io::{self, IoSlice, IoSliceMut, Read, Write};
use std::net::{SocketAddr, TcpListener};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd, RawFd};
use std::sync::mpsc;
use std::sync::Arc;
use std::time::{Duration, Instant};

use rustix::event::{EventfdFlags, PollFd, PollFlags};

use super::netif::Interface;
use super::socket::{
    self, decode_addr, encode_addr, ConnKind, Handshake, Hello, Role, Stream, ADDR_BYTES, HELLO_BYTES,
};
use super::{ConnectorId, MemRegion, Net, NetHandle, NetListener, NetRecv, NetSend, RequestId, WaitHint};
use crate::error::{Error, Result};
use crate::tls;
use crate::topo::CpuSet;
use crate::wire::{frame_fields, frame_header, OpSig, FRAME_BYTES};

/// Requests one connection queues at most (NCCL allows 32 per comm).
const MAX_QUEUED: usize = 64;
/// TLS: messages up to this size (with their header) are copied into one buffer, so a small
/// message is one record rather than a 16-byte record plus the payload's.
const TLS_SMALL_MESSAGE: usize = 64 << 10;
/// Connections an acceptor keeps mid-handshake at most; the oldest is dropped beyond.
const MAX_PENDING_ACCEPTS: usize = 256;

pub struct SocketNet {
    iface: Interface,
    /// Where helper threads run (see [`crate::topo::Topology::socket_helper_cpus`]); `None`
    /// leaves them wherever the OS puts them.
    helper_cpus: Option<CpuSet>,
}

impl SocketNet {
    pub fn new(iface: Interface, helper_cpus: Option<CpuSet>) -> SocketNet {
        SocketNet { iface, helper_cpus }
    }

    /// Helper threads per data connection (each with its own socket), `None` for inline
    /// connections.
    pub fn helper_threads(&self) -> Option<usize> {
        helper_sockets()
    }
}

/// Binds a helper thread (called first thing in it); a refusal is logged by the topology
/// and the thread runs unbound.
fn bind_helper(cpus: &Option<CpuSet>) {
    if let Some(cpus) = cpus {
        if let Err(e) = crate::topo::Topology::system().bind_current_thread(cpus) {
            log::info!(target: "NET", "NET/Socket : helper thread left unbound: {e}");
        }
    }
}

impl Net for SocketNet {
    fn name(&self) -> &'static str {
        "Socket"
    }

    fn describe(&self) -> String {
        format!("[0]{}:{}<0>", self.iface.name, self.iface.addr)
    }

    fn listen(&self, comm_magic: u64) -> Result<(NetHandle, Box<dyn NetListener>)> {
        let listener = socket::listen(self.iface.addr, 0)?;
        listener.set_nonblocking(true).map_err(|e| Error::system("O_NONBLOCK", e))?;
        let addr = listener.local_addr().map_err(|e| Error::system("getsockname", e))?;
        let mut handle = vec![0u8; ADDR_BYTES];
        encode_addr(&addr, &mut handle);
        Ok((handle, Box::new(SocketListener::spawn(listener, comm_magic, self.helper_cpus.clone())?)))
    }

    fn connect(&self, handle: &[u8], me: ConnectorId) -> Result<Box<dyn NetSend>> {
        let addr: SocketAddr = decode_addr(handle)?;
        let deadline = Instant::now() + socket::setup_timeout();
        let tcp = socket::connect_tcp(addr, deadline)?;
        let hello = Hello { magic: me.comm_magic, kind: ConnKind::Data, rank: me.rank, extra: me.channel };
        if let Some(n) = helper_sockets() {
            return Ok(Box::new(ThreadedSend::spawn(tcp, addr, deadline, hello, n, self.helper_cpus.clone())?));
        }
        tcp.set_nonblocking(true).map_err(|e| Error::system("O_NONBLOCK", e))?;
        let hs = Handshake::start(tcp, Role::Client)?;
        let mut send = SocketSend {
            conn: SendConn::Handshaking(Some(hs)),
            peer: addr,
            deadline,
            me,
            preamble: hello.encode().to_vec(),
            preamble_sent: 0,
            queue: VecDeque::new(),
            next_id: 0,
            done: HashMap::new(),
            moved: 0,
        };
        // Plaintext is ready at once; TLS sends its ClientHello now.
        send.advance_handshake()?;
        Ok(Box::new(send))
    }
}

/// An eventfd: a counter that poll() sees as readable while nonzero.
struct EventFd(OwnedFd);

impl EventFd {
    fn new() -> Result<EventFd> {
        let fd = rustix::event::eventfd(0, EventfdFlags::NONBLOCK | EventfdFlags::CLOEXEC)
            .map_err(|e| Error::system("eventfd", e.into()))?;
        Ok(EventFd(fd))
    }

    fn signal(&self) {
        let _ = rustix::io::write(&self.0, &1u64.to_ne_bytes());
    }

    fn clear(&self) {
        // Non-blocking: EAGAIN when already clear.
        let _ = rustix::io::read(&self.0, &mut [0u8; 8]);
    }

    fn fd(&self) -> RawFd {
        self.0.as_raw_fd()
    }
}

impl AsFd for EventFd {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.0.as_fd()
    }
}

type Accepted = (ConnectorId, Box<dyn NetRecv>);

/// The receiving side's listener: an acceptor thread does the handshakes and hellos and hands
/// finished connections over a channel, signalling `ready`.
struct SocketListener {
    accepted: mpsc::Receiver<Accepted>,
    ready: Arc<EventFd>,
    stop: Arc<EventFd>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl SocketListener {
    fn spawn(listener: TcpListener, magic: u64, cpus: Option<CpuSet>) -> Result<SocketListener> {
        let (tx, rx) = mpsc::channel();
        let ready = Arc::new(EventFd::new()?);
        let stop = Arc::new(EventFd::new()?);
        let (r, s) = (ready.clone(), stop.clone());
        let thread = std::thread::Builder::new()
            .name("ferroccl-accept".into())
            .spawn(move || {
                bind_helper(&cpus);
                Acceptor { listener, magic, pending: Vec::new(), groups: HashMap::new(), cpus }.run(&tx, &r, &s)
            })
            .map_err(|e| Error::system("spawn acceptor thread", e))?;
        Ok(SocketListener { accepted: rx, ready, stop, thread: Some(thread) })
    }
}

impl Drop for SocketListener {
    fn drop(&mut self) {
        self.stop.signal();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl NetListener for SocketListener {
    fn accept(&mut self) -> Result<Option<(ConnectorId, Box<dyn NetRecv>)>> {
        // Clear first: a connection queued after try_recv signals again.
        self.ready.clear();
        match self.accepted.try_recv() {
            Ok((id, recv)) => Ok(Some((id, recv))),
            Err(mpsc::TryRecvError::Empty) => Ok(None),
            Err(mpsc::TryRecvError::Disconnected) => Err(Error::internal("NET/Socket : acceptor thread ended")),
        }
    }

    fn wait_hint(&self) -> Option<WaitHint> {
        Some(WaitHint { fd: self.ready.fd(), readable: true, writable: false })
    }
}

/// A connection the acceptor is still working on.
enum Incoming {
    Handshaking(Handshake),
    Hello { stream: Stream, buf: [u8; HELLO_BYTES], got: usize },
}

struct Pending {
    state: Option<Incoming>,
    peer: SocketAddr,
    deadline: Instant,
}

struct Acceptor {
    listener: TcpListener,
    magic: u64,
    pending: Vec<Pending>,
    /// Striped connections whose sockets have not all arrived, by (rank, channel).
    groups: HashMap<(u32, u32), Group>,
    /// Where receive helpers run.
    cpus: Option<CpuSet>,
}

/// The sockets of a striped connection so far, and when to give up on the rest.
type Group = (Vec<Option<Stream>>, Instant);

/// A verified data socket: socket `sub` of `nsub` of connection `id`.
struct Arrived {
    id: ConnectorId,
    sub: usize,
    nsub: usize,
    stream: Stream,
}

impl Acceptor {
    /// A finished connection once all its sockets are here.
    fn assemble(&mut self, a: Arrived) -> Result<Option<Accepted>> {
        if a.nsub == 1 {
            let recv: Box<dyn NetRecv> = if helper_sockets().is_some() {
                Box::new(ThreadedRecv::spawn(vec![a.stream], self.cpus.clone())?)
            } else {
                Box::new(SocketRecv {
                    stream: a.stream,
                    queue: VecDeque::new(),
                    next_id: 0,
                    done: HashMap::new(),
                    moved: 0,
                })
            };
            return Ok(Some((a.id, recv)));
        }
        let key = (a.id.rank, a.id.channel);
        let limit = Instant::now() + socket::setup_timeout();
        let (slots, _) = self.groups.entry(key).or_insert_with(|| ((0..a.nsub).map(|_| None).collect(), limit));
        if slots.len() != a.nsub || slots[a.sub].is_some() {
            self.groups.remove(&key);
            return Err(Error::remote(format!("inconsistent data sockets from rank {}", a.id.rank)));
        }
        slots[a.sub] = Some(a.stream);
        if slots.iter().any(Option::is_none) {
            return Ok(None);
        }
        let (slots, _) = self.groups.remove(&key).expect("present");
        let streams: Vec<Stream> = slots.into_iter().map(|s| s.expect("all arrived")).collect();
        Ok(Some((a.id, Box::new(ThreadedRecv::spawn(streams, self.cpus.clone())?))))
    }
}

impl Acceptor {
    fn run(mut self, tx: &mpsc::Sender<Accepted>, ready: &EventFd, stop: &EventFd) {
        let limit = socket::setup_timeout();
        loop {
            let mut fds = vec![PollFd::new(&self.listener, PollFlags::IN), PollFd::new(stop, PollFlags::IN)];
            for p in &self.pending {
                match &p.state {
                    Some(Incoming::Handshaking(h)) => {
                        let events = if h.wait_hint().writable { PollFlags::OUT } else { PollFlags::IN };
                        fds.push(PollFd::new(h.tcp(), events));
                    }
                    Some(Incoming::Hello { stream, .. }) => fds.push(PollFd::new(stream.tcp(), PollFlags::IN)),
                    None => {}
                }
            }
            let now = Instant::now();
            let wait = self
                .pending
                .iter()
                .map(|p| p.deadline.saturating_duration_since(now))
                .min()
                .unwrap_or(Duration::from_secs(1))
                .min(Duration::from_secs(1));
            super::poll_ms(&mut fds, wait.as_millis() as i64 + 1);
            if !fds[1].revents().is_empty() {
                return;
            }
            self.accept_new(limit);
            let now = Instant::now();
            self.groups.retain(|(rank, _), (_, deadline)| {
                let keep = now < *deadline;
                if !keep {
                    log::warn!(target: "NET", "NET/Socket : dropped the sockets of rank {rank}: its other sockets never arrived");
                }
                keep
            });
            let mut i = 0;
            while i < self.pending.len() {
                match self.advance(i) {
                    Ok(Some(arrived)) => {
                        let peer = self.pending.swap_remove(i).peer;
                        match self.assemble(arrived) {
                            Ok(Some(done)) => {
                                if tx.send(done).is_err() {
                                    return; // the listener is gone
                                }
                                ready.signal();
                            }
                            Ok(None) => {}
                            Err(e) => log::warn!(target: "NET", "NET/Socket : dropped connection from {peer}: {e}"),
                        }
                    }
                    Ok(None) if Instant::now() >= self.pending[i].deadline => {
                        log::warn!(target: "NET", "NET/Socket : dropped connection from {}: no TLS handshake and hello within {}s", self.pending[i].peer, limit.as_secs());
                        self.pending.swap_remove(i);
                    }
                    Ok(None) => i += 1,
                    Err(e) => {
                        log::warn!(target: "NET", "NET/Socket : dropped connection from {}: {e}", self.pending[i].peer);
                        self.pending.swap_remove(i);
                    }
                }
            }
        }
    }

    fn accept_new(&mut self, limit: Duration) {
        loop {
            match self.listener.accept() {
                Ok((tcp, from)) => {
                    if let Err(e) = tcp.set_nonblocking(true) {
                        log::warn!(target: "NET", "NET/Socket : dropped connection from {from}: O_NONBLOCK: {e}");
                        continue;
                    }
                    match Handshake::start(tcp, Role::Server) {
                        Ok(h) => {
                            if self.pending.len() >= MAX_PENDING_ACCEPTS {
                                let old = self.pending.remove(0);
                                log::warn!(target: "NET", "NET/Socket : too many pending connections; dropped {}", old.peer);
                            }
                            self.pending.push(Pending {
                                state: Some(Incoming::Handshaking(h)),
                                peer: from,
                                deadline: Instant::now() + limit,
                            });
                        }
                        Err(e) => log::warn!(target: "NET", "NET/Socket : dropped connection from {from}: {e}"),
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => {
                    // EMFILE and the like: back off (poll's timeout) rather than spin.
                    log::warn!(target: "NET", "NET/Socket : accept: {e}");
                    return;
                }
            }
        }
    }

    /// Moves pending connection `i` on; `Some` once it is a verified data socket.
    fn advance(&mut self, i: usize) -> Result<Option<Arrived>> {
        let p = &mut self.pending[i];
        loop {
            match p.state.take().expect("state is put back") {
                Incoming::Handshaking(mut h) => {
                    if !h.step()? {
                        p.state = Some(Incoming::Handshaking(h));
                        return Ok(None);
                    }
                    let stream = h.finish()?;
                    p.state = Some(Incoming::Hello { stream, buf: [0; HELLO_BYTES], got: 0 });
                }
                Incoming::Hello { mut stream, mut buf, mut got } => {
                    while got < HELLO_BYTES {
                        match stream.read(&mut buf[got..]) {
                            Ok(0) => return Err(Error::remote("closed before its hello")),
                            Ok(n) => got += n,
                            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                                p.state = Some(Incoming::Hello { stream, buf, got });
                                return Ok(None);
                            }
                            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                            Err(e) => return Err(socket::io_error(e, "hello", p.peer)),
                        }
                    }
                    let h = Hello::decode(&buf, self.magic)?;
                    if h.kind != ConnKind::Data {
                        return Err(Error::remote(format!("unexpected {:?} connection", h.kind)));
                    }
                    let (channel, sub, nsub) = stripe_of(h.extra);
                    if sub >= nsub || nsub > MAX_STRIPES {
                        return Err(Error::remote(format!("bad data socket {sub} of {nsub}")));
                    }
                    stream.attribute(h.magic, tls::Owner::Listener, tls::Channel::NetSocket);
                    stream.configure_for_receiving();
                    let id = ConnectorId { comm_magic: h.magic, rank: h.rank, channel };
                    return Ok(Some(Arrived { id, sub, nsub, stream }));
                }
            }
        }
    }
}

struct SendReq {
    id: u64,
    region: MemRegion,
    /// The frame header, followed (TLS) by a copy of the first `head_payload` payload bytes.
    head: Vec<u8>,
    head_payload: usize,
    sent: usize,
}

impl SendReq {
    fn total(&self) -> usize {
        self.head.len() + self.region.len() - self.head_payload
    }
}

enum SendConn {
    /// The TLS client handshake is under way (`None` only transiently).
    Handshaking(Option<Handshake>),
    Open(Stream),
}

struct SocketSend {
    conn: SendConn,
    peer: SocketAddr,
    /// The handshake must be over by then.
    deadline: Instant,
    me: ConnectorId,
    /// The hello, sent (inside TLS) before any message.
    preamble: Vec<u8>,
    preamble_sent: usize,
    queue: VecDeque<SendReq>,
    next_id: u64,
    done: HashMap<u64, usize>,
    /// Bytes written so far (the watchdog's progress mark).
    moved: u64,
}

impl SocketSend {
    /// Drives the client handshake; `Some` stream once it is open.
    fn advance_handshake(&mut self) -> Result<Option<&mut Stream>> {
        if let SendConn::Handshaking(slot) = &mut self.conn {
            let hs = slot.as_mut().expect("handshake present");
            if !hs.step().map_err(|e| e.context(&format!("NET/Socket : connection to {}", self.peer)))? {
                if Instant::now() >= self.deadline {
                    return Err(Error::Timeout(format!(
                        "NET/Socket : TLS handshake with {} did not finish within the bootstrap timeout",
                        self.peer
                    )));
                }
                return Ok(None);
            }
            let mut stream = slot.take().expect("handshake present").finish()?;
            stream.configure_for_data();
            stream.attribute(self.me.comm_magic, tls::Owner::Rank(self.me.rank), tls::Channel::NetSocket);
            self.conn = SendConn::Open(stream);
        }
        match &mut self.conn {
            SendConn::Open(s) => Ok(Some(s)),
            SendConn::Handshaking(_) => unreachable!("set above"),
        }
    }

    fn progress(&mut self) -> Result<()> {
        if self.advance_handshake()?.is_none() {
            return Ok(());
        }
        let SendConn::Open(stream) = &mut self.conn else { unreachable!("open after the handshake") };
        let peer = self.peer;
        while self.preamble_sent < self.preamble.len() {
            match stream.write(&self.preamble[self.preamble_sent..]) {
                Ok(0) => return Err(Error::remote(format!("send to {peer}: connection closed"))),
                Ok(n) => self.preamble_sent += n,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(()),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(socket::io_error(e, "send", peer)),
            }
        }
        while let Some(req) = self.queue.front_mut() {
            let total = req.total();
            while req.sent < total {
                let data = region_bytes(&req.region);
                let hl = req.head.len();
                let r = if req.sent < hl {
                    if req.head_payload == 0 {
                        stream.write_vectored(&[IoSlice::new(&req.head[req.sent..]), IoSlice::new(data)])
                    } else {
                        stream.write(&req.head[req.sent..])
                    }
                } else {
                    stream.write(&data[req.head_payload + req.sent - hl..])
                };
                match r {
                    Ok(0) => return Err(Error::remote(format!("send to {peer}: connection closed"))),
                    Ok(n) => {
                        req.sent += n;
                        self.moved += n as u64;
                    }
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(()),
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                    Err(e) => return Err(socket::io_error(e, "send", peer)),
                }
            }
            // A request is done once its bytes are in the kernel (TLS coalesces records in
            // user space: push them out first).
            match stream.flush_pending() {
                Ok(()) => {}
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(()),
                Err(e) => return Err(socket::io_error(e, "send", peer)),
            }
            let req = self.queue.pop_front().expect("front exists");
            self.done.insert(req.id, req.region.len());
        }
        Ok(())
    }
}

/// The bytes of a region a send request reads.
fn region_bytes(region: &MemRegion) -> &[u8] {
    if region.is_empty() {
        return &[];
    }
    // SAFETY: MemRegion::new's contract keeps the region valid and unwritten while queued.
    unsafe { std::slice::from_raw_parts(region.ptr(), region.len()) }
}

impl NetSend for SocketSend {
    fn isend(&mut self, data: MemRegion, sig: OpSig) -> Result<Option<RequestId>> {
        if self.queue.len() >= MAX_QUEUED {
            self.progress()?;
            if self.queue.len() >= MAX_QUEUED {
                return Ok(None);
            }
        }
        let id = self.next_id;
        self.next_id += 1;
        let mut head = Vec::with_capacity(FRAME_BYTES);
        head.extend_from_slice(&frame_header(data.len() as u64, sig));
        // TLS: copy the start of the payload behind the header so the header shares a record
        // with it (all of a small message; one full record's worth of a large one).
        let head_payload = if crate::encryption::enabled() {
            let n = if data.len() + FRAME_BYTES <= TLS_SMALL_MESSAGE {
                data.len()
            } else {
                tls::RECORD_BYTES - FRAME_BYTES
            };
            head.extend_from_slice(&region_bytes(&data)[..n]);
            n
        } else {
            0
        };
        self.queue.push_back(SendReq { id, region: data, head, head_payload, sent: 0 });
        self.progress()?;
        Ok(Some(RequestId(id)))
    }

    fn test(&mut self, req: RequestId) -> Result<Option<usize>> {
        if let Some(n) = self.done.remove(&req.0) {
            return Ok(Some(n));
        }
        self.progress()?;
        Ok(self.done.remove(&req.0))
    }

    fn progress_mark(&self) -> u64 {
        self.moved
    }

    fn wait_hint(&self) -> Option<WaitHint> {
        if self.queue.is_empty() {
            return None;
        }
        match &self.conn {
            SendConn::Handshaking(Some(h)) => Some(h.wait_hint()),
            SendConn::Handshaking(None) => None,
            SendConn::Open(s) => Some(WaitHint { fd: s.fd(), readable: false, writable: true }),
        }
    }

    fn via(&self) -> String {
        "NET/Socket/0".into()
    }
}

struct RecvReq {
    id: u64,
    region: MemRegion,
    sig: OpSig,
    header: [u8; FRAME_BYTES],
    got: usize,
}

struct SocketRecv {
    stream: Stream,
    queue: VecDeque<RecvReq>,
    next_id: u64,
    done: HashMap<u64, usize>,
    /// Bytes read so far (the watchdog's progress mark).
    moved: u64,
}

impl SocketRecv {
    fn progress(&mut self) -> Result<()> {
        while let Some(req) = self.queue.front_mut() {
            let total = FRAME_BYTES + req.region.len();
            while req.got < total {
                let data: &mut [u8] = if req.region.is_empty() {
                    &mut []
                } else {
                    // SAFETY: MemRegion::new's contract: the region is ours alone until completion.
                    unsafe { std::slice::from_raw_parts_mut(req.region.ptr(), req.region.len()) }
                };
                let r = if req.got < FRAME_BYTES {
                    // One readv takes the header and as much payload as has arrived.
                    // (TLS: the header first, then the payload; see Stream::read_vectored.)
                    let (hdr, len) = (&mut req.header[req.got..], data.len());
                    self.stream.read_vectored(&mut [IoSliceMut::new(hdr), IoSliceMut::new(&mut data[..len])])
                } else {
                    self.stream.read(&mut data[req.got - FRAME_BYTES..])
                };
                match r {
                    Ok(0) => {
                        return Err(Error::remote(format!(
                            "receive from {}: connection closed by the peer",
                            self.stream.peer()
                        )))
                    }
                    Ok(n) => {
                        let before = req.got;
                        req.got += n;
                        self.moved += n as u64;
                        if before < FRAME_BYTES && req.got >= FRAME_BYTES {
                            check_frame(&req.header, req.region.len(), req.sig, self.stream.peer())?;
                        }
                    }
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(()),
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                    Err(e) => return Err(socket::io_error(e, "receive", self.stream.peer())),
                }
            }
            let req = self.queue.pop_front().expect("front exists");
            self.done.insert(req.id, req.region.len());
        }
        Ok(())
    }
}

fn check_frame(header: &[u8; FRAME_BYTES], expected: usize, sig: OpSig, peer: SocketAddr) -> Result<()> {
    let (len, theirs) = frame_fields(header).map_err(|e| e.context(&format!("data connection from {peer}")))?;
    // The calls first: a different count or root usually changes the size too, and the
    // signature says why.
    sig.check_labelled(theirs, "this rank", "the peer")?;
    if len != expected as u64 {
        return Err(Error::invalid_usage(format!(
            "message size mismatch: peer {peer} sent {len} bytes, {expected} were posted (do the ranks' calls match?)"
        )));
    }
    Ok(())
}

impl NetRecv for SocketRecv {
    fn irecv(&mut self, data: MemRegion, sig: OpSig) -> Result<Option<RequestId>> {
        if self.queue.len() >= MAX_QUEUED {
            return Ok(None);
        }
        let id = self.next_id;
        self.next_id += 1;
        self.queue.push_back(RecvReq { id, region: data, sig, header: [0; FRAME_BYTES], got: 0 });
        self.progress()?;
        Ok(Some(RequestId(id)))
    }

    fn test(&mut self, req: RequestId) -> Result<Option<usize>> {
        if let Some(n) = self.done.remove(&req.0) {
            return Ok(Some(n));
        }
        self.progress()?;
        Ok(self.done.remove(&req.0))
    }

    fn progress_mark(&self) -> u64 {
        self.moved
    }

    fn wait_hint(&self) -> Option<WaitHint> {
        if self.queue.is_empty() {
            return None;
        }
        let fd = self.stream.fd();
        if self.stream.pending() {
            // Input already decrypted in user space: poll() on the fd would not report it, so
            // ask for writability, which a receive-only socket has at once (no sleep).
            return Some(WaitHint { fd, readable: false, writable: true });
        }
        Some(WaitHint { fd, readable: true, writable: false })
    }
}

// ---------------------------------------------------------------------------------------
// Data connections striped over helper threads.
//
// With one progress thread per rank, encryption, decryption, kernel copies and reductions
// would all queue on one core, and one TLS session is encrypted by one core at a time. So a
// data connection can be `n` sockets (each its own TLS session; NCCL_SOCKET_NTHREADS x
// NCCL_NSOCKS_PERTHREAD; unset, hosts with 8+ cores get one socket per four cores, 2-4, and
// smaller ones keep the inline path), each served by a helper thread running blocking writes
// (or reads). A message is cut into `n` contiguous parts of at least 64 KiB (NCCL's task size;
// smaller messages use the first socket only), the same cut on both sides, and part `i`
// travels on socket `i` with its own frame header. The progress loop only posts requests and
// checks in-order completion counters; an eventfd wakes it. NCCL_SOCKET_NTHREADS=0 keeps
// every connection inline on the progress loop (the non-blocking path above).

/// Smallest part of a striped message.
const MIN_PART: usize = 64 << 10;
/// Most sockets per striped connection (NCCL allows 64).
const MAX_STRIPES: usize = 16;

/// Sockets (each with a helper thread) per data connection, or `None` for the inline path:
/// NCCL_SOCKET_NTHREADS x NCCL_NSOCKS_PERTHREAD when set (0 threads: inline); unset, hosts
/// with 8 or more cores get one socket per four cores (2-4), plaintext or TLS alike (so an
/// encrypted run is compared like for like), and smaller hosts stay inline.
fn helper_sockets() -> Option<usize> {
    let per_thread = crate::env::get_int_opt("NCCL_NSOCKS_PERTHREAD").unwrap_or(1).max(1);
    let n = match crate::env::get_int_opt("NCCL_SOCKET_NTHREADS") {
        Some(t) if t <= 0 => return None,
        Some(t) => t * per_thread,
        None => {
            // Helper threads pay off where cores are spare; on a few cores they only add a
            // thread hand-off per message.
            let cores = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1) as i64;
            if cores < 8 {
                return None;
            }
            (cores / 4).clamp(2, 4) * per_thread
        }
    };
    Some((n as usize).clamp(1, MAX_STRIPES))
}

/// The hello's `extra` for socket `sub` of `nsub` on data channel `channel`.
fn stripe_extra(channel: u32, sub: usize, nsub: usize) -> u32 {
    (channel & 0xffff) | ((sub as u32 & 0xff) << 16) | ((nsub as u32 & 0xff) << 24)
}

/// (channel, socket index, socket count) from a hello's `extra` (count 0 means 1).
fn stripe_of(extra: u32) -> (u32, usize, usize) {
    (extra & 0xffff, ((extra >> 16) & 0xff) as usize, (((extra >> 24) & 0xff) as usize).max(1))
}

/// How a message of `len` bytes is cut over `n` sockets: (offset, length) per socket; both
/// sides compute the same cut.
fn stripe_parts(len: usize, n: usize) -> Vec<(usize, usize)> {
    let used = (len / MIN_PART).clamp(1, n);
    let part = len.div_ceil(used).next_multiple_of(4096);
    (0..n)
        .map(|i| {
            let off = (i * part).min(len);
            let end = if i + 1 >= used {
                if i + 1 == used {
                    len
                } else {
                    off
                }
            } else {
                ((i + 1) * part).min(len)
            };
            (off, end - off)
        })
        .collect()
}

/// What a connection and its helper threads share.
struct Shared {
    /// Per socket: parts finished, in posting order.
    completed: Vec<std::sync::atomic::AtomicU64>,
    /// The first failure; the connection is unusable afterwards.
    failed: std::sync::Mutex<Option<Error>>,
    /// Signalled after each completion or failure.
    ready: EventFd,
}

impl Shared {
    fn new(n: usize) -> Result<Arc<Shared>> {
        Ok(Arc::new(Shared {
            completed: (0..n).map(|_| std::sync::atomic::AtomicU64::new(0)).collect(),
            failed: std::sync::Mutex::new(None),
            ready: EventFd::new()?,
        }))
    }

    fn complete_one(&self, sub: usize) {
        self.completed[sub].fetch_add(1, std::sync::atomic::Ordering::Release);
        self.ready.signal();
    }

    fn fail(&self, e: Error) {
        self.failed.lock().unwrap_or_else(|p| p.into_inner()).get_or_insert(e);
        self.ready.signal();
    }

    /// Requests complete on every socket.
    /// Parts completed by all helpers together: moves while a striped request is under way.
    fn parts_completed(&self) -> u64 {
        self.completed.iter().fold(0u64, |m, c| m.wrapping_add(c.load(std::sync::atomic::Ordering::Relaxed)))
    }

    fn completed(&self) -> u64 {
        self.completed.iter().map(|c| c.load(std::sync::atomic::Ordering::Acquire)).min().unwrap_or(0)
    }

    fn error(&self) -> Option<Error> {
        self.failed.lock().unwrap_or_else(|p| p.into_inner()).as_ref().map(Error::duplicate)
    }
}

/// The progress-loop half of a striped connection.
struct Striped {
    jobs: Vec<mpsc::Sender<(MemRegion, OpSig)>>,
    shared: Arc<Shared>,
    /// Requests posted so far (ids are 0, 1, ...) and the lengths of unreported ones.
    posted: u64,
    lens: HashMap<u64, usize>,
    /// For unblocking the helpers when the connection is dropped mid-transfer.
    sockets: Vec<std::net::TcpStream>,
    threads: Vec<std::thread::JoinHandle<()>>,
    peer: SocketAddr,
    /// Where the helpers run.
    cpus: Option<CpuSet>,
}

impl Striped {
    fn post(&mut self, region: MemRegion, sig: OpSig) -> Result<Option<RequestId>> {
        if let Some(e) = self.shared.error() {
            return Err(e);
        }
        if self.posted - self.shared.completed() >= MAX_QUEUED as u64 {
            return Ok(None);
        }
        let id = self.posted;
        for (job, (off, len)) in self.jobs.iter().zip(stripe_parts(region.len(), self.jobs.len())) {
            // SAFETY: a sub-range of `region`, which MemRegion::new's contract keeps valid
            // (and ours alone, for receives) until the request completes.
            let part = unsafe { MemRegion::new(region.ptr().wrapping_add(off), len) };
            if job.send((part, sig)).is_err() {
                return Err(self
                    .shared
                    .error()
                    .unwrap_or_else(|| Error::remote(format!("NET/Socket : connection to {} ended", self.peer))));
            }
        }
        self.posted += 1;
        self.lens.insert(id, region.len());
        Ok(Some(RequestId(id)))
    }

    fn test(&mut self, req: RequestId) -> Result<Option<usize>> {
        // Clear before looking: a completion after the look signals again.
        self.shared.ready.clear();
        if self.shared.completed() > req.0 {
            return Ok(self.lens.remove(&req.0));
        }
        match self.shared.error() {
            Some(e) => Err(e),
            None => Ok(None),
        }
    }

    fn wait_hint(&self) -> Option<WaitHint> {
        Some(WaitHint { fd: self.shared.ready.fd(), readable: true, writable: false })
    }

    fn spawn_helper(
        &mut self,
        name: &str,
        body: impl FnOnce(&mpsc::Receiver<(MemRegion, OpSig)>, &Shared) -> Result<()> + Send + 'static,
    ) -> Result<()> {
        let (tx, rx) = mpsc::channel::<(MemRegion, OpSig)>();
        let sh = self.shared.clone();
        let cpus = self.cpus.clone();
        let t = std::thread::Builder::new()
            .name(name.into())
            .spawn(move || {
                bind_helper(&cpus);
                if let Err(e) = body(&rx, &sh) {
                    sh.fail(e);
                }
            })
            .map_err(|e| Error::system("spawn TLS helper thread", e))?;
        self.jobs.push(tx);
        self.threads.push(t);
        Ok(())
    }

    fn empty(peer: SocketAddr, n: usize, cpus: Option<CpuSet>) -> Result<Striped> {
        Ok(Striped {
            cpus,
            jobs: Vec::new(),
            shared: Shared::new(n)?,
            posted: 0,
            lens: HashMap::new(),
            sockets: Vec::new(),
            threads: Vec::new(),
            peer,
        })
    }
}

impl Drop for Striped {
    fn drop(&mut self) {
        let busy = self.posted > self.shared.completed();
        self.jobs.clear(); // idle helpers end
        if busy {
            // Mid-transfer (abort): unblock their reads and writes.
            for t in &self.sockets {
                let _ = t.shutdown(std::net::Shutdown::Both);
            }
        }
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

struct ThreadedSend {
    conn: Striped,
}

impl ThreadedSend {
    /// Connects the sockets; handshakes and hellos run on the helper threads (bounded by
    /// `deadline`), so this returns without waiting for the peer.
    fn spawn(
        first: std::net::TcpStream,
        peer: SocketAddr,
        deadline: Instant,
        hello: Hello,
        n: usize,
        cpus: Option<CpuSet>,
    ) -> Result<ThreadedSend> {
        let mut conn = Striped::empty(peer, n, cpus)?;
        let mut tcps = vec![first];
        for _ in 1..n {
            tcps.push(socket::connect_tcp(peer, deadline)?);
        }
        for (sub, tcp) in tcps.into_iter().enumerate() {
            tcp.set_nonblocking(false).map_err(|e| Error::system("O_NONBLOCK", e))?;
            conn.sockets.push(tcp.try_clone().map_err(|e| Error::system("dup socket", e))?);
            let hello = Hello { extra: stripe_extra(hello.extra, sub, n), ..hello };
            conn.spawn_helper("ferroccl-tls-send", move |jobs, shared| {
                send_helper(tcp, peer, deadline, hello, sub, jobs, shared)
            })?;
        }
        Ok(ThreadedSend { conn })
    }
}

fn send_helper(
    tcp: std::net::TcpStream,
    peer: SocketAddr,
    deadline: Instant,
    hello: Hello,
    sub: usize,
    jobs: &mpsc::Receiver<(MemRegion, OpSig)>,
    shared: &Shared,
) -> Result<()> {
    let mut stream = Stream::establish(tcp, Role::Client, deadline)
        .map_err(|e| e.context(&format!("NET/Socket : connection to {peer}")))?;
    stream.set_timeout(None)?;
    stream.configure_for_data();
    stream.attribute(hello.magic, tls::Owner::Rank(hello.rank), tls::Channel::NetSocket);
    stream.write_all_or(&hello.encode(), "hello")?;
    let tls = stream.is_tls();
    let mut head = Vec::with_capacity(if tls { TLS_SMALL_MESSAGE } else { FRAME_BYTES });
    while let Ok((region, sig)) = jobs.recv() {
        let data = region_bytes(&region);
        if !tls && (!data.is_empty() || sub == 0) {
            let header = frame_header(data.len() as u64, sig);
            write_all_two(&mut stream, &header, data).map_err(|e| socket::io_error(e, "send", peer))?;
        } else if !data.is_empty() || sub == 0 {
            // Header and the start of the payload in one record (all of a small message).
            let n = if data.len() + FRAME_BYTES <= TLS_SMALL_MESSAGE {
                data.len()
            } else {
                tls::RECORD_BYTES - FRAME_BYTES
            };
            head.clear();
            head.extend_from_slice(&frame_header(data.len() as u64, sig));
            head.extend_from_slice(&data[..n]);
            stream.write_all(&head).map_err(|e| socket::io_error(e, "send", peer))?;
            stream.write_all(&data[n..]).map_err(|e| socket::io_error(e, "send", peer))?;
            stream.flush().map_err(|e| socket::io_error(e, "send", peer))?;
        }
        shared.complete_one(sub);
    }
    Ok(())
}

/// Writes `a` then `b` with as few writev calls as the socket allows (blocking).
fn write_all_two(stream: &mut Stream, a: &[u8], b: &[u8]) -> io::Result<()> {
    let mut done = 0;
    let total = a.len() + b.len();
    while done < total {
        let r = if done < a.len() {
            stream.write_vectored(&[IoSlice::new(&a[done..]), IoSlice::new(b)])
        } else {
            stream.write(&b[done - a.len()..])
        };
        match r {
            Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
            Ok(n) => done += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

impl NetSend for ThreadedSend {
    fn isend(&mut self, data: MemRegion, sig: OpSig) -> Result<Option<RequestId>> {
        self.conn.post(data, sig)
    }

    fn progress_mark(&self) -> u64 {
        self.conn.shared.parts_completed()
    }

    fn test(&mut self, req: RequestId) -> Result<Option<usize>> {
        self.conn.test(req)
    }

    fn wait_hint(&self) -> Option<WaitHint> {
        self.conn.wait_hint()
    }

    fn via(&self) -> String {
        "NET/Socket/0".into()
    }
}

struct ThreadedRecv {
    conn: Striped,
}

impl ThreadedRecv {
    /// `streams[i]` is socket `i` of the connection (handshake and hello done).
    fn spawn(streams: Vec<Stream>, cpus: Option<CpuSet>) -> Result<ThreadedRecv> {
        let peer = streams[0].peer();
        let mut conn = Striped::empty(peer, streams.len(), cpus)?;
        for (sub, stream) in streams.into_iter().enumerate() {
            stream.set_nonblocking(false)?;
            stream.set_timeout(None)?;
            conn.sockets.push(stream.tcp().try_clone().map_err(|e| Error::system("dup socket", e))?);
            conn.spawn_helper("ferroccl-tls-recv", move |jobs, shared| recv_helper(stream, sub, jobs, shared))?;
        }
        Ok(ThreadedRecv { conn })
    }
}

fn recv_helper(
    mut stream: Stream,
    sub: usize,
    jobs: &mpsc::Receiver<(MemRegion, OpSig)>,
    shared: &Shared,
) -> Result<()> {
    let peer = stream.peer();
    while let Ok((region, sig)) = jobs.recv() {
        if !region.is_empty() || sub == 0 {
            let mut header = [0u8; FRAME_BYTES];
            stream.read_exact_or(&mut header, "receive")?;
            check_frame(&header, region.len(), sig, peer)?;
        }
        if !region.is_empty() {
            // SAFETY: MemRegion::new's contract: the region is ours alone until this request
            // completes, and the connection's drop joins this thread first.
            let data = unsafe { std::slice::from_raw_parts_mut(region.ptr(), region.len()) };
            stream.read_exact_or(data, "receive")?;
        }
        shared.complete_one(sub);
    }
    Ok(())
}

impl NetRecv for ThreadedRecv {
    fn irecv(&mut self, data: MemRegion, sig: OpSig) -> Result<Option<RequestId>> {
        self.conn.post(data, sig)
    }

    fn progress_mark(&self) -> u64 {
        self.conn.shared.parts_completed()
    }

    fn test(&mut self, req: RequestId) -> Result<Option<usize>> {
        self.conn.test(req)
    }

    fn wait_hint(&self) -> Option<WaitHint> {
        self.conn.wait_hint()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stripes_cover_the_message_once_in_order() {
        for n in [1, 2, 3, 4, 16] {
            for len in [0, 1, 4095, 65536, 65537, 131072, 200_000, 1 << 20, (1 << 22) + 12345] {
                let parts = stripe_parts(len, n);
                assert_eq!(parts.len(), n);
                let mut at = 0;
                for &(off, l) in &parts {
                    if l > 0 {
                        assert_eq!(off, at, "n={n} len={len} {parts:?}");
                        at += l;
                    }
                }
                assert_eq!(at, len, "n={n} len={len} {parts:?}");
                // Parts of at least MIN_PART, except a message that is smaller than that.
                assert!(parts.iter().filter(|p| p.1 > 0).count() <= (len / MIN_PART).max(1));
            }
        }
    }

    /// The watchdog's marks count bytes that really moved: the sender's stops short of the
    /// message while nobody reads (the kernel's buffers are full), and both reach the whole
    /// frame once the receiver drains it.
    #[test]
    fn progress_marks_count_moved_bytes() {
        if helper_sockets().is_some() {
            return; // striped connections count parts, not bytes (NCCL_NSOCKS_PERTHREAD set)
        }
        let net = SocketNet::new(super::super::netif::pick().unwrap(), None);
        let magic = 0x5eed_0000_0000_7777u64;
        let (handle, mut listener) = net.listen(magic).unwrap();
        let mut send = net.connect(&handle, ConnectorId { comm_magic: magic, rank: 0, channel: 0 }).unwrap();
        let len = 64 << 20;
        let data = vec![3u8; len];
        // SAFETY: `data` outlives the request, unmodified.
        let sreq = send.isend(unsafe { MemRegion::new(data.as_ptr() as *mut u8, len) }, OpSig::NONE).unwrap().unwrap();
        let deadline = Instant::now() + Duration::from_secs(20);
        let (_, mut recv) = loop {
            if let Some(x) = listener.accept().unwrap() {
                break x;
            }
            assert!(send.test(sreq).unwrap().is_none(), "64 MiB cannot fit in socket buffers");
            assert!(Instant::now() < deadline, "never accepted");
            std::thread::sleep(Duration::from_millis(1));
        };
        // Push until the kernel takes no more; then the mark must stay put.
        let mut last = u64::MAX;
        while send.progress_mark() != last {
            last = send.progress_mark();
            for _ in 0..100 {
                assert!(send.test(sreq).unwrap().is_none());
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        assert!(last > 0 && last < len as u64, "stalled at {last} of {len} bytes");
        assert_eq!(recv.progress_mark(), 0, "nothing read yet");
        let mut got = vec![0u8; len];
        // SAFETY: `got` outlives the request and nobody else touches it.
        let rreq = recv.irecv(unsafe { MemRegion::new(got.as_mut_ptr(), len) }, OpSig::NONE).unwrap().unwrap();
        let (mut sent, mut received) = (false, false);
        while !(sent && received) {
            sent |= send.test(sreq).unwrap().is_some();
            received |= recv.test(rreq).unwrap().is_some();
            assert!(Instant::now() < deadline, "transfer stalled");
        }
        assert_eq!(recv.progress_mark(), (len + FRAME_BYTES) as u64);
        assert!(send.progress_mark() >= len as u64);
        assert!(got.iter().all(|&b| b == 3));
    }

    #[test]
    fn stripe_fields_round_trip() {
        assert_eq!(stripe_of(stripe_extra(5, 3, 4)), (5, 3, 4));
        assert_eq!(stripe_of(7), (7, 0, 1));
    }
}
