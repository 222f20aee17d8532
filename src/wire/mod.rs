//! Fixed layouts of the bytes ranks exchange: every encoder and decoder of data that comes
//! from a peer (or from a user, as a unique id) lives here, free of I/O.
//!
//! Owns: socket addresses in ids, handles and tables ([`addr`]); the hello every connection
//! starts with and the socket transport's frame header ([`hello`]); the unique id and the
//! rendezvous root's messages ([`ids`]); what ranks learn about each other at init and split
//! ([`peer_info`]); the InfiniBand transport's connection info and clear-to-send entries
//! ([`ib`]). Not here: moving the bytes (`transport`, `bootstrap`) or acting on them.
//!
//! Invariants, for every decoder: the length is checked first, every field is read through
//! `Reader` (no indexing, no `expect`), padding must be zero, and a decoder accepts only
//! what its encoder produces (decode then encode gives back the same bytes). So no input can
//! make one panic; `tests::no_decoder_panics_on_random_bytes` feeds them random bytes.

pub mod addr;
pub mod hello;
pub mod ib;
pub mod ids;
pub mod peer_info;
pub mod sig;

pub use addr::{decode_addr, encode_addr, ADDR_BYTES};
pub use hello::{frame_fields, frame_header, frame_len, ConnKind, Hello, FRAME_BYTES, FRAME_MAGIC, HELLO_BYTES};
pub use ib::{CtsEntry, IbConnInfo, IbRole, LinkLayer, CTS_BYTES, IB_CONN_INFO_BYTES};
pub use ids::{decode_table, encode_table, RankInfo, UniqueId};
pub use peer_info::{PeerInfo, SplitEntry, MAX_NET_HANDLE, PEER_INFO_BYTES};
pub use sig::OpSig;

use crate::error::{Error, Result};

/// Reads the fields of one record front to back; every read is checked.
pub(crate) struct Reader<'a> {
    rest: &'a [u8],
    what: &'static str,
}

impl<'a> Reader<'a> {
    /// A reader over `b`, which must be exactly `len` bytes (checked before anything is read).
    pub(crate) fn exact(b: &'a [u8], len: usize, what: &'static str) -> Result<Reader<'a>> {
        if b.len() != len {
            return Err(Error::remote(format!("{what}: {} bytes, expected {len}", b.len())));
        }
        Ok(Reader { rest: b, what })
    }

    fn short(&self) -> Error {
        Error::remote(format!("{}: record ends early", self.what))
    }

    pub(crate) fn bytes<const N: usize>(&mut self) -> Result<[u8; N]> {
        let (head, tail) = self.rest.split_first_chunk::<N>().ok_or_else(|| self.short())?;
        self.rest = tail;
        Ok(*head)
    }

    pub(crate) fn slice(&mut self, n: usize) -> Result<&'a [u8]> {
        if n > self.rest.len() {
            return Err(self.short());
        }
        let (head, tail) = self.rest.split_at(n);
        self.rest = tail;
        Ok(head)
    }

    pub(crate) fn u8(&mut self) -> Result<u8> {
        Ok(u8::from_le_bytes(self.bytes()?))
    }
    pub(crate) fn u16_le(&mut self) -> Result<u16> {
        Ok(u16::from_le_bytes(self.bytes()?))
    }
    pub(crate) fn u16_be(&mut self) -> Result<u16> {
        Ok(u16::from_be_bytes(self.bytes()?))
    }
    pub(crate) fn u32_le(&mut self) -> Result<u32> {
        Ok(u32::from_le_bytes(self.bytes()?))
    }
    pub(crate) fn i32_le(&mut self) -> Result<i32> {
        Ok(i32::from_le_bytes(self.bytes()?))
    }
    pub(crate) fn u64_le(&mut self) -> Result<u64> {
        Ok(u64::from_le_bytes(self.bytes()?))
    }

    /// Skips `n` bytes of padding, which must be zero.
    pub(crate) fn zeros(&mut self, n: usize) -> Result<()> {
        let what = self.what;
        if self.slice(n)?.iter().any(|&b| b != 0) {
            return Err(Error::remote(format!("{what}: nonzero padding")));
        }
        Ok(())
    }

    /// Ends the record: every byte must have been read.
    pub(crate) fn finish(self) -> Result<()> {
        if !self.rest.is_empty() {
            return Err(Error::remote(format!("{}: {} bytes left over", self.what, self.rest.len())));
        }
        Ok(())
    }
}

