//! The verbs edge: every libibverbs call of the IB transport (cargo feature `ib`), through
//! `ibverbs-sys`. Nothing above this module touches a verbs object.
//!
//! Owns: the device probe ([`probe`]), one opened HCA port ([`VerbsFabric`]: device context,
//! protection domain, GID, the registration cache), queue pairs with their completion queue
//! and CTS FIFO ([`VerbsQp`], the [`Rdma`] the flow state machines drive), and memory
//! registration ([`VerbsRegistrar`]: `ibv_reg_mr` for host memory, `ibv_reg_dmabuf_mr` for
//! CUDA device memory exported as a dma-buf).
//!
//! NOT RUN ON HARDWARE: the development and CI machines have no HCA and no kernel RDMA
//! support, where `ibv_get_device_list` fails (ENOSYS) and [`probe`] reports that as "no
//! device". Everything here compiles against rdma-core 55 headers and follows the verbs man
//! pages, but no queue pair of this module has ever carried a byte.
//!
//! `ibv_post_send`, `ibv_post_recv` and `ibv_poll_cq` are static inline functions in
//! `verbs.h`: they are called through the context's ops table, as the header does.

use std::ffi::CStr;
use std::io;
use std::ptr;
use std::sync::{Arc, Mutex};

use ibverbs_sys as sys;

use super::flow::{Completion, Rdma, RemoteSeg, WriteSource, FIFO_SLOTS};
use super::hca::{choose_gid_index, speed_mbps, DeviceInfo, IbSettings, PortChoice, PortInfo};
use super::mr::{Access, Keys, MemKind, RegCache, RegRef, Registrar};
use super::{Fabric, SQ_DEPTH};
use crate::error::{Error, Result};
use crate::transport::MemRegion;
use crate::wire::{IbConnInfo, IbRole, LinkLayer, CTS_BYTES};

fn page_size() -> usize {
    // SAFETY: sysconf has no preconditions.
    let n = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    usize::try_from(n).ok().filter(|n| n.is_power_of_two()).unwrap_or(4096)
}

fn os_error(call: &str, code: i32) -> Error {
    Error::system(call, io::Error::from_raw_os_error(code))
}

fn last_os_error(call: &str) -> Error {
    Error::system(call, io::Error::last_os_error())
}

/// The device list, freed on drop.
struct DeviceList {
    list: *mut *mut sys::ibv_device,
    len: usize,
}

impl DeviceList {
    fn get() -> std::result::Result<DeviceList, io::Error> {
        let mut n: i32 = 0;
        // SAFETY: `n` is a live out-parameter; the call has no other preconditions.
        let list = unsafe { sys::ibv_get_device_list(&mut n) };
        if list.is_null() {
            return Err(io::Error::last_os_error());
        }
        Ok(DeviceList { list, len: n.max(0) as usize })
    }

    fn device(&self, i: usize) -> *mut sys::ibv_device {
        assert!(i < self.len);
        // SAFETY: the list holds `len` valid entries (then a NULL), alive until freed on drop.
        unsafe { *self.list.add(i) }
    }

    fn name(&self, i: usize) -> String {
        // SAFETY: a device of the live list; the name is a NUL-terminated string it owns.
        let name = unsafe { sys::ibv_get_device_name(self.device(i)) };
        if name.is_null() {
            return format!("ibdev{i}");
        }
        // SAFETY: non-NULL, NUL-terminated, valid while the list lives (copied at once).
        unsafe { CStr::from_ptr(name) }.to_string_lossy().into_owned()
    }
}

impl Drop for DeviceList {
    fn drop(&mut self) {
        // SAFETY: the list came from ibv_get_device_list and is freed once.
        unsafe { sys::ibv_free_device_list(self.list) };
    }
}

/// An opened device and its protection domain, closed on drop. Shared by a fabric's queue
/// pairs and registrations.
struct Context {
    ctx: *mut sys::ibv_context,
    pd: *mut sys::ibv_pd,
}

