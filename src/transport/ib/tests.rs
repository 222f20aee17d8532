//! The IB network end to end over the in-memory fabric: setup over real sockets, connection
//! info, the flow state machines, registrations, peer closure.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};

use super::sim::{Regions, Sim, SimEnd, FIFO_BASE, FIFO_RKEY};
use super::*;
use crate::error::ncclResult_t;
use crate::wire::LinkLayer;

/// Queue pairs are [`Sim`]s found by the sender's QP number; registrations go to one table.
#[derive(Default)]
struct SimFabric {
    sims: Mutex<HashMap<u32, Sim>>,
    regions: Regions,
    next: AtomicU32,
    live: Mutex<usize>,
}

struct SimQp(Option<SimEnd>);

impl SimQp {
    fn end(&mut self) -> Result<&mut SimEnd> {
        self.0.as_mut().ok_or_else(|| Error::internal("sim QP not connected"))
    }
}

impl Rdma for SimQp {
    fn post_write(&mut self, wr_id: u64, src: WriteSource<'_>, dst: RemoteSeg, imm: Option<u32>) -> Result<()> {
        self.end()?.post_write(wr_id, src, dst, imm)
    }
    fn post_recv(&mut self, wr_id: u64) -> Result<()> {
        self.end()?.post_recv(wr_id)
    }
    fn poll(&mut self, out: &mut Vec<Completion>) -> Result<()> {
        self.end()?.poll(out)
    }
    fn fifo_slot(&self, slot: usize) -> [u8; CTS_BYTES] {
        self.0.as_ref().map(|e| e.fifo_slot(slot)).unwrap_or([0; CTS_BYTES])
    }
    fn peer_closed(&mut self) -> bool {
        false // the setup socket tells
    }
}

impl Fabric for SimFabric {
    type Qp = SimQp;
    fn create(&self, role: IbRole) -> Result<(SimQp, IbConnInfo)> {
        let qpn = self.next.fetch_add(1, Ordering::Relaxed) + 1;
        let sender = role == IbRole::Sender;
        let qp = if sender {
            let sim = Sim::with_regions(SQ_DEPTH, FIFO_SLOTS, FIFO_SLOTS, self.regions.clone());
            let end = sim.end(0);
            self.sims.lock().unwrap().insert(qpn, sim);
            SimQp(Some(end))
        } else {
            SimQp(None)
        };
        let info = IbConnInfo {
            role,
            link_layer: LinkLayer::InfiniBand,
            port: 1,
            mtu: 5,
            qpn,
            psn: 0,
            lid: 1,
            gid: [0; 16],
            fifo_addr: if sender { FIFO_BASE } else { 0 },
            fifo_rkey: if sender { FIFO_RKEY } else { 0 },
            fifo_slots: FIFO_SLOTS as u32,
        };
        Ok((qp, info))
    }
    fn connect(&self, qp: &mut SimQp, remote: &IbConnInfo) -> Result<()> {
        if qp.0.is_none() {
            let sims = self.sims.lock().unwrap();
            let sim = sims.get(&remote.qpn).ok_or_else(|| Error::remote("sim: no such QP"))?;
            qp.0 = Some(sim.end(1));
        }
        Ok(())
    }
    fn acquire(&self, region: MemRegion, access: Access) -> Result<RegRef> {
        let key = self.next.fetch_add(1, Ordering::Relaxed) + 0x1000;
        if access == Access::RemoteWrite {
            self.regions.lock().unwrap().insert(key, (region.ptr() as u64, region.len()));
        }
        *self.live.lock().unwrap() += 1;
        Ok(RegRef::for_tests(key as u64, mr::Keys { lkey: key, rkey: key }))
    }
    fn release(&self, r: RegRef) {
        self.regions.lock().unwrap().remove(&r.keys.rkey);
        *self.live.lock().unwrap() -= 1;
    }
    fn label(&self) -> String {
        "sim_0:1/IB".into()
    }
}

