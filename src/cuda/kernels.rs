//! Reduction kernels for device memory: CUDA C (`kernels.cu`, embedded) compiled by NVRTC for
//! the running GPU at first use, loaded once per context, launched on the caller's stream.
//!
//! One "fold" kernel per (type, operator), `ferroccl_fold_<type>_<op>`, computes
//! `out[i] = post(pre_0(in_0[i]) op ... op pre_{n-1}(in_{n-1}[i]))` left to right with the
//! host path's arithmetic bit for bit (see `reduce` and the comment atop `kernels.cu`):
//! the same result as `acc = prepare(in_0)`, then `acc = combine(incoming = acc, local = in_k)`
//! for each further input, then `finalize(acc)`.
//!
//! Building: `--gpu-architecture=sm_XY` (a CUBIN) when NVRTC knows the device's compute
//! capability, else `compute_XY` PTX for the newest architecture NVRTC supports below it (the
//! driver JIT-compiles it), with `--fmad=false --ftz=false --prec-div=true`. One NVRTC program
//! per element type (`-DFERROCCL_TYPE_<t>`): [`prepare_current_device`] builds the twelve on
//! several threads, [`fold`] builds only its own type on first use. Images are cached per
//! (compute capability, type), modules and functions per `CUcontext` (a context is never
//! destroyed by ferroccl; one the application destroys and whose address the driver reuses
//! would need [`forget_current_context`]). NVRTC is opened only after
//! `is_culib_present()` said yes; a build failure is `Error::Cuda` carrying NVRTC's log.
//!
//! Launch shape: 256-thread blocks, at most 8 blocks per SM, grid-stride loops. When `out` and
//! every input are 16-byte aligned each thread moves 16 bytes per input per step; the rest
//! (and unaligned buffers) go element by element.

use std::collections::HashMap;
use std::ffi::{c_char, c_int, c_void, CStr, CString};
use std::sync::{Arc, LazyLock, Mutex};

use cudarc::driver::sys;
use cudarc::nvrtc::sys as nvrtc;

use super::driver::{self, check};
use super::stream::Stream;
use crate::error::{Error, Result};
use crate::reduce::{Post, Pre, ReduceKind, Reduction};
use crate::types::DataType;

/// The most inputs one fold kernel takes.
pub const MAX_INPUTS: usize = 16;

/// The CUDA C source of every kernel.
pub const SOURCE: &str = include_str!("kernels.cu");

/// Threads per block.
const BLOCK: u32 = 256;
/// Upper bound on resident blocks per SM we launch (the loops stride over the rest).
const BLOCKS_PER_SM: u64 = 8;

/// NVRTC options besides the architecture: IEEE arithmetic, no contraction into FMA.
const OPTIONS: [&str; 5] = ["--fmad=false", "--ftz=false", "--prec-div=true", "--prec-sqrt=true", "--std=c++17"];

/// Kernel name parts per type, in [`DataType::ALL`] order.
const TYPE_NAMES: [(DataType, &str); 12] = [
    (DataType::Int8, "i8"),
    (DataType::Uint8, "u8"),
    (DataType::Int32, "i32"),
    (DataType::Uint32, "u32"),
    (DataType::Int64, "i64"),
    (DataType::Uint64, "u64"),
    (DataType::Float16, "f16"),
    (DataType::Float32, "f32"),
    (DataType::Float64, "f64"),
    (DataType::Bfloat16, "bf16"),
    (DataType::Float8e4m3, "e4m3"),
    (DataType::Float8e5m2, "e5m2"),
];

/// Kernel name parts per operator.
const OP_NAMES: [(ReduceKind, &str); 4] =
    [(ReduceKind::Sum, "sum"), (ReduceKind::Prod, "prod"), (ReduceKind::Max, "max"), (ReduceKind::Min, "min")];

fn kernel_index(dtype: DataType, kind: ReduceKind) -> usize {
    let t = TYPE_NAMES.iter().position(|(d, _)| *d == dtype);
    let o = OP_NAMES.iter().position(|(k, _)| *k == kind);
    // invariant: both tables list every variant of their enum.
    t.expect("every DataType has a name") * OP_NAMES.len() + o.expect("every ReduceKind has a name")
}

/// The entry point that folds `dtype` with `kind`.
pub fn kernel_name(dtype: DataType, kind: ReduceKind) -> String {
    let (_, t) = TYPE_NAMES[kernel_index(dtype, kind) / OP_NAMES.len()];
    let (_, o) = OP_NAMES[kernel_index(dtype, kind) % OP_NAMES.len()];
    format!("ferroccl_fold_{t}_{o}")
}

/// The entry point that runs a [`FoldBatch`] of `dtype` with `kind`.
pub fn batch_kernel_name(dtype: DataType, kind: ReduceKind) -> String {
    kernel_name(dtype, kind).replacen("ferroccl_fold_", "ferroccl_batch_", 1)
}

/// All 48 single-fold entry points, in the order of the function table of a loaded module
/// (each has a batch twin, [`batch_kernel_name`]).
pub fn kernel_names() -> Vec<String> {
    TYPE_NAMES.iter().flat_map(|(d, _)| OP_NAMES.iter().map(move |(k, _)| kernel_name(*d, *k))).collect()
}

/// The `pre` multiply of one input.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum PreScalar {
    /// The input enters as it is.
    None,
    /// Multiply by this scalar of the element type: its raw native-endian bytes, as
    /// [`Pre::Mul`] stores them (the first `dtype.size()` bytes are used).
    Bits([u8; 8]),
    /// Multiply by the scalar of the element type that this device pointer holds when the
    /// kernel runs (`ncclScalarDevice`).
    Device(*const u8),
}

/// One fold: `out = post(pre_0(inputs[0]) op ... op pre_{n-1}(inputs[n-1]))`, element-wise.
#[derive(Clone, Copy, Debug)]
pub struct Fold<'a> {
    pub dtype: DataType,
    pub kind: ReduceKind,
    /// `count` elements of device memory; may be one of the inputs (in place).
    pub out: *mut u8,
    /// 1 to [`MAX_INPUTS`] buffers of `count` elements each.
    pub inputs: &'a [*const u8],
    /// Empty: no input has a pre step; else one entry per input.
    pub pre: &'a [PreScalar],
    /// Integer average: divide the result by this (non-zero) count.
    pub post_div: Option<u64>,
    pub count: usize,
    /// Up to [`MAX_INPUTS`] more buffers that get the same result in the same pass (each may
    /// be one of the inputs): an all-reduce writes every rank's output while it reads.
    pub more_outs: &'a [*mut u8],
}

