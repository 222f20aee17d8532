//! The 128-byte unique id: the root's address and a random magic that every connection of the
//! communicator carries (connections with another magic are dropped).

use crate::error::{Error, Result};
pub use crate::wire::UniqueId;

/// Magic NCCL uses when the root address comes from NCCL_COMM_ID.
pub const COMM_ID_ENV_MAGIC: u64 = 0x0280_0280_0280_0280;

/// 64 random bits from the kernel.
pub fn random_u64() -> Result<u64> {
    let mut v = [0u8; 8];
    // SAFETY: getrandom writes at most v.len() bytes into v.
    let n = unsafe { libc::getrandom(v.as_mut_ptr().cast(), v.len(), 0) };
    if n != v.len() as isize {
        return Err(Error::system("getrandom", std::io::Error::last_os_error()));
    }
    Ok(u64::from_ne_bytes(v))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn random_words_differ() {
        assert_ne!(random_u64().unwrap(), random_u64().unwrap());
    }
}
