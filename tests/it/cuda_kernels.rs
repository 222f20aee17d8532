//! The CUDA fold kernels against the host reduction (`coll::reduce`), bit for bit, over every
//! type x operator x pre/post mode x input count x length, with NaNs, infinities, signed zeros,
//! subnormals and saturating values in the inputs.
//!
//! Two executors run the same cases: the GPU (needs a device and NVRTC; skips and says why
//! without them) and kernels.cu compiled for the CPU by the host C++ compiler with the few CUDA
//! builtins it uses defined as plain IEEE operations (skips without a C++ compiler). The second
//! checks the kernels' arithmetic on every machine; only the first checks the GPU's.

use cudarc::driver::sys;

use ferroccl::coll::reduce::{Post, Pre, ReduceKind, Reduction};
use ferroccl::cuda::batch::{self, Launches};
use ferroccl::cuda::kernels::{self, FanOut, Fold, FoldBatch, FoldParams, PreScalar, MAX_INPUTS};
use ferroccl::cuda::stream::Stream;
use ferroccl::cuda::{driver, memory};
use ferroccl::types::{BuiltinOp, DataType};

const GPU_COUNTS: [usize; 4] = [1, 7, 1000, 65537 + 3];
/// Smaller on the CPU, where the emulation runs one element at a time.
const HOST_COUNTS: [usize; 4] = [1, 7, 1000, 4096 + 3];
const INPUT_COUNTS: [usize; 5] = [1, 2, 3, 7, 16];
const KINDS: [ReduceKind; 4] = [ReduceKind::Sum, ReduceKind::Prod, ReduceKind::Max, ReduceKind::Min];
/// Room before each buffer so that pointers can be shifted off 16-byte alignment.
const SLACK: usize = 64;

/// xorshift64*: deterministic, good enough for bit patterns.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

/// Values every type should meet: NaNs (several payloads and signs), infinities, signed zeros,
/// smallest and largest subnormals, the largest finite value, one, and for fp8 values that
/// saturate.
fn specials(dtype: DataType) -> &'static [u64] {
    match dtype {
        DataType::Float32 => &[
            0x7fc0_0000,
            0x7f80_0001,
            0xffc1_2345,
            0x7f80_0000,
            0xff80_0000,
            0,
            0x8000_0000,
            1,
            0x807f_ffff,
            0x7f7f_ffff,
            0xff7f_ffff,
            0x3f80_0000,
            0x0080_0000,
        ],
        DataType::Float64 => &[
            0x7ff8_0000_0000_0000,
            0x7ff0_0000_0000_0001,
            0xfff8_1234_0000_0000,
            0x7ff0_0000_0000_0000,
            0xfff0_0000_0000_0000,
            0,
            0x8000_0000_0000_0000,
            1,
            0x800f_ffff_ffff_ffff,
            0x7fef_ffff_ffff_ffff,
            0x3ff0_0000_0000_0000,
        ],
        DataType::Float16 => {
            &[0x7e00, 0x7c01, 0xfe00, 0x7c00, 0xfc00, 0, 0x8000, 1, 0x83ff, 0x7bff, 0xfbff, 0x3c00, 0x0400]
        }
        DataType::Bfloat16 => &[0x7fc0, 0x7f81, 0xffc0, 0x7f80, 0xff80, 0, 0x8000, 1, 0x807f, 0x7f7f, 0xff7f, 0x3f80],
        DataType::Float8e4m3 => &[0x7f, 0xff, 0x7e, 0xfe, 0x77, 0, 0x80, 1, 0x87, 0x38, 0x08],
        DataType::Float8e5m2 => &[0x7e, 0x7d, 0xff, 0x7c, 0xfc, 0x7b, 0xfb, 0, 0x80, 1, 0x83, 0x3c],
        DataType::Int8 | DataType::Uint8 => &[0, 1, 0xff, 0x80, 0x7f],
        DataType::Int32 | DataType::Uint32 => &[0, 1, 0xffff_ffff, 0x8000_0000, 0x7fff_ffff],
        DataType::Int64 | DataType::Uint64 => &[0, 1, u64::MAX, 1 << 63, u64::MAX >> 1],
    }
}

/// A value near one (random sign and mantissa, exponent within a few steps of 1.0), so that
/// sums and products round instead of being swamped.
fn near_one(dtype: DataType, rng: &mut Rng) -> u64 {
    let r = rng.next();
    let sign = r >> 63;
    let e = (r >> 40) % 7; // 0..6, centred on 3
    match dtype {
        DataType::Float32 => (sign << 31) | ((124 + e) << 23) | (r & 0x7f_ffff),
        DataType::Float64 => (sign << 63) | ((1020 + e) << 52) | (r & 0xf_ffff_ffff_ffff),
        DataType::Float16 => (sign << 15) | ((12 + e) << 10) | (r & 0x3ff),
        DataType::Bfloat16 => (sign << 15) | ((124 + e) << 7) | (r & 0x7f),
        DataType::Float8e4m3 => (sign << 7) | ((4 + e) << 3) | (r & 0x7),
        DataType::Float8e5m2 => (sign << 7) | ((12 + e) << 2) | (r & 0x3),
        _ => r % 5,
    }
}

fn element(dtype: DataType, rng: &mut Rng) -> u64 {
    match rng.below(8) {
        0 | 1 => {
            let s = specials(dtype);
            s[rng.below(s.len() as u64) as usize]
        }
        2..=4 => near_one(dtype, rng),
        _ => rng.next(),
    }
}