// SAFETY: libibverbs objects may be used from any thread and its calls are thread-safe
// (verbs(7)); the pointers stay valid until drop, which runs once, after every user (an Arc).
unsafe impl Send for Context {}
// SAFETY: as above: concurrent verbs calls on one context / PD are allowed.
unsafe impl Sync for Context {}

impl Context {
    fn open(list: &DeviceList, i: usize) -> Result<Context> {
        // SAFETY: a device of the live list.
        let ctx = unsafe { sys::ibv_open_device(list.device(i)) };
        if ctx.is_null() {
            return Err(last_os_error("ibv_open_device"));
        }
        // SAFETY: ctx is an open context.
        let pd = unsafe { sys::ibv_alloc_pd(ctx) };
        if pd.is_null() {
            let e = last_os_error("ibv_alloc_pd");
            // SAFETY: opened above, closed once.
            unsafe { sys::ibv_close_device(ctx) };
            return Err(e);
        }
        Ok(Context { ctx, pd })
    }

    fn port_count(&self) -> Result<u8> {
        let mut attr = sys::ibv_device_attr::default();
        // SAFETY: open context; `attr` is a live, writable ibv_device_attr.
        let rc = unsafe { sys::ibv_query_device(self.ctx, &mut attr) };
        if rc != 0 {
            return Err(os_error("ibv_query_device", rc));
        }
        Ok(attr.phys_port_cnt)
    }

    fn port(&self, port: u8) -> Result<sys::ibv_port_attr> {
        let mut attr = sys::ibv_port_attr::default();
        // SAFETY: open context; the library's ibv_query_port writes a whole ibv_port_attr
        // (its declared compat struct is a prefix of it), and `attr` is one.
        let rc = unsafe {
            sys::ibv_query_port(self.ctx, port, &mut attr as *mut sys::ibv_port_attr as *mut sys::_compat_ibv_port_attr)
        };
        if rc != 0 {
            return Err(os_error("ibv_query_port", rc));
        }
        Ok(attr)
    }

    /// GID table entry `index`: the GID and whether it is RoCE v2 (`None` when empty).
    fn gid(&self, port: u8, index: u32) -> Option<([u8; 16], bool)> {
        let mut entry = sys::ibv_gid_entry::default();
        // SAFETY: open context; `entry` is a live ibv_gid_entry of the size passed.
        let rc = unsafe {
            sys::_ibv_query_gid_ex(
                self.ctx,
                port as u32,
                index,
                &mut entry,
                0,
                std::mem::size_of::<sys::ibv_gid_entry>(),
            )
        };
        if rc != 0 {
            return None;
        }
        // SAFETY: `raw` is the union's plain-bytes view, valid for any contents.
        let raw = unsafe { entry.gid.raw };
        Some((raw, entry.gid_type == sys::IBV_GID_TYPE_ROCE_V2))
    }
}

impl Drop for Context {
    fn drop(&mut self) {
        // SAFETY: allocated and opened in `open`; every queue pair and registration holds an
        // Arc to this context, so none is left when it drops.
        unsafe {
            sys::ibv_dealloc_pd(self.pd);
            sys::ibv_close_device(self.ctx);
        }
    }
}

fn link_layer(code: u8) -> Option<LinkLayer> {
    match code as u32 {
        sys::IBV_LINK_LAYER_INFINIBAND => Some(LinkLayer::InfiniBand),
        sys::IBV_LINK_LAYER_ETHERNET => Some(LinkLayer::Ethernet),
        // Unspecified: InfiniBand, as verbs.h says for old kernels.
        0 => Some(LinkLayer::InfiniBand),
        _ => None,
    }
}

/// PCI address and NUMA node of an HCA, from sysfs.
fn placement(name: &str) -> (Option<String>, Option<i32>) {
    let dev = std::path::Path::new("/sys/class/infiniband").join(name).join("device");
    let pci = std::fs::canonicalize(&dev).ok().and_then(|p| p.file_name().map(|f| f.to_string_lossy().into_owned()));
    let numa = std::fs::read_to_string(dev.join("numa_node"))
        .ok()
        .and_then(|s| s.trim().parse::<i32>().ok())
        .filter(|&n| n >= 0);
    (pci, numa)
}

