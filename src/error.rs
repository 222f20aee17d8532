//! One error type for the whole library, and its mapping onto NCCL's `ncclResult_t`.

use std::ffi::c_int;
use std::io;

/// `ncclResult_t`: NCCL's status codes (the enum itself is declared in cbindgen.toml; `types`
/// re-exports it with the other C ABI types).
#[allow(non_camel_case_types)]
#[repr(transparent)]
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct ncclResult_t(pub c_int);

#[allow(non_upper_case_globals)]
impl ncclResult_t {
    pub const ncclSuccess: Self = Self(0);
    pub const ncclUnhandledCudaError: Self = Self(1);
    pub const ncclSystemError: Self = Self(2);
    pub const ncclInternalError: Self = Self(3);
    pub const ncclInvalidArgument: Self = Self(4);
    pub const ncclInvalidUsage: Self = Self(5);
    pub const ncclRemoteError: Self = Self(6);
    pub const ncclInProgress: Self = Self(7);
    pub const ncclTimeout: Self = Self(8);
    pub const ncclNumResults: Self = Self(9);
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Everything that can go wrong inside ferroccl. Each variant maps onto one NCCL code.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The caller passed a bad value; nothing was changed (`ncclInvalidArgument`).
    #[error("{0}")]
    InvalidArgument(String),
    /// The call is not allowed in this state or build (`ncclInvalidUsage`).
    #[error("{0}")]
    InvalidUsage(String),
    /// An operating-system call failed (`ncclSystemError`).
    #[error("{context}: {source}")]
    System {
        context: String,
        #[source]
        source: io::Error,
    },
    /// A peer went away, sent garbage, or the network failed (`ncclRemoteError`).
    #[error("{0}")]
    Remote(String),
    /// A bug in ferroccl (`ncclInternalError`).
    #[error("internal error: {0}")]
    Internal(String),
    /// An operation did not finish in time (`ncclTimeout`).
    #[error("timeout: {0}")]
    Timeout(String),
    /// A CUDA call failed (`ncclUnhandledCudaError`).
    #[error("CUDA error in {call}: {message}")]
    Cuda { call: &'static str, message: String },
}

impl Error {
    pub fn invalid_argument(msg: impl Into<String>) -> Self {
        Error::InvalidArgument(msg.into())
    }
    pub fn invalid_usage(msg: impl Into<String>) -> Self {
        Error::InvalidUsage(msg.into())
    }
    pub fn remote(msg: impl Into<String>) -> Self {
        Error::Remote(msg.into())
    }
    pub fn internal(msg: impl Into<String>) -> Self {
        Error::Internal(msg.into())
    }
    pub fn system(context: impl Into<String>, source: io::Error) -> Self {
        Error::System { context: context.into(), source }
    }
    /// An NCCL function that ferroccl does not implement yet.
    pub fn not_implemented(function: &str) -> Self {
        Error::InvalidUsage(format!("{function} is not implemented by ferroccl yet"))
    }

    /// The NCCL status code this error is reported as.
    pub fn code(&self) -> ncclResult_t {
        match self {
            Error::InvalidArgument(_) => ncclResult_t::ncclInvalidArgument,
            Error::InvalidUsage(_) => ncclResult_t::ncclInvalidUsage,
            Error::System { .. } => ncclResult_t::ncclSystemError,
            Error::Remote(_) => ncclResult_t::ncclRemoteError,
            Error::Internal(_) => ncclResult_t::ncclInternalError,
            Error::Timeout(_) => ncclResult_t::ncclTimeout,
            Error::Cuda { .. } => ncclResult_t::ncclUnhandledCudaError,
        }
    }

    /// Prefix the message with where it happened, keeping the code.
    pub fn context(self, what: &str) -> Self {
        match self {
            Error::InvalidArgument(m) => Error::InvalidArgument(format!("{what}: {m}")),
            Error::InvalidUsage(m) => Error::InvalidUsage(format!("{what}: {m}")),
            Error::System { context, source } => Error::System { context: format!("{what}: {context}"), source },
            Error::Remote(m) => Error::Remote(format!("{what}: {m}")),
            Error::Internal(m) => Error::Internal(format!("{what}: {m}")),
            Error::Timeout(m) => Error::Timeout(format!("{what}: {m}")),
            Error::Cuda { call, message } => Error::Cuda { call, message: format!("{what}: {message}") },
        }
    }

    /// A copy for reporting the same failure to several waiters (io::Error is not Clone).
    pub fn duplicate(&self) -> Self {
        match self {
            Error::System { context, source } => {
                Error::System { context: context.clone(), source: io::Error::new(source.kind(), source.to_string()) }
            }
            Error::InvalidArgument(m) => Error::InvalidArgument(m.clone()),
            Error::InvalidUsage(m) => Error::InvalidUsage(m.clone()),
            Error::Remote(m) => Error::Remote(m.clone()),
            Error::Internal(m) => Error::Internal(m.clone()),
            Error::Timeout(m) => Error::Timeout(m.clone()),
            Error::Cuda { call, message } => Error::Cuda { call, message: message.clone() },
        }
    }
}

/// NCCL's fixed strings for `ncclGetErrorString`.
pub fn error_string(code: ncclResult_t) -> &'static std::ffi::CStr {
    match code.0 {
        0 => c"no error",
        1 => c"unhandled cuda error (run with NCCL_DEBUG=INFO for details)",
        2 => c"unhandled system error (run with NCCL_DEBUG=INFO for details)",
        3 => c"internal error - please report this issue to the NCCL developers",
        4 => c"invalid argument (run with NCCL_DEBUG=WARN for details)",
        5 => c"invalid usage (run with NCCL_DEBUG=WARN for details)",
        6 => c"remote process exited or there was a network error",
        7 => c"NCCL operation in progress",
        8 => c"timeout",
        _ => c"unknown result code",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_and_strings() {
        assert_eq!(Error::invalid_argument("x").code(), ncclResult_t::ncclInvalidArgument);
        assert_eq!(Error::not_implemented("ncclCommShrink").code(), ncclResult_t::ncclInvalidUsage);
        assert!(Error::not_implemented("ncclCommShrink").to_string().contains("ncclCommShrink"));
        assert_eq!(
            error_string(ncclResult_t(6)).to_str().unwrap(),
            "remote process exited or there was a network error"
        );
        assert_eq!(error_string(ncclResult_t(42)).to_str().unwrap(), "unknown result code");
        let e = Error::system("connect", io::Error::from(io::ErrorKind::ConnectionRefused)).context("bootstrap");
        assert_eq!(e.duplicate().code(), ncclResult_t::ncclSystemError);
        assert!(e.to_string().starts_with("bootstrap: connect"));
    }
}