/// What a host-path [`Reduction`] asks of the fold kernel: its operator, the pre step of each
/// input, and the post divisor.
pub fn from_reduction(r: &Reduction) -> (ReduceKind, PreScalar, Option<u64>) {
    let pre = match r.pre {
        Pre::None => PreScalar::None,
        Pre::Mul(bits) => PreScalar::Bits(bits),
    };
    let post = match r.post {
        Post::None => None,
        Post::Div(n) => Some(n),
    };
    (r.kind, pre, post)
}

/// The kernels' parameter block: `struct FoldParams` in kernels.cu (passed by value).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FoldParams {
    out: u64,
    inputs: [u64; MAX_INPUTS],
    pre_bits: [u64; MAX_INPUTS],
    pre_ptr: [u64; MAX_INPUTS],
    count: u64,
    post_div: u64,
    n_in: c_int,
    pre_mask: u32,
    n_more: u64,
    more_out: [u64; MAX_INPUTS],
    groups: u64,
    group_bytes: u64,
}

const _: () = assert!(size_of::<FoldParams>() == 568);

impl FoldParams {
    /// The byte ranges the kernel reads and writes with these parameters (elements of
    /// `elem_size` bytes), as kernels.cu's `fold` walks them.
    pub fn footprint(&self, elem_size: usize) -> (Vec<std::ops::Range<u64>>, Vec<std::ops::Range<u64>>) {
        let n_in = (self.n_in.max(0) as usize).min(MAX_INPUTS);
        let n_more = (self.n_more as usize).min(MAX_INPUTS);
        let bytes = self.count * elem_size as u64;
        // Group g of a grouped launch sits g * group_bytes into its buffer.
        let grouped = bytes + self.groups.saturating_sub(1) * self.group_bytes;
        let fan_out = self.groups > 1 && n_in == 1 && self.pre_mask == 0 && self.post_div == 0;
        let span = |at: u64, len: u64| at..at + len;
        let outs = std::iter::once(self.out).chain(self.more_out[..n_more].iter().copied());
        let (mut reads, writes): (Vec<_>, Vec<_>) = if self.groups <= 1 {
            (self.inputs[..n_in].iter().map(|&a| span(a, bytes)).collect(), outs.map(|a| span(a, bytes)).collect())
        } else if fan_out {
            // Source g is inputs[g], copied to offset g * group_bytes of every output.
            let sources = (self.groups as usize).min(MAX_INPUTS);
            (self.inputs[..sources].iter().map(|&a| span(a, bytes)).collect(), outs.map(|a| span(a, grouped)).collect())
        } else {
            // Every input holds all groups; output g takes group g.
            (self.inputs[..n_in].iter().map(|&a| span(a, grouped)).collect(), outs.map(|a| span(a, bytes)).collect())
        };
        for k in 0..n_in {
            if (self.pre_mask >> k) & 1 == 1 && self.pre_ptr[k] != 0 {
                reads.push(span(self.pre_ptr[k], elem_size as u64));
            }
        }
        (reads, writes)
    }
}

/// The most folds one batch launch runs: what fits in the 4 KiB of kernel parameters.
pub const BATCH_MAX: usize = 7;

/// The batch kernels' parameter block: `struct FoldBatch` in kernels.cu (passed by value).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct FoldBatch {
    ops: [FoldParams; BATCH_MAX],
    n_ops: u64,
}

const _: () = assert!(size_of::<FoldBatch>() == 3984);

impl FoldBatch {
    /// The batch of `ops` (1 to [`BATCH_MAX`]); the unused entries are never read.
    pub fn of(ops: &[FoldParams]) -> Result<FoldBatch> {
        let (&first, _) = ops.split_first().ok_or_else(|| Error::internal("empty fold batch"))?;
        if ops.len() > BATCH_MAX {
            return Err(Error::internal(format!("fold batch of {} (at most {BATCH_MAX})", ops.len())));
        }
        let mut b = FoldBatch { ops: [first; BATCH_MAX], n_ops: ops.len() as u64 };
        b.ops[..ops.len()].copy_from_slice(ops);
        Ok(b)
    }
}

/// Checks a fold and lays out the kernel's parameters (what [`fold`] launches with; public so
/// that tests can run kernels.cu's code on the host).
pub fn fold_params(f: &Fold<'_>) -> Result<FoldParams> {
    let n = f.inputs.len();
    if n == 0 || n > MAX_INPUTS {
        return Err(Error::internal(format!("fold kernel: {n} inputs (1 to {MAX_INPUTS} allowed)")));
    }
    if !f.pre.is_empty() && f.pre.len() != n {
        return Err(Error::internal(format!("fold kernel: {} pre scalars for {n} inputs", f.pre.len())));
    }
    if f.post_div == Some(0) {
        return Err(Error::internal("fold kernel: post-divide by zero"));
    }
    if f.more_outs.len() > MAX_INPUTS {
        return Err(Error::internal(format!("fold kernel: {} more outputs (at most {MAX_INPUTS})", f.more_outs.len())));
    }
    if f.count > 0
        && (f.out.is_null() || f.inputs.iter().any(|p| p.is_null()) || f.more_outs.iter().any(|p| p.is_null()))
    {
        return Err(Error::internal("fold kernel: NULL buffer"));
    }
    let mut p = FoldParams {
        out: f.out as u64,
        inputs: [0; MAX_INPUTS],
        pre_bits: [0; MAX_INPUTS],
        pre_ptr: [0; MAX_INPUTS],
        count: f.count as u64,
        post_div: f.post_div.unwrap_or(0),
        n_in: n as c_int,
        pre_mask: 0,
        n_more: f.more_outs.len() as u64,
        more_out: [0; MAX_INPUTS],
        groups: 1,
        group_bytes: 0,
    };
    for (slot, out) in p.more_out.iter_mut().zip(f.more_outs) {
        *slot = *out as u64;
    }
    for (k, input) in f.inputs.iter().enumerate() {
        p.inputs[k] = *input as u64;
    }
    for (k, pre) in f.pre.iter().enumerate() {
        match *pre {
            PreScalar::None => {}
            PreScalar::Bits(bits) => {
                p.pre_bits[k] = u64::from_ne_bytes(bits);
                p.pre_mask |= 1 << k;
            }
            PreScalar::Device(ptr) => {
                if ptr.is_null() {
                    return Err(Error::internal("fold kernel: NULL device scalar"));
                }
                p.pre_ptr[k] = ptr as u64;
                p.pre_mask |= 1 << k;
            }
        }
    }
    Ok(p)
}

