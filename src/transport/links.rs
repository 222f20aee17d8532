//! One communicator's connections: a listener, and per peer a send and a receive connection,
//! made on first use (NCCL's runtime connect). Chooses the transport for each peer.

use std::sync::Arc;

use super::{ConnectorId, Net, NetHandle, NetListener, NetRecv, NetSend, WaitHint};
use crate::error::{Error, Result};

pub struct Links {
    rank: usize,
    magic: u64,
    net: Arc<dyn Net>,
    listener: Box<dyn NetListener>,
    handles: Vec<NetHandle>,
    send: Vec<Option<Box<dyn NetSend>>>,
    recv: Vec<Option<Box<dyn NetRecv>>>,
}

impl Links {
    /// Starts listening; `handle()` must then reach every peer (through the bootstrap) before
    /// [`Links::set_peer_handles`].
    pub fn listen(net: Arc<dyn Net>, rank: usize, nranks: usize, magic: u64) -> Result<(Links, NetHandle)> {
        let (handle, listener) = net.listen(magic)?;
        let links = Links {
            rank,
            magic,
            net,
            listener,
            handles: vec![Vec::new(); nranks],
            send: (0..nranks).map(|_| None).collect(),
            recv: (0..nranks).map(|_| None).collect(),
        };
        Ok((links, handle))
    }

    pub fn set_peer_handles(&mut self, handles: Vec<NetHandle>) {
        self.handles = handles;
    }

    pub fn nranks(&self) -> usize {
        self.send.len()
    }

    pub fn net_name(&self) -> &'static str {
        self.net.name()
    }

    /// The send connection to `peer`, connecting on first use.
    pub fn send_conn(&mut self, peer: usize) -> Result<&mut dyn NetSend> {
        if self.send[peer].is_none() {
            let me = ConnectorId { comm_magic: self.magic, rank: self.rank as u32, channel: 0 };
            let conn = self
                .net
                .connect(&self.handles[peer], me)
                .map_err(|e| e.context(&format!("connecting to rank {peer}")))?;
            log::info!(target: "P2P", "Channel 00/0 : {}[{}] -> {}[{}] [send] via {}", self.rank, self.rank, peer, peer, conn.via());
            self.send[peer] = Some(conn);
        }
        Ok(self.send[peer].as_deref_mut().expect("just set"))
    }

    /// The receive connection from `peer`, or `None` while it has not connected yet.
    pub fn recv_conn(&mut self, peer: usize) -> Result<Option<&mut dyn NetRecv>> {
        while self.recv[peer].is_none() {
            match self.listener.accept()? {
                Some((id, conn)) => {
                    let from = id.rank as usize;
                    if from >= self.recv.len() || self.recv[from].is_some() {
                        return Err(Error::remote(format!("unexpected data connection claiming to be rank {from}")));
                    }
                    log::info!(target: "P2P", "Channel 00/0 : {}[{}] -> {}[{}] [receive] via NET/{}/0", from, from, self.rank, self.rank, self.net.name());
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

    pub fn listener_hint(&self) -> Option<WaitHint> {
        self.listener.wait_hint()
    }

    /// Connections made so far, for the coverage report: (sends, receives).
    pub fn connection_counts(&self) -> (usize, usize) {
        (self.send.iter().flatten().count(), self.recv.iter().flatten().count())
    }

    /// Drops every connection (destroy/abort).
    pub fn close_all(&mut self) {
        self.send.iter_mut().for_each(|c| *c = None);
        self.recv.iter_mut().for_each(|c| *c = None);
    }
}