fn net() -> (IbNet<SimFabric>, Arc<SimFabric>) {
    let fabric = Arc::new(SimFabric::default());
    (IbNet::new(fabric.clone(), crate::transport::netif::pick().unwrap()), fabric)
}

fn accept(l: &mut Box<dyn NetListener>) -> (ConnectorId, Box<dyn NetRecv>) {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        if let Some(a) = l.accept().unwrap() {
            return a;
        }
        assert!(Instant::now() < deadline, "never accepted");
        std::thread::sleep(Duration::from_millis(1));
    }
}

fn region(b: &mut [u8]) -> MemRegion {
    // SAFETY: every test keeps its buffers alive and untouched until its requests complete.
    unsafe { MemRegion::new(b.as_mut_ptr(), b.len()) }
}

#[test]
fn messages_cross_an_ib_connection_set_up_over_sockets() {
    let (net, fabric) = net();
    assert_eq!(net.name(), "IB");
    assert!(net.describe().starts_with("[0]sim_0:1/IB ; OOB "), "{}", net.describe());
    let magic = 0x1b1b_0000_0000_0001;
    let (handle, mut listener) = net.listen(magic).unwrap();
    let me = ConnectorId { comm_magic: magic, rank: 3, channel: 1 };
    let mut send = net.connect(&handle, me).unwrap();
    assert_eq!(send.via(), "NET/IB/0");
    let (id, mut recv) = accept(&mut listener);
    assert_eq!(id, me);
    // The setup connection is in the coverage registry as the IB channel, on both sides.
    let conns = tls::connections(magic);
    assert!(
        conns.iter().any(|(o, c, _, n)| *o == tls::Owner::Rank(3) && *c == tls::Channel::NetIb && n.live == 1),
        "{conns:?}"
    );
    assert!(conns.iter().any(|(o, c, _, n)| *o == tls::Owner::Listener && *c == tls::Channel::NetIb && n.live == 1));
    let n = 3 * FIFO_SLOTS;
    let mut sends: Vec<Vec<u8>> = (0..n).map(|i| (0..1000 + i).map(|j| (i * 7 + j) as u8).collect()).collect();
    let mut bufs: Vec<Vec<u8>> = (0..n).map(|i| vec![0u8; 1000 + i]).collect();
    let (mut si, mut ri, mut sdone, mut rdone) = (0, 0, 0, 0);
    let (mut sreqs, mut rreqs) = (std::collections::VecDeque::new(), std::collections::VecDeque::new());
    let deadline = Instant::now() + Duration::from_secs(20);
    while sdone < n || rdone < n {
        assert!(Instant::now() < deadline, "stalled at {sdone}/{rdone}");
        if si < n {
            if let Some(r) = send.isend(region(&mut sends[si]), OpSig::NONE).unwrap() {
                sreqs.push_back(r);
                si += 1;
            }
        }
        if ri < n {
            if let Some(r) = recv.irecv(region(&mut bufs[ri]), OpSig::NONE).unwrap() {
                rreqs.push_back(r);
                ri += 1;
            }
        }
        if let Some(&r) = sreqs.front() {
            if send.test(r).unwrap().is_some() {
                sreqs.pop_front();
                sdone += 1;
            }
        }
        if let Some(&r) = rreqs.front() {
            if let Some(len) = recv.test(r).unwrap() {
                assert_eq!(len, 1000 + rdone);
                rreqs.pop_front();
                rdone += 1;
            }
        }
    }
    assert_eq!(bufs, sends);
    assert_eq!(*fabric.live.lock().unwrap(), 0, "every registration was released");
    assert!(send.progress_mark() > 0 && recv.progress_mark() > 0);
}