fn fill(dtype: DataType, count: usize, rng: &mut Rng) -> Vec<u8> {
    let size = dtype.size();
    let mut out = vec![0u8; count * size];
    for chunk in out.chunks_exact_mut(size) {
        chunk.copy_from_slice(&element(dtype, rng).to_le_bytes()[..size]);
    }
    out
}

fn scalar_bits(dtype: DataType, rng: &mut Rng) -> [u8; 8] {
    // Mostly moderate scalars, sometimes a special one (NaN, zero, Inf, ...).
    let v = if rng.below(4) == 0 { element(dtype, rng) } else { near_one(dtype, rng) };
    let mut raw = [0u8; 8];
    raw[..dtype.size()].copy_from_slice(&v.to_le_bytes()[..dtype.size()]);
    raw
}

/// `acc = prepare(in_0)`, `acc = combine(incoming = acc, local = in_k)`, `finalize(acc)`.
fn host_fold(dtype: DataType, kind: ReduceKind, inputs: &[Vec<u8>], pre: &[Pre], post: Post) -> Vec<u8> {
    let with = |pre| Reduction { dtype, kind, pre, post: Post::None };
    let mut acc = vec![0u8; inputs[0].len()];
    with(pre[0]).prepare(&mut acc, &inputs[0]).expect("prepare");
    let mut next = acc.clone();
    for (input, p) in inputs.iter().zip(pre).skip(1) {
        with(*p).combine(&mut next, &acc, input).expect("combine");
        std::mem::swap(&mut acc, &mut next);
    }
    Reduction { dtype, kind, pre: Pre::None, post }.finalize(&mut acc).expect("finalize");
    acc
}

/// How the pre and post steps are set.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Mode {
    Plain,
    /// A different random scalar per input; odd inputs read theirs from device memory, and
    /// every fourth input has none.
    PerInputPre,
    /// `Reduction::builtin(.., Avg, n)`: 1/n pre on floats, post-divide on integers.
    Avg,
    /// Integers only: post-divide by an arbitrary count (huge ones included).
    PostDiv(u64),
}

fn make_current() -> Result<(), String> {
    if !driver::available() {
        return Err("no CUDA driver or device".into());
    }
    if driver::current_context().is_some() {
        return Ok(());
    }
    let mut ctx: sys::CUcontext = std::ptr::null_mut();
    // SAFETY: CUDA is available (probed above); out-pointer is a live local.
    let res = unsafe { sys::cuDevicePrimaryCtxRetain(&mut ctx, 0) };
    if res != sys::CUresult::CUDA_SUCCESS {
        return Err(format!("cuDevicePrimaryCtxRetain: {}", driver::describe(res)));
    }
    // SAFETY: ctx was just retained.
    let res = unsafe { sys::cuCtxSetCurrent(ctx) };
    if res != sys::CUresult::CUDA_SUCCESS {
        return Err(format!("cuCtxSetCurrent: {}", driver::describe(res)));
    }
    Ok(())
}

