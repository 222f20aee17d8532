//! What the InfiniBand transport's two sides tell each other: the connection info exchanged
//! once over the setup socket ([`IbConnInfo`]), and the clear-to-send entries a receiver
//! RDMA-writes into its sender's FIFO ([`CtsEntry`]). Both come from a peer, so both decoders
//! check the length first and accept only canonical encodings.
//!
//! IbConnInfo layout ([`IB_CONN_INFO_BYTES`] = 56, little-endian): [`IB_CONN_MAGIC`] (u32),
//! role (u8: 1 sender, 2 receiver), link layer (u8: 1 InfiniBand, 2 Ethernet/RoCE), port (u8,
//! nonzero), path MTU (u8, verbs' `ibv_mtu`: 1..=5), QP number (u32, 24 bits), packet
//! sequence number (u32, 24 bits), LID (u16), 2 zero bytes, GID (16 bytes), FIFO address
//! (u64), FIFO rkey (u32), FIFO slots (u32, 1..=[`MAX_FIFO_SLOTS`]), 4 zero bytes. A receiver
//! sends FIFO address and rkey 0 (only the sender has a FIFO).
//!
//! CtsEntry layout ([`CTS_BYTES`] = 32): destination address (u64), size (u64), rkey (u32),
//! 4 zero bytes, sequence number (u64, counting from 1; 0 is an empty slot). The sequence
//! number is last so that a sender which sees it has the rest of the entry (an RDMA write
//! lands in address order on the HCAs NCCL supports; the sender also re-checks the slot).

use super::Reader;
use crate::error::{Error, Result};

pub const IB_CONN_MAGIC: u32 = 0x3142_4946; // "FIB1"
pub const IB_CONN_INFO_BYTES: usize = 56;
pub const CTS_BYTES: usize = 32;
/// Most CTS FIFO slots a connection may announce.
pub const MAX_FIFO_SLOTS: u32 = 256;

/// Which side of a connection a record describes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum IbRole {
    Sender = 1,
    Receiver = 2,
}

/// The link under a port: native InfiniBand (addressed by LID) or Ethernet (RoCE, by GID).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LinkLayer {
    InfiniBand = 1,
    Ethernet = 2,
}

impl LinkLayer {
    /// As NCCL's log lines name it.
    pub fn name(self) -> &'static str {
        match self {
            LinkLayer::InfiniBand => "IB",
            LinkLayer::Ethernet => "RoCE",
        }
    }
}

/// One side's queue pair and FIFO, as the other side needs them to connect.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct IbConnInfo {
    pub role: IbRole,
    pub link_layer: LinkLayer,
    pub port: u8,
    /// `ibv_mtu` value (1 = 256 bytes ... 5 = 4096 bytes).
    pub mtu: u8,
    pub qpn: u32,
    pub psn: u32,
    pub lid: u16,
    pub gid: [u8; 16],
    pub fifo_addr: u64,
    pub fifo_rkey: u32,
    pub fifo_slots: u32,
}

impl IbConnInfo {
    pub fn encode(&self) -> [u8; IB_CONN_INFO_BYTES] {
        let mut b = [0u8; IB_CONN_INFO_BYTES];
        b[0..4].copy_from_slice(&IB_CONN_MAGIC.to_le_bytes());
        b[4] = self.role as u8;
        b[5] = self.link_layer as u8;
        b[6] = self.port;
        b[7] = self.mtu;
        b[8..12].copy_from_slice(&self.qpn.to_le_bytes());
        b[12..16].copy_from_slice(&self.psn.to_le_bytes());
        b[16..18].copy_from_slice(&self.lid.to_le_bytes());
        b[20..36].copy_from_slice(&self.gid);
        b[36..44].copy_from_slice(&self.fifo_addr.to_le_bytes());
        b[44..48].copy_from_slice(&self.fifo_rkey.to_le_bytes());
        b[48..52].copy_from_slice(&self.fifo_slots.to_le_bytes());
        b
    }

    pub fn decode(b: &[u8]) -> Result<IbConnInfo> {
        const WHAT: &str = "IB connection info";
        let bad = |m: String| Error::remote(format!("{WHAT}: {m}"));
        let mut r = Reader::exact(b, IB_CONN_INFO_BYTES, WHAT)?;
        let magic = r.u32_le()?;
        if magic != IB_CONN_MAGIC {
            return Err(bad(format!("bad magic {magic:#x}")));
        }
        let role = match r.u8()? {
            1 => IbRole::Sender,
            2 => IbRole::Receiver,
            v => return Err(bad(format!("role {v}"))),
        };
        let link_layer = match r.u8()? {
            1 => LinkLayer::InfiniBand,
            2 => LinkLayer::Ethernet,
            v => return Err(bad(format!("link layer {v}"))),
        };
        let port = r.u8()?;
        if port == 0 {
            return Err(bad("port 0".into()));
        }
        let mtu = r.u8()?;
        if !(1..=5).contains(&mtu) {
            return Err(bad(format!("MTU code {mtu}")));
        }
        let qpn = r.u32_le()?;
        let psn = r.u32_le()?;
        if qpn >= 1 << 24 || psn >= 1 << 24 {
            return Err(bad(format!("QP number {qpn:#x} or PSN {psn:#x} wider than 24 bits")));
        }
        let lid = r.u16_le()?;
        r.zeros(2)?;
        let gid = r.bytes::<16>()?;
        let fifo_addr = r.u64_le()?;
        let fifo_rkey = r.u32_le()?;
        let fifo_slots = r.u32_le()?;
        if fifo_slots == 0 || fifo_slots > MAX_FIFO_SLOTS {
            return Err(bad(format!("{fifo_slots} FIFO slots")));
        }
        if role == IbRole::Receiver && (fifo_addr != 0 || fifo_rkey != 0) {
            return Err(bad("a receiver announced a FIFO".into()));
        }
        r.zeros(4)?;
        r.finish()?;
        Ok(IbConnInfo { role, link_layer, port, mtu, qpn, psn, lid, gid, fifo_addr, fifo_rkey, fifo_slots })
    }
}

