//! NCCL's C ABI types (`#[repr(C)]`, NCCL's names) and their parsed Rust forms.
//!
//! Values coming from C are plain integers until parsed here: a C enum argument may hold any
//! value (PreMulSum operators are dynamic), so nothing crosses the boundary as a Rust enum.
#![allow(non_camel_case_types, non_upper_case_globals, non_snake_case)]

use std::ffi::{c_char, c_int, c_uint, c_void};
use std::fmt;

pub use crate::error::ncclResult_t;
use crate::error::{Error, Result};

/// `ncclDataType_t` as received from C.
#[repr(transparent)]
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct ncclDataType_t(pub c_int);

/// `ncclRedOp_t` as received from C: a built-in operator or a PreMulSum handle (>= 5).
#[repr(transparent)]
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct ncclRedOp_t(pub c_int);

/// `ncclScalarResidence_t` as received from C.
#[repr(transparent)]
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct ncclScalarResidence_t(pub c_int);

/// Opaque communicator as C sees it.
#[repr(C)]
pub struct ncclComm {
    _private: [u8; 0],
}
/// Opaque memory window as C sees it.
#[repr(C)]
pub struct ncclWindow_vidmem {
    _private: [u8; 0],
}
pub type ncclComm_t = *mut ncclComm;
pub type ncclWindow_t = *mut ncclWindow_vidmem;
/// CUDA stream handle (`struct CUstream_st*`); NULL is the legacy default stream.
pub type cudaStream_t = *mut c_void;

pub const NCCL_UNIQUE_ID_BYTES: usize = 128;

/// Opaque 128-byte identifier that ranks share to form a communicator.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct ncclUniqueId {
    pub internal: [c_char; NCCL_UNIQUE_ID_BYTES],
}

impl ncclUniqueId {
    pub fn from_bytes(bytes: &[u8; NCCL_UNIQUE_ID_BYTES]) -> Self {
        let mut internal = [0 as c_char; NCCL_UNIQUE_ID_BYTES];
        for (dst, src) in internal.iter_mut().zip(bytes) {
            *dst = *src as c_char;
        }
        Self { internal }
    }
    pub fn to_bytes(&self) -> [u8; NCCL_UNIQUE_ID_BYTES] {
        let mut out = [0u8; NCCL_UNIQUE_ID_BYTES];
        for (dst, src) in out.iter_mut().zip(self.internal.iter()) {
            *dst = *src as u8;
        }
        out
    }
}

/// Communicator configuration, NCCL's `ncclConfig_v23000` layout (96 bytes on LP64).
///
/// Callers built against older headers pass a shorter struct: see [`crate::config`] for how
/// `size` and `version` are honoured.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct ncclConfig_t {
    pub size: usize,
    pub magic: c_uint,
    pub version: c_uint,
    pub blocking: c_int,
    pub cgaClusterSize: c_int,
    pub minCTAs: c_int,
    pub maxCTAs: c_int,
    pub netName: *const c_char,
    pub splitShare: c_int,
    pub trafficClass: c_int,
    pub commName: *const c_char,
    pub collnetEnable: c_int,
    pub CTAPolicy: c_int,
    pub shrinkShare: c_int,
    pub nvlsCTAs: c_int,
    pub nChannelsPerNetPeer: c_int,
    pub nvlinkCentricSched: c_int,
    pub graphUsageMode: c_int,
    pub numRmaCtx: c_int,
    pub maxP2pPeers: c_int,
    pub graphStreamOrdering: c_int,
}

/// Simulation info for `ncclGroupSimulateEnd`.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct ncclSimInfo_t {
    pub size: usize,
    pub magic: c_uint,
    pub version: c_uint,
    pub estimatedTime: f32,
}

/// Process-wide encryption settings for `ncclSetEncryption` (NCCL 2.32).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct ncclEncryptionConfig_t {
    pub size: usize,
    pub magic: c_uint,
    pub version: c_uint,
    /// `NCCL_ENCRYPTION_MODE_NONE` (0) or `NCCL_ENCRYPTION_MODE_PSK` (1).
    pub mode: c_int,
    /// NUL-terminated pre-shared key of at least 32 bytes (mode PSK).
    pub psk: *const c_char,
}

/// `NCCL_API_MAGIC`: marks an initialised config struct.
pub const NCCL_API_MAGIC: c_uint = 0xcafe_beef;
pub const NCCL_SIM_INFO_MAGIC: c_uint = 0x7468_5283;
pub const NCCL_CONFIG_UNDEF_INT: c_int = c_int::MIN;
pub const NCCL_SPLIT_NOCOLOR: c_int = -1;
pub const NCCL_ENCRYPTION_MODE_NONE: c_int = 0;
pub const NCCL_ENCRYPTION_MODE_PSK: c_int = 1;

/// An element type, parsed from `ncclDataType_t`.
#[derive(Clone, Copy, PartialEq, Eq, Debug, Hash)]
pub enum DataType {
    Int8,
    Uint8,
    Int32,
    Uint32,
    Int64,
    Uint64,
    Float16,
    Float32,
    Float64,
    Bfloat16,
    Float8e4m3,
    Float8e5m2,
}

