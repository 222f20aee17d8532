//! Element types and reduction operators as the benchmark names them (nccl-tests' names), with
//! host conversions to and from `f64` for the data check.

use ferroccl::types::{ncclDataType_t, ncclRedOp_t};
use float8::{F8E4M3, F8E5M2};
use half::{bf16, f16};

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Dtype {
    Int8,
    Uint8,
    Int32,
    Uint32,
    Int64,
    Uint64,
    Half,
    Float,
    Double,
    Bfloat16,
    F8e4m3,
    F8e5m2,
}

impl Dtype {
    /// nccl-tests' order for `-d all`.
    pub const ALL: [Dtype; 12] = [
        Dtype::Int8,
        Dtype::Uint8,
        Dtype::Int32,
        Dtype::Uint32,
        Dtype::Int64,
        Dtype::Uint64,
        Dtype::Half,
        Dtype::Float,
        Dtype::Double,
        Dtype::Bfloat16,
        Dtype::F8e4m3,
        Dtype::F8e5m2,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Dtype::Int8 => "int8",
            Dtype::Uint8 => "uint8",
            Dtype::Int32 => "int32",
            Dtype::Uint32 => "uint32",
            Dtype::Int64 => "int64",
            Dtype::Uint64 => "uint64",
            Dtype::Half => "half",
            Dtype::Float => "float",
            Dtype::Double => "double",
            Dtype::Bfloat16 => "bfloat16",
            Dtype::F8e4m3 => "f8e4m3",
            Dtype::F8e5m2 => "f8e5m2",
        }
    }

    /// Accepts nccl-tests' names and NCCL's aliases.
    pub fn parse(s: &str) -> Option<Dtype> {
        Some(match s {
            "int8" | "char" => Dtype::Int8,
            "uint8" => Dtype::Uint8,
            "int32" | "int" => Dtype::Int32,
            "uint32" => Dtype::Uint32,
            "int64" => Dtype::Int64,
            "uint64" => Dtype::Uint64,
            "half" | "float16" | "fp16" => Dtype::Half,
            "float" | "float32" | "fp32" => Dtype::Float,
            "double" | "float64" | "fp64" => Dtype::Double,
            "bfloat16" | "bf16" => Dtype::Bfloat16,
            "f8e4m3" | "fp8_e4m3" | "float8e4m3" => Dtype::F8e4m3,
            "f8e5m2" | "fp8_e5m2" | "float8e5m2" => Dtype::F8e5m2,
            _ => return None,
        })
    }

    /// `ncclDataType_t` value (nccl.h).
    pub fn nccl(self) -> ncclDataType_t {
        ncclDataType_t(match self {
            Dtype::Int8 => 0,
            Dtype::Uint8 => 1,
            Dtype::Int32 => 2,
            Dtype::Uint32 => 3,
            Dtype::Int64 => 4,
            Dtype::Uint64 => 5,
            Dtype::Half => 6,
            Dtype::Float => 7,
            Dtype::Double => 8,
            Dtype::Bfloat16 => 9,
            Dtype::F8e4m3 => 10,
            Dtype::F8e5m2 => 11,
        })
    }

    pub fn size(self) -> usize {
        match self {
            Dtype::Int8 | Dtype::Uint8 | Dtype::F8e4m3 | Dtype::F8e5m2 => 1,
            Dtype::Half | Dtype::Bfloat16 => 2,
            Dtype::Int32 | Dtype::Uint32 | Dtype::Float => 4,
            Dtype::Int64 | Dtype::Uint64 | Dtype::Double => 8,
        }
    }

    pub fn is_float(self) -> bool {
        matches!(self, Dtype::Half | Dtype::Float | Dtype::Double | Dtype::Bfloat16 | Dtype::F8e4m3 | Dtype::F8e5m2)
    }

    pub fn is_signed(self) -> bool {
        !matches!(self, Dtype::Uint8 | Dtype::Uint32 | Dtype::Uint64)
    }

    /// Largest integer M such that every integer in [-M, M] (signed) or [0, M] (unsigned) is
    /// exactly representable: the budget the data check keeps every partial result within.
    pub fn exact_int_limit(self) -> u64 {
        match self {
            Dtype::Int8 => 127,
            Dtype::Uint8 => 255,
            Dtype::Int32 => i32::MAX as u64,
            Dtype::Uint32 => u32::MAX as u64,
            Dtype::Int64 => i64::MAX as u64,
            Dtype::Uint64 => u64::MAX,
            Dtype::Half => 1 << 11,
            Dtype::Float => 1 << 24,
            Dtype::Double => 1 << 53,
            Dtype::Bfloat16 => 1 << 8,
            Dtype::F8e4m3 => 16,
            Dtype::F8e5m2 => 8,
        }
    }

    /// Relative tolerance of the float `avg` check (every other check is bit-exact); see
    /// `Check::avg_tolerance` for the rounding bound it is combined with.
    pub fn avg_tolerance(self) -> f64 {
        match self {
            Dtype::Float | Dtype::Double => 1e-6,
            Dtype::Half | Dtype::Bfloat16 | Dtype::F8e4m3 | Dtype::F8e5m2 => 1e-2,
            _ => 0.0,
        }
    }

    /// Explicit mantissa bits of a floating-point type (0 for integers).
    pub fn mantissa_bits(self) -> i32 {
        match self {
            Dtype::Half => 10,
            Dtype::Float => 23,
            Dtype::Double => 52,
            Dtype::Bfloat16 => 7,
            Dtype::F8e4m3 => 3,
            Dtype::F8e5m2 => 2,
            _ => 0,
        }
    }

    /// One unit in the last place at magnitude `x` (> 0), ignoring subnormals.
    pub fn ulp(self, x: f64) -> f64 {
        2f64.powi(x.log2().floor() as i32 - self.mantissa_bits())
    }

    /// Writes `v` (an exactly representable value, or rounded to nearest for floats) into `out`.
    #[inline]
    pub fn encode(self, v: f64, out: &mut [u8]) {
        match self {
            Dtype::Int8 => out[0] = (v as i8) as u8,
            Dtype::Uint8 => out[0] = v as u8,
            Dtype::Int32 => out[..4].copy_from_slice(&(v as i32).to_ne_bytes()),
            Dtype::Uint32 => out[..4].copy_from_slice(&(v as u32).to_ne_bytes()),
            Dtype::Int64 => out[..8].copy_from_slice(&(v as i64).to_ne_bytes()),
            Dtype::Uint64 => out[..8].copy_from_slice(&(v as u64).to_ne_bytes()),
            Dtype::Half => out[..2].copy_from_slice(&f16::from_f64(v).to_bits().to_ne_bytes()),
            Dtype::Float => out[..4].copy_from_slice(&(v as f32).to_ne_bytes()),
            Dtype::Double => out[..8].copy_from_slice(&v.to_ne_bytes()),
            Dtype::Bfloat16 => out[..2].copy_from_slice(&bf16::from_f64(v).to_bits().to_ne_bytes()),
            Dtype::F8e4m3 => out[0] = F8E4M3::from_f64(v).to_bits(),
            Dtype::F8e5m2 => out[0] = F8E5M2::from_f64(v).to_bits(),
        }
    }

    #[inline]
    pub fn decode(self, b: &[u8]) -> f64 {
        match self {
            Dtype::Int8 => b[0] as i8 as f64,
            Dtype::Uint8 => b[0] as f64,
            Dtype::Int32 => i32::from_ne_bytes(b[..4].try_into().unwrap()) as f64,
            Dtype::Uint32 => u32::from_ne_bytes(b[..4].try_into().unwrap()) as f64,
            Dtype::Int64 => i64::from_ne_bytes(b[..8].try_into().unwrap()) as f64,
            Dtype::Uint64 => u64::from_ne_bytes(b[..8].try_into().unwrap()) as f64,
            Dtype::Half => f16::from_bits(u16::from_ne_bytes(b[..2].try_into().unwrap())).to_f64(),
            Dtype::Float => f32::from_ne_bytes(b[..4].try_into().unwrap()) as f64,
            Dtype::Double => f64::from_ne_bytes(b[..8].try_into().unwrap()),
            Dtype::Bfloat16 => bf16::from_bits(u16::from_ne_bytes(b[..2].try_into().unwrap())).to_f64(),
            Dtype::F8e4m3 => F8E4M3::from_bits(b[0]).to_f64(),
            Dtype::F8e5m2 => F8E5M2::from_bits(b[0]).to_f64(),
        }
    }
}

