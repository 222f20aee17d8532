//! Communicators: creation (from a unique id, from threads, from a parent by split or
//! shrink), the handle registry the C API looks them up in, and their lifecycle.
//!
//! A handle may name a communicator still being created ([`Creation`]: NCCL's non-blocking
//! init hands the handle out at once); such a handle answers only ncclCommGetAsyncError and
//! ncclCommAbort until the creation finishes and the registry slot turns into the
//! communicator.
//!
//! Owns a communicator's peers, connection table, bootstrap, reduction operators and state.
//! Not here: plans and their cache (`coll`, kept in the opaque slot of
//! [`Comm::with_layer_state`]), the encryption coverage report (`coverage`), the layout of what
//! ranks exchange (`wire`).

use std::any::Any;
use std::cell::RefCell;
use std::collections::HashMap;
use std::ffi::c_int;
use std::sync::atomic::{AtomicI32, AtomicU64, AtomicU8, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, OnceLock, Weak};

use crate::bootstrap::{self, Bootstrap, UniqueId};
use crate::config::CommConfig;
use crate::error::{Error, Result};
use crate::interrupt::Interrupt;
use crate::reduce::Reduction;
use crate::transport::ib::hca::PortChoice;
use crate::transport::links::{Links, PeerLink, TierPolicy};
use crate::transport::net_select::{self, NetKind, NetPolicy};
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

/// A buffer registered with a communicator (ncclCommRegister) or a window of it
/// (ncclCommWindowRegister): bookkeeping, kept for its handle's checks and for logs.
struct Registration {
    addr: usize,
    size: usize,
    /// The window's flags; `None` for an ncclCommRegister buffer.
    window: Option<c_int>,
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
    /// Registered buffers and windows by handle.
    registrations: Mutex<HashMap<usize, Registration>>,
    /// State an upper layer keeps per communicator (the collectives' plan cache), opaque here
    /// so that comm does not depend on the layer that defines it; see [`Comm::with_layer_state`].
    layer_state: Mutex<Option<Box<dyn Any + Send>>>,
    /// All ranks share a node area (`transport::node_area`): node-level algorithms apply.
    pub node_area: bool,
}

impl Comm {
    /// Joins the communicator behind `id` (ncclCommInitRank*). Blocks until all ranks joined,
    /// or until `interrupt` is set (it becomes the communicator's abort flag).
    pub fn init_rank(
        id: &UniqueId,
        nranks: usize,
        rank: usize,
        config: CommConfig,
        cuda_dev: i32,
        interrupt: Interrupt,
    ) -> Result<Arc<Comm>> {
        if nranks == 0 {
            return Err(Error::invalid_argument("nranks must be at least 1"));
        }
        if rank >= nranks {
            return Err(Error::invalid_argument(format!("rank {rank} is out of range for {nranks} ranks")));
        }
        crate::debug::version_banner(&crate::version::banner());
        let bootstrap = Bootstrap::join_or_interrupt(id, rank, nranks, Some(&interrupt))?;
        Self::from_bootstrap(bootstrap, id.hash(), config, cuda_dev, interrupt)
    }

