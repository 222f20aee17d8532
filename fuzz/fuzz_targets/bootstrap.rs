//! Bootstrap messages: a rank's announcement to the root and the root's address table, and
//! the socket addresses inside them. Decoding never panics; what decodes re-encodes the same.
#![no_main]
use ferroccl::wire::{decode_addr, decode_table, encode_addr, encode_table, RankInfo, ADDR_BYTES};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(info) = RankInfo::decode(data) {
        assert_eq!(RankInfo::decode(&info.encode()).expect("re-decodes"), info);
    }
    if let Ok(addr) = decode_addr(data) {
        let mut out = [0u8; ADDR_BYTES];
        encode_addr(&addr, &mut out);
        assert_eq!(decode_addr(&out).expect("re-decodes"), addr);
    }
    // The first byte picks the rank count the receiver expects (1 to 64).
    if let Some((&n, rest)) = data.split_first() {
        let nranks = usize::from(n % 64) + 1;
        if let Ok(table) = decode_table(rest, nranks) {
            assert_eq!(table.len(), nranks);
            assert_eq!(decode_table(&encode_table(&table), nranks).expect("re-decodes"), table);
        }
    }
});