/// A reduction as nccl-tests names it; `MulSum` is a PreMulSum operator created per call.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Op {
    Sum,
    Prod,
    Max,
    Min,
    Avg,
    MulSum,
}

impl Op {
    /// nccl-tests' order for `-o all`.
    pub const ALL: [Op; 6] = [Op::Sum, Op::Prod, Op::Max, Op::Min, Op::Avg, Op::MulSum];

    pub fn name(self) -> &'static str {
        match self {
            Op::Sum => "sum",
            Op::Prod => "prod",
            Op::Max => "max",
            Op::Min => "min",
            Op::Avg => "avg",
            Op::MulSum => "mulsum",
        }
    }

    pub fn parse(s: &str) -> Option<Op> {
        Op::ALL.into_iter().find(|o| o.name() == s)
    }

    /// The built-in `ncclRedOp_t` (None for MulSum, which is created at run time).
    pub fn builtin(self) -> Option<ncclRedOp_t> {
        Some(ncclRedOp_t(match self {
            Op::Sum => 0,
            Op::Prod => 1,
            Op::Max => 2,
            Op::Min => 3,
            Op::Avg => 4,
            Op::MulSum => return None,
        }))
    }
}

/// nccl-tests' PreMulSum scalar: 1 on even ranks, 2 on odd ranks.
pub fn premul_scalar(rank: usize) -> f64 {
    1.0 + (rank % 2) as f64
}
