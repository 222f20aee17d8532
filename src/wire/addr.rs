//! Socket addresses in 28 bytes, as unique ids, net handles and the root's table carry them.
//!
//! Layout: family (u16 LE: `AF_INET` or `AF_INET6`), port (u16 big-endian, nonzero), then
//! IPv4: 4 address bytes and 20 zero bytes; IPv6: 16 address bytes, the scope id (u32 LE) and
//! 4 zero bytes.

use std::net::{SocketAddr, SocketAddrV6};

use super::Reader;
use crate::error::{Error, Result};

pub const ADDR_BYTES: usize = 28;

/// Encodes `addr` into the first [`ADDR_BYTES`] of `out` (which must have room for them).
pub fn encode_addr(addr: &SocketAddr, out: &mut [u8]) {
    let b = addr_bytes(addr);
    out[..ADDR_BYTES].copy_from_slice(&b);
}

/// `addr` in its 28-byte form.
pub fn addr_bytes(addr: &SocketAddr) -> [u8; ADDR_BYTES] {
    let mut out = [0u8; ADDR_BYTES];
    match addr {
        SocketAddr::V4(a) => {
            out[0..2].copy_from_slice(&(libc::AF_INET as u16).to_le_bytes());
            out[2..4].copy_from_slice(&a.port().to_be_bytes());
            out[4..8].copy_from_slice(&a.ip().octets());
        }
        SocketAddr::V6(a) => {
            out[0..2].copy_from_slice(&(libc::AF_INET6 as u16).to_le_bytes());
            out[2..4].copy_from_slice(&a.port().to_be_bytes());
            out[4..20].copy_from_slice(&a.ip().octets());
            out[20..24].copy_from_slice(&a.scope_id().to_le_bytes());
        }
    }
    out
}

/// Decodes [`encode_addr`]'s format: exactly [`ADDR_BYTES`] bytes; anything else is an error.
pub fn decode_addr(b: &[u8]) -> Result<SocketAddr> {
    let mut r = Reader::exact(b, ADDR_BYTES, "address record")?;
    let family = r.u16_le()? as i32;
    let port = r.u16_be()?;
    if port == 0 {
        return Err(Error::remote("address record has port 0"));
    }
    let addr = match family {
        libc::AF_INET => {
            let ip: [u8; 4] = r.bytes()?;
            r.zeros(20)?;
            SocketAddr::from((ip, port))
        }
        libc::AF_INET6 => {
            let ip: [u8; 16] = r.bytes()?;
            let scope = r.u32_le()?;
            r.zeros(4)?;
            SocketAddr::V6(SocketAddrV6::new(ip.into(), port, 0, scope))
        }
        other => return Err(Error::remote(format!("address record has unknown family {other}"))),
    };
    r.finish()?;
    Ok(addr)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_truncated_and_oversized() {
        for s in ["127.0.0.1:5000", "[::1]:6000", "[fe80::1%3]:7"] {
            let a: SocketAddr = s.parse().unwrap();
            let b = addr_bytes(&a);
            assert_eq!(decode_addr(&b).unwrap(), a);
            assert!(decode_addr(&b[..ADDR_BYTES - 1]).is_err(), "{s}: truncated");
            let mut long = b.to_vec();
            long.push(0);
            assert!(decode_addr(&long).is_err(), "{s}: oversized");
        }
        assert!(decode_addr(&[0u8; ADDR_BYTES]).is_err());
        assert!(decode_addr(&[1u8; 4]).is_err());
        assert!(decode_addr(&[]).is_err());
        let mut padded = addr_bytes(&"1.2.3.4:5".parse().unwrap());
        padded[27] = 1;
        assert!(decode_addr(&padded).is_err(), "nonzero padding");
    }
}
