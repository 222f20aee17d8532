//! Element-wise reduction kernels on host memory, for all of NCCL's data types and operators.
//!
//! A bottom layer (it uses only `types` and `error`): the transports apply reductions as data
//! lands, the collectives' executor and the communicator's operator table use them, and CUDA
//! kernels will join here as siblings of the host ones. `coll::reduce` re-exports this module.
//!
//! The executor sees a reduction as [`Reduction`]: an operator ([`ReduceKind`]) plus NCCL's two
//! extra steps, a `pre` multiply applied once to each rank's own input (PreMulSum, and `ncclAvg`
//! on floating-point types) and a `post` divide applied once to the final result (`ncclAvg` on
//! integer types). See `coll::plan` for where each entry point is used.
//!
//! # Arithmetic
//! Results are bit-exact and deterministic, so every rank computes the same bytes:
//! - Integers wrap around on sum, product and the PreMulSum multiply; the integer average is
//!   the wrapping sum divided by the rank count, truncating toward zero (signed for signed types).
//! - `f32` and `f64` use native IEEE arithmetic (round to nearest even).
//! - `f16`, `bf16`, fp8 e4m3 and fp8 e5m2 are widened to `f32` (exactly), computed in `f32`, and
//!   rounded back once, to nearest even. For +, × of two values of these types this equals the
//!   correctly rounded result in the narrow type (f32 has at least 2p+2 significand bits, so the
//!   double rounding is innocuous), which is what the GPU's native half/bf16 operations give. fp8 rounding follows CUDA's `__NV_SATFINITE`: a finite
//!   value beyond the largest finite one becomes ±max finite (±448 for e4m3, ±57344 for e5m2),
//!   except that for e5m2 an infinite result stays ±Inf (Inf inputs propagate). e4m3 has no Inf.
//! - PreMulSum in the narrow float types: `pre(x) = round(f32(x) * f32(s))` is rounded into the
//!   type once, then `incoming + pre(x)` is computed in `f32` and rounded again.
//! - NaN: every operator, max and min included, returns NaN when either operand is NaN, and every
//!   NaN a kernel produces is the type's canonical quiet NaN (f32 `0x7fc00000`, f64
//!   `0x7ff8000000000000`, f16 `0x7e00`, bf16 `0x7fc0`, e4m3 `0x7f`, e5m2 `0x7e`), so operand order
//!   and NaN payloads never change the bits.
//! - Signed zeros: `max(+0, -0) = +0` and `min(+0, -0) = -0`, whatever the order.
//!
//! Every binary operator is therefore commutative bit-for-bit, which matters because ranks fold
//! partial results in different orders. (Float sums are of course not associative: the plan, not
//! this module, must fix one combining order per element for all ranks to agree.)
//!
//! # Memory and speed
//! Buffers are plain byte slices in native byte order with no alignment requirement: elements
//! are read with `from_ne_bytes` over `chunks_exact`, which the compiler turns into unaligned
//! vector loads, so aligned and unaligned data take the same path and no `unsafe` is needed.
//! The narrow-float conversions are written without data-dependent branches (and without the
//! `half`/`float8` per-element calls, which are not vectorizable or check CPU features per
//! element), so every kernel auto-vectorizes on the baseline x86-64 target. The tests check the
//! conversions against `half` and `float8` (all 2^32 f32 inputs in an ignored test).

use crate::error::{Error, Result};
use crate::types::{BuiltinOp, DataType};

/// Calls `$f::<T>($args)` with `T` the element type of `$dtype`.
macro_rules! dispatch {
    ($dtype:expr, $f:ident($($arg:expr),*)) => {
        match $dtype {
            DataType::Int8 => $f::<i8>($($arg),*),
            DataType::Uint8 => $f::<u8>($($arg),*),
            DataType::Int32 => $f::<i32>($($arg),*),
            DataType::Uint32 => $f::<u32>($($arg),*),
            DataType::Int64 => $f::<i64>($($arg),*),
            DataType::Uint64 => $f::<u64>($($arg),*),
            DataType::Float16 => $f::<F16>($($arg),*),
            DataType::Float32 => $f::<f32>($($arg),*),
            DataType::Float64 => $f::<f64>($($arg),*),
            DataType::Bfloat16 => $f::<Bf16>($($arg),*),
            DataType::Float8e4m3 => $f::<E4m3>($($arg),*),
            DataType::Float8e5m2 => $f::<E5m2>($($arg),*),
        }
    };
}

/// A reduction as the executor applies it: the operator plus NCCL's pre/post steps.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Reduction {
    pub dtype: DataType,
    pub kind: ReduceKind,
    pub pre: Pre,
    pub post: Post,
}

/// The binary operator that folds two values.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReduceKind {
    Sum,
    Prod,
    Max,
    Min,
}

/// Applied once to each rank's own input when it enters the reduction.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Pre {
    None,
    /// Multiply by a scalar of `dtype`, stored as its raw native-endian bytes (the first
    /// `dtype.size()` bytes are used; the rest are zero).
    Mul([u8; 8]),
}

/// Applied once to the final result.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Post {
    None,
    /// Integer average: divide by the rank count (truncating toward zero).
    Div(u64),
}

impl Reduction {
    /// Built-in operator for `nranks` ranks.
    ///
    /// Avg on float types (f16, bf16, fp8, f32, f64) is PreMulSum with the scalar `1/nranks` in
    /// the type, as NCCL does: the scalar is `(1.0f64 / nranks) as f32`, then rounded into the
    /// type (f64 uses `1.0 / nranks` directly). Avg on integer types is Sum with
    /// `Post::Div(nranks)`. An `nranks` of 0 is treated as 1.
    pub fn builtin(dtype: DataType, op: BuiltinOp, nranks: usize) -> Reduction {
        let plain = |kind| Reduction { dtype, kind, pre: Pre::None, post: Post::None };
        match op {
            BuiltinOp::Sum => plain(ReduceKind::Sum),
            BuiltinOp::Prod => plain(ReduceKind::Prod),
            BuiltinOp::Max => plain(ReduceKind::Max),
            BuiltinOp::Min => plain(ReduceKind::Min),
            BuiltinOp::Avg => {
                let n = nranks.max(1);
                if dtype.is_float() {
                    Reduction { dtype, kind: ReduceKind::Sum, pre: Pre::Mul(avg_scalar(dtype, n)), post: Post::None }
                } else {
                    Reduction { dtype, kind: ReduceKind::Sum, pre: Pre::None, post: Post::Div(n as u64) }
                }
            }
        }
    }

    /// PreMulSum with the scalar given as raw bytes of `dtype` (first `dtype.size()` bytes used).
    pub fn pre_mul_sum(dtype: DataType, scalar: &[u8]) -> Result<Reduction> {
        let size = dtype.size();
        let Some(bytes) = scalar.get(..size) else {
            return Err(Error::invalid_argument(format!(
                "PreMulSum scalar of type {dtype} needs {size} bytes, got {}",
                scalar.len()
            )));
        };
        let mut raw = [0u8; 8];
        raw[..size].copy_from_slice(bytes);
        Ok(Reduction { dtype, kind: ReduceKind::Sum, pre: Pre::Mul(raw), post: Post::None })
    }

    /// Whether [`Reduction::prepare`] does anything beyond a copy.
    pub fn has_pre(&self) -> bool {
        self.pre != Pre::None
    }

    /// Whether [`Reduction::finalize`] does anything.
    pub fn has_post(&self) -> bool {
        self.post != Post::None
    }

    /// `dst = incoming (op) pre(local)`.
    ///
    /// All three lengths must be equal and a multiple of `dtype.size()`, else
    /// `Err(Error::Internal)` (the executor's slices disagree: a ferroccl bug).
    pub fn combine(&self, dst: &mut [u8], incoming: &[u8], local: &[u8]) -> Result<()> {
        self.check("combine", dst.len(), &[incoming.len(), local.len()])?;
        dispatch!(self.dtype, combine_t(self, dst, incoming, local));
        Ok(())
    }

    /// Same with `local == dst` (in place): `dst = incoming (op) pre(dst)`.
    pub fn combine_in_place(&self, dst: &mut [u8], incoming: &[u8]) -> Result<()> {
        self.check("combine", dst.len(), &[incoming.len()])?;
        dispatch!(self.dtype, combine_in_place_t(self, dst, incoming));
        Ok(())
    }

    /// `dst = dst (op) incoming`: merge two partial results (no `pre`).
    pub fn accumulate(&self, dst: &mut [u8], incoming: &[u8]) -> Result<()> {
        self.check("accumulate", dst.len(), &[incoming.len()])?;
        dispatch!(self.dtype, accumulate_t(self.kind, dst, incoming));
        Ok(())
    }

    /// `dst = pre(src)` (a plain copy when there is no `pre`).
    pub fn prepare(&self, dst: &mut [u8], src: &[u8]) -> Result<()> {
        self.check("prepare", dst.len(), &[src.len()])?;
        match self.pre {
            Pre::None => crate::memcopy::copy(dst, src),
            Pre::Mul(s) => dispatch!(self.dtype, prepare_t(s, dst, src)),
        }
        Ok(())
    }

    /// `buf = pre(buf)`.
    pub fn prepare_in_place(&self, buf: &mut [u8]) -> Result<()> {
        self.check("prepare", buf.len(), &[])?;
        if let Pre::Mul(s) = self.pre {
            dispatch!(self.dtype, prepare_in_place_t(s, buf));
        }
        Ok(())
    }

    /// `buf = post(buf)`.
    pub fn finalize(&self, buf: &mut [u8]) -> Result<()> {
        self.check("finalize", buf.len(), &[])?;
        if let Post::Div(n) = self.post {
            if n == 0 {
                return Err(Error::internal("reduction post-divide by zero ranks"));
            }
            dispatch!(self.dtype, finalize_t(n, buf));
        }
        Ok(())
    }

    fn check(&self, what: &str, len: usize, others: &[usize]) -> Result<()> {
        let size = self.dtype.size();
        if others.iter().any(|&l| l != len) {
            return Err(Error::internal(format!(
                "reduction {what}: buffer lengths differ ({len} vs {others:?} bytes)"
            )));
        }
        if len % size != 0 {
            return Err(Error::internal(format!(
                "reduction {what}: {len} bytes is not a whole number of {} elements",
                self.dtype
            )));
        }
        Ok(())
    }
}

