//! One communicator's connections: listeners, and per peer a send and a receive connection,
//! made on first use (NCCL's runtime connect). Chooses the transport for each peer in NCCL's
//! priority order: peer-to-peer (later), shared memory for peers on this host, then network.

use std::sync::Arc;

use super::node_area::NodeArea;
use super::shm::ShmNet;
use super::{ConnectorId, Net, NetHandle, NetListener, NetRecv, NetSend, WaitHint};
use crate::error::{Error, Result};
use crate::interrupt::Interrupt;

/// What links need to know about each peer.
#[derive(Clone, Debug)]
pub struct PeerLink {
    pub net_handle: NetHandle,
    pub host_hash: u64,
    pub pid: u32,
    /// The peer listens for shared-memory connections.
    pub shm: bool,
}

/// The transport carrying one direction to one peer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Route {
    Shm,
    Net,
}

pub struct Links {
    rank: usize,
    magic: u64,
    host_hash: u64,
    net: Arc<dyn Net>,
    listener: Box<dyn NetListener>,
    shm: Option<(ShmNet, Box<dyn NetListener>)>,
    peers: Vec<PeerLink>,
    send: Vec<Option<Box<dyn NetSend>>>,
    recv: Vec<Option<Box<dyn NetRecv>>>,
    routes: Vec<Route>,
    /// Ranks on this host, itself included (set with the peers).
    local_ranks: usize,
    /// The shared control area, when every rank is on this host.
    node: Option<NodeArea>,
    /// The communicator's abort flag (the communicator triggers it without this lock).
    interrupt: Interrupt,
}

/// Whether shared memory may be used at all (NCCL_SHM_DISABLE, the strict encryption policy).
pub fn shm_allowed() -> bool {
    !crate::env::get_bool("NCCL_SHM_DISABLE") && !crate::encryption::strict()
}

impl Links {
    /// Starts listening; the returned handle (and `shm_listening`) must reach every peer
    /// through the bootstrap before [`Links::set_peers`].
    pub fn listen(
        net: Arc<dyn Net>,
        rank: usize,
        nranks: usize,
        magic: u64,
        host_hash: u64,
        interrupt: Interrupt,
    ) -> Result<(Links, NetHandle)> {
        let (handle, listener) = net.listen(magic)?;
        let shm = if shm_allowed() {
            let shm_net = ShmNet::with_interrupt(interrupt.clone());
            match shm_net.listen_rank(magic, rank) {
                Ok((_, l)) => Some((shm_net, l)),
                Err(e) => {
                    log::info!(target: "SHM", "SHM: disabled for this communicator: {e}");
                    None
                }
            }
        } else {
            None
        };
        let links = Links {
            rank,
            magic,
            host_hash,
            net,
            listener,
            shm,
            peers: Vec::new(),
            send: (0..nranks).map(|_| None).collect(),
            recv: (0..nranks).map(|_| None).collect(),
            routes: vec![Route::Net; nranks],
            local_ranks: 1,
            node: None,
            interrupt,
        };
        Ok((links, handle))
    }

    /// Whether this rank accepts shared-memory connections.
    pub fn shm_listening(&self) -> bool {
        self.shm.is_some()
    }

    /// Records the peers and picks each one's route.
    pub fn set_peers(&mut self, peers: Vec<PeerLink>) {
        self.routes = peers
            .iter()
            .enumerate()
            .map(|(i, p)| {
                if i != self.rank && self.shm.is_some() && p.shm && p.host_hash == self.host_hash {
                    Route::Shm
                } else {
                    Route::Net
                }
            })
            .collect();
        self.local_ranks = peers.iter().filter(|p| p.host_hash == self.host_hash).count().max(1);
        self.peers = peers;
    }

    /// Installs the node area (see `NodeArea::establish`).
    pub fn set_node_area(&mut self, area: NodeArea) {
        self.node = Some(area);
    }

    pub fn node_area(&mut self) -> Option<&mut NodeArea> {
        self.node.as_mut()
    }

    pub fn node(&self) -> Option<&NodeArea> {
        self.node.as_ref()
    }

    pub fn nranks(&self) -> usize {
        self.send.len()
    }

    /// The communicator's abort flag, for waits on these connections.
    pub fn interrupt(&self) -> &Interrupt {
        &self.interrupt
    }