/// The little-endian `i64` that starts `b` (an all-gathered word, e.g. a file descriptor).
pub fn le_i64(b: &[u8], what: &'static str) -> Result<i64> {
    let word = b.first_chunk::<8>().ok_or_else(|| Error::remote(format!("{what}: fewer than 8 bytes")))?;
    Ok(i64::from_le_bytes(*word))
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// xorshift64*: deterministic, dependency-free randomness for the codec tests.
    pub(crate) struct Rng(u64);

    impl Rng {
        pub(crate) fn new(seed: u64) -> Rng {
            Rng(seed | 1)
        }
        pub(crate) fn next(&mut self) -> u64 {
            self.0 ^= self.0 >> 12;
            self.0 ^= self.0 << 25;
            self.0 ^= self.0 >> 27;
            self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
        }
        pub(crate) fn below(&mut self, n: usize) -> usize {
            (self.next() % n as u64) as usize
        }
        pub(crate) fn bytes(&mut self, n: usize) -> Vec<u8> {
            (0..n).map(|_| self.next() as u8).collect()
        }
        /// `valid` damaged: truncated, extended, or with a few bytes changed.
        pub(crate) fn mutate(&mut self, valid: &[u8]) -> Vec<u8> {
            let mut b = valid.to_vec();
            match self.below(4) {
                0 => b.truncate(self.below(valid.len().max(1))),
                1 => {
                    let extra = 1 + self.below(16);
                    b.extend(self.bytes(extra));
                }
                _ => {
                    for _ in 0..1 + self.below(3) {
                        if !b.is_empty() {
                            let i = self.below(b.len());
                            b[i] = self.next() as u8;
                        }
                    }
                }
            }
            b
        }
    }

    const MAGIC: u64 = 0x1234_5678_9abc_def0;

    /// Samples of valid encodings, by decoder, that the random inputs are mutated from.
    fn valid_samples() -> Vec<(&'static str, Vec<u8>)> {
        let v4: std::net::SocketAddr = "10.1.2.3:4567".parse().unwrap();
        let v6: std::net::SocketAddr = "[fe80::1%2]:99".parse().unwrap();
        let mut a4 = [0u8; ADDR_BYTES];
        encode_addr(&v4, &mut a4);
        let peer = PeerInfo {
            rank: 5,
            host_hash: 77,
            pid: 4242,
            cuda_dev: 1,
            net_handle: a4.to_vec(),
            shm: true,
            gpu: Default::default(),
        };
        vec![
            ("addr", a4.to_vec()),
            ("hello", Hello { magic: MAGIC, kind: ConnKind::Ring, rank: 2, extra: 3 }.encode().to_vec()),
            ("frame", frame_header(12345, OpSig(0x0070_0071)).to_vec()),
            ("unique id", UniqueId { magic: MAGIC, root: v6 }.encode().to_vec()),
            ("rank info", RankInfo { rank: 1, nranks: 4, addr: v6 }.encode()),
            ("table", encode_table(&[v4, v6])),
            ("peer info", peer.encode().unwrap()),
            ("split", SplitEntry { color: 3, key: -7 }.encode().to_vec()),
            ("le_i64", 17i64.to_le_bytes().to_vec()),
            ("ib conn", ib::tests::sample(IbRole::Sender).encode().to_vec()),
            ("ib conn recv", ib::tests::sample(IbRole::Receiver).encode().to_vec()),
            ("cts", CtsEntry { addr: 0x1000, size: 4096, rkey: 9, seq: 3 }.encode().to_vec()),
        ]
    }

    /// Runs the decoder named `which` on `b`; when it accepts, the input must be exactly
    /// what the encoder makes of the result (canonical form). Returns whether it accepted.
    fn decode_and_check(which: &str, b: &[u8]) -> bool {
        match which {
            "addr" => decode_addr(b).map(|a| {
                let mut again = [0u8; ADDR_BYTES];
                encode_addr(&a, &mut again);
                assert_eq!(again.as_slice(), b, "addr not canonical");
            }),
            "hello" => Hello::decode(b, MAGIC).map(|h| assert_eq!(h.encode().as_slice(), b, "hello")),
            "frame" => frame_fields(b).map(|(n, s)| assert_eq!(frame_header(n, s).as_slice(), b, "frame")),
            "unique id" => UniqueId::decode(b).map(|id| assert_eq!(id.encode().as_slice(), b, "unique id")),
            "rank info" => RankInfo::decode(b).map(|r| assert_eq!(r.encode(), b, "rank info")),
            "table" => decode_table(b, 2).map(|t| assert_eq!(encode_table(&t), b, "table")),
            "peer info" => PeerInfo::decode(b).map(|p| assert_eq!(p.encode().unwrap(), b, "peer info")),
            "split" => SplitEntry::decode(b).map(|s| assert_eq!(s.encode().as_slice(), b, "split")),
            "le_i64" => le_i64(b, "word").map(|_| ()),
            "ib conn" | "ib conn recv" => {
                IbConnInfo::decode(b).map(|c| assert_eq!(c.encode().as_slice(), b, "ib conn"))
            }
            "cts" => CtsEntry::decode(b).map(|c| assert_eq!(c.encode().as_slice(), b, "cts")),
            other => panic!("no decoder {other}"),
        }
        .is_ok()
    }

    #[test]
    fn no_decoder_panics_on_random_bytes() {
        let mut rng = Rng::new(0x5eed_cafe);
        let samples = valid_samples();
        let mut accepted = 0;
        for (which, valid) in &samples {
            assert!(decode_and_check(which, valid), "{which}: its own encoding is rejected");
            for _ in 0..3000 {
                let len = rng.below(2 * valid.len() + 8);
                let random = rng.bytes(len);
                accepted += decode_and_check(which, &random) as usize;
                let damaged = rng.mutate(valid);
                accepted += decode_and_check(which, &damaged) as usize;
            }
        }
        // Mutations that only touch free fields (ranks, hashes, lengths) decode; the point is
        // the absence of panics and the canonical form, checked above.
        assert!(accepted > 0);
    }

    #[test]
    fn reader_checks_length_first_and_leftovers() {
        assert!(Reader::exact(&[0; 3], 4, "x").is_err());
        let mut r = Reader::exact(&[1, 0, 0, 0, 9], 5, "x").unwrap();
        assert_eq!(r.u32_le().unwrap(), 1);
        assert!(r.u32_le().is_err(), "reads past the end are errors");
        assert!(r.finish().is_err(), "one byte was left");
        let mut r = Reader::exact(&[0, 1], 2, "x").unwrap();
        assert!(r.zeros(2).is_err(), "nonzero padding");
        assert!(le_i64(&[1; 7], "w").is_err());
        assert_eq!(le_i64(&[255; 9], "w").unwrap(), -1);
    }
}