impl DataType {
    pub const ALL: [DataType; 12] = [
        DataType::Int8,
        DataType::Uint8,
        DataType::Int32,
        DataType::Uint32,
        DataType::Int64,
        DataType::Uint64,
        DataType::Float16,
        DataType::Float32,
        DataType::Float64,
        DataType::Bfloat16,
        DataType::Float8e4m3,
        DataType::Float8e5m2,
    ];

    /// Bytes per element.
    pub const fn size(self) -> usize {
        match self {
            DataType::Int8 | DataType::Uint8 | DataType::Float8e4m3 | DataType::Float8e5m2 => 1,
            DataType::Float16 | DataType::Bfloat16 => 2,
            DataType::Int32 | DataType::Uint32 | DataType::Float32 => 4,
            DataType::Int64 | DataType::Uint64 | DataType::Float64 => 8,
        }
    }

    pub const fn is_float(self) -> bool {
        !matches!(
            self,
            DataType::Int8 | DataType::Uint8 | DataType::Int32 | DataType::Uint32 | DataType::Int64 | DataType::Uint64
        )
    }

    /// NCCL's short name, as nccl-tests prints it.
    pub const fn name(self) -> &'static str {
        match self {
            DataType::Int8 => "int8",
            DataType::Uint8 => "uint8",
            DataType::Int32 => "int32",
            DataType::Uint32 => "uint32",
            DataType::Int64 => "int64",
            DataType::Uint64 => "uint64",
            DataType::Float16 => "half",
            DataType::Float32 => "float",
            DataType::Float64 => "double",
            DataType::Bfloat16 => "bfloat16",
            DataType::Float8e4m3 => "f8e4m3",
            DataType::Float8e5m2 => "f8e5m2",
        }
    }

    pub const fn to_raw(self) -> ncclDataType_t {
        ncclDataType_t(self as c_int)
    }
}

impl TryFrom<ncclDataType_t> for DataType {
    type Error = Error;
    fn try_from(raw: ncclDataType_t) -> Result<Self> {
        usize::try_from(raw.0)
            .ok()
            .and_then(|i| DataType::ALL.get(i).copied())
            .ok_or_else(|| Error::invalid_argument(format!("invalid data type {}", raw.0)))
    }
}

impl fmt::Display for DataType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A built-in reduction operator.
#[derive(Clone, Copy, PartialEq, Eq, Debug, Hash)]
pub enum BuiltinOp {
    Sum,
    Prod,
    Max,
    Min,
    Avg,
}

impl BuiltinOp {
    pub const ALL: [BuiltinOp; 5] = [BuiltinOp::Sum, BuiltinOp::Prod, BuiltinOp::Max, BuiltinOp::Min, BuiltinOp::Avg];

    pub const fn name(self) -> &'static str {
        match self {
            BuiltinOp::Sum => "sum",
            BuiltinOp::Prod => "prod",
            BuiltinOp::Max => "max",
            BuiltinOp::Min => "min",
            BuiltinOp::Avg => "avg",
        }
    }

    pub const fn to_raw(self) -> ncclRedOp_t {
        ncclRedOp_t(self as c_int)
    }

    pub fn from_raw(raw: ncclRedOp_t) -> Option<Self> {
        usize::try_from(raw.0).ok().and_then(|i| Self::ALL.get(i).copied())
    }
}

/// Number of built-in operators; the smallest dynamic (PreMulSum) handle.
pub const NCCL_NUM_OPS: c_int = 5;

#[cfg(test)]
mod tests {
    use super::*;
    use std::mem::{offset_of, size_of};

    #[test]
    fn abi_sizes_and_offsets_match_nccl() {
        assert_eq!(size_of::<ncclUniqueId>(), 128);
        assert_eq!(size_of::<ncclConfig_t>(), 96);
        assert_eq!(offset_of!(ncclConfig_t, netName), 32);
        assert_eq!(offset_of!(ncclConfig_t, commName), 48);
        assert_eq!(offset_of!(ncclConfig_t, collnetEnable), 56);
        assert_eq!(offset_of!(ncclConfig_t, nvlsCTAs), 68);
        assert_eq!(offset_of!(ncclConfig_t, nChannelsPerNetPeer), 72);
        assert_eq!(offset_of!(ncclConfig_t, graphStreamOrdering), 92);
        assert_eq!(size_of::<ncclSimInfo_t>(), 24);
        assert_eq!(size_of::<ncclEncryptionConfig_t>(), 32);
        assert_eq!(offset_of!(ncclEncryptionConfig_t, psk), 24);
        assert_eq!(size_of::<ncclResult_t>(), 4);
    }

    #[test]
    fn enum_values_match_nccl() {
        assert_eq!(ncclResult_t::ncclTimeout.0, 8);
        assert_eq!(ncclResult_t::ncclNumResults.0, 9);
        assert_eq!(DataType::Float16 as i32, 6);
        assert_eq!(DataType::Bfloat16 as i32, 9);
        assert_eq!(DataType::Float8e5m2 as i32, 11);
        assert_eq!(BuiltinOp::Avg as i32, 4);
        assert_eq!(NCCL_API_MAGIC, 0xcafebeef);
    }

    #[test]
    fn data_type_parsing_rejects_out_of_range() {
        assert_eq!(DataType::try_from(ncclDataType_t(7)).unwrap(), DataType::Float32);
        assert!(DataType::try_from(ncclDataType_t(12)).is_err());
        assert!(DataType::try_from(ncclDataType_t(-1)).is_err());
    }
}
