//! Communicators: creation (from a unique id, from threads, from a parent by split), the
//! handle registry the C API looks them up in, and their lifecycle.
//!
//! Owns a communicator's peers, connection table, bootstrap, reduction operators and state.
//! Not here: plans and their cache (`coll`, kept in the opaque slot of
//! [`Comm::with_layer_state`]), the encryption coverage report (`coverage`), the layout of what
//! ranks exchange (`wire`).

use std::any::Any;
use std::collections::HashMap;
use std::ffi::c_int;
use std::sync::atomic::{AtomicI32, AtomicU8, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};

use crate::bootstrap::{self, Bootstrap, UniqueId};
use crate::config::CommConfig;
use crate::error::{Error, Result};
use crate::interrupt::Interrupt;
use crate::reduce::Reduction;
use crate::transport::links::{Links, PeerLink, TierPolicy};
use crate::transport::net_select::{self, NetKind, NetPolicy, SysfsIbProbe};
use crate::transport::node_area::NodeArea;
use crate::transport::socket_net::SocketNet;
use crate::transport::Net;
use crate::types::{ncclComm_t, ncclResult_t, DataType, NCCL_NUM_OPS};
pub use crate::wire::PeerInfo;
use crate::wire::SplitEntry;

/// A PreMulSum scalar: its value now (ncclScalarHostImmediate) or where to read it each time
/// a collective uses the operator (ncclScalarDevice).
#[derive(Clone, Copy, Debug)]
pub enum Scalar {
    Immediate([u8; 8]),
    Pointer(usize),
}

#[derive(Clone, Copy, Debug)]
enum RedOpEntry {
    Fixed(Reduction),
    Pointer { dtype: DataType, addr: usize },
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum CommState {
    Active = 0,
    Finalized = 1,
    Aborted = 2,
}

/// A communicator: one rank's membership in a group of ranks.
pub struct Comm {
    pub rank: usize,
    pub nranks: usize,
    pub cuda_dev: i32,
    pub comm_hash: u64,
    pub magic: u64,
    pub peers: Vec<PeerInfo>,
    pub config: CommConfig,
    bootstrap: Mutex<Bootstrap>,
    links: Mutex<Links>,
    /// Set by abort, without taking `links`: a call blocked on these connections notices it
    /// within a poll interval, fails and releases them (the links and the bootstrap share it).
    interrupt: Interrupt,
    async_error: AtomicI32,
    state: AtomicU8,
    redops: Mutex<HashMap<c_int, RedOpEntry>>,
    next_redop: AtomicI32,
    registrations: Mutex<HashMap<usize, (usize, usize)>>,
    next_registration: AtomicUsize,
    /// State an upper layer keeps per communicator (the collectives' plan cache), opaque here
    /// so that comm does not depend on the layer that defines it; see [`Comm::with_layer_state`].
    layer_state: Mutex<Option<Box<dyn Any + Send>>>,
    /// All ranks share a node area (`transport::node_area`): node-level algorithms apply.
    pub node_area: bool,
}

impl Comm {
    /// Joins the communicator behind `id` (ncclCommInitRank*). Blocks until all ranks joined.
    pub fn init_rank(
        id: &UniqueId,
        nranks: usize,
        rank: usize,
        config: CommConfig,
        cuda_dev: i32,
    ) -> Result<Arc<Comm>> {
        if nranks == 0 {
            return Err(Error::invalid_argument("nranks must be at least 1"));
        }
        if rank >= nranks {
            return Err(Error::invalid_argument(format!("rank {rank} is out of range for {nranks} ranks")));
        }
        crate::debug::version_banner(&crate::version::banner());
        let bootstrap = Bootstrap::join(id, rank, nranks)?;
        Self::from_bootstrap(bootstrap, id.hash(), config, cuda_dev)
    }

