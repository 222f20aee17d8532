//! `ferroccl-bench`: nccl-tests' benchmark (same flags, table, check and exit status) for
//! ferroccl, calling the library only through its NCCL C ABI.
//!
//! Ranks are threads of this process (`-t N`), or processes under `mpirun` (the unique id goes
//! from rank 0 by MPI_Bcast, as in nccl-tests), optionally with `-t` threads per process
//! (rank = process * nthreads + thread).
//!
//! `--psk-env VAR` encrypts the run (ncclSetEncryption); `--canary` runs it plaintext, then
//! encrypted, and compares the two (see canary.rs).

mod canary;
mod check;
mod coll;
mod dtype;
mod fmt;
mod json;
mod procs;
mod psk;
mod relay;
mod world;

use std::alloc::{alloc_zeroed, dealloc, Layout};
use std::ffi::{c_int, c_void, CStr};
use std::io::Write;
use std::path::PathBuf;
use std::time::Instant;

use clap::Parser;
use ferroccl::ffi::group::{ncclGroupEnd, ncclGroupStart};
use ferroccl::ffi::init::{ncclCommDestroy, ncclCommInitAll, ncclCommInitRank, ncclGetUniqueId};
use ferroccl::ffi::mem::{ncclMemAlloc, ncclMemFree};
use ferroccl::ffi::query::{
    ncclGetErrorString, ncclGetLastError, ncclGetVersion, ncclRedOpCreatePreMulSum, ncclRedOpDestroy,
};
use ferroccl::types::{
    ncclComm_t, ncclRedOp_t, ncclResult_t, ncclScalarResidence_t, ncclUniqueId, NCCL_UNIQUE_ID_BYTES,
};

use canary::Phase;
use check::Check;
use coll::{Coll, Counts};
use dtype::{premul_scalar, Dtype, Op};
use json::Json;
use procs::{MpiSession, Procs};
use psk::Psk;
use world::{Combine, World};

const NCCL_TESTS_FORMAT: &str = "2.19.6";

#[derive(Clone, Copy, PartialEq, Eq, Debug, clap::ValueEnum)]
enum MpiMode {
    /// MPI when launched by an MPI launcher (OMPI_COMM_WORLD_SIZE, PMI_SIZE or PMIX_RANK set).
    Auto,
    On,
    Off,
}

/// Where the benchmark's host buffers come from.
#[derive(Clone, Copy, PartialEq, Eq, Debug, clap::ValueEnum)]
enum Alloc {
    /// The system allocator, as a simulation code's arrays (malloc, Fortran allocate).
    System,
    /// ncclMemAlloc, as nccl-tests allocates: ranks on one host map these and work in place.
    Nccl,
}

#[derive(Clone, Copy, PartialEq, Eq, Debug, clap::ValueEnum)]
enum InitMode {
    /// nccl-tests: one thread calls ncclGroupStart, ncclCommInitRank per local rank, ncclGroupEnd.
    Group,
    /// Each rank's thread calls ncclCommInitRank itself, concurrently (nccl-tests -p 1).
    Threads,
    /// ncclCommInitAll (single process only).
    All,
}

