//! Out-of-band setup traffic between the ranks of a communicator: the unique-id rendezvous,
//! a TCP ring for all-gathers, and tagged point-to-point messages. Only used while creating,
//! splitting and tearing down communicators; data moves through `transport`.

pub mod id;
pub mod mpi;
pub mod root;

use std::net::{SocketAddr, TcpListener};
use std::time::Instant;

use crate::error::{Error, Result};
use crate::interrupt::Interrupt;
use crate::tls;
use crate::transport::exchange::Exchange;
use crate::transport::socket::{self, ConnKind, Hello, Stream};
pub use id::UniqueId;

pub use crate::transport::socket::setup_timeout as timeout;

/// Largest bootstrap message accepted from a peer; anything larger is garbage.
const MAX_MESSAGE: usize = 64 << 20;

/// Makes a fresh unique id and starts its root (ncclGetUniqueId).
pub fn create_unique_id() -> Result<UniqueId> {
    let iface = crate::transport::netif::pick()?;
    let listener = socket::listen(iface.addr, 0)?;
    let root = listener.local_addr().map_err(|e| Error::system("getsockname", e))?;
    let magic = id::random_u64()?;
    log::info!(target: "BOOTSTRAP", "Bootstrap: Using {}:{}", iface.name, root);
    root::spawn(listener, magic)?;
    Ok(UniqueId { magic, root })
}

/// The id given by NCCL_COMM_ID, if set (its root is started by rank 0 in init).
pub fn env_unique_id() -> Result<Option<UniqueId>> {
    match crate::env::get_str("NCCL_COMM_ID") {
        None => Ok(None),
        Some(spec) => {
            let root = socket::parse_comm_id(&spec)?;
            Ok(Some(UniqueId { magic: id::COMM_ID_ENV_MAGIC, root }))
        }
    }
}

/// Starts the root for an NCCL_COMM_ID address (rank 0 does this).
pub fn start_env_root(id: &UniqueId) -> Result<()> {
    let listener = socket::listen(id.root.ip(), id.root.port())?;
    root::spawn(listener, id.magic)
}

/// One rank's view of the bootstrap network.
pub struct Bootstrap {
    rank: usize,
    nranks: usize,
    magic: u64,
    listener: TcpListener,
    addrs: Vec<SocketAddr>,
    next: Option<Stream>,
    prev: Option<Stream>,
    /// Point-to-point messages that arrived before they were asked for: (from, tag, data).
    unexpected: Vec<(usize, u32, Vec<u8>)>,
    /// The abort flag of the communicator this bootstrap serves (none while it is created).
    interrupt: Option<Interrupt>,
    /// Accepted connections whose hellos are still due (strangers are dropped from it).
    hellos: socket::HelloQueue,
}

impl Bootstrap {
    /// Joins the communicator behind `id` as `rank` of `nranks`.
    pub fn join(id: &UniqueId, rank: usize, nranks: usize) -> Result<Bootstrap> {
        Self::join_or_interrupt(id, rank, nranks, None)
    }

    /// [`Bootstrap::join`], giving up once `interrupt` is set (ncclCommAbort of a
    /// communicator whose non-blocking init is still waiting for its peers); every later wait
    /// of the bootstrap answers to it too.
    pub fn join_or_interrupt(
        id: &UniqueId,
        rank: usize,
        nranks: usize,
        interrupt: Option<&Interrupt>,
    ) -> Result<Bootstrap> {
        let deadline = Instant::now() + timeout();
        let iface = crate::transport::netif::pick()?;
        let listener = socket::listen(iface.addr, 0)?;
        let mine = listener.local_addr().map_err(|e| Error::system("getsockname", e))?;
        let addrs = root::rendezvous(id.root, id.magic, rank, nranks, mine, deadline, interrupt)?;
        Self::from_table(rank, addrs, listener, id.magic, deadline, interrupt)
    }