/// Several sources, each copied to every output at its own offset, in one launch: group `g`
/// copies `sources[g]` (`bytes` each) to `outs[m] + g * bytes` for every `m`. An all-gather is
/// one (source `g` is rank `g`'s input, the outputs are every rank's buffer), as is a gather
/// (one output) or one rank's share of an all-to-all.
#[derive(Clone, Copy, Debug)]
pub struct FanOut<'a> {
    pub sources: &'a [*const u8],
    pub outs: &'a [*mut u8],
    pub bytes: usize,
}

/// The kernel parameters of a grouped copy, or `None` where the one-launch form does not
/// apply: fewer than two or more than [`MAX_INPUTS`] sources, no output or more than
/// `1 + MAX_INPUTS`, or a pointer or `bytes` not a multiple of 16 (then copy per source).
pub fn fan_out_params(f: &FanOut<'_>) -> Option<FoldParams> {
    let aligned = |a: usize| a % 16 == 0;
    let usable = (2..=MAX_INPUTS).contains(&f.sources.len())
        && (1..=1 + MAX_INPUTS).contains(&f.outs.len())
        && aligned(f.bytes)
        && f.sources.iter().all(|&p| !p.is_null() && aligned(p as usize))
        && f.outs.iter().all(|&p| !p.is_null() && aligned(p as usize));
    if !usable {
        return None;
    }
    // A one-input copy (the byte type's sum kernel) of the first source, then every source
    // in the input slots, one per group.
    let copy = Fold {
        dtype: DataType::Uint8,
        kind: ReduceKind::Sum,
        out: f.outs[0],
        inputs: &f.sources[..1],
        pre: &[],
        post_div: None,
        count: f.bytes,
        more_outs: &f.outs[1..],
    };
    let mut p = fold_params(&copy).ok()?;
    for (slot, src) in p.inputs.iter_mut().zip(f.sources) {
        *slot = *src as u64;
    }
    p.groups = f.sources.len() as u64;
    p.group_bytes = f.bytes as u64;
    Some(p)
}

/// The kernel parameters of one launch folding `f`'s inputs per group (a reduce-scatter):
/// group `g` folds every input at byte offset `g * group_bytes` into `outs[g]`, `f.count`
/// elements each (`f.out` and `f.more_outs` are not used). `Ok(None)` where the one-launch form
/// does not apply: fewer than two inputs or groups, more than `1 + MAX_INPUTS` groups, or a
/// pointer, `group_bytes` or the group's bytes not a multiple of 16 (then fold per group).
pub fn grouped_fold_params(f: &Fold<'_>, outs: &[*mut u8], group_bytes: usize) -> Result<Option<FoldParams>> {
    let aligned = |a: usize| a % 16 == 0;
    let usable = f.inputs.len() >= 2
        && (2..=1 + MAX_INPUTS).contains(&outs.len())
        && aligned(group_bytes)
        && aligned(f.count * f.dtype.size())
        && f.inputs.iter().all(|&p| aligned(p as usize))
        && outs.iter().all(|&p| !p.is_null() && aligned(p as usize));
    if !usable {
        return Ok(None);
    }
    let mut p = fold_params(&Fold { out: outs[0], more_outs: &[], ..*f })?;
    p.n_more = (outs.len() - 1) as u64;
    for (slot, out) in p.more_out.iter_mut().zip(&outs[1..]) {
        *slot = *out as u64;
    }
    p.groups = outs.len() as u64;
    p.group_bytes = group_bytes as u64;
    Ok(Some(p))
}

/// Launches a grouped fold ([`grouped_fold_params`]) on `stream` as one kernel; `Ok(false)`
/// (nothing queued) where the one-launch form does not apply.
///
/// # Safety
/// Every input must be device-accessible memory of `outs.len() * group_bytes` bytes, every
/// output and device scalar as for [`fold`], valid until the kernel has run.
pub unsafe fn fold_groups(stream: Stream, f: &Fold<'_>, outs: &[*mut u8], group_bytes: usize) -> Result<bool> {
    let Some(p) = grouped_fold_params(f, outs, group_bytes)? else { return Ok(false) };
    if f.count > 0 {
        // SAFETY: the caller's contract, passed on.
        unsafe { launch(stream, f.dtype, f.kind, p)? };
    }
    Ok(true)
}

/// Blocks to launch for `p` on a device with `sm_count` SMs.
fn grid_blocks(p: &FoldParams, elem_size: usize, sm_count: u32) -> u32 {
    let aligned = p.inputs[..p.n_in as usize].iter().chain([&p.out]).all(|a| a % 16 == 0);
    let per_thread = if aligned { (16 / elem_size) as u64 } else { 1 };
    let threads = p.count.div_ceil(per_thread);
    let blocks = threads.div_ceil(BLOCK as u64);
    blocks.clamp(1, u64::from(sm_count.max(1)) * BLOCKS_PER_SM) as u32
}

// ---------------------------------------------------------------------------------------------
// NVRTC.

/// What NVRTC produced.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ImageKind {
    Cubin,
    /// NUL-terminated PTX text.
    Ptx,
}

/// A compiled kernel image.
#[derive(Debug)]
pub struct Image {
    pub kind: ImageKind,
    pub code: Vec<u8>,
    /// NVRTC's log (warnings), empty when it had nothing to say.
    pub log: String,
}

