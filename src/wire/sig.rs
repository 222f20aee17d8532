//! The operation signature every message and node-area publication carries, so that a rank
//! whose call does not match its peer's (another collective, count, data type, operator or
//! root) fails with `ncclInvalidUsage` naming the difference instead of reading the wrong
//! bytes or waiting for a message that never comes.
//!
//! Layout (32 bits, little-endian where it travels): kind (bits 0-3, 1-9; 0 means "not
//! checked"), data type index (4-7), operator (8-11: 0 none, else 1 + sum/prod/max/min, +4 with
//! a pre-scaling scalar (PreMulSum, float Avg), +8 with a final division (integer Avg)), root
//! (12-18, modulo 128), device buffers (19: a collective whose caller passed device memory,
//! including the host copies and exchanges it runs on) and a 12-bit digest of the count
//! (20-31: the 12-bit groups of the count XORed together, so counts below 4096 are themselves
//! and counts one bit apart, such as powers of two, always differ). The socket transport puts
//! it in its frame header's spare word, shared memory in the high half of its slot's flag word,
//! the node area next to its counters. Truncated fields mean some mismatches slip through
//! (roots 128 apart, counts with equal digests); sizes are checked separately by every
//! transport.

/// A call's signature; `OpSig::NONE` is never compared.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct OpSig(pub u32);

/// Names of the kinds, by code (0 unused).
const KINDS: [&str; 10] = [
    "?",
    "AllReduce",
    "Broadcast",
    "Reduce",
    "AllGather",
    "ReduceScatter",
    "AlltoAll",
    "Gather",
    "Scatter",
    "Send/Recv",
];
/// The point-to-point kind: a send on one rank matches a receive on the other.
pub const KIND_P2P: u32 = 9;
const OPS: [&str; 4] = ["sum", "prod", "max", "min"];
pub const ROOT_MOD: usize = 1 << 7;
const DEVICE_BIT: u32 = 1 << 19;

/// The count's 12-bit groups XORed together: itself below 4096, and different for counts that
/// differ in one bit.
fn count_digest(count: usize) -> u32 {
    let mut c = count as u64;
    let mut d = 0u64;
    while c != 0 {
        d ^= c & 0xfff;
        c >>= 12;
    }
    d as u32
}

impl OpSig {
    pub const NONE: OpSig = OpSig(0);

    /// `kind` 1-9 (see `KINDS`), `dtype` an index into `DataType::ALL` (0 for point-to-point,
    /// whose ranks may name the bytes differently), `op` as described in the module docs,
    /// `root` (0 where there is none) and `count` in elements (point-to-point: bytes).
    pub fn new(kind: u32, dtype: u32, op: u32, root: usize, count: usize) -> OpSig {
        debug_assert!((1..=9).contains(&kind) && dtype < 16 && op < 16);
        OpSig(
            (kind & 0xf)
                | (dtype & 0xf) << 4
                | (op & 0xf) << 8
                | ((root % ROOT_MOD) as u32) << 12
                | count_digest(count) << 20,
        )
    }

    /// The same call made on device buffers.
    pub fn on_device(self) -> OpSig {
        OpSig(self.0 | DEVICE_BIT)
    }

    /// The operator code of a reduction: `kind` 0-3 (sum, prod, max, min), whether inputs are
    /// pre-scaled and whether the result is divided.
    pub fn op_code(kind: u32, pre: bool, post: bool) -> u32 {
        1 + (kind & 3) + 4 * pre as u32 + 8 * post as u32
    }

    pub fn is_none(self) -> bool {
        self.0 & 0xf == 0
    }
    fn kind(self) -> u32 {
        self.0 & 0xf
    }
    fn dtype(self) -> u32 {
        (self.0 >> 4) & 0xf
    }
    fn op(self) -> u32 {
        (self.0 >> 8) & 0xf
    }
    fn root(self) -> u32 {
        (self.0 >> 12) & 0x7f
    }
    fn device(self) -> bool {
        self.0 & DEVICE_BIT != 0
    }
    fn count(self) -> u32 {
        self.0 >> 20
    }

