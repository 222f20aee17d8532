//! Group semantics: ncclGroupStart/End nest per thread; calls inside a group are queued and
//! run together by the outermost ncclGroupEnd, which returns once every queued operation is
//! complete for this rank (host buffers may then be reused). Outside a group each call is a
//! group of one.
//!
//! Communicator creations of non-blocking communicators are the exception: they start on
//! threads of their own and the call (or group end) returns [`Progress::InProgress`], as in
//! NCCL. Operations always complete before the call returns, also on non-blocking
//! communicators (NCCL allows ncclSuccess there), so a non-blocking group of operations ends
//! with ncclSuccess. Unlike NCCL, blocking and non-blocking creations may share a group: the
//! group end starts the non-blocking ones, then runs the blocking ones.

use std::cell::RefCell;
use std::sync::Arc;

use crate::coll::{self, OpRequest};
use crate::comm::Comm;
use crate::error::{Error, Result};

/// A deferred communicator creation (ncclCommInitRank*, split, shrink inside a group).
pub struct InitTask {
    job: Box<dyn FnOnce() -> Result<()> + Send>,
    /// Runs on a thread of its own, not waited for (a non-blocking communicator's creation).
    background: bool,
}

impl InitTask {
    /// A creation the call (or its group end) waits for.
    pub fn blocking(job: impl FnOnce() -> Result<()> + Send + 'static) -> InitTask {
        InitTask { job: Box::new(job), background: false }
    }

    /// A creation that runs on its own thread; `job` reports its outcome itself.
    pub fn background(job: impl FnOnce() -> Result<()> + Send + 'static) -> InitTask {
        InitTask { job: Box::new(job), background: true }
    }
}

/// How a call that may leave work running ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Progress {
    Complete,
    /// Work continues in the background (ncclInProgress): poll ncclCommGetAsyncError.
    InProgress,
}

#[derive(Default)]
struct GroupState {
    depth: u32,
    ops: Vec<(Arc<Comm>, OpRequest)>,
    inits: Vec<InitTask>,
}

thread_local! {
    static GROUP: RefCell<GroupState> = const { RefCell::new(GroupState { depth: 0, ops: Vec::new(), inits: Vec::new() }) };
}

pub fn start() {
    GROUP.with(|g| g.borrow_mut().depth += 1);
}

pub fn depth() -> u32 {
    GROUP.with(|g| g.borrow().depth)
}

/// What the outermost end of a group takes over: its creations and operations.
type Queued = (Vec<InitTask>, Vec<(Arc<Comm>, OpRequest)>);

/// Closes one nesting level for `function`; `Some` with everything queued at the outermost.
fn close_level(function: &str) -> Result<Option<Queued>> {
    GROUP.with(|g| {
        let mut g = g.borrow_mut();
        if g.depth == 0 {
            return Err(Error::invalid_usage(format!("{function}: not inside a group (ncclGroupStart missing)")));
        }
        g.depth -= 1;
        if g.depth > 0 {
            return Ok(None);
        }
        Ok(Some((std::mem::take(&mut g.inits), std::mem::take(&mut g.ops))))
    })
}

/// Ends one nesting level; the outermost runs everything queued.
pub fn end() -> Result<Progress> {
    let Some((inits, ops)) = close_level("ncclGroupEnd")? else { return Ok(Progress::Complete) };
    let progress = run_inits(inits)?;
    run_ops(ops)?;
    Ok(progress)
}

/// Ends one nesting level like [`end`], but the outermost one runs only the group's
/// communicator creations: its operations are dropped, not run, and their estimated time in
/// microseconds comes back instead (`coll::estimate`; `None` for an empty group and for inner
/// levels). `valid`: whether the caller's simulation info is well formed, which, as in NCCL,
/// only the outermost level looks at: there a bad one still closes the group and drops its
/// operations, then fails with ncclInvalidArgument.
pub fn simulate_end(valid: bool) -> Result<(Progress, Option<f32>)> {
    let Some((inits, ops)) = close_level("ncclGroupSimulateEnd")? else { return Ok((Progress::Complete, None)) };
    let progress = run_inits(inits)?;
    if !valid {
        return Err(Error::invalid_argument(format!(
            "ncclGroupSimulateEnd: simInfo not initialised with NCCL_SIM_INFO_INITIALIZER; the group is \
             closed and its {} operation(s) dropped",
            ops.len()
        )));
    }
    Ok((progress, (!ops.is_empty()).then(|| coll::estimate::group_time_us(&ops))))
}

