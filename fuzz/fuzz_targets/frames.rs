//! What arrives first on a data connection: the hello (connection kind, rank, magic) and the
//! frame headers after it. Garbage is an error, never a panic; what decodes re-encodes the same.
#![no_main]
use ferroccl::wire::{frame_fields, frame_header, Hello};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    // The receiver's expected magic: the first 8 bytes when present, else a fixed one.
    let magic = data.get(..8).map_or(0x5647_ab9f_2fc4_b9d6, |m| u64::from_le_bytes(m.try_into().unwrap()));
    let body = data.get(8..).unwrap_or(data);
    if let Ok(h) = Hello::decode(body, magic) {
        assert_eq!(Hello::decode(&h.encode(), magic).expect("re-decodes"), h);
    }
    if let Ok((len, sig)) = frame_fields(body) {
        assert_eq!(frame_header(len, sig).as_slice(), body, "canonical");
        // The signature of a frame is compared against this rank's call: never a panic.
        let mine = ferroccl::wire::OpSig(magic as u32);
        let _ = mine.check(sig, 0, 1);
    }
});