    fn from_bootstrap(
        mut bootstrap: Bootstrap,
        comm_hash: u64,
        config: CommConfig,
        cuda_dev: i32,
        interrupt: Interrupt,
    ) -> Result<Arc<Comm>> {
        let (rank, nranks, magic) = (bootstrap.rank(), bootstrap.nranks(), bootstrap.magic());
        let net = network()?;
        crate::transport::net_select::check_config_name(config.net_name.as_deref(), net.name())?;
        describe_topology_once();
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
            gpu: crate::cuda::driver::identity(cuda_dev),
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
            let slot_bytes = crate::env::get_bytes("FERROCCL_NODE_SLOT_SIZE") as usize;
            if let Some(area) = NodeArea::establish(&mut bootstrap, magic, &pids, wanted, slot_bytes)? {
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
        if e == ncclResult_t::ncclInProgress.0 {
            // NCCL's ncclCommEnsureReady: refused, and nothing changes.
            return Err(Error::invalid_argument(format!(
                "{function}: attempt to use the communicator before its previous non-blocking call \
                 completed (ncclCommGetAsyncError still returns ncclInProgress)"
            )));
        }
        if e != 0 {
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

    /// Records a failure that leaves the communicator unusable (not bad arguments). It
    /// replaces a background call's ncclInProgress: that call has failed too.
    pub fn set_async_error(&self, e: &Error) {
        if matches!(e, Error::InvalidArgument(_)) {
            return;
        }
        let in_progress = ncclResult_t::ncclInProgress.0;
        let _ = self.async_error.fetch_update(Ordering::AcqRel, Ordering::Acquire, |cur| {
            (cur == 0 || cur == in_progress).then_some(e.code().0)
        });
    }

    /// A non-blocking split or shrink of this communicator runs in the background: until
    /// [`Comm::end_background`], ncclCommGetAsyncError reports ncclInProgress and other calls
    /// are refused (NCCL marks the parent the same way, so programs poll it). Overwrites an
    /// earlier error, as NCCL does: after NCCL_SHRINK_ABORT the parent may hold one.
    pub fn begin_background(&self) {
        self.async_error.store(ncclResult_t::ncclInProgress.0, Ordering::Release);
    }

    /// The background call finished with `failure` (None: success).
    pub fn end_background(&self, failure: Option<&Error>) {
        let code = match failure {
            Some(e) if !matches!(e, Error::InvalidArgument(_)) => e.code().0,
            _ => 0,
        };
        let in_progress = ncclResult_t::ncclInProgress.0;
        let _ = self.async_error.compare_exchange(in_progress, code, Ordering::AcqRel, Ordering::Acquire);
    }

    /// A background call on this communicator has not finished.
    pub fn busy(&self) -> bool {
        self.async_error() == ncclResult_t::ncclInProgress
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

    /// ncclCommRegister (`window` None) or ncclCommWindowRegister (`window`: its flags):
    /// remembers the range and returns a handle (never 0).
    pub fn register(&self, addr: usize, size: usize, window: Option<c_int>) -> usize {
        // One count for the process: a handle of another communicator never names one here.
        static NEXT_REGISTRATION: AtomicUsize = AtomicUsize::new(1);
        let h = NEXT_REGISTRATION.fetch_add(1, Ordering::AcqRel);
        self.registrations.lock().unwrap_or_else(|p| p.into_inner()).insert(h, Registration { addr, size, window });
        h
    }

    /// ncclCommDeregister (`window` false) or ncclCommWindowDeregister (true): forgets a handle
    /// of that kind; any other value is ncclInvalidArgument and changes nothing.
    pub fn deregister(&self, handle: usize, window: bool) -> Result<()> {
        let mut all = self.registrations.lock().unwrap_or_else(|p| p.into_inner());
        match all.get(&handle) {
            Some(r) if r.window.is_some() == window => {
                let what = if window { "window" } else { "buffer" };
                log::info!(target: "REG", "deregistered the {what} of {} bytes at {:#x}", r.size, r.addr);
                all.remove(&handle);
                Ok(())
            }
            _ if window => Err(Error::invalid_argument(
                "ncclCommWindowDeregister: not a window of this communicator (already deregistered?)",
            )),
            _ => Err(Error::invalid_argument("ncclCommDeregister: unknown registration handle")),
        }
    }

    /// ncclCommSplit: every rank of `self` calls this; ranks with the same color form a new
    /// communicator ordered by (key, old rank). NCCL_SPLIT_NOCOLOR (-1) yields `None`.
    /// `interrupt` becomes the child's abort flag (and ends its creation early).
    pub fn split(
        &self,
        color: c_int,
        key: c_int,
        config: CommConfig,
        interrupt: Interrupt,
    ) -> Result<Option<Arc<Comm>>> {
        // Usability was checked by the call: a non-blocking split runs while the parent
        // reports ncclInProgress.
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
        Comm::init_rank(&id, members.len(), new_rank, config, self.cuda_dev, interrupt).map(Some)
    }

    /// ncclCommShrink: the ranks of `self` not in `excluded` (from [`shrink_exclusions`]) form
    /// a new communicator, numbered in parent order. Only they call this, and the excluded
    /// ranks may be dead, so the rendezvous needs nothing of theirs: the lowest surviving rank
    /// makes a fresh id (the root runs in its process) and sends it to the other survivors over
    /// the parent's bootstrap, whose listening addresses every rank learnt at init; then the
    /// survivors join that id. The parent's bootstrap waits answer to `interrupt` (the new
    /// communicator's abort flag) rather than the parent's, which NCCL_SHRINK_ABORT has set.
    pub fn shrink(&self, excluded: &[usize], config: CommConfig, interrupt: Interrupt) -> Result<Arc<Comm>> {
        let members: Vec<usize> = (0..self.nranks).filter(|r| !excluded.contains(r)).collect();
        let new_rank = members
            .iter()
            .position(|&r| r == self.rank)
            .ok_or_else(|| Error::internal("ncclCommShrink: this rank is in its own exclude list"))?;
        let leader = members[0];
        let id = self.bootstrap().with_interrupt(interrupt.clone(), |boot| -> Result<UniqueId> {
            if leader == self.rank {
                let id = bootstrap::create_unique_id()?;
                for &r in &members[1..] {
                    boot.send(r, SHRINK_TAG, &id.encode()).map_err(|e| e.context("ncclCommShrink"))?;
                }
                Ok(id)
            } else {
                let b = boot.recv(leader, SHRINK_TAG).map_err(|e| e.context("ncclCommShrink"))?;
                UniqueId::decode(&b).map_err(|e| Error::remote(format!("malformed shrink id: {e}")))
            }
        })?;
        log::info!(
            target: "INIT",
            "ncclCommShrink: rank {} of {} becomes rank {new_rank} of {} (excluded {excluded:?}, root at rank {leader})",
            self.rank,
            self.nranks,
            members.len()
        );
        Comm::init_rank(&id, members.len(), new_rank, config, self.cuda_dev, interrupt)
    }
}

/// Bootstrap tag of the new id the lowest surviving rank sends in ncclCommShrink (split's
/// tags have 0x5 in the top nibble).
const SHRINK_TAG: u32 = 0x6000_0000;

/// ncclCommShrink's exclude list, checked before anything changes: distinct ranks of a
/// communicator of `nranks`, not all of them, and not `rank` itself (excluded ranks must not
/// call ncclCommShrink). Returns the excluded ranks in increasing order.
pub fn shrink_exclusions(nranks: usize, rank: usize, excluded: &[c_int]) -> Result<Vec<usize>> {
    if excluded.is_empty() {
        return Err(Error::invalid_argument("ncclCommShrink: excludeRanksCount must be at least 1"));
    }
    let mut sorted = Vec::with_capacity(excluded.len());
    for &r in excluded {
        match usize::try_from(r) {
            Ok(r) if r < nranks => sorted.push(r),
            _ => {
                return Err(Error::invalid_argument(format!(
                    "ncclCommShrink: excluded rank {r} is out of range for {nranks} ranks"
                )))
            }
        }
    }
    sorted.sort_unstable();
    if let Some(w) = sorted.windows(2).find(|w| w[0] == w[1]) {
        return Err(Error::invalid_argument(format!("ncclCommShrink: rank {} is excluded twice", w[0])));
    }
    if sorted.len() >= nranks {
        return Err(Error::invalid_argument(format!(
            "ncclCommShrink: excluding all {nranks} ranks leaves no communicator"
        )));
    }
    if sorted.binary_search(&rank).is_ok() {
        return Err(Error::invalid_argument(format!(
            "ncclCommShrink: this rank ({rank}) is in the exclude list; excluded ranks must not call ncclCommShrink"
        )));
    }
    Ok(sorted)
}

/// The network of the NET tier, chosen once per process at run time (`net_select`: IB when
/// present and built, else sockets; `NCCL_NET`). A failed choice fails every init with the
/// same error.
fn network() -> Result<Arc<dyn Net>> {
    static NET: OnceLock<std::result::Result<Arc<dyn Net>, Error>> = OnceLock::new();
    let net = NET.get_or_init(|| {
        let policy = NetPolicy::from_env();
        let selection = net_select::select(&policy, &*net_select::system_probe());
        for line in &selection.trace {
            log::trace!(target: "NET", "{line}");
        }
        for line in &selection.log {
            log::info!(target: "NET", "{line}");
        }
        match selection.kind? {
            NetKind::Socket => socket_network(),
            NetKind::Ib(ports) => ib_network(&ports, policy.wants_ib()),
        }
    });
    match net {
        Ok(n) => Ok(n.clone()),
        Err(e) => Err(Error::invalid_usage(e.to_string())),
    }
}

/// The IB network on the first chosen port. A port that cannot be opened fails init when
/// NCCL_NET=IB asked for IB, else it is logged and sockets are used.
#[cfg(feature = "ib")]
fn ib_network(ports: &[PortChoice], required: bool) -> Result<Arc<dyn Net>> {
    use crate::transport::ib::hca::{describe_port, prefer_numa, IbSettings};
    use crate::transport::ib::{verbs::VerbsFabric, IbNet};
    // Placement from the topology (hwloc) where sysfs said nothing; then the caller's NUMA
    // node first.
    let topo = crate::topo::Topology::system();
    let mut ports = ports.to_vec();
    for p in &mut ports {
        if let Some(dev) = topo.device_by_name(&p.device) {
            p.pci.get_or_insert_with(|| dev.bus_id.to_string());
            if p.numa.is_none() {
                p.numa = dev.numa_nodes.first().map(|&n| n as i32);
            }
        }
    }
    // SAFETY: sched_getcpu has no preconditions.
    let cpu = u32::try_from(unsafe { libc::sched_getcpu() }).ok();
    let local = cpu.and_then(|c| topo.numa_nodes().iter().find(|n| n.cpuset.contains(c))).map(|n| n.os_index as i32);
    let ports = prefer_numa(ports, local);
    for p in &ports {
        log::info!(target: "NET", "NET/IB : usable port {}", describe_port(p));
    }
    let Some(port) = ports.first() else {
        return Err(Error::internal("IB chosen without a port"));
    };
    let opened = IbSettings::from_env().and_then(|settings| {
        let fabric = VerbsFabric::open(port, settings)?;
        let iface = crate::transport::netif::pick().map_err(|e| Error::invalid_usage(e.to_string()))?;
        Ok((fabric, iface))
    });
    match opened {
        Ok((fabric, iface)) => {
            let net = IbNet::new(Arc::new(fabric), iface);
            log::info!(target: "NET", "NET/IB : Using {}", net.describe());
            if ports.len() > 1 {
                let others: Vec<String> = ports[1..].iter().map(PortChoice::label).collect();
                log::info!(target: "NET", "NET/IB : not using {} (this transport uses one port)", others.join(", "));
            }
            log::info!(target: "NET", "{}", IB_TLS_NOTE);
            log::warn!(
                target: "NET",
                "NET/IB : this transport has not yet run on RDMA hardware; NCCL_NET=Socket or NCCL_IB_DISABLE=1 uses sockets instead"
            );
            Ok(Arc::new(net))
        }
        Err(e) if required => Err(e.context("NCCL_NET=IB")),
        Err(e) => {
            log::warn!(target: "NET", "NET/IB : cannot use {}: {e}; using sockets", port.label());
            socket_network()
        }
    }
}

#[cfg(not(feature = "ib"))]
fn ib_network(_ports: &[PortChoice], _required: bool) -> Result<Arc<dyn Net>> {
    Err(Error::internal("IB chosen in a build without the IB transport"))
}

/// Said whenever the IB network is used: what TLS covers and what it does not.
pub const IB_TLS_NOTE: &str =
    "NET/IB : RDMA data is outside the TLS boundary (not encrypted); only connection setup uses the encrypted sockets";

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

/// A communicator being created behind a handle its caller already holds (non-blocking
/// init, split, shrink). The job that creates it calls [`Creation::start`], then
/// [`finish_creation`]; ncclCommAbort calls [`Creation::cancel`].
pub struct Creation {
    /// The call that started it, for messages.
    function: &'static str,
    /// Becomes the new communicator's abort flag; set early, it ends the creation's waits.
    interrupt: Interrupt,
    phase: Mutex<Phase>,
    changed: Condvar,
}

enum Phase {
    /// Queued in a group that has not ended yet.
    Queued,
    Running,
    Failed(Error),
    /// The communicator replaced the creation in the registry (or was dropped, if aborted).
    Done,
}

impl Creation {
    pub fn new(function: &'static str) -> Arc<Creation> {
        Arc::new(Creation {
            function,
            interrupt: Interrupt::new(),
            phase: Mutex::new(Phase::Queued),
            changed: Condvar::new(),
        })
    }

    pub fn interrupt(&self) -> &Interrupt {
        &self.interrupt
    }

    fn phase(&self) -> MutexGuard<'_, Phase> {
        self.phase.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The job begins (from here on, an abort waits for it to stop).
    pub fn start(&self) {
        let mut phase = self.phase();
        if matches!(*phase, Phase::Queued) {
            *phase = Phase::Running;
        }
    }

    /// What ncclCommGetAsyncError reports: ncclInProgress until the creation failed.
    pub fn status(&self) -> ncclResult_t {
        match &*self.phase() {
            Phase::Failed(e) => e.code(),
            _ => ncclResult_t::ncclInProgress,
        }
    }

    /// The error a call other than ncclCommGetAsyncError/ncclCommAbort gets on this handle:
    /// NCCL's ncclCommEnsureReady (ncclInvalidArgument while in progress, else the failure).
    pub fn refusal(&self, function: &str, handle: ncclComm_t) -> Error {
        match &*self.phase() {
            Phase::Failed(e) => {
                e.duplicate().context(&format!("{function}: communicator {handle:p} failed to initialise"))
            }
            _ => Error::invalid_argument(format!(
                "{function}: communicator {handle:p} is still being created (its non-blocking {} returned \
                 ncclInProgress): poll ncclCommGetAsyncError until it returns ncclSuccess",
                self.function
            )),
        }
    }

    /// True once the creation failed (its handle may then be destroyed like any other).
    pub fn failed(&self) -> bool {
        matches!(*self.phase(), Phase::Failed(_))
    }

    /// ncclCommAbort: sets the abort flag and waits until a running job has stopped (each of
    /// its waits polls the flag); a job still queued stops as soon as it starts.
    pub fn cancel(&self) {
        self.interrupt.trigger();
        let mut phase = self.phase();
        while matches!(*phase, Phase::Running) {
            phase = self.changed.wait(phase).unwrap_or_else(|p| p.into_inner());
        }
    }
}

/// A registry slot.
enum Slot {
    Ready(Arc<Comm>),
    Creating(Arc<Creation>),
}

/// What a handle names.
pub enum Entry {
    Ready(Arc<Comm>),
    Creating(Arc<Creation>),
}

/// Live communicators, indexed by handle token. Tokens are never reused, so a destroyed
/// handle is always recognised (and never dereferenced); lookups need no hashing.
static REGISTRY: Mutex<Vec<Option<Slot>>> = Mutex::new(Vec::new());

fn registry() -> MutexGuard<'static, Vec<Option<Slot>>> {
    REGISTRY.lock().unwrap_or_else(|p| p.into_inner())
}

/// Bumped when a slot is emptied (a handle destroyed or aborted): [`lookup`]'s per-thread memo
/// is good only while this has not moved. Nothing else needs a bump: the memo only ever holds a
/// handle whose creation had ended, and tokens are never reused.
static REGISTRY_EPOCH: AtomicU64 = AtomicU64::new(0);

fn registry_changed() {
    REGISTRY_EPOCH.fetch_add(1, Ordering::Release);
}

thread_local! {
    /// The handle this thread last looked up, the epoch it was looked up at, and its
    /// communicator: a small call then skips the registry's lock. Weak, so that it keeps no
    /// destroyed communicator alive (only its allocation, so the address stays unique).
    static LAST_LOOKUP: RefCell<Option<(usize, u64, Weak<Comm>)>> = const { RefCell::new(None) };
}

/// Handles look like aligned pointers but are opaque tokens (C never dereferences them).
const HANDLE_SHIFT: u32 = 4;
const HANDLE_BASE: usize = 1;

fn push(slot: Slot) -> ncclComm_t {
    let mut reg = registry();
    reg.push(Some(slot));
    ((reg.len() - 1 + HANDLE_BASE) << HANDLE_SHIFT) as ncclComm_t
}

/// Gives C a handle for a new communicator.
pub fn register_handle(comm: Arc<Comm>) -> ncclComm_t {
    push(Slot::Ready(comm))
}

/// Gives C a handle for a communicator that `creation` will make.
pub fn register_creation(creation: Arc<Creation>) -> ncclComm_t {
    push(Slot::Creating(creation))
}

/// Ends `creation` (behind `handle`): a communicator takes its place in the registry; a
/// failure stays there for ncclCommGetAsyncError (and is logged, as NCCL warns). If the
/// handle was aborted meanwhile, the new communicator is closed at once.
pub fn finish_creation(handle: ncclComm_t, creation: &Arc<Creation>, result: Result<Arc<Comm>>) {
    let orphan = match result {
        Ok(comm) => {
            let mut reg = registry();
            let slot = slot_of(handle).and_then(|i| reg.get_mut(i));
            match slot {
                Some(slot) if matches!(&*slot, Some(Slot::Creating(c)) if Arc::ptr_eq(c, creation)) => {
                    *slot = Some(Slot::Ready(comm));
                    None
                }
                _ => Some(comm),
            }
        }
        Err(e) => {
            log::warn!(target: "INIT", "{}: non-blocking creation of comm {handle:p} failed: {e}", creation.function);
            *creation.phase() = Phase::Failed(e);
            creation.changed.notify_all();
            return;
        }
    };
    if let Some(comm) = orphan {
        comm.abort();
    }
    *creation.phase() = Phase::Done;
    creation.changed.notify_all();
}

fn slot_of(handle: ncclComm_t) -> Option<usize> {
    let token = handle as usize;
    if token & ((1 << HANDLE_SHIFT) - 1) != 0 {
        return None;
    }
    (token >> HANDLE_SHIFT).checked_sub(HANDLE_BASE)
}

fn not_live(function: &str, handle: ncclComm_t) -> Error {
    if handle.is_null() {
        return Error::invalid_argument(format!("{function}: comm is NULL"));
    }
    Error::invalid_argument(format!("{function}: comm {handle:p} is not a live communicator (destroyed?)"))
}

/// What a handle names, whether created yet or not; NULL or unknown handles are errors.
pub fn entry(handle: ncclComm_t, function: &str) -> Result<Entry> {
    let reg = registry();
    match slot_of(handle).and_then(|i| reg.get(i)) {
        Some(Some(Slot::Ready(c))) => Ok(Entry::Ready(c.clone())),
        Some(Some(Slot::Creating(c))) => Ok(Entry::Creating(c.clone())),
        _ => Err(not_live(function, handle)),
    }
}

/// The communicator behind a handle; NULL, unknown (destroyed) handles and handles whose
/// creation has not completed are errors.
pub fn lookup(handle: ncclComm_t, function: &str) -> Result<Arc<Comm>> {
    // Read before the registry: a change after this read makes the memo stale at once.
    let epoch = REGISTRY_EPOCH.load(Ordering::Acquire);
    let token = handle as usize;
    let memo = LAST_LOOKUP.with(|m| match &*m.borrow() {
        Some((t, e, c)) if *t == token && *e == epoch => c.upgrade(),
        _ => None,
    });
    if let Some(c) = memo {
        return Ok(c);
    }
    match entry(handle, function)? {
        Entry::Ready(c) => {
            LAST_LOOKUP.with(|m| *m.borrow_mut() = Some((token, epoch, Arc::downgrade(&c))));
            Ok(c)
        }
        Entry::Creating(c) => Err(c.refusal(function, handle)),
    }
}

/// Removes a handle (destroy/abort); a communicator is freed when its last user is done.
pub fn unregister(handle: ncclComm_t, function: &str) -> Result<Entry> {
    let taken = slot_of(handle).and_then(|i| registry().get_mut(i).and_then(Option::take));
    registry_changed();
    match taken {
        Some(Slot::Ready(c)) => Ok(Entry::Ready(c)),
        Some(Slot::Creating(c)) => Ok(Entry::Creating(c)),
        None => Err(not_live(function, handle)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shrink_exclusions_are_checked() {
        assert_eq!(shrink_exclusions(5, 0, &[4, 1]).unwrap(), vec![1, 4]);
        let msg = |r: Result<Vec<usize>>| {
            let e = r.unwrap_err();
            assert_eq!(e.code(), ncclResult_t::ncclInvalidArgument);
            e.to_string()
        };
        assert!(msg(shrink_exclusions(4, 0, &[])).contains("at least 1"));
        assert!(msg(shrink_exclusions(4, 0, &[4])).contains("excluded rank 4 is out of range"));
        assert!(msg(shrink_exclusions(4, 0, &[-1])).contains("excluded rank -1 is out of range"));
        assert!(msg(shrink_exclusions(4, 0, &[2, 1, 2])).contains("rank 2 is excluded twice"));
        assert!(msg(shrink_exclusions(3, 0, &[2, 0, 1])).contains("excluding all 3 ranks"));
        assert!(msg(shrink_exclusions(3, 1, &[1])).contains("this rank (1) is in the exclude list"));
    }

    #[test]
    fn creation_status_and_cancel() {
        let c = Creation::new("ncclCommInitRankConfig");
        assert_eq!(c.status(), ncclResult_t::ncclInProgress);
        // Queued: cancel does not wait for a job that has not started.
        c.cancel();
        assert!(c.interrupt().is_set());
        let c = Creation::new("ncclCommSplit");
        c.start();
        let handle = register_creation(c.clone());
        let e = lookup(handle, "ncclCommCount").err().unwrap();
        assert_eq!(e.code(), ncclResult_t::ncclInvalidArgument);
        assert!(e.to_string().contains("still being created"), "{e}");
        let job = {
            let (c, token) = (c.clone(), handle as usize);
            std::thread::spawn(move || {
                while !c.interrupt().is_set() {
                    std::thread::sleep(std::time::Duration::from_millis(5));
                }
                finish_creation(token as ncclComm_t, &c, Err(Error::remote("peer gone")));
            })
        };
        c.cancel(); // returns only once the job has stopped
        assert_eq!(c.status(), ncclResult_t::ncclRemoteError);
        assert!(c.failed());
        let e = lookup(handle, "ncclAllReduce").err().unwrap();
        assert_eq!(e.code(), ncclResult_t::ncclRemoteError, "{e}");
        assert!(matches!(unregister(handle, "ncclCommAbort"), Ok(Entry::Creating(_))));
        assert!(entry(handle, "x").is_err());
        job.join().unwrap();
    }
}
