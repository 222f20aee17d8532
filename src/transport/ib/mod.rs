//! The InfiniBand / RoCE network (`NET/IB`): reliable-connected queue pairs, RDMA writes with
//! immediate data, and a clear-to-send FIFO for flow control, as in NCCL.
//!
//! Owns: [`IbNet`] (the [`Net`] implementation: listen, connect, accept, and the setup
//! exchange of queue-pair details over a socket), the send and receive halves, and the split
//! below them:
//! - [`hca`]: device and port choice (NCCL_IB_HCA, port state, link layer) and the numeric
//!   settings, pure;
//! - [`flow`]: flow control and completion handling as pure state machines over the small
//!   [`flow::Rdma`] trait;
//! - [`mr`]: the registration cache over a [`mr::Registrar`];
//! - `verbs` (cargo feature `ib`): every verbs call, the only `unsafe` of this transport;
//! - `sim` (tests only): an in-memory queue pair the unit tests drive everything through.
//!
//! The glue here is generic over a [`Fabric`] (queue pairs and registrations of one HCA
//! port), so the whole path (sockets, TLS, connection info, flow, registrations) runs in the
//! unit tests over the in-memory double; only `verbs` needs hardware.
//!
//! Setup, per connection: the sending side connects a socket to the receiver's listener
//! (TLS under a pre-shared key, like every ferroccl socket), sends the hello and its
//! [`IbConnInfo`] (queue pair, GID/LID, FIFO address and rkey); the receiving side creates
//! its queue pair, moves it to ready-to-send and answers with its own; the sender does the
//! same and sends one "ready" byte, after which the receiver hands the connection out. The
//! socket stays open for the connection's life: its end tells each side that the peer
//! closed. Only this setup traffic is inside TLS; the RDMA payload is not, and the log and
//! the coverage report say so.

pub mod flow;
pub mod hca;
pub mod mr;
#[cfg(test)]
pub(crate) mod sim;
#[cfg(feature = "ib")]
pub mod verbs;

use std::collections::HashMap;
use std::net::{SocketAddr, TcpListener};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};

use self::flow::{Completion, Rdma, RecvFlow, RemoteSeg, SendFlow, WriteSource, FIFO_SLOTS};
use self::mr::{Access, RegRef};
use super::netif::Interface;
use super::socket::{self, decode_addr, encode_addr, Role, Stream, ADDR_BYTES};
use super::{ConnectorId, MemRegion, Net, NetHandle, NetListener, NetRecv, NetSend, RequestId, WaitHint};
use crate::error::{Error, Result};
use crate::tls;
use crate::wire::OpSig;
use crate::wire::{ConnKind, Hello, IbConnInfo, IbRole, CTS_BYTES, IB_CONN_INFO_BYTES};

/// Send-queue entries per queue pair (data pieces plus CTS writes in flight).
pub const SQ_DEPTH: usize = 2 * FIFO_SLOTS;
/// The byte a sender sends once its queue pair is ready to send.
const READY: u8 = 0x52;
/// Setup connections a listener works on at once; more are closed at once.
const MAX_PENDING_SETUPS: usize = 64;
/// How often the halves look at the setup socket for a closed peer.
const CLOSE_CHECK: Duration = Duration::from_millis(50);

/// Queue pairs and registrations on one HCA port: `verbs` over hardware, `sim` in tests.
pub trait Fabric: Send + Sync + 'static {
    /// One queue pair with its completion queue (and, for a sender, its CTS FIFO).
    type Qp: Rdma + Send + 'static;
    /// A new queue pair for one side of a connection, and the details to send the peer.
    fn create(&self, role: IbRole) -> Result<(Self::Qp, IbConnInfo)>;
    /// Moves `qp` to ready-to-send towards the peer described by `remote`.
    fn connect(&self, qp: &mut Self::Qp, remote: &IbConnInfo) -> Result<()>;
    /// A registration covering `region` (from the cache).
    fn acquire(&self, region: MemRegion, access: Access) -> Result<RegRef>;
    fn release(&self, r: RegRef);
    /// `mlx5_0:1/RoCE` and the like.
    fn label(&self) -> String;
}

/// A queue pair plus the setup socket that tells whether the peer is still there.
struct Endpoint<Q> {
    qp: Q,
    ctrl: Stream,
    closed: bool,
    last_check: Instant,
}

impl<Q> Endpoint<Q> {
    fn new(qp: Q, ctrl: Stream) -> Endpoint<Q> {
        Endpoint { qp, ctrl, closed: false, last_check: Instant::now() }
    }
}