/// Whether the NVRTC library can be opened (probed once).
pub fn nvrtc_available() -> bool {
    static PRESENT: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    // SAFETY: only tries to open the library; no NVRTC call is made.
    *PRESENT.get_or_init(|| std::panic::catch_unwind(|| unsafe { nvrtc::is_culib_present() }).unwrap_or(false))
}

fn nvrtc_check(res: nvrtc::nvrtcResult, call: &'static str) -> Result<()> {
    if res == nvrtc::nvrtcResult::NVRTC_SUCCESS {
        return Ok(());
    }
    // SAFETY: NVRTC returns a static NUL-terminated string (or NULL) for any result code.
    let text = unsafe { nvrtc::nvrtcGetErrorString(res) };
    let message = if text.is_null() {
        format!("NVRTC error {}", res as i32)
    } else {
        // SAFETY: non-NULL static string from NVRTC.
        unsafe { CStr::from_ptr(text) }.to_string_lossy().into_owned()
    };
    Err(Error::Cuda { call, message })
}

/// Runs `f`, turning a panic inside cudarc (a symbol missing from an old NVRTC) into an error.
fn no_panic<T>(what: &'static str, f: impl FnOnce() -> Result<T>) -> Result<T> {
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)).unwrap_or_else(|_| {
        Err(Error::Cuda { call: what, message: "the NVRTC library lacks a function ferroccl needs".into() })
    })
}

/// The architectures (e.g. 90 for sm_90) that the loaded NVRTC can build for.
pub fn supported_archs() -> Result<Vec<i32>> {
    if !nvrtc_available() {
        return Err(Error::Cuda { call: "nvrtc", message: "the NVRTC library (libnvrtc.so) was not found".into() });
    }
    no_panic("nvrtcGetSupportedArchs", || {
        let mut n: c_int = 0;
        // SAFETY: the library is present; out-pointer is a live local.
        nvrtc_check(unsafe { nvrtc::nvrtcGetNumSupportedArchs(&mut n) }, "nvrtcGetNumSupportedArchs")?;
        let mut archs = vec![0 as c_int; n.max(0) as usize];
        // SAFETY: the buffer holds the number of entries NVRTC just reported.
        nvrtc_check(unsafe { nvrtc::nvrtcGetSupportedArchs(archs.as_mut_ptr()) }, "nvrtcGetSupportedArchs")?;
        Ok(archs)
    })
}

/// The `--gpu-arch` for a device of compute capability `cc` (major * 10 + minor): the real
/// architecture when NVRTC supports it, else PTX for the newest supported one below it.
fn arch_for(cc: i32, supported: &[i32]) -> Option<String> {
    if supported.contains(&cc) {
        return Some(format!("sm_{cc}"));
    }
    supported.iter().filter(|&&a| a <= cc).max().map(|a| format!("compute_{a}"))
}

/// Owns an nvrtcProgram and destroys it on drop.
struct Program(nvrtc::nvrtcProgram);

impl Drop for Program {
    fn drop(&mut self) {
        // SAFETY: the program came from nvrtcCreateProgram and is destroyed once.
        unsafe { nvrtc::nvrtcDestroyProgram(&mut self.0) };
    }
}

impl Program {
    fn log(&self) -> String {
        let mut size = 0usize;
        // SAFETY: live program; out-pointer is a live local.
        if unsafe { nvrtc::nvrtcGetProgramLogSize(self.0, &mut size) } != nvrtc::nvrtcResult::NVRTC_SUCCESS {
            return String::new();
        }
        let mut buf = vec![0u8; size.max(1)];
        // SAFETY: the buffer has the size NVRTC reported.
        if unsafe { nvrtc::nvrtcGetProgramLog(self.0, buf.as_mut_ptr() as *mut c_char) }
            != nvrtc::nvrtcResult::NVRTC_SUCCESS
        {
            return String::new();
        }
        let end = buf.iter().position(|&b| b == 0).unwrap_or(buf.len());
        String::from_utf8_lossy(&buf[..end]).trim().to_string()
    }
}

/// Compiles [`SOURCE`] for `arch` (`sm_XY`: a CUBIN; `compute_XY`: PTX). Needs no GPU.
pub fn compile(arch: &str) -> Result<Image> {
    compile_source(SOURCE, arch, &[])
}

/// Compiles only the four kernels of `dtype`.
pub fn compile_type(arch: &str, dtype: DataType) -> Result<Image> {
    let (_, t) = TYPE_NAMES[kernel_index(dtype, ReduceKind::Sum) / OP_NAMES.len()];
    compile_source(SOURCE, arch, &["-DFERROCCL_ONE_TYPE".to_string(), format!("-DFERROCCL_TYPE_{t}")])
}

fn compile_source(source: &str, arch: &str, defines: &[String]) -> Result<Image> {
    if !nvrtc_available() {
        return Err(Error::Cuda { call: "nvrtc", message: "the NVRTC library (libnvrtc.so) was not found".into() });
    }
    let kind = if arch.starts_with("sm_") { ImageKind::Cubin } else { ImageKind::Ptx };
    let source = CString::new(source).map_err(|_| Error::internal("kernels.cu contains a NUL byte"))?;
    let name = c"ferroccl_kernels.cu";
    let mut options: Vec<CString> = Vec::new();
    let all = std::iter::once(format!("--gpu-architecture={arch}"))
        .chain(OPTIONS.iter().map(|s| s.to_string()))
        .chain(defines.iter().cloned());
    for o in all {
        options.push(CString::new(o).map_err(|_| Error::internal("NUL in an NVRTC option"))?);
    }
    let option_ptrs: Vec<*const c_char> = options.iter().map(|o| o.as_ptr()).collect();
    no_panic("nvrtcCompileProgram", || {
        let mut raw: nvrtc::nvrtcProgram = std::ptr::null_mut();
        // SAFETY: source and name are NUL-terminated and outlive the call; no headers.
        let res = unsafe {
            nvrtc::nvrtcCreateProgram(&mut raw, source.as_ptr(), name.as_ptr(), 0, std::ptr::null(), std::ptr::null())
        };
        nvrtc_check(res, "nvrtcCreateProgram")?;
        let program = Program(raw);
        // SAFETY: live program; the option pointers point into `options`, alive here.
        let res = unsafe { nvrtc::nvrtcCompileProgram(program.0, option_ptrs.len() as c_int, option_ptrs.as_ptr()) };
        let log = program.log();
        if res != nvrtc::nvrtcResult::NVRTC_SUCCESS {
            let err = nvrtc_check(res, "nvrtcCompileProgram").err().map(|e| e.to_string()).unwrap_or_default();
            return Err(Error::Cuda {
                call: "nvrtcCompileProgram",
                message: format!("building the reduction kernels for {arch} failed ({err}):\n{log}"),
            });
        }
        let mut size = 0usize;
        let code = match kind {
            ImageKind::Cubin => {
                // SAFETY: compiled program; out-pointer is a live local.
                nvrtc_check(unsafe { nvrtc::nvrtcGetCUBINSize(program.0, &mut size) }, "nvrtcGetCUBINSize")?;
                let mut code = vec![0u8; size];
                // SAFETY: the buffer has the size NVRTC reported.
                let res = unsafe { nvrtc::nvrtcGetCUBIN(program.0, code.as_mut_ptr() as *mut c_char) };
                nvrtc_check(res, "nvrtcGetCUBIN")?;
                code
            }
            ImageKind::Ptx => {
                // SAFETY: as above.
                nvrtc_check(unsafe { nvrtc::nvrtcGetPTXSize(program.0, &mut size) }, "nvrtcGetPTXSize")?;
                let mut code = vec![0u8; size];
                // SAFETY: as above (the size includes the terminating NUL).
                let res = unsafe { nvrtc::nvrtcGetPTX(program.0, code.as_mut_ptr() as *mut c_char) };
                nvrtc_check(res, "nvrtcGetPTX")?;
                code
            }
        };
        Ok(Image { kind, code, log })
    })
}