/// nccl-tests' flags (same letters, long names and defaults, except -w: 5).
#[derive(Parser, Debug)]
#[command(
    name = "ferroccl-bench",
    about = "nccl-tests-style benchmark of ferroccl through its NCCL C API",
    disable_version_flag = true
)]
struct Args {
    /// Collective to run.
    #[arg(value_enum)]
    collective: Coll,
    /// Ranks (threads) per process.
    #[arg(short = 't', long = "nthreads", default_value_t = 1)]
    nthreads: usize,
    /// GPUs per thread (host memory: only 1).
    #[arg(short = 'g', long = "ngpus", default_value_t = 1)]
    ngpus: usize,
    /// Smallest size in bytes (K/M/G suffixes).
    #[arg(short = 'b', long = "minbytes", default_value = "32M", value_parser = parse_size)]
    minbytes: usize,
    /// Largest size in bytes (K/M/G suffixes).
    #[arg(short = 'e', long = "maxbytes", default_value = "32M", value_parser = parse_size)]
    maxbytes: usize,
    /// Size increment when -f is 1.
    #[arg(short = 'i', long = "stepbytes", default_value = "1M", value_parser = parse_size)]
    stepbytes: usize,
    /// Size multiplication factor (> 1 replaces -i).
    #[arg(short = 'f', long = "stepfactor", default_value_t = 1)]
    stepfactor: usize,
    /// Timed iterations per size.
    #[arg(short = 'n', long = "iters", default_value_t = 20, value_parser = clap::value_parser!(u32).range(1..))]
    iters: u32,
    /// Calls aggregated in one ncclGroupStart/End per iteration.
    #[arg(short = 'm', long = "agg_iters", default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..))]
    agg_iters: u32,
    /// Warm-up iterations per size (sizes doubling from -b to -e).
    #[arg(short = 'w', long = "warmup_iters", default_value_t = 5)]
    warmup_iters: u32,
    /// Sizes >= S take N timed and W warm-up iterations instead of -n and -w (S:N:W, S with
    /// K/M/G; repeatable, the largest S at or below a size wins): one sweep, in one pair of
    /// buffers, can then cover 8 B to 128 MiB, as ompi_bench's flag of the same name does.
    #[arg(long = "tier", value_name = "S:N:W", value_parser = parse_tier)]
    tier: Vec<Tier>,
    /// Also warm each size up right before timing it (its -w or --tier warm-up calls, in the
    /// timed placement), as ompi_bench does, after nccl-tests' one pass over all sizes (where
    /// the first sizes timed would find what the largest ones evicted). The pass stays, so that
    /// one-time costs of a buffer (huge-page collapse, first touch) fall before the sweep.
    #[arg(long = "warmup-each")]
    warmup_each: bool,
    /// Before every call (warm-up and timed), each rank that passes an input rewrites it (its
    /// first element repeated throughout), as an application that computed new data would. The
    /// rewrite is timed with the calls. Without it, a benchmark's inputs never change, so peers
    /// that read them in place (ncclMemAlloc buffers) find them in their own caches from the
    /// call before, which no application whose data changes does.
    #[arg(long = "fresh-inputs")]
    fresh_inputs: bool,
    /// Time each size in send and receive arrays of its own, of the bytes it needs (at least
    /// 64; another data type of the same size may reuse a few bytes more), allocated when the
    /// size is first timed (and warmed up before every timing: its -w or --tier warm-up calls,
    /// at least one; so --warmup-each changes nothing), as a simulation code passes arrays of
    /// its problem's size: from glibc's mmap threshold (128 KiB) each is a mapping of its own on
    /// 4 KiB pages, where one buffer sized for the largest message holds whole 2 MiB regions
    /// that may get huge pages. No pass over all sizes first. The arrays live until the end (no
    /// address is reused, and glibc's threshold stays where it was), and later cycles (-N),
    /// types, operators and roots reuse them. Sizes must step by a factor (-f), not -i.
    #[arg(long = "arrays")]
    arrays: bool,
    /// Repeat the size sweep this many times (0: forever).
    #[arg(short = 'N', long = "run_cycles", default_value_t = 1)]
    run_cycles: u32,
    /// 1: threads create their communicators concurrently (same as --init threads).
    #[arg(short = 'p', long = "parallel_init", default_value_t = 0)]
    parallel_init: u8,
    /// Checked iterations per size (0: no check, #wrong is N/A).
    #[arg(short = 'c', long = "check", default_value_t = 1)]
    check: u32,
    /// sum|prod|min|max|avg|mulsum|all
    #[arg(short = 'o', long = "op", default_value = "sum")]
    op: String,
    /// int8|uint8|int32|uint32|int64|uint64|half|float|double|bfloat16|f8e4m3|f8e5m2|all
    #[arg(short = 'd', long = "datatype", default_value = "float")]
    datatype: String,
    /// Root rank, or all.
    #[arg(short = 'r', long = "root", default_value = "0")]
    root: String,
    /// Time reported: 0 rank 0's, 1 average, 2 minimum, 3 maximum over ranks.
    #[arg(short = 'a', long = "average", default_value_t = 1, value_parser = clap::value_parser!(u8).range(0..=3))]
    average: u8,
    /// Also write the results as JSON to this file.
    #[arg(short = 'J', long = "output_file")]
    output_file: Option<PathBuf>,
    /// Misalign buffers by this many elements.
    #[arg(short = 'u', long = "unalign", default_value_t = 0)]
    unalign: usize,
    /// Blocking mode (host calls always complete before returning: only 0).
    #[arg(short = 'z', long = "blocking", default_value_t = 0, hide = true)]
    blocking: u8,
    /// CUDA graph launches (no CUDA: only 0).
    #[arg(short = 'G', long = "cudagraph", default_value_t = 0, hide = true)]
    cudagraph: u32,
    /// Use MPI (one rank per process under mpirun).
    #[arg(long = "mpi", value_enum, default_value = "auto")]
    mpi: MpiMode,
    /// How communicators are created.
    #[arg(long = "init", value_enum, default_value = "group")]
    init: InitMode,
    /// Where the buffers come from: the system allocator (default: what simulation codes
    /// pass) or ncclMemAlloc (what nccl-tests uses).
    #[arg(long = "alloc", value_enum, default_value = "system")]
    alloc: Alloc,
    /// The same as `--alloc system` (kept for recorded commands).
    #[arg(long = "host-alloc", hide = true, conflicts_with = "alloc")]
    host_alloc: bool,
    /// Encryption canary: run the benchmark plaintext, then encrypted (each phase in its own
    /// process(es), same ranks and flags), print busbw and p99 latency of both and the busbw
    /// loss; exit 1 when the loss exceeds --max-loss. The largest size decides (the worst row of
    /// that size). Needs a build with --features tls.
    #[arg(long = "canary")]
    canary: bool,
    /// Largest busbw loss --canary accepts, in percent of the plaintext busbw.
    #[arg(long = "max-loss", value_name = "PERCENT", default_value_t = canary::DEFAULT_MAX_LOSS, requires = "canary")]
    max_loss: f64,
    /// --canary: run the plaintext and encrypted phases this many times, alternating, and
    /// judge the per-phase medians (a shared host's noise then hits both phases alike).
    #[arg(long = "canary-rounds", value_name = "R", default_value_t = 1, requires = "canary",
          value_parser = clap::value_parser!(u32).range(1..=99))]
    canary_rounds: u32,
    /// Encrypt with the pre-shared key (at least 32 bytes) in environment variable VAR
    /// (ncclSetEncryption). With --canary: the encrypted phase's key (default: a random one).
    #[arg(long = "psk-env", value_name = "VAR")]
    psk_env: Option<String>,
    /// Internal: run one phase of --canary.
    #[arg(long = "canary-phase", value_enum, hide = true, requires = "canary_out")]
    canary_phase: Option<Phase>,
    /// Internal: where a --canary phase writes its results (JSON).
    #[arg(long = "canary-out", hide = true)]
    canary_out: Option<PathBuf>,
    /// Internal: the socket of a --canary phase's parent, which makes its MPI calls.
    #[arg(long = "canary-relay", hide = true, requires = "canary_phase")]
    canary_relay: Option<PathBuf>,
}

/// `--tier S:N:W`: from `from` bytes on, `iters` timed and `warmup` warm-up iterations.
#[derive(Clone, Copy, Debug, PartialEq)]
struct Tier {
    from: usize,
    iters: u32,
    warmup: u32,
}

fn parse_tier(s: &str) -> Result<Tier, String> {
    let bad = || format!("invalid tier '{s}' (want S:N:W, e.g. 1M:20:5)");
    let mut parts = s.split(':');
    let (Some(size), Some(n), Some(w), None) = (parts.next(), parts.next(), parts.next(), parts.next()) else {
        return Err(bad());
    };
    let from = parse_size(size)?;
    let iters: u32 = n.trim().parse().map_err(|_| bad())?;
    let warmup: u32 = w.trim().parse().map_err(|_| bad())?;
    if iters == 0 {
        return Err(format!("invalid tier '{s}': at least 1 timed iteration"));
    }
    Ok(Tier { from, iters, warmup })
}

/// Timed and warm-up iterations for `size`: the tier with the largest start at or below it,
/// else -n and -w.
fn schedule(tiers: &[Tier], iters: u32, warmup: u32, size: usize) -> (u32, u32) {
    tiers.iter().filter(|t| t.from <= size).max_by_key(|t| t.from).map_or((iters, warmup), |t| (t.iters, t.warmup))
}

impl Plan {
    /// This run's (timed, warm-up) iterations for `size` ([`schedule`]).
    fn schedule(&self, size: usize) -> (u32, u32) {
        schedule(&self.tiers, self.iters, self.warmup, size)
    }
}

/// nccl-tests' `parsesize`: a number with an optional K, M or G (powers of 1024).
fn parse_size(s: &str) -> Result<usize, String> {
    let t = s.trim();
    let (num, unit) = match t.char_indices().find(|(_, c)| c.is_ascii_alphabetic()) {
        Some((i, c)) => {
            if !t[i + c.len_utf8()..].trim().is_empty() {
                return Err(format!("invalid size '{s}'"));
            }
            (
                &t[..i],
                match c {
                    'K' | 'k' => 1u64 << 10,
                    'M' | 'm' => 1 << 20,
                    'G' | 'g' => 1 << 30,
                    _ => return Err(format!("invalid size '{s}' (suffixes: K, M, G)")),
                },
            )
        }
        None => (t, 1),
    };
    let v: f64 = num.trim().parse().map_err(|_| format!("invalid size '{s}'"))?;
    if v.is_nan() || v < 0.0 {
        return Err(format!("invalid size '{s}'"));
    }
    Ok((v * unit as f64) as usize)
}

