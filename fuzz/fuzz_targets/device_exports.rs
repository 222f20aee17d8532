//! Where a peer says its device buffer is (CUDA IPC handle or cuMem descriptor, offset,
//! address), as gathered to rank 0 before it maps the buffer. Decoding never panics; what
//! decodes re-encodes the same.
#![no_main]
use ferroccl::cuda::ipc::{Export, EXPORT_BYTES};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Some(e) = Export::decode(data) {
        let mut out = [0u8; EXPORT_BYTES];
        e.encode(&mut out);
        assert_eq!(Export::decode(&out), Some(e));
    }
});