    /// Builds the ring once every rank's listening address is known.
    pub fn from_table(
        rank: usize,
        addrs: Vec<SocketAddr>,
        listener: TcpListener,
        magic: u64,
        deadline: Instant,
        interrupt: Option<&Interrupt>,
    ) -> Result<Bootstrap> {
        let nranks = addrs.len();
        let mut b = Bootstrap {
            rank,
            nranks,
            magic,
            listener,
            addrs,
            next: None,
            prev: None,
            unexpected: Vec::new(),
            interrupt: interrupt.cloned(),
            hellos: socket::HelloQueue::default(),
        };
        if nranks > 1 {
            // Connect to the next rank while accepting the previous one: a TLS client
            // handshake needs its server to take part, so if every rank connected first and
            // accepted afterwards, the ring would wait on itself.
            let next_addr = b.addrs[(rank + 1) % nranks];
            let prev = (rank + nranks - 1) % nranks;
            let (out, inc) = std::thread::scope(|scope| {
                let connector = std::thread::Builder::new()
                    .name("ferroccl-ring".into())
                    .spawn_scoped(scope, move || -> Result<Stream> {
                        let mut out = socket::connect(next_addr, deadline).map_err(|e| e.context("bootstrap ring"))?;
                        out.set_timeout(Some(timeout()))?;
                        out.send_hello(&Hello { magic, kind: ConnKind::Ring, rank: rank as u32, extra: 0 })?;
                        Ok(out)
                    })
                    .map_err(|e| Error::system("spawn bootstrap ring thread", e));
                let inc = b.accept_from(ConnKind::Ring, prev, deadline);
                let out = match connector {
                    Ok(h) => h.join().unwrap_or_else(|_| Err(Error::internal("bootstrap ring thread panicked"))),
                    Err(e) => Err(e),
                };
                (out, inc)
            });
            // The connecting side's error explains an accept that timed out waiting for it.
            b.next = Some(out?);
            b.prev = Some(inc?);
        }
        Ok(b)
    }

    pub fn rank(&self) -> usize {
        self.rank
    }
    pub fn nranks(&self) -> usize {
        self.nranks
    }
    pub fn magic(&self) -> u64 {
        self.magic
    }

    /// Makes every later wait give up once `interrupt` is set (the communicator's abort).
    pub fn set_interrupt(&mut self, interrupt: Interrupt) {
        self.interrupt = Some(interrupt);
    }

    /// Runs `f` with waits answering to `interrupt` instead of the communicator's own flag,
    /// then restores it: ncclCommShrink's rendezvous runs over an aborted parent
    /// (NCCL_SHRINK_ABORT) and must stop when the communicator it creates is aborted instead.
    pub fn with_interrupt<R>(&mut self, interrupt: Interrupt, f: impl FnOnce(&mut Bootstrap) -> R) -> R {
        let saved = self.interrupt.replace(interrupt);
        let r = f(self);
        self.interrupt = saved;
        r
    }

    /// Accepts connections until one of `kind` from `peer` arrives; p2p messages arriving
    /// meanwhile are queued and strangers dropped.
    fn accept_from(&mut self, kind: ConnKind, peer: usize, deadline: Instant) -> Result<Stream> {
        loop {
            let (mut s, hello) = self
                .hellos
                .next(&self.listener, self.magic, deadline, self.interrupt.as_ref())
                .map_err(|e| e.context("bootstrap"))?;
            s.set_timeout(Some(timeout()))?;
            s.attribute(self.magic, tls::Owner::Rank(self.rank as u32), tls::Channel::Bootstrap);
            match hello.kind {
                k if k == kind && hello.rank as usize == peer && kind != ConnKind::BootstrapP2p => return Ok(s),
                ConnKind::BootstrapP2p if (hello.rank as usize) < self.nranks => {
                    let data = s.recv_msg(MAX_MESSAGE, "bootstrap message")?;
                    self.unexpected.push((hello.rank as usize, hello.extra, data));
                    if kind == ConnKind::BootstrapP2p {
                        return Err(Error::internal("accept_from(p2p) must use recv"));
                    }
                }
                _ => {
                    log::info!(target: "BOOTSTRAP", "Bootstrap: dropped unexpected {:?} connection from rank {}", hello.kind, hello.rank)
                }
            }
        }
    }