/// Makes registered memory safe across fork() (ibv_fork_init, which must come before any
/// other verbs call, as NCCL does it). Once per process; a failure is only logged (TRACE):
/// on kernels without RDMA support nothing is ever registered anyway.
fn fork_init_once() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        // SAFETY: no preconditions; called before any other verbs function of this process.
        let rc = unsafe { sys::ibv_fork_init() };
        if rc != 0 {
            log::trace!(target: "NET", "NET/IB : ibv_fork_init: {}", io::Error::from_raw_os_error(rc.abs()));
        }
    });
}

/// Every HCA with its ports. An error means the verbs library could not list devices at all
/// (no kernel RDMA support: ENOSYS), which callers treat as "no device".
pub fn probe() -> std::result::Result<Vec<DeviceInfo>, String> {
    fork_init_once();
    let list = DeviceList::get().map_err(|e| format!("ibv_get_device_list: {e}"))?;
    let mut devices = Vec::new();
    for i in 0..list.len {
        let name = list.name(i);
        let (pci, numa) = placement(&name);
        let ports = match Context::open(&list, i) {
            Ok(ctx) => {
                let n = ctx.port_count().unwrap_or(0);
                (1..=n)
                    .filter_map(|p| ctx.port(p).ok().map(|a| (p, a)))
                    .map(|(p, a)| PortInfo {
                        port: p,
                        state: a.state as u8,
                        link_layer: link_layer(a.link_layer),
                        lid: a.lid,
                        active_mtu: a.active_mtu as u8,
                        speed_mbps: speed_mbps(a.active_speed as u32, a.active_width),
                    })
                    .collect()
            }
            Err(e) => {
                log::trace!(target: "NET", "NET/IB : {name}: {e}");
                Vec::new()
            }
        };
        devices.push(DeviceInfo { name, ports, pci, numa });
    }
    Ok(devices)
}

/// A registration: an `ibv_mr`.
pub struct Mr(*mut sys::ibv_mr);

// SAFETY: an MR handle may be deregistered from any thread.
unsafe impl Send for Mr {}

/// Registers memory in one protection domain.
pub struct VerbsRegistrar {
    ctx: Arc<Context>,
}

fn access_flags(access: Access) -> i32 {
    match access {
        // The source of our RDMA writes: local reads only (also works for read-only pages).
        Access::Local => 0,
        Access::RemoteWrite => {
            (sys::ibv_access_flags::IBV_ACCESS_LOCAL_WRITE | sys::ibv_access_flags::IBV_ACCESS_REMOTE_WRITE).0 as i32
        }
    }
}

impl Registrar for VerbsRegistrar {
    type Mr = Mr;

    fn register(&mut self, kind: MemKind, addr: u64, len: usize, access: Access) -> Result<(Mr, Keys)> {
        let flags = access_flags(access);
        let mr = match kind {
            // SAFETY: the PD is live; the range is the caller's memory (the cache rounds it to
            // whole pages of that mapping); the kernel pins it or fails.
            MemKind::Host => unsafe { sys::ibv_reg_mr(self.ctx.pd, addr as *mut libc::c_void, len, flags) },
            MemKind::Device => {
                let fd = crate::cuda::memory::dmabuf_fd(addr, len)?;
                // SAFETY: live PD; `fd` is a dma-buf of exactly this device range (offset 0,
                // mapped at iova `addr`), kept open across the call; the MR holds its own
                // reference afterwards.
                unsafe {
                    sys::ibv_reg_dmabuf_mr(self.ctx.pd, 0, len, addr, std::os::fd::AsRawFd::as_raw_fd(&fd), flags)
                }
            }
        };
        if mr.is_null() {
            let what = if kind == MemKind::Host { "ibv_reg_mr" } else { "ibv_reg_dmabuf_mr" };
            return Err(last_os_error(&format!("{what} of {len} bytes at {addr:#x}")));
        }
        // SAFETY: a valid MR just returned.
        let keys = unsafe { Keys { lkey: (*mr).lkey, rkey: (*mr).rkey } };
        Ok((Mr(mr), keys))
    }

