//! # ferroccl
//!
//! A re-implementation of NVIDIA NCCL's C API in Rust: `libnccl.so` for C, C++ and Fortran
//! programs built against NCCL, on host memory today and CUDA device memory next.
//!
//! # Layers
//!
//! Each module uses only modules of lower layers (or of its own row, where the graph shows no
//! cycle); `tests/it/layers.rs` reads `src/` and fails on any cycle between top-level modules.
//! Bottom up:
//! 1. [`error`] (the error enum and `ncclResult_t`), [`env`](mod@env) (the only reader of the
//!    environment), [`hash`], [`version`], [`memcopy`] (byte copies at memory speed whatever
//!    the buffers' page offsets);
//! 2. [`types`] (C ABI types, parsed at the edge), [`debug`] (NCCL-format logging),
//!    [`encryption`] (the process-wide key setting), [`topo`] (cores, NUMA, NICs),
//!    [`interrupt`] (the abort flag and no-progress deadline every wait polls);
//! 3. [`wire`] (fixed layouts of every byte exchanged with peers), [`reduce`] (reduction
//!    kernels on host memory), [`cuda`] (the driver loaded at run time, memory kinds, streams,
//!    IPC, the CUDA kernels), [`tls`] (TLS streams and the connection registry), [`config`]
//!    (`ncclConfig_t`);
//! 4. [`transport`]: TCP building blocks, the `ncclNet_t`-shaped [`transport::Net`] with its
//!    socket and shared-memory implementations, node areas, per-communicator connection tables;
//! 5. [`bootstrap`]: unique ids, the rendezvous root, the setup ring;
//! 6. [`comm`]: communicators and their lifecycle;
//! 7. [`coll`] (plans as data, algorithms, the plan cache, the progress engine, the
//!    stream-ordered executor for device buffers) and
//!    [`coverage`] (the encryption coverage report);
//! 8. [`group`]: group semantics; [`creation`]: communicator creation run as NCCL runs it,
//!    blocking or in the background behind a handle the caller already holds;
//! 9. [`ffi`]: the C boundary, one thin file per section of nccl.h.
//!
//! `unsafe` lives at the edges only: `ffi`, raw memory in `coll::exec`, `memcopy` and the
//! transports, and libc calls; each block carries a `// SAFETY:` comment.
#![deny(unsafe_op_in_unsafe_fn)]
#![warn(clippy::undocumented_unsafe_blocks)]
#![allow(clippy::missing_safety_doc)]

pub mod bootstrap;
pub mod coll;
pub mod comm;
pub mod config;
pub mod coverage;
pub mod creation;
pub mod cuda;
pub mod debug;
pub mod encryption;
pub mod env;
pub mod error;
pub mod ffi;
pub mod group;
pub mod hash;
pub mod interrupt;
pub mod memcopy;
pub mod reduce;
pub mod tls;
pub mod topo;
pub mod transport;
pub mod types;
pub mod version;
pub mod wire;

pub use error::{Error, Result};