#[test]
fn a_closed_sender_fails_the_receivers_outstanding_request() {
    let (net, fabric) = net();
    let magic = 0x1b1b_0000_0000_0002;
    let (handle, mut listener) = net.listen(magic).unwrap();
    let send = net.connect(&handle, ConnectorId { comm_magic: magic, rank: 0, channel: 0 }).unwrap();
    let (_, mut recv) = accept(&mut listener);
    let mut buf = vec![0u8; 64];
    let r = recv.irecv(region(&mut buf), OpSig::NONE).unwrap().unwrap();
    assert_eq!(recv.test(r).unwrap(), None);
    drop(send);
    let deadline = Instant::now() + Duration::from_secs(10);
    let e = loop {
        match recv.test(r) {
            Ok(None) => assert!(Instant::now() < deadline, "the closure was never noticed"),
            Ok(Some(_)) => panic!("nothing was sent"),
            Err(e) => break e,
        }
        std::thread::sleep(Duration::from_millis(5));
    };
    assert_eq!(e.code(), ncclResult_t::ncclRemoteError);
    assert!(e.to_string().contains("closed by the peer") && e.to_string().contains("rank 0"), "{e}");
    drop(recv);
    assert_eq!(*fabric.live.lock().unwrap(), 0, "dropping releases outstanding registrations");
}

#[test]
fn the_listener_drops_bad_setup_connections_and_goes_on() {
    let (net, _) = net();
    let magic = 0x1b1b_0000_0000_0003;
    let (handle, mut listener) = net.listen(magic).unwrap();
    let addr = decode_addr(&handle).unwrap();
    // A socket-transport hello, then garbage connection info, then a wrong magic.
    for hello in [
        Hello { magic, kind: ConnKind::Data, rank: 0, extra: 0 },
        Hello { magic, kind: ConnKind::IbSetup, rank: 0, extra: 0 },
        Hello { magic: magic + 1, kind: ConnKind::IbSetup, rank: 0, extra: 0 },
    ] {
        let mut s = socket::connect(addr, Instant::now() + Duration::from_secs(5)).unwrap();
        s.send_hello(&hello).unwrap();
        let _ = s.send_msg(&[0xff; IB_CONN_INFO_BYTES], "garbage");
        // The listener closes it without an answer.
        let mut b = [0u8; 1];
        s.set_timeout(Some(Duration::from_secs(10))).unwrap();
        assert!(s.read_exact_or(&mut b, "answer").is_err());
    }
    assert!(listener.accept().unwrap().is_none());
    // A real connection still works.
    let _send = net.connect(&handle, ConnectorId { comm_magic: magic, rank: 1, channel: 0 }).unwrap();
    let (id, _) = accept(&mut listener);
    assert_eq!(id.rank, 1);
}

#[test]
fn a_silent_client_does_not_hold_up_other_setups() {
    let (net, _) = net();
    let magic = 0x1b1b_0000_0000_0005;
    let (handle, mut listener) = net.listen(magic).unwrap();
    let addr = decode_addr(&handle).unwrap();
    // Connects and never says anything (its setup waits for the setup timeout, 120 s).
    let _silent: Vec<std::net::TcpStream> = (0..3).map(|_| std::net::TcpStream::connect(addr).unwrap()).collect();
    std::thread::sleep(Duration::from_millis(100));
    let started = Instant::now();
    let _send = net.connect(&handle, ConnectorId { comm_magic: magic, rank: 2, channel: 0 }).unwrap();
    let (id, _) = accept(&mut listener);
    assert_eq!(id.rank, 2);
    assert!(started.elapsed() < Duration::from_secs(10), "took {:?}", started.elapsed());
}

#[test]
fn size_mismatch_over_the_network_fails_both_halves() {
    let (net, _) = net();
    let magic = 0x1b1b_0000_0000_0004;
    let (handle, mut listener) = net.listen(magic).unwrap();
    let mut send = net.connect(&handle, ConnectorId { comm_magic: magic, rank: 0, channel: 0 }).unwrap();
    let (_, mut recv) = accept(&mut listener);
    let mut data = vec![1u8; 100];
    let mut buf = vec![0u8; 50];
    let s = send.isend(region(&mut data), OpSig::NONE).unwrap().unwrap();
    let r = recv.irecv(region(&mut buf), OpSig::NONE).unwrap().unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    let (mut es, mut er) = (None, None);
    while es.is_none() || er.is_none() {
        assert!(Instant::now() < deadline);
        if es.is_none() {
            es = send.test(s).err();
        }
        if er.is_none() {
            er = recv.test(r).err();
        }
    }
    for e in [es.unwrap(), er.unwrap()] {
        assert_eq!(e.code(), ncclResult_t::ncclInvalidUsage, "{e}");
        assert!(e.to_string().contains("message size mismatch"), "{e}");
    }
}