/// The raw bytes of `1/n` in a float type, computed like NCCL's host code.
fn avg_scalar(dtype: DataType, n: usize) -> [u8; 8] {
    let inv = 1.0f64 / n as f64;
    let mut raw = [0u8; 8];
    match dtype {
        DataType::Float64 => raw.copy_from_slice(&inv.to_ne_bytes()),
        DataType::Float32 => raw[..4].copy_from_slice(&(inv as f32).to_ne_bytes()),
        DataType::Float16 => raw[..2].copy_from_slice(&f32_to_f16(inv as f32).to_ne_bytes()),
        DataType::Bfloat16 => raw[..2].copy_from_slice(&f32_to_bf16(inv as f32).to_ne_bytes()),
        DataType::Float8e4m3 => raw[0] = f32_to_e4m3(inv as f32),
        DataType::Float8e5m2 => raw[0] = f32_to_e5m2(inv as f32),
        _ => unreachable!("avg_scalar on integer type {dtype}"),
    }
    raw
}

// ---------------------------------------------------------------------------------------------
// Element types.

/// One element type: how it is stored and its arithmetic (see the module documentation).
trait Elem: Copy {
    const SIZE: usize;
    /// Reads one element from exactly `SIZE` bytes.
    fn load(bytes: &[u8]) -> Self;
    /// Writes one element into exactly `SIZE` bytes.
    fn store(self, bytes: &mut [u8]);
    fn sum_with(self, other: Self) -> Self;
    fn prod_with(self, other: Self) -> Self;
    fn max_with(self, other: Self) -> Self;
    fn min_with(self, other: Self) -> Self;
    /// Division by a rank count `n > 0`.
    fn div_by(self, n: u64) -> Self;
}

macro_rules! int_elem {
    ($($t:ty => $wide:ty, $narrow_div:expr);*) => {$(
        impl Elem for $t {
            const SIZE: usize = size_of::<$t>();
            #[inline(always)]
            fn load(bytes: &[u8]) -> Self {
                <$t>::from_ne_bytes(bytes.try_into().expect("element size"))
            }
            #[inline(always)]
            fn store(self, bytes: &mut [u8]) {
                bytes.copy_from_slice(&self.to_ne_bytes());
            }
            #[inline(always)]
            fn sum_with(self, other: Self) -> Self {
                self.wrapping_add(other)
            }
            #[inline(always)]
            fn prod_with(self, other: Self) -> Self {
                self.wrapping_mul(other)
            }
            #[inline(always)]
            fn max_with(self, other: Self) -> Self {
                Ord::max(self, other)
            }
            #[inline(always)]
            fn min_with(self, other: Self) -> Self {
                Ord::min(self, other)
            }
            #[inline(always)]
            fn div_by(self, n: u64) -> Self {
                if $narrow_div {
                    // |self| < 2^32: the f64 quotient is within 2^-21/n of the true one, which is
                    // at least 1/n away from any integer it is not equal to, so truncating it
                    // gives the exact integer quotient (and vectorizes, unlike integer division).
                    (self as f64 / n as f64) as $t
                } else {
                    match <$t>::try_from(n) {
                        // n > 0, so this cannot overflow (signed MIN / -1 would need n = -1).
                        Ok(d) => self / d,
                        // n is beyond the type's range: the quotient still fits, computed wide.
                        Err(_) => (self as $wide / n as $wide) as $t,
                    }
                }
            }
        }
    )*};
}
// (type => wide type for huge divisors, whether its quotient may be computed in f64)
int_elem!(
    i8 => i128, true;
    u8 => u128, true;
    i32 => i128, true;
    u32 => u128, true;
    i64 => i128, false;
    u64 => u128, false
);

/// The canonical quiet NaNs that every f32 / f64 kernel returns in place of any NaN.
const NAN32: f32 = f32::from_bits(0x7fc0_0000);
const NAN64: f64 = f64::from_bits(0x7ff8_0000_0000_0000);

macro_rules! float_elem {
    ($($t:ty, $nan:expr);*) => {$(
        impl Elem for $t {
            const SIZE: usize = size_of::<$t>();
            #[inline(always)]
            fn load(bytes: &[u8]) -> Self {
                <$t>::from_ne_bytes(bytes.try_into().expect("element size"))
            }
            #[inline(always)]
            fn store(self, bytes: &mut [u8]) {
                bytes.copy_from_slice(&self.to_ne_bytes());
            }
            #[inline(always)]
            fn sum_with(self, other: Self) -> Self {
                let r = self + other;
                if r.is_nan() { $nan } else { r }
            }
            #[inline(always)]
            fn prod_with(self, other: Self) -> Self {
                let r = self * other;
                if r.is_nan() { $nan } else { r }
            }
            #[inline(always)]
            fn max_with(self, other: Self) -> Self {
                // Equal values have equal bits except for +0/-0, where AND gives +0.
                let eq = <$t>::from_bits(self.to_bits() & other.to_bits());
                let m = if other > self { other } else { eq };
                let m = if self > other { self } else { m };
                if self.is_nan() | other.is_nan() { $nan } else { m }
            }
            #[inline(always)]
            fn min_with(self, other: Self) -> Self {
                // Equal values have equal bits except for +0/-0, where OR gives -0.
                let eq = <$t>::from_bits(self.to_bits() | other.to_bits());
                let m = if other < self { other } else { eq };
                let m = if self < other { self } else { m };
                if self.is_nan() | other.is_nan() { $nan } else { m }
            }
            #[inline(always)]
            fn div_by(self, n: u64) -> Self {
                let r = self / n as $t;
                if r.is_nan() { $nan } else { r }
            }
        }
    )*};
}
float_elem!(f32, NAN32; f64, NAN64);

/// A narrow float type computed in f32: widening is exact, narrowing rounds to nearest even.
trait Narrow: Copy {
    const SIZE: usize;
    fn from_raw(bytes: &[u8]) -> Self;
    fn to_raw(self, bytes: &mut [u8]);
    fn widen(self) -> f32;
    /// Round an f32 to nearest even; every NaN becomes the type's canonical NaN.
    fn narrow(x: f32) -> Self;
}

impl<T: Narrow> Elem for T {
    const SIZE: usize = <T as Narrow>::SIZE;
    #[inline(always)]
    fn load(bytes: &[u8]) -> Self {
        T::from_raw(bytes)
    }
    #[inline(always)]
    fn store(self, bytes: &mut [u8]) {
        self.to_raw(bytes)
    }
    #[inline(always)]
    fn sum_with(self, other: Self) -> Self {
        // `narrow` canonicalises NaN, so the f32 step may leave any NaN.
        T::narrow(self.widen() + other.widen())
    }
    #[inline(always)]
    fn prod_with(self, other: Self) -> Self {
        T::narrow(self.widen() * other.widen())
    }
    #[inline(always)]
    fn max_with(self, other: Self) -> Self {
        T::narrow(Elem::max_with(self.widen(), other.widen()))
    }
    #[inline(always)]
    fn min_with(self, other: Self) -> Self {
        T::narrow(Elem::min_with(self.widen(), other.widen()))
    }
    #[inline(always)]
    fn div_by(self, n: u64) -> Self {
        T::narrow(self.widen() / n as f32)
    }
}

/// IEEE binary16, as raw bits.
#[derive(Clone, Copy)]
struct F16(u16);
/// bfloat16, as raw bits.
#[derive(Clone, Copy)]
struct Bf16(u16);
/// fp8 e4m3 (OCP "fn": no Inf, NaN is 0x7f/0xff), as raw bits.
#[derive(Clone, Copy)]
struct E4m3(u8);
/// fp8 e5m2 (IEEE-like: Inf 0x7c, NaN 0x7d-0x7f), as raw bits.
#[derive(Clone, Copy)]
struct E5m2(u8);

impl Narrow for F16 {
    const SIZE: usize = 2;
    #[inline(always)]
    fn from_raw(bytes: &[u8]) -> Self {
        F16(u16::from_ne_bytes(bytes.try_into().expect("element size")))
    }
    #[inline(always)]
    fn to_raw(self, bytes: &mut [u8]) {
        bytes.copy_from_slice(&self.0.to_ne_bytes())
    }
    #[inline(always)]
    fn widen(self) -> f32 {
        f16_to_f32(self.0)
    }
    #[inline(always)]
    fn narrow(x: f32) -> Self {
        F16(f32_to_f16(x))
    }
}

impl Narrow for Bf16 {
    const SIZE: usize = 2;
    #[inline(always)]
    fn from_raw(bytes: &[u8]) -> Self {
        Bf16(u16::from_ne_bytes(bytes.try_into().expect("element size")))
    }
    #[inline(always)]
    fn to_raw(self, bytes: &mut [u8]) {
        bytes.copy_from_slice(&self.0.to_ne_bytes())
    }
    #[inline(always)]
    fn widen(self) -> f32 {
        f32::from_bits((self.0 as u32) << 16)
    }
    #[inline(always)]
    fn narrow(x: f32) -> Self {
        Bf16(f32_to_bf16(x))
    }
}

impl Narrow for E4m3 {
    const SIZE: usize = 1;
    #[inline(always)]
    fn from_raw(bytes: &[u8]) -> Self {
        E4m3(bytes[0])
    }
    #[inline(always)]
    fn to_raw(self, bytes: &mut [u8]) {
        bytes[0] = self.0;
    }
    #[inline(always)]
    fn widen(self) -> f32 {
        e4m3_to_f32(self.0)
    }
    #[inline(always)]
    fn narrow(x: f32) -> Self {
        E4m3(f32_to_e4m3(x))
    }
}

impl Narrow for E5m2 {
    const SIZE: usize = 1;
    #[inline(always)]
    fn from_raw(bytes: &[u8]) -> Self {
        E5m2(bytes[0])
    }
    #[inline(always)]
    fn to_raw(self, bytes: &mut [u8]) {
        bytes[0] = self.0;
    }
    #[inline(always)]
    fn widen(self) -> f32 {
        e5m2_to_f32(self.0)
    }
    #[inline(always)]
    fn narrow(x: f32) -> Self {
        E5m2(f32_to_e5m2(x))
    }
}

// Conversions. Each computes every candidate result and then selects, so that the loops around
// them vectorize; all arithmetic is in f32 on values that are normal f32s, so FTZ/DAZ settings
// of the host process cannot change a result.

/// binary16 to f32, exact (NaN payloads kept). Bit-identical to `half::f16::to_f32` (tested
/// over all 65536 inputs).
#[inline(always)]
fn f16_to_f32(h: u16) -> f32 {
    const SHIFTED_EXP: u32 = 0x7c00 << 13;
    // 2^-14, the smallest normal f16.
    const MAGIC: u32 = 113 << 23;
    let h = h as u32;
    let o = (h & 0x7fff) << 13;
    let exp = o & SHIFTED_EXP;
    let normal = o + ((127 - 15) << 23);
    // Inf/NaN: finish the exponent.
    let inf_nan = normal + ((128 - 16) << 23);
    // Zero/subnormal: 2^-14 * (1 + m/1024) - 2^-14 = m * 2^-24, an exact subtraction.
    let subnormal = (f32::from_bits(o + MAGIC) - f32::from_bits(MAGIC)).to_bits();
    let o = if exp == SHIFTED_EXP { inf_nan } else { normal };
    let o = if exp == 0 { subnormal } else { o };
    f32::from_bits(o | ((h & 0x8000) << 16))
}

