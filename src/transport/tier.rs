//! Transport tiers in NCCL's shape: peer-to-peer (P2P), shared memory (SHM), network (NET),
//! tried in that order for each peer; the first whose [`Transport::can_connect`] holds wins.
//!
//! The choice is made once per peer at setup (from the peer table every rank exchanged) and
//! kept by [`super::links::Links`]; operations then use the stored connections and never ask
//! again. Each transport sets up its side when built (listens), connects a send side to a peer,
//! accepts receive sides, and frees its side.
//!
//! P2P cannot connect host buffers (CUDA IPC between different GPUs would plug in here); it is
//! in the list so that the order and the logged reasons match NCCL's.

use std::sync::Arc;

use super::shm::ShmNet;
use super::{ConnectorId, Net, NetHandle, NetListener, NetRecv, NetSend, WaitHint};
use crate::error::{Error, Result};
use crate::interrupt::Interrupt;

/// What each rank knows about every peer after the peer table exchange.
#[derive(Clone, Debug)]
pub struct PeerLink {
    pub rank: usize,
    pub net_handle: NetHandle,
    pub host_hash: u64,
    pub pid: u32,
    /// The peer listens for shared-memory connections.
    pub shm: bool,
}

/// A transport tier, in priority order.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Tier {
    P2p,
    Shm,
    Net,
}

impl Tier {
    /// Name as NCCL logs it.
    pub fn name(self) -> &'static str {
        match self {
            Tier::P2p => "P2P",
            Tier::Shm => "SHM",
            Tier::Net => "NET",
        }
    }
}

/// The settings that enable or forbid tiers, read once from the environment (or given by tests).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TierPolicy {
    /// NCCL_P2P_DISABLE.
    pub p2p_disabled: bool,
    /// NCCL_SHM_DISABLE.
    pub shm_disabled: bool,
    /// The strict encryption policy: shared memory carries plaintext, so it is not used.
    pub strict_encryption: bool,
}

impl TierPolicy {
    pub fn from_env() -> TierPolicy {
        TierPolicy {
            p2p_disabled: crate::env::get_bool("NCCL_P2P_DISABLE"),
            shm_disabled: crate::env::get_bool("NCCL_SHM_DISABLE"),
            strict_encryption: crate::encryption::strict(),
        }
    }
}

/// One transport tier's side of a communicator (NCCL's `ncclTransport`: canConnect, setup,
/// connect, free).
pub trait Transport: Send {
    fn tier(&self) -> Tier;
    /// `Ok` when this transport can carry data between `me` and `peer`, else why not.
    fn check(&self, me: &PeerLink, peer: &PeerLink) -> std::result::Result<(), String>;
    /// NCCL's canConnect.
    fn can_connect(&self, me: &PeerLink, peer: &PeerLink) -> bool {
        self.check(me, peer).is_ok()
    }
    /// Whether this side accepts connections (peers learn it through the peer table).
    fn listening(&self) -> bool;
    /// Connects this rank's send side to `peer`.
    fn connect(&self, me: ConnectorId, peer: &PeerLink) -> Result<Box<dyn NetSend>>;
    /// A receive connection that has arrived, with who made it; `None` if none waits.
    fn accept(&mut self) -> Result<Option<(ConnectorId, Box<dyn NetRecv>)>>;
    /// What to wait on while no connection has arrived.
    fn accept_hint(&self) -> Option<WaitHint>;
    /// Frees this side (stops listening); connections already made are the caller's.
    fn free(&mut self);
}

/// Peer-to-peer between GPUs: never connects host buffers.
pub struct P2pTransport {
    policy: TierPolicy,
}

impl P2pTransport {
    pub fn new(policy: TierPolicy) -> P2pTransport {
        P2pTransport { policy }
    }
}

impl Transport for P2pTransport {
    fn tier(&self) -> Tier {
        Tier::P2p
    }
    fn check(&self, _me: &PeerLink, _peer: &PeerLink) -> std::result::Result<(), String> {
        if self.policy.p2p_disabled {
            Err("disabled by NCCL_P2P_DISABLE".into())
        } else {
            Err("host buffers cannot use CUDA IPC (device-buffer collectives of ranks on one GPU, or on GPUs with peer \
                 access, use it outside the transports)"
                .into())
        }
    }
    fn listening(&self) -> bool {
        false
    }
    fn connect(&self, _me: ConnectorId, peer: &PeerLink) -> Result<Box<dyn NetSend>> {
        Err(Error::internal(format!("P2P cannot connect to rank {}", peer.rank)))
    }
    fn accept(&mut self) -> Result<Option<(ConnectorId, Box<dyn NetRecv>)>> {
        Ok(None)
    }
    fn accept_hint(&self) -> Option<WaitHint> {
        None
    }
    fn free(&mut self) {}
}

