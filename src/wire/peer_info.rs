//! What every rank tells every other at init ([`PeerInfo`]), and at split ([`SplitEntry`]).
//!
//! PeerInfo layout ([`PEER_INFO_BYTES`] = 232): rank (u64 LE), host hash (u64 LE), pid (u32
//! LE), CUDA device (i32 LE), net handle length (u8, at most [`MAX_NET_HANDLE`]), shm flag
//! (u8, 0 or 1), reach count (u8, at most [`MAX_REACH`]), 5 zero bytes, the net handle padded
//! with zeros to 64 bytes, the GPU's PCI location (u64 LE, 0 for none), then the reach list
//! (u64 LE each) padded with zeros to [`MAX_REACH`] entries.

use super::Reader;
use crate::cuda::driver::{GpuIdentity, MAX_REACH};
use crate::error::{Error, Result};

/// What every rank learns about every other at init.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PeerInfo {
    pub rank: usize,
    pub host_hash: u64,
    pub pid: u32,
    pub cuda_dev: i32,
    pub net_handle: Vec<u8>,
    /// Accepts shared-memory connections.
    pub shm: bool,
    /// The rank's GPU as every process can recognise it (not by ordinal).
    pub gpu: GpuIdentity,
}

/// Longest net handle a [`PeerInfo`] carries.
pub const MAX_NET_HANDLE: usize = 64;
pub const PEER_INFO_BYTES: usize = 32 + MAX_NET_HANDLE + 8 + 8 * MAX_REACH;

impl PeerInfo {
    /// The fixed-size record; a handle longer than [`MAX_NET_HANDLE`] is an internal error.
    pub fn encode(&self) -> Result<Vec<u8>> {
        let n = self.net_handle.len();
        if n > MAX_NET_HANDLE {
            return Err(Error::internal(format!("net handle of {n} bytes (at most {MAX_NET_HANDLE})")));
        }
        let reach = self.gpu.reach.len();
        if reach > MAX_REACH {
            return Err(Error::internal(format!("a GPU reaching {reach} devices (at most {MAX_REACH} listed)")));
        }
        let mut b = Vec::with_capacity(PEER_INFO_BYTES);
        b.extend_from_slice(&(self.rank as u64).to_le_bytes());
        b.extend_from_slice(&self.host_hash.to_le_bytes());
        b.extend_from_slice(&self.pid.to_le_bytes());
        b.extend_from_slice(&self.cuda_dev.to_le_bytes());
        b.push(n as u8);
        b.push(self.shm as u8);
        b.push(reach as u8);
        b.extend_from_slice(&[0; 5]);
        b.extend_from_slice(&self.net_handle);
        b.resize(32 + MAX_NET_HANDLE, 0);
        b.extend_from_slice(&self.gpu.bus.to_le_bytes());
        for bus in &self.gpu.reach {
            b.extend_from_slice(&bus.to_le_bytes());
        }
        b.resize(PEER_INFO_BYTES, 0);
        Ok(b)
    }

    pub fn decode(b: &[u8]) -> Result<PeerInfo> {
        let mut r = Reader::exact(b, PEER_INFO_BYTES, "peer info")?;
        let rank = usize::try_from(r.u64_le()?).map_err(|_| Error::remote("peer info: rank out of range"))?;
        let (host_hash, pid, cuda_dev) = (r.u64_le()?, r.u32_le()?, r.i32_le()?);
        let n = r.u8()? as usize;
        if n > MAX_NET_HANDLE {
            return Err(Error::remote(format!("peer info: net handle of {n} bytes")));
        }
        let shm = match r.u8()? {
            0 => false,
            1 => true,
            v => return Err(Error::remote(format!("peer info: shm flag {v}"))),
        };
        let reach_len = r.u8()? as usize;
        if reach_len > MAX_REACH {
            return Err(Error::remote(format!("peer info: a GPU reaching {reach_len} devices")));
        }
        r.zeros(5)?;
        let net_handle = r.slice(n)?.to_vec();
        r.zeros(MAX_NET_HANDLE - n)?;
        let bus = r.u64_le()?;
        let reach = (0..reach_len).map(|_| r.u64_le()).collect::<Result<Vec<u64>>>()?;
        r.zeros(8 * (MAX_REACH - reach_len))?;
        r.finish()?;
        if (bus == 0) != reach.is_empty() || reach.first().is_some_and(|&first| first != bus) {
            return Err(Error::remote("peer info: a GPU's reach list does not start with the GPU"));
        }
        let mut distinct = reach.clone();
        distinct.sort_unstable();
        distinct.dedup();
        if distinct.len() != reach.len() || reach.contains(&0) {
            return Err(Error::remote("peer info: a GPU's reach list repeats a device or names none"));
        }
        Ok(PeerInfo { rank, host_hash, pid, cuda_dev, net_handle, shm, gpu: GpuIdentity { bus, reach } })
    }