/// f32 to binary16, rounding to nearest even; overflow gives ±Inf, any NaN gives the canonical
/// NaN 0x7e00. Bit-identical to `half::f16::from_f32` for every non-NaN input (tested over all
/// 2^32 inputs, see `narrowing_exhaustive`).
#[inline(always)]
fn f32_to_f16(x: f32) -> u16 {
    const F32_INF: u32 = 255 << 23;
    // 2^16: at and above this the result is Inf (smaller values that round up to 2^16 reach the
    // Inf encoding through the rounding carry).
    const F16_OVERFLOW: u32 = (127 + 16) << 23;
    // 0.5: adding it puts the 10 subnormal mantissa bits at the bottom of the f32 mantissa.
    const DENORM_MAGIC: u32 = ((127 - 15) + (23 - 10) + 1) << 23;
    let bits = x.to_bits();
    let sign = bits & 0x8000_0000;
    let u = bits ^ sign;
    // Subnormal or zero result: the f32 adder aligns and rounds (to nearest even).
    let subnormal = (f32::from_bits(u) + f32::from_bits(DENORM_MAGIC)).to_bits().wrapping_sub(DENORM_MAGIC);
    // Normal: rebias the exponent and add the rounding bias; a carry rounds into the exponent.
    let mant_odd = (u >> 13) & 1;
    let normal = u.wrapping_add((((15 - 127) << 23) + 0xfff) as u32).wrapping_add(mant_odd) >> 13;
    let o = if u < (113 << 23) { subnormal } else { normal };
    let o = if u >= F16_OVERFLOW { 0x7c00 } else { o };
    let o = o | (sign >> 16);
    (if u > F32_INF { 0x7e00 } else { o }) as u16
}

/// f32 to bfloat16, rounding to nearest even (overflow gives ±Inf); any NaN gives the canonical
/// NaN 0x7fc0. Bit-identical to `half::bf16::from_f32` for every non-NaN input.
#[inline(always)]
fn f32_to_bf16(x: f32) -> u16 {
    let bits = x.to_bits();
    let rounded = bits.wrapping_add(0x7fff + ((bits >> 16) & 1)) >> 16;
    (if x.is_nan() { 0x7fc0 } else { rounded }) as u16
}

/// fp8 e4m3 to f32, exact; 0x7f/0xff decode to a NaN. Agrees with `F8E4M3::to_f32`.
#[inline(always)]
fn e4m3_to_f32(b: u8) -> f32 {
    // 2^-6, the smallest normal e4m3.
    const MAGIC: u32 = 121 << 23;
    let b = b as u32;
    let o = (b & 0x7f) << 20;
    let normal = o + ((127 - 7) << 23);
    let subnormal = (f32::from_bits(o + MAGIC) - f32::from_bits(MAGIC)).to_bits();
    let o = if b & 0x78 == 0 { subnormal } else { normal };
    let o = if b & 0x7f == 0x7f { NAN32.to_bits() } else { o };
    f32::from_bits(o | ((b & 0x80) << 24))
}

/// fp8 e5m2 to f32, exact: e5m2 is the top byte of a binary16.
#[inline(always)]
fn e5m2_to_f32(b: u8) -> f32 {
    f16_to_f32((b as u16) << 8)
}

/// f32 to fp8 e4m3 with CUDA's `__NV_SATFINITE` (`__nv_cvt_float_to_fp8`): nearest even;
/// magnitudes above 464 (the midpoint between 448 and the next power-of-two step) saturate to
/// ±448, Inf included; any NaN gives the canonical NaN 0x7f. Bit-identical to
/// `F8E4M3::from_f32` (which transcribes cuda_fp8.hpp) for every non-NaN f32.
#[inline(always)]
fn f32_to_e4m3(x: f32) -> u8 {
    const SAT_ABOVE: u32 = 0x43e8_0000; // 464.0
    const MIN_NORMAL: u32 = 121 << 23; // 2^-6
    const DENORM_MAGIC: u32 = (127 + 14) << 23; // 2^14: its f32 ulp is 2^-9, the e4m3 step
    let bits = x.to_bits();
    let sign = (bits >> 24) & 0x80;
    let u = bits & 0x7fff_ffff;
    let normal = (u.wrapping_add(0x7_ffff + ((u >> 20) & 1)) >> 20).wrapping_sub((127 - 7) << 3);
    let subnormal = (f32::from_bits(u) + f32::from_bits(DENORM_MAGIC)).to_bits().wrapping_sub(DENORM_MAGIC);
    let o = if u >= MIN_NORMAL { normal } else { subnormal };
    let o = if u > SAT_ABOVE { 0x7e } else { o };
    let o = o | sign;
    (if u > 0x7f80_0000 { 0x7f } else { o }) as u8
}

/// f32 to fp8 e5m2: CUDA's `__NV_SATFINITE` for finite values (nearest even; magnitudes from
/// 61440, the midpoint between 57344 and 65536, saturate to ±57344), but ±Inf stays ±Inf so
/// that infinities propagate through a reduction. Any NaN gives the canonical NaN 0x7e. Equal
/// to `F8E5M2::from_f32` for every non-NaN f32 except ±Inf.
#[inline(always)]
fn f32_to_e5m2(x: f32) -> u8 {
    const SAT_FROM: u32 = 0x4770_0000; // 61440.0
    const MIN_NORMAL: u32 = 113 << 23; // 2^-14
    const DENORM_MAGIC: u32 = (127 + 7) << 23; // 2^7: its f32 ulp is 2^-16, the e5m2 step
    let bits = x.to_bits();
    let sign = (bits >> 24) & 0x80;
    let u = bits & 0x7fff_ffff;
    let normal = (u.wrapping_add(0xf_ffff + ((u >> 21) & 1)) >> 21).wrapping_sub((127 - 15) << 2);
    let subnormal = (f32::from_bits(u) + f32::from_bits(DENORM_MAGIC)).to_bits().wrapping_sub(DENORM_MAGIC);
    let o = if u >= MIN_NORMAL { normal } else { subnormal };
    let o = if u >= SAT_FROM { 0x7b } else { o };
    let o = if u == 0x7f80_0000 { 0x7c } else { o };
    let o = o | sign;
    (if u > 0x7f80_0000 { 0x7e } else { o }) as u8
}

// ---------------------------------------------------------------------------------------------
// Kernels. Lengths are checked by the caller (equal, whole elements).

/// The `pre` step as a type, so that the no-pre kernels carry no multiply.
trait PreOp<T>: Copy {
    fn apply(self, x: T) -> T;
}

#[derive(Clone, Copy)]
struct NoPre;

impl<T> PreOp<T> for NoPre {
    #[inline(always)]
    fn apply(self, x: T) -> T {
        x
    }
}

#[derive(Clone, Copy)]
struct MulPre<T>(T);

impl<T: Elem> PreOp<T> for MulPre<T> {
    #[inline(always)]
    fn apply(self, x: T) -> T {
        x.prod_with(self.0)
    }
}

fn scalar<T: Elem>(raw: [u8; 8]) -> MulPre<T> {
    MulPre(T::load(&raw[..T::SIZE]))
}

// The four loops below are kept out of line: inlined into the big dispatching functions, LLVM
// stops vectorizing the narrow-float bodies (f16 ran at a third of the speed).

/// `dst[i] = f(a[i], b[i])`.
#[inline(never)]
fn zip3<T: Elem>(dst: &mut [u8], a: &[u8], b: &[u8], f: impl Fn(T, T) -> T) {
    let n = T::SIZE;
    for ((d, x), y) in dst.chunks_exact_mut(n).zip(a.chunks_exact(n)).zip(b.chunks_exact(n)) {
        f(T::load(x), T::load(y)).store(d);
    }
}

/// `dst[i] = f(dst[i], a[i])`.
#[inline(never)]
fn zip2<T: Elem>(dst: &mut [u8], a: &[u8], f: impl Fn(T, T) -> T) {
    let n = T::SIZE;
    for (d, x) in dst.chunks_exact_mut(n).zip(a.chunks_exact(n)) {
        f(T::load(d), T::load(x)).store(d);
    }
}

/// `dst[i] = f(src[i])`.
#[inline(never)]
fn map<T: Elem>(dst: &mut [u8], src: &[u8], f: impl Fn(T) -> T) {
    let n = T::SIZE;
    for (d, x) in dst.chunks_exact_mut(n).zip(src.chunks_exact(n)) {
        f(T::load(x)).store(d);
    }
}

/// `buf[i] = f(buf[i])`.
#[inline(never)]
fn map_in_place<T: Elem>(buf: &mut [u8], f: impl Fn(T) -> T) {
    for d in buf.chunks_exact_mut(T::SIZE) {
        f(T::load(d)).store(d);
    }
}

fn combine_t<T: Elem>(r: &Reduction, dst: &mut [u8], incoming: &[u8], local: &[u8]) {
    match r.pre {
        Pre::None => combine_k::<T, _>(r.kind, NoPre, dst, incoming, local),
        Pre::Mul(s) => combine_k::<T, _>(r.kind, scalar(s), dst, incoming, local),
    }
}

fn combine_k<T: Elem, P: PreOp<T>>(kind: ReduceKind, pre: P, dst: &mut [u8], a: &[u8], b: &[u8]) {
    match kind {
        ReduceKind::Sum => zip3(dst, a, b, |x: T, y| x.sum_with(pre.apply(y))),
        ReduceKind::Prod => zip3(dst, a, b, |x: T, y| x.prod_with(pre.apply(y))),
        ReduceKind::Max => zip3(dst, a, b, |x: T, y| x.max_with(pre.apply(y))),
        ReduceKind::Min => zip3(dst, a, b, |x: T, y| x.min_with(pre.apply(y))),
    }
}

fn combine_in_place_t<T: Elem>(r: &Reduction, dst: &mut [u8], incoming: &[u8]) {
    match r.pre {
        Pre::None => combine_in_place_k::<T, _>(r.kind, NoPre, dst, incoming),
        Pre::Mul(s) => combine_in_place_k::<T, _>(r.kind, scalar(s), dst, incoming),
    }
}

fn combine_in_place_k<T: Elem, P: PreOp<T>>(kind: ReduceKind, pre: P, dst: &mut [u8], a: &[u8]) {
    match kind {
        ReduceKind::Sum => zip2(dst, a, |d: T, x| x.sum_with(pre.apply(d))),
        ReduceKind::Prod => zip2(dst, a, |d: T, x| x.prod_with(pre.apply(d))),
        ReduceKind::Max => zip2(dst, a, |d: T, x| x.max_with(pre.apply(d))),
        ReduceKind::Min => zip2(dst, a, |d: T, x| x.min_with(pre.apply(d))),
    }
}

