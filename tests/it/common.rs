//! Helpers: ranks as threads, typed buffers as bytes, expected results computed independently
//! of the library (in i128 / f64, then rounded into the type).

use std::ffi::CStr;
use std::sync::Arc;

use ferroccl::ffi::init::{ncclCommDestroy, ncclCommInitRank, ncclGetUniqueId};
use ferroccl::ffi::query::{ncclGetErrorString, ncclGetLastError};
use ferroccl::types::{ncclComm_t, ncclResult_t, ncclUniqueId, DataType};

/// A communicator handle that can cross threads (it is an opaque token).
#[derive(Clone, Copy, Debug)]
pub struct Comm(pub ncclComm_t);
// SAFETY: ncclComm_t is an opaque token; the library is thread-safe for distinct comms.
unsafe impl Send for Comm {}
// SAFETY: as above.
unsafe impl Sync for Comm {}

pub fn check(r: ncclResult_t, what: &str) {
    if r != ncclResult_t::ncclSuccess {
        // SAFETY: both return static or thread-local NUL-terminated strings.
        let (s, last) =
            unsafe { (CStr::from_ptr(ncclGetErrorString(r)), CStr::from_ptr(ncclGetLastError(std::ptr::null_mut()))) };
        panic!("{what} failed: {} ({:?}): {:?}", r.0, s, last);
    }
}

/// A float sum all-reduce of host buffers of equal length, outside any stream: the call the
/// process tests make.
pub fn all_reduce_f32(send: &[f32], recv: &mut [f32], comm: ncclComm_t) -> ncclResult_t {
    assert_eq!(send.len(), recv.len(), "send and receive buffers of one all-reduce");
    ferroccl::ffi::coll::ncclAllReduce(
        send.as_ptr().cast(),
        recv.as_mut_ptr().cast(),
        send.len(),
        ferroccl::types::ncclDataType_t(7),
        ferroccl::types::ncclRedOp_t(0),
        comm,
        std::ptr::null_mut(),
    )
}

pub fn unique_id() -> ncclUniqueId {
    let mut id = ncclUniqueId { internal: [0; 128] };
    check(ncclGetUniqueId(&mut id), "ncclGetUniqueId");
    id
}

/// Runs `body(rank, comm)` on `n` threads, one communicator each; destroys them afterwards.
pub fn with_ranks<T: Send + 'static>(n: usize, body: impl Fn(usize, Comm) -> T + Send + Sync + 'static) -> Vec<T> {
    with_prepared_ranks(n, || {}, body)
}

/// [`with_ranks`], with `prepare()` run on each rank's thread before its communicator is made
/// (a CUDA test makes the device current there).
pub fn with_prepared_ranks<T: Send + 'static>(
    n: usize,
    prepare: impl Fn() + Send + Sync + 'static,
    body: impl Fn(usize, Comm) -> T + Send + Sync + 'static,
) -> Vec<T> {
    let id = unique_id();
    let shared = Arc::new((prepare, body));
    let threads: Vec<_> = (0..n)
        .map(|rank| {
            let shared = shared.clone();
            std::thread::spawn(move || {
                (shared.0)();
                let mut comm: ncclComm_t = std::ptr::null_mut();
                check(ncclCommInitRank(&mut comm, n as i32, id, rank as i32), "ncclCommInitRank");
                let out = (shared.1)(rank, Comm(comm));
                check(ncclCommDestroy(comm), "ncclCommDestroy");
                out
            })
        })
        .collect();
    threads.into_iter().map(|t| t.join().expect("rank thread panicked")).collect()
}

/// A value as the tests reason about it: exact integers or floats.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Val {
    Int(i128),
    Float(f64),
}

pub fn is_int(dt: DataType) -> bool {
    !dt.is_float()
}