/// A receiver's clear-to-send: "message `seq` may be written to `addr` (`size` bytes, `rkey`)".
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CtsEntry {
    pub addr: u64,
    pub size: u64,
    pub rkey: u32,
    /// Message number, from 1; 0 marks a slot never written.
    pub seq: u64,
}

impl CtsEntry {
    pub fn encode(&self) -> [u8; CTS_BYTES] {
        let mut b = [0u8; CTS_BYTES];
        b[0..8].copy_from_slice(&self.addr.to_le_bytes());
        b[8..16].copy_from_slice(&self.size.to_le_bytes());
        b[16..20].copy_from_slice(&self.rkey.to_le_bytes());
        b[24..32].copy_from_slice(&self.seq.to_le_bytes());
        b
    }

    pub fn decode(b: &[u8]) -> Result<CtsEntry> {
        let mut r = Reader::exact(b, CTS_BYTES, "IB clear-to-send entry")?;
        let (addr, size, rkey) = (r.u64_le()?, r.u64_le()?, r.u32_le()?);
        r.zeros(4)?;
        let seq = r.u64_le()?;
        r.finish()?;
        Ok(CtsEntry { addr, size, rkey, seq })
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    pub(crate) fn sample(role: IbRole) -> IbConnInfo {
        let sender = role == IbRole::Sender;
        IbConnInfo {
            role,
            link_layer: LinkLayer::Ethernet,
            port: 1,
            mtu: 5,
            qpn: 0x00ab_cdef,
            psn: 0x0012_3456,
            lid: 7,
            gid: [0xfe, 0x80, 0, 0, 0, 0, 0, 0, 1, 2, 3, 4, 5, 6, 7, 8],
            fifo_addr: if sender { 0x7f00_1234_5000 } else { 0 },
            fifo_rkey: if sender { 0x1234 } else { 0 },
            fifo_slots: 32,
        }
    }

    #[test]
    fn conn_info_round_trip_truncated_oversized() {
        for role in [IbRole::Sender, IbRole::Receiver] {
            let c = sample(role);
            let b = c.encode();
            assert_eq!(IbConnInfo::decode(&b).unwrap(), c);
            assert!(IbConnInfo::decode(&b[..IB_CONN_INFO_BYTES - 1]).is_err());
            assert!(IbConnInfo::decode(&[b.as_slice(), &[0]].concat()).is_err());
            assert!(IbConnInfo::decode(&[]).is_err());
        }
    }

    #[test]
    fn conn_info_rejects_each_bad_field() {
        let good = sample(IbRole::Sender).encode();
        let cases: &[(usize, u8, &str)] = &[
            (0, 0x47, "magic"),
            (4, 3, "role"),
            (5, 0, "link layer"),
            (6, 0, "port"),
            (7, 0, "MTU code"),
            (7, 6, "MTU code"),
            (11, 1, "24 bits"),
            (15, 1, "24 bits"),
            (18, 1, "padding"),
            (48, 0, "FIFO slots"),
            (52, 9, "padding"),
        ];
        for &(at, v, what) in cases {
            let mut b = good;
            b[at] = v;
            if at == 48 {
                b[49..52].fill(0);
            }
            let e = IbConnInfo::decode(&b).expect_err(what);
            assert!(e.to_string().contains(what), "byte {at}: {e}");
        }
        let mut b = good;
        b[48..52].copy_from_slice(&(MAX_FIFO_SLOTS + 1).to_le_bytes());
        assert!(IbConnInfo::decode(&b).is_err(), "too many slots");
        let mut b = sample(IbRole::Receiver).encode();
        b[44] = 1;
        assert!(IbConnInfo::decode(&b).unwrap_err().to_string().contains("receiver announced a FIFO"));
    }

    /// The fuzz corpus (fuzz/corpus/ib_conn) starts from valid records of both kinds.
    #[test]
    fn fuzz_corpus_holds_valid_samples() {
        let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/fuzz/corpus/ib_conn");
        let (mut conns, mut cts) = (0, 0);
        for entry in std::fs::read_dir(dir).expect("fuzz/corpus/ib_conn") {
            let b = std::fs::read(entry.unwrap().path()).unwrap();
            conns += IbConnInfo::decode(&b).is_ok() as usize;
            cts += CtsEntry::decode(&b).is_ok() as usize;
        }
        assert!(conns >= 4 && cts >= 3, "{conns} connection infos, {cts} CTS entries");
    }

    #[test]
    fn cts_round_trip_and_padding() {
        let e = CtsEntry { addr: u64::MAX - 5, size: 1 << 33, rkey: 0xdead_beef, seq: 77 };
        let b = e.encode();
        assert_eq!(CtsEntry::decode(&b).unwrap(), e);
        assert_eq!(CtsEntry::decode(&[0; CTS_BYTES]).unwrap().seq, 0, "an empty slot decodes as seq 0");
        let mut bad = b;
        bad[21] = 1;
        assert!(CtsEntry::decode(&bad).is_err());
        assert!(CtsEntry::decode(&b[..31]).is_err());
        assert!(CtsEntry::decode(&[b.as_slice(), &[0]].concat()).is_err());
    }
}