    /// Every rank's `mine` (all the same length), in rank order.
    pub fn all_gather(&mut self, mine: &[u8]) -> Result<Vec<u8>> {
        let n = self.nranks;
        let len = mine.len();
        let mut all = vec![0u8; len * n];
        all[self.rank * len..(self.rank + 1) * len].copy_from_slice(mine);
        if n == 1 {
            return Ok(all);
        }
        for step in 0..n - 1 {
            let send_block = (self.rank + n - step) % n;
            let recv_block = (self.rank + n - step - 1) % n;
            if let Some(i) = &self.interrupt {
                i.check("bootstrap all-gather")?;
            }
            let next = self.next.as_mut().expect("ring exists when nranks > 1");
            next.send_msg(&all[send_block * len..(send_block + 1) * len], "bootstrap all-gather")?;
            let prev = self.prev.as_mut().expect("ring exists when nranks > 1");
            let what = format!("bootstrap all-gather: waiting for rank {}", (self.rank + n - 1) % n);
            prev.await_input(self.interrupt.as_ref(), Instant::now() + timeout(), &what)?;
            let got = prev.recv_msg(MAX_MESSAGE, "bootstrap all-gather")?;
            if got.len() != len {
                return Err(Error::invalid_usage(format!(
                    "bootstrap all-gather: rank {} sent {} bytes, expected {len} (ranks disagree on the call)",
                    (self.rank + n - 1) % n,
                    got.len()
                )));
            }
            all[recv_block * len..(recv_block + 1) * len].copy_from_slice(&got);
        }
        Ok(all)
    }

    /// Sends a tagged message to `peer` over a fresh connection.
    pub fn send(&mut self, peer: usize, tag: u32, data: &[u8]) -> Result<()> {
        if let Some(i) = &self.interrupt {
            i.check("bootstrap send")?;
        }
        let deadline = Instant::now() + timeout();
        let mut s = socket::connect(self.addrs[peer], deadline)?;
        s.set_timeout(Some(timeout()))?;
        s.send_hello(&Hello { magic: self.magic, kind: ConnKind::BootstrapP2p, rank: self.rank as u32, extra: tag })?;
        s.send_msg(data, "bootstrap send")
    }

    /// Receives the tagged message `peer` sent (messages are matched by sender and tag).
    pub fn recv(&mut self, peer: usize, tag: u32) -> Result<Vec<u8>> {
        let deadline = Instant::now() + timeout();
        loop {
            if let Some(i) = self.unexpected.iter().position(|(p, t, _)| *p == peer && *t == tag) {
                return Ok(self.unexpected.remove(i).2);
            }
            let (mut s, hello) = self
                .hellos
                .next(&self.listener, self.magic, deadline, self.interrupt.as_ref())
                .map_err(|e| e.context(&format!("bootstrap recv from rank {peer}")))?;
            s.set_timeout(Some(timeout()))?;
            if hello.kind == ConnKind::BootstrapP2p && (hello.rank as usize) < self.nranks {
                s.attribute(self.magic, tls::Owner::Rank(self.rank as u32), tls::Channel::Bootstrap);
                let data = s.recv_msg(MAX_MESSAGE, "bootstrap message")?;
                self.unexpected.push((hello.rank as usize, hello.extra, data));
            } else {
                log::info!(target: "BOOTSTRAP", "Bootstrap: dropped unexpected {:?} connection from rank {}", hello.kind, hello.rank)
            }
        }
    }

    /// All ranks reach this point before any leaves it.
    pub fn barrier(&mut self) -> Result<()> {
        self.all_gather(&[1]).map(|_| ())
    }

    /// The listening address, for children made by split.
    pub fn local_ip(&self) -> Result<std::net::IpAddr> {
        self.listener.local_addr().map(|a| a.ip()).map_err(|e| Error::system("getsockname", e))
    }
}