/// Encodes a value into `dt` (integers wrap; floats round to nearest even).
pub fn encode(dt: DataType, v: Val, out: &mut Vec<u8>) {
    let i = |v: Val| match v {
        Val::Int(i) => i,
        Val::Float(f) => f as i128,
    };
    let f = |v: Val| match v {
        Val::Int(i) => i as f64,
        Val::Float(f) => f,
    };
    match dt {
        DataType::Int8 => out.extend_from_slice(&(i(v) as i8).to_ne_bytes()),
        DataType::Uint8 => out.extend_from_slice(&(i(v) as u8).to_ne_bytes()),
        DataType::Int32 => out.extend_from_slice(&(i(v) as i32).to_ne_bytes()),
        DataType::Uint32 => out.extend_from_slice(&(i(v) as u32).to_ne_bytes()),
        DataType::Int64 => out.extend_from_slice(&(i(v) as i64).to_ne_bytes()),
        DataType::Uint64 => out.extend_from_slice(&(i(v) as u64).to_ne_bytes()),
        DataType::Float16 => out.extend_from_slice(&half::f16::from_f64(f(v)).to_ne_bytes()),
        DataType::Bfloat16 => out.extend_from_slice(&half::bf16::from_f64(f(v)).to_ne_bytes()),
        DataType::Float32 => out.extend_from_slice(&(f(v) as f32).to_ne_bytes()),
        DataType::Float64 => out.extend_from_slice(&f(v).to_ne_bytes()),
        DataType::Float8e4m3 => out.push(float8::F8E4M3::from_f64(f(v)).to_bits()),
        DataType::Float8e5m2 => out.push(float8::F8E5M2::from_f64(f(v)).to_bits()),
    }
}

/// Decodes element `idx` of `bytes` as f64 (for tolerant comparisons).
pub fn decode_f64(dt: DataType, bytes: &[u8], idx: usize) -> f64 {
    let s = dt.size();
    let b = &bytes[idx * s..(idx + 1) * s];
    match dt {
        DataType::Int8 => b[0] as i8 as f64,
        DataType::Uint8 => b[0] as f64,
        DataType::Int32 => i32::from_ne_bytes(b.try_into().unwrap()) as f64,
        DataType::Uint32 => u32::from_ne_bytes(b.try_into().unwrap()) as f64,
        DataType::Int64 => i64::from_ne_bytes(b.try_into().unwrap()) as f64,
        DataType::Uint64 => u64::from_ne_bytes(b.try_into().unwrap()) as f64,
        DataType::Float16 => half::f16::from_ne_bytes(b.try_into().unwrap()).to_f64(),
        DataType::Bfloat16 => half::bf16::from_ne_bytes(b.try_into().unwrap()).to_f64(),
        DataType::Float32 => f32::from_ne_bytes(b.try_into().unwrap()) as f64,
        DataType::Float64 => f64::from_ne_bytes(b.try_into().unwrap()),
        DataType::Float8e4m3 => float8::F8E4M3::from_bits(b[0]).to_f64(),
        DataType::Float8e5m2 => float8::F8E5M2::from_bits(b[0]).to_f64(),
    }
}

/// Input element `i` of `rank`: integers exercise wrap-around, floats stay exactly summable.
pub fn input(dt: DataType, op: &str, rank: usize, i: usize) -> Val {
    let h = (rank * 131 + i * 71 + 7) % 1009;
    if is_int(dt) {
        let span: i128 = match dt.size() {
            1 => 256,
            4 => 1 << 32,
            _ => 1 << 64,
        };
        // Large magnitudes so sums and products wrap.
        let v = (h as i128 * (span / 1009 + 1)) % span - span / 2;
        return Val::Int(if op == "prod" { (h % 5) as i128 - 2 } else { v });
    }
    let small_type = matches!(dt, DataType::Float8e4m3 | DataType::Float8e5m2);
    Val::Float(match op {
        "prod" => [1.0, 2.0, 0.5, -1.0][h % 4],
        _ if small_type => (h % 2) as f64,
        _ => (h % 17) as f64 - 8.0,
    })
}

