//! The socket transport: one TCP connection per direction and peer, non-blocking, each
//! message framed as a 16-byte header (magic, reserved, length) followed by the bytes.
//!
//! Requests queue per connection and complete in order; progress happens inside `isend`,
//! `irecv` and `test`, so whichever thread polls drives the wire (the caller for host
//! buffers, a proxy thread later for device buffers).

use std::collections::{HashMap, VecDeque};
use std::io::{self, IoSlice, IoSliceMut, Read, Write};
use std::net::{SocketAddr, TcpListener};
use std::os::fd::AsRawFd;
use std::time::Instant;

use super::netif::Interface;
use super::socket::{self, decode_addr, encode_addr, ConnKind, Hello, Stream, ADDR_BYTES, HELLO_BYTES};
use super::{ConnectorId, MemRegion, Net, NetHandle, NetListener, NetRecv, NetSend, RequestId, WaitHint};
use crate::error::{Error, Result};

const FRAME_MAGIC: u32 = 0x4c43_4346; // "FCCL"
const FRAME_BYTES: usize = 16;
/// Requests one connection queues at most (NCCL allows 32 per comm).
const MAX_QUEUED: usize = 64;

pub struct SocketNet {
    iface: Interface,
}

impl SocketNet {
    pub fn new(iface: Interface) -> SocketNet {
        SocketNet { iface }
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
        Ok((handle, Box::new(SocketListener { listener, magic: comm_magic, pending: Vec::new() })))
    }

    fn connect(&self, handle: &[u8], me: ConnectorId) -> Result<Box<dyn NetSend>> {
        let addr: SocketAddr = decode_addr(handle)?;
        let deadline = Instant::now() + crate::bootstrap::timeout();
        let mut stream = socket::connect(addr, deadline)?;
        stream.set_timeout(Some(crate::bootstrap::timeout()))?;
        stream.send_hello(&Hello { magic: me.comm_magic, kind: ConnKind::Data, rank: me.rank, extra: me.channel })?;
        stream.set_nonblocking(true)?;
        Ok(Box::new(SocketSend { stream, queue: VecDeque::new(), next_id: 0, done: HashMap::new() }))
    }
}

struct SocketListener {
    listener: TcpListener,
    magic: u64,
    /// Accepted connections whose hello has not fully arrived yet.
    pending: Vec<(Stream, [u8; HELLO_BYTES], usize)>,
}