/// Shared memory between ranks on one host.
pub struct ShmTransport {
    magic: u64,
    side: std::result::Result<(ShmNet, Box<dyn NetListener>), String>,
}

impl ShmTransport {
    /// Listens for shared-memory connections unless the policy forbids them (or listening
    /// fails, which is logged and leaves this tier unable to connect).
    pub fn new(policy: TierPolicy, magic: u64, rank: usize, interrupt: Interrupt) -> ShmTransport {
        let side = if policy.shm_disabled {
            Err("disabled by NCCL_SHM_DISABLE".to_string())
        } else if policy.strict_encryption {
            Err("not used under the strict encryption policy (shared memory is not encrypted)".to_string())
        } else {
            let shm_net = ShmNet::with_interrupt(interrupt);
            match shm_net.listen_rank(magic, rank) {
                Ok((_, l)) => Ok((shm_net, l)),
                Err(e) => {
                    log::info!(target: "SHM", "SHM: disabled for this communicator: {e}");
                    Err(format!("cannot listen: {e}"))
                }
            }
        };
        ShmTransport { magic, side }
    }
}

impl Transport for ShmTransport {
    fn tier(&self) -> Tier {
        Tier::Shm
    }
    fn check(&self, me: &PeerLink, peer: &PeerLink) -> std::result::Result<(), String> {
        if let Err(why) = &self.side {
            return Err(why.clone());
        }
        if peer.rank == me.rank {
            Err("same rank".into())
        } else if peer.host_hash != me.host_hash {
            Err(format!("rank {} is on another host", peer.rank))
        } else if !peer.shm {
            Err(format!("rank {} does not accept shared memory", peer.rank))
        } else {
            Ok(())
        }
    }
    fn listening(&self) -> bool {
        self.side.is_ok()
    }
    fn connect(&self, me: ConnectorId, peer: &PeerLink) -> Result<Box<dyn NetSend>> {
        match &self.side {
            Ok((shm, _)) => shm.connect(&ShmNet::peer_handle(self.magic, peer.rank, peer.pid), me),
            Err(why) => Err(Error::internal(format!("SHM cannot connect: {why}"))),
        }
    }
    fn accept(&mut self) -> Result<Option<(ConnectorId, Box<dyn NetRecv>)>> {
        match &mut self.side {
            Ok((_, l)) => l.accept(),
            Err(_) => Ok(None),
        }
    }
    fn accept_hint(&self) -> Option<WaitHint> {
        self.side.as_ref().ok().and_then(|(_, l)| l.wait_hint())
    }
    fn free(&mut self) {
        if self.side.is_ok() {
            self.side = Err("freed".into());
        }
    }
}

/// The network (sockets or IB; see `net_select`): connects any two ranks.
pub struct NetTransport {
    net: Arc<dyn Net>,
    listener: Option<Box<dyn NetListener>>,
}

impl NetTransport {
    /// Listens on `net`; the handle must reach every peer through the peer table.
    pub fn listen(net: Arc<dyn Net>, magic: u64) -> Result<(NetTransport, NetHandle)> {
        let (handle, listener) = net.listen(magic)?;
        Ok((NetTransport { net, listener: Some(listener) }, handle))
    }

    pub fn net_name(&self) -> &'static str {
        self.net.name()
    }
}

impl Transport for NetTransport {
    fn tier(&self) -> Tier {
        Tier::Net
    }
    fn check(&self, _me: &PeerLink, _peer: &PeerLink) -> std::result::Result<(), String> {
        Ok(())
    }
    fn listening(&self) -> bool {
        self.listener.is_some()
    }
    fn connect(&self, me: ConnectorId, peer: &PeerLink) -> Result<Box<dyn NetSend>> {
        self.net.connect(&peer.net_handle, me)
    }
    fn accept(&mut self) -> Result<Option<(ConnectorId, Box<dyn NetRecv>)>> {
        match &mut self.listener {
            Some(l) => l.accept(),
            None => Ok(None),
        }
    }
    fn accept_hint(&self) -> Option<WaitHint> {
        self.listener.as_ref().and_then(|l| l.wait_hint())
    }
    fn free(&mut self) {
        self.listener = None;
    }
}

