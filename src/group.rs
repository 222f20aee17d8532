//! Group semantics: ncclGroupStart/End nest per thread; calls inside a group are queued and
//! run together by the outermost ncclGroupEnd, which returns once every queued operation is
//! complete for this rank (host buffers may then be reused). Outside a group each call is a
//! group of one.

use std::cell::RefCell;
use std::sync::Arc;

use crate::coll::{self, OpRequest};
use crate::comm::Comm;
use crate::error::{Error, Result};

/// A deferred communicator creation (ncclCommInitRank* inside a group).
pub type InitTask = Box<dyn FnOnce() -> Result<()> + Send>;

#[derive(Default)]
struct GroupState {
    depth: u32,
    ops: Vec<(Arc<Comm>, OpRequest)>,
    inits: Vec<InitTask>,
}

thread_local! {
    static GROUP: RefCell<GroupState> = RefCell::new(GroupState::default());
}

pub fn start() {
    GROUP.with(|g| g.borrow_mut().depth += 1);
}

pub fn depth() -> u32 {
    GROUP.with(|g| g.borrow().depth)
}

/// Ends one nesting level; the outermost runs everything queued.
pub fn end() -> Result<()> {
    let (inits, ops) = GROUP.with(|g| {
        let mut g = g.borrow_mut();
        if g.depth == 0 {
            return Err(Error::invalid_usage("ncclGroupEnd: not inside a group (ncclGroupStart missing)"));
        }
        g.depth -= 1;
        if g.depth > 0 {
            return Ok((Vec::new(), Vec::new()));
        }
        Ok((std::mem::take(&mut g.inits), std::mem::take(&mut g.ops)))
    })?;
    run_inits(inits)?;
    run_ops(ops)
}

/// Queues an init in the current group, or runs it now outside one.
pub fn init(task: InitTask) -> Result<()> {
    let queued = GROUP.with(|g| {
        let mut g = g.borrow_mut();
        if g.depth > 0 {
            g.inits.push(task);
            None
        } else {
            Some(task)
        }
    });
    match queued {
        Some(task) => task(),
        None => Ok(()),
    }
}

/// Queues an operation in the current group, or runs it now outside one.
pub fn enqueue(comm: Arc<Comm>, req: OpRequest) -> Result<()> {
    let queued = GROUP.with(|g| {
        let mut g = g.borrow_mut();
        if g.depth > 0 {
            g.ops.push((comm, req));
            None
        } else {
            Some((comm, req))
        }
    });
    match queued {
        Some((comm, req)) if req.mem.is_device() => coll::stream::submit(vec![(comm, req)]),
        Some((comm, req)) => {
            coll::stream::drain_current_thread();
            let result = coll::run_one(&comm, &req);
            if let Err(e) = &result {
                comm.set_async_error(e);
            }
            result
        }
        None => Ok(()),
    }
}

/// Inits of one group join each other (ranks of one communicator driven from one thread),
/// so each runs on its own thread.
fn run_inits(inits: Vec<InitTask>) -> Result<()> {
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
