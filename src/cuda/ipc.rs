//! CUDA IPC: other processes' device buffers, mapped into this one.
//!
//! A buffer is described by the handle of its whole allocation plus its offset in it
//! ([`Export`]): a legacy CUDA IPC handle, or for ncclMemAlloc's cuMem memory a POSIX
//! descriptor ([`super::vmm`]). Opening a handle costs tens of microseconds (85 us measured on an H200), so
//! opened allocations are cached per (process, handle) for the life of the process. Ranks that
//! are threads of one process use each other's pointers as they are: CUDA refuses to open a
//! handle in the process that owns it.

use std::collections::HashMap;
use std::sync::Mutex;

use cudarc::driver::sys;

use super::driver::check;
use crate::error::Result;

/// Bytes of an encoded [`Export`]: kind (8, padded), handle (64), offset, address, and for a
/// legacy handle the allocation's size.
pub const EXPORT_BYTES: usize = 8 + 64 + 8 + 8 + 8;

/// How another process opens the allocation holding a buffer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Handle {
    /// Legacy CUDA IPC (cudaMalloc / cuMemAlloc memory): the handle and the allocation's size.
    Legacy { handle: [u8; 64], size: u64 },
    /// An ncclMemAlloc (cuMem) allocation, exported as a POSIX descriptor ([`super::vmm`]).
    Vmm { fd: i32, serial: u64, size: u64 },
    /// A buffer of a rank in the same process, which needs no handle: its address is used as
    /// is ([`local`]). Any device memory qualifies, stream-ordered pool memory included.
    Local,
}

/// A device buffer as another process can find it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Export {
    pub handle: Handle,
    /// Offset of the buffer in its allocation.
    pub offset: u64,
    /// The buffer's address in its own process (used as is by ranks of that process).
    pub addr: u64,
}

const KIND_LEGACY: u8 = 1;
const KIND_VMM: u8 = 2;
const KIND_LOCAL: u8 = 3;

impl Export {
    pub fn encode(&self, out: &mut [u8]) {
        out[..EXPORT_BYTES].fill(0);
        match self.handle {
            Handle::Legacy { handle, size } => {
                out[0] = KIND_LEGACY;
                out[8..72].copy_from_slice(&handle);
                out[88..96].copy_from_slice(&size.to_le_bytes());
            }
            Handle::Vmm { fd, serial, size } => {
                out[0] = KIND_VMM;
                out[8..12].copy_from_slice(&fd.to_le_bytes());
                out[16..24].copy_from_slice(&serial.to_le_bytes());
                out[24..32].copy_from_slice(&size.to_le_bytes());
            }
            Handle::Local => out[0] = KIND_LOCAL,
        }
        out[72..80].copy_from_slice(&self.offset.to_le_bytes());
        out[80..88].copy_from_slice(&self.addr.to_le_bytes());
    }

    /// Decodes from exactly [`EXPORT_BYTES`] bytes (`None` otherwise, or for an unknown kind).
    pub fn decode(b: &[u8]) -> Option<Export> {
        if b.len() != EXPORT_BYTES {
            return None;
        }
        let u64_at = |i: usize| b[i..i + 8].try_into().ok().map(u64::from_le_bytes);
        let handle = match b[0] {
            KIND_LEGACY => {
                let mut handle = [0u8; 64];
                handle.copy_from_slice(&b[8..72]);
                Handle::Legacy { handle, size: u64_at(88)? }
            }
            KIND_VMM => Handle::Vmm {
                fd: i32::from_le_bytes(b[8..12].try_into().ok()?),
                serial: u64_at(16)?,
                size: u64_at(24)?,
            },
            KIND_LOCAL => Handle::Local,
            _ => return None,
        };
        Some(Export { handle, offset: u64_at(72)?, addr: u64_at(80)? })
    }
}

/// Describes a device buffer for ranks of this same process: its address, no handle (making
/// one costs a driver call, and fails for memory CUDA IPC cannot share).
pub fn local(ptr: *const u8) -> Export {
    Export { handle: Handle::Local, offset: 0, addr: ptr as u64 }
}

/// Describes a device buffer for other processes. `ptr` must be device memory.
pub fn export(ptr: *const u8) -> Result<Export> {
    if let Some(s) = super::vmm::shareable(ptr)? {
        return Ok(Export {
            handle: Handle::Vmm { fd: s.fd, serial: s.serial, size: s.size },
            offset: s.offset,
            addr: ptr as u64,
        });
    }
    let mut base: sys::CUdeviceptr = 0;
    let mut size = 0usize;
    // SAFETY: ptr is device memory (classified by the caller); out-pointers are live locals.
    let res = unsafe { sys::cuMemGetAddressRange_v2(&mut base, &mut size, ptr as sys::CUdeviceptr) };
    check(res, "cuMemGetAddressRange")?;
    let mut handle = sys::CUipcMemHandle { reserved: [0; 64] };
    // SAFETY: base is the start of a live device allocation; out-pointer is a live local.
    let res = unsafe { sys::cuIpcGetMemHandle(&mut handle, base) };
    check(res, "cuIpcGetMemHandle").map_err(|e| {
        e.context("this device memory cannot be shared with other processes (cuMem memory not made by ncclMemAlloc?)")
    })?;
    let mut bytes = [0u8; 64];
    for (b, c) in bytes.iter_mut().zip(handle.reserved.iter()) {
        *b = *c as u8;
    }
    Ok(Export {
        handle: Handle::Legacy { handle: bytes, size: size as u64 },
        offset: ptr as u64 - base,
        addr: ptr as u64,
    })
}

