//! ncclSetEncryption (NCCL 2.32).

use super::boundary;
use crate::encryption::{self, MIN_PSK_BYTES};
use crate::error::Error;
use crate::types::{
    ncclEncryptionConfig_t, ncclResult_t, NCCL_API_MAGIC, NCCL_ENCRYPTION_MODE_NONE, NCCL_ENCRYPTION_MODE_PSK,
};

/// Sets the process-wide encryption of ferroccl's TCP traffic. NULL or mode NONE means
/// plaintext; mode PSK needs a NUL-terminated key of at least 32 bytes. Must be called before
/// ncclGetUniqueId or any communicator.
#[unsafe(no_mangle)]
pub extern "C" fn ncclSetEncryption(config: *const ncclEncryptionConfig_t) -> ncclResult_t {
    boundary("ncclSetEncryption", || {
        if config.is_null() {
            return encryption::set(None);
        }
        // SAFETY: non-null; the caller initialised it with NCCL_ENCRYPTION_CONFIG_INITIALIZER.
        let cfg = unsafe { config.read() };
        if cfg.magic != NCCL_API_MAGIC {
            return Err(Error::invalid_argument(
                "ncclSetEncryption: config not initialised with NCCL_ENCRYPTION_CONFIG_INITIALIZER (bad magic)",
            ));
        }
        if cfg.size < std::mem::size_of::<ncclEncryptionConfig_t>() {
            return Err(Error::invalid_argument(format!("ncclSetEncryption: config size {} is too small", cfg.size)));
        }
        match cfg.mode {
            NCCL_ENCRYPTION_MODE_NONE => encryption::set(None),
            NCCL_ENCRYPTION_MODE_PSK => {
                // SAFETY: psk is NULL or a NUL-terminated string (API contract).
                let psk = unsafe { super::opt_cstr(cfg.psk) }
                    .ok_or_else(|| Error::invalid_argument("ncclSetEncryption: mode PSK with a NULL psk"))?;
                let bytes = psk.to_bytes();
                if bytes.len() < MIN_PSK_BYTES {
                    return Err(Error::invalid_argument(format!(
                        "ncclSetEncryption: the pre-shared key has {} bytes; at least {MIN_PSK_BYTES} are required",
                        bytes.len()
                    )));
                }
                encryption::set(Some(bytes.to_vec()))
            }
            other => Err(Error::invalid_argument(format!("ncclSetEncryption: unknown mode {other}"))),
        }
    })
}
