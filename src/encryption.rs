//! The process-wide encryption setting made by ncclSetEncryption.
//!
//! It must be set before the first unique id or communicator; after that it is frozen, so no
//! connection of this process can ever see a different setting. Fail-closed rule: whenever a
//! key is configured, every TCP stream must be encrypted; a build or code path that cannot
//! encrypt refuses to connect instead of sending plaintext. The TLS itself lives in
//! [`crate::tls`]; this module also owns FERROCCL_ENCRYPTION_POLICY ([`policy`], [`strict`]).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;

use crate::error::{Error, Result};

/// Minimum PSK length NCCL accepts.
pub const MIN_PSK_BYTES: usize = 32;

/// The configured key, wiped on replacement and on drop.
pub struct Psk(Vec<u8>);

impl Drop for Psk {
    fn drop(&mut self) {
        wipe(&mut self.0);
    }
}

impl Psk {
    pub fn bytes(&self) -> &[u8] {
        &self.0
    }
}

/// Overwrites key material so it does not linger in freed memory.
pub fn wipe(buf: &mut [u8]) {
    for b in buf.iter_mut() {
        // SAFETY: a volatile write through a valid &mut u8 (keeps the wipe from being elided).
        unsafe { std::ptr::write_volatile(b, 0) };
    }
    std::sync::atomic::compiler_fence(Ordering::SeqCst);
}

static PSK: Mutex<Option<Psk>> = Mutex::new(None);
static FROZEN: AtomicBool = AtomicBool::new(false);

/// Called by ncclGetUniqueId and communicator creation: the setting can no longer change.
pub fn freeze() {
    FROZEN.store(true, Ordering::Release);
}

/// Whether a key is configured (then nothing may go out unencrypted).
pub fn enabled() -> bool {
    PSK.lock().unwrap_or_else(|p| p.into_inner()).is_some()
}

/// Runs `f` with the configured key, if any.
pub fn with_psk<T>(f: impl FnOnce(Option<&[u8]>) -> T) -> T {
    let guard = PSK.lock().unwrap_or_else(|p| p.into_inner());
    f(guard.as_ref().map(|p| p.bytes()))
}

/// Applies a new setting: `None` is plaintext, `Some(key)` a PSK (already length-checked).
pub fn set(psk: Option<Vec<u8>>) -> Result<()> {
    let mut guard = PSK.lock().unwrap_or_else(|p| p.into_inner());
    let same = match (&*guard, &psk) {
        (None, None) => true,
        (Some(a), Some(b)) => a.bytes() == b.as_slice(),
        _ => false,
    };
    // The build check comes first: without TLS a key is refused whatever the state.
    if psk.is_some() && !cfg!(feature = "openssl3") {
        log::warn!(target: "INIT", "NCCL was built without TLS support but a pre-shared key was configured");
        return Err(Error::invalid_usage(
            "ncclSetEncryption: ferroccl was built without TLS support (rebuild with TLS_BACKEND=OPENSSL3)",
        ));
    }
    if FROZEN.load(Ordering::Acquire) && !same {
        return Err(Error::invalid_usage(
            "ncclSetEncryption: the encryption setting cannot change once a unique id or communicator exists",
        ));
    }
    *guard = psk.map(Psk);
    Ok(())
}

/// Whether the process is frozen (a unique id or communicator exists).
pub fn frozen() -> bool {
    FROZEN.load(Ordering::Acquire)
}

/// Refuses to open a plaintext stream while a key is configured, or under the strict policy
/// (the fail-closed guard every plaintext stream passes through; TLS streams never do).
pub fn require_plaintext_allowed(what: &str) -> Result<()> {
    if enabled() {
        return Err(Error::invalid_usage(format!(
            "{what}: a pre-shared key is configured but this connection cannot be encrypted; refusing to send plaintext"
        )));
    }
    if strict() {
        return Err(Error::invalid_usage(format!(
            "{what}: FERROCCL_ENCRYPTION_POLICY=strict but no pre-shared key is configured \
             (call ncclSetEncryption before ncclGetUniqueId); refusing to send plaintext"
        )));
    }
    Ok(())
}

/// FERROCCL_ENCRYPTION_POLICY.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Policy {
    /// Follow ncclSetEncryption: with a key, every TCP connection is TLS; shared memory and
    /// other non-socket transports may still be used between ranks.
    Default,
    /// All traffic between ranks goes over encrypted sockets: transport selection must not
    /// pick shared memory, IB or IPC, and plaintext sockets are refused even without a key.
    Strict,
}

impl std::fmt::Display for Policy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Policy::Default => "default",
            Policy::Strict => "strict",
        })
    }
}

/// Parses a policy value; anything unknown is strict (fail closed).
pub fn parse_policy(value: &str) -> (Policy, bool) {
    match value.trim().to_ascii_lowercase().as_str() {
        "" | "default" => (Policy::Default, true),
        "strict" => (Policy::Strict, true),
        _ => (Policy::Strict, false),
    }
}

/// The policy in force (read once).
pub fn policy() -> Policy {
    static POLICY: std::sync::OnceLock<Policy> = std::sync::OnceLock::new();
    *POLICY.get_or_init(|| {
        let value = crate::env::get_str_or_default("FERROCCL_ENCRYPTION_POLICY").unwrap_or_default();
        let (p, known) = parse_policy(&value);
        if !known {
            log::warn!(
                target: "INIT",
                "FERROCCL_ENCRYPTION_POLICY={value:?} is not 'default' or 'strict'; using strict"
            );
        }
        p
    })
}

/// Whether FERROCCL_ENCRYPTION_POLICY=strict: transport selection must keep every byte
/// between ranks on encrypted sockets (no shared memory, IB or IPC).
pub fn strict() -> bool {
    policy() == Policy::Strict
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn policy_values() {
        assert_eq!(parse_policy("default"), (Policy::Default, true));
        assert_eq!(parse_policy(""), (Policy::Default, true));
        assert_eq!(parse_policy(" Strict "), (Policy::Strict, true));
        assert_eq!(parse_policy("relaxed"), (Policy::Strict, false));
    }

    #[test]
    fn wipe_zeroes() {
        let mut k = vec![0xa5u8; 40];
        wipe(&mut k);
        assert!(k.iter().all(|&b| b == 0));
    }
}