/// A legacy allocation of another process mapped here.
#[derive(Clone, Copy)]
struct Opened {
    /// Its address in this process.
    here: u64,
    /// Its address range in the owner's process.
    owner_start: u64,
    owner_end: u64,
}

/// Mapped allocations of other processes, by (pid, handle).
type OpenedMap = HashMap<(u32, [u8; 64]), Opened>;
static OPENED: Mutex<Option<OpenedMap>> = Mutex::new(None);

/// The address of another process's buffer in this process (opening its allocation once).
pub fn open(pid: u32, e: &Export) -> Result<*mut u8> {
    let (handle, size) = match e.handle {
        Handle::Legacy { handle, size } => (handle, size),
        Handle::Vmm { fd, serial, size } => {
            return super::vmm::import(pid, &super::vmm::Shareable { fd, serial, size, offset: e.offset })
        }
        Handle::Local => {
            return Err(crate::error::Error::remote(format!(
                "pid {pid} described a buffer by its address only, which another process cannot use"
            )))
        }
    };
    let owner_start = e.addr.wrapping_sub(e.offset);
    let owner_end = owner_start.saturating_add(size);
    let mut opened = OPENED.lock().unwrap_or_else(|p| p.into_inner());
    let map = opened.get_or_insert_with(HashMap::new);
    let base = match map.get(&(pid, handle)) {
        Some(o) => o.here,
        None => {
            // Two live allocations of one process never overlap: a mapping whose range in the
            // owner overlaps this new one's is of memory the owner has freed (and reused). The
            // driver refuses to open the new one while it stays (CUDA_ERROR_ALREADY_MAPPED), and
            // it pins the freed memory. No queued work still reads it: the owner's free waited
            // for its streams, which wait for every operation's readers (the flags of one_gpu).
            let stale: Vec<(u32, [u8; 64])> = map
                .iter()
                .filter(|(k, o)| k.0 == pid && o.owner_start < owner_end && owner_start < o.owner_end)
                .map(|(k, _)| *k)
                .collect();
            for k in stale {
                let o = map.remove(&k).expect("listed above");
                // SAFETY: `here` came from cuIpcOpenMemHandle and is closed once (removed above);
                // nothing uses it any more (see above).
                let res = unsafe { sys::cuIpcCloseMemHandle(o.here) };
                log::info!(target: "P2P", "P2P/IPC: closed a mapping of pid {pid} whose memory it freed ({res:?})");
            }
            let handle_bytes = handle;
            let mut handle = sys::CUipcMemHandle { reserved: [0; 64] };
            for (c, b) in handle.reserved.iter_mut().zip(handle_bytes.iter()) {
                *c = *b as std::ffi::c_char;
            }
            let mut base: sys::CUdeviceptr = 0;
            let flags = sys::CUipcMem_flags::CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS as u32;
            // SAFETY: the handle came from a peer's cuIpcGetMemHandle; the driver validates it.
            check(unsafe { sys::cuIpcOpenMemHandle_v2(&mut base, handle, flags) }, "cuIpcOpenMemHandle")?;
            log::info!(target: "P2P", "P2P/IPC: mapped a device allocation of pid {pid}");
            map.insert((pid, handle_bytes), Opened { here: base, owner_start, owner_end });
            base
        }
    };
    Ok((base + e.offset) as *mut u8)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn export_codec_round_trip_and_rejects_wrong_lengths_and_kinds() {
        for handle in [
            Handle::Legacy { handle: [7; 64], size: 3 << 20 },
            Handle::Vmm { fd: 42, serial: 9, size: 2 << 20 },
            Handle::Local,
        ] {
            let e = Export { handle, offset: 4096, addr: 0x7f00_0000_1000 };
            let mut b = [0u8; EXPORT_BYTES];
            e.encode(&mut b);
            assert_eq!(Export::decode(&b), Some(e));
            assert_eq!(Export::decode(&b[..EXPORT_BYTES - 1]), None);
            let mut longer = b.to_vec();
            longer.push(0);
            assert_eq!(Export::decode(&longer), None);
            let mut unknown = b;
            unknown[0] = 0;
            assert_eq!(Export::decode(&unknown), None);
        }
        let mine = local(0x7f00_0000_2000 as *const u8);
        assert_eq!((mine.handle, mine.addr), (Handle::Local, 0x7f00_0000_2000));
        let e = open(1, &mine).unwrap_err();
        assert!(e.to_string().contains("address only"), "{e}");
    }
}
