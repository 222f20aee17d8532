//! CUDA, loaded at run time: the one place that talks to the driver.
//!
//! One binary serves hosts with and without a GPU. The driver (`libcuda.so.1`) and NVRTC are
//! opened with cudarc's dynamic loading the first time they are needed; [`driver::available`]
//! answers whether CUDA can be used at all, and every other function here is only called once
//! it said yes (cudarc panics on a missing library, so nothing may reach it unprobed).
//!
//! - [`driver`]: the probe, result checking, contexts;
//! - [`memory`]: what kind of memory a pointer is ([`memory::MemKind`]), device and pinned
//!   allocations;
//! - [`stream`]: stream-ordered copies and memory operations (wait/write a flag);
//! - [`kernels`]: the reduction and copy kernels, compiled by NVRTC for the running GPU;
//! - [`batch`]: a group's folds gathered into few launches;
//! - [`graph`]: host nodes and graph-owned objects for operations captured into CUDA graphs;
//! - [`vmm`]: ncclMemAlloc's exportable allocations (cuMem*) and their import by peers;
//! - [`ipc`]: any device buffer as another process on this host finds it.

pub mod batch;
pub mod driver;
pub mod graph;
pub mod ipc;
pub mod kernels;
pub mod memory;
pub mod stream;
pub mod vmm;