    fn from_bootstrap(
        mut bootstrap: Bootstrap,
        comm_hash: u64,
        config: CommConfig,
        cuda_dev: i32,
    ) -> Result<Arc<Comm>> {
        let (rank, nranks, magic) = (bootstrap.rank(), bootstrap.nranks(), bootstrap.magic());
        let net = network()?;
        crate::transport::net_select::check_config_name(config.net_name.as_deref(), net.name())?;
        describe_topology_once();
        let interrupt = Interrupt::new();
        bootstrap.set_interrupt(interrupt.clone());
        let (mut links, handle) =
            Links::listen(net.clone(), TierPolicy::from_env(), rank, nranks, magic, host_hash(), interrupt.clone())?;
        let me = PeerInfo {
            rank,
            host_hash: host_hash(),
            pid: std::process::id(),
            cuda_dev,
            net_handle: handle,
            shm: links.shm_listening(),
        };
        let all = bootstrap.all_gather(&me.encode()?)?;
        let peers = PeerInfo::decode_all(&all, nranks)?;
        links.set_peers(
            peers
                .iter()
                .map(|p| PeerLink {
                    rank: p.rank,
                    net_handle: p.net_handle.clone(),
                    host_hash: p.host_hash,
                    pid: p.pid,
                    shm: p.shm,
                })
                .collect(),
        )?;
        // Every rank computes the same condition from the same peer table, so all of them
        // take part in setting the area up, or none does.
        let all_local = nranks > 1 && peers.iter().all(|p| p.host_hash == me.host_hash && p.shm);
        let mut node_area = false;
        if all_local {
            let pids: Vec<u32> = peers.iter().map(|p| p.pid).collect();
            let wanted = crate::env::get_bool("FERROCCL_NODE_COLL");
            if let Some(area) = NodeArea::establish(&mut bootstrap, magic, &pids, wanted)? {
                links.set_node_area(area);
                node_area = true;
            }
        }
        let comm = Comm {
            rank,
            nranks,
            cuda_dev,
            comm_hash,
            magic,
            peers,
            config,
            bootstrap: Mutex::new(bootstrap),
            links: Mutex::new(links),
            interrupt,
            async_error: AtomicI32::new(0),
            state: AtomicU8::new(CommState::Active as u8),
            redops: Mutex::new(HashMap::new()),
            next_redop: AtomicI32::new(NCCL_NUM_OPS),
            registrations: Mutex::new(HashMap::new()),
            next_registration: AtomicUsize::new(1),
            layer_state: Mutex::new(None),
            node_area,
        };
        log::info!(target: "INIT", "Using network {}", net.name());
        log::info!(
            target: "INIT",
            "ncclCommInitRank comm {:#x} rank {rank} nranks {nranks} cudaDev {cuda_dev} commId {comm_hash:#x} - Init COMPLETE",
            &comm as *const Comm as usize
        );
        Ok(Arc::new(comm))
    }

    /// Runs `f` on the upper layers' per-communicator state of type `T`, made (default) on
    /// first use. One type lives in the slot at a time (today only `coll`'s plan cache); asking
    /// for another replaces it.
    pub fn with_layer_state<T: Any + Send + Default, R>(&self, f: impl FnOnce(&mut T) -> R) -> R {
        let mut slot = self.layer_state.lock().unwrap_or_else(|p| p.into_inner());
        match slot.as_mut().and_then(|b| b.downcast_mut::<T>()) {
            Some(state) => f(state),
            None => {
                let mut state = T::default();
                let r = f(&mut state);
                *slot = Some(Box::new(state));
                r
            }
        }
    }

    pub fn state(&self) -> CommState {
        match self.state.load(Ordering::Acquire) {
            0 => CommState::Active,
            1 => CommState::Finalized,
            _ => CommState::Aborted,
        }
    }

    /// Errors unless the communicator can still run operations.
    pub fn check_usable(&self, function: &str) -> Result<()> {
        match self.state() {
            CommState::Active => {}
            CommState::Finalized => {
                return Err(Error::invalid_usage(format!("{function}: communicator was finalized")))
            }
            CommState::Aborted => return Err(Error::invalid_usage(format!("{function}: communicator was aborted"))),
        }
        let e = self.async_error.load(Ordering::Acquire);
        if e != 0 && e != ncclResult_t::ncclInProgress.0 {
            return Err(Error::invalid_usage(format!(
                "{function}: communicator has a pending asynchronous error ({}); it must be destroyed",
                crate::error::error_string(ncclResult_t(e)).to_string_lossy()
            )));
        }
        Ok(())
    }

    pub fn async_error(&self) -> ncclResult_t {
        ncclResult_t(self.async_error.load(Ordering::Acquire))
    }