// ---------------------------------------------------------------------------------------------
// Modules per context.

/// The four kernels (in [`OP_NAMES`] order) of one type and their batch twins, loaded into
/// one context.
#[derive(Clone, Copy)]
struct TypeKernels {
    fold: [sys::CUfunction; 4],
    batch: [sys::CUfunction; 4],
}

// SAFETY: function handles are process-wide driver objects, usable from any thread in which
// their context is current; they are never mutated. (Their modules are never unloaded: the
// context owns them and frees them when it is destroyed.)
unsafe impl Send for TypeKernels {}
// SAFETY: as above.
unsafe impl Sync for TypeKernels {}

/// What one context has loaded.
struct ContextKernels {
    /// Compute capability, major * 10 + minor.
    cc: i32,
    sm_count: u32,
    /// By type, in [`TYPE_NAMES`] order.
    types: [Option<TypeKernels>; 12],
}

#[derive(Default)]
struct Cache {
    /// Images by (compute capability, type index).
    images: HashMap<(i32, usize), Arc<Image>>,
    /// Loaded kernels by CUcontext address.
    contexts: HashMap<usize, ContextKernels>,
}

fn cache() -> std::sync::MutexGuard<'static, Cache> {
    static CACHE: LazyLock<Mutex<Cache>> = LazyLock::new(Mutex::default);
    // A panic while holding the lock leaves nothing half-written that matters: recover.
    CACHE.lock().unwrap_or_else(|e| e.into_inner())
}

fn attribute(attr: sys::CUdevice_attribute, dev: sys::CUdevice) -> Result<i32> {
    let mut v: c_int = 0;
    // SAFETY: CUDA is available (callers checked); out-pointer is a live local.
    let res = unsafe { sys::cuDeviceGetAttribute(&mut v, attr, dev) };
    check(res, "cuDeviceGetAttribute")?;
    Ok(v)
}

/// The current context's key and, the first time it is seen, its device's properties.
fn current_context_key() -> Result<usize> {
    if !driver::available() {
        return Err(Error::Cuda { call: "cuInit", message: "CUDA is not available in this process".into() });
    }
    let ctx = driver::current_context()
        .ok_or_else(|| Error::Cuda { call: "cuCtxGetCurrent", message: "no CUDA context is current".into() })?;
    let key = ctx.key();
    if cache().contexts.contains_key(&key) {
        return Ok(key);
    }
    let dev = driver::current_device()
        .ok_or_else(|| Error::Cuda { call: "cuCtxGetDevice", message: "no device for the current context".into() })?;
    use sys::CUdevice_attribute as A;
    let major = attribute(A::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, dev)?;
    let minor = attribute(A::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, dev)?;
    let sm_count = attribute(A::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, dev)?;
    let entry = ContextKernels { cc: major * 10 + minor, sm_count: sm_count.max(1) as u32, types: [None; 12] };
    cache().contexts.entry(key).or_insert(entry);
    Ok(key)
}

/// Compiles the images of `types` for `cc`, several at a time.
fn build_images(cc: i32, types: &[usize]) -> Result<Vec<(usize, Image)>> {
    let archs = supported_archs()?;
    let arch = arch_for(cc, &archs).ok_or_else(|| Error::Cuda {
        call: "nvrtcGetSupportedArchs",
        message: format!(
            "this NVRTC cannot build for compute capability {}.{} (it supports {archs:?})",
            cc / 10,
            cc % 10
        ),
    })?;
    let started = std::time::Instant::now();
    let workers = std::thread::available_parallelism().map_or(1, |n| n.get()).clamp(1, types.len().max(1));
    let next = std::sync::atomic::AtomicUsize::new(0);
    let results: Mutex<Vec<(usize, Result<Image>)>> = Mutex::new(Vec::new());
    std::thread::scope(|s| {
        for _ in 0..workers {
            s.spawn(|| loop {
                let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                let Some(&t) = types.get(i) else { break };
                let image = compile_type(&arch, TYPE_NAMES[t].0);
                results.lock().unwrap_or_else(|e| e.into_inner()).push((t, image));
            });
        }
    });
    let mut images = Vec::new();
    for (t, image) in results.into_inner().unwrap_or_else(|e| e.into_inner()) {
        let image = image?;
        if !image.log.is_empty() {
            log::warn!(target: "INIT", "NVRTC said while building the {} kernels:\n{}", TYPE_NAMES[t].1, image.log);
        }
        images.push((t, image));
    }
    log::info!(
        target: "INIT",
        "CUDA: built {} type(s) of reduction kernels for {arch} in {} ms",
        types.len(),
        started.elapsed().as_millis()
    );
    Ok(images)
}