/// Run-wide settings every rank shares.
struct Plan {
    coll: Coll,
    types: Vec<Dtype>,
    ops: Vec<Option<Op>>,
    root: Option<usize>,
    minbytes: usize,
    maxbytes: usize,
    stepbytes: usize,
    stepfactor: usize,
    iters: u32,
    agg: u32,
    warmup: u32,
    /// --tier: other iteration counts from a size on ([`schedule`]).
    tiers: Vec<Tier>,
    /// --warmup-each: warm-up calls right before each size's timed loop too.
    warmup_each: bool,
    /// --fresh-inputs: each rank rewrites its input before every call.
    fresh_inputs: bool,
    /// --arrays: each size in send and receive arrays of its own, of exactly its size.
    arrays: bool,
    cycles: u32,
    check: u32,
    combine: Combine,
    unalign: usize,
    /// Buffers from the system allocator instead of ncclMemAlloc.
    host_alloc: bool,
    hostname: String,
    /// Record every timed iteration (for --canary's p99 latency).
    record_latency: bool,
}

/// What one rank reports at the end.
#[derive(Default)]
struct RankOutcome {
    errors: u64,
    bw_sum: f64,
    bw_count: u64,
    rows: Vec<Json>,
}

/// A communicator handle carried into a rank's thread.
#[derive(Clone, Copy)]
struct CommPtr(ncclComm_t);
// SAFETY: NCCL communicators may be used from any thread (one at a time, as here).
unsafe impl Send for CommPtr {}

/// Page-aligned host buffer: from the system allocator, or (`--alloc nccl`) from ncclMemAlloc
/// as in nccl-tests.
struct Buf {
    ptr: *mut u8,
    len: usize,
    from_nccl: bool,
}

impl Buf {
    fn new(len: usize, host_alloc: bool) -> Buf {
        let len = len.max(64);
        if !host_alloc {
            let mut p: *mut c_void = std::ptr::null_mut();
            let rc = ncclMemAlloc(&mut p, len);
            if rc != ncclResult_t::ncclSuccess || p.is_null() {
                panic!("ncclMemAlloc of {len} bytes failed: {}", cstr(ncclGetErrorString(rc)));
            }
            // SAFETY: a fresh allocation of len bytes; zeroed like the system path below.
            unsafe { std::ptr::write_bytes(p as *mut u8, 0, len) };
            return Buf { ptr: p as *mut u8, len, from_nccl: true };
        }
        let layout = Layout::from_size_align(len, 4096).expect("buffer layout");
        // SAFETY: non-zero size.
        let ptr = unsafe { alloc_zeroed(layout) };
        if ptr.is_null() {
            std::alloc::handle_alloc_error(layout);
        }
        Buf { ptr, len, from_nccl: false }
    }
    fn bytes(&mut self, offset: usize, len: usize) -> &mut [u8] {
        assert!(offset + len <= self.len, "buffer overrun: {offset}+{len} > {}", self.len);
        // SAFETY: in bounds (checked); the buffer is owned by this rank's thread.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.add(offset), len) }
    }
}

impl Drop for Buf {
    fn drop(&mut self) {
        if self.from_nccl {
            ncclMemFree(self.ptr as *mut c_void);
            return;
        }
        // SAFETY: allocated in `new` with this layout.
        unsafe { dealloc(self.ptr, Layout::from_size_align(self.len, 4096).unwrap()) };
    }
}

fn cstr(p: *const std::ffi::c_char) -> String {
    if p.is_null() {
        return String::new();
    }
    // SAFETY: the library returns NUL-terminated strings.
    unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned()
}

/// nccl-tests' NCCLCHECK: prints the failure and ends the run (every rank).
fn nccl_check(host: &str, call: &str, r: ncclResult_t) {
    if r.0 == 0 {
        return;
    }
    let msg = format!(
        "{host}: Test NCCL failure {call} '{} / {}'",
        cstr(ncclGetErrorString(r)),
        cstr(ncclGetLastError(std::ptr::null_mut()))
    );
    // nccl-tests prints it on stdout, in line with the table.
    println!("{msg}");
    let _ = std::io::stdout().flush();
    // Other ranks may be blocked in a collective with this one: end the whole process (mpirun
    // then ends the job).
    std::process::exit(3);
}

fn hostname() -> String {
    let mut buf = [0u8; 1024];
    // SAFETY: buffer and length are valid.
    let rc = unsafe { libc::gethostname(buf.as_mut_ptr() as *mut libc::c_char, buf.len() - 1) };
    if rc != 0 {
        return "unknown".into();
    }
    let end = buf.iter().position(|&b| b == 0).unwrap_or(buf.len());
    let full = String::from_utf8_lossy(&buf[..end]).into_owned();
    // nccl-tests' getHostName stops at the first '.'.
    full.split('.').next().unwrap_or("").to_string()
}

fn now_string() -> String {
    // SAFETY: plain libc time formatting into a local buffer.
    unsafe {
        let t = libc::time(std::ptr::null_mut());
        let mut tm: libc::tm = std::mem::zeroed();
        libc::localtime_r(&t, &mut tm);
        let mut buf = [0u8; 64];
        let n = libc::strftime(buf.as_mut_ptr() as *mut libc::c_char, buf.len(), c"%Y-%m-%dT%H:%M:%S%z".as_ptr(), &tm);
        String::from_utf8_lossy(&buf[..n]).into_owned()
    }
}

fn launched_by_mpi() -> bool {
    ["OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_RANK", "MPI_LOCALNRANKS"].iter().any(|v| std::env::var_os(v).is_some())
}

fn main() {
    let args = Args::parse();
    // The canary's parent only starts its phases: it never makes a communicator itself.
    if args.canary && args.canary_phase.is_none() {
        std::process::exit(canary::run(&canary::CanaryConfig {
            max_loss: args.max_loss,
            rounds: args.canary_rounds,
            psk_env: args.psk_env.as_deref(),
            output_file: args.output_file.as_deref(),
            run_cycles: args.run_cycles,
            maxbytes: args.maxbytes,
            under_mpi: wants_mpi(args.mpi),
        }));
    }
    if args.canary_phase.is_some() {
        canary::die_with_parent();
    }
    let code = match configure_encryption(&args).and_then(|()| real_main(args)) {
        Ok(code) => code,
        Err(msg) => {
            eprintln!("ferroccl-bench: {msg}");
            2
        }
    };
    std::process::exit(code);
}

fn wants_mpi(mode: MpiMode) -> bool {
    match mode {
        MpiMode::On => true,
        MpiMode::Off => false,
        MpiMode::Auto => launched_by_mpi(),
    }
}

/// The key of this run, if it is encrypted: --psk-env's, or the canary parent's for its
/// encrypted phase.
fn run_psk(args: &Args) -> Result<Option<Psk>, String> {
    match args.canary_phase {
        Some(phase) => canary::phase_psk(phase),
        None => args.psk_env.as_deref().map(Psk::from_env).transpose(),
    }
}

