//! `ncclConfig_t` as NCCL reads it: by the caller's `size` and `version`, so programs built
//! against older or newer headers work, then UNDEF fields resolved from the environment.

use crate::error::{Error, Result};
use crate::types::{ncclConfig_t, NCCL_API_MAGIC, NCCL_CONFIG_UNDEF_INT};

/// The settings ferroccl acts on, resolved.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CommConfig {
    /// Blocking communicator (`ncclConfig_t.blocking`, overridden by NCCL_COMM_BLOCKING). A
    /// non-blocking one is created, split and shrunk on a background thread (the call returns
    /// ncclInProgress; `ncclCommGetAsyncError` tells when it is done); its host operations
    /// still complete before their calls return.
    pub blocking: bool,
    pub comm_name: Option<String>,
    pub net_name: Option<String>,
    pub split_share: bool,
}

impl Default for CommConfig {
    fn default() -> Self {
        CommConfig { blocking: true, comm_name: None, net_name: None, split_share: false }
    }
}

const fn version(major: u32, minor: u32, patch: u32) -> u32 {
    if major <= 2 && minor <= 8 {
        major * 1000 + minor * 100 + patch
    } else {
        major * 10000 + minor * 100 + patch
    }
}

/// Copies the caller's config the way NCCL does and resets fields its version predates.
///
/// # Safety
/// `ptr` must be NULL or point to at least `(*ptr).size` readable bytes (and at least the
/// leading `size` field).
pub unsafe fn read_config(ptr: *const ncclConfig_t) -> Result<ncclConfig_t> {
    let mut cfg = undef_config();
    if ptr.is_null() {
        return Ok(cfg);
    }
    // SAFETY: caller guarantees ptr points at a config whose first field is its size.
    let size = unsafe { std::ptr::read_unaligned(ptr as *const usize) };
    if size < 16 {
        return Err(Error::invalid_argument(format!(
            "config size {size} is too small (not initialised with NCCL_CONFIG_INITIALIZER?)"
        )));
    }
    let n = size.min(std::mem::size_of::<ncclConfig_t>());
    // SAFETY: the caller's struct has `size` bytes; we copy at most that many into ours.
    unsafe { std::ptr::copy_nonoverlapping(ptr as *const u8, &mut cfg as *mut ncclConfig_t as *mut u8, n) };
    if cfg.magic != NCCL_API_MAGIC {
        return Err(Error::invalid_argument(format!(
            "config magic {:#x} is not {NCCL_API_MAGIC:#x}: initialise it with NCCL_CONFIG_INITIALIZER",
            cfg.magic
        )));
    }
    let undef = undef_config();
    let v = cfg.version;
    if v < version(2, 14, 0) {
        cfg.blocking = undef.blocking;
    }
    if v < version(2, 17, 0) {
        cfg.cgaClusterSize = undef.cgaClusterSize;
        cfg.minCTAs = undef.minCTAs;
        cfg.maxCTAs = undef.maxCTAs;
        cfg.netName = undef.netName;
        cfg.splitShare = undef.splitShare;
    }
    if v < version(2, 19, 0) {
        cfg.commName = undef.commName;
    }
    if v < version(2, 25, 0) {
        cfg.trafficClass = undef.trafficClass;
    }
    if v < version(2, 27, 0) {
        cfg.collnetEnable = undef.collnetEnable;
        cfg.CTAPolicy = undef.CTAPolicy;
        cfg.shrinkShare = undef.shrinkShare;
        cfg.nvlsCTAs = undef.nvlsCTAs;
    }
    if v < version(2, 28, 0) {
        cfg.nChannelsPerNetPeer = undef.nChannelsPerNetPeer;
        cfg.nvlinkCentricSched = undef.nvlinkCentricSched;
    }
    if v < version(2, 29, 0) {
        cfg.graphUsageMode = undef.graphUsageMode;
        cfg.numRmaCtx = undef.numRmaCtx;
    }
    if v < version(2, 30, 0) {
        cfg.maxP2pPeers = undef.maxP2pPeers;
        cfg.graphStreamOrdering = undef.graphStreamOrdering;
    }
    Ok(cfg)
}

/// A config with every field UNDEF, as NCCL_CONFIG_INITIALIZER makes it.
pub fn undef_config() -> ncclConfig_t {
    let u = NCCL_CONFIG_UNDEF_INT;
    ncclConfig_t {
        size: std::mem::size_of::<ncclConfig_t>(),
        magic: NCCL_API_MAGIC,
        version: crate::version::NCCL_VERSION_CODE as u32,
        blocking: u,
        cgaClusterSize: u,
        minCTAs: u,
        maxCTAs: u,
        netName: std::ptr::null(),
        splitShare: u,
        trafficClass: u,
        commName: std::ptr::null(),
        collnetEnable: u,
        CTAPolicy: u,
        shrinkShare: u,
        nvlsCTAs: u,
        nChannelsPerNetPeer: u,
        nvlinkCentricSched: u,
        graphUsageMode: u,
        numRmaCtx: u,
        maxP2pPeers: u,
        graphStreamOrdering: u,
    }
}