/// Where the fold runs.
trait Exec {
    fn alloc(&self, bytes: usize) -> *mut u8;
    fn free(&self, ptr: *mut u8);
    fn upload(&self, dst: *mut u8, src: &[u8]);
    fn download(&self, dst: &mut [u8], src: *const u8);
    /// Runs the fold to completion.
    ///
    /// # Safety
    /// The fold's pointers come from `alloc` and hold `count` elements.
    unsafe fn fold(&self, f: &Fold<'_>);
    /// Runs a grouped copy to completion; `false` where its one-launch form does not apply.
    ///
    /// # Safety
    /// As for `fold`: sources of `bytes`, outputs of `sources.len() * bytes`, from `alloc`.
    unsafe fn fan_out(&self, f: &FanOut<'_>) -> bool;
    /// Runs a grouped fold to completion; `false` where its one-launch form does not apply.
    ///
    /// # Safety
    /// Inputs of `outs.len() * group_bytes` bytes and outputs of `count` elements, from `alloc`.
    unsafe fn fold_groups(&self, f: &Fold<'_>, outs: &[*mut u8], group_bytes: usize) -> bool;
    /// Runs the folds of a group, in order, as the library launches them (batched where they
    /// allow it), to completion.
    ///
    /// # Safety
    /// As for `fold`, for every fold.
    unsafe fn group(&self, folds: &[Fold<'_>]);
}

struct Gpu;

impl Exec for Gpu {
    fn alloc(&self, bytes: usize) -> *mut u8 {
        memory::alloc_device(bytes).expect("cuMemAlloc")
    }
    fn free(&self, ptr: *mut u8) {
        memory::free_device(ptr).expect("cuMemFree");
    }
    fn upload(&self, dst: *mut u8, src: &[u8]) {
        // SAFETY: dst is a device allocation at least src.len() bytes long (see Buffers).
        let res = unsafe { sys::cuMemcpyHtoD_v2(dst as sys::CUdeviceptr, src.as_ptr() as *const _, src.len()) };
        assert_eq!(res, sys::CUresult::CUDA_SUCCESS, "cuMemcpyHtoD: {}", driver::describe(res));
    }
    fn download(&self, dst: &mut [u8], src: *const u8) {
        // SAFETY: src is a device allocation at least dst.len() bytes long.
        let res = unsafe { sys::cuMemcpyDtoH_v2(dst.as_mut_ptr() as *mut _, src as sys::CUdeviceptr, dst.len()) };
        assert_eq!(res, sys::CUresult::CUDA_SUCCESS, "cuMemcpyDtoH: {}", driver::describe(res));
    }
    unsafe fn fold(&self, f: &Fold<'_>) {
        // SAFETY: the caller's pointers are device memory of count elements, alive until the
        // synchronize below.
        unsafe { kernels::fold(Stream(0), f) }.expect("fold launch");
        Stream(0).synchronize().expect("kernel ran");
    }
    unsafe fn fan_out(&self, f: &FanOut<'_>) -> bool {
        // SAFETY: as for fold.
        let queued = unsafe { kernels::fan_out(Stream(0), f) }.expect("fan-out launch");
        Stream(0).synchronize().expect("kernel ran");
        queued
    }
    unsafe fn fold_groups(&self, f: &Fold<'_>, outs: &[*mut u8], group_bytes: usize) -> bool {
        // SAFETY: as for fold.
        let queued = unsafe { kernels::fold_groups(Stream(0), f, outs, group_bytes) }.expect("grouped fold launch");
        Stream(0).synchronize().expect("kernel ran");
        queued
    }
    unsafe fn group(&self, folds: &[Fold<'_>]) {
        let mut launches = Launches::new(Stream(0));
        for f in folds {
            // SAFETY: as for fold.
            unsafe { launches.fold(f) }.expect("fold queued");
        }
        launches.flush().expect("batch launch");
        Stream(0).synchronize().expect("kernels ran");
    }
}

/// kernels.cu built for the CPU as a shared library, with CUDA's builtins defined on the host.
struct HostEmulation {
    lib: *mut std::ffi::c_void,
}

/// What kernels.cu needs from CUDA, for the CPU. `-ffp-contract=off` keeps a*b+c two roundings.
const HOST_PRELUDE: &str = r#"
#include <cstring>
#define __device__
#define __global__
#define __forceinline__ inline
#define __launch_bounds__(x)
struct FerrocclDim { unsigned x, y; };
static FerrocclDim blockIdx{0, 0}, threadIdx{0, 0}, blockDim{1, 1}, gridDim{1, 1};
// The batch kernels pick their fold by blockIdx.y: the test sets it before each call.
extern "C" void ferroccl_host_set_block_y(unsigned y) { blockIdx.y = y; }
static inline float __uint_as_float(unsigned b) { float f; memcpy(&f, &b, 4); return f; }
static inline unsigned __float_as_uint(float f) { unsigned b; memcpy(&b, &f, 4); return b; }
static inline double __longlong_as_double(long long b) { double f; memcpy(&f, &b, 8); return f; }
static inline long long __double_as_longlong(double f) { long long b; memcpy(&b, &f, 8); return b; }
static inline float __fadd_rn(float a, float b) { return a + b; }
static inline float __fsub_rn(float a, float b) { return a - b; }
static inline float __fmul_rn(float a, float b) { return a * b; }
static inline float __fdiv_rn(float a, float b) { return a / b; }
static inline double __dadd_rn(double a, double b) { return a + b; }
static inline double __dmul_rn(double a, double b) { return a * b; }
static inline double __ddiv_rn(double a, double b) { return a / b; }
static inline float __ull2float_rn(unsigned long long n) { return (float)n; }
static inline double __ull2double_rn(unsigned long long n) { return (double)n; }
"#;

impl HostEmulation {
    fn build() -> Result<HostEmulation, String> {
        let dir = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join("ferroccl_kernels_host");
        std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
        let source = dir.join("kernels_host.cpp");
        let kernels_cu = concat!(env!("CARGO_MANIFEST_DIR"), "/src/cuda/kernels.cu");
        std::fs::write(&source, format!("{HOST_PRELUDE}\n#include \"{kernels_cu}\"\n")).map_err(|e| e.to_string())?;
        let lib = dir.join(format!("libkernels_host_{}.so", std::process::id()));
        let mut last = String::from("no C++ compiler (c++, g++, clang++) found");
        for cxx in ["c++", "g++", "clang++"] {
            let out = std::process::Command::new(cxx)
                .args(["-std=c++17", "-O2", "-ffp-contract=off", "-fno-fast-math", "-fPIC", "-shared", "-w", "-o"])
                .arg(&lib)
                .arg(&source)
                .output();
            match out {
                Ok(o) if o.status.success() => {
                    let path = std::ffi::CString::new(lib.to_string_lossy().into_owned()).map_err(|e| e.to_string())?;
                    // SAFETY: the library was just built from kernels.cu; it has no constructors.
                    let handle = unsafe { libc::dlopen(path.as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL) };
                    let _ = std::fs::remove_file(&lib);
                    if handle.is_null() {
                        return Err(format!("dlopen of the host build of kernels.cu failed ({cxx})"));
                    }
                    return Ok(HostEmulation { lib: handle });
                }
                Ok(o) => {
                    // A compiler that runs but rejects kernels.cu is a failure, not a skip.
                    panic!("{cxx} could not build kernels.cu for the host:\n{}", String::from_utf8_lossy(&o.stderr));
                }
                Err(e) => last = format!("{cxx}: {e}"),
            }
        }
        Err(last)
    }
}

impl Exec for HostEmulation {
    fn alloc(&self, bytes: usize) -> *mut u8 {
        // 8-byte words, so 16-byte alignment is possible but not certain; leaked (test only).
        let words = vec![0u64; bytes.div_ceil(8) + 2].into_boxed_slice();
        let p = Box::leak(words).as_mut_ptr() as *mut u8;
        p.wrapping_add(p.align_offset(16))
    }
    fn free(&self, _ptr: *mut u8) {}
    fn upload(&self, dst: *mut u8, src: &[u8]) {
        // SAFETY: dst comes from alloc with at least src.len() bytes.
        unsafe { std::ptr::copy_nonoverlapping(src.as_ptr(), dst, src.len()) };
    }
    fn download(&self, dst: &mut [u8], src: *const u8) {
        // SAFETY: src comes from alloc with at least dst.len() bytes.
        unsafe { std::ptr::copy_nonoverlapping(src, dst.as_mut_ptr(), dst.len()) };
    }
    unsafe fn fold(&self, f: &Fold<'_>) {
        let p = kernels::fold_params(f).expect("valid fold");
        if f.count == 0 {
            return;
        }
        let name = std::ffi::CString::new(kernels::kernel_name(f.dtype, f.kind)).expect("name");
        // SAFETY: lib is a live handle; the name is NUL-terminated.
        let sym = unsafe { libc::dlsym(self.lib, name.as_ptr()) };
        assert!(!sym.is_null(), "{name:?} missing from the host build");
        // SAFETY: the symbol is `extern "C" void f(const FoldParams)` and FoldParams is repr(C)
        // as kernels.cu declares it.
        let kernel: extern "C" fn(FoldParams) = unsafe { std::mem::transmute(sym) };
        kernel(p);
    }
    unsafe fn fan_out(&self, f: &FanOut<'_>) -> bool {
        let Some(p) = kernels::fan_out_params(f) else { return false };
        let name = std::ffi::CString::new(kernels::kernel_name(DataType::Uint8, ReduceKind::Sum)).expect("name");
        // SAFETY: as in fold.
        let sym = unsafe { libc::dlsym(self.lib, name.as_ptr()) };
        assert!(!sym.is_null(), "{name:?} missing from the host build");
        // SAFETY: as in fold.
        let kernel: extern "C" fn(FoldParams) = unsafe { std::mem::transmute(sym) };
        kernel(p);
        true
    }
    unsafe fn fold_groups(&self, f: &Fold<'_>, outs: &[*mut u8], group_bytes: usize) -> bool {
        let Some(p) = kernels::grouped_fold_params(f, outs, group_bytes).expect("valid fold") else { return false };
        let name = std::ffi::CString::new(kernels::kernel_name(f.dtype, f.kind)).expect("name");
        // SAFETY: as in fold.
        let sym = unsafe { libc::dlsym(self.lib, name.as_ptr()) };
        assert!(!sym.is_null(), "{name:?} missing from the host build");
        // SAFETY: as in fold.
        let kernel: extern "C" fn(FoldParams) = unsafe { std::mem::transmute(sym) };
        kernel(p);
        true
    }
    unsafe fn group(&self, folds: &[Fold<'_>]) {
        // The launches the library makes of these folds (cuda::batch::plan), each batch's rows
        // run last to first: folds that may share a launch give the same result in any order,
        // and a dependency the plan missed shows.
        let set_y = self.symbol("ferroccl_host_set_block_y");
        // SAFETY: the symbol is `extern "C" void f(unsigned)` (HOST_PRELUDE).
        let set_y: extern "C" fn(u32) = unsafe { std::mem::transmute(set_y) };
        let planned: Vec<(DataType, ReduceKind, FoldParams)> =
            folds.iter().map(|f| (f.dtype, f.kind, kernels::fold_params(f).expect("valid fold"))).collect();
        for launch in batch::plan(&planned) {
            let (dtype, kind, _) = planned[launch.start];
            let params: Vec<FoldParams> = planned[launch.clone()].iter().map(|p| p.2).collect();
            let batch = FoldBatch::of(&params).expect("batch");
            let sym = self.symbol(&kernels::batch_kernel_name(dtype, kind));
            // SAFETY: the symbol is `extern "C" void f(const FoldBatch)` and FoldBatch is
            // repr(C) as kernels.cu declares it.
            let kernel: extern "C" fn(FoldBatch) = unsafe { std::mem::transmute(sym) };
            for y in (0..params.len()).rev() {
                set_y(y as u32);
                kernel(batch);
            }
            set_y(0);
        }
    }
}

impl HostEmulation {
    fn symbol(&self, name: &str) -> *mut std::ffi::c_void {
        let c = std::ffi::CString::new(name).expect("name");
        // SAFETY: lib is a live handle; the name is NUL-terminated.
        let sym = unsafe { libc::dlsym(self.lib, c.as_ptr()) };
        assert!(!sym.is_null(), "{name} missing from the host build");
        sym
    }
}

/// A group of folds (as a group of small collectives makes them) against the host reduction
/// applied one fold after the other: independent folds (batched), two identical ones, folds
/// that read or overwrite an earlier one's result (which must run after it), other kernels in
/// between, more folds than one batch holds, per-input scalars, an element-wise tail.
fn run_group(exec: &dyn Exec, label: &str) {
    let mut rng = Rng(0x2545_f491_4f6c_dd1d);
    const BUFS: usize = 24;
    const CAP: usize = (4096 + 3) * 8 + SLACK;
    let bufs: Vec<*mut u8> = (0..BUFS).map(|_| exec.alloc(CAP)).collect();
    let mut model: Vec<Vec<u8>> = (0..BUFS).map(|_| fill(DataType::Uint8, CAP, &mut rng)).collect();
    for (b, m) in bufs.iter().zip(&model) {
        exec.upload(*b, m);
    }
    struct Spec {
        dtype: DataType,
        kind: ReduceKind,
        ins: Vec<usize>,
        out: usize,
        more: Vec<usize>,
        count: usize,
        pre: bool,
    }
    let spec = |dtype, kind, ins: &[usize], out, more: &[usize], count| Spec {
        dtype,
        kind,
        ins: ins.to_vec(),
        out,
        more: more.to_vec(),
        count,
        pre: false,
    };
    let (f32_, bf16) = (DataType::Float32, DataType::Bfloat16);
    let (sum, max) = (ReduceKind::Sum, ReduceKind::Max);
    let mut specs = vec![
        spec(f32_, sum, &[0, 1], 2, &[], 1000),
        spec(f32_, sum, &[3, 4], 5, &[6], 7),
        // The first one again (identical: may run beside it).
        spec(f32_, sum, &[0, 1], 2, &[], 1000),
        // Reads the first one's result.
        spec(f32_, sum, &[2, 0], 7, &[], 1000),
        spec(bf16, max, &[8, 9], 10, &[], 4096 + 3),
        // In place over the previous result.
        spec(bf16, max, &[10, 8], 10, &[], 4096 + 3),
        spec(f32_, sum, &[11, 12], 13, &[], 1),
    ];
    // Eight independent ones, more than a batch holds, sharing inputs and writing disjoint
    // stretches of buffers 19-23 (placed below).
    for k in 0..8 {
        let mut s = spec(f32_, sum, &[14 + k % 3, 17 + k % 2], 19 + k % 5, &[], 16 + 4 * k);
        s.pre = k % 2 == 1;
        specs.push(s);
    }
    // Each fold's buffers, which its Fold borrows.
    struct Placed {
        ins: Vec<*const u8>,
        out: *mut u8,
        more: Vec<*mut u8>,
        pre: Vec<PreScalar>,
    }
    let mut placed: Vec<Placed> = Vec::new();
    let mut used: Vec<Vec<(usize, usize)>> = vec![Vec::new(); BUFS];
    for s in &specs {
        let size = s.dtype.size();
        let bytes = s.count * size;
        // Buffers 19-23 take several folds' outputs, each past the one before.
        let at = if s.out >= 19 {
            let next = used[s.out].iter().map(|&(a, b)| a + b).max().unwrap_or(0).next_multiple_of(16);
            used[s.out].push((next, bytes));
            next
        } else {
            0
        };
        let ins: Vec<*const u8> = s.ins.iter().map(|&b| bufs[b] as *const u8).collect();
        let out = bufs[s.out].wrapping_add(at);
        let more: Vec<*mut u8> = s.more.iter().map(|&b| bufs[b]).collect();
        let pre: Vec<PreScalar> = if s.pre {
            (0..ins.len()).map(|_| PreScalar::Bits(scalar_bits(s.dtype, &mut rng))).collect()
        } else {
            Vec::new()
        };
        // The model: the same fold on the host, in order.
        let inputs: Vec<Vec<u8>> = s.ins.iter().map(|&b| model[b][..bytes].to_vec()).collect();
        let host_pre: Vec<Pre> = match pre.is_empty() {
            true => vec![Pre::None; ins.len()],
            false => pre
                .iter()
                .map(|p| match p {
                    PreScalar::Bits(b) => Pre::Mul(*b),
                    _ => Pre::None,
                })
                .collect(),
        };
        let result = host_fold(s.dtype, s.kind, &inputs, &host_pre, Post::None);
        model[s.out][at..at + bytes].copy_from_slice(&result);
        for &m in &s.more {
            model[m][..bytes].copy_from_slice(&result);
        }
        placed.push(Placed { ins, out, more, pre });
    }
    let folds: Vec<Fold<'_>> = specs
        .iter()
        .zip(&placed)
        .map(|(s, p)| Fold {
            dtype: s.dtype,
            kind: s.kind,
            out: p.out,
            inputs: &p.ins,
            pre: &p.pre,
            post_div: None,
            count: s.count,
            more_outs: &p.more,
        })
        .collect();
    // SAFETY: every pointer comes from exec.alloc with room for its fold's elements.
    unsafe { exec.group(&folds) };
    for (b, (&p, want)) in bufs.iter().zip(&model).enumerate() {
        let mut got = vec![0u8; CAP];
        exec.download(&mut got, p);
        assert!(got == *want, "{label}: buffer {b} differs from the folds run one after the other");
    }
    bufs.iter().for_each(|&p| exec.free(p));
    println!("{label}: a group of {} folds exact", folds.len());
}

/// Grouped folds (a reduce-scatter in one launch) against the host reduction per group: every
/// operator, plain and with per-input scalars (host bits and device-resident), out of place and
/// in place (output g is input g's own block g), and a refusal (misaligned group).
fn run_grouped_folds(exec: &dyn Exec, label: &str) {
    let mut rng = Rng(0x5851_f42d_4c95_7f2d);
    let mut cases = 0;
    for dtype in [DataType::Float32, DataType::Bfloat16, DataType::Int32, DataType::Float64, DataType::Uint8] {
        let size = dtype.size();
        for kind in KINDS {
            for (n_in, groups) in [(2usize, 2usize), (3, 3), (8, 8), (4, 2)] {
                for with_pre in [false, true] {
                    if with_pre && !(dtype.is_float() || matches!(kind, ReduceKind::Sum)) {
                        continue;
                    }
                    for in_place in [false, true] {
                        if in_place && n_in != groups {
                            continue;
                        }
                        let count = 256 + 16 / size * (cases % 3);
                        let block = count * size;
                        let inputs_host: Vec<Vec<u8>> =
                            (0..n_in).map(|_| fill(dtype, count * groups, &mut rng)).collect();
                        let ins: Vec<*mut u8> = (0..n_in).map(|_| exec.alloc(block * groups)).collect();
                        for (b, d) in ins.iter().zip(&inputs_host) {
                            exec.upload(*b, d);
                        }
                        let outs: Vec<*mut u8> = (0..groups)
                            .map(|g| if in_place { ins[g].wrapping_add(g * block) } else { exec.alloc(block) })
                            .collect();
                        let scalars = exec.alloc(8 * MAX_INPUTS);
                        let mut host_pre = vec![Pre::None; n_in];
                        let mut dev_pre = Vec::new();
                        if with_pre {
                            for (k, p) in host_pre.iter_mut().enumerate() {
                                let bits = scalar_bits(dtype, &mut rng);
                                *p = Pre::Mul(bits);
                                if k % 2 == 1 {
                                    let at = scalars.wrapping_add(8 * k);
                                    exec.upload(at, &bits[..size]);
                                    dev_pre.push(PreScalar::Device(at));
                                } else {
                                    dev_pre.push(PreScalar::Bits(bits));
                                }
                            }
                        }
                        let inputs: Vec<*const u8> = ins.iter().map(|&p| p as *const u8).collect();
                        let f = Fold {
                            dtype,
                            kind,
                            out: outs[0],
                            inputs: &inputs,
                            pre: &dev_pre,
                            post_div: None,
                            count,
                            more_outs: &[],
                        };
                        // SAFETY: every pointer comes from exec.alloc with the sizes needed.
                        assert!(unsafe { exec.fold_groups(&f, &outs, block) }, "{label}: refused");
                        for (g, &o) in outs.iter().enumerate() {
                            let slices: Vec<Vec<u8>> =
                                inputs_host.iter().map(|d| d[g * block..(g + 1) * block].to_vec()).collect();
                            let want = host_fold(dtype, kind, &slices, &host_pre, Post::None);
                            let mut got = vec![0u8; block];
                            exec.download(&mut got, o);
                            assert!(
                                got == want,
                                "{label}: {dtype:?} {kind:?}, {n_in} inputs, group {g} of {groups}, pre {with_pre}, \
                                 in place {in_place}"
                            );
                        }
                        ins.iter().for_each(|&p| exec.free(p));
                        if !in_place {
                            outs.iter().for_each(|&p| exec.free(p));
                        }
                        exec.free(scalars);
                        cases += 1;
                    }
                }
            }
        }
    }
    let a = exec.alloc(4096 + SLACK);
    let f = Fold {
        dtype: DataType::Float32,
        kind: ReduceKind::Sum,
        out: a,
        inputs: &[a as *const u8, a as *const u8],
        pre: &[],
        post_div: None,
        count: 4,
        more_outs: &[],
    };
    // SAFETY: refused before anything runs (group of 24 bytes).
    assert!(!unsafe { exec.fold_groups(&f, &[a, a], 24) }, "{label}: a misaligned group should be refused");
    exec.free(a);
    println!("{label}: {cases} grouped folds exact, 1 refusal");
}

/// Grouped copies (an all-gather, a gather, an all-to-all share) against the plain per-block
/// copy, out of place and in place (each rank's own block is its source), and the cases the
/// one-launch form refuses (misaligned, one source).
fn run_fan_outs(exec: &dyn Exec, label: &str) {
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    let mut cases = 0;
    for &groups in &[2usize, 3, 5, 8, 16] {
        for &n_outs in &[1usize, 2, 3, 8] {
            for &bytes in &[16usize, 4096, 65536 + 48] {
                for in_place in [false, true] {
                    if in_place && n_outs < groups.min(2) {
                        continue;
                    }
                    let outs: Vec<*mut u8> = (0..n_outs).map(|_| exec.alloc(groups * bytes)).collect();
                    let own: Vec<*mut u8> = (0..groups).map(|_| exec.alloc(bytes)).collect();
                    // In place: source g is output g's own block g, where output g exists.
                    let sources: Vec<*const u8> =
                        (0..groups)
                            .map(|g| {
                                if in_place && g < n_outs {
                                    outs[g].wrapping_add(g * bytes) as *const u8
                                } else {
                                    own[g]
                                }
                            })
                            .collect();
                    let data: Vec<Vec<u8>> = (0..groups).map(|_| fill(DataType::Uint8, bytes, &mut rng)).collect();
                    let junk = fill(DataType::Uint8, groups * bytes, &mut rng);
                    for &o in &outs {
                        exec.upload(o, &junk);
                    }
                    for (g, d) in data.iter().enumerate() {
                        exec.upload(sources[g] as *mut u8, d);
                    }
                    let f = FanOut { sources: &sources, outs: &outs, bytes };
                    // SAFETY: every pointer comes from exec.alloc with the sizes FanOut needs.
                    assert!(unsafe { exec.fan_out(&f) }, "{label}: {groups} groups of {bytes} B refused");
                    for (m, &o) in outs.iter().enumerate() {
                        let mut got = vec![0u8; groups * bytes];
                        exec.download(&mut got, o);
                        for (g, d) in data.iter().enumerate() {
                            assert!(
                                got[g * bytes..(g + 1) * bytes] == d[..],
                                "{label}: output {m}, block {g} of {groups} ({bytes} B, in place {in_place})"
                            );
                        }
                    }
                    outs.iter().chain(&own).for_each(|&p| exec.free(p));
                    cases += 1;
                }
            }
        }
    }
    // Refused: a misaligned source or size, a single source. Nothing is queued then.
    let a = exec.alloc(4096 + SLACK);
    let b = exec.alloc(2 * (4096 + SLACK));
    let two = [a as *const u8, a.wrapping_add(16) as *const u8];
    for f in [
        FanOut { sources: &[a.wrapping_add(1) as *const u8, a as *const u8], outs: &[b], bytes: 64 },
        FanOut { sources: &two, outs: &[b], bytes: 24 },
        FanOut { sources: &two[..1], outs: &[b], bytes: 64 },
    ] {
        // SAFETY: as above (refused before anything runs).
        assert!(!unsafe { exec.fan_out(&f) }, "{label}: {f:?} should be refused");
    }
    exec.free(a);
    exec.free(b);
    println!("{label}: {cases} grouped copies exact, 3 refusals");
}

/// Buffers for 16 inputs, the output and the device scalars.
struct Buffers<'e> {
    exec: &'e dyn Exec,
    slots: Vec<*mut u8>,
    scalars: *mut u8,
}

impl<'e> Buffers<'e> {
    fn new(exec: &'e dyn Exec, bytes: usize) -> Buffers<'e> {
        let slots = (0..=MAX_INPUTS).map(|_| exec.alloc(bytes + SLACK)).collect();
        Buffers { exec, slots, scalars: exec.alloc(8 * MAX_INPUTS) }
    }
}

impl Drop for Buffers<'_> {
    fn drop(&mut self) {
        for p in self.slots.iter().chain([&self.scalars]) {
            self.exec.free(*p);
        }
    }
}

struct Totals {
    cases: usize,
    elements: usize,
    failures: Vec<String>,
}

#[allow(clippy::too_many_arguments)]
fn run_case(
    bufs: &Buffers<'_>,
    rng: &mut Rng,
    totals: &mut Totals,
    dtype: DataType,
    kind: ReduceKind,
    mode: Mode,
    n: usize,
    count: usize,
) {
    let size = dtype.size();
    let inputs: Vec<Vec<u8>> = (0..n).map(|_| fill(dtype, count, rng)).collect();

    // Pre and post, for the host and for the kernel.
    let mut host_pre = vec![Pre::None; n];
    let mut dev_pre = Vec::new();
    let mut post = Post::None;
    match mode {
        Mode::Plain => {}
        Mode::PerInputPre => {
            for (k, p) in host_pre.iter_mut().enumerate() {
                if k % 4 == 3 {
                    dev_pre.push(PreScalar::None);
                    continue;
                }
                let bits = scalar_bits(dtype, rng);
                *p = Pre::Mul(bits);
                if k % 2 == 1 {
                    // scalars holds 8 bytes per input.
                    let at = bufs.scalars.wrapping_add(8 * k);
                    bufs.exec.upload(at, &bits[..size]);
                    dev_pre.push(PreScalar::Device(at));
                } else {
                    dev_pre.push(PreScalar::Bits(bits));
                }
            }
        }
        Mode::Avg => {
            let r = Reduction::builtin(dtype, BuiltinOp::Avg, n);
            let (_, pre, post_div) = kernels::from_reduction(&r);
            host_pre = vec![r.pre; n];
            if pre != PreScalar::None {
                dev_pre = vec![pre; n];
            }
            post = r.post;
            assert_eq!(post_div.is_some(), r.post != Post::None);
        }
        Mode::PostDiv(d) => post = Post::Div(d),
    }
    let post_div = match post {
        Post::None => None,
        Post::Div(d) => Some(d),
    };

    // Placement: n == 2 shifts every pointer by one element and n == 16 shifts input 5 (the
    // element-wise path); n == 3 writes in place over input 0 and n == 7 over input 6.
    let offset = |k: usize| -> usize {
        match n {
            2 => size,
            16 if k == 5 => size,
            _ => 0,
        }
    };
    let ptrs: Vec<*mut u8> = (0..n).map(|k| bufs.slots[k].wrapping_add(offset(k))).collect();
    for (p, data) in ptrs.iter().zip(&inputs) {
        bufs.exec.upload(*p, data);
    }
    let out = match n {
        3 => ptrs[0],
        7 => ptrs[6],
        _ => bufs.slots[MAX_INPUTS].wrapping_add(if n == 2 { size } else { 0 }),
    };
    let in_ptrs: Vec<*const u8> = ptrs.iter().map(|p| *p as *const u8).collect();
    // n == 3 also writes the result over input 1 (an in-place all-reduce's other rank) and
    // n == 16 into a spare buffer.
    let more_outs: Vec<*mut u8> = match n {
        3 => vec![ptrs[1]],
        16 => vec![bufs.slots[MAX_INPUTS]],
        _ => Vec::new(),
    };
    let fold = Fold { dtype, kind, out, inputs: &in_ptrs, pre: &dev_pre, post_div, count, more_outs: &more_outs };
    // SAFETY: every pointer comes from the executor and holds count elements (plus slack for
    // the shifted ones).
    unsafe { bufs.exec.fold(&fold) };
    let mut got = vec![0u8; count * size];
    bufs.exec.download(&mut got, out);

    let want = host_fold(dtype, kind, &inputs, &host_pre, post);
    totals.cases += 1;
    totals.elements += count;
    for (m, extra) in more_outs.iter().enumerate() {
        let mut also = vec![0u8; count * size];
        bufs.exec.download(&mut also, *extra);
        if also != want {
            totals.failures.push(format!("{dtype} {kind:?} {mode:?} n={n} count={count}: more output {m} differs"));
        }
    }
    if got != want {
        let i = (0..count).find(|&i| got[i * size..(i + 1) * size] != want[i * size..(i + 1) * size]).unwrap_or(0);
        let hex = |b: &[u8]| b.iter().rev().map(|x| format!("{x:02x}")).collect::<String>();
        let ins: Vec<String> = inputs.iter().map(|v| hex(&v[i * size..(i + 1) * size])).collect();
        totals.failures.push(format!(
            "{dtype} {kind:?} {mode:?} n={n} count={count}: element {i}: kernel {} host {} (inputs {ins:?}, pre {host_pre:?})",
            hex(&got[i * size..(i + 1) * size]),
            hex(&want[i * size..(i + 1) * size]),
        ));
    }
}

/// Every case on `exec`, compared with the host path; prints a summary line.
fn run_all(exec: &dyn Exec, counts: &[usize], label: &str) {
    let started = std::time::Instant::now();
    let max_count = *counts.iter().max().expect("counts");
    let bufs = Buffers::new(exec, max_count * 8);
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    let mut totals = Totals { cases: 0, elements: 0, failures: Vec::new() };
    for dtype in DataType::ALL {
        let mut modes = vec![Mode::Plain, Mode::PerInputPre, Mode::Avg];
        if !dtype.is_float() {
            modes.extend([Mode::PostDiv(3), Mode::PostDiv(1 << 40), Mode::PostDiv(1 << 63), Mode::PostDiv(u64::MAX)]);
        }
        for kind in KINDS {
            for &mode in &modes {
                for n in INPUT_COUNTS {
                    for &count in counts {
                        run_case(&bufs, &mut rng, &mut totals, dtype, kind, mode, n, count);
                    }
                }
            }
        }
    }
    // A zero-length fold does nothing and succeeds.
    let one = [bufs.slots[0] as *const u8];
    let empty = Fold {
        dtype: DataType::Float32,
        kind: ReduceKind::Sum,
        out: bufs.slots[1],
        inputs: &one,
        pre: &[],
        post_div: None,
        count: 0,
        more_outs: &[],
    };
    // SAFETY: nothing is read or written for count 0.
    unsafe { exec.fold(&empty) };

    println!(
        "{label}: {} cases run, {} elements compared, {} mismatching cases, {} ms",
        totals.cases,
        totals.elements,
        totals.failures.len(),
        started.elapsed().as_millis()
    );
    for f in totals.failures.iter().take(20) {
        println!("  {f}");
    }
    assert!(
        totals.failures.is_empty(),
        "{} of {} cases differ from the host path",
        totals.failures.len(),
        totals.cases
    );
}

#[test]
fn fold_kernels_match_the_host_reduction_bit_for_bit() {
    if let Err(why) = make_current() {
        println!("skipped: {why}");
        return;
    }
    if !kernels::nvrtc_available() {
        println!("skipped: no NVRTC library (libnvrtc.so) on this machine");
        return;
    }
    let started = std::time::Instant::now();
    kernels::prepare_current_device().expect("the kernels build and load");
    println!("cuda fold kernels: built and loaded in {} ms", started.elapsed().as_millis());
    kernels::prepare_current_device().expect("a second prepare is a no-op");
    run_all(&Gpu, &GPU_COUNTS, "cuda fold kernels (GPU)");
    run_fan_outs(&Gpu, "cuda grouped copies (GPU)");
    run_grouped_folds(&Gpu, "cuda grouped folds (GPU)");
    run_group(&Gpu, "cuda batched folds (GPU)");
}

#[test]
fn fold_kernel_source_matches_the_host_reduction_on_the_cpu() {
    let exec = match HostEmulation::build() {
        Ok(e) => e,
        Err(why) => {
            println!("skipped: {why}");
            return;
        }
    };
    run_all(&exec, &HOST_COUNTS, "cuda fold kernels (kernels.cu on the CPU)");
    run_fan_outs(&exec, "cuda grouped copies (kernels.cu on the CPU)");
    run_grouped_folds(&exec, "cuda grouped folds (kernels.cu on the CPU)");
    run_group(&exec, "cuda batched folds (kernels.cu on the CPU)");
}