/// ncclSetEncryption comes before anything else in the library: the first unique id or
/// communicator freezes the setting.
fn configure_encryption(args: &Args) -> Result<(), String> {
    match run_psk(args)? {
        Some(key) => psk::enable(&key),
        None => Ok(()),
    }
}

fn encrypted_run(args: &Args) -> bool {
    args.canary_phase.map_or(args.psk_env.is_some(), |p| p == Phase::Encrypted)
}

fn real_main(args: Args) -> Result<i32, String> {
    // A canary phase is never an MPI process itself: under mpirun its parent relays for it.
    let use_mpi = args.canary_phase.is_none() && wants_mpi(args.mpi);
    let session = MpiSession::start(use_mpi)?;
    let procs = match &args.canary_relay {
        Some(socket) => Procs::Relay(relay::Client::connect(socket)?),
        None => session.procs(),
    };
    // Declared after the session, so dropped before it: MPI_Finalize comes last.
    let world = World::new(args.nthreads.max(1), procs);

    let code = run(&args, &world, use_mpi || args.canary_relay.is_some());
    // Under MPI a usage error on one process must not leave the others waiting.
    let code = match code {
        Ok(c) => c,
        Err(msg) => {
            eprintln!("ferroccl-bench: {msg}");
            if use_mpi {
                world.abort(2);
            }
            2
        }
    };
    Ok(code)
}

fn build_plan(args: &Args, nranks: usize) -> Result<Plan, String> {
    if args.nthreads < 1 {
        return Err("-t must be at least 1".into());
    }
    if args.ngpus != 1 {
        return Err("-g: host memory ranks are threads or processes; only -g 1 is supported".into());
    }
    if args.blocking != 0 {
        return Err("-z: calls on host memory always complete before returning; only -z 0 is supported".into());
    }
    if args.cudagraph != 0 {
        return Err("-G: CUDA graphs are not supported on host memory".into());
    }
    if args.minbytes > args.maxbytes {
        return Err(format!("invalid sizes for 'minbytes' and 'maxbytes': {} > {}", args.minbytes, args.maxbytes));
    }
    // Every size's arrays are kept: geometric steps keep about twice the largest, linear ones
    // their sum.
    if args.arrays && args.stepfactor <= 1 && args.maxbytes > args.minbytes {
        return Err("--arrays keeps every size's arrays to the end: step sizes with -f (a factor), not -i".into());
    }
    let coll = args.collective;
    let types = if args.datatype == "all" {
        Dtype::ALL.to_vec()
    } else {
        vec![Dtype::parse(&args.datatype).ok_or_else(|| format!("invalid type {}", args.datatype))?]
    };
    let ops: Vec<Option<Op>> = if !coll.has_op() {
        vec![None]
    } else if args.op == "all" {
        Op::ALL.iter().map(|&o| Some(o)).collect()
    } else {
        vec![Some(Op::parse(&args.op).ok_or_else(|| format!("invalid op {}", args.op))?)]
    };
    let root = if args.root == "all" {
        None
    } else {
        let r: usize = args.root.parse().map_err(|_| format!("invalid root {}", args.root))?;
        if coll.has_root() && r >= nranks {
            return Err(format!("root {r} is out of range for {nranks} ranks"));
        }
        Some(r)
    };
    Ok(Plan {
        coll,
        types,
        ops,
        root,
        minbytes: args.minbytes,
        maxbytes: args.maxbytes,
        stepbytes: args.stepbytes,
        stepfactor: args.stepfactor,
        iters: args.iters,
        agg: args.agg_iters,
        warmup: args.warmup_iters,
        tiers: args.tier.clone(),
        warmup_each: args.warmup_each,
        fresh_inputs: args.fresh_inputs,
        arrays: args.arrays,
        cycles: args.run_cycles,
        check: args.check,
        combine: Combine::from_average(args.average),
        unalign: args.unalign,
        host_alloc: args.host_alloc || args.alloc == Alloc::System,
        hostname: hostname(),
        record_latency: args.canary_phase.is_some(),
    })
}

