//! The rendezvous root behind a unique id: collects every rank's bootstrap address, then sends
//! each rank the whole table. Runs on a detached thread of the process that made the id.

use std::net::{SocketAddr, TcpListener};
use std::time::Instant;

use crate::error::{Error, Result};
use crate::interrupt::Interrupt;
use crate::transport::socket::{self, ConnKind, Hello, Stream, ADDR_BYTES};
pub use crate::wire::{decode_table, encode_table, RankInfo};

/// Starts the root on `listener` for the communicator with `magic`.
pub fn spawn(listener: TcpListener, magic: u64) -> Result<()> {
    std::thread::Builder::new()
        .name("ferroccl-root".into())
        .spawn(move || {
            if let Err(e) = serve(&listener, magic) {
                log::warn!(target: "BOOTSTRAP", "bootstrap root {}: {e}", listener.local_addr().map(|a| a.to_string()).unwrap_or_default());
            }
        })
        .map_err(|e| Error::system("spawn bootstrap root thread", e))?;
    Ok(())
}

fn serve(listener: &TcpListener, magic: u64) -> Result<()> {
    let deadline = Instant::now() + crate::bootstrap::timeout();
    let mut nranks: Option<u32> = None;
    let mut ranks: Vec<Option<(Stream, SocketAddr)>> = Vec::new();
    let mut arrived = 0usize;
    let mut hellos = socket::HelloQueue::default();
    loop {
        // Strangers (garbage, silent or slow connections) are dropped by the queue.
        let (mut stream, hello) = hellos.next(listener, magic, deadline, None)?;
        stream.set_timeout(Some(std::time::Duration::from_secs(10)))?;
        // A bad peer (wrong kind, garbage after the hello) is dropped; the root keeps serving.
        let info = match Ok(hello).and_then(|h: Hello| {
            if h.kind != ConnKind::Root {
                return Err(Error::remote(format!("unexpected {:?} connection at the root", h.kind)));
            }
            RankInfo::decode(&stream.recv_msg(64, "root")?)
        }) {
            Ok(info) => info,
            Err(e) => {
                log::info!(target: "BOOTSTRAP", "bootstrap root: dropped connection from {}: {e}", stream.peer());
                continue;
            }
        };
        stream.attribute(magic, crate::tls::Owner::Root, crate::tls::Channel::Bootstrap);
        let n = *nranks.get_or_insert(info.nranks);
        if ranks.is_empty() {
            ranks.resize_with(n as usize, || None);
        }
        if info.nranks != n || info.rank >= n || ranks[info.rank as usize].is_some() {
            let reason = if info.nranks != n {
                format!("rank {} says nranks {}, others said {n}", info.rank, info.nranks)
            } else {
                format!("rank {} out of range or duplicated (nranks {n})", info.rank)
            };
            let _ = stream.send_msg(reason.as_bytes(), "root");
            log::warn!(target: "BOOTSTRAP", "bootstrap root: {reason}");
            continue;
        }
        ranks[info.rank as usize] = Some((stream, info.addr));
        arrived += 1;
        if arrived == n as usize {
            break;
        }
    }
    let addrs: Vec<SocketAddr> = ranks.iter().map(|r| r.as_ref().expect("all arrived").1).collect();
    let table = encode_table(&addrs);
    for (stream, _) in ranks.iter_mut().flatten() {
        stream.send_msg(&table, "root reply")?;
    }
    log::info!(target: "BOOTSTRAP", "bootstrap root: {} ranks connected", addrs.len());
    Ok(())
}

/// Rank side: registers with the root and returns every rank's bootstrap address.
pub fn rendezvous(
    root: SocketAddr,
    magic: u64,
    rank: usize,
    nranks: usize,
    mine: SocketAddr,
    deadline: Instant,
    interrupt: Option<&Interrupt>,
) -> Result<Vec<SocketAddr>> {
    let mut s = socket::connect(root, deadline).map_err(|e| e.context("contacting the bootstrap root"))?;
    s.set_timeout(Some(deadline.saturating_duration_since(Instant::now()).max(std::time::Duration::from_millis(1))))?;
    s.send_hello(&Hello { magic, kind: ConnKind::Root, rank: rank as u32, extra: 0 })?;
    s.send_msg(&RankInfo { rank: rank as u32, nranks: nranks as u32, addr: mine }.encode(), "root")?;
    let what = "waiting for all ranks at the bootstrap root";
    // The reply comes once every rank has registered: that wait polls the abort flag.
    s.await_input(interrupt, deadline, what)?;
    let reply = s.recv_msg(nranks * ADDR_BYTES, what)?;
    if reply.len() != nranks * ADDR_BYTES {
        return Err(Error::invalid_argument(format!(
            "bootstrap root refused rank {rank}: {}",
            String::from_utf8_lossy(&reply)
        )));
    }
    decode_table(&reply, nranks)
}
