//! # ferroccl
//!
//! A re-implementation of NVIDIA NCCL's C API in Rust: `libnccl.so` for C, C++ and Fortran
//! programs built against NCCL, on host memory today and CUDA device memory next.
//!
//! Layers, bottom up:
//! - [`env`] (the only reader of the environment) and [`debug`] (NCCL-format logging);
//! - [`transport`]: TCP building blocks, the `ncclNet_t`-shaped [`transport::Net`] with its
//!   socket implementation, and per-communicator connection tables;
//! - [`bootstrap`]: unique ids, the rendezvous root, the setup ring;
//! - [`comm`]: communicators and their lifecycle; [`group`]: group semantics;
//! - [`coll`]: plans (schedules as data), algorithms, reduction kernels, the progress engine;
//! - [`ffi`]: the C boundary, one thin file per section of nccl.h.
//!
//! `unsafe` lives at the edges only: `ffi`, raw memory in `coll::exec` and the transports,
//! and libc calls; each block carries a `// SAFETY:` comment.
#![deny(unsafe_op_in_unsafe_fn)]
#![warn(clippy::undocumented_unsafe_blocks)]
#![allow(clippy::missing_safety_doc)]

pub mod bootstrap;
pub mod coll;
pub mod comm;
pub mod config;
pub mod coverage;
pub mod debug;
pub mod encryption;
pub mod env;
pub mod error;
pub mod ffi;
pub mod group;
pub mod hash;
pub mod reduce;
pub mod tls;
pub mod topo;
pub mod transport;
pub mod types;
pub mod version;
pub mod wire;

pub use error::{Error, Result};
