//! The process-wide encryption setting made by ncclSetEncryption.
//!
//! It must be set before the first unique id or communicator; after that it is frozen, so no
//! connection of this process can ever see a different setting. Fail-closed rule: whenever a
//! key is configured, every TCP stream must be encrypted; a build or code path that cannot
//! encrypt refuses to connect instead of sending plaintext.

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
    if FROZEN.load(Ordering::Acquire) && !same {
        return Err(Error::invalid_usage(
            "ncclSetEncryption: the encryption setting cannot change once a unique id or communicator exists",
        ));
    }
    if psk.is_some() && !cfg!(feature = "openssl3") {
        log::warn!(target: "INIT", "NCCL was built without TLS support but a pre-shared key was configured");
        return Err(Error::invalid_usage(
            "ncclSetEncryption: ferroccl was built without TLS support (rebuild with TLS_BACKEND=OPENSSL3)",
        ));
    }
    *guard = psk.map(Psk);
    Ok(())
}

/// Refuses to open a plaintext stream while a key is configured (the fail-closed guard every
/// connection passes through until TLS streams are in place).
pub fn require_plaintext_allowed(what: &str) -> Result<()> {
    if enabled() {
        return Err(Error::invalid_usage(format!(
            "{what}: a pre-shared key is configured but this build cannot encrypt this connection; refusing to send plaintext"
        )));
    }
    Ok(())
}
