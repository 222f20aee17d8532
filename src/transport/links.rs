//! One communicator's connections: listeners, and per peer a send and a receive connection,
//! made on first use (NCCL's runtime connect). The transport for each peer is chosen once, at
//! [`Links::set_peers`], in NCCL's priority order (see [`super::tier`]): peer-to-peer, shared
//! memory for peers on this host, then the network.

use std::sync::Arc;

use super::node_area::NodeArea;
use super::tier::{NetTransport, P2pTransport, ShmTransport, Transport};
pub use super::tier::{PeerLink, Tier, TierPolicy};
use super::{ConnectorId, Net, NetHandle, NetRecv, NetSend, WaitHint};
use crate::error::{Error, Result};
use crate::interrupt::Interrupt;

/// Indexes of the tiers in [`Links::tiers`] (priority order).
const P2P: usize = 0;
const SHM: usize = 1;
const NET: usize = 2;

pub struct Links {
    rank: usize,
    magic: u64,
    host_hash: u64,
    net_name: &'static str,
    /// P2P, SHM, NET, in NCCL's order.
    tiers: [Box<dyn Transport>; 3],
    peers: Vec<PeerLink>,
    send: Vec<Option<Box<dyn NetSend>>>,
    recv: Vec<Option<Box<dyn NetRecv>>>,
    /// Per peer, the index in `tiers` of the transport chosen at setup.
    chosen: Vec<usize>,
    /// Ranks on this host, itself included (set with the peers).
    local_ranks: usize,
    /// The shared control area, when every rank is on this host.
    node: Option<NodeArea>,
    /// The communicator's abort flag (the communicator triggers it without this lock).
    interrupt: Interrupt,
}

impl Links {
    /// Sets up every tier's side (listens); the returned handle (and `shm_listening`) must
    /// reach every peer through the bootstrap before [`Links::set_peers`].
    pub fn listen(
        net: Arc<dyn Net>,
        policy: TierPolicy,
        rank: usize,
        nranks: usize,
        magic: u64,
        host_hash: u64,
        interrupt: Interrupt,
    ) -> Result<(Links, NetHandle)> {
        let net_name = net.name();
        let (net, handle) = NetTransport::listen(net, magic)?;
        let tiers: [Box<dyn Transport>; 3] = [
            Box::new(P2pTransport::new(policy)),
            Box::new(ShmTransport::new(policy, magic, rank, interrupt.clone())),
            Box::new(net),
        ];
        let links = Links {
            rank,
            magic,
            host_hash,
            net_name,
            tiers,
            peers: Vec::new(),
            send: (0..nranks).map(|_| None).collect(),
            recv: (0..nranks).map(|_| None).collect(),
            chosen: vec![NET; nranks],
            local_ranks: 1,
            node: None,
            interrupt,
        };
        Ok((links, handle))
    }

    /// Whether this rank accepts shared-memory connections.
    pub fn shm_listening(&self) -> bool {
        self.tiers[SHM].listening()
    }

    /// Records the peers and picks each one's transport: the first tier that can connect.
    pub fn set_peers(&mut self, peers: Vec<PeerLink>) -> Result<()> {
        let me = peers.get(self.rank).ok_or_else(|| Error::internal("peer table lacks this rank"))?.clone();
        let mut counts = [0usize; 3];
        let mut first_refusals: [Option<String>; 3] = Default::default();
        self.chosen = Vec::with_capacity(peers.len());
        for p in &peers {
            let (choice, refused) = super::tier::choose(&self.tiers, &me, p);
            let i = choice.ok_or_else(|| Error::internal(format!("no transport can reach rank {}", p.rank)))?;
            if p.rank != self.rank {
                counts[i] += 1;
                for (tier, why) in refused {
                    let slot = &mut first_refusals[tier as usize];
                    if slot.is_none() {
                        *slot = Some(format!("{} not used for rank {}: {why}", tier.name(), p.rank));
                    }
                }
            }
            self.chosen.push(i);
        }
        let reasons: Vec<String> = first_refusals.into_iter().flatten().collect();
        log::info!(
            target: "INIT",
            "Transports: P2P {} peers, SHM {} peers, NET/{} {} peers{}{}",
            counts[P2P],
            counts[SHM],
            self.net_name,
            counts[NET],
            if reasons.is_empty() { "" } else { "; " },
            reasons.join("; ")
        );
        self.local_ranks = peers.iter().filter(|p| p.host_hash == self.host_hash).count().max(1);
        self.peers = peers;
        Ok(())
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

    /// The transport tier chosen for `peer` at setup.
    pub fn tier(&self, peer: usize) -> Tier {
        self.tiers[self.chosen[peer]].tier()
    }

    pub fn net_name(&self) -> &'static str {
        self.net_name
    }

    /// The send connection to `peer`, connecting on first use (network connects retry for
    /// at most NCCL_SOCKET_RETRY_CNT x NCCL_SOCKET_RETRY_SLEEP_MSEC; shared-memory ones stop
    /// at the interrupt).
    pub fn send_conn(&mut self, peer: usize) -> Result<&mut dyn NetSend> {
        if self.send[peer].is_none() {
            self.interrupt.check(&format!("connecting to rank {peer}"))?;
            let me = ConnectorId { comm_magic: self.magic, rank: self.rank as u32, channel: 0 };
            let conn = self.tiers[self.chosen[peer]]
                .connect(me, &self.peers[peer])
                .map_err(|e| e.context(&format!("connecting to rank {peer}")))?;
            log::info!(target: "P2P", "Channel 00/0 : {}[{}] -> {}[{}] via {}", self.rank, self.rank, peer, peer, conn.via());
            self.send[peer] = Some(conn);
        }
        Ok(self.send[peer].as_deref_mut().expect("just set"))
    }

    /// The receive connection from `peer`, or `None` while it has not connected yet.
    pub fn recv_conn(&mut self, peer: usize) -> Result<Option<&mut dyn NetRecv>> {
        while self.recv[peer].is_none() {
            let accepted = self.tiers[self.chosen[peer]].accept()?;
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
        self.tiers[self.chosen[peer]].accept_hint()
    }

    /// Connections made so far per tier: (shm, net) counts of send + receive connections
    /// (P2P never connects host buffers).
    pub fn connection_counts(&self) -> (usize, usize) {
        let mut per_tier = [0usize; 3];
        for (peer, &i) in self.chosen.iter().enumerate() {
            per_tier[i] += self.send[peer].is_some() as usize + self.recv[peer].is_some() as usize;
        }
        (per_tier[SHM], per_tier[NET])
    }

    /// Drops every connection (destroy/abort).
    pub fn close_all(&mut self) {
        self.send.iter_mut().for_each(|c| *c = None);
        self.recv.iter_mut().for_each(|c| *c = None);
        self.node = None;
        self.tiers.iter_mut().for_each(|t| t.free());
    }
}