/// The first of `tiers` (in order) that can connect `me` to `peer`, as an index into `tiers`,
/// with the reasons the earlier ones gave. `None` when none can.
pub fn choose(tiers: &[Box<dyn Transport>], me: &PeerLink, peer: &PeerLink) -> (Option<usize>, Vec<(Tier, String)>) {
    let mut refused = Vec::new();
    for (i, t) in tiers.iter().enumerate() {
        match t.check(me, peer) {
            Ok(()) => return (Some(i), refused),
            Err(why) => refused.push((t.tier(), why)),
        }
    }
    (None, refused)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A network that only listens (selection never connects).
    struct FakeNet;
    struct FakeListener;
    impl NetListener for FakeListener {
        fn accept(&mut self) -> Result<Option<(ConnectorId, Box<dyn NetRecv>)>> {
            Ok(None)
        }
        fn wait_hint(&self) -> Option<WaitHint> {
            None
        }
    }
    impl Net for FakeNet {
        fn name(&self) -> &'static str {
            "Fake"
        }
        fn describe(&self) -> String {
            "fake".into()
        }
        fn listen(&self, _magic: u64) -> Result<(NetHandle, Box<dyn NetListener>)> {
            Ok((vec![1, 2, 3], Box::new(FakeListener)))
        }
        fn connect(&self, _handle: &[u8], _me: ConnectorId) -> Result<Box<dyn NetSend>> {
            Err(Error::internal("fake"))
        }
    }

    fn peer(rank: usize, host_hash: u64, shm: bool) -> PeerLink {
        PeerLink { rank, net_handle: vec![], host_hash, pid: 1, shm }
    }

    fn tiers(policy: TierPolicy) -> Vec<Box<dyn Transport>> {
        // A distinct magic per call: each ShmTransport binds its own abstract socket name.
        static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0x7e57_0000);
        let magic = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let (net, _) = NetTransport::listen(Arc::new(FakeNet), magic).unwrap();
        vec![
            Box::new(P2pTransport::new(policy)),
            Box::new(ShmTransport::new(policy, magic, 0, Interrupt::new())),
            Box::new(net),
        ]
    }

    fn chosen(t: &[Box<dyn Transport>], me: &PeerLink, p: &PeerLink) -> Tier {
        t[choose(t, me, p).0.expect("the network always connects")].tier()
    }

    #[test]
    fn same_host_peers_use_shm_other_hosts_the_network() {
        let t = tiers(TierPolicy::default());
        let me = peer(0, 0xaa, true);
        assert!(t[1].listening());
        assert_eq!(chosen(&t, &me, &peer(1, 0xaa, true)), Tier::Shm);
        assert_eq!(chosen(&t, &me, &peer(2, 0xbb, true)), Tier::Net);
        // A same-host peer that does not listen for shared memory.
        assert_eq!(chosen(&t, &me, &peer(3, 0xaa, false)), Tier::Net);
        // P2P was asked first and said why not.
        let (_, refused) = choose(&t, &me, &peer(1, 0xaa, true));
        assert_eq!(refused.len(), 1);
        assert_eq!(refused[0].0, Tier::P2p);
        assert!(refused[0].1.contains("CUDA IPC"), "{}", refused[0].1);
        let (_, refused) = choose(&t, &me, &peer(2, 0xbb, true));
        assert!(refused[1].1.contains("another host"), "{refused:?}");
    }

    #[test]
    fn shm_disabled_or_strict_encryption_sends_same_host_peers_to_the_network() {
        for (policy, reason) in [
            (TierPolicy { shm_disabled: true, ..Default::default() }, "NCCL_SHM_DISABLE"),
            (TierPolicy { strict_encryption: true, ..Default::default() }, "strict encryption"),
        ] {
            let t = tiers(policy);
            assert!(!t[1].listening());
            let me = peer(0, 0xaa, false);
            let (i, refused) = choose(&t, &me, &peer(1, 0xaa, true));
            assert_eq!(t[i.unwrap()].tier(), Tier::Net);
            assert!(refused.iter().any(|(tier, why)| *tier == Tier::Shm && why.contains(reason)), "{refused:?}");
        }
    }

    #[test]
    fn p2p_never_connects_host_buffers_and_names_its_reason() {
        let me = peer(0, 0xaa, true);
        let p = peer(1, 0xaa, true);
        let on = P2pTransport::new(TierPolicy::default());
        assert!(!on.can_connect(&me, &p));
        assert!(on.connect(ConnectorId { comm_magic: 1, rank: 0, channel: 0 }, &p).is_err());
        let off = P2pTransport::new(TierPolicy { p2p_disabled: true, ..Default::default() });
        assert_eq!(off.check(&me, &p), Err("disabled by NCCL_P2P_DISABLE".to_string()));
    }

    #[test]
    fn freed_sides_no_longer_listen() {
        let mut t = tiers(TierPolicy::default());
        for side in t.iter_mut() {
            side.free();
            assert!(!side.listening());
            assert!(side.accept().unwrap().is_none());
        }
        // Self never goes over shared memory.
        let t = tiers(TierPolicy::default());
        let me = peer(0, 0xaa, true);
        assert_eq!(chosen(&t, &me, &me.clone()), Tier::Net);
    }
}