    /// Records a failure that leaves the communicator unusable (not bad arguments).
    pub fn set_async_error(&self, e: &Error) {
        if !matches!(e, Error::InvalidArgument(_)) {
            let _ = self.async_error.compare_exchange(0, e.code().0, Ordering::AcqRel, Ordering::Acquire);
        }
    }

    pub fn links(&self) -> Result<MutexGuard<'_, Links>> {
        self.links.try_lock().map_err(|_| {
            Error::invalid_usage(
                "communicator is already in use by another thread (NCCL forbids concurrent use of one communicator)",
            )
        })
    }

    pub fn bootstrap(&self) -> MutexGuard<'_, Bootstrap> {
        self.bootstrap.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Host operations complete before their calls return, so nothing is in flight once the
    /// caller reaches finalize: it is local (no barrier), which also lets one thread finalize
    /// several communicators of one clique in turn.
    pub fn finalize(&self) -> Result<()> {
        self.check_usable("ncclCommFinalize")?;
        self.state.store(CommState::Finalized as u8, Ordering::Release);
        Ok(())
    }

    /// Closes every connection (destroy, abort). A call blocked on this communicator in
    /// another thread holds the links: the interrupt makes it fail and let go (within a poll
    /// interval, see `interrupt::POLL_SLICE`), and the connections are closed after it.
    pub fn abort(&self) {
        self.state.store(CommState::Aborted as u8, Ordering::Release);
        self.interrupt.trigger();
        self.links.lock().unwrap_or_else(|p| p.into_inner()).close_all();
    }

    /// The abort flag of this communicator.
    pub fn interrupt(&self) -> &Interrupt {
        &self.interrupt
    }

    /// Creates a PreMulSum operator handle.
    pub fn create_premul_sum(&self, dtype: DataType, scalar: Scalar) -> Result<c_int> {
        let entry = match scalar {
            Scalar::Immediate(bytes) => RedOpEntry::Fixed(Reduction::pre_mul_sum(dtype, &bytes[..dtype.size()])?),
            Scalar::Pointer(addr) => RedOpEntry::Pointer { dtype, addr },
        };
        let handle = self.next_redop.fetch_add(1, Ordering::AcqRel);
        if handle == c_int::MAX {
            return Err(Error::invalid_usage("too many reduction operators created"));
        }
        self.redops.lock().unwrap_or_else(|p| p.into_inner()).insert(handle, entry);
        Ok(handle)
    }

    pub fn destroy_redop(&self, op: c_int) -> Result<()> {
        if op < NCCL_NUM_OPS {
            return Err(Error::invalid_argument(format!("ncclRedOpDestroy: operator {op} is built in")));
        }
        self.redops.lock().unwrap_or_else(|p| p.into_inner()).remove(&op).map(|_| ()).ok_or_else(|| {
            Error::invalid_argument(format!("ncclRedOpDestroy: operator {op} was not created on this communicator"))
        })
    }

    /// The reduction for an operator handle and type.
    pub fn reduction(&self, op: c_int, dtype: DataType) -> Result<Reduction> {
        self.reduction_for_call(op, dtype, false).map(|(r, _)| r)
    }

    /// The reduction for a call. On a device-buffer call (`device_call`), a PreMulSum scalar in
    /// device memory is not read now: its address is returned, to be read in stream order
    /// when the operation runs (the returned reduction's pre bits are then zero: a path that
    /// forgot to read the scalar gives zeros, which tests catch).
    pub fn reduction_for_call(
        &self,
        op: c_int,
        dtype: DataType,
        device_call: bool,
    ) -> Result<(Reduction, Option<usize>)> {
        if let Some(b) = crate::types::BuiltinOp::from_raw(crate::types::ncclRedOp_t(op)) {
            return Ok((Reduction::builtin(dtype, b, self.nranks), None));
        }
        let entry = self
            .redops
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(&op)
            .copied()
            .ok_or_else(|| Error::invalid_argument(format!("invalid reduction operator {op}")))?;
        if let RedOpEntry::Pointer { dtype: d, addr } = entry {
            if device_call && d == dtype && crate::cuda::memory::classify(addr as *const u8).is_device() {
                return Ok((Reduction::pre_mul_sum(d, &[0u8; 8])?, Some(addr)));
            }
        }
        Ok((Self::resolve(op, entry, dtype)?, None))
    }