fn accumulate_t<T: Elem>(kind: ReduceKind, dst: &mut [u8], a: &[u8]) {
    match kind {
        ReduceKind::Sum => zip2(dst, a, |d: T, x| d.sum_with(x)),
        ReduceKind::Prod => zip2(dst, a, |d: T, x| d.prod_with(x)),
        ReduceKind::Max => zip2(dst, a, |d: T, x| d.max_with(x)),
        ReduceKind::Min => zip2(dst, a, |d: T, x| d.min_with(x)),
    }
}

fn prepare_t<T: Elem>(s: [u8; 8], dst: &mut [u8], src: &[u8]) {
    let pre = scalar::<T>(s);
    map(dst, src, |x: T| pre.apply(x));
}

fn prepare_in_place_t<T: Elem>(s: [u8; 8], buf: &mut [u8]) {
    let pre = scalar::<T>(s);
    map_in_place(buf, |x: T| pre.apply(x));
}

fn finalize_t<T: Elem>(n: u64, buf: &mut [u8]) {
    map_in_place(buf, |x: T| x.div_by(n));
}

#[cfg(test)]
mod tests {
    use super::*;
    use float8::{F8E4M3, F8E5M2};
    use half::{bf16, f16};

    // ---- helpers: typed vectors <-> bytes ----

    fn bytes<T: Elem>(v: &[T]) -> Vec<u8> {
        let mut out = vec![0u8; v.len() * T::SIZE];
        for (d, x) in out.chunks_exact_mut(T::SIZE).zip(v) {
            x.store(d);
        }
        out
    }

    fn elems<T: Elem>(b: &[u8]) -> Vec<T> {
        b.chunks_exact(T::SIZE).map(T::load).collect()
    }

    fn h(x: f32) -> u16 {
        f16::from_f32(x).to_bits()
    }
    fn b(x: f32) -> u16 {
        bf16::from_f32(x).to_bits()
    }
    fn e4(x: f32) -> u8 {
        F8E4M3::from_f32(x).to_bits()
    }
    fn e5(x: f32) -> u8 {
        F8E5M2::from_f32(x).to_bits()
    }

    fn red(dtype: DataType, op: BuiltinOp) -> Reduction {
        Reduction::builtin(dtype, op, 1)
    }

    /// `a (op) b` through `combine` (no pre).
    fn op2(r: &Reduction, a: &[u8], b: &[u8]) -> Vec<u8> {
        let mut out = vec![0xAAu8; a.len()];
        r.combine(&mut out, a, b).unwrap();
        out
    }

    /// Every entry point applied to `(a, b)` without pre gives `expect`, in both orders.
    fn check_all_paths(r: &Reduction, a: &[u8], b: &[u8], expect: &[u8]) {
        assert!(!r.has_pre());
        let ctx = format!("{:?}", r);
        assert_eq!(op2(r, a, b), expect, "combine(a, b) {ctx}");
        assert_eq!(op2(r, b, a), expect, "combine(b, a) {ctx}");
        let mut d = b.to_vec();
        r.combine_in_place(&mut d, a).unwrap();
        assert_eq!(d, expect, "combine_in_place {ctx}");
        let mut d = a.to_vec();
        r.accumulate(&mut d, b).unwrap();
        assert_eq!(d, expect, "accumulate {ctx}");
        let mut d = b.to_vec();
        r.accumulate(&mut d, a).unwrap();
        assert_eq!(d, expect, "accumulate reversed {ctx}");
    }

    fn check_typed<T: Elem>(dtype: DataType, op: BuiltinOp, a: &[T], b: &[T], expect: &[T]) {
        check_all_paths(&red(dtype, op), &bytes(a), &bytes(b), &bytes(expect));
    }

    // ---- integers ----

    #[test]
    fn int8_ops_and_wraparound() {
        use BuiltinOp::*;
        let t = DataType::Int8;
        let a: [i8; 5] = [1, -5, 127, -128, 100];
        let b: [i8; 5] = [2, 3, 1, -1, 3];
        check_typed::<i8>(t, Sum, &a, &b, &[3, -2, -128, 127, 103]);
        check_typed::<i8>(t, Prod, &a, &b, &[2, -15, 127, -128, 44]);
        check_typed::<i8>(t, Max, &a, &b, &[2, 3, 127, -1, 100]);
        check_typed::<i8>(t, Min, &a, &b, &[1, -5, 1, -128, 3]);
    }

    #[test]
    fn uint8_ops_and_wraparound() {
        use BuiltinOp::*;
        let t = DataType::Uint8;
        let a: [u8; 4] = [1, 200, 255, 16];
        let b: [u8; 4] = [2, 100, 1, 16];
        check_typed::<u8>(t, Sum, &a, &b, &[3, 44, 0, 32]);
        check_typed::<u8>(t, Prod, &a, &b, &[2, 32, 255, 0]);
        check_typed::<u8>(t, Max, &a, &b, &[2, 200, 255, 16]);
        check_typed::<u8>(t, Min, &a, &b, &[1, 100, 1, 16]);
    }

    #[test]
    fn int32_uint32_ops() {
        use BuiltinOp::*;
        let a: [i32; 4] = [i32::MAX, -7, 65536, 0];
        let b: [i32; 4] = [1, 3, 65536, -1];
        check_typed::<i32>(DataType::Int32, Sum, &a, &b, &[i32::MIN, -4, 131072, -1]);
        check_typed::<i32>(DataType::Int32, Prod, &a, &b, &[i32::MAX, -21, 0, 0]);
        check_typed::<i32>(DataType::Int32, Max, &a, &b, &[i32::MAX, 3, 65536, 0]);
        check_typed::<i32>(DataType::Int32, Min, &a, &b, &[1, -7, 65536, -1]);
        let a: [u32; 3] = [u32::MAX, 7, 1 << 31];
        let b: [u32; 3] = [2, 3, 2];
        check_typed::<u32>(DataType::Uint32, Sum, &a, &b, &[1, 10, (1 << 31) + 2]);
        check_typed::<u32>(DataType::Uint32, Prod, &a, &b, &[u32::MAX - 1, 21, 0]);
        check_typed::<u32>(DataType::Uint32, Max, &a, &b, &[u32::MAX, 7, 1 << 31]);
        check_typed::<u32>(DataType::Uint32, Min, &a, &b, &[2, 3, 2]);
    }

    #[test]
    fn int64_uint64_ops() {
        use BuiltinOp::*;
        let a: [i64; 3] = [i64::MIN, -7, 1 << 40];
        let b: [i64; 3] = [-1, 3, 1 << 30];
        check_typed::<i64>(DataType::Int64, Sum, &a, &b, &[i64::MAX, -4, (1 << 40) + (1 << 30)]);
        check_typed::<i64>(DataType::Int64, Prod, &a, &b, &[i64::MIN, -21, 0]);
        check_typed::<i64>(DataType::Int64, Max, &a, &b, &[-1, 3, 1 << 40]);
        check_typed::<i64>(DataType::Int64, Min, &a, &b, &[i64::MIN, -7, 1 << 30]);
        let a: [u64; 3] = [u64::MAX, 7, 1 << 63];
        let b: [u64; 3] = [u64::MAX, 3, 2];
        check_typed::<u64>(DataType::Uint64, Sum, &a, &b, &[u64::MAX - 1, 10, (1 << 63) + 2]);
        check_typed::<u64>(DataType::Uint64, Prod, &a, &b, &[1, 21, 0]);
        check_typed::<u64>(DataType::Uint64, Max, &a, &b, &[u64::MAX, 7, 1 << 63]);
        check_typed::<u64>(DataType::Uint64, Min, &a, &b, &[u64::MAX, 3, 2]);
    }

    #[test]
    fn int64_prod_wraps() {
        let r = red(DataType::Int64, BuiltinOp::Prod);
        let a = bytes::<i64>(&[1 << 40, i64::MAX]);
        let b = bytes::<i64>(&[1 << 30, 2]);
        assert_eq!(elems::<i64>(&op2(&r, &a, &b)), [0, -2]);
    }

    /// Runs an average over `inputs` (one vector per rank) the way a plan does: prepare each
    /// rank's input, fold with combine/accumulate, finalize.
    fn reduce_ranks(r: &Reduction, inputs: &[Vec<u8>]) -> Vec<u8> {
        let mut acc = vec![0u8; inputs[0].len()];
        r.prepare(&mut acc, &inputs[0]).unwrap();
        for x in &inputs[1..] {
            let partial = acc.clone();
            r.combine(&mut acc, &partial, x).unwrap();
        }
        r.finalize(&mut acc).unwrap();
        acc
    }

    #[test]
    fn int_avg_divides_with_truncation() {
        let r = Reduction::builtin(DataType::Int32, BuiltinOp::Avg, 3);
        assert_eq!(r.kind, ReduceKind::Sum);
        assert_eq!(r.pre, Pre::None);
        assert_eq!(r.post, Post::Div(3));
        assert!(r.has_post() && !r.has_pre());
        let inputs = [bytes::<i32>(&[1, -1, -7, 5]), bytes::<i32>(&[2, -2, 0, 0]), bytes::<i32>(&[4, -4, 0, 0])];
        // (1+2+4)/3 = 2, (-7)/3 = -2 (toward zero), 5/3 = 1.
        assert_eq!(elems::<i32>(&reduce_ranks(&r, &inputs)), [2, -2, -2, 1]);

        let r = Reduction::builtin(DataType::Uint8, BuiltinOp::Avg, 3);
        let inputs = [bytes::<u8>(&[1, 200]), bytes::<u8>(&[2, 100]), bytes::<u8>(&[4, 2])];
        // 302 wraps to 46: 46 / 3 = 15.
        assert_eq!(elems::<u8>(&reduce_ranks(&r, &inputs)), [2, 15]);
    }

    #[test]
    fn int_post_div_edge_cases() {
        let div = |dtype, n, input: Vec<u8>| {
            let r = Reduction { dtype, kind: ReduceKind::Sum, pre: Pre::None, post: Post::Div(n) };
            let mut buf = input;
            r.finalize(&mut buf).unwrap();
            buf
        };
        assert_eq!(elems::<i8>(&div(DataType::Int8, 2, bytes::<i8>(&[-128, 127, -3]))), [-64, 63, -1]);
        // Divisors beyond the type's range.
        assert_eq!(elems::<i8>(&div(DataType::Int8, 128, bytes::<i8>(&[-128, 127, -1]))), [-1, 0, 0]);
        assert_eq!(elems::<i8>(&div(DataType::Int8, 1000, bytes::<i8>(&[-128, 127]))), [0, 0]);
        assert_eq!(elems::<u8>(&div(DataType::Uint8, 300, bytes::<u8>(&[255]))), [0]);
        assert_eq!(elems::<i64>(&div(DataType::Int64, 1 << 63, bytes::<i64>(&[i64::MIN, i64::MAX]))), [-1, 0]);
        assert_eq!(elems::<u64>(&div(DataType::Uint64, u64::MAX, bytes::<u64>(&[u64::MAX, 5]))), [1, 0]);
        assert_eq!(elems::<i64>(&div(DataType::Int64, 7, bytes::<i64>(&[-15, i64::MIN]))), [-2, i64::MIN / 7]);
        // A zero divisor is refused.
        let r = Reduction { dtype: DataType::Int32, kind: ReduceKind::Sum, pre: Pre::None, post: Post::Div(0) };
        assert!(matches!(r.finalize(&mut [0u8; 4]), Err(Error::Internal(_))));
    }