/// The exact reduction of `vals` under `op` for `dt`, rounded into `dt`.
pub fn reduce_expected(dt: DataType, op: &str, vals: &[Val], out: &mut Vec<u8>) {
    if is_int(dt) {
        let bits = dt.size() as u32 * 8;
        let signed = matches!(dt, DataType::Int8 | DataType::Int32 | DataType::Int64);
        let wrap = |x: i128| -> i128 {
            let m = x & ((1i128 << bits) - 1);
            if signed && m >= 1i128 << (bits - 1) {
                m - (1i128 << bits)
            } else {
                m
            }
        };
        let xs: Vec<i128> = vals.iter().map(|v| if let Val::Int(i) = v { wrap(*i) } else { unreachable!() }).collect();
        let r = match op {
            "sum" => xs.iter().fold(0i128, |a, &b| wrap(a.wrapping_add(b))),
            "prod" => xs.iter().fold(1i128, |a, &b| wrap(a.wrapping_mul(b))),
            "max" => *xs.iter().max().unwrap(),
            "min" => *xs.iter().min().unwrap(),
            "avg" => {
                let s = xs.iter().fold(0i128, |a, &b| wrap(a.wrapping_add(b)));
                s / xs.len() as i128 // truncation toward zero, as Rust integer division
            }
            _ => unreachable!(),
        };
        encode(dt, Val::Int(r), out);
    } else {
        let xs: Vec<f64> = vals.iter().map(|v| if let Val::Float(f) = v { *f } else { unreachable!() }).collect();
        let r = match op {
            "sum" => xs.iter().sum(),
            "prod" => xs.iter().product(),
            "max" => xs.iter().cloned().fold(f64::MIN, f64::max),
            "min" => xs.iter().cloned().fold(f64::MAX, f64::min),
            "avg" => xs.iter().sum::<f64>() / xs.len() as f64,
            _ => unreachable!(),
        };
        encode(dt, Val::Float(r), out);
    }
}

pub fn op_code(op: &str) -> i32 {
    match op {
        "sum" => 0,
        "prod" => 1,
        "max" => 2,
        "min" => 3,
        "avg" => 4,
        _ => unreachable!(),
    }
}

/// Compares results: bit-exact, except float averages (1/n is inexact) within `rel`.
pub fn compare(dt: DataType, op: &str, got: &[u8], want: &[u8], what: &str) {
    assert_eq!(got.len(), want.len(), "{what}: length");
    if op == "avg" && dt.is_float() {
        let rel = match dt {
            DataType::Float32 | DataType::Float64 => 1e-6,
            _ => 0.13, // fp8 has 3 mantissa bits
        };
        for i in 0..got.len() / dt.size() {
            let (g, w) = (decode_f64(dt, got, i), decode_f64(dt, want, i));
            assert!((g - w).abs() <= rel * w.abs().max(1.0), "{what}: element {i}: got {g}, want {w}");
        }
    } else if got != want {
        let es = dt.size();
        let i = (0..got.len() / es).find(|&i| got[i * es..(i + 1) * es] != want[i * es..(i + 1) * es]).unwrap();
        panic!(
            "{what}: first difference at element {i}: got {:?} want {:?} ({} vs {})",
            &got[i * es..(i + 1) * es],
            &want[i * es..(i + 1) * es],
            decode_f64(dt, got, i),
            decode_f64(dt, want, i)
        );
    }
}

/// `count` inputs of `rank` encoded in `dt`.
pub fn inputs(dt: DataType, op: &str, rank: usize, count: usize) -> Vec<u8> {
    let mut v = Vec::with_capacity(count * dt.size());
    for i in 0..count {
        encode(dt, input(dt, op, rank, i), &mut v);
    }
    v
}

/// The all-reduce of every rank's inputs.
pub fn all_reduced(dt: DataType, op: &str, nranks: usize, count: usize) -> Vec<u8> {
    let mut out = Vec::with_capacity(count * dt.size());
    for i in 0..count {
        let vals: Vec<Val> = (0..nranks).map(|r| input(dt, op, r, i)).collect();
        reduce_expected(dt, op, &vals, &mut out);
    }
    out
}