    /// An all-gather of `nranks` records, each of which must name its own position.
    pub fn decode_all(b: &[u8], nranks: usize) -> Result<Vec<PeerInfo>> {
        if Some(b.len()) != nranks.checked_mul(PEER_INFO_BYTES) {
            return Err(Error::remote(format!("peer infos: {} bytes for {nranks} ranks", b.len())));
        }
        let peers: Vec<PeerInfo> = b.chunks_exact(PEER_INFO_BYTES).map(PeerInfo::decode).collect::<Result<_>>()?;
        for (i, p) in peers.iter().enumerate() {
            if p.rank != i {
                return Err(Error::remote(format!("peer info of rank {i} claims rank {}", p.rank)));
            }
        }
        Ok(peers)
    }
}

/// One rank's part of ncclCommSplit's exchange: color (i32 LE), key (i32 LE).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SplitEntry {
    pub color: i32,
    pub key: i32,
}

pub const SPLIT_ENTRY_BYTES: usize = 8;

impl SplitEntry {
    pub fn encode(&self) -> [u8; SPLIT_ENTRY_BYTES] {
        let mut b = [0u8; SPLIT_ENTRY_BYTES];
        b[0..4].copy_from_slice(&self.color.to_le_bytes());
        b[4..8].copy_from_slice(&self.key.to_le_bytes());
        b
    }

    pub fn decode(b: &[u8]) -> Result<SplitEntry> {
        let mut r = Reader::exact(b, SPLIT_ENTRY_BYTES, "split entry")?;
        let e = SplitEntry { color: r.i32_le()?, key: r.i32_le()? };
        r.finish()?;
        Ok(e)
    }