/// `multi_process`: ranks are processes under mpirun (possibly as canary phases).
fn run(args: &Args, world: &World, multi_process: bool) -> Result<i32, String> {
    let nranks = world.nranks();
    let plan = build_plan(args, nranks)?;
    let init = if args.parallel_init != 0 { InitMode::Threads } else { args.init };
    if init == InitMode::All && world.nprocs > 1 {
        return Err("--init all (ncclCommInitAll) works within one process only".into());
    }
    let main_proc = world.proc_ == 0;
    let host = plan.hostname.clone();

    let mut version: c_int = 0;
    nccl_check(&host, "ncclGetVersion", ncclGetVersion(&mut version));

    // Header (nccl-tests' writeDeviceReport).
    let step = if plan.stepfactor > 1 { (plan.stepfactor, "factor") } else { (plan.stepbytes, "bytes") };
    if main_proc {
        println!(
            "# ferroccl-bench version {} (nccl-tests {NCCL_TESTS_FORMAT} format) nccl-headers={} nccl-library={version}",
            env!("CARGO_PKG_VERSION"),
            ferroccl::version::NCCL_VERSION_CODE
        );
        println!("# Collective test starting: ferroccl-bench {}", plan.coll.name());
        println!(
            "# nThread {} nGpus 1 minBytes {} maxBytes {} step: {}({}) warmup iters: {} iters: {} agg iters: {} validation: {} graph: 0 unalign: {}",
            world.nthreads, plan.minbytes, plan.maxbytes, step.0, step.1, plan.warmup, plan.iters, plan.agg, plan.check, plan.unalign
        );
        for t in &plan.tiers {
            println!("# sizes >= {}: warmup iters: {} iters: {}", t.from, t.warmup, t.iters);
        }
        if plan.arrays {
            println!("# buffers: each size in arrays of its own, warmed up right before it is timed");
        } else if plan.warmup_each {
            println!("# warm-up: each size right before it is timed, after a pass over all sizes");
        }
        if init == InitMode::Threads {
            println!("# Parallel Init Enabled: threads call into NcclInitRank concurrently ");
        }
        println!(
            "# Mode: {} ({} process{} x {} thread{}, {} ranks), host memory from {}",
            if multi_process { "mpi" } else { "threads" },
            world.nprocs,
            if world.nprocs == 1 { "" } else { "es" },
            world.nthreads,
            if world.nthreads == 1 { "" } else { "s" },
            nranks,
            if plan.host_alloc { "the system allocator" } else { "ncclMemAlloc" }
        );
        if encrypted_run(args) {
            println!("# Encryption: TLS 1.3 with a pre-shared key (ncclSetEncryption)");
        }
        println!("#");
        println!("# Using devices");
    }
    let hosts = world.allgather_u64(ferroccl::hash::fnv1a64(host.as_bytes()));
    let local_rank = hosts[..world.proc_].iter().filter(|&&h| h == hosts[world.proc_]).count();
    let pid = std::process::id();
    let mut lines = String::new();
    let mut devices = Vec::new();
    for t in 0..world.nthreads {
        let dev = local_rank * world.nthreads + t;
        lines.push_str(&format!(
            "#  Rank {:2} Group {:2} Pid {:6} on {:>10} device {:2} [host memory]\n",
            world.rank_of(t),
            0,
            pid,
            host,
            dev
        ));
    }
    if let Some(all) = world.gather_text(&lines) {
        for text in all {
            print!("{text}");
            for line in text.lines() {
                devices.push(parse_rank_line(line));
            }
        }
    }
    let _ = std::io::stdout().flush();

    // Unique id from rank 0, by MPI_Bcast (nccl-tests' pattern).
    let mut id = ncclUniqueId { internal: [0; NCCL_UNIQUE_ID_BYTES] };
    if init != InitMode::All {
        if world.proc_ == 0 {
            nccl_check(&host, "ncclGetUniqueId", ncclGetUniqueId(&mut id));
        }
        let mut bytes = id.to_bytes();
        world.broadcast_bytes(&mut bytes);
        id = ncclUniqueId::from_bytes(&bytes);
    }

    let mut comms: Vec<ncclComm_t> = vec![std::ptr::null_mut(); world.nthreads];
    match init {
        InitMode::Group => {
            nccl_check(&host, "ncclGroupStart", ncclGroupStart());
            for (t, c) in comms.iter_mut().enumerate() {
                nccl_check(
                    &host,
                    "ncclCommInitRank",
                    ncclCommInitRank(c, nranks as c_int, id, world.rank_of(t) as c_int),
                );
            }
            nccl_check(&host, "ncclGroupEnd", ncclGroupEnd());
        }
        InitMode::All => {
            nccl_check(
                &host,
                "ncclCommInitAll",
                ncclCommInitAll(comms.as_mut_ptr(), world.nthreads as c_int, std::ptr::null()),
            );
        }
        InitMode::Threads => {} // in each rank's thread
    }

    if main_proc {
        print_table_header();
    }

    let outcomes: Vec<(RankOutcome, CommPtr)> = std::thread::scope(|s| {
        let plan = &plan;
        let spawn_rank = |t: usize, comm: CommPtr| {
            move || {
                let mut comm = comm;
                if init == InitMode::Threads {
                    nccl_check(
                        &plan.hostname,
                        "ncclCommInitRank",
                        ncclCommInitRank(&mut comm.0, nranks as c_int, id, world.rank_of(t) as c_int),
                    );
                }
                (rank_main(plan, world, t, comm.0), comm)
            }
        };
        let handles: Vec<_> = (1..world.nthreads)
            .map(|t| {
                std::thread::Builder::new()
                    .name(format!("rank-{}", world.rank_of(t)))
                    .spawn_scoped(s, spawn_rank(t, CommPtr(comms[t])))
                    .expect("spawn rank thread")
            })
            .collect();
        let mut out = vec![spawn_rank(0, CommPtr(comms[0]))()];
        for h in handles {
            match h.join() {
                Ok(o) => out.push(o),
                Err(_) => {
                    eprintln!("ferroccl-bench: a rank thread panicked");
                    std::process::exit(3);
                }
            }
        }
        out
    });

    // The reports must be taken before ncclCommDestroy closes the connections they describe.
    let local_reports: Result<Vec<String>, String> = match args.canary_phase {
        Some(_) => outcomes.iter().map(|(_, c)| canary::encryption_report(c.0)).collect(),
        None => Ok(Vec::new()),
    };
    let mut errors_local = 0u64;
    for (o, c) in &outcomes {
        errors_local += o.errors;
        nccl_check(&host, "ncclCommDestroy", ncclCommDestroy(c.0));
    }
    let reports = match args.canary_phase {
        Some(_) => canary::gather_reports(world, &local_reports?)?,
        None => Vec::new(),
    };
    let errors = world.sum_procs(errors_local as f64) as u64;
    let main_outcome = &outcomes[0].0;
    let avg_bw = if main_outcome.bw_count > 0 { main_outcome.bw_sum / main_outcome.bw_count as f64 } else { 0.0 };

    if main_proc {
        println!("# {:<20} : {} {}", "Out of bounds values", errors, if errors > 0 { "FAILED" } else { "OK" });
        println!("# {:<20} : {} ", "Avg bus bandwidth", fmt::c_g(avg_bw));
        println!("#");
        println!("# Collective test concluded: ferroccl-bench {}", plan.coll.name());
        let _ = std::io::stdout().flush();

        if let Some(path) = args.canary_out.as_ref().or(args.output_file.as_ref()) {
            let mut fields = vec![
                ("program", json::str("ferroccl-bench")),
                ("version", json::str(env!("CARGO_PKG_VERSION"))),
                ("nccl_tests_format", json::str(NCCL_TESTS_FORMAT)),
                ("nccl_version", Json::from(version as i64)),
                ("command_line", json::str(std::env::args().collect::<Vec<_>>().join(" "))),
                ("hostname", json::str(host.clone())),
                ("date", json::str(now_string())),
                ("mode", json::str(if multi_process { "mpi" } else { "threads" })),
                ("encryption", json::str(if encrypted_run(args) { "psk" } else { "none" })),
                ("collective", json::str(plan.coll.name())),
                ("nprocs", Json::from(world.nprocs as i64)),
                ("nthreads", Json::from(world.nthreads as i64)),
                ("ranks", Json::from(nranks as i64)),
                (
                    "config",
                    json::obj(vec![
                        ("minimum_bytes", Json::from(plan.minbytes as i64)),
                        ("maximum_bytes", Json::from(plan.maxbytes as i64)),
                        (if plan.stepfactor > 1 { "step_factor" } else { "step_bytes" }, Json::from(step.0 as i64)),
                        ("warmup_iters", Json::from(plan.warmup as i64)),
                        ("warmup_each", Json::Bool(plan.warmup_each)),
                        ("fresh_inputs", Json::Bool(plan.fresh_inputs)),
                        ("arrays", Json::Bool(plan.arrays)),
                        ("iterations", Json::from(plan.iters as i64)),
                        (
                            "tiers",
                            Json::Array(
                                plan.tiers
                                    .iter()
                                    .map(|t| {
                                        json::obj(vec![
                                            ("from", Json::from(t.from as i64)),
                                            ("iters", Json::from(t.iters as i64)),
                                            ("warmup_iters", Json::from(t.warmup as i64)),
                                        ])
                                    })
                                    .collect(),
                            ),
                        ),
                        ("aggregated_iterations", Json::from(plan.agg as i64)),
                        ("validation", Json::from(plan.check as i64)),
                        ("average", Json::from(args.average as i64)),
                        ("unalign", Json::from(plan.unalign as i64)),
                        ("init", json::str(format!("{init:?}").to_lowercase())),
                    ]),
                ),
                ("devices", Json::Array(devices)),
                ("results", Json::Array(main_outcome.rows.clone())),
                (
                    "out_of_bounds",
                    json::obj(vec![("count", Json::from(errors as i64)), ("okay", Json::Bool(errors == 0))]),
                ),
                ("average_bus_bandwidth", Json::from(avg_bw)),
            ];
            if let Some(phase) = args.canary_phase {
                // The canary parent reads this file instead of the user's -J.
                fields.push(("canary_phase", json::str(phase.name())));
                fields.push(("encryption_reports", Json::Array(reports)));
                std::fs::write(path, json::render(&json::obj(fields)))
                    .map_err(|e| format!("cannot write the canary phase's results to {}: {e}", path.display()))?;
            } else {
                match std::fs::write(path, json::render(&json::obj(fields))) {
                    Ok(()) => println!("# Wrote JSON output to {}", path.display()),
                    Err(e) => eprintln!("ferroccl-bench: cannot write {}: {e}", path.display()),
                }
            }
        }
    }
    Ok(if errors > 0 { 1 } else { 0 })
}