    fn deregister(&mut self, mr: Mr) {
        // SAFETY: registered by `register`, deregistered once (the cache hands it back once).
        unsafe { sys::ibv_dereg_mr(mr.0) };
    }
}

/// One opened HCA port: what [`super::IbNet`] runs on over hardware.
pub struct VerbsFabric {
    ctx: Arc<Context>,
    port: u8,
    link_layer: LinkLayer,
    lid: u16,
    mtu: u8,
    gid_index: u8,
    gid: [u8; 16],
    settings: IbSettings,
    cache: Mutex<RegCache<VerbsRegistrar>>,
    label: String,
}

impl VerbsFabric {
    /// Opens the chosen port.
    pub fn open(choice: &PortChoice, settings: IbSettings) -> Result<VerbsFabric> {
        fork_init_once();
        let list = DeviceList::get().map_err(|e| Error::system("ibv_get_device_list", e))?;
        let i = (0..list.len)
            .find(|&i| list.name(i) == choice.device)
            .ok_or_else(|| Error::internal(format!("NET/IB : device {} disappeared", choice.device)))?;
        let ctx = Arc::new(Context::open(&list, i)?);
        let attr = ctx.port(choice.port)?;
        let link_layer = link_layer(attr.link_layer).unwrap_or(choice.link_layer);
        let gid_index = match (link_layer, settings.gid_index) {
            (_, Some(g)) => g,
            (LinkLayer::InfiniBand, None) => 0,
            (LinkLayer::Ethernet, None) => {
                let n = attr.gid_tbl_len.clamp(0, 256) as u32;
                let table: Vec<(u8, [u8; 16], bool)> =
                    (0..n).filter_map(|i| ctx.gid(choice.port, i).map(|(g, v2)| (i as u8, g, v2))).collect();
                choose_gid_index(&table)
            }
        };
        let gid = ctx.gid(choice.port, gid_index as u32).map(|(g, _)| g).unwrap_or([0; 16]);
        let page = page_size() as u64;
        let cache = Mutex::new(RegCache::new(VerbsRegistrar { ctx: ctx.clone() }, page));
        Ok(VerbsFabric {
            label: choice.label(),
            ctx,
            port: choice.port,
            link_layer,
            lid: attr.lid,
            mtu: attr.active_mtu as u8,
            gid_index,
            gid,
            settings,
            cache,
        })
    }

    pub fn gid_index(&self) -> u8 {
        self.gid_index
    }
}

/// The CTS FIFO a sender's peer writes into: page-aligned memory registered for remote writes.
struct Fifo {
    mem: *mut u8,
    len: usize,
    mr: *mut sys::ibv_mr,
}

