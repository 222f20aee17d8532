//! ferroccl's encryption coverage report (issue 4): which connections of a communicator are
//! protected and how, for compliance records.

use std::ffi::c_char;

use super::{boundary, non_null};
use crate::comm;
use crate::coverage::Coverage;
use crate::error::Error;
use crate::types::{ncclComm_t, ncclResult_t};

/// Writes a JSON object describing `comm`'s connections by transport and protection
/// (protocol, cipher, key exchange; counts of bootstrap and network connections; transports
/// outside the TLS boundary; plaintext connections; key updates) into `buf`, NUL-terminated.
/// The same facts as the `Encryption coverage:` INFO line. A `buf` shorter than the report
/// gives ncclInvalidArgument (the message names the size needed) and is left untouched.
#[unsafe(no_mangle)]
pub extern "C" fn ferrocclCommEncryptionReport(comm: ncclComm_t, buf: *mut c_char, len: usize) -> ncclResult_t {
    boundary("ferrocclCommEncryptionReport", || {
        let c = comm::lookup(comm, "ferrocclCommEncryptionReport")?;
        non_null(buf, "ferrocclCommEncryptionReport", "buf")?;
        let text = Coverage::of(&c)?.json();
        if text.len() + 1 > len {
            return Err(Error::invalid_argument(format!(
                "ferrocclCommEncryptionReport: buffer of {len} bytes is too small; the report needs {}",
                text.len() + 1
            )));
        }
        // SAFETY: buf is non-null and the caller provides len >= text.len() + 1 writable bytes.
        unsafe {
            std::ptr::copy_nonoverlapping(text.as_ptr(), buf.cast::<u8>(), text.len());
            buf.add(text.len()).write(0);
        }
        Ok(())
    })
}
