//! The CUDA driver: a probe made once per process, result checking, and contexts.
//!
//! The probe opens `libcuda` (cudarc's dynamic loading) and calls `cuInit`. Without a driver or
//! without a device the library stays in host-memory mode and says so once at INFO.
//! `FERROCCL_CUDA_DISABLE=1` forces host-memory mode.

use std::ffi::CStr;
use std::sync::{Mutex, OnceLock};

use cudarc::driver::sys;

use crate::error::{Error, Result};

/// What the probe found.
#[derive(Clone, Copy, Debug)]
struct Probe {
    devices: i32,
    driver_version: i32,
}

fn probe() -> Option<Probe> {
    static PROBE: OnceLock<Option<Probe>> = OnceLock::new();
    *PROBE.get_or_init(|| {
        let found = run_probe();
        match &found {
            Ok(p) => log::info!(
                target: "INIT",
                "CUDA: driver {}.{}, {} device(s); device buffers are supported",
                p.driver_version / 1000,
                (p.driver_version % 1000) / 10,
                p.devices
            ),
            Err(why) => log::info!(target: "INIT", "CUDA: {why}; host memory only"),
        }
        found.ok()
    })
}

fn run_probe() -> std::result::Result<Probe, String> {
    if crate::env::get_bool("FERROCCL_CUDA_DISABLE") {
        return Err("disabled by FERROCCL_CUDA_DISABLE".into());
    }
    // SAFETY: only tries to open the library; no CUDA call is made.
    if !unsafe { sys::is_culib_present() } {
        return Err("no driver (libcuda.so.1 not found)".into());
    }
    // SAFETY: the library is present (checked above); cuInit has no other precondition.
    let res = std::panic::catch_unwind(|| unsafe { sys::cuInit(0) })
        .map_err(|_| "the CUDA driver library could not be used".to_string())?;
    check(res, "cuInit").map_err(|e| e.to_string())?;
    let mut devices = 0;
    // SAFETY: cuInit succeeded; the out-pointer is a live local.
    check(unsafe { sys::cuDeviceGetCount(&mut devices) }, "cuDeviceGetCount").map_err(|e| e.to_string())?;
    if devices == 0 {
        return Err("no CUDA device".into());
    }
    let mut driver_version = 0;
    // SAFETY: as above.
    check(unsafe { sys::cuDriverGetVersion(&mut driver_version) }, "cuDriverGetVersion").map_err(|e| e.to_string())?;
    Ok(Probe { devices, driver_version })
}

/// The driver's CUDA version (1000 x major + 10 x minor; 0 without CUDA).
pub fn driver_version() -> i32 {
    probe().map_or(0, |p| p.driver_version)
}

/// The number of devices this process sees (0 without CUDA).
pub fn device_count() -> i32 {
    probe().map_or(0, |p| p.devices)
}

/// Whether CUDA can be used in this process (probed once).
pub fn available() -> bool {
    probe().is_some()
}

/// Turns a driver result into an error naming the call.
pub fn check(res: sys::CUresult, call: &'static str) -> Result<()> {
    if res == sys::CUresult::CUDA_SUCCESS {
        return Ok(());
    }
    Err(Error::Cuda { call, message: describe(res) })
}

/// The driver's name and text for a result code.
pub fn describe(res: sys::CUresult) -> String {
    let mut name: *const std::ffi::c_char = std::ptr::null();
    let mut text: *const std::ffi::c_char = std::ptr::null();
    // SAFETY: only called after a successful probe (a result exists only then); the driver
    // returns pointers to static strings or leaves them NULL.
    unsafe {
        sys::cuGetErrorName(res, &mut name);
        sys::cuGetErrorString(res, &mut text);
    }
    let s = |p: *const std::ffi::c_char| {
        // SAFETY: NULL or a static NUL-terminated string from the driver.
        (!p.is_null()).then(|| unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned())
    };
    match (s(name), s(text)) {
        (Some(n), Some(t)) => format!("{n} ({t})"),
        (Some(n), None) => n,
        _ => format!("CUDA error {}", res as i32),
    }
}

/// A CUDA context handle that may cross threads (contexts are process-wide objects). Made
/// only from the driver's answers (this module), so holding one proves that CUDA is loaded.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Context(sys::CUcontext);

impl Context {
    /// The context's identity, as a key for per-context caches.
    pub fn key(self) -> usize {
        self.0 as usize
    }