impl Fifo {
    fn new(ctx: &Context) -> Result<Fifo> {
        let len = (FIFO_SLOTS * CTS_BYTES).next_multiple_of(page_size());
        // SAFETY: an anonymous private mapping; no address hint.
        let mem = unsafe {
            libc::mmap(
                ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        if mem == libc::MAP_FAILED {
            return Err(last_os_error("mmap CTS FIFO"));
        }
        // SAFETY: live PD; `mem..mem+len` was just mapped (zeroed: every slot empty).
        let mr = unsafe { sys::ibv_reg_mr(ctx.pd, mem, len, access_flags(Access::RemoteWrite)) };
        if mr.is_null() {
            let e = last_os_error("ibv_reg_mr CTS FIFO");
            // SAFETY: mapped above, unmapped once.
            unsafe { libc::munmap(mem, len) };
            return Err(e);
        }
        Ok(Fifo { mem: mem.cast(), len, mr })
    }
}

impl Drop for Fifo {
    fn drop(&mut self) {
        // SAFETY: registered and mapped in `new`; the queue pair that exposed it to the peer
        // is destroyed first (VerbsQp's drop), so the HCA no longer writes here.
        unsafe {
            sys::ibv_dereg_mr(self.mr);
            libc::munmap(self.mem.cast(), self.len);
        }
    }
}

/// One reliable-connected queue pair with its completion queue (and a sender's FIFO).
pub struct VerbsQp {
    cq: *mut sys::ibv_cq,
    qp: *mut sys::ibv_qp,
    fifo: Option<Fifo>,
    psn: u32,
    port: u8,
    mtu: u8,
    link_layer: LinkLayer,
    gid_index: u8,
    settings: IbSettings,
    wcs: Vec<sys::ibv_wc>,
    /// Keeps the device open while this queue pair lives; last, so that it drops after the
    /// FIFO (fields drop in declaration order).
    _ctx: Arc<Context>,
}

// SAFETY: the queue pair, CQ and FIFO are used by one thread at a time (`&mut self` for every
// call that touches them); verbs objects may move between threads.
unsafe impl Send for VerbsQp {}

impl Drop for VerbsQp {
    fn drop(&mut self) {
        // SAFETY: created in `create`, destroyed once, the QP before its CQ (and before the
        // FIFO, dropped after this body).
        unsafe {
            sys::ibv_destroy_qp(self.qp);
            sys::ibv_destroy_cq(self.cq);
        }
    }
}

fn modify(qp: *mut sys::ibv_qp, attr: &mut sys::ibv_qp_attr, mask: sys::ibv_qp_attr_mask, what: &str) -> Result<()> {
    // SAFETY: a live QP; `attr` is a complete ibv_qp_attr whose fields named in `mask` are set.
    let rc = unsafe { sys::ibv_modify_qp(qp, attr, mask.0 as i32) };
    if rc != 0 {
        return Err(os_error(&format!("ibv_modify_qp to {what}"), rc));
    }
    Ok(())
}

/// A 24-bit starting packet sequence number, different per queue pair.
fn initial_psn() -> u32 {
    use std::sync::atomic::{AtomicU32, Ordering};
    static NEXT: AtomicU32 = AtomicU32::new(0);
    let t = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.subsec_nanos()).unwrap_or(0);
    (t ^ std::process::id().rotate_left(8) ^ NEXT.fetch_add(0x9e37, Ordering::Relaxed)) & 0x00ff_ffff
}

impl Fabric for VerbsFabric {
    type Qp = VerbsQp;