/// Loads `image` into the current context and looks up the type's eight kernels.
fn load(image: &Image, t: usize) -> Result<TypeKernels> {
    let mut module: sys::CUmodule = std::ptr::null_mut();
    // SAFETY: a context is current; the image is a complete CUBIN or NUL-terminated PTX that
    // outlives the call.
    let res = unsafe { sys::cuModuleLoadData(&mut module, image.code.as_ptr() as *const c_void) };
    check(res, "cuModuleLoadData")?;
    let mut kernels = TypeKernels { fold: [std::ptr::null_mut(); 4], batch: [std::ptr::null_mut(); 4] };
    let dtype = TYPE_NAMES[t].0;
    let named = kernels
        .fold
        .iter_mut()
        .zip(OP_NAMES)
        .map(|(f, (kind, _))| (f, kernel_name(dtype, kind)))
        .chain(kernels.batch.iter_mut().zip(OP_NAMES).map(|(f, (kind, _))| (f, batch_kernel_name(dtype, kind))));
    for (f, name) in named {
        let name = CString::new(name).map_err(|_| Error::internal("NUL in a kernel name"))?;
        // SAFETY: module was just loaded; the name is NUL-terminated; out-pointer is live.
        let res = unsafe { sys::cuModuleGetFunction(f, module, name.as_ptr()) };
        check(res, "cuModuleGetFunction")?;
        // Load the function now even under CUDA's lazy loading: loading code later, while a
        // stream of this context waits on a flag that only this library will set, can wait
        // for that stream and deadlock (NCCL forces its kernels in at init for the same reason).
        let mut threads: c_int = 0;
        // SAFETY: f is a function of the loaded module; out-pointer is live.
        let res = unsafe {
            sys::cuFuncGetAttribute(
                &mut threads,
                sys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK,
                *f,
            )
        };
        check(res, "cuFuncGetAttribute")?;
    }
    Ok(kernels)
}

/// The error when another thread called [`forget_current_context`] in the middle of a fold.
fn forgotten() -> Error {
    Error::invalid_usage("the current CUDA context's kernels were forgotten while in use")
}

/// Makes sure the kernels of `types` (indices into [`TYPE_NAMES`]) are loaded in the current
/// context; returns the context's key.
fn ensure(types: &[usize]) -> Result<usize> {
    let key = current_context_key()?;
    let (cc, missing) = {
        let cache = cache();
        let ctx = cache.contexts.get(&key).ok_or_else(forgotten)?;
        (ctx.cc, types.iter().copied().filter(|&t| ctx.types[t].is_none()).collect::<Vec<_>>())
    };
    if missing.is_empty() {
        return Ok(key);
    }
    // Compile outside the lock (seconds); two threads may race to build one image, the second
    // result is dropped.
    let to_build: Vec<usize> = {
        let cache = cache();
        missing.iter().copied().filter(|&t| !cache.images.contains_key(&(cc, t))).collect()
    };
    let built = if to_build.is_empty() { Vec::new() } else { build_images(cc, &to_build)? };
    let mut cache = cache();
    for (t, image) in built {
        cache.images.entry((cc, t)).or_insert_with(|| Arc::new(image));
    }
    for t in missing {
        if cache.contexts.get(&key).ok_or_else(forgotten)?.types[t].is_some() {
            continue;
        }
        let image = cache.images.get(&(cc, t)).cloned().ok_or_else(|| Error::internal("kernel image missing"))?;
        let kernels = load(&image, t)?;
        if let Some(ctx) = cache.contexts.get_mut(&key) {
            ctx.types[t] = Some(kernels);
        }
    }
    Ok(key)
}

/// Builds and loads every kernel for the current context now (so that the first collective
/// does not pay for it); Ok(()) when they already are.
pub fn prepare_current_device() -> Result<()> {
    let all: Vec<usize> = (0..TYPE_NAMES.len()).collect();
    ensure(&all).map(|_| ())
}

/// Whether the kernels of `dtype` are loaded in the calling thread's current context (built
/// at communicator creation in CUDA programs).
pub fn loaded(dtype: DataType) -> bool {
    let Some(ctx) = driver::current_context() else { return false };
    let t = kernel_index(dtype, ReduceKind::Sum) / OP_NAMES.len();
    cache().contexts.get(&ctx.key()).is_some_and(|c| c.types[t].is_some())
}

/// Drops the kernels cached for the current context (call before an application destroys it
/// if a new context might reuse its address).
pub fn forget_current_context() {
    if let Some(ctx) = driver::current_context() {
        cache().contexts.remove(&ctx.key());
    }
}

/// Launches the fold on `stream` in the calling thread's current context.
///
/// # Safety
/// `out`, every input and every device scalar must be device-accessible memory of `count`
/// elements (one element for a scalar) that stays valid until the kernel has run.
pub unsafe fn fold(stream: Stream, f: &Fold<'_>) -> Result<()> {
    let p = fold_params(f)?;
    if f.count == 0 {
        return Ok(());
    }
    // SAFETY: the caller's contract, passed on.
    unsafe { launch(stream, f.dtype, f.kind, p) }
}

/// Launches a grouped copy ([`FanOut`]) on `stream` as one kernel; `Ok(false)` (nothing
/// queued) where the one-launch form does not apply ([`fan_out_params`]).
///
/// # Safety
/// Every source and output must be device-accessible memory (sources of `bytes`, outputs of
/// `sources.len() * bytes`) that stays valid until the kernel has run.
pub unsafe fn fan_out(stream: Stream, f: &FanOut<'_>) -> Result<bool> {
    let Some(p) = fan_out_params(f) else { return Ok(false) };
    if f.bytes > 0 {
        // SAFETY: the caller's contract, passed on; a copy is the byte type's sum kernel
        // with one input and no pre or post step.
        unsafe { launch(stream, DataType::Uint8, ReduceKind::Sum, p)? };
    }
    Ok(true)
}