    /// The context stream `stream` belongs to (the current one for the legacy default
    /// stream's handles 0 and 1).
    pub fn of_stream(stream: super::stream::Stream) -> Result<Context> {
        let mut ctx: sys::CUcontext = std::ptr::null_mut();
        // SAFETY: the stream is the caller's (or a default stream's handle); out-pointer is live.
        check(unsafe { sys::cuStreamGetCtx(stream.0 as sys::CUstream, &mut ctx) }, "cuStreamGetCtx")?;
        Ok(Context(ctx))
    }
}

// SAFETY: a CUcontext is a process-wide handle; the driver allows using it from any thread.
unsafe impl Send for Context {}
// SAFETY: as above; the handle itself is never mutated.
unsafe impl Sync for Context {}

/// The calling thread's current context, if CUDA is available and the thread has one (a
/// program that uses the CUDA runtime has its device's primary context current).
pub fn current_context() -> Option<Context> {
    if !available() {
        return None;
    }
    let mut ctx: sys::CUcontext = std::ptr::null_mut();
    // SAFETY: probe succeeded; out-pointer is a live local.
    let res = unsafe { sys::cuCtxGetCurrent(&mut ctx) };
    (res == sys::CUresult::CUDA_SUCCESS && !ctx.is_null()).then_some(Context(ctx))
}

/// The device of the calling thread's current context.
pub fn current_device() -> Option<i32> {
    current_context()?;
    let mut dev: sys::CUdevice = 0;
    // SAFETY: a context is current (checked); out-pointer is a live local.
    let res = unsafe { sys::cuCtxGetDevice(&mut dev) };
    (res == sys::CUresult::CUDA_SUCCESS).then_some(dev)
}

/// The primary context of device `dev` (the one the CUDA runtime uses), if CUDA is available.
pub fn primary_context(dev: i32) -> Option<Context> {
    if !available() {
        return None;
    }
    // One reference per device for the process's life (as the runtime keeps its own), not one
    // per call.
    static RETAINED: Mutex<Vec<(i32, usize)>> = Mutex::new(Vec::new());
    let mut retained = RETAINED.lock().unwrap_or_else(|p| p.into_inner());
    if let Some(&(_, ctx)) = retained.iter().find(|(d, _)| *d == dev) {
        return Some(Context(ctx as sys::CUcontext));
    }
    let mut ctx: sys::CUcontext = std::ptr::null_mut();
    // SAFETY: the probe succeeded; out-pointer is a live local.
    let res = unsafe { sys::cuDevicePrimaryCtxRetain(&mut ctx, dev) };
    (res == sys::CUresult::CUDA_SUCCESS && !ctx.is_null()).then(|| {
        retained.push((dev, ctx as usize));
        Context(ctx)
    })
}

/// Whether device `dev` can map and use memory of device `peer` (the same device, or peer access
/// over NVLink or PCIe), as this process numbers devices. Asked once per pair.
pub fn can_access_peer(dev: i32, peer: i32) -> bool {
    if dev == peer {
        return true;
    }
    static ASKED: Mutex<Vec<((i32, i32), bool)>> = Mutex::new(Vec::new());
    let mut asked = ASKED.lock().unwrap_or_else(|p| p.into_inner());
    if let Some(&(_, can)) = asked.iter().find(|(pair, _)| *pair == (dev, peer)) {
        return can;
    }
    let mut can: std::ffi::c_int = 0;
    // SAFETY: out-pointer is a live local; the driver validates both ordinals (and fails before
    // cuInit, which `available` runs).
    let res = available() && unsafe { sys::cuDeviceCanAccessPeer(&mut can, dev, peer) } == sys::CUresult::CUDA_SUCCESS;
    let can = res && can == 1;
    asked.push(((dev, peer), can));
    can
}

/// Most devices a [`GpuIdentity`] lists as reachable.
pub const MAX_REACH: usize = 16;

/// A GPU as other processes can recognise it: its PCI location, and the PCI locations of the
/// devices it reaches by peer access (itself first). Device ordinals cannot serve: each process
/// numbers the devices it sees, and processes launched with different `CUDA_VISIBLE_DEVICES`
/// call different GPUs "device 0".
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct GpuIdentity {
    /// [`pci_location`] of the device; 0 for none (host memory only).
    pub bus: u64,
    /// Locations of the devices visible to this process that this one maps by peer access,
    /// itself first; at most [`MAX_REACH`].
    pub reach: Vec<u64>,
}