    #[test]
    fn int_pre_mul_sum_wraps() {
        let r = Reduction::pre_mul_sum(DataType::Int8, &[3]).unwrap();
        assert!(r.has_pre() && !r.has_post());
        let mut d = vec![0u8; 3];
        r.combine(&mut d, &bytes::<i8>(&[1, 100, -1]), &bytes::<i8>(&[2, 50, -50])).unwrap();
        // 1 + 6, 100 + 150 (= -106) = -6, -1 - 150 (= 106) = 105.
        assert_eq!(elems::<i8>(&d), [7, -6, 105]);
        let r = Reduction::pre_mul_sum(DataType::Uint64, &7u64.to_ne_bytes()).unwrap();
        let mut d = bytes::<u64>(&[u64::MAX / 7 + 1]);
        r.prepare_in_place(&mut d).unwrap();
        assert_eq!(elems::<u64>(&d), [(u64::MAX / 7 + 1).wrapping_mul(7)]);
    }

    // ---- f32 / f64 ----

    #[test]
    fn f32_ops_exact_values() {
        use BuiltinOp::*;
        let t = DataType::Float32;
        let a: [f32; 4] = [1.5, -2.0, 1e30, 0.1];
        let b: [f32; 4] = [2.25, 3.0, 1e30, 0.2];
        check_typed::<f32>(t, Sum, &a, &b, &[3.75, 1.0, 2e30, 0.1f32 + 0.2f32]);
        check_typed::<f32>(t, Prod, &a, &b, &[3.375, -6.0, f32::INFINITY, 0.1f32 * 0.2f32]);
        check_typed::<f32>(t, Max, &a, &b, &[2.25, 3.0, 1e30, 0.2]);
        check_typed::<f32>(t, Min, &a, &b, &[1.5, -2.0, 1e30, 0.1]);
    }

    #[test]
    fn f64_ops_exact_values() {
        use BuiltinOp::*;
        let t = DataType::Float64;
        let a: [f64; 4] = [1.5, -2.0, 1e300, 0.1];
        let b: [f64; 4] = [2.25, 3.0, 1e300, 0.2];
        check_typed::<f64>(t, Sum, &a, &b, &[3.75, 1.0, 2e300, 0.1 + 0.2]);
        check_typed::<f64>(t, Prod, &a, &b, &[3.375, -6.0, f64::INFINITY, 0.1 * 0.2]);
        check_typed::<f64>(t, Max, &a, &b, &[2.25, 3.0, 1e300, 0.2]);
        check_typed::<f64>(t, Min, &a, &b, &[1.5, -2.0, 1e300, 0.1]);
    }

    #[test]
    fn f32_f64_nan_inf_and_signed_zero() {
        use BuiltinOp::*;
        let nan_a = f32::from_bits(0x7fc0_0123);
        let nan_b = f32::from_bits(0xffc0_4567);
        let snan = f32::from_bits(0x7f80_0001);
        let inf = f32::INFINITY;
        let a = [nan_a, nan_a, 1.0, inf, inf, 0.0, snan];
        let b = [nan_b, 1.0, nan_b, -inf, 1.0, -0.0, 2.0];
        let n = NAN32;
        check_typed::<f32>(DataType::Float32, Sum, &a, &b, &[n, n, n, n, inf, 0.0, n]);
        check_typed::<f32>(DataType::Float32, Prod, &a, &b, &[n, n, n, -inf, inf, -0.0, n]);
        check_typed::<f32>(DataType::Float32, Max, &a, &b, &[n, n, n, inf, inf, 0.0, n]);
        check_typed::<f32>(DataType::Float32, Min, &a, &b, &[n, n, n, -inf, 1.0, -0.0, n]);
        // inf * 0 is NaN: canonical too.
        check_typed::<f32>(DataType::Float32, Prod, &[inf], &[0.0], &[n]);

        let nan_a = f64::from_bits(0x7ff8_0000_0000_0123);
        let nan_b = f64::from_bits(0xfff0_0000_0000_4567);
        let inf = f64::INFINITY;
        let a = [nan_a, nan_a, inf, 0.0, -0.0];
        let b = [nan_b, -1.0, -inf, -0.0, -0.0];
        let n = NAN64;
        check_typed::<f64>(DataType::Float64, Sum, &a, &b, &[n, n, n, 0.0, -0.0]);
        check_typed::<f64>(DataType::Float64, Max, &a, &b, &[n, n, inf, 0.0, -0.0]);
        check_typed::<f64>(DataType::Float64, Min, &a, &b, &[n, n, -inf, -0.0, -0.0]);
        check_typed::<f64>(DataType::Float64, Prod, &a, &b, &[n, n, -inf, -0.0, 0.0]);
    }

    #[test]
    fn signed_zero_bits_for_max_min() {
        for t in [DataType::Float32, DataType::Float64] {
            let (p, m) = if t == DataType::Float32 {
                (bytes(&[0.0f32]), bytes(&[-0.0f32]))
            } else {
                (bytes(&[0.0f64]), bytes(&[-0.0f64]))
            };
            check_all_paths(&red(t, BuiltinOp::Max), &p, &m, &p);
            check_all_paths(&red(t, BuiltinOp::Min), &p, &m, &m);
        }
        let (p, m) = (bytes(&[F16(0)]), bytes(&[F16(0x8000)]));
        check_all_paths(&red(DataType::Float16, BuiltinOp::Max), &p, &m, &p);
        check_all_paths(&red(DataType::Float16, BuiltinOp::Min), &p, &m, &m);
        let (p, m) = ([0u8], [0x80u8]);
        for t in [DataType::Float8e4m3, DataType::Float8e5m2] {
            check_all_paths(&red(t, BuiltinOp::Max), &p, &m, &p);
            check_all_paths(&red(t, BuiltinOp::Min), &p, &m, &m);
        }
    }

    #[test]
    fn float_avg_is_premul_sum() {
        let r = Reduction::builtin(DataType::Float32, BuiltinOp::Avg, 4);
        assert_eq!(r.kind, ReduceKind::Sum);
        assert_eq!(r.post, Post::None);
        let mut quarter = [0u8; 8];
        quarter[..4].copy_from_slice(&0.25f32.to_ne_bytes());
        assert_eq!(r.pre, Pre::Mul(quarter));
        let inputs = [bytes(&[1.0f32, 8.0]), bytes(&[2.0f32, 8.0]), bytes(&[3.0f32, 8.0]), bytes(&[6.0f32, -8.0])];
        assert_eq!(elems::<f32>(&reduce_ranks(&r, &inputs)), [3.0, 4.0]);

        let r = Reduction::builtin(DataType::Float64, BuiltinOp::Avg, 3);
        assert_eq!(r.pre, Pre::Mul((1.0f64 / 3.0).to_ne_bytes()));
        let inputs = [bytes(&[3.0f64]), bytes(&[6.0f64]), bytes(&[9.0f64])];
        let third = 1.0f64 / 3.0;
        assert_eq!(elems::<f64>(&reduce_ranks(&r, &inputs)), [3.0 * third + 6.0 * third + 9.0 * third]);

        // The scalars in the narrow types.
        let pre = |t| match Reduction::builtin(t, BuiltinOp::Avg, 3).pre {
            Pre::Mul(s) => s,
            Pre::None => panic!("no pre"),
        };
        let third32 = (1.0f64 / 3.0) as f32;
        assert_eq!(pre(DataType::Float16)[..2], h(third32).to_ne_bytes());
        assert_eq!(pre(DataType::Bfloat16)[..2], b(third32).to_ne_bytes());
        assert_eq!(pre(DataType::Float8e4m3)[0], e4(third32));
        assert_eq!(pre(DataType::Float8e5m2)[0], e5(third32));
        assert_eq!(pre(DataType::Float16)[2..], [0; 6]);

        // bf16 average of 4 ranks: scalar 0.25 is exact.
        let r = Reduction::builtin(DataType::Bfloat16, BuiltinOp::Avg, 4);
        let inputs: Vec<Vec<u8>> = [1.0f32, 2.0, 3.0, 10.0].iter().map(|&x| bytes(&[Bf16(b(x))])).collect();
        assert_eq!(elems::<Bf16>(&reduce_ranks(&r, &inputs))[0].0, b(4.0));
        // e4m3 average of 2 ranks.
        let r = Reduction::builtin(DataType::Float8e4m3, BuiltinOp::Avg, 2);
        let inputs = vec![vec![e4(448.0)], vec![e4(448.0)]];
        assert_eq!(reduce_ranks(&r, &inputs), [e4(448.0)]);
        // nranks == 0 behaves as 1.
        assert_eq!(Reduction::builtin(DataType::Int8, BuiltinOp::Avg, 0).post, Post::Div(1));
    }