    fn create(&self, role: IbRole) -> Result<(VerbsQp, IbConnInfo)> {
        let cqe = (SQ_DEPTH + FIFO_SLOTS) as i32;
        // SAFETY: open context; no completion channel, no context pointer, vector 0.
        let cq = unsafe { sys::ibv_create_cq(self.ctx.ctx, cqe, ptr::null_mut(), ptr::null_mut(), 0) };
        if cq.is_null() {
            return Err(last_os_error("ibv_create_cq"));
        }
        let mut init = sys::ibv_qp_init_attr {
            send_cq: cq,
            recv_cq: cq,
            cap: sys::ibv_qp_cap {
                max_send_wr: SQ_DEPTH as u32,
                max_recv_wr: FIFO_SLOTS as u32,
                max_send_sge: 1,
                max_recv_sge: 1,
                max_inline_data: CTS_BYTES as u32,
            },
            qp_type: sys::ibv_qp_type::IBV_QPT_RC,
            sq_sig_all: 0,
            ..Default::default()
        };
        // SAFETY: live PD; `init` is complete and names the CQ just made.
        let qp = unsafe { sys::ibv_create_qp(self.ctx.pd, &mut init) };
        if qp.is_null() {
            let e = last_os_error("ibv_create_qp");
            // SAFETY: made above, destroyed once.
            unsafe { sys::ibv_destroy_cq(cq) };
            return Err(e);
        }
        let mut out = VerbsQp {
            _ctx: self.ctx.clone(),
            cq,
            qp,
            fifo: None,
            psn: initial_psn(),
            port: self.port,
            mtu: self.mtu,
            link_layer: self.link_layer,
            gid_index: self.gid_index,
            settings: self.settings,
            wcs: vec![sys::ibv_wc::default(); 16],
        };
        let mut attr = sys::ibv_qp_attr {
            qp_state: sys::ibv_qp_state::IBV_QPS_INIT,
            pkey_index: 0,
            port_num: self.port,
            qp_access_flags: access_flags(Access::RemoteWrite) as u32,
            ..Default::default()
        };
        use sys::ibv_qp_attr_mask as M;
        modify(
            qp,
            &mut attr,
            M::IBV_QP_STATE | M::IBV_QP_PKEY_INDEX | M::IBV_QP_PORT | M::IBV_QP_ACCESS_FLAGS,
            "INIT",
        )?;
        let (fifo_addr, fifo_rkey) = if role == IbRole::Sender {
            let fifo = Fifo::new(&self.ctx)?;
            // SAFETY: a valid MR just made.
            let rkey = unsafe { (*fifo.mr).rkey };
            let addr = fifo.mem as u64;
            out.fifo = Some(fifo);
            (addr, rkey)
        } else {
            (0, 0)
        };
        // SAFETY: a live QP.
        let qpn = unsafe { (*qp).qp_num };
        let info = IbConnInfo {
            role,
            link_layer: self.link_layer,
            port: self.port,
            mtu: self.mtu.clamp(1, 5),
            qpn,
            psn: out.psn,
            lid: self.lid,
            gid: self.gid,
            fifo_addr,
            fifo_rkey,
            fifo_slots: FIFO_SLOTS as u32,
        };
        Ok((out, info))
    }

    fn connect(&self, qp: &mut VerbsQp, remote: &IbConnInfo) -> Result<()> {
        if remote.link_layer != qp.link_layer {
            return Err(Error::invalid_usage(format!(
                "NET/IB : peer port is {} but this one is {}",
                remote.link_layer.name(),
                qp.link_layer.name()
            )));
        }
        let mut ah = sys::ibv_ah_attr { port_num: qp.port, sl: 0, ..Default::default() };
        if qp.link_layer == LinkLayer::Ethernet {
            ah.is_global = 1;
            ah.grh.dgid.raw = remote.gid;
            ah.grh.sgid_index = qp.gid_index;
            ah.grh.hop_limit = 255;
        } else {
            ah.dlid = remote.lid;
        }
        let mut attr = sys::ibv_qp_attr {
            qp_state: sys::ibv_qp_state::IBV_QPS_RTR,
            path_mtu: qp.mtu.min(remote.mtu).clamp(1, 5) as sys::ibv_mtu,
            dest_qp_num: remote.qpn,
            rq_psn: remote.psn,
            max_dest_rd_atomic: 1,
            min_rnr_timer: 12,
            ah_attr: ah,
            ..Default::default()
        };
        use sys::ibv_qp_attr_mask as M;
        let rtr = M::IBV_QP_STATE
            | M::IBV_QP_AV
            | M::IBV_QP_PATH_MTU
            | M::IBV_QP_DEST_QPN
            | M::IBV_QP_RQ_PSN
            | M::IBV_QP_MAX_DEST_RD_ATOMIC
            | M::IBV_QP_MIN_RNR_TIMER;
        modify(qp.qp, &mut attr, rtr, "RTR")?;
        let mut attr = sys::ibv_qp_attr {
            qp_state: sys::ibv_qp_state::IBV_QPS_RTS,
            timeout: qp.settings.timeout,
            retry_cnt: qp.settings.retry_cnt,
            rnr_retry: 7,
            sq_psn: qp.psn,
            max_rd_atomic: 1,
            ..Default::default()
        };
        let rts = M::IBV_QP_STATE
            | M::IBV_QP_TIMEOUT
            | M::IBV_QP_RETRY_CNT
            | M::IBV_QP_RNR_RETRY
            | M::IBV_QP_SQ_PSN
            | M::IBV_QP_MAX_QP_RD_ATOMIC;
        modify(qp.qp, &mut attr, rts, "RTS")
    }