    /// An operator entry as a reduction now (a scalar behind a pointer is read now).
    fn resolve(op: c_int, entry: RedOpEntry, dtype: DataType) -> Result<Reduction> {
        let red = match entry {
            RedOpEntry::Fixed(r) => r,
            RedOpEntry::Pointer { dtype: d, addr } => {
                let mut bytes = [0u8; 8];
                if crate::cuda::memory::classify(addr as *const u8).is_device() {
                    // A device-resident scalar is read when the call is issued (not in stream
                    // order): set it before the call, synchronously.
                    crate::cuda::memory::read_device(addr as *const u8, &mut bytes[..d.size()])?;
                } else {
                    // SAFETY: ncclScalarDevice's contract: the scalar stays valid and readable
                    // while collectives use the operator; on host memory it is read when the
                    // collective is issued, which is when it runs.
                    unsafe { std::ptr::copy_nonoverlapping(addr as *const u8, bytes.as_mut_ptr(), d.size()) };
                }
                Reduction::pre_mul_sum(d, &bytes[..d.size()])?
            }
        };
        if red.dtype != dtype {
            return Err(Error::invalid_argument(format!(
                "operator {op} was created for {} but used with {dtype}",
                red.dtype
            )));
        }
        Ok(red)
    }

    /// ncclCommRegister for host memory: remembers the range and returns a handle.
    pub fn register(&self, addr: usize, size: usize) -> usize {
        let h = self.next_registration.fetch_add(1, Ordering::AcqRel);
        self.registrations.lock().unwrap_or_else(|p| p.into_inner()).insert(h, (addr, size));
        h
    }

    pub fn deregister(&self, handle: usize) -> Result<()> {
        self.registrations
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&handle)
            .map(|_| ())
            .ok_or_else(|| Error::invalid_argument("ncclCommDeregister: unknown registration handle"))
    }

    /// ncclCommSplit: every rank of `self` calls this; ranks with the same color form a new
    /// communicator ordered by (key, old rank). NCCL_SPLIT_NOCOLOR (-1) yields `None`.
    pub fn split(&self, color: c_int, key: c_int, config: CommConfig) -> Result<Option<Arc<Comm>>> {
        self.check_usable("ncclCommSplit")?;
        if color < -1 {
            return Err(Error::invalid_argument(format!(
                "ncclCommSplit: color {color} must be >= 0 or NCCL_SPLIT_NOCOLOR"
            )));
        }
        let mut boot = self.bootstrap();
        let all = boot.all_gather(&SplitEntry { color, key }.encode())?;
        let entries = SplitEntry::decode_all(&all)?;
        if color == -1 {
            return Ok(None);
        }
        let mut members: Vec<(c_int, usize)> =
            entries.iter().enumerate().filter(|(_, e)| e.color == color).map(|(r, e)| (e.key, r)).collect();
        members.sort();
        let new_rank = members
            .iter()
            .position(|&(_, r)| r == self.rank)
            .ok_or_else(|| Error::internal("ncclCommSplit: this rank is missing from its own color"))?;
        let leader = members[0].1;
        // The leader makes the child's id and hands it to the other members.
        let tag = 0x5000_0000u32 | (color as u32 & 0x0fff_ffff);
        let id = if leader == self.rank {
            let id = bootstrap::create_unique_id()?;
            for &(_, r) in &members[1..] {
                boot.send(r, tag, &id.encode())?;
            }
            id
        } else {
            let b = boot.recv(leader, tag)?;
            UniqueId::decode(&b).map_err(|e| Error::remote(format!("malformed split id: {e}")))?
        };
        drop(boot);
        Comm::init_rank(&id, members.len(), new_rank, config, self.cuda_dev).map(Some)
    }
}

/// The network of the NET tier, chosen once per process at run time (`net_select`: IB when
/// present and built, else sockets; `NCCL_NET`). A failed choice fails every init with the
/// same error.
fn network() -> Result<Arc<dyn Net>> {
    static NET: OnceLock<std::result::Result<Arc<dyn Net>, Error>> = OnceLock::new();
    let net = NET.get_or_init(|| {
        let selection = net_select::select(&NetPolicy::from_env(), &SysfsIbProbe::system());
        for line in &selection.log {
            log::info!(target: "NET", "{line}");
        }
        match selection.kind? {
            NetKind::Socket => socket_network(),
        }
    });
    match net {
        Ok(n) => Ok(n.clone()),
        Err(e) => Err(Error::invalid_usage(e.to_string())),
    }
}

