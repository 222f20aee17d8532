//! CUDA IPC: other processes' device buffers, mapped into this one.
//!
//! A buffer is described by the IPC handle of its whole allocation plus its offset in it
//! ([`Export`]). Opening a handle costs tens of microseconds (85 us measured on an H200), so
//! opened allocations are cached per (process, handle) for the life of the process. Ranks that
//! are threads of one process use each other's pointers as they are: CUDA refuses to open a
//! handle in the process that owns it.

use std::collections::HashMap;
use std::sync::Mutex;

use cudarc::driver::sys;

use super::driver::check;
use crate::error::Result;

/// Bytes of an encoded [`Export`].
pub const EXPORT_BYTES: usize = 64 + 8 + 8;

/// A device buffer as another process can find it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Export {
    pub handle: [u8; 64],
    /// Offset of the buffer in its allocation.
    pub offset: u64,
    /// The buffer's address in its own process (used as is by ranks of that process).
    pub addr: u64,
}

impl Export {
    pub fn encode(&self, out: &mut [u8]) {
        out[..64].copy_from_slice(&self.handle);
        out[64..72].copy_from_slice(&self.offset.to_le_bytes());
        out[72..80].copy_from_slice(&self.addr.to_le_bytes());
    }

    /// Decodes from exactly [`EXPORT_BYTES`] bytes (`None` otherwise).
    pub fn decode(b: &[u8]) -> Option<Export> {
        if b.len() != EXPORT_BYTES {
            return None;
        }
        let mut handle = [0u8; 64];
        handle.copy_from_slice(&b[..64]);
        Some(Export {
            handle,
            offset: u64::from_le_bytes(b[64..72].try_into().ok()?),
            addr: u64::from_le_bytes(b[72..80].try_into().ok()?),
        })
    }
}

/// Describes a device buffer for other processes. `ptr` must be device memory.
pub fn export(ptr: *const u8) -> Result<Export> {
    let mut base: sys::CUdeviceptr = 0;
    let mut size = 0usize;
    // SAFETY: ptr is device memory (classified by the caller); out-pointers are live locals.
    let res = unsafe { sys::cuMemGetAddressRange_v2(&mut base, &mut size, ptr as sys::CUdeviceptr) };
    check(res, "cuMemGetAddressRange")?;
    let mut handle = sys::CUipcMemHandle { reserved: [0; 64] };
    // SAFETY: base is the start of a live device allocation; out-pointer is a live local.
    check(unsafe { sys::cuIpcGetMemHandle(&mut handle, base) }, "cuIpcGetMemHandle")?;
    let mut bytes = [0u8; 64];
    for (b, c) in bytes.iter_mut().zip(handle.reserved.iter()) {
        *b = *c as u8;
    }
    Ok(Export { handle: bytes, offset: ptr as u64 - base, addr: ptr as u64 })
}

/// Mapped allocations of other processes: base address by (pid, handle).
type OpenedMap = HashMap<(u32, [u8; 64]), u64>;
static OPENED: Mutex<Option<OpenedMap>> = Mutex::new(None);

/// The address of another process's buffer in this process (opening its allocation once).
pub fn open(pid: u32, e: &Export) -> Result<*mut u8> {
    let mut opened = OPENED.lock().unwrap_or_else(|p| p.into_inner());
    let map = opened.get_or_insert_with(HashMap::new);
    let base = match map.get(&(pid, e.handle)) {
        Some(&b) => b,
        None => {
            let mut handle = sys::CUipcMemHandle { reserved: [0; 64] };
            for (c, b) in handle.reserved.iter_mut().zip(e.handle.iter()) {
                *c = *b as std::ffi::c_char;
            }
            let mut base: sys::CUdeviceptr = 0;
            let flags = sys::CUipcMem_flags::CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS as u32;
            // SAFETY: the handle came from a peer's cuIpcGetMemHandle; the driver validates it.
            check(unsafe { sys::cuIpcOpenMemHandle_v2(&mut base, handle, flags) }, "cuIpcOpenMemHandle")?;
            log::info!(target: "P2P", "P2P/IPC: mapped a device allocation of pid {pid}");
            map.insert((pid, e.handle), base);
            base
        }
    };
    Ok((base + e.offset) as *mut u8)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn export_codec_round_trip_and_rejects_wrong_lengths() {
        let e = Export { handle: [7; 64], offset: 4096, addr: 0x7f00_0000_1000 };
        let mut b = [0u8; EXPORT_BYTES];
        e.encode(&mut b);
        assert_eq!(Export::decode(&b), Some(e));
        assert_eq!(Export::decode(&b[..EXPORT_BYTES - 1]), None);
        assert_eq!(Export::decode(&[0u8; EXPORT_BYTES + 1]), None);
    }
}
