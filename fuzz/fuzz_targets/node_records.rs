//! Node-area records: a rank's buffer descriptor (twelve words another process wrote into its
//! control block) and the call signatures ranks announce there. Any words decode; what decodes
//! re-encodes the same; a claimed allocation range is checked, never trusted; comparing any
//! two signatures (the message naming their differences) never panics.
#![no_main]
use ferroccl::transport::node_area::{Descriptor, DESC_WORDS};
use ferroccl::wire::OpSig;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if data.len() < DESC_WORDS * 8 + 16 {
        return;
    }
    let words: [u64; DESC_WORDS] =
        std::array::from_fn(|i| u64::from_le_bytes(data[i * 8..i * 8 + 8].try_into().unwrap()));
    let d = Descriptor::decode(&words);
    assert_eq!(Descriptor::decode(&d.encode()), d);
    let tail = &data[DESC_WORDS * 8..];
    let len = u64::from_le_bytes(tail[..8].try_into().unwrap()) as usize;
    for buf in [d.send, d.recv] {
        if let Some(r) = buf.shared_range(len) {
            assert!(r.offset.checked_add(len as u64).is_some_and(|end| end <= r.size));
        }
    }
    let (a, b) = (
        OpSig(u32::from_le_bytes(tail[8..12].try_into().unwrap())),
        OpSig(u32::from_le_bytes(tail[12..16].try_into().unwrap())),
    );
    let diffs = a.differences(b, "rank 0", "rank 1");
    assert_eq!(a.check(b, 0, 1).is_err(), !diffs.is_empty());
});
