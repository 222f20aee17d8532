//! Integration tests through the C ABI, with ranks as threads of this process.
//! One binary (module per area), as in rustls' tests/api.

mod broadcast_stream;
mod call_shapes;
mod collectives;
mod common;
mod cuda;
mod cuda_kernels;
mod errors;
mod garbage;
mod ib;
mod interrupts;
mod layers;
mod lifecycle;
mod mismatch;
mod nonblocking;
mod processes;
mod progressive;
mod recreate;
mod shrink;
mod tls;
mod vanished;