/// The (dtype, kind) fold kernel and its batch twin in the current context, and the
/// device's SM count.
fn functions(dtype: DataType, kind: ReduceKind) -> Result<(sys::CUfunction, sys::CUfunction, u32)> {
    let index = kernel_index(dtype, kind);
    let (t, op) = (index / OP_NAMES.len(), index % OP_NAMES.len());
    let key = ensure(&[t])?;
    let cache = cache();
    let ctx = cache.contexts.get(&key).ok_or_else(forgotten)?;
    let kernels = ctx.types[t].ok_or_else(|| Error::internal("fold kernels not loaded"))?;
    Ok((kernels.fold[op], kernels.batch[op], ctx.sm_count))
}

/// Launches the (dtype, kind) kernel with `p` on `stream`.
///
/// # Safety
/// Every buffer `p` names is device-accessible and stays valid until the kernel has run.
pub(super) unsafe fn launch(stream: Stream, dtype: DataType, kind: ReduceKind, mut p: FoldParams) -> Result<()> {
    let (func, _, sm_count) = functions(dtype, kind)?;
    let blocks = grid_blocks(&p, dtype.size(), sm_count);
    // SAFETY: func belongs to the current context's module and takes one FoldParams; the
    // caller keeps the buffers valid until the kernel has run.
    unsafe { launch_with(stream, func, (blocks, 1), &mut p as *mut FoldParams as *mut c_void) }
}

/// Launches the (dtype, kind) batch kernel for `ops` (1 to [`BATCH_MAX`]) on `stream`: one
/// row of blocks per fold, each as wide as the widest fold's own launch.
///
/// # Safety
/// As for [`launch`], for every fold; no fold may read bytes another one writes, and two
/// folds may write the same bytes only if they are identical and neither reads what it
/// writes.
pub(super) unsafe fn launch_batch(stream: Stream, dtype: DataType, kind: ReduceKind, ops: &[FoldParams]) -> Result<()> {
    let (_, func, sm_count) = functions(dtype, kind)?;
    let mut b = FoldBatch::of(ops)?;
    let blocks = ops.iter().map(|p| grid_blocks(p, dtype.size(), sm_count)).max().unwrap_or(1);
    // SAFETY: func is the batch twin and takes one FoldBatch; the caller's contract covers
    // every fold in it.
    unsafe { launch_with(stream, func, (blocks, ops.len() as u32), &mut b as *mut FoldBatch as *mut c_void) }
}