/// Under a pre-shared key every setup connection is TLS and is recorded as such, a plaintext
/// client is dropped, and data still moves. The key is process-wide, so this runs in a child
/// process (this test binary again, with [`TLS_CHILD`] set).
#[cfg(feature = "openssl3")]
#[test]
fn setup_runs_over_tls_under_a_psk() {
    const NAME: &str = "transport::ib::tests::setup_runs_over_tls_under_a_psk";
    if std::env::var_os(TLS_CHILD).is_some() {
        return tls_child();
    }
    let out = std::process::Command::new(std::env::current_exe().unwrap())
        .args(["--exact", NAME, "--nocapture", "--test-threads=1"])
        .env(TLS_CHILD, "1")
        .output()
        .unwrap();
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "{text}");
    assert!(text.contains("IB-TLS OK"), "the child did not run the scenario:\n{text}");
}

#[cfg(feature = "openssl3")]
const TLS_CHILD: &str = "FERROCCL_IB_TLS_CHILD";

#[cfg(feature = "openssl3")]
fn tls_child() {
    use std::io::{Read, Write};
    crate::encryption::set(Some(b"ib-unit-test-psk-0123456789abcdef-0123".to_vec())).unwrap();
    let (net, fabric) = net();
    let magic = 0x1b1b_0000_0000_0077;
    let (handle, mut listener) = net.listen(magic).unwrap();
    let addr = decode_addr(&handle).unwrap();
    // A plaintext client speaking the protocol is dropped (its TLS handshake never happens).
    let mut plain = std::net::TcpStream::connect(addr).unwrap();
    plain.write_all(&Hello { magic, kind: ConnKind::IbSetup, rank: 9, extra: 0 }.encode()).unwrap();
    plain.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    let mut b = [0u8; 64];
    let answered = plain.read(&mut b).unwrap_or(0);
    assert!(answered == 0 || b[0] == 0x15, "a plaintext client got an answer other than an alert");
    let mut send = net.connect(&handle, ConnectorId { comm_magic: magic, rank: 4, channel: 0 }).unwrap();
    let (id, mut recv) = accept(&mut listener);
    assert_eq!(id.rank, 4, "the plaintext client was not accepted");
    let conns = tls::connections(magic);
    for owner in [tls::Owner::Rank(4), tls::Owner::Listener] {
        assert!(
            conns
                .iter()
                .any(|(o, c, s, n)| *o == owner && *c == tls::Channel::NetIb && s.is_encrypted() && n.live == 1),
            "{owner:?}: {conns:?}"
        );
    }
    assert!(conns.iter().all(|(_, _, s, _)| s.is_encrypted()), "{conns:?}");
    let mut data = (0..5000u32).map(|i| i as u8).collect::<Vec<u8>>();
    let mut buf = vec![0u8; 5000];
    let s = send.isend(region(&mut data), OpSig::NONE).unwrap().unwrap();
    let r = recv.irecv(region(&mut buf), OpSig::NONE).unwrap().unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    let (mut sent, mut got) = (false, false);
    while !(sent && got) {
        assert!(Instant::now() < deadline, "stalled");
        sent = sent || send.test(s).unwrap().is_some();
        got = got || recv.test(r).unwrap().is_some();
    }
    assert_eq!(buf, data);
    drop((send, recv));
    assert_eq!(*fabric.live.lock().unwrap(), 0);
    println!("IB-TLS OK");
}