/// Resolves UNDEF fields from the environment and checks values.
///
/// # Safety
/// String fields must be NULL or valid NUL-terminated strings.
pub unsafe fn resolve(cfg: &ncclConfig_t) -> Result<CommConfig> {
    // SAFETY: forwarded from the caller.
    unsafe { resolve_with(cfg, crate::env::comm_blocking()) }
}

/// The settings of a communicator created without a config (NCCL_CONFIG_INITIALIZER, then
/// the environment), as NCCL resolves them for ncclCommInitRank and ncclCommInitAll.
pub fn from_environment() -> CommConfig {
    // SAFETY: an UNDEF config has NULL string fields.
    unsafe { resolve(&undef_config()) }.unwrap_or_default()
}

/// [`resolve`] with NCCL_COMM_BLOCKING given: as in NCCL (`envConfigOverride`), a set value
/// overrides the config's `blocking` even when the config defines it.
///
/// # Safety
/// As [`resolve`].
unsafe fn resolve_with(cfg: &ncclConfig_t, env_blocking: Option<bool>) -> Result<CommConfig> {
    if cfg.blocking != NCCL_CONFIG_UNDEF_INT && cfg.blocking != 0 && cfg.blocking != 1 {
        return Err(Error::invalid_argument(format!("config.blocking must be 0 or 1, got {}", cfg.blocking)));
    }
    let blocking = env_blocking.unwrap_or(cfg.blocking != 0);
    let split_share = if cfg.splitShare == NCCL_CONFIG_UNDEF_INT { 0 } else { cfg.splitShare };
    let string = |p: *const std::ffi::c_char| {
        // SAFETY: caller guarantees NULL or valid NUL-terminated strings.
        (!p.is_null()).then(|| unsafe { std::ffi::CStr::from_ptr(p) }.to_string_lossy().into_owned())
    };
    Ok(CommConfig {
        blocking,
        comm_name: string(cfg.commName),
        net_name: string(cfg.netName),
        split_share: split_share != 0,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn honours_size_and_version() {
        let mut c = undef_config();
        c.blocking = 0;
        c.nvlinkCentricSched = 1;
        c.version = version(2, 27, 7);
        // SAFETY: c is a valid config.
        let got = unsafe { read_config(&c) }.unwrap();
        assert_eq!(got.blocking, 0);
        assert_eq!(got.nvlinkCentricSched, NCCL_CONFIG_UNDEF_INT, "2.28 field reset for a 2.27 caller");
        // A caller with a short (2.14-era, 24-byte) struct.
        let mut short = undef_config();
        short.size = 24;
        short.version = version(2, 14, 0);
        short.blocking = 0;
        short.minCTAs = 7; // beyond its size: must not be read
                           // SAFETY: we pass a full struct; only 24 bytes are read.
        let got = unsafe { read_config(&short) }.unwrap();
        assert_eq!(got.blocking, 0);
        assert_eq!(got.minCTAs, NCCL_CONFIG_UNDEF_INT);
    }

    #[test]
    fn rejects_bad_magic_and_values() {
        let mut c = undef_config();
        c.magic = 0;
        // SAFETY: valid struct.
        assert!(unsafe { read_config(&c) }.is_err());
        let mut c = undef_config();
        c.blocking = 5;
        // SAFETY: valid struct with NULL strings.
        assert!(unsafe { resolve(&c) }.is_err());
        // SAFETY: NULL is allowed.
        assert_eq!(unsafe { read_config(std::ptr::null()) }.unwrap().magic, NCCL_API_MAGIC);
    }

    #[test]
    fn blocking_from_config_and_environment() {
        let mut c = undef_config();
        let blocking = |c: &ncclConfig_t, env| {
            // SAFETY: a valid config with NULL strings.
            unsafe { resolve_with(c, env) }.unwrap().blocking
        };
        assert!(blocking(&c, None), "UNDEF and no environment: blocking");
        assert!(!blocking(&c, Some(false)), "UNDEF: NCCL_COMM_BLOCKING=0 decides");
        c.blocking = 0;
        assert!(!blocking(&c, None));
        assert!(blocking(&c, Some(true)), "a set NCCL_COMM_BLOCKING overrides the config, as in NCCL");
        c.blocking = 1;
        assert!(!blocking(&c, Some(false)));
        c.blocking = -1;
        // SAFETY: as above.
        assert!(unsafe { resolve_with(&c, Some(true)) }.is_err(), "a bad value is rejected whatever the environment");
    }
}
