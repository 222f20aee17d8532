//! ncclUniqueId bytes, as a user or launcher passes them between processes: decoding never
//! panics, and what decodes re-encodes to the same bytes.
#![no_main]
use ferroccl::wire::UniqueId;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(id) = UniqueId::decode(data) {
        let again = id.encode();
        assert_eq!(UniqueId::decode(&again).expect("an encoded id decodes"), id);
    }
});
