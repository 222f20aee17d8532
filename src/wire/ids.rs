//! The 128-byte unique id, and the messages between ranks and the rendezvous root.
//!
//! Unique id layout: magic (u64 LE), the root's address ([`super::addr`], 28 bytes), the tag
//! "Fer1" (u32 LE; ids of other libraries are refused), 88 zero bytes. A rank tells the root
//! [`RankInfo`]: rank (u32 LE), nranks (u32 LE), its bootstrap address (28 bytes); the root
//! answers with every rank's address in rank order ([`encode_table`]).

use std::net::SocketAddr;

use super::addr::{addr_bytes, decode_addr, ADDR_BYTES};
use super::Reader;
use crate::error::{Error, Result};
use crate::types::NCCL_UNIQUE_ID_BYTES;

const ID_VERSION_TAG: u32 = 0x4665_7231; // "Fer1": lets us reject ids from other libraries

/// What `ncclGetUniqueId` hands out: where the root listens, and the communicator's magic
/// (connections with another magic are dropped).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct UniqueId {
    pub magic: u64,
    pub root: SocketAddr,
}

impl UniqueId {
    pub fn encode(&self) -> [u8; NCCL_UNIQUE_ID_BYTES] {
        let mut b = [0u8; NCCL_UNIQUE_ID_BYTES];
        b[0..8].copy_from_slice(&self.magic.to_le_bytes());
        b[8..8 + ADDR_BYTES].copy_from_slice(&addr_bytes(&self.root));
        b[36..40].copy_from_slice(&ID_VERSION_TAG.to_le_bytes());
        b
    }

    /// Parses an id; anything `encode` cannot have produced is an invalid argument (the
    /// user passes ids in).
    pub fn decode(b: &[u8]) -> Result<UniqueId> {
        Self::parse(b).map_err(|e| {
            Error::invalid_argument(format!(
                "unique id was not produced by ferroccl's ncclGetUniqueId (or is corrupted): {e}"
            ))
        })
    }

    fn parse(b: &[u8]) -> Result<UniqueId> {
        let mut r = Reader::exact(b, NCCL_UNIQUE_ID_BYTES, "unique id")?;
        let magic = r.u64_le()?;
        let root = r.slice(ADDR_BYTES)?;
        if r.u32_le()? != ID_VERSION_TAG {
            return Err(Error::remote("unknown version tag"));
        }
        r.zeros(NCCL_UNIQUE_ID_BYTES - 40)?;
        r.finish()?;
        Ok(UniqueId { magic, root: decode_addr(root)? })
    }

    /// A short hash for log lines (NCCL prints `commId 0x...`).
    pub fn hash(&self) -> u64 {
        crate::hash::fnv1a64(&self.encode())
    }
}

/// What a rank tells the root.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RankInfo {
    pub rank: u32,
    pub nranks: u32,
    pub addr: SocketAddr,
}

pub const RANK_INFO_BYTES: usize = 8 + ADDR_BYTES;

impl RankInfo {
    pub fn encode(&self) -> Vec<u8> {
        let mut b = Vec::with_capacity(RANK_INFO_BYTES);
        b.extend_from_slice(&self.rank.to_le_bytes());
        b.extend_from_slice(&self.nranks.to_le_bytes());
        b.extend_from_slice(&addr_bytes(&self.addr));
        b
    }

    pub fn decode(b: &[u8]) -> Result<RankInfo> {
        let mut r = Reader::exact(b, RANK_INFO_BYTES, "root: rank info")?;
        let (rank, nranks) = (r.u32_le()?, r.u32_le()?);
        let addr = decode_addr(r.slice(ADDR_BYTES)?)?;
        r.finish()?;
        Ok(RankInfo { rank, nranks, addr })
    }
}

/// The root's answer: every rank's address, in rank order.
pub fn encode_table(addrs: &[SocketAddr]) -> Vec<u8> {
    addrs.iter().flat_map(addr_bytes).collect()
}

/// Decodes [`encode_table`] for `nranks` ranks.
pub fn decode_table(b: &[u8], nranks: usize) -> Result<Vec<SocketAddr>> {
    let len = nranks.checked_mul(ADDR_BYTES).ok_or_else(|| Error::remote("bootstrap: too many ranks"))?;
    if b.len() != len {
        return Err(Error::remote("bootstrap: malformed address table from root"));
    }
    b.chunks_exact(ADDR_BYTES).map(decode_addr).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unique_id_round_trip_and_rejects_garbage() {
        let id = UniqueId { magic: 0xdead_beef_cafe_f00d, root: "10.0.0.1:4242".parse().unwrap() };
        let b = id.encode();
        assert_eq!(UniqueId::decode(&b).unwrap(), id);
        assert!(UniqueId::decode(&[0u8; 128]).is_err());
        assert!(UniqueId::decode(&b[..127]).is_err(), "truncated");
        assert!(UniqueId::decode(&[b.as_slice(), &[0]].concat()).is_err(), "oversized");
        let mut bad = b;
        bad[100] = 1;
        let e = UniqueId::decode(&bad).unwrap_err();
        assert_eq!(e.code(), crate::types::ncclResult_t::ncclInvalidArgument);
        assert_ne!(id.hash(), UniqueId { magic: 1, ..id }.hash());
    }

    #[test]
    fn rank_info_and_table_round_trip_truncated_oversized() {
        let info = RankInfo { rank: 2, nranks: 3, addr: "[::1]:80".parse().unwrap() };
        let b = info.encode();
        assert_eq!(RankInfo::decode(&b).unwrap(), info);
        assert!(RankInfo::decode(&b[..b.len() - 1]).is_err());
        assert!(RankInfo::decode(&[b.as_slice(), &[0]].concat()).is_err());

        let addrs: Vec<SocketAddr> = vec!["1.2.3.4:5".parse().unwrap(), "[::2]:6".parse().unwrap()];
        let t = encode_table(&addrs);
        assert_eq!(decode_table(&t, 2).unwrap(), addrs);
        assert!(decode_table(&t[..t.len() - 1], 2).is_err());
        assert!(decode_table(&t, 1).is_err());
        assert!(decode_table(&t, 3).is_err());
        assert!(decode_table(&[], usize::MAX).is_err());
    }
}