/// A device's PCI domain, bus and device numbers as one value (`1 << 48 | domain << 16 | bus <<
/// 8 | device`; the marker bit tells it from "none", and domains above 0xffff, as VMD uses,
/// stay apart), if the driver says them.
fn pci_location(dev: i32) -> Option<u64> {
    use sys::CUdevice_attribute::*;
    let attr = |a: sys::CUdevice_attribute| -> Option<u64> {
        let mut v: std::ffi::c_int = 0;
        // SAFETY: out-pointer is a live local; the driver validates the ordinal.
        let res = unsafe { sys::cuDeviceGetAttribute(&mut v, a, dev) };
        (res == sys::CUresult::CUDA_SUCCESS && v >= 0).then_some(v as u64)
    };
    let (domain, bus, device) = (
        attr(CU_DEVICE_ATTRIBUTE_PCI_DOMAIN_ID)?,
        attr(CU_DEVICE_ATTRIBUTE_PCI_BUS_ID)?,
        attr(CU_DEVICE_ATTRIBUTE_PCI_DEVICE_ID)?,
    );
    Some(1 << 48 | (domain & 0xffff_ffff) << 16 | (bus & 0xff) << 8 | (device & 0xff))
}

/// The identity of device `dev` (as this process numbers devices); the empty identity without
/// CUDA or for a negative ordinal.
pub fn identity(dev: i32) -> GpuIdentity {
    let Some(p) = probe() else { return GpuIdentity::default() };
    let Some(bus) = (dev >= 0 && dev < p.devices).then(|| pci_location(dev)).flatten() else {
        return GpuIdentity::default();
    };
    let mut reach = vec![bus];
    for other in (0..p.devices).filter(|&o| o != dev) {
        if reach.len() == MAX_REACH {
            break;
        }
        if let Some(b) = pci_location(other).filter(|_| can_access_peer(dev, other)) {
            reach.push(b);
        }
    }
    GpuIdentity { bus, reach }
}

/// Lets the current context map memory of device `peer` (`cuCtxEnablePeerAccess` on its primary
/// context), once per pair: ranks of one process on different devices use each other's
/// buffers directly.
pub fn enable_peer_access(peer: i32) -> Result<()> {
    let ctx = current_context().ok_or_else(|| Error::internal("no current CUDA context"))?;
    enable_peer_access_from(ctx, peer)
}

/// [`enable_peer_access`] for context `ctx` (a stream's), whatever the calling thread has
/// current, which is left as it was.
pub fn enable_peer_access_from(ctx: Context, peer: i32) -> Result<()> {
    let peer_ctx =
        primary_context(peer).ok_or_else(|| Error::internal(format!("no CUDA context for device {peer}")))?;
    static ENABLED: Mutex<Vec<(usize, usize)>> = Mutex::new(Vec::new());
    let key = (ctx.key(), peer_ctx.key());
    let mut enabled = ENABLED.lock().unwrap_or_else(|p| p.into_inner());
    if key.0 == key.1 || enabled.contains(&key) {
        return Ok(());
    }
    let pushed = current_context() != Some(ctx);
    if pushed {
        // SAFETY: ctx came from the driver (a live stream's or the current context); popped below.
        check(unsafe { sys::cuCtxPushCurrent_v2(ctx.0) }, "cuCtxPushCurrent")?;
    }
    // SAFETY: both contexts came from the driver and live for the process; ctx is current.
    let res = unsafe { sys::cuCtxEnablePeerAccess(peer_ctx.0, 0) };
    if pushed {
        let mut popped: sys::CUcontext = std::ptr::null_mut();
        // SAFETY: pops the context pushed above; out-pointer is a live local.
        check(unsafe { sys::cuCtxPopCurrent_v2(&mut popped) }, "cuCtxPopCurrent")?;
    }
    if res != sys::CUresult::CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED {
        check(res, "cuCtxEnablePeerAccess")?;
    }
    enabled.push(key);
    Ok(())
}

/// Makes `ctx` current on the calling thread (worker threads serving a rank's streams).
pub fn make_current(ctx: Context) -> Result<()> {
    // SAFETY: ctx came from the driver and contexts are never destroyed by ferroccl.
    check(unsafe { sys::cuCtxSetCurrent(ctx.0) }, "cuCtxSetCurrent")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn probe_never_panics_and_is_stable() {
        // On machines without a driver this must say no, quietly; with one, yes twice.
        let first = available();
        assert_eq!(first, available());
        if !first {
            println!("skipped the device part: no CUDA driver or device on this machine");
            assert!(current_context().is_none());
            assert!(current_device().is_none());
        }
    }
}