/// Queues a creation in the current group; outside one, runs it as a group of its own (NCCL
/// wraps ncclCommInitRankConfig, split and shrink in one): a blocking one now, a
/// non-blocking one on its own thread.
pub fn init(task: InitTask) -> Result<Progress> {
    match queue_init(task) {
        Some(task) if task.background => spawn_background(task.job).map(|()| Progress::InProgress),
        Some(task) => (task.job)().map(|()| Progress::Complete),
        None => Ok(Progress::Complete),
    }
}

/// [`init`] for ncclCommInitRank, which NCCL does not wrap in a group: outside a group it
/// runs on the calling thread whatever the communicator's mode.
pub fn init_ungrouped(task: InitTask) -> Result<Progress> {
    match queue_init(task) {
        Some(task) => (task.job)().map(|()| Progress::Complete),
        None => Ok(Progress::Complete),
    }
}

/// Queues `task` inside a group; gives it back outside one.
fn queue_init(task: InitTask) -> Option<InitTask> {
    GROUP.with(|g| {
        let mut g = g.borrow_mut();
        if g.depth > 0 {
            g.inits.push(task);
            None
        } else {
            Some(task)
        }
    })
}

fn spawn_background(job: Box<dyn FnOnce() -> Result<()> + Send>) -> Result<()> {
    std::thread::Builder::new()
        .name("ferroccl-init".into())
        .spawn(move || {
            // The job records its outcome in the handle it creates; nobody joins this thread.
            let _ = job();
        })
        .map(|_| ())
        .map_err(|e| Error::system("spawn init thread", e))
}

/// Queues an operation in the current group, or runs it now outside one.
pub fn enqueue(comm: Arc<Comm>, req: OpRequest) -> Result<()> {
    // The request stays where it is unless queued: moving it in and out of the
    // thread-local cost a visible share of a small call.
    if depth() > 0 {
        GROUP.with(|g| g.borrow_mut().ops.push((comm, req)));
        return Ok(());
    }
    if req.mem.is_device() {
        return coll::stream::submit(vec![(comm, req)]);
    }
    coll::stream::drain_current_thread();
    let result = coll::run_one(&comm, &req);
    if let Err(e) = &result {
        comm.set_async_error(e);
    }
    result
}

/// Inits of one group join each other (ranks of one communicator driven from one thread),
/// so each runs on its own thread. Background (non-blocking) ones start first, so that a
/// blocking one waiting for them can finish.
fn run_inits(inits: Vec<InitTask>) -> Result<Progress> {
    let mut progress = Progress::Complete;
    let mut waited = Vec::new();
    for task in inits {
        if task.background {
            spawn_background(task.job)?;
            progress = Progress::InProgress;
        } else {
            waited.push(task.job);
        }
    }
    run_blocking_inits(waited)?;
    Ok(progress)
}

fn run_blocking_inits(inits: Vec<Box<dyn FnOnce() -> Result<()> + Send>>) -> Result<()> {
    match inits.len() {
        0 => Ok(()),
        1 => inits.into_iter().next().expect("one")(),
        _ => {
            let handles: Vec<_> = inits
                .into_iter()
                .map(|t| std::thread::Builder::new().name("ferroccl-init".into()).spawn(t))
                .collect::<std::io::Result<_>>()
                .map_err(|e| Error::system("spawn init thread", e))?;
            let mut first_err = None;
            for h in handles {
                let r = h.join().unwrap_or_else(|_| Err(Error::internal("init thread panicked")));
                if let Err(e) = r {
                    first_err.get_or_insert(e);
                }
            }
            first_err.map_or(Ok(()), Err)
        }
    }
}

fn run_ops(ops: Vec<(Arc<Comm>, OpRequest)>) -> Result<()> {
    if ops.is_empty() {
        return Ok(());
    }
    if ops.iter().any(|(_, r)| r.mem.is_device()) {
        return coll::stream::submit(ops);
    }
    coll::stream::drain_current_thread();
    let by_comm = coll::by_communicator(ops);
    let result = coll::run(&by_comm);
    if let Err(e) = &result {
        for (comm, _) in &by_comm {
            comm.set_async_error(e);
        }
    }
    result
}