    fn kind_name(self) -> &'static str {
        KINDS.get(self.kind() as usize).copied().unwrap_or("?")
    }

    fn dtype_name(self) -> &'static str {
        crate::types::DataType::ALL.get(self.dtype() as usize).map_or("?", |d| d.name())
    }

    fn op_name(self) -> String {
        match self.op() {
            0 => "none".into(),
            c => {
                let base = OPS[((c - 1) & 3) as usize];
                match (c - 1) >> 2 {
                    0 => base.into(),
                    1 => format!("{base} with pre-scaling (PreMulSum or float avg)"),
                    2 => format!("{base} then divide (integer avg)"),
                    _ => format!("{base} (code {c})"),
                }
            }
        }
    }

    /// The fields in which `theirs` differs from `self`, one phrase each (empty: they
    /// match, or either is [`OpSig::NONE`]).
    pub fn differences(self, theirs: OpSig, me: &str, peer: &str) -> Vec<String> {
        if self.is_none() || theirs.is_none() || self == theirs {
            return Vec::new();
        }
        let mut d = Vec::new();
        if self.kind() != theirs.kind() {
            d.push(format!("operation {} on {me}, {} on {peer}", self.kind_name(), theirs.kind_name()));
        }
        if self.device() != theirs.device() {
            let kind = |device: bool| if device { "device" } else { "host" };
            d.push(format!(
                "{} buffers on {me}, {} buffers on {peer} (all ranks of a collective pass the same kind of memory)",
                kind(self.device()),
                kind(theirs.device())
            ));
        }
        if !d.is_empty() {
            return d;
        }
        if self.dtype() != theirs.dtype() {
            d.push(format!("data type {} on {me}, {} on {peer}", self.dtype_name(), theirs.dtype_name()));
        }
        if self.op() != theirs.op() {
            d.push(format!("operator {} on {me}, {} on {peer}", self.op_name(), theirs.op_name()));
        }
        if self.root() != theirs.root() {
            d.push(format!("root {} on {me}, {} on {peer} (modulo {ROOT_MOD})", self.root(), theirs.root()));
        }
        if self.count() != theirs.count() {
            d.push(format!(
                "counts differ (12-bit digests, the count itself below 4096: {} on {me}, {} on {peer})",
                self.count(),
                theirs.count()
            ));
        }
        d
    }

    /// `Err(ncclInvalidUsage)` naming both ranks and what differs when `theirs` (received from
    /// rank `peer`) does not match this rank's (`me`) call.
    #[inline]
    pub fn check(self, theirs: OpSig, me: usize, peer: usize) -> crate::error::Result<()> {
        // The common case first, without building the labels (this runs per message).
        if self == theirs || self.is_none() || theirs.is_none() {
            return Ok(());
        }
        self.check_labelled(theirs, &format!("rank {me}"), &format!("rank {peer}"))
    }

    /// As [`OpSig::check`] with the two sides named by `me` and `peer` (a transport that does
    /// not know ranks says "this rank" and "the peer"; the executor adds the ranks).
    #[inline]
    pub fn check_labelled(self, theirs: OpSig, me: &str, peer: &str) -> crate::error::Result<()> {
        if self == theirs || self.is_none() || theirs.is_none() {
            return Ok(());
        }
        let d = self.differences(theirs, me, peer);
        if d.is_empty() {
            return Ok(());
        }
        Err(crate::error::Error::invalid_usage(format!(
            "mismatched calls: {me}'s {} does not match {peer}'s {}: {}",
            self.kind_name(),
            theirs.kind_name(),
            d.join("; ")
        )))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fields_round_trip_and_differences_are_named() {
        let a = OpSig::new(1, 7, OpSig::op_code(0, false, false), 0, 1000);
        assert!(!a.is_none() && OpSig::NONE.is_none());
        assert!(a.check(a, 0, 1).is_ok());
        assert!(a.check(OpSig::NONE, 0, 1).is_ok(), "unsigned messages are not compared");
        let count = OpSig::new(1, 7, OpSig::op_code(0, false, false), 0, 1001);
        let e = a.check(count, 0, 1).unwrap_err().to_string();
        assert!(
            e.contains("counts differ (12-bit digests, the count itself below 4096: 1000 on rank 0, 1001 on rank 1)"),
            "{e}"
        );
        let dtype = OpSig::new(1, 2, OpSig::op_code(0, false, false), 0, 1000);
        let e = a.check(dtype, 0, 1).unwrap_err().to_string();
        assert!(e.contains("data type float on rank 0, int32 on rank 1"), "{e}");
        let op = OpSig::new(1, 7, OpSig::op_code(2, false, false), 0, 1000);
        let e = a.check(op, 3, 2).unwrap_err().to_string();
        assert!(e.contains("operator sum on rank 3, max on rank 2"), "{e}");
        let b0 = OpSig::new(2, 7, 0, 0, 10);
        let e = b0.check(OpSig::new(2, 7, 0, 1, 10), 0, 1).unwrap_err().to_string();
        assert!(e.contains("root 0 on rank 0, 1 on rank 1"), "{e}");
        let e = a.check(b0, 0, 1).unwrap_err().to_string();
        assert!(e.contains("operation AllReduce on rank 0, Broadcast on rank 1"), "{e}");
        let e = a.check_labelled(count, "this rank", "the peer").unwrap_err().to_string();
        assert!(e.contains("1000 on this rank, 1001 on the peer"), "{e}");
        // Powers of two (the common sizes) are told apart, and counts one bit apart always are.
        for bit in 0..40 {
            assert_ne!(OpSig::new(1, 7, 1, 0, 1 << bit), OpSig::new(1, 7, 1, 0, 1 << (bit + 1)), "2^{bit}");
            assert_ne!(OpSig::new(1, 7, 1, 0, 3 << 20), OpSig::new(1, 7, 1, 0, (3 << 20) ^ (1 << bit)), "bit {bit}");
        }
        assert_eq!(OpSig::new(9, 0, 0, 0, 5 | 5 << 12), OpSig::new(9, 0, 0, 0, 0), "equal digests pass");
        // The kind of memory: named first, before any other difference.
        let dev = a.on_device();
        assert!(dev.check(dev, 0, 1).is_ok());
        let e = dev.check(count, 0, 1).unwrap_err().to_string();
        assert!(e.contains("device buffers on rank 0, host buffers on rank 1"), "{e}");
        assert!(!e.contains("counts differ"), "{e}");
        assert_eq!(OpSig::new(2, 7, 0, 127, 10).root(), 127);
        assert_eq!(OpSig::new(2, 7, 0, 128, 10), OpSig::new(2, 7, 0, 0, 10), "root is kept modulo 128");
    }
}