impl<Q: Rdma> Rdma for Endpoint<Q> {
    fn post_write(&mut self, wr_id: u64, src: WriteSource<'_>, dst: RemoteSeg, imm: Option<u32>) -> Result<()> {
        self.qp.post_write(wr_id, src, dst, imm)
    }
    fn post_recv(&mut self, wr_id: u64) -> Result<()> {
        self.qp.post_recv(wr_id)
    }
    fn poll(&mut self, out: &mut Vec<Completion>) -> Result<()> {
        self.qp.poll(out)
    }
    fn fifo_slot(&self, slot: usize) -> [u8; CTS_BYTES] {
        self.qp.fifo_slot(slot)
    }
    /// Nothing is sent on the setup socket after setup, so anything readable there (end of
    /// stream, an error, a TLS close) means the peer went away.
    fn peer_closed(&mut self) -> bool {
        if !self.closed && self.last_check.elapsed() >= CLOSE_CHECK {
            self.last_check = Instant::now();
            self.closed = self.ctrl.pending() || socket::wait_readable(self.ctrl.tcp(), Duration::ZERO);
        }
        self.closed || self.qp.peer_closed()
    }
}

/// The IB network over one fabric port; setup sockets on `iface`.
pub struct IbNet<F: Fabric> {
    fabric: Arc<F>,
    iface: Interface,
}

impl<F: Fabric> IbNet<F> {
    pub fn new(fabric: Arc<F>, iface: Interface) -> IbNet<F> {
        IbNet { fabric, iface }
    }
}

/// The peer as messages name it.
fn peer_label(rank: Option<u32>, addr: SocketAddr) -> String {
    match rank {
        Some(r) => format!("rank {r} ({addr})"),
        None => addr.to_string(),
    }
}

/// Receives the peer's connection info and checks it is the other role with our FIFO size.
fn recv_info(stream: &mut Stream, want: IbRole) -> Result<IbConnInfo> {
    let bytes = stream.recv_msg(IB_CONN_INFO_BYTES, "IB connection info")?;
    let info = IbConnInfo::decode(&bytes)?;
    if info.role != want || info.fifo_slots != FIFO_SLOTS as u32 {
        return Err(Error::remote(format!(
            "IB connection info from {}: role {:?} with {} FIFO slots (expected {want:?} with {FIFO_SLOTS})",
            stream.peer(),
            info.role,
            info.fifo_slots
        )));
    }
    Ok(info)
}

impl<F: Fabric> Net for IbNet<F> {
    fn name(&self) -> &'static str {
        "IB"
    }

    fn describe(&self) -> String {
        format!("[0]{} ; OOB {}:{}<0>", self.fabric.label(), self.iface.name, self.iface.addr)
    }

    fn listen(&self, comm_magic: u64) -> Result<(NetHandle, Box<dyn NetListener>)> {
        let listener = socket::listen(self.iface.addr, 0)?;
        let addr = listener.local_addr().map_err(|e| Error::system("getsockname", e))?;
        let mut handle = vec![0u8; ADDR_BYTES];
        encode_addr(&addr, &mut handle);
        Ok((handle, Box::new(IbListener::spawn(listener, comm_magic, self.fabric.clone())?)))
    }

    fn connect(&self, handle: &[u8], me: ConnectorId) -> Result<Box<dyn NetSend>> {
        let addr = decode_addr(handle)?;
        let deadline = Instant::now() + socket::setup_timeout();
        let mut ctrl = socket::connect(addr, deadline)?;
        ctrl.set_timeout(Some(socket::setup_timeout()))?;
        ctrl.send_hello(&Hello { magic: me.comm_magic, kind: ConnKind::IbSetup, rank: me.rank, extra: me.channel })?;
        let (mut qp, local) = self.fabric.create(IbRole::Sender)?;
        ctrl.send_msg(&local.encode(), "IB connection info")?;
        let remote = recv_info(&mut ctrl, IbRole::Receiver)?;
        self.fabric.connect(&mut qp, &remote)?;
        ctrl.write_all_or(&[READY], "IB ready")?;
        ctrl.set_timeout(None)?;
        let peer = format!("the receiver at {addr}");
        Ok(Box::new(IbSend {
            ep: Endpoint::new(qp, ctrl),
            flow: SendFlow::new(peer, SQ_DEPTH),
            regs: HashMap::new(),
            fabric: self.fabric.clone(),
        }))
    }
}

type Accepted = (ConnectorId, Box<dyn NetRecv>);