    #[test]
    fn float_pre_mul_sum_rounds_pre_then_sum() {
        // f32: pre = x * s, then + incoming.
        let r = Reduction::pre_mul_sum(DataType::Float32, &0.1f32.to_ne_bytes()).unwrap();
        let mut d = vec![0u8; 4];
        r.combine(&mut d, &bytes(&[1.0f32]), &bytes(&[3.0f32])).unwrap();
        assert_eq!(elems::<f32>(&d), [1.0 + 3.0f32 * 0.1]);
        let mut p = vec![0u8; 4];
        r.prepare(&mut p, &bytes(&[3.0f32])).unwrap();
        assert_eq!(elems::<f32>(&p), [3.0f32 * 0.1]);

        // f16: pre(x) is rounded to f16 before the sum. s = 0.1 (f16 0x2e66), x = 3:
        // x*s = 0.29980469 -> f16 0.2998 (0x34cc); 1 + that -> rounded once more.
        let s = h(0.1);
        let r = Reduction::pre_mul_sum(DataType::Float16, &s.to_ne_bytes()).unwrap();
        let pre = f16::from_f32(f16::from_bits(s).to_f32() * 3.0);
        let expect = f16::from_f32(1.0 + pre.to_f32()).to_bits();
        let mut d = vec![0u8; 2];
        r.combine(&mut d, &bytes(&[F16(h(1.0))]), &bytes(&[F16(h(3.0))])).unwrap();
        assert_eq!(elems::<F16>(&d)[0].0, expect);
        // in place: same result
        let mut d = bytes(&[F16(h(3.0))]);
        r.combine_in_place(&mut d, &bytes(&[F16(h(1.0))])).unwrap();
        assert_eq!(elems::<F16>(&d)[0].0, expect);
        // accumulate has no pre
        let mut d = bytes(&[F16(h(3.0))]);
        r.accumulate(&mut d, &bytes(&[F16(h(1.0))])).unwrap();
        assert_eq!(elems::<F16>(&d)[0].0, h(4.0));

        // A case where rounding pre separately matters (bf16): s = 1 + 2^-7, x = 1 + 2^-7.
        // Exact x*s = 1 + 2^-6 + 2^-14 -> bf16 1 + 2^-6. Sum with 2^-7 + 2^-14 ... computed in f32.
        let s = b(1.0 + 1.0 / 128.0);
        let r = Reduction::pre_mul_sum(DataType::Bfloat16, &s.to_ne_bytes()).unwrap();
        let xs = bf16::from_bits(s).to_f32();
        let pre = bf16::from_f32(xs * xs);
        assert_eq!(pre.to_bits(), b(1.0 + 1.0 / 64.0));
        let inc = bf16::from_f32(1.0 / 128.0);
        let expect = bf16::from_f32(inc.to_f32() + pre.to_f32()).to_bits();
        let mut d = vec![0u8; 2];
        r.combine(&mut d, &bytes(&[Bf16(inc.to_bits())]), &bytes(&[Bf16(s)])).unwrap();
        assert_eq!(elems::<Bf16>(&d)[0].0, expect);

        // fp8 e5m2 PreMulSum, saturating.
        let r = Reduction::pre_mul_sum(DataType::Float8e5m2, &[e5(2.0)]).unwrap();
        let mut d = [0u8; 2];
        r.combine(&mut d, &[e5(1.0), e5(57344.0)], &[e5(1.5), e5(57344.0)]).unwrap();
        assert_eq!(d, [e5(4.0), e5(57344.0)]);

        // Scalar too short.
        assert!(matches!(Reduction::pre_mul_sum(DataType::Float64, &[0; 4]), Err(Error::InvalidArgument(_))));
        // Extra bytes ignored.
        let r = Reduction::pre_mul_sum(DataType::Int8, &[2, 9, 9]).unwrap();
        assert_eq!(r.pre, Pre::Mul([2, 0, 0, 0, 0, 0, 0, 0]));
    }

    // ---- f16 / bf16 ----

    #[test]
    fn f16_ops_exact_values() {
        use BuiltinOp::*;
        let t = DataType::Float16;
        let v = |xs: &[f32]| xs.iter().map(|&x| F16(h(x))).collect::<Vec<_>>();
        let hf = |x: f32| f16::from_f32(x).to_f32();
        let a = v(&[1.5, -2.0, 60000.0, 0.1, 6e-8]);
        let bb = v(&[2.25, 3.0, 60000.0, 0.2, 6e-8]);
        assert_eq!(h(6e-8), 0x0001);
        check_typed(t, Sum, &a, &bb, &v(&[3.75, 1.0, f32::INFINITY, hf(0.1) + hf(0.2), 2.0 * hf(6e-8)]));
        check_typed(t, Prod, &a, &bb, &v(&[3.375, -6.0, f32::INFINITY, hf(0.1) * hf(0.2), 0.0]));
        check_typed(t, Max, &a, &bb, &v(&[2.25, 3.0, 60000.0, 0.2, 6e-8]));
        check_typed(t, Min, &a, &bb, &v(&[1.5, -2.0, 60000.0, 0.1, 6e-8]));
    }

    #[test]
    fn bf16_ops_exact_values() {
        use BuiltinOp::*;
        let t = DataType::Bfloat16;
        let v = |xs: &[f32]| xs.iter().map(|&x| Bf16(b(x))).collect::<Vec<_>>();
        let bf = |x: f32| bf16::from_f32(x).to_f32();
        let a = v(&[1.5, -2.0, 3e38, 0.1]);
        let bb = v(&[2.25, 3.0, 3e38, 0.2]);
        check_typed(t, Sum, &a, &bb, &v(&[3.75, 1.0, f32::INFINITY, bf(0.1) + bf(0.2)]));
        check_typed(t, Prod, &a, &bb, &v(&[3.375, -6.0, f32::INFINITY, bf(0.1) * bf(0.2)]));
        check_typed(t, Max, &a, &bb, &v(&[2.25, 3.0, 3e38, 0.2]));
        check_typed(t, Min, &a, &bb, &v(&[1.5, -2.0, 3e38, 0.1]));
    }

    #[test]
    fn f16_bf16_round_to_nearest_even_on_ties() {
        let sum16 = red(DataType::Float16, BuiltinOp::Sum);
        let one = F16(h(1.0));
        // 1 + 2^-11 is a tie between 1 and 1 + 2^-10: even is 1.
        let tiny = F16(h(1.0 / 2048.0));
        assert_eq!(elems::<F16>(&op2(&sum16, &bytes(&[one]), &bytes(&[tiny])))[0].0, 0x3c00);
        // (1 + 2^-10) + 2^-11 ties between 1+2^-10 (odd) and 1+2^-9 (even): rounds up.
        let one_ulp = F16(0x3c01);
        assert_eq!(elems::<F16>(&op2(&sum16, &bytes(&[one_ulp]), &bytes(&[tiny])))[0].0, 0x3c02);
        // Overflow to Inf: 65504 + 16 is the tie between 65504 (odd) and 65536 (even, = Inf).
        let max = F16(0x7bff);
        let sixteen = F16(h(16.0));
        assert_eq!(elems::<F16>(&op2(&sum16, &bytes(&[max]), &bytes(&[sixteen])))[0].0, 0x7c00);
        let eight = F16(h(8.0));
        assert_eq!(elems::<F16>(&op2(&sum16, &bytes(&[max]), &bytes(&[eight])))[0].0, 0x7bff);
        // Subnormal tie: 2^-24 * 1.5 via prod (2^-24 * 1.5 = tie between 2^-24 and 2^-23).
        let prod16 = red(DataType::Float16, BuiltinOp::Prod);
        let min_sub = F16(0x0001);
        let three_halves = F16(h(1.5));
        assert_eq!(elems::<F16>(&op2(&prod16, &bytes(&[min_sub]), &bytes(&[three_halves])))[0].0, 0x0002);
        let half = F16(h(0.5));
        assert_eq!(elems::<F16>(&op2(&prod16, &bytes(&[min_sub]), &bytes(&[half])))[0].0, 0x0000);

        let sum_b = red(DataType::Bfloat16, BuiltinOp::Sum);
        let one = Bf16(b(1.0));
        let tiny = Bf16(b(1.0 / 256.0)); // half an ulp of 1 in bf16
        assert_eq!(elems::<Bf16>(&op2(&sum_b, &bytes(&[one]), &bytes(&[tiny])))[0].0, 0x3f80);
        let one_ulp = Bf16(0x3f81);
        assert_eq!(elems::<Bf16>(&op2(&sum_b, &bytes(&[one_ulp]), &bytes(&[tiny])))[0].0, 0x3f82);
        // bf16 overflow to Inf.
        let max = Bf16(0x7f7f);
        assert_eq!(elems::<Bf16>(&op2(&sum_b, &bytes(&[max]), &bytes(&[max])))[0].0, 0x7f80);
    }

    #[test]
    fn f16_bf16_nan_inf() {
        use BuiltinOp::*;
        let nan_a = F16(0x7e01);
        let nan_b = F16(0xfd55); // negative signalling NaN
        let inf = F16(0x7c00);
        let ninf = F16(0xfc00);
        let one = F16(h(1.0));
        let n = F16(0x7e00);
        for op in [Sum, Prod, Max, Min] {
            check_typed(DataType::Float16, op, &[nan_a, nan_a, one], &[nan_b, one, nan_b], &[n, n, n]);
        }
        check_typed(DataType::Float16, Sum, &[inf, inf], &[ninf, one], &[n, inf]);
        check_typed(DataType::Float16, Max, &[inf, ninf], &[ninf, one], &[inf, one]);
        check_typed(DataType::Float16, Min, &[inf, ninf], &[ninf, one], &[ninf, ninf]);

        let nan_a = Bf16(0x7fc1);
        let nan_b = Bf16(0xff81);
        let inf = Bf16(0x7f80);
        let ninf = Bf16(0xff80);
        let one = Bf16(b(1.0));
        let n = Bf16(0x7fc0);
        for op in [Sum, Prod, Max, Min] {
            check_typed(DataType::Bfloat16, op, &[nan_a, nan_a, one], &[nan_b, one, nan_b], &[n, n, n]);
        }
        check_typed(DataType::Bfloat16, Sum, &[inf, inf], &[ninf, one], &[n, inf]);
        check_typed(DataType::Bfloat16, Prod, &[inf, inf], &[Bf16(0), one], &[n, inf]);
    }

    #[test]
    fn f16_conversions_match_half() {
        for bits in 0..=u16::MAX {
            let ours = f16_to_f32(bits);
            let theirs = f16::from_bits(bits).to_f32();
            if theirs.is_nan() {
                assert!(ours.is_nan(), "{bits:#x}");
            } else {
                assert_eq!(ours.to_bits(), theirs.to_bits(), "{bits:#x}");
            }
            // Round trip through our narrowing.
            if !theirs.is_nan() {
                assert_eq!(f32_to_f16(ours), bits, "{bits:#x}");
            }
        }
        // f32 -> f16 against half on a dense sample of all f32 bit patterns (every pattern near
        // f16 rounding boundaries is covered by the low-bit sweep below).
        let check = |x: u32| {
            let f = f32::from_bits(x);
            if f.is_nan() {
                assert_eq!((f32_to_f16(f), f32_to_bf16(f)), (0x7e00, 0x7fc0), "{x:#x}");
            } else {
                assert_eq!(f32_to_f16(f), f16::from_f32(f).to_bits(), "{x:#x}");
                assert_eq!(f32_to_bf16(f), bf16::from_f32(f).to_bits(), "{x:#x}");
            }
        };
        for x in (0..=u32::MAX).step_by(4093) {
            check(x);
        }
        for base in 0..=u16::MAX as u32 {
            // Around every f16 value (as f32): the exact value, the ties and their neighbours.
            let centre = f16_to_f32(base as u16).to_bits();
            for d in [0u32, 1, 0xfff, 0x1000, 0x1001, 0x1fff, 0x2000] {
                check(centre.wrapping_add(d));
                check(centre.wrapping_sub(d));
            }
        }
        assert_eq!(f32_to_f16(NAN32), f16::from_f32(NAN32).to_bits());
        assert_eq!(f32_to_bf16(NAN32), bf16::from_f32(NAN32).to_bits());
    }