    fn acquire(&self, region: MemRegion, access: Access) -> Result<RegRef> {
        let kind =
            if crate::cuda::memory::classify(region.ptr()).is_device() { MemKind::Device } else { MemKind::Host };
        self.cache.lock().unwrap_or_else(|p| p.into_inner()).acquire(kind, region.ptr() as u64, region.len(), access)
    }

    fn release(&self, r: RegRef) {
        self.cache.lock().unwrap_or_else(|p| p.into_inner()).release(r)
    }

    fn label(&self) -> String {
        self.label.clone()
    }
}

impl Rdma for VerbsQp {
    fn post_write(&mut self, wr_id: u64, src: WriteSource<'_>, dst: RemoteSeg, imm: Option<u32>) -> Result<()> {
        let (mut sge, mut flags) = match src {
            WriteSource::Inline(b) => (
                sys::ibv_sge { addr: b.as_ptr() as u64, length: b.len() as u32, lkey: 0 },
                sys::ibv_send_flags::IBV_SEND_SIGNALED | sys::ibv_send_flags::IBV_SEND_INLINE,
            ),
            WriteSource::Registered { addr, len, lkey } => {
                (sys::ibv_sge { addr, length: len as u32, lkey }, sys::ibv_send_flags::IBV_SEND_SIGNALED)
            }
        };
        if sge.length == 0 {
            flags = sys::ibv_send_flags::IBV_SEND_SIGNALED;
        }
        let mut wr = sys::ibv_send_wr {
            wr_id,
            next: ptr::null_mut(),
            sg_list: &mut sge,
            num_sge: if sge.length == 0 { 0 } else { 1 },
            opcode: if imm.is_some() {
                sys::ibv_wr_opcode::IBV_WR_RDMA_WRITE_WITH_IMM
            } else {
                sys::ibv_wr_opcode::IBV_WR_RDMA_WRITE
            },
            send_flags: flags.0,
            ..Default::default()
        };
        wr.__bindgen_anon_1.imm_data = imm.unwrap_or(0).to_be();
        wr.wr.rdma = sys::ibv_send_wr__bindgen_ty_2__bindgen_ty_1 { remote_addr: dst.addr, rkey: dst.rkey };
        let mut bad: *mut sys::ibv_send_wr = ptr::null_mut();
        // SAFETY: a live QP in RTS; `wr` and `sge` live across the call (inline data is copied
        // by the call; registered data stays valid until its completion, the caller's
        // MemRegion contract); post_send is the provider's entry in the context's ops table,
        // as verbs.h's inline ibv_post_send calls it.
        let rc = unsafe {
            let ctx = (*self.qp).context;
            match (*ctx).ops.post_send {
                Some(post) => post(self.qp, &mut wr, &mut bad),
                None => libc::ENOSYS,
            }
        };
        if rc != 0 {
            return Err(os_error("ibv_post_send", rc));
        }
        Ok(())
    }

    fn post_recv(&mut self, wr_id: u64) -> Result<()> {
        let mut wr = sys::ibv_recv_wr { wr_id, next: ptr::null_mut(), sg_list: ptr::null_mut(), num_sge: 0 };
        let mut bad: *mut sys::ibv_recv_wr = ptr::null_mut();
        // SAFETY: a live QP; a receive with no scatter entries (it takes only an immediate);
        // the ops table entry as verbs.h's inline ibv_post_recv calls it.
        let rc = unsafe {
            let ctx = (*self.qp).context;
            match (*ctx).ops.post_recv {
                Some(post) => post(self.qp, &mut wr, &mut bad),
                None => libc::ENOSYS,
            }
        };
        if rc != 0 {
            return Err(os_error("ibv_post_recv", rc));
        }
        Ok(())
    }