    /// An all-gather of split entries, in rank order.
    pub fn decode_all(b: &[u8]) -> Result<Vec<SplitEntry>> {
        if b.len() % SPLIT_ENTRY_BYTES != 0 {
            return Err(Error::remote(format!("split entries: {} bytes", b.len())));
        }
        b.chunks_exact(SPLIT_ENTRY_BYTES).map(SplitEntry::decode).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample(handle: Vec<u8>) -> PeerInfo {
        PeerInfo {
            rank: 3,
            host_hash: 99,
            pid: 1234,
            cuda_dev: -1,
            net_handle: handle,
            shm: true,
            gpu: GpuIdentity::default(),
        }
    }

    #[test]
    fn gpu_identity_round_trips_and_must_be_consistent() {
        let full: Vec<u64> = (0..MAX_REACH as u64).map(|i| 1 << 48 | 0x19 << 8 | i).collect();
        for reach in [vec![1 << 48 | 0x19 << 8], full] {
            let p = PeerInfo { gpu: GpuIdentity { bus: reach[0], reach }, ..sample(vec![7; 5]) };
            let b = p.encode().unwrap();
            assert_eq!(b.len(), PEER_INFO_BYTES);
            assert_eq!(PeerInfo::decode(&b).unwrap(), p);
        }
        let too_many = GpuIdentity { bus: 1, reach: vec![1; MAX_REACH + 1] };
        assert!(PeerInfo { gpu: too_many, ..sample(vec![]) }.encode().is_err());
        let not_first = GpuIdentity { bus: 1 << 48, reach: vec![1 << 48 | 1, 1 << 48] };
        assert!(PeerInfo::decode(&PeerInfo { gpu: not_first, ..sample(vec![]) }.encode().unwrap()).is_err());
        let twice = GpuIdentity { bus: 1 << 48, reach: vec![1 << 48, 1 << 48 | 1, 1 << 48 | 1] };
        assert!(PeerInfo::decode(&PeerInfo { gpu: twice, ..sample(vec![]) }.encode().unwrap()).is_err());
        let none_listed = GpuIdentity { bus: 1 << 48, reach: vec![1 << 48, 0] };
        assert!(PeerInfo::decode(&PeerInfo { gpu: none_listed, ..sample(vec![]) }.encode().unwrap()).is_err());
        let no_gpu_but_reach = GpuIdentity { bus: 0, reach: vec![0] };
        assert!(PeerInfo::decode(&PeerInfo { gpu: no_gpu_but_reach, ..sample(vec![]) }.encode().unwrap()).is_err());
        let mut bad = sample(vec![]).encode().unwrap();
        bad[26] = MAX_REACH as u8 + 1;
        assert!(PeerInfo::decode(&bad).is_err(), "reach count beyond the record");
        let mut bad = sample(vec![]).encode().unwrap();
        bad[PEER_INFO_BYTES - 1] = 1;
        assert!(PeerInfo::decode(&bad).is_err(), "bytes after the reach list");
    }

    #[test]
    fn peer_info_round_trip_truncated_oversized() {
        let p = sample(vec![1, 2, 3]);
        let b = p.encode().unwrap();
        assert_eq!(b.len(), PEER_INFO_BYTES);
        assert_eq!(PeerInfo::decode(&b).unwrap(), p);
        for len in [0, 24, 25, PEER_INFO_BYTES - 1, PEER_INFO_BYTES + 1] {
            let mut short_or_long = b.clone();
            short_or_long.resize(len, 0);
            assert!(PeerInfo::decode(&short_or_long).is_err(), "{len} bytes accepted");
        }
        let mut bad = b.clone();
        bad[24] = 200;
        assert!(PeerInfo::decode(&bad).is_err(), "handle length beyond the record");
        let mut bad = b.clone();
        bad[25] = 2;
        assert!(PeerInfo::decode(&bad).is_err(), "shm flag");
        let mut bad = b;
        bad[40] = 1;
        assert!(PeerInfo::decode(&bad).is_err(), "bytes after the handle");
    }

    #[test]
    fn full_size_handle_survives_the_shm_flag() {
        // The old layout let the shm flag overwrite the 64th byte of a 64-byte handle, which
        // its decoder then refused.
        for shm in [false, true] {
            let p = PeerInfo { shm, ..sample(vec![0xab; MAX_NET_HANDLE]) };
            assert_eq!(PeerInfo::decode(&p.encode().unwrap()).unwrap(), p);
        }
        assert!(sample(vec![0; MAX_NET_HANDLE + 1]).encode().is_err());
    }

    #[test]
    fn decode_all_checks_count_and_ranks() {
        let peers: Vec<PeerInfo> = (0..3).map(|r| PeerInfo { rank: r, ..sample(vec![r as u8]) }).collect();
        let all: Vec<u8> = peers.iter().flat_map(|p| p.encode().unwrap()).collect();
        assert_eq!(PeerInfo::decode_all(&all, 3).unwrap(), peers);
        assert!(PeerInfo::decode_all(&all, 2).is_err());
        assert!(PeerInfo::decode_all(&all[1..], 3).is_err());
        assert!(PeerInfo::decode_all(&all, usize::MAX).is_err());
        let swapped: Vec<u8> = [&peers[1], &peers[0], &peers[2]].iter().flat_map(|p| p.encode().unwrap()).collect();
        assert!(PeerInfo::decode_all(&swapped, 3).is_err(), "rank 0's slot claims rank 1");
    }

    #[test]
    fn split_entries_round_trip_truncated_oversized() {
        let e = SplitEntry { color: -1, key: i32::MIN };
        assert_eq!(SplitEntry::decode(&e.encode()).unwrap(), e);
        assert!(SplitEntry::decode(&e.encode()[..7]).is_err());
        assert!(SplitEntry::decode(&[0; 9]).is_err());
        let all = [e.encode(), SplitEntry { color: 4, key: 5 }.encode()].concat();
        assert_eq!(SplitEntry::decode_all(&all).unwrap().len(), 2);
        assert!(SplitEntry::decode_all(&all[..15]).is_err());
    }
}