    // ---- fp8 ----

    #[test]
    fn e4m3_ops_saturation_and_nan() {
        use BuiltinOp::*;
        let t = DataType::Float8e4m3;
        check_typed(
            t,
            Sum,
            &[E4m3(e4(1.5)), E4m3(e4(448.0)), E4m3(e4(-448.0))],
            &[E4m3(e4(2.0)), E4m3(e4(448.0)), E4m3(e4(-32.0))],
            &[E4m3(e4(3.5)), E4m3(0x7e), E4m3(0xfe)],
        );
        check_typed(
            t,
            Prod,
            &[E4m3(e4(1.5)), E4m3(e4(448.0)), E4m3(e4(0.5))],
            &[E4m3(e4(-3.0)), E4m3(e4(2.0)), E4m3(e4(0.25))],
            &[E4m3(e4(-4.5)), E4m3(0x7e), E4m3(e4(0.125))],
        );
        check_typed(
            t,
            Max,
            &[E4m3(e4(1.5)), E4m3(e4(-448.0))],
            &[E4m3(e4(-3.0)), E4m3(e4(-1.0))],
            &[E4m3(e4(1.5)), E4m3(e4(-1.0))],
        );
        check_typed(
            t,
            Min,
            &[E4m3(e4(1.5)), E4m3(e4(-448.0))],
            &[E4m3(e4(-3.0)), E4m3(e4(-1.0))],
            &[E4m3(e4(-3.0)), E4m3(e4(-448.0))],
        );
        assert_eq!(e4(448.0), 0x7e);
        // NaN (0x7f / 0xff) propagates, canonical 0x7f.
        for op in [Sum, Prod, Max, Min] {
            check_typed(
                t,
                op,
                &[E4m3(0xff), E4m3(0x7f), E4m3(e4(1.0))],
                &[E4m3(0x7f), E4m3(e4(2.0)), E4m3(0xff)],
                &[E4m3(0x7f); 3],
            );
        }
        // Sum of two max of opposite sign is exact zero.
        check_typed(t, Sum, &[E4m3(0x7e)], &[E4m3(0xfe)], &[E4m3(0)]);
    }

    #[test]
    fn e5m2_ops_inf_saturation_and_nan() {
        use BuiltinOp::*;
        let t = DataType::Float8e5m2;
        let x = |v: f32| E5m2(e5(v));
        let inf = E5m2(0x7c);
        let ninf = E5m2(0xfc);
        assert_eq!(e5(57344.0), 0x7b);
        // Finite overflow saturates (SATFINITE); Inf stays Inf.
        check_typed(
            t,
            Sum,
            &[x(1.5), x(57344.0), x(-57344.0), inf, inf],
            &[x(2.0), x(57344.0), x(-16384.0), x(1.0), ninf],
            &[x(3.5), x(57344.0), x(-57344.0), inf, E5m2(0x7e)],
        );
        check_typed(
            t,
            Prod,
            &[x(1.5), x(57344.0), ninf, inf],
            &[x(-3.0), x(2.0), x(2.0), x(0.0)],
            &[x(-4.5), x(57344.0), ninf, E5m2(0x7e)],
        );
        check_typed(t, Max, &[x(1.5), inf, ninf], &[x(-3.0), x(57344.0), x(-1.0)], &[x(1.5), inf, x(-1.0)]);
        check_typed(t, Min, &[x(1.5), inf, ninf], &[x(-3.0), x(57344.0), x(-1.0)], &[x(-3.0), x(57344.0), ninf]);
        for op in [Sum, Prod, Max, Min] {
            check_typed(t, op, &[E5m2(0xfd), E5m2(0x7f), x(1.0)], &[E5m2(0x7e), x(2.0), E5m2(0xff)], &[E5m2(0x7e); 3]);
        }
    }

    #[test]
    fn fp8_round_to_nearest_even_on_ties() {
        let s4 = red(DataType::Float8e4m3, BuiltinOp::Sum);
        // e4m3 near 1: ulp 2^-3. 1 + 2^-4 is a tie: even -> 1. (1+2^-3) + 2^-4 -> 1 + 2^-2.
        assert_eq!(op2(&s4, &[e4(1.0)], &[e4(1.0 / 16.0)]), [e4(1.0)]);
        assert_eq!(op2(&s4, &[e4(1.125)], &[e4(1.0 / 16.0)]), [e4(1.25)]);
        // Between 416 and 448 (ulp 32) 432 ties -> 448 (mantissa 110 even); 400+... check 448+16 = 464
        // is the saturation tie point and stays 448.
        assert_eq!(op2(&s4, &[e4(448.0)], &[e4(16.0)]), [e4(448.0)]);
        assert_eq!(op2(&s4, &[e4(416.0)], &[e4(16.0)]), [e4(448.0)]);
        // Subnormals: min subnormal 2^-9; 2^-9 * 0.5 ties to 0, 2^-9 * 1.5 ties to 2^-8.
        let p4 = red(DataType::Float8e4m3, BuiltinOp::Prod);
        assert_eq!(op2(&p4, &[0x01], &[e4(0.5)]), [0x00]);
        assert_eq!(op2(&p4, &[0x01], &[e4(1.5)]), [0x02]);
        assert_eq!(op2(&p4, &[0x81], &[e4(0.5)]), [0x80]);

        let s5 = red(DataType::Float8e5m2, BuiltinOp::Sum);
        // e5m2 near 1: ulp 2^-2. 1 + 2^-3 ties -> 1; 1.25 + 2^-3 -> 1.5.
        assert_eq!(op2(&s5, &[e5(1.0)], &[e5(0.125)]), [e5(1.0)]);
        assert_eq!(op2(&s5, &[e5(1.25)], &[e5(0.125)]), [e5(1.5)]);
        // 57344 + 4096 (the tie between max and the Inf encoding) saturates to max.
        assert_eq!(op2(&s5, &[e5(57344.0)], &[e5(4096.0)]), [e5(57344.0)]);
    }

    #[test]
    fn fp8_conversions_match_float8() {
        assert_eq!(e4m3_to_f32(0x7e), 448.0);
        assert_eq!(e4m3_to_f32(0x38), 1.0);
        assert_eq!(e4m3_to_f32(0x01), 1.0 / 512.0);
        assert_eq!(e4m3_to_f32(0x80).to_bits(), (-0.0f32).to_bits());
        assert!(e4m3_to_f32(0x7f).is_nan() && e4m3_to_f32(0xff).is_nan());
        assert_eq!(e5m2_to_f32(0x7b), 57344.0);
        assert_eq!(e5m2_to_f32(0x7c), f32::INFINITY);
        assert_eq!(e5m2_to_f32(0xfc), f32::NEG_INFINITY);
        assert_eq!(e5m2_to_f32(0x01), 1.0 / 65536.0);
        assert!(e5m2_to_f32(0x7d).is_nan() && e5m2_to_f32(0xff).is_nan());
        for i in 0..=255u8 {
            for (ours, theirs) in
                [(e4m3_to_f32(i), F8E4M3::from_bits(i).to_f32()), (e5m2_to_f32(i), F8E5M2::from_bits(i).to_f32())]
            {
                assert!(ours.to_bits() == theirs.to_bits() || (ours.is_nan() && theirs.is_nan()), "{i:#x}");
            }
            // Round trip of every non-NaN code.
            if !e4m3_to_f32(i).is_nan() {
                assert_eq!(f32_to_e4m3(e4m3_to_f32(i)), i);
            }
            if !e5m2_to_f32(i).is_nan() {
                assert_eq!(f32_to_e5m2(e5m2_to_f32(i)), i);
            }
        }
        // Encoding against float8 (a transcription of cuda_fp8.hpp): a dense sample of all f32
        // bit patterns, plus every pattern within a few f32 ulps of each fp8 value and of each
        // midpoint between neighbours (the rounding and saturation boundaries).
        let check = |x: u32| {
            let f = f32::from_bits(x);
            if f.is_nan() {
                assert_eq!((f32_to_e4m3(f), f32_to_e5m2(f)), (0x7f, 0x7e), "{x:#x}");
                return;
            }
            assert_eq!(f32_to_e4m3(f), F8E4M3::from_f32(f).to_bits(), "e4m3 {x:#x}");
            let expect5 = if f.is_infinite() { (x >> 24) as u8 & 0x80 | 0x7c } else { F8E5M2::from_f32(f).to_bits() };
            assert_eq!(f32_to_e5m2(f), expect5, "e5m2 {x:#x}");
        };
        for x in (0..=u32::MAX).step_by(2039) {
            check(x);
        }
        let mut points: Vec<f32> = Vec::new();
        for i in 0..=255u8 {
            for v in [e4m3_to_f32(i), e5m2_to_f32(i)] {
                points.push(v);
            }
            if i < 0x7f {
                points.push((e4m3_to_f32(i) + e4m3_to_f32(i + 1)) / 2.0);
                points.push((e5m2_to_f32(i) + e5m2_to_f32(i + 1)) / 2.0);
            }
        }
        points.extend([464.0, 480.0, 61440.0, 65536.0, 1.0 / 1024.0, 1.0 / 131072.0, f32::MAX]);
        for p in points.iter().filter(|p| p.is_finite()) {
            let centre = p.abs().to_bits();
            for d in 0..4u32 {
                for sign in [0, 0x8000_0000] {
                    check(centre.wrapping_add(d) | sign);
                    check(centre.wrapping_sub(d) | sign);
                }
            }
        }
        for x in [0x7f80_0000, 0xff80_0000, 0x7fc0_0000, 0xffa0_0000, 0x7f80_0001, 0, 0x8000_0000, 1] {
            check(x);
        }
    }

    /// Every f32 bit pattern through every narrowing, against the reference crates.
    #[test]
    #[ignore = "exhaustive (2^32 inputs): cargo test --release -- --ignored"]
    fn narrowing_exhaustive() {
        let threads = std::thread::available_parallelism().map_or(1, |n| n.get()) as u64;
        let chunk = (1u64 << 32).div_ceil(threads);
        std::thread::scope(|scope| {
            for t in 0..threads {
                scope.spawn(move || {
                    let end = ((t + 1) * chunk).min(1 << 32);
                    for x in (t * chunk)..end {
                        let x = x as u32;
                        let f = f32::from_bits(x);
                        if f.is_nan() {
                            let got = (f32_to_f16(f), f32_to_bf16(f), f32_to_e4m3(f), f32_to_e5m2(f));
                            assert_eq!(got, (0x7e00, 0x7fc0, 0x7f, 0x7e), "NaN {x:#x}");
                            continue;
                        }
                        assert_eq!(f32_to_f16(f), f16::from_f32(f).to_bits(), "f16 {x:#x}");
                        assert_eq!(f32_to_bf16(f), bf16::from_f32(f).to_bits(), "bf16 {x:#x}");
                        assert_eq!(f32_to_e4m3(f), F8E4M3::from_f32(f).to_bits(), "e4m3 {x:#x}");
                        if !f.is_infinite() {
                            assert_eq!(f32_to_e5m2(f), F8E5M2::from_f32(f).to_bits(), "e5m2 {x:#x}");
                        }
                    }
                });
            }
        });
    }

