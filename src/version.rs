//! Versions: the NCCL version ferroccl advertises (kept below 2.28 so nccl-tests does not
//! compile NCCL's device API against us) and ferroccl's own.

/// `NCCL_VERSION_CODE` of include/nccl.h (2.27.7); ncclGetVersion returns the same.
pub const NCCL_VERSION_CODE: i32 = 22707;
pub const NCCL_VERSION_STRING: &str = "2.27.7";
pub const FERROCCL_VERSION: &str = env!("CARGO_PKG_VERSION");

/// The banner NCCL prints at init with NCCL_DEBUG=VERSION or above.
pub fn banner() -> String {
    format!("NCCL version {NCCL_VERSION_STRING}+ferroccl-{FERROCCL_VERSION} (build: {})", build_options())
}

/// Compile-time options, for the banner and the demo.
pub fn build_options() -> String {
    let tls = if cfg!(feature = "openssl3") { "TLS_BACKEND=OPENSSL3" } else { "TLS_BACKEND=none" };
    let mpi = if cfg!(feature = "mpi") { "MPI=on" } else { "MPI=off" };
    format!("{tls} {mpi}")
}