    fn poll(&mut self, out: &mut Vec<Completion>) -> Result<()> {
        loop {
            let n = self.wcs.len() as i32;
            // SAFETY: a live CQ; `wcs` has room for `n` entries; the ops table entry as
            // verbs.h's inline ibv_poll_cq calls it.
            let got = unsafe {
                match (*(*self.cq).context).ops.poll_cq {
                    Some(poll) => poll(self.cq, n, self.wcs.as_mut_ptr()),
                    None => -1,
                }
            };
            if got < 0 {
                return Err(Error::system("ibv_poll_cq", io::Error::other("completion queue error")));
            }
            for wc in &self.wcs[..got as usize] {
                let (status, vendor_err) = wc.error().unwrap_or((0, 0));
                let recv = (status == 0 && wc.opcode() == sys::ibv_wc_opcode::IBV_WC_RECV_RDMA_WITH_IMM)
                    .then(|| (u32::from_be(wc.imm_data().unwrap_or(0)), wc.len() as u32));
                out.push(Completion { wr_id: wc.wr_id(), status, vendor_err, recv });
            }
            if got < n {
                return Ok(());
            }
        }
    }

    fn fifo_slot(&self, slot: usize) -> [u8; CTS_BYTES] {
        let Some(fifo) = &self.fifo else {
            return [0; CTS_BYTES];
        };
        if slot >= FIFO_SLOTS {
            return [0; CTS_BYTES];
        }
        // SAFETY: the slot lies inside the live FIFO mapping; the HCA may write it at any
        // time, hence a volatile read of plain bytes (any value is a valid [u8; 32], and the
        // flow re-checks the sequence number it carries).
        let bytes = unsafe { ptr::read_volatile(fifo.mem.add(slot * CTS_BYTES) as *const [u8; CTS_BYTES]) };
        std::sync::atomic::fence(std::sync::atomic::Ordering::Acquire);
        bytes
    }

    fn peer_closed(&mut self) -> bool {
        false // the setup socket tells (super::Endpoint)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The pure code names statuses and link layers by number; they must be verbs' numbers.
    #[test]
    fn constants_match_the_verbs_headers() {
        use sys::ibv_wc_status as S;
        for (code, name) in [
            (S::IBV_WC_SUCCESS, "success"),
            (S::IBV_WC_LOC_PROT_ERR, "local protection error"),
            (S::IBV_WC_WR_FLUSH_ERR, "work request flushed"),
            (S::IBV_WC_REM_ACCESS_ERR, "remote access error"),
            (S::IBV_WC_RETRY_EXC_ERR, "transport retry counter exceeded"),
            (S::IBV_WC_RNR_RETRY_EXC_ERR, "RNR retry counter exceeded"),
            (S::IBV_WC_GENERAL_ERR, "general error"),
        ] {
            assert_eq!(super::super::flow::wc_status_name(code), name, "status {code}");
        }
        assert_eq!(sys::ibv_port_state::IBV_PORT_ACTIVE as u8, super::super::hca::PORT_ACTIVE);
        assert_eq!(link_layer(sys::IBV_LINK_LAYER_ETHERNET as u8), Some(LinkLayer::Ethernet));
        assert_eq!(link_layer(sys::IBV_LINK_LAYER_INFINIBAND as u8), Some(LinkLayer::InfiniBand));
        assert_eq!(sys::IBV_MTU_4096, 5);
    }

    /// On this machine (no kernel RDMA support) the probe fails or finds nothing, without
    /// crashing or hanging; on a machine with HCAs it lists them.
    #[test]
    fn probe_returns_without_crashing() {
        match probe() {
            Ok(devices) => {
                for d in &devices {
                    assert!(!d.name.is_empty());
                }
            }
            Err(e) => assert!(e.starts_with("ibv_get_device_list"), "{e}"),
        }
    }
}