    // ---- every dtype × op: commutativity exhaustively for the 8-bit types, sampled otherwise ----

    #[test]
    fn every_op_commutative_over_all_fp8_and_int8_pairs() {
        for t in [DataType::Int8, DataType::Uint8, DataType::Float8e4m3, DataType::Float8e5m2] {
            let a: Vec<u8> = (0..=255u8).flat_map(|x| std::iter::repeat_n(x, 256)).collect();
            let bb: Vec<u8> = (0..256 * 256).map(|i| i as u8).collect();
            for op in [BuiltinOp::Sum, BuiltinOp::Prod, BuiltinOp::Max, BuiltinOp::Min] {
                let r = red(t, op);
                assert_eq!(op2(&r, &a, &bb), op2(&r, &bb, &a), "{t} {op:?}");
            }
        }
    }

    #[test]
    fn fp8_sum_matches_reference_rounding() {
        // Reference: exact sum in f64, CUDA SATFINITE rounding, except Inf results for e5m2.
        let a: Vec<u8> = (0..=255u8).flat_map(|x| std::iter::repeat_n(x, 256)).collect();
        let bb: Vec<u8> = (0..256 * 256).map(|i| i as u8).collect();
        let r = red(DataType::Float8e4m3, BuiltinOp::Sum);
        for ((&x, &y), &z) in a.iter().zip(&bb).zip(&op2(&r, &a, &bb)) {
            let s = F8E4M3::from_bits(x).to_f64() + F8E4M3::from_bits(y).to_f64();
            let expect = if s.is_nan() { 0x7f } else { F8E4M3::from_f64(s).to_bits() };
            assert_eq!(z, expect, "{x:#x} + {y:#x}");
        }
        let r = red(DataType::Float8e5m2, BuiltinOp::Sum);
        for ((&x, &y), &z) in a.iter().zip(&bb).zip(&op2(&r, &a, &bb)) {
            let s = F8E5M2::from_bits(x).to_f64() + F8E5M2::from_bits(y).to_f64();
            let expect = if s.is_nan() {
                0x7e
            } else if s.is_infinite() {
                if s > 0.0 {
                    0x7c
                } else {
                    0xfc
                }
            } else {
                F8E5M2::from_f64(s).to_bits()
            };
            assert_eq!(z, expect, "{x:#x} + {y:#x}");
        }
    }

    #[test]
    fn f16_bf16_sum_prod_match_correct_rounding() {
        // f32 computation then one rounding equals rounding the exact (f64) result.
        let vals: Vec<u16> = (0..=u16::MAX).step_by(97).chain([0x7bff, 0x0001, 0x8001, 0x3c00, 0x3c01]).collect();
        let a: Vec<u16> = vals.iter().flat_map(|&x| std::iter::repeat_n(x, vals.len())).collect();
        let bb: Vec<u16> = vals.iter().cycle().take(vals.len() * vals.len()).copied().collect();
        let ab: Vec<u8> = a.iter().flat_map(|x| x.to_ne_bytes()).collect();
        let bbb: Vec<u8> = bb.iter().flat_map(|x| x.to_ne_bytes()).collect();
        for op in [BuiltinOp::Sum, BuiltinOp::Prod] {
            let f = |x: f64, y: f64| if op == BuiltinOp::Sum { x + y } else { x * y };
            let out = op2(&red(DataType::Float16, op), &ab, &bbb);
            for ((&x, &y), z) in a.iter().zip(&bb).zip(out.chunks_exact(2)) {
                let e = f(f16::from_bits(x).to_f64(), f16::from_bits(y).to_f64());
                let expect = if e.is_nan() { 0x7e00 } else { f16::from_f64(e).to_bits() };
                assert_eq!(u16::from_ne_bytes([z[0], z[1]]), expect, "{op:?} {x:#x} {y:#x}");
            }
            let out = op2(&red(DataType::Bfloat16, op), &ab, &bbb);
            for ((&x, &y), z) in a.iter().zip(&bb).zip(out.chunks_exact(2)) {
                let e = f(bf16::from_bits(x).to_f64(), bf16::from_bits(y).to_f64());
                let expect = if e.is_nan() { 0x7fc0 } else { bf16::from_f64(e).to_bits() };
                assert_eq!(u16::from_ne_bytes([z[0], z[1]]), expect, "{op:?} {x:#x} {y:#x}");
            }
        }
    }

    /// Pseudo-random bytes (xorshift), deterministic.
    fn noise(len: usize, seed: u64) -> Vec<u8> {
        let mut s = seed | 1;
        (0..len)
            .map(|_| {
                s ^= s << 13;
                s ^= s >> 7;
                s ^= s << 17;
                (s >> 24) as u8
            })
            .collect()
    }

    fn all_reductions() -> Vec<Reduction> {
        let mut v = Vec::new();
        for t in DataType::ALL {
            for op in BuiltinOp::ALL {
                v.push(Reduction::builtin(t, op, 3));
            }
            v.push(Reduction::pre_mul_sum(t, &noise(8, t as u64 + 99)).unwrap());
        }
        v
    }

    #[test]
    fn every_dtype_op_commutative_on_random_bits() {
        for r in all_reductions() {
            let len = 64 * 8 + r.dtype.size() * 3;
            let a = noise(len, 1);
            let bb = noise(len, 2);
            let mut x = a.clone();
            r.accumulate(&mut x, &bb).unwrap();
            let mut y = bb.clone();
            r.accumulate(&mut y, &a).unwrap();
            assert_eq!(x, y, "{r:?}");
        }
    }

    #[test]
    fn in_place_variants_match_out_of_place() {
        for r in all_reductions() {
            let len = 40 * r.dtype.size();
            let inc = noise(len, 3);
            let local = noise(len, 4);
            let mut out = vec![0u8; len];
            r.combine(&mut out, &inc, &local).unwrap();
            let mut inplace = local.clone();
            r.combine_in_place(&mut inplace, &inc).unwrap();
            assert_eq!(out, inplace, "combine {r:?}");

            let mut prepared = vec![0u8; len];
            r.prepare(&mut prepared, &local).unwrap();
            let mut p2 = local.clone();
            r.prepare_in_place(&mut p2).unwrap();
            assert_eq!(prepared, p2, "prepare {r:?}");
            if !r.has_pre() {
                assert_eq!(prepared, local);
            }
            // combine == accumulate(incoming, prepare(local)).
            let mut acc = inc.clone();
            r.accumulate(&mut acc, &prepared).unwrap();
            assert_eq!(acc, out, "combine vs prepare+accumulate {r:?}");

            let mut fin = out.clone();
            r.finalize(&mut fin).unwrap();
            if !r.has_post() {
                assert_eq!(fin, out);
            }
        }
    }

    #[test]
    fn unaligned_slices_match_aligned() {
        for r in all_reductions() {
            let len = 257 * r.dtype.size();
            let (inc, local) = (noise(len, 5), noise(len, 6));
            let mut expect = vec![0u8; len];
            r.combine(&mut expect, &inc, &local).unwrap();
            let mut expect_acc = inc.clone();
            r.accumulate(&mut expect_acc, &local).unwrap();
            let mut expect_fin = expect.clone();
            r.finalize(&mut expect_fin).unwrap();
            for off in 1..r.dtype.size().max(2) + 1 {
                let shift = |v: &[u8]| {
                    let mut s = vec![0u8; off];
                    s.extend_from_slice(v);
                    s
                };
                let (si, sl) = (shift(&inc), shift(&local));
                let mut sd = vec![0u8; len + off];
                r.combine(&mut sd[off..], &si[off..], &sl[off..]).unwrap();
                assert_eq!(&sd[off..], &expect[..], "{r:?} off {off}");
                let mut sa = shift(&inc);
                r.accumulate(&mut sa[off..], &sl[off..]).unwrap();
                assert_eq!(&sa[off..], &expect_acc[..], "{r:?} off {off}");
                let mut sf = shift(&expect);
                r.finalize(&mut sf[off..]).unwrap();
                assert_eq!(&sf[off..], &expect_fin[..], "{r:?} off {off}");
            }
        }
    }

    #[test]
    fn length_errors() {
        for t in DataType::ALL {
            let r = Reduction::builtin(t, BuiltinOp::Sum, 2);
            let s = t.size();
            let mut d = vec![0u8; 4 * s];
            assert!(matches!(r.combine(&mut d, &vec![0; 4 * s], &vec![0; 3 * s]), Err(Error::Internal(_))));
            assert!(matches!(r.combine(&mut d, &vec![0; 5 * s], &vec![0; 4 * s]), Err(Error::Internal(_))));
            assert!(matches!(r.combine_in_place(&mut d, &vec![0; 3 * s]), Err(Error::Internal(_))));
            assert!(matches!(r.accumulate(&mut d, &vec![0; 8 * s]), Err(Error::Internal(_))));
            assert!(matches!(r.prepare(&mut d, &[]), Err(Error::Internal(_))));
            if s > 1 {
                let mut odd = vec![0u8; 4 * s + 1];
                assert!(matches!(r.combine(&mut odd.clone(), &odd.clone(), &odd), Err(Error::Internal(_))));
                assert!(matches!(r.accumulate(&mut odd.clone(), &odd), Err(Error::Internal(_))));
                assert!(matches!(r.prepare_in_place(&mut odd), Err(Error::Internal(_))));
                assert!(matches!(r.finalize(&mut odd), Err(Error::Internal(_))));
            }
            // Empty buffers are fine.
            r.combine(&mut [], &[], &[]).unwrap();
            r.accumulate(&mut [], &[]).unwrap();
            r.finalize(&mut []).unwrap();
        }
    }

    #[test]
    fn builtin_kinds() {
        for t in DataType::ALL {
            for (op, kind) in [
                (BuiltinOp::Sum, ReduceKind::Sum),
                (BuiltinOp::Prod, ReduceKind::Prod),
                (BuiltinOp::Max, ReduceKind::Max),
                (BuiltinOp::Min, ReduceKind::Min),
            ] {
                let r = Reduction::builtin(t, op, 8);
                assert_eq!((r.dtype, r.kind, r.pre, r.post), (t, kind, Pre::None, Post::None));
                assert!(!r.has_pre() && !r.has_post());
            }
            let avg = Reduction::builtin(t, BuiltinOp::Avg, 8);
            assert_eq!(avg.has_pre(), t.is_float());
            assert_eq!(avg.has_post(), !t.is_float());
        }
    }
}