fn parse_rank_line(line: &str) -> Json {
    // "#  Rank %2d Group %2d Pid %6d on %10s device %2d [host memory]"
    let w: Vec<&str> = line.split_whitespace().collect();
    let num = |i: usize| w.get(i).and_then(|s| s.parse::<i64>().ok()).map_or(Json::Null, Json::from);
    json::obj(vec![
        ("rank", num(2)),
        ("group", num(4)),
        ("pid", num(6)),
        ("hostname", w.get(8).map_or(Json::Null, |s| json::str(*s))),
        ("device", num(10)),
        ("memory", json::str("host")),
    ])
}

fn print_table_header() {
    println!("#");
    println!(
        "# {:>10}  {:>12}  {:>8}  {:>6}  {:>6}           out-of-place                       in-place          ",
        "", "", "", "", ""
    );
    println!(
        "# {:>10}  {:>12}  {:>8}  {:>6}  {:>6}  {:>7}  {:>6}  {:>6}  {:>6}  {:>7}  {:>6}  {:>6}  {:>6} ",
        "size",
        "count",
        "type",
        "redop",
        "root",
        "time",
        "algbw",
        "busbw",
        "#wrong",
        "time",
        "algbw",
        "busbw",
        "#wrong"
    );
    println!(
        "# {:>10}  {:>12}  {:>8}  {:>6}  {:>6}  {:>7}  {:>6}  {:>6}  {:>6}  {:>7}  {:>6}  {:>6}  {:>6} ",
        "(B)", "(elements)", "", "", "", "(us)", "(GB/s)", "(GB/s)", "", "(us)", "(GB/s)", "(GB/s)", ""
    );
    let _ = std::io::stdout().flush();
}

/// One measurement (out-of-place or in-place) of one size.
struct Measure {
    time_us: f64,
    algbw: f64,
    busbw: f64,
    wrong: Option<u64>,
    /// Each timed iteration's time on the slowest rank (empty unless recorded).
    latencies_us: Vec<f64>,
}

impl Measure {
    fn cell(&self) -> String {
        let wrong = match self.wrong {
            Some(w) => format!("{:>6}", fmt::c_g(w as f64)),
            None => "   N/A".into(),
        };
        format!(
            "  {}  {}  {}  {}",
            fmt::float_str(self.time_us, 7),
            fmt::float_str(self.algbw, 6),
            fmt::float_str(self.busbw, 6),
            wrong
        )
    }
    fn json(&self) -> Json {
        let mut fields = vec![
            ("time_us", Json::from(self.time_us)),
            ("algbw", Json::from(self.algbw)),
            ("busbw", Json::from(self.busbw)),
            ("wrong", self.wrong.map_or(Json::Null, |w| Json::from(w as i64))),
        ];
        if !self.latencies_us.is_empty() {
            fields.push(("latencies_us", Json::Array(self.latencies_us.iter().map(|&us| Json::from(us)).collect())));
        }
        json::obj(fields)
    }
}

/// One rank's whole run.
struct Rank<'a> {
    plan: &'a Plan,
    world: &'a World,
    thread: usize,
    rank: usize,
    nranks: usize,
    comm: ncclComm_t,
    main: bool,
    send: Buf,
    recv: Buf,
    /// --arrays: the send and receive arrays of every size timed so far but the current one,
    /// and the current one's size.
    arrays: Vec<(usize, Buf, Buf)>,
    current_size: Option<usize>,
    seed: u64,
    out: RankOutcome,
}

fn rank_main(plan: &Plan, world: &World, thread: usize, comm: ncclComm_t) -> RankOutcome {
    // With --arrays every size allocates its own (Rank::arrays_for).
    let cap = if plan.arrays { 64 } else { plan.maxbytes + 8 * plan.unalign + 64 };
    let mut r = Rank {
        plan,
        world,
        thread,
        rank: world.rank_of(thread),
        nranks: world.nranks(),
        comm,
        main: world.proc_ == 0 && thread == 0,
        send: Buf::new(cap, plan.host_alloc),
        recv: Buf::new(cap, plan.host_alloc),
        arrays: Vec::new(),
        current_size: None,
        seed: 0,
        out: RankOutcome::default(),
    };
    let roots: Vec<i64> = if !plan.coll.has_root() {
        vec![-1]
    } else {
        match plan.root {
            Some(x) => vec![x as i64],
            None => (0..r.nranks as i64).collect(),
        }
    };
    for &dt in &plan.types {
        for &op in &plan.ops {
            for &root in &roots {
                r.time_test(dt, op, root);
            }
        }
    }
    r.out
}