fn socket_network() -> Result<Arc<dyn Net>> {
    let iface = crate::transport::netif::pick().map_err(|e| Error::invalid_usage(e.to_string()))?;
    // SAFETY: sched_getcpu has no preconditions.
    let cpu = u32::try_from(unsafe { libc::sched_getcpu() }).ok();
    let helper_cpus = crate::topo::Topology::system().socket_helper_cpus(&iface.name, cpu);
    if let Some(cpus) = &helper_cpus {
        log::info!(target: "NET", "NET/Socket : helper threads of {} run on cpus {cpus}", iface.name);
    }
    let net = SocketNet::new(iface, helper_cpus);
    log::info!(target: "NET", "NET/Socket : Using {}", net.describe());
    if let Some(n) = net.helper_threads() {
        // NCCL's line; here every helper thread has one socket of its own.
        log::info!(target: "NET", "NET/Socket: Using {n} threads and 1 sockets per thread");
    }
    Ok(Arc::new(net))
}

/// Logs the machine's topology (NCCL_DEBUG_SUBSYS=GRAPH) and writes it out when
/// FERROCCL_TOPO_DUMP asks, once per process.
fn describe_topology_once() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        let topo = crate::topo::Topology::system();
        topo.log_graph();
        match topo.dump_if_requested() {
            Ok(Some(path)) => log::info!(target: "GRAPH", "Topology written to {}", path.display()),
            Ok(None) => {}
            Err(e) => log::warn!(target: "GRAPH", "FERROCCL_TOPO_DUMP: {e}"),
        }
    });
}

/// Host identity: hostname plus boot id, or NCCL_HOSTID.
pub fn host_hash() -> u64 {
    let ident = crate::env::get_str("NCCL_HOSTID").unwrap_or_else(|| {
        let host = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap_or_default();
        let boot = std::fs::read_to_string("/proc/sys/kernel/random/boot_id").unwrap_or_default();
        format!("{}{}", host.trim(), boot.trim())
    });
    crate::hash::fnv1a64(ident.as_bytes())
}

/// Live communicators, indexed by handle token. Tokens are never reused, so a destroyed
/// handle is always recognised (and never dereferenced); lookups need no hashing.
static REGISTRY: Mutex<Vec<Option<Arc<Comm>>>> = Mutex::new(Vec::new());

fn registry() -> MutexGuard<'static, Vec<Option<Arc<Comm>>>> {
    REGISTRY.lock().unwrap_or_else(|p| p.into_inner())
}

/// Handles look like aligned pointers but are opaque tokens (C never dereferences them).
const HANDLE_SHIFT: u32 = 4;
const HANDLE_BASE: usize = 1;

/// Gives C a handle for a new communicator.
pub fn register_handle(comm: Arc<Comm>) -> ncclComm_t {
    let mut reg = registry();
    reg.push(Some(comm));
    ((reg.len() - 1 + HANDLE_BASE) << HANDLE_SHIFT) as ncclComm_t
}

fn slot_of(handle: ncclComm_t) -> Option<usize> {
    let token = handle as usize;
    if token & ((1 << HANDLE_SHIFT) - 1) != 0 {
        return None;
    }
    (token >> HANDLE_SHIFT).checked_sub(HANDLE_BASE)
}

/// The communicator behind a handle; NULL or unknown (destroyed) handles are errors.
pub fn lookup(handle: ncclComm_t, function: &str) -> Result<Arc<Comm>> {
    if handle.is_null() {
        return Err(Error::invalid_argument(format!("{function}: comm is NULL")));
    }
    slot_of(handle).and_then(|i| registry().get(i).cloned().flatten()).ok_or_else(|| {
        Error::invalid_argument(format!("{function}: comm {handle:p} is not a live communicator (destroyed?)"))
    })
}

/// Removes a handle (destroy/abort); the communicator is freed when its last user is done.
pub fn unregister(handle: ncclComm_t, function: &str) -> Result<Arc<Comm>> {
    if handle.is_null() {
        return Err(Error::invalid_argument(format!("{function}: comm is NULL")));
    }
    slot_of(handle).and_then(|i| registry().get_mut(i).and_then(Option::take)).ok_or_else(|| {
        Error::invalid_argument(format!("{function}: comm {handle:p} is not a live communicator (destroyed?)"))
    })
}
