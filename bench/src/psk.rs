//! The benchmark's side of `ncclSetEncryption`: reading a pre-shared key from the environment
//! (`--psk-env VAR`; never from the command line, where `ps` would show it), generating a
//! throw-away key for the encryption canary, and configuring the library with it.

use std::ffi::{CString, OsStr};
use std::io::Read;
use std::os::unix::ffi::OsStrExt;

use ferroccl::ffi::encryption::ncclSetEncryption;
use ferroccl::ffi::query::{ncclGetErrorString, ncclGetLastError};
use ferroccl::types::{ncclEncryptionConfig_t, ncclResult_t, NCCL_API_MAGIC, NCCL_ENCRYPTION_MODE_PSK};

/// NCCL's minimum key length (shorter keys are refused by the library too).
pub const MIN_PSK_BYTES: usize = 32;

/// What `NCCL_ENCRYPTION_CONFIG_INITIALIZER` puts in `version`: NCCL_VERSION(2,32,0).
const ENCRYPTION_CONFIG_VERSION: u32 = 23200;

/// Random bytes behind a generated key.
const GENERATED_KEY_BYTES: usize = 32;
/// Length of a generated key: its random bytes in hex.
pub const GENERATED_KEY_LEN: usize = 2 * GENERATED_KEY_BYTES;

/// Hint for a build whose library has no TLS backend.
pub const NO_TLS_HINT: &str =
    "this ferroccl-bench was built without TLS support: rebuild it with --features tls (ferroccl/openssl3)";

/// A key that is wiped from memory when dropped.
pub struct Psk(CString);

impl Drop for Psk {
    fn drop(&mut self) {
        let mut bytes = std::mem::take(&mut self.0).into_bytes_with_nul();
        ferroccl::encryption::wipe(&mut bytes);
    }
}

impl Psk {
    /// The key as text (to hand to a child process through its environment).
    pub fn as_os_str(&self) -> &OsStr {
        OsStr::from_bytes(self.0.as_bytes())
    }

    pub fn as_bytes(&self) -> &[u8] {
        self.0.as_bytes()
    }

    /// Validates raw key bytes; `source` names where they came from in error messages.
    pub fn from_bytes(bytes: &[u8], source: &str) -> Result<Psk, String> {
        if bytes.len() < MIN_PSK_BYTES {
            return Err(format!(
                "{source}: the pre-shared key has {} bytes; at least {MIN_PSK_BYTES} are required",
                bytes.len()
            ));
        }
        // Environment values cannot hold NUL bytes, but keys from elsewhere might.
        CString::new(bytes).map(Psk).map_err(|_| format!("{source}: the pre-shared key contains a NUL byte"))
    }

    /// The key in environment variable `var`.
    pub fn from_env(var: &str) -> Result<Psk, String> {
        let source = format!("--psk-env {var}");
        let value = std::env::var_os(var).ok_or_else(|| format!("{source}: the variable is not set"))?;
        Psk::from_bytes(value.as_bytes(), &source)
    }

    /// A fresh random key: 64 hex characters from /dev/urandom.
    pub fn generate() -> Result<Psk, String> {
        let mut random = [0u8; GENERATED_KEY_BYTES];
        std::fs::File::open("/dev/urandom")
            .and_then(|mut f| f.read_exact(&mut random))
            .map_err(|e| format!("cannot read /dev/urandom for a canary key: {e}"))?;
        let hex: String = random.iter().map(|b| format!("{b:02x}")).collect();
        random.fill(0);
        Psk::from_bytes(hex.as_bytes(), "generated key")
    }
}

/// Configures the library's process-wide encryption with `psk`: must come before the first
/// unique id or communicator of this process (the library freezes the setting then).
pub fn enable(psk: &Psk) -> Result<(), String> {
    let config = ncclEncryptionConfig_t {
        size: std::mem::size_of::<ncclEncryptionConfig_t>(),
        magic: NCCL_API_MAGIC,
        version: ENCRYPTION_CONFIG_VERSION,
        mode: NCCL_ENCRYPTION_MODE_PSK,
        psk: psk.0.as_ptr(),
    };
    library_result(ncclSetEncryption(&config))
}

/// Back to plaintext (only valid while the setting is not frozen).
pub fn disable() -> Result<(), String> {
    library_result(ncclSetEncryption(std::ptr::null()))
}

/// Whether the library accepts a key at all: sets `psk` and clears it again. For a process
/// that checks before starting others and never creates a communicator itself.
pub fn check_tls_support(psk: &Psk) -> Result<(), String> {
    enable(psk)?;
    disable()
}

fn library_result(r: ncclResult_t) -> Result<(), String> {
    if r == ncclResult_t::ncclSuccess {
        return Ok(());
    }
    // The library answers a key with ncclInvalidUsage only when it has no TLS backend (the
    // setting cannot be frozen yet here: this runs before any unique id or communicator).
    if r == ncclResult_t::ncclInvalidUsage {
        return Err(NO_TLS_HINT.into());
    }
    Err(format!(
        "ncclSetEncryption failed: {} / {}",
        crate::cstr(ncclGetErrorString(r)),
        crate::cstr(ncclGetLastError(std::ptr::null_mut()))
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn short_keys_are_refused_with_their_length() {
        let err = Psk::from_bytes(b"too short", "--psk-env K").err().unwrap();
        assert!(err.contains("--psk-env K") && err.contains("9 bytes") && err.contains("at least 32"), "{err}");
        assert!(Psk::from_bytes(&[b'k'; 32], "x").is_ok());
        assert!(Psk::from_bytes(&[0u8; 40], "x").is_err());
    }

    #[test]
    fn generated_keys_are_64_hex_characters_and_differ() {
        let (a, b) = (Psk::generate().unwrap(), Psk::generate().unwrap());
        let text = a.as_os_str().to_str().unwrap();
        assert_eq!(text.len(), GENERATED_KEY_LEN);
        assert!(text.bytes().all(|c| c.is_ascii_hexdigit()));
        assert_ne!(a.as_os_str(), b.as_os_str());
    }
}