impl Rank<'_> {
    fn fail(&self, call: &str, res: ncclResult_t) {
        nccl_check(&self.plan.hostname, call, res);
    }

    /// Send and receive pointers of one call (nccl-tests' in-place layout).
    fn pointers(&self, dt: Dtype, counts: &Counts, in_place: bool) -> (*const c_void, *mut c_void) {
        let sz = dt.size();
        let ua = self.plan.unalign * sz;
        // SAFETY: offsets stay within the buffers (sized for maxbytes plus the misalignment).
        unsafe {
            let s = self.send.ptr.add(ua);
            let r = self.recv.ptr.add(ua);
            if in_place {
                (
                    r.add(counts.send_inplace_offset * self.rank * sz) as *const c_void,
                    r.add(counts.recv_inplace_offset * self.rank * sz) as *mut c_void,
                )
            } else {
                (s as *const c_void, r as *mut c_void)
            }
        }
    }

    /// One call, creating (and destroying) the PreMulSum operator for mulsum as nccl-tests does.
    fn start_coll(&self, dt: Dtype, op: Option<Op>, root: i64, counts: &Counts, in_place: bool) {
        let (s, r) = self.pointers(dt, counts, in_place);
        let mut handle = ncclRedOp_t(0);
        let mut created = false;
        if let Some(o) = op.filter(|_| self.plan.coll.reduces()) {
            match o.builtin() {
                Some(b) => handle = b,
                None => {
                    let mut scalar = [0u8; 8];
                    dt.encode(premul_scalar(self.rank), &mut scalar);
                    let res = ncclRedOpCreatePreMulSum(
                        &mut handle,
                        scalar.as_mut_ptr() as *mut c_void,
                        dt.nccl(),
                        ncclScalarResidence_t(1), // ncclScalarHostImmediate
                        self.comm,
                    );
                    self.fail("ncclRedOpCreatePreMulSum", res);
                    created = true;
                }
            }
        }
        // SAFETY: the pointers cover the regions of `counts` (see `pointers`).
        let res = unsafe {
            coll::run(
                self.plan.coll,
                s,
                r,
                counts.param,
                dt.nccl(),
                handle,
                root.max(0) as c_int,
                self.rank,
                self.nranks,
                self.comm,
            )
        };
        if let Err((call, code)) = res {
            self.fail(call, code);
        }
        if created {
            self.fail("ncclRedOpDestroy", ncclRedOpDestroy(handle, self.comm));
        }
    }

    /// Writes the inputs of one call (and poisons the receive region when checking).
    fn init_data(&mut self, chk: &Check, counts: &Counts, in_place: bool, poison: bool) {
        let sz = chk.dtype.size();
        let ua = self.plan.unalign * sz;
        let (sb, rb) = (counts.send * sz, counts.recv * sz);
        if in_place {
            let soff = counts.send_inplace_offset * self.rank * sz;
            let roff = counts.recv_inplace_offset * self.rank * sz;
            if poison {
                let end = (soff + sb).max(roff + rb);
                chk.poison(self.recv.bytes(ua, end));
            }
            chk.fill_send(self.rank, self.recv.bytes(ua + soff, sb));
        } else {
            chk.fill_send(self.rank, self.send.bytes(ua, sb));
            if poison {
                chk.poison(self.recv.bytes(ua, rb));
            }
        }
    }

    /// --fresh-inputs: rewrites this rank's input for the next call with its first element
    /// repeated (a valid value of its type, so reductions stay finite). Ranks that pass no
    /// input (a broadcast's or scatter's non-roots) leave theirs alone.
    fn rewrite_input(&mut self, dt: Dtype, root: usize, counts: &Counts, in_place: bool) {
        let rooted = matches!(self.plan.coll, Coll::Broadcast | Coll::Scatter);
        if !self.plan.fresh_inputs || (rooted && self.rank != root) {
            return;
        }
        let sz = dt.size();
        let ua = self.plan.unalign * sz;
        let input = if in_place {
            self.recv.bytes(ua + counts.send_inplace_offset * self.rank * sz, counts.send * sz)
        } else {
            self.send.bytes(ua, counts.send * sz)
        };
        refill_with_first(input, sz);
    }

    fn count_wrong(&mut self, chk: &Check, counts: &Counts, in_place: bool) -> u64 {
        if !chk.rank_checks(self.rank) {
            return 0;
        }
        let sz = chk.dtype.size();
        let ua = self.plan.unalign * sz;
        let roff = if in_place { counts.recv_inplace_offset * self.rank * sz } else { 0 };
        let rank = self.rank;
        let expected = chk.expected(rank, counts);
        let got = self.recv.bytes(ua + roff, counts.recv * sz);
        chk.count_wrong(rank, counts, got, &expected)
    }

    /// nccl-tests' BenchTime: one timed loop and the check, for one size and placement.
    fn bench_time(
        &mut self,
        dt: Dtype,
        op: Option<Op>,
        root: i64,
        counts: &Counts,
        in_place: bool,
        (iters, warmup): (u32, u32),
    ) -> Measure {
        let plan = self.plan;
        let root_u = root.max(0) as usize;
        let op_for_data = op.unwrap_or(Op::Sum);
        // Finite, well-formed inputs for the timed calls too.
        let chk = Check::new(plan.coll, dt, op_for_data, root_u, self.nranks, self.seed);
        self.init_data(&chk, counts, in_place, false);
        // nccl-tests makes one call here; --warmup-each and --arrays the size's warm-up calls.
        for _ in 0..if plan.warmup_each || plan.arrays { warmup.max(1) } else { 1 } {
            self.rewrite_input(dt, root_u, counts, in_place);
            self.start_coll(dt, op, root, counts, in_place);
        }
        self.world.barrier(self.thread);

        let mut iteration_us = Vec::with_capacity(if plan.record_latency { iters as usize } else { 0 });
        let t0 = Instant::now();
        for _ in 0..iters {
            let iteration_start = plan.record_latency.then(Instant::now);
            if plan.agg > 1 {
                self.fail("ncclGroupStart", ncclGroupStart());
            }
            for _ in 0..plan.agg {
                self.rewrite_input(dt, root_u, counts, in_place);
                self.start_coll(dt, op, root, counts, in_place);
            }
            if plan.agg > 1 {
                self.fail("ncclGroupEnd", ncclGroupEnd());
            }
            if let Some(start) = iteration_start {
                iteration_us.push(start.elapsed().as_secs_f64() * 1e6);
            }
        }
        let sec = t0.elapsed().as_secs_f64() / (iters as f64 * plan.agg as f64);
        let sec = self.world.allreduce(self.thread, sec, plan.combine);
        let (algbw, busbw) = plan.coll.bandwidth(counts.param, dt.size(), sec, self.nranks);
        let latencies_us = self.slowest_rank_each(&iteration_us);
        self.world.barrier(self.thread);

        let mut wrong = 0u64;
        for _ in 0..plan.check {
            self.seed += 1;
            let chk = Check::new(plan.coll, dt, op_for_data, root_u, self.nranks, self.seed);
            self.init_data(&chk, counts, in_place, true);
            self.start_coll(dt, op, root, counts, in_place);
            let local = self.count_wrong(&chk, counts, in_place);
            wrong = self.world.allreduce(self.thread, local as f64, Combine::Sum) as u64;
            if wrong > 0 {
                break;
            }
        }
        if plan.check > 0 && wrong > 0 {
            self.out.errors += 1;
        }
        self.out.bw_sum += busbw;
        self.out.bw_count += 1;
        Measure { time_us: sec * 1e6, algbw, busbw, wrong: (plan.check > 0).then_some(wrong), latencies_us }
    }

    /// --arrays: makes `size`'s send and receive arrays current (allocated on its first
    /// timing), each of exactly the bytes its calls reach (the misalignment included; in
    /// place, the receive array holds this rank's input too). The current pair goes back to
    /// the list under its size; the first pair (64 bytes, no size) is dropped.
    fn arrays_for(&mut self, size: usize, elt: usize, counts: &Counts) {
        let host_alloc = self.plan.host_alloc;
        let ua = self.plan.unalign * elt;
        let recv_elems = counts
            .recv
            .max(counts.send_inplace_offset * self.rank + counts.send)
            .max(counts.recv_inplace_offset * self.rank + counts.recv);
        let (send_bytes, recv_bytes) = (ua + counts.send * elt, ua + recv_elems * elt);
        // Timed again (another cycle, type, operator or root): the same pair.
        if self.current_size == Some(size) && self.send.len >= send_bytes && self.recv.len >= recv_bytes {
            return;
        }
        // (Another data type may need a few bytes more of the same size.)
        let fits = |(s, send, recv): &(usize, Buf, Buf)| *s == size && send.len >= send_bytes && recv.len >= recv_bytes;
        let (send, recv) = match self.arrays.iter().position(fits) {
            Some(k) => {
                let (_, send, recv) = self.arrays.swap_remove(k);
                (send, recv)
            }
            None => (Buf::new(send_bytes, host_alloc), Buf::new(recv_bytes, host_alloc)),
        };
        let old_send = std::mem::replace(&mut self.send, send);
        let old_recv = std::mem::replace(&mut self.recv, recv);
        if let Some(old) = self.current_size.replace(size) {
            self.arrays.push((old, old_send, old_recv));
        }
    }

    /// Element-wise maximum over ranks: an iteration lasts as long as its slowest rank.
    fn slowest_rank_each(&self, local: &[f64]) -> Vec<f64> {
        local.iter().map(|&v| self.world.allreduce(self.thread, v, Combine::Max)).collect()
    }

    fn sizes(&self) -> Vec<usize> {
        let p = self.plan;
        let mut v = Vec::new();
        let mut size = p.minbytes;
        while size <= p.maxbytes {
            v.push(size);
            let next =
                if p.stepfactor > 1 { size.saturating_mul(p.stepfactor) } else { size.saturating_add(p.stepbytes) };
            if next <= size {
                break;
            }
            size = next;
        }
        v
    }

    /// nccl-tests' TimeTest: warm-up over doubling sizes, then the sweep.
    fn time_test(&mut self, dt: Dtype, op: Option<Op>, root: i64) {
        let plan = self.plan;
        let elt = dt.size();
        self.world.barrier(self.thread);
        // --arrays: each size warms up in its own arrays instead (bench_time).
        let mut size = plan.minbytes;
        while !plan.arrays && size <= plan.maxbytes {
            let counts = plan.coll.counts(size / elt, elt, self.nranks);
            let (_, warmup) = plan.schedule(size);
            for _ in 0..warmup {
                self.start_coll(dt, op, root, &counts, false);
            }
            if size == 0 {
                break;
            }
            size = size.saturating_mul(2);
        }
        let mut cycle = 0u32;
        loop {
            for size in self.sizes() {
                let counts = plan.coll.counts(size / elt, elt, self.nranks);
                let bytes = counts.send.max(counts.recv) * elt;
                let opname = op.map_or("none", |o| o.name());
                if self.main {
                    print!("{:>12}  {:>12}  {:>8}  {:>6}  {:>6}", bytes, counts.param, dt.name(), opname, root);
                    let _ = std::io::stdout().flush();
                }
                let sched = plan.schedule(size);
                if plan.arrays {
                    self.arrays_for(size, elt, &counts);
                }
                let oop = self.bench_time(dt, op, root, &counts, false, sched);
                if self.main {
                    print!("{}", oop.cell());
                    let _ = std::io::stdout().flush();
                }
                let ip = self.bench_time(dt, op, root, &counts, true, sched);
                if self.main {
                    println!("{}", ip.cell());
                    self.out.rows.push(json::obj(vec![
                        ("collective", json::str(plan.coll.name())),
                        ("size", Json::from(bytes as i64)),
                        ("count", Json::from(counts.param as i64)),
                        ("type", json::str(dt.name())),
                        ("redop", json::str(opname)),
                        ("root", Json::from(root)),
                        ("oop", oop.json()),
                        ("ip", ip.json()),
                    ]));
                }
            }
            cycle += 1;
            if plan.cycles != 0 && cycle >= plan.cycles {
                break;
            }
        }
    }
}