/// One cuLaunchKernel of a kernel with a single by-value parameter at `param`.
///
/// # Safety
/// `func` belongs to the current context's module and its one parameter has the layout of
/// `*param` (the driver copies it at launch); the buffers it names stay valid until the kernel
/// has run.
unsafe fn launch_with(stream: Stream, func: sys::CUfunction, (x, y): (u32, u32), param: *mut c_void) -> Result<()> {
    let mut args = [param];
    // SAFETY: the caller's contract; 256-thread blocks as every kernel declares.
    let res = unsafe {
        sys::cuLaunchKernel(
            func,
            x,
            y,
            1,
            BLOCK,
            1,
            1,
            0,
            stream.0 as sys::CUstream,
            args.as_mut_ptr(),
            std::ptr::null_mut(),
        )
    };
    check(res, "cuLaunchKernel")
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `FERROCCL_FOLD(t, T, op, OP)` lines of kernels.cu, as kernel names.
    fn names_in_source() -> Vec<String> {
        SOURCE
            .lines()
            .filter_map(|l| l.trim().strip_prefix("FERROCCL_FOLD(")?.strip_suffix(')').map(str::to_string))
            .map(|args| {
                let a: Vec<&str> = args.split(',').map(str::trim).collect();
                assert_eq!(a.len(), 4, "FERROCCL_FOLD({args}) needs 4 arguments");
                format!("ferroccl_fold_{}_{}", a[0], a[2])
            })
            .collect()
    }

    #[test]
    fn source_declares_exactly_the_rust_name_table() {
        let source = names_in_source();
        let table = kernel_names();
        assert_eq!(table.len(), 48);
        let unique: std::collections::HashSet<_> = table.iter().collect();
        assert_eq!(unique.len(), 48, "duplicate kernel names");
        assert_eq!(source, table, "kernels.cu's FERROCCL_FOLD lines differ from the Rust table");
        assert_eq!(kernel_name(DataType::Float8e5m2, ReduceKind::Min), "ferroccl_fold_e5m2_min");
        assert_eq!(kernel_name(DataType::Int8, ReduceKind::Sum), "ferroccl_fold_i8_sum");
        assert_eq!(kernel_name(DataType::Bfloat16, ReduceKind::Prod), "ferroccl_fold_bf16_prod");
        // The tables cover DataType::ALL in order, so indices are stable.
        for (i, (d, _)) in TYPE_NAMES.iter().enumerate() {
            assert_eq!(DataType::ALL[i], *d);
        }
    }

    #[test]
    fn source_needs_no_headers() {
        let includes = SOURCE.lines().filter(|l| l.trim_start().starts_with("#include")).count();
        assert_eq!(includes, 0, "NVRTC has no toolkit headers to include");
        assert!(SOURCE.contains("FERROCCL_MAX_INPUTS 16"), "MAX_INPUTS differs from kernels.cu");
        assert!(SOURCE.contains("FERROCCL_BATCH_MAX 7") && BATCH_MAX == 7, "BATCH_MAX differs from kernels.cu");
    }

    fn fold_of<'a>(inputs: &'a [*const u8], pre: &'a [PreScalar], post_div: Option<u64>) -> Fold<'a> {
        Fold {
            dtype: DataType::Float32,
            kind: ReduceKind::Sum,
            out: 0x1000 as *mut u8,
            inputs,
            pre,
            post_div,
            count: 10,
            more_outs: &[],
        }
    }

    #[test]
    fn params_layout_and_validation() {
        let inputs = [0x1000 as *const u8, 0x2010 as *const u8, 0x3000 as *const u8];
        let pre = [
            PreScalar::Bits((2.5f32.to_bits() as u64).to_ne_bytes()),
            PreScalar::None,
            PreScalar::Device(0x40 as *const u8),
        ];
        let p = fold_params(&fold_of(&inputs, &pre, Some(3))).expect("valid fold");
        assert_eq!(p.n_in, 3);
        assert_eq!(p.pre_mask, 0b101);
        assert_eq!(p.pre_bits[0], 2.5f32.to_bits() as u64);
        assert_eq!(p.pre_ptr[2], 0x40);
        assert_eq!(p.inputs[1], 0x2010);
        assert_eq!(p.post_div, 3);
        assert_eq!(std::mem::offset_of!(FoldParams, count), 8 + 3 * 128);
        assert_eq!(std::mem::offset_of!(FoldParams, n_in), 8 + 3 * 128 + 16);
        // One misaligned input: one element per thread.
        assert_eq!(grid_blocks(&p, 4, 132), 1);

        assert!(fold_params(&fold_of(&[], &[], None)).is_err());
        assert!(fold_params(&fold_of(&[0x10 as *const u8; 17], &[], None)).is_err());
        assert!(fold_params(&fold_of(&inputs, &pre[..2], None)).is_err());
        assert!(fold_params(&fold_of(&inputs, &[], Some(0))).is_err());
        assert!(fold_params(&fold_of(
            &inputs,
            &[PreScalar::None, PreScalar::None, PreScalar::Device(std::ptr::null())],
            None
        ))
        .is_err());
        assert!(fold_params(&fold_of(&[std::ptr::null()], &[], None)).is_err());
        assert_eq!(fold_params(&fold_of(&inputs[..1], &[], None)).expect("valid").pre_mask, 0);
    }

    #[test]
    fn grid_covers_and_caps() {
        let mut p = fold_params(&fold_of(&[0x1000 as *const u8], &[], None)).expect("valid");
        p.count = 1 << 20;
        // Aligned f32: 4 per thread, 1M/4/256 = 1024 blocks, capped at 8 per SM.
        assert_eq!(grid_blocks(&p, 4, 1000), 1024);
        assert_eq!(grid_blocks(&p, 4, 10), 80);
        p.inputs[0] = 0x1004;
        assert_eq!(grid_blocks(&p, 4, 1000), 4096);
        p.count = 0;
        assert_eq!(grid_blocks(&p, 4, 1000), 1);
    }

    #[test]
    fn arch_choice() {
        let archs = [75, 80, 86, 89, 90, 100, 120];
        assert_eq!(arch_for(90, &archs).as_deref(), Some("sm_90"));
        assert_eq!(arch_for(121, &archs).as_deref(), Some("compute_120"));
        assert_eq!(arch_for(87, &archs).as_deref(), Some("compute_86"));
        assert_eq!(arch_for(70, &archs), None);
    }

    #[test]
    fn reduction_to_fold_parts() {
        let avg = Reduction::builtin(DataType::Float32, crate::types::BuiltinOp::Avg, 4);
        let (kind, pre, post) = from_reduction(&avg);
        assert_eq!(kind, ReduceKind::Sum);
        let mut bits = [0u8; 8];
        bits[..4].copy_from_slice(&0.25f32.to_ne_bytes());
        assert_eq!(pre, PreScalar::Bits(bits));
        assert_eq!(post, None);
        let iavg = Reduction::builtin(DataType::Int32, crate::types::BuiltinOp::Avg, 3);
        assert_eq!(from_reduction(&iavg), (ReduceKind::Sum, PreScalar::None, Some(3)));
    }

    /// Builds the whole source with NVRTC for sm_90 (no GPU needed): a CUBIN and PTX, with no
    /// diagnostics and every entry point present.
    #[test]
    fn nvrtc_builds_every_kernel_for_sm_90() {
        if !nvrtc_available() {
            println!("skipped: no NVRTC library");
            return;
        }
        let started = std::time::Instant::now();
        let cubin = compile("sm_90").expect("kernels.cu builds for sm_90");
        let cubin_ms = started.elapsed().as_millis();
        assert_eq!(cubin.kind, ImageKind::Cubin);
        assert!(cubin.code.starts_with(b"\x7fELF"), "a CUBIN is an ELF file");
        assert!(cubin.log.is_empty(), "NVRTC diagnostics:\n{}", cubin.log);
        let started = std::time::Instant::now();
        let ptx = compile("compute_90").expect("kernels.cu builds PTX for compute_90");
        let ptx_ms = started.elapsed().as_millis();
        assert_eq!(ptx.kind, ImageKind::Ptx);
        assert!(ptx.log.is_empty(), "NVRTC diagnostics:\n{}", ptx.log);
        assert_eq!(ptx.code.last(), Some(&0), "PTX is NUL-terminated for cuModuleLoadData");
        let text = String::from_utf8_lossy(&ptx.code);
        let entries = text.lines().filter(|l| l.contains(".entry ferroccl_fold_")).count();
        assert_eq!(entries, 48, "PTX entry points");
        for name in kernel_names() {
            assert!(text.contains(&format!(".entry {name}(")), "{name} missing from the PTX");
            let needle = name.as_bytes();
            assert!(cubin.code.windows(needle.len()).any(|w| w == needle), "{name} missing from the CUBIN");
        }
        // One type alone: its four kernels and no other.
        let started = std::time::Instant::now();
        let f16 = compile_type("compute_90", DataType::Float16).expect("the f16 kernels build alone");
        let f16_ms = started.elapsed().as_millis();
        let text16 = String::from_utf8_lossy(&f16.code);
        let entries: Vec<&str> = text16.lines().filter(|l| l.contains(".entry ferroccl_fold_")).collect();
        assert_eq!(entries.len(), 4, "{entries:?}");
        assert!(entries.iter().all(|l| l.contains("ferroccl_fold_f16_")), "{entries:?}");
        println!("NVRTC: f16 alone (PTX) in {f16_ms} ms");
        // A broken source is an error carrying the log, not a crash.
        let err = compile_source("extern \"C\" __global__ void k() { undeclared_thing(); }", "sm_90", &[])
            .expect_err("a broken source does not build");
        let text = err.to_string();
        assert!(matches!(err, Error::Cuda { call: "nvrtcCompileProgram", .. }), "{text}");
        assert!(text.contains("undeclared_thing"), "the NVRTC log is in the error: {text}");
        println!(
            "NVRTC: CUBIN sm_90 {} bytes in {cubin_ms} ms, PTX {} bytes in {ptx_ms} ms",
            cubin.code.len(),
            ptx.code.len()
        );
    }
}
