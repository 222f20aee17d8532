//! The first bytes of every TCP connection ([`Hello`]) and the header in front of every
//! message of the socket transport ([`frame_header`]).
//!
//! Hello layout (20 bytes): communicator magic (u64 LE), [`ConnKind`] (u32 LE), sender rank
//! (u32 LE), purpose-specific value (u32 LE). Frame layout (16 bytes): [`FRAME_MAGIC`] (u32
//! LE), the sending call's [`OpSig`](super::sig::OpSig) (u32 LE; 0 = not checked), payload length
//! (u64 LE).

use super::Reader;
use crate::error::{Error, Result};

/// What a connection is for; sent in the hello so an acceptor can route it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u32)]
pub enum ConnKind {
    /// A rank contacting the unique-id root.
    Root = 1,
    /// The bootstrap ring (rank -> rank+1).
    Ring = 2,
    /// A bootstrap point-to-point message.
    BootstrapP2p = 3,
    /// A data connection of the socket transport.
    Data = 4,
    /// The setup connection of an InfiniBand connection (queue-pair details).
    IbSetup = 5,
}

impl ConnKind {
    fn from_u32(v: u32) -> Option<ConnKind> {
        match v {
            1 => Some(ConnKind::Root),
            2 => Some(ConnKind::Ring),
            3 => Some(ConnKind::BootstrapP2p),
            4 => Some(ConnKind::Data),
            5 => Some(ConnKind::IbSetup),
            _ => None,
        }
    }
}

/// First bytes of every connection: the communicator's magic, the purpose and the sender.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Hello {
    pub magic: u64,
    pub kind: ConnKind,
    pub rank: u32,
    /// Purpose-specific value (bootstrap tag, data channel index).
    pub extra: u32,
}

pub const HELLO_BYTES: usize = 20;

impl Hello {
    pub fn encode(&self) -> [u8; HELLO_BYTES] {
        let mut b = [0u8; HELLO_BYTES];
        b[0..8].copy_from_slice(&self.magic.to_le_bytes());
        b[8..12].copy_from_slice(&(self.kind as u32).to_le_bytes());
        b[12..16].copy_from_slice(&self.rank.to_le_bytes());
        b[16..20].copy_from_slice(&self.extra.to_le_bytes());
        b
    }

    /// Parses a hello, rejecting a wrong length, a wrong magic or an unknown kind.
    pub fn decode(b: &[u8], expected_magic: u64) -> Result<Hello> {
        let mut r = Reader::exact(b, HELLO_BYTES, "hello")?;
        let magic = r.u64_le()?;
        if magic != expected_magic {
            return Err(Error::remote(format!(
                "connection with wrong magic {magic:#018x} (expected {expected_magic:#018x}) dropped"
            )));
        }
        let kind = r.u32_le()?;
        let kind = ConnKind::from_u32(kind)
            .ok_or_else(|| Error::remote(format!("connection of unknown kind {kind} dropped")))?;
        let hello = Hello { magic, kind, rank: r.u32_le()?, extra: r.u32_le()? };
        r.finish()?;
        Ok(hello)
    }
}

pub const FRAME_MAGIC: u32 = 0x4c43_4346; // "FCCL"
pub const FRAME_BYTES: usize = 16;

/// The header announcing a message of `len` bytes sent by a call of signature `sig`.
pub fn frame_header(len: u64, sig: super::sig::OpSig) -> [u8; FRAME_BYTES] {
    let mut b = [0u8; FRAME_BYTES];
    b[0..4].copy_from_slice(&FRAME_MAGIC.to_le_bytes());
    b[4..8].copy_from_slice(&sig.0.to_le_bytes());
    b[8..16].copy_from_slice(&len.to_le_bytes());
    b
}

/// The payload length and sender's signature a frame header announces; anything but a
/// header is garbage.
pub fn frame_fields(b: &[u8]) -> Result<(u64, super::sig::OpSig)> {
    let mut r = Reader::exact(b, FRAME_BYTES, "frame header")?;
    let magic = r.u32_le()?;
    if magic != FRAME_MAGIC {
        return Err(Error::remote(format!("garbage (bad frame magic {magic:#x})")));
    }
    let sig = super::sig::OpSig(r.u32_le()?);
    let len = r.u64_le()?;
    r.finish()?;
    Ok((len, sig))
}

/// The payload length a frame header announces.
pub fn frame_len(b: &[u8]) -> Result<u64> {
    frame_fields(b).map(|(len, _)| len)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hello_round_trip_wrong_magic_truncated_oversized() {
        let h = Hello { magic: 0x1234, kind: ConnKind::Data, rank: 3, extra: 9 };
        let b = h.encode();
        assert_eq!(Hello::decode(&b, 0x1234).unwrap(), h);
        assert!(Hello::decode(&b, 0x9999).is_err());
        assert!(Hello::decode(&b[..HELLO_BYTES - 1], 0x1234).is_err());
        assert!(Hello::decode(&[b.as_slice(), &[0]].concat(), 0x1234).is_err());
        let mut garbage = b;
        garbage[8] = 77;
        assert!(Hello::decode(&garbage, 0x1234).is_err());
    }

    #[test]
    fn frame_round_trip_truncated_oversized() {
        let sig = super::super::sig::OpSig(0x1234_5671);
        let b = frame_header(1 << 40, sig);
        assert_eq!(frame_fields(&b).unwrap(), (1 << 40, sig));
        assert_eq!(frame_len(&b).unwrap(), 1 << 40);
        assert!(frame_len(&b[..FRAME_BYTES - 1]).is_err());
        assert!(frame_len(&[b.as_slice(), &[0]].concat()).is_err());
        let mut bad = b;
        bad[0] ^= 1;
        assert!(frame_len(&bad).is_err(), "magic");
    }
}