impl Exchange for Bootstrap {
    fn rank(&self) -> usize {
        Bootstrap::rank(self)
    }
    fn nranks(&self) -> usize {
        Bootstrap::nranks(self)
    }
    fn all_gather(&mut self, mine: &[u8]) -> Result<Vec<u8>> {
        Bootstrap::all_gather(self, mine)
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[test]
    fn ring_all_gather_and_p2p_over_threads() {
        let id = create_unique_id().unwrap();
        let n = 4;
        let handles: Vec<_> = (0..n)
            .map(|rank| {
                std::thread::spawn(move || {
                    let mut b = Bootstrap::join(&id, rank, n).unwrap();
                    let all = b.all_gather(&[rank as u8 * 10, 7]).unwrap();
                    assert_eq!(all, vec![0, 7, 10, 7, 20, 7, 30, 7]);
                    // Everyone sends to rank 0 with two tags, in reverse tag order.
                    if rank != 0 {
                        b.send(0, 2, &[rank as u8, 2]).unwrap();
                        b.send(0, 1, &[rank as u8, 1]).unwrap();
                    } else {
                        for peer in (1..n).rev() {
                            assert_eq!(b.recv(peer, 1).unwrap(), vec![peer as u8, 1]);
                            assert_eq!(b.recv(peer, 2).unwrap(), vec![peer as u8, 2]);
                        }
                    }
                    b.barrier().unwrap();
                })
            })
            .collect();
        for h in handles {
            h.join().unwrap();
        }
    }

    /// Rank 0 waits in an all-gather and then in a receive that rank 1 never serves; its
    /// interrupt, set from another thread, must end each wait within a poll slice or two.
    #[test]
    fn interrupt_ends_bootstrap_waits() {
        let id = create_unique_id().unwrap();
        let (done_tx, done_rx) = std::sync::mpsc::channel::<()>();
        let idle = std::thread::spawn(move || {
            let _b = Bootstrap::join(&id, 1, 2).unwrap();
            // Keep the connections open, silent, until rank 0 is done.
            let _ = done_rx.recv_timeout(Duration::from_secs(30));
        });
        let mut b = Bootstrap::join(&id, 0, 2).unwrap();
        for what in ["all-gather", "recv"] {
            let interrupt = Interrupt::new();
            b.set_interrupt(interrupt.clone());
            let trigger = std::thread::spawn(move || {
                std::thread::sleep(Duration::from_millis(200));
                interrupt.trigger();
                Instant::now()
            });
            let err = match what {
                "all-gather" => b.all_gather(&[1, 2, 3]).map(|_| ()),
                _ => b.recv(1, 9).map(|_| ()),
            }
            .unwrap_err();
            let released = Instant::now().saturating_duration_since(trigger.join().unwrap());
            assert_eq!(err.code(), crate::types::ncclResult_t::ncclInvalidUsage, "{what}: {err}");
            assert!(err.to_string().contains("aborted"), "{what}: {err}");
            assert!(released < Duration::from_secs(1), "{what}: released {released:?} after the interrupt");
        }
        let _ = done_tx.send(());
        idle.join().unwrap();
    }

    #[test]
    fn wrong_magic_is_dropped_and_root_keeps_serving() {
        let id = create_unique_id().unwrap();
        // A stranger with another magic, and one sending garbage, connect first.
        let deadline = Instant::now() + Duration::from_secs(5);
        let mut s = socket::connect(id.root, deadline).unwrap();
        s.send_hello(&Hello { magic: id.magic ^ 1, kind: ConnKind::Root, rank: 0, extra: 0 }).unwrap();
        let mut g = socket::connect(id.root, deadline).unwrap();
        g.write_all_or(b"GET / HTTP/1.0\r\n\r\n garbage garbage", "test").unwrap();
        let t: Vec<_> = (0..2).map(|r| std::thread::spawn(move || Bootstrap::join(&id, r, 2).map(|_| ()))).collect();
        for h in t {
            h.join().unwrap().unwrap();
        }
    }
}
