//! Connection blobs: each rank's peer record (transport handles) as all-gathered at init, and
//! the split table of ncclCommSplit. Decoding never panics; what decodes re-encodes the same.
#![no_main]
use ferroccl::wire::{PeerInfo, SplitEntry};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(p) = PeerInfo::decode(data) {
        let again = p.encode().expect("a decoded record encodes");
        assert_eq!(PeerInfo::decode(&again).expect("re-decodes"), p);
    }
    if let Some((&n, rest)) = data.split_first() {
        let _ = PeerInfo::decode_all(rest, usize::from(n % 16) + 1);
    }
    if let Ok(entries) = SplitEntry::decode_all(data) {
        let again: Vec<u8> = entries.iter().flat_map(|e| e.encode()).collect();
        assert_eq!(SplitEntry::decode_all(&again).expect("re-decodes"), entries);
    }
});