/// Writes `bytes`' first element (of `elem` bytes) over every element: every line of the
/// buffer is stored to, at memset speed.
fn refill_with_first(bytes: &mut [u8], elem: usize) {
    fn fill<T: Copy>(bytes: &mut [u8]) {
        // SAFETY: called with u16, u32 and u64 only, of which every bit pattern is valid.
        let (head, words, tail) = unsafe { bytes.align_to_mut::<T>() };
        assert!(head.is_empty() && tail.is_empty(), "input not aligned to its element size");
        if let Some(&first) = words.first() {
            words.fill(first);
        }
    }
    match elem {
        2 => fill::<u16>(bytes),
        4 => fill::<u32>(bytes),
        8 => fill::<u64>(bytes),
        _ => {
            if let Some(&first) = bytes.first() {
                bytes.fill(first);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_parse_like_nccl_tests() {
        assert_eq!(parse_size("8"), Ok(8));
        assert_eq!(parse_size("32M"), Ok(32 << 20));
        assert_eq!(parse_size("1k"), Ok(1024));
        assert_eq!(parse_size("1.5G"), Ok(3 << 29));
        assert!(parse_size("3T").is_err());
        assert!(parse_size("x").is_err());
    }

    #[test]
    fn tiers_pick_the_largest_start_at_or_below_a_size() {
        let tiers = [parse_tier("1M:20:5").unwrap(), parse_tier("64M:5:2").unwrap()];
        assert_eq!(tiers[0], Tier { from: 1 << 20, iters: 20, warmup: 5 });
        assert_eq!(schedule(&tiers, 100, 10, 8), (100, 10));
        assert_eq!(schedule(&tiers, 100, 10, (1 << 20) - 1), (100, 10));
        assert_eq!(schedule(&tiers, 100, 10, 1 << 20), (20, 5));
        assert_eq!(schedule(&tiers, 100, 10, 128 << 20), (5, 2));
        // Order on the command line does not matter.
        assert_eq!(schedule(&[tiers[1], tiers[0]], 100, 10, 2 << 20), (20, 5));
        for bad in ["1M:20", "1M:0:5", "1M:x:5", "1M:20:5:1", "1X:20:5", ""] {
            assert!(parse_tier(bad).is_err(), "{bad} accepted");
        }
    }

    #[test]
    fn fresh_inputs_repeat_the_first_element_of_every_width() {
        for elem in [1usize, 2, 4, 8] {
            let mut words = vec![0u64; 64];
            let bytes: &mut [u8] = {
                // SAFETY: u64 storage viewed as bytes (any bit pattern is a valid u8).
                unsafe { std::slice::from_raw_parts_mut(words.as_mut_ptr() as *mut u8, 64 * 8) }
            };
            bytes.iter_mut().enumerate().for_each(|(i, b)| *b = i as u8 + 1);
            let first = bytes[..elem].to_vec();
            refill_with_first(&mut bytes[..40 * elem], elem);
            assert!(bytes[..40 * elem].chunks(elem).all(|c| c == first.as_slice()), "width {elem}");
            assert_eq!(bytes[40 * elem], (40 * elem) as u8 + 1, "width {elem}: wrote past the input");
        }
    }
}