impl NetListener for SocketListener {
    fn accept(&mut self) -> Result<Option<(ConnectorId, Box<dyn NetRecv>)>> {
        loop {
            match self.listener.accept() {
                Ok((tcp, _)) => {
                    let stream = Stream::from_tcp(tcp)?;
                    stream.set_nonblocking(true)?;
                    self.pending.push((stream, [0; HELLO_BYTES], 0));
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(Error::system("accept", e)),
            }
        }
        let mut i = 0;
        while i < self.pending.len() {
            let (stream, buf, got) = &mut self.pending[i];
            match stream.read(&mut buf[*got..]) {
                Ok(0) => {
                    self.pending.swap_remove(i);
                    continue;
                }
                Ok(n) => *got += n,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock || e.kind() == io::ErrorKind::Interrupted => {}
                Err(_) => {
                    self.pending.swap_remove(i);
                    continue;
                }
            }
            if *got < HELLO_BYTES {
                i += 1;
                continue;
            }
            let (stream, buf, _) = self.pending.swap_remove(i);
            match Hello::decode(&buf, self.magic) {
                Ok(h) if h.kind == ConnKind::Data => {
                    let id = ConnectorId { comm_magic: h.magic, rank: h.rank, channel: h.extra };
                    let recv = SocketRecv { stream, queue: VecDeque::new(), next_id: 0, done: HashMap::new() };
                    return Ok(Some((id, Box::new(recv))));
                }
                Ok(h) => {
                    log::info!(target: "NET", "NET/Socket : dropped {:?} connection from {}", h.kind, stream.peer())
                }
                Err(e) => log::info!(target: "NET", "NET/Socket : dropped connection from {}: {e}", stream.peer()),
            }
        }
        Ok(None)
    }

    fn wait_hint(&self) -> Option<WaitHint> {
        Some(WaitHint { fd: self.listener.as_raw_fd(), readable: true, writable: false })
    }
}

struct SendReq {
    id: u64,
    region: MemRegion,
    header: [u8; FRAME_BYTES],
    sent: usize,
}

struct SocketSend {
    stream: Stream,
    queue: VecDeque<SendReq>,
    next_id: u64,
    done: HashMap<u64, usize>,
}

impl SocketSend {
    fn progress(&mut self) -> Result<()> {
        while let Some(req) = self.queue.front_mut() {
            let total = FRAME_BYTES + req.region.len();
            while req.sent < total {
                let data = region_bytes(&req.region);
                let r = if req.sent < FRAME_BYTES {
                    self.stream.write_vectored(&[IoSlice::new(&req.header[req.sent..]), IoSlice::new(data)])
                } else {
                    self.stream.write(&data[req.sent - FRAME_BYTES..])
                };
                match r {
                    Ok(0) => return Err(Error::remote(format!("send to {}: connection closed", self.stream.peer()))),
                    Ok(n) => req.sent += n,
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(()),
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                    Err(e) => return Err(socket::io_error(e, "send", self.stream.peer())),
                }
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
    fn isend(&mut self, data: MemRegion) -> Result<Option<RequestId>> {
        if self.queue.len() >= MAX_QUEUED {
            self.progress()?;
            if self.queue.len() >= MAX_QUEUED {
                return Ok(None);
            }
        }
        let id = self.next_id;
        self.next_id += 1;
        let mut header = [0u8; FRAME_BYTES];
        header[0..4].copy_from_slice(&FRAME_MAGIC.to_le_bytes());
        header[8..16].copy_from_slice(&(data.len() as u64).to_le_bytes());
        self.queue.push_back(SendReq { id, region: data, header, sent: 0 });
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

    fn wait_hint(&self) -> Option<WaitHint> {
        (!self.queue.is_empty()).then(|| WaitHint {
            fd: self.stream.tcp().as_raw_fd(),
            readable: false,
            writable: true,
        })
    }

    fn via(&self) -> String {
        "NET/Socket/0".into()
    }
}

struct RecvReq {
    id: u64,
    region: MemRegion,
    header: [u8; FRAME_BYTES],
    got: usize,
}

struct SocketRecv {
    stream: Stream,
    queue: VecDeque<RecvReq>,
    next_id: u64,
    done: HashMap<u64, usize>,
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
                    let (hdr, len) = (&mut req.header[req.got..], data.len());
                    let r =
                        self.stream.tcp().read_vectored(&mut [IoSliceMut::new(hdr), IoSliceMut::new(&mut data[..len])]);
                    r
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
                        if before < FRAME_BYTES && req.got >= FRAME_BYTES {
                            check_frame(&req.header, req.region.len(), self.stream.peer())?;
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

fn check_frame(header: &[u8; FRAME_BYTES], expected: usize, peer: SocketAddr) -> Result<()> {
    let magic = u32::from_le_bytes(header[0..4].try_into().expect("4 bytes"));
    if magic != FRAME_MAGIC {
        return Err(Error::remote(format!("garbage on the data connection from {peer} (bad frame magic {magic:#x})")));
    }
    let len = u64::from_le_bytes(header[8..16].try_into().expect("8 bytes"));
    if len != expected as u64 {
        return Err(Error::invalid_usage(format!(
            "message size mismatch: peer {peer} sent {len} bytes, {expected} were posted (do the ranks' calls match?)"
        )));
    }
    Ok(())
}

impl NetRecv for SocketRecv {
    fn irecv(&mut self, data: MemRegion) -> Result<Option<RequestId>> {
        if self.queue.len() >= MAX_QUEUED {
            return Ok(None);
        }
        let id = self.next_id;
        self.next_id += 1;
        self.queue.push_back(RecvReq { id, region: data, header: [0; FRAME_BYTES], got: 0 });
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

    fn wait_hint(&self) -> Option<WaitHint> {
        (!self.queue.is_empty()).then(|| WaitHint {
            fd: self.stream.tcp().as_raw_fd(),
            readable: true,
            writable: false,
        })
    }
}
