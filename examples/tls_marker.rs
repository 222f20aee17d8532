//! Moves buffers full of an ASCII marker through ferroccl (all-gather and broadcast, ranks as
//! threads, through the C ABI) so that a packet capture can show whether the marker crosses
//! the wire in the clear. Driven by tests/tls/capture.sh.
//!
//! Usage: tls_marker [--psk KEY] [--marker TEXT] [--ranks N] [--bytes B]
//! With --psk the process calls ncclSetEncryption first (a TLS build is needed).

use std::ffi::CString;
use std::process::ExitCode;
use std::sync::Arc;

use ferroccl::ffi::coll::{ncclAllGather, ncclBroadcast};
use ferroccl::ffi::encryption::ncclSetEncryption;
use ferroccl::ffi::init::{ncclCommDestroy, ncclCommInitRank, ncclGetUniqueId};
use ferroccl::ffi::query::ncclGetLastError;
use ferroccl::types::{
    ncclComm_t, ncclDataType_t, ncclEncryptionConfig_t, ncclResult_t, ncclUniqueId, NCCL_API_MAGIC,
    NCCL_ENCRYPTION_MODE_PSK,
};

const UINT8: ncclDataType_t = ncclDataType_t(1);

fn check(r: ncclResult_t, what: &str) -> Result<(), String> {
    if r == ncclResult_t::ncclSuccess {
        return Ok(());
    }
    // SAFETY: ncclGetLastError returns a NUL-terminated string valid until the next call.
    let msg = unsafe { std::ffi::CStr::from_ptr(ncclGetLastError(std::ptr::null_mut())) };
    Err(format!("{what} failed with {}: {}", r.0, msg.to_string_lossy()))
}

struct Args {
    psk: Option<String>,
    marker: String,
    ranks: usize,
    bytes: usize,
}

fn parse() -> Result<Args, String> {
    let mut a = Args { psk: None, marker: "FERROCCL-MARKER-7f3a".into(), ranks: 2, bytes: 1 << 20 };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let mut value = || it.next().ok_or_else(|| format!("{flag} needs a value"));
        match flag.as_str() {
            "--psk" => a.psk = Some(value()?),
            "--marker" => a.marker = value()?,
            "--ranks" => a.ranks = value()?.parse().map_err(|e| format!("--ranks: {e}"))?,
            "--bytes" => a.bytes = value()?.parse().map_err(|e| format!("--bytes: {e}"))?,
            other => return Err(format!("unknown argument {other}")),
        }
    }
    Ok(a)
}

fn filled(marker: &str, len: usize) -> Vec<u8> {
    marker.bytes().cycle().take(len).collect()
}

#[derive(Clone, Copy)]
struct Comm(ncclComm_t);
// SAFETY: an opaque token; each thread uses its own communicator.
unsafe impl Send for Comm {}

fn run() -> Result<(), String> {
    let args = parse()?;
    if let Some(psk) = &args.psk {
        let key = CString::new(psk.as_str()).map_err(|_| "--psk contains NUL".to_string())?;
        let cfg = ncclEncryptionConfig_t {
            size: std::mem::size_of::<ncclEncryptionConfig_t>(),
            magic: NCCL_API_MAGIC,
            version: 23200, // NCCL_VERSION(2,32,0), as NCCL_ENCRYPTION_CONFIG_INITIALIZER
            mode: NCCL_ENCRYPTION_MODE_PSK,
            psk: key.as_ptr(),
        };
        check(ncclSetEncryption(&cfg), "ncclSetEncryption")?;
    }
    let mut id = ncclUniqueId { internal: [0; 128] };
    check(ncclGetUniqueId(&mut id), "ncclGetUniqueId")?;
    let n = args.ranks;
    let args = Arc::new(args);
    let threads: Vec<_> = (0..n)
        .map(|rank| {
            let args = args.clone();
            std::thread::spawn(move || -> Result<(), String> {
                let mut comm: ncclComm_t = std::ptr::null_mut();
                check(ncclCommInitRank(&mut comm, n as i32, id, rank as i32), "ncclCommInitRank")?;
                let comm = Comm(comm);
                let mine = filled(&args.marker, args.bytes);
                let mut all = vec![0u8; args.bytes * n];
                let s = std::ptr::null_mut();
                check(
                    ncclAllGather(mine.as_ptr().cast(), all.as_mut_ptr().cast(), args.bytes, UINT8, comm.0, s),
                    "ncclAllGather",
                )?;
                if all != filled(&args.marker, args.bytes).repeat(n) {
                    return Err(format!("rank {rank}: all-gather result differs"));
                }
                let mut b = if rank == 0 { filled(&args.marker, args.bytes) } else { vec![0u8; args.bytes] };
                check(
                    ncclBroadcast(b.as_ptr().cast(), b.as_mut_ptr().cast(), args.bytes, UINT8, 0, comm.0, s),
                    "ncclBroadcast",
                )?;
                if b != mine {
                    return Err(format!("rank {rank}: broadcast result differs"));
                }
                check(ncclCommDestroy(comm.0), "ncclCommDestroy")
            })
        })
        .collect();
    for t in threads {
        t.join().map_err(|_| "rank thread panicked".to_string())??;
    }
    println!(
        "tls_marker: ok ({} ranks, {} bytes, {})",
        n,
        args.bytes,
        if args.psk.is_some() { "encrypted" } else { "plaintext" }
    );
    Ok(())
}

fn main() -> ExitCode {
    match run() {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("tls_marker: {e}");
            ExitCode::FAILURE
        }
    }
}