    /// A number that changes whenever data moves on any connection or a peer advances a
    /// node-area counter: the executor's watchdog compares it across an idle stretch.
    pub fn progress_mark(&self) -> u64 {
        let conns = self.send.iter().flatten().map(|c| c.progress_mark());
        let conns = conns.chain(self.recv.iter().flatten().map(|c| c.progress_mark()));
        let node = self.node.as_ref().map_or(0, NodeArea::progress_mark);
        conns.fold(node, u64::wrapping_add)
    }

    /// Ranks of this communicator on this host (itself included), whatever carries their
    /// data: how many processes or threads poll for it here.
    pub fn local_ranks(&self) -> usize {
        self.local_ranks
    }

    pub fn route(&self, peer: usize) -> Route {
        self.routes[peer]
    }

    pub fn net_name(&self) -> &'static str {
        self.net.name()
    }

    /// The send connection to `peer`, connecting on first use (network connects retry for
    /// at most NCCL_SOCKET_RETRY_CNT x NCCL_SOCKET_RETRY_SLEEP_MSEC; shared-memory ones stop
    /// at the interrupt).
    pub fn send_conn(&mut self, peer: usize) -> Result<&mut dyn NetSend> {
        if self.send[peer].is_none() {
            self.interrupt.check(&format!("connecting to rank {peer}"))?;
            let me = ConnectorId { comm_magic: self.magic, rank: self.rank as u32, channel: 0 };
            let conn = match (self.routes[peer], &self.shm) {
                (Route::Shm, Some((shm, _))) => {
                    shm.connect(&ShmNet::peer_handle(self.magic, peer, self.peers[peer].pid), me)
                }
                _ => self.net.connect(&self.peers[peer].net_handle, me),
            }
            .map_err(|e| e.context(&format!("connecting to rank {peer}")))?;
            log::info!(target: "P2P", "Channel 00/0 : {}[{}] -> {}[{}] via {}", self.rank, self.rank, peer, peer, conn.via());
            self.send[peer] = Some(conn);
        }
        Ok(self.send[peer].as_deref_mut().expect("just set"))
    }

    /// The receive connection from `peer`, or `None` while it has not connected yet.
    pub fn recv_conn(&mut self, peer: usize) -> Result<Option<&mut dyn NetRecv>> {
        while self.recv[peer].is_none() {
            let accepted = match self.routes[peer] {
                Route::Shm => match &mut self.shm {
                    Some((_, l)) => l.accept()?,
                    None => None,
                },
                Route::Net => self.listener.accept()?,
            };
            match accepted {
                Some((id, conn)) => {
                    let from = id.rank as usize;
                    if from >= self.recv.len() || self.recv[from].is_some() {
                        return Err(Error::remote(format!("unexpected data connection claiming to be rank {from}")));
                    }
                    self.recv[from] = Some(conn);
                }
                None => return Ok(None),
            }
        }
        Ok(self.recv[peer].as_mut().map(|c| &mut **c as &mut dyn NetRecv))
    }

    pub fn recv_connected(&self, peer: usize) -> Option<&dyn NetRecv> {
        self.recv[peer].as_deref()
    }

    pub fn send_connected(&self, peer: usize) -> Option<&dyn NetSend> {
        self.send[peer].as_deref()
    }

    /// What to wait on while `peer` has not connected yet.
    pub fn accept_hint(&self, peer: usize) -> Option<WaitHint> {
        match (self.routes[peer], &self.shm) {
            (Route::Shm, Some((_, l))) => l.wait_hint(),
            _ => self.listener.wait_hint(),
        }
    }

    /// Connections made so far per route: (shm, net) counts of send + receive connections.
    pub fn connection_counts(&self) -> (usize, usize) {
        let mut shm = 0;
        let mut net = 0;
        for (peer, route) in self.routes.iter().enumerate() {
            let n = self.send[peer].is_some() as usize + self.recv[peer].is_some() as usize;
            match route {
                Route::Shm => shm += n,
                Route::Net => net += n,
            }
        }
        (shm, net)
    }

    /// Drops every connection (destroy/abort).
    pub fn close_all(&mut self) {
        self.send.iter_mut().for_each(|c| *c = None);
        self.recv.iter_mut().for_each(|c| *c = None);
        self.node = None;
    }
}