/// Accepts setup connections on a thread of its own and runs each one's setup on a thread of
/// its own (a slow or hostile peer stalls neither the progress loop nor other peers' setups),
/// handing finished receive halves over a channel.
struct IbListener {
    accepted: mpsc::Receiver<Accepted>,
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl IbListener {
    fn spawn<F: Fabric>(listener: TcpListener, magic: u64, fabric: Arc<F>) -> Result<IbListener> {
        let (tx, rx) = mpsc::channel();
        let stop = Arc::new(AtomicBool::new(false));
        let st = stop.clone();
        listener.set_nonblocking(true).map_err(|e| Error::system("O_NONBLOCK", e))?;
        let thread = std::thread::Builder::new()
            .name("ferroccl-ib-accept".into())
            .spawn(move || accept_loop(&listener, magic, &fabric, &tx, &st))
            .map_err(|e| Error::system("spawn IB acceptor thread", e))?;
        Ok(IbListener { accepted: rx, stop, thread: Some(thread) })
    }
}

impl Drop for IbListener {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Release);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

fn accept_loop<F: Fabric>(
    listener: &TcpListener,
    magic: u64,
    fabric: &Arc<F>,
    tx: &mpsc::Sender<Accepted>,
    stop: &AtomicBool,
) {
    let pending = Arc::new(AtomicUsize::new(0));
    while !stop.load(Ordering::Acquire) {
        match listener.accept() {
            Ok((tcp, from)) => {
                if pending.load(Ordering::Acquire) >= MAX_PENDING_SETUPS {
                    log::warn!(target: "NET", "NET/IB : too many setup connections in progress; dropped {from}");
                    continue;
                }
                pending.fetch_add(1, Ordering::AcqRel);
                let (fabric, tx, done) = (fabric.clone(), tx.clone(), pending.clone());
                // One thread per setup connection: a slow or silent peer holds only its own.
                let spawned = std::thread::Builder::new().name("ferroccl-ib-setup".into()).spawn(move || {
                    match accept_one(tcp, magic, &fabric) {
                        Ok(accepted) => {
                            let _ = tx.send(accepted); // the listener may be gone: then dropped
                        }
                        Err(e) => log::warn!(target: "NET", "NET/IB : dropped setup connection from {from}: {e}"),
                    }
                    done.fetch_sub(1, Ordering::AcqRel);
                });
                if let Err(e) = spawned {
                    log::warn!(target: "NET", "NET/IB : dropped setup connection from {from}: spawn: {e}");
                    pending.fetch_sub(1, Ordering::AcqRel);
                }
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock || e.kind() == std::io::ErrorKind::Interrupted => {
                socket::wait_readable(listener, Duration::from_millis(50));
            }
            Err(e) => {
                log::warn!(target: "NET", "NET/IB : accept: {e}");
                std::thread::sleep(Duration::from_millis(50));
            }
        }
    }
}

/// The receiving side's setup for one connection (bounded by the setup timeout).
fn accept_one<F: Fabric>(tcp: std::net::TcpStream, magic: u64, fabric: &Arc<F>) -> Result<Accepted> {
    tcp.set_nonblocking(false).map_err(|e| Error::system("O_NONBLOCK", e))?;
    let deadline = Instant::now() + socket::setup_timeout();
    let mut ctrl = Stream::establish(tcp, Role::Server, deadline)?;
    ctrl.set_timeout(Some(socket::setup_timeout()))?;
    let hello = ctrl.recv_hello(magic)?;
    if hello.kind != ConnKind::IbSetup {
        return Err(Error::remote(format!("a {:?} connection on the IB listener", hello.kind)));
    }
    ctrl.attribute(magic, tls::Owner::Listener, tls::Channel::NetIb);
    let remote = recv_info(&mut ctrl, IbRole::Sender)?;
    let (mut qp, local) = fabric.create(IbRole::Receiver)?;
    fabric.connect(&mut qp, &remote)?;
    ctrl.send_msg(&local.encode(), "IB connection info")?;
    let mut ready = [0u8; 1];
    ctrl.read_exact_or(&mut ready, "IB ready")?;
    if ready[0] != READY {
        return Err(Error::remote(format!("IB setup: ready byte {:#x}", ready[0])));
    }
    ctrl.set_timeout(None)?;
    let id = ConnectorId { comm_magic: magic, rank: hello.rank, channel: hello.extra };
    let peer = peer_label(Some(hello.rank), ctrl.peer());
    let fifo = RemoteSeg { addr: remote.fifo_addr, rkey: remote.fifo_rkey };
    let recv = IbRecv {
        ep: Endpoint::new(qp, ctrl),
        flow: RecvFlow::new(peer, fifo, SQ_DEPTH),
        regs: HashMap::new(),
        fabric: fabric.clone(),
    };
    Ok((id, Box::new(recv)))
}

impl NetListener for IbListener {
    fn accept(&mut self) -> Result<Option<(ConnectorId, Box<dyn NetRecv>)>> {
        match self.accepted.try_recv() {
            Ok(a) => Ok(Some(a)),
            Err(mpsc::TryRecvError::Empty) => Ok(None),
            Err(mpsc::TryRecvError::Disconnected) => Err(Error::internal("NET/IB : acceptor thread ended")),
        }
    }

    fn wait_hint(&self) -> Option<WaitHint> {
        None
    }
}

/// The sending half of an IB connection.
struct IbSend<F: Fabric> {
    ep: Endpoint<F::Qp>,
    flow: SendFlow,
    /// Registrations of requests not yet reported complete.
    regs: HashMap<u64, RegRef>,
    fabric: Arc<F>,
}

/// The receiving half.
struct IbRecv<F: Fabric> {
    ep: Endpoint<F::Qp>,
    flow: RecvFlow,
    regs: HashMap<u64, RegRef>,
    fabric: Arc<F>,
}

/// Releases the registration of a request once its outcome is reported.
fn finish<F: Fabric>(fabric: &F, regs: &mut HashMap<u64, RegRef>, req: RequestId, r: &Result<Option<usize>>) {
    if !matches!(r, Ok(None)) {
        if let Some(reg) = regs.remove(&req.0) {
            fabric.release(reg);
        }
    }
}

impl<F: Fabric> NetSend for IbSend<F> {
    // The call signature is not carried over IB (the clear-to-send entry has no field for
    // it): mismatched calls show as size mismatches, or not at all when sizes agree.
    fn isend(&mut self, data: MemRegion, _sig: OpSig) -> Result<Option<RequestId>> {
        self.flow.progress(&mut self.ep)?;
        let reg = self.fabric.acquire(data, Access::Local)?;
        match self.flow.post(data.ptr() as u64, data.len(), reg.keys.lkey) {
            Ok(Some(id)) => {
                self.regs.insert(id.0, reg);
                self.flow.progress(&mut self.ep)?;
                Ok(Some(id))
            }
            other => {
                self.fabric.release(reg);
                other
            }
        }
    }

    fn test(&mut self, req: RequestId) -> Result<Option<usize>> {
        self.flow.progress(&mut self.ep)?;
        let r = self.flow.test(req);
        finish(&*self.fabric, &mut self.regs, req, &r);
        r
    }

    fn wait_hint(&self) -> Option<WaitHint> {
        None // completion queues are polled, as NCCL's proxy does
    }

    fn progress_mark(&self) -> u64 {
        self.flow.progress_mark()
    }

    fn via(&self) -> String {
        "NET/IB/0".into()
    }
}

impl<F: Fabric> Drop for IbSend<F> {
    fn drop(&mut self) {
        for (_, reg) in self.regs.drain() {
            self.fabric.release(reg);
        }
    }
}

impl<F: Fabric> NetRecv for IbRecv<F> {
    // As for sends: no call signature over IB.
    fn irecv(&mut self, data: MemRegion, _sig: OpSig) -> Result<Option<RequestId>> {
        self.flow.progress(&mut self.ep)?;
        let reg = self.fabric.acquire(data, Access::RemoteWrite)?;
        match self.flow.post(data.ptr() as u64, data.len(), reg.keys.rkey) {
            Ok(Some(id)) => {
                self.regs.insert(id.0, reg);
                self.flow.progress(&mut self.ep)?;
                Ok(Some(id))
            }
            other => {
                self.fabric.release(reg);
                other
            }
        }
    }

    fn test(&mut self, req: RequestId) -> Result<Option<usize>> {
        self.flow.progress(&mut self.ep)?;
        let r = self.flow.test(req);
        finish(&*self.fabric, &mut self.regs, req, &r);
        r
    }

    fn wait_hint(&self) -> Option<WaitHint> {
        None
    }

    fn progress_mark(&self) -> u64 {
        self.flow.progress_mark()
    }
}

impl<F: Fabric> Drop for IbRecv<F> {
    fn drop(&mut self) {
        for (_, reg) in self.regs.drain() {
            self.fabric.release(reg);
        }
    }
}

#[cfg(test)]
mod tests;
