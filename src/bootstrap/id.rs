//! The 128-byte unique id: the root's address and a random magic that every connection of the
//! communicator carries (connections with another magic are dropped).

use std::net::SocketAddr;

use crate::error::{Error, Result};
use crate::transport::socket::{decode_addr, encode_addr, ADDR_BYTES};
use crate::types::NCCL_UNIQUE_ID_BYTES;

/// Magic NCCL uses when the root address comes from NCCL_COMM_ID.
pub const COMM_ID_ENV_MAGIC: u64 = 0x0280_0280_0280_0280;

const ID_VERSION_TAG: u32 = 0x4665_7231; // "Fer1": lets us reject ids from other libraries

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct UniqueId {
    pub magic: u64,
    pub root: SocketAddr,
}

impl UniqueId {
    pub fn encode(&self) -> [u8; NCCL_UNIQUE_ID_BYTES] {
        let mut b = [0u8; NCCL_UNIQUE_ID_BYTES];
        b[0..8].copy_from_slice(&self.magic.to_le_bytes());
        encode_addr(&self.root, &mut b[8..8 + ADDR_BYTES]);
        b[36..40].copy_from_slice(&ID_VERSION_TAG.to_le_bytes());
        b
    }

    pub fn decode(b: &[u8; NCCL_UNIQUE_ID_BYTES]) -> Result<UniqueId> {
        let tag = u32::from_le_bytes(b[36..40].try_into().expect("4 bytes"));
        if tag != ID_VERSION_TAG || b[40..].iter().any(|&x| x != 0) {
            return Err(Error::invalid_argument(
                "unique id was not produced by ferroccl's ncclGetUniqueId (or is corrupted)",
            ));
        }
        let magic = u64::from_le_bytes(b[0..8].try_into().expect("8 bytes"));
        let root = decode_addr(&b[8..8 + ADDR_BYTES]).map_err(|e| e.context("unique id"))?;
        Ok(UniqueId { magic, root })
    }

    /// A short hash for log lines (NCCL prints `commId 0x...`).
    pub fn hash(&self) -> u64 {
        let mut h: u64 = 0xcbf2_9ce4_8422_2325;
        for byte in self.encode() {
            h ^= byte as u64;
            h = h.wrapping_mul(0x0100_0000_01b3);
        }
        h
    }
}

/// 64 random bits from the kernel.
pub fn random_u64() -> Result<u64> {
    let mut v = [0u8; 8];
    // SAFETY: getrandom writes at most v.len() bytes into v.
    let n = unsafe { libc::getrandom(v.as_mut_ptr().cast(), v.len(), 0) };
    if n != v.len() as isize {
        return Err(Error::system("getrandom", std::io::Error::last_os_error()));
    }
    Ok(u64::from_ne_bytes(v))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_and_rejects_garbage() {
        let id = UniqueId { magic: 0xdead_beef_cafe_f00d, root: "10.0.0.1:4242".parse().unwrap() };
        let b = id.encode();
        assert_eq!(UniqueId::decode(&b).unwrap(), id);
        assert!(UniqueId::decode(&[0u8; 128]).is_err());
        let mut bad = b;
        bad[100] = 1;
        assert!(UniqueId::decode(&bad).is_err());
        assert_ne!(random_u64().unwrap(), random_u64().unwrap());
    }
}
