//! A communicator's creation (init, split, shrink) run as NCCL runs it: a blocking
//! communicator exists when the call (or its group) returns; a non-blocking one gets its handle
//! at once and is made by a job on a thread of its own, while `ncclCommGetAsyncError` on that
//! handle (and, for split and shrink, on the parent, which NCCL programs poll) reports
//! ncclInProgress.
//!
//! Owns: the job around a creation (handle, start, outcome, parent marking). Not here: how a
//! communicator is made (`comm`), when jobs run (`group`), C pointers (`ffi` hands in a
//! closure that writes the caller's handle).

use std::sync::Arc;

use crate::comm::{self, Comm, Creation};
use crate::error::{Error, Result};
use crate::group::{self, InitTask, Progress};
use crate::interrupt::Interrupt;
use crate::types::ncclComm_t;

/// Makes the communicator; `None` for a split's NCCL_SPLIT_NOCOLOR rank. The interrupt ends
/// its waits early (abort of the new handle) and becomes the new communicator's abort flag.
pub type Make = Box<dyn FnOnce(Interrupt) -> Result<Option<Arc<Comm>>> + Send>;

/// How one creation runs.
pub struct Request {
    /// The C function, for messages.
    pub function: &'static str,
    /// The mode that decides whether the call waits: the new communicator's for init, the
    /// parent's for split and shrink (NCCL queues those jobs on the parent).
    pub blocking: bool,
    /// NCCL wraps every creation call in a group of its own except ncclCommInitRank, which
    /// outside a group therefore runs on the calling thread even when non-blocking.
    pub own_group: bool,
    /// False for a split's NCCL_SPLIT_NOCOLOR rank: it takes part, gets no communicator.
    pub makes_comm: bool,
    /// The communicator split or shrunk.
    pub parent: Option<Arc<Comm>>,
}

/// Runs or queues the creation. `publish` writes the caller's handle: NULL at once, then the
/// communicator when it exists (blocking), or at once the handle of the communicator being
/// made (non-blocking; NULL for NCCL_SPLIT_NOCOLOR).
pub fn create(req: Request, make: Make, publish: impl Fn(ncclComm_t) + Send + 'static) -> Result<Progress> {
    let task = if req.blocking {
        publish(std::ptr::null_mut());
        InitTask::blocking(move || {
            let made = make(Interrupt::new())?;
            publish(made.map_or(std::ptr::null_mut(), comm::register_handle));
            Ok(())
        })
    } else {
        background_task(&req, make, publish)
    };
    if req.own_group {
        group::init(task)
    } else {
        group::init_ungrouped(task)
    }
}

fn background_task(req: &Request, make: Make, publish: impl Fn(ncclComm_t)) -> InitTask {
    let creation = req.makes_comm.then(|| Creation::new(req.function));
    let handle = creation.as_ref().map_or(std::ptr::null_mut(), |c| comm::register_creation(c.clone()));
    publish(handle);
    let parent = req.parent.clone();
    if let Some(p) = &parent {
        p.begin_background();
    }
    let (function, token) = (req.function, handle as usize);
    InitTask::background(move || {
        let handle = token as ncclComm_t;
        let interrupt = match &creation {
            Some(c) => {
                c.start();
                c.interrupt().clone()
            }
            None => Interrupt::new(),
        };
        let made = make(interrupt);
        let failure = made.as_ref().err().map(Error::duplicate);
        match (creation, made) {
            (Some(c), Ok(Some(comm))) => comm::finish_creation(handle, &c, Ok(comm)),
            (Some(c), Ok(None)) => {
                comm::finish_creation(handle, &c, Err(Error::internal(format!("{function}: no communicator made"))))
            }
            (Some(c), Err(e)) => comm::finish_creation(handle, &c, Err(e)),
            (None, Ok(made)) => {
                if let Some(comm) = made {
                    comm.abort(); // a NOCOLOR rank never gets one; nothing to hand it to
                }
            }
            (None, Err(e)) => log::warn!(target: "INIT", "{function}: {e}"),
        }
        if let Some(p) = parent {
            p.end_background(failure.as_ref());
        }
        failure.map_or(Ok(()), Err)
    })
}
