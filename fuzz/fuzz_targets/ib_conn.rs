//! What an InfiniBand peer sends: its connection info over the setup socket (queue pair,
//! GID/LID, FIFO address and rkey) and the clear-to-send entries it RDMA-writes into our
//! FIFO. Garbage is an error, never a panic; what decodes re-encodes to the same bytes.
#![no_main]
use ferroccl::wire::{CtsEntry, IbConnInfo};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(c) = IbConnInfo::decode(data) {
        assert_eq!(c.encode().as_slice(), data, "connection info not canonical");
        assert_eq!(IbConnInfo::decode(&c.encode()).expect("re-decodes"), c);
    }
    if let Ok(e) = CtsEntry::decode(data) {
        assert_eq!(e.encode().as_slice(), data, "CTS entry not canonical");
    }
    // A FIFO read as a whole: every 32-byte slot on its own.
    for slot in data.chunks(32) {
        let _ = CtsEntry::decode(slot);
    }
});
