//! What may end a wait early: a communicator's abort flag ([`Interrupt`]) and the
//! no-progress deadline of `FERROCCL_TIMEOUT` ([`Watchdog`]).
//!
//! Owns: the flag shared by a communicator, its connections and whatever thread is blocked in
//! one of its calls; the deadline logic every waiter uses. Not owned: how a waiter sleeps
//! (`coll::exec` polls sockets or yields, the bootstrap polls its socket) nor what counts as
//! progress below it (the transports' and the node area's `progress_mark`s).
//!
//! Cost rule: waiters look at either only when they are about to sleep, never per byte or per
//! step; [`Watchdog::progressed`] is a plain store, and the clock is read only while idle and
//! only when a timeout is configured. A later stream-ordered (CUDA) executor polls the same two
//! things from its host-side waits.
//!
//! Invariants: the flag only ever goes from clear to set; a watchdog fires only after a full
//! timeout in which neither the waiter nor the progress mark it was given moved.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::error::{Error, Result};

/// The abort flag of one communicator: cloned into its connections and read by its waits.
#[derive(Clone, Debug, Default)]
pub struct Interrupt(Arc<AtomicBool>);

impl Interrupt {
    pub fn new() -> Interrupt {
        Interrupt::default()
    }

    /// Asks every wait on this communicator to give up (ncclCommAbort, destroy).
    pub fn trigger(&self) {
        self.0.store(true, Ordering::Release);
    }

    pub fn is_set(&self) -> bool {
        self.0.load(Ordering::Acquire)
    }

    /// Errors once the flag is set; `what` names the wait.
    pub fn check(&self, what: &str) -> Result<()> {
        if self.is_set() {
            return Err(aborted(what));
        }
        Ok(())
    }
}

/// The error a wait returns when its communicator is aborted.
pub fn aborted(what: &str) -> Error {
    Error::invalid_usage(format!("{what}: the communicator was aborted (ncclCommAbort) while this call waited"))
}

/// `FERROCCL_TIMEOUT`, read once: `None` (unset, 0 or negative) waits for ever, as NCCL does.
pub fn progress_timeout() -> Option<Duration> {
    static TIMEOUT: std::sync::OnceLock<Option<Duration>> = std::sync::OnceLock::new();
    *TIMEOUT.get_or_init(|| crate::env::get_seconds_opt("FERROCCL_TIMEOUT"))
}

/// The longest a waiter sleeps between two looks at its interrupt (bootstrap's blocking reads
/// sleep in slices of this; the executor's own sleeps are shorter still).
pub const POLL_SLICE: Duration = Duration::from_millis(100);

/// Watches one wait for a stretch without progress.
///
/// The waiter calls [`Watchdog::progressed`] whenever it moves (cheap), and
/// [`Watchdog::idle`] each time it is about to sleep. The first idle call after progress arms
/// the deadline and records a progress mark (a number that changes whenever something below
/// the waiter moves: bytes on a connection, a peer's counter); when the deadline passes, a
/// changed mark re-arms it instead of firing, so only a full timeout of silence fires.
#[derive(Debug)]
pub struct Watchdog {
    timeout: Option<Duration>,
    armed: Option<Armed>,
}

#[derive(Clone, Copy, Debug)]
struct Armed {
    since: Instant,
    deadline: Instant,
    mark: u64,
}

impl Watchdog {
    /// A watchdog firing after `timeout` without progress; `None` never fires.
    pub fn new(timeout: Option<Duration>) -> Watchdog {
        Watchdog { timeout, armed: None }
    }

    /// Whether a timeout is configured (otherwise `idle` never reads the clock).
    pub fn enabled(&self) -> bool {
        self.timeout.is_some()
    }

    /// The waiter moved: the next idle stretch starts from scratch.
    #[inline]
    pub fn progressed(&mut self) {
        self.armed = None;
    }

    /// The waiter is about to sleep: `Some(idle time)` when nothing moved for the whole
    /// timeout. `mark` is only called when the timeout is configured.
    pub fn idle(&mut self, mark: impl FnOnce() -> u64) -> Option<Duration> {
        self.timeout?;
        self.idle_at(Instant::now(), mark)
    }

    /// [`Watchdog::idle`] at a given time (tests drive the clock).
    pub fn idle_at(&mut self, now: Instant, mark: impl FnOnce() -> u64) -> Option<Duration> {
        let timeout = self.timeout?;
        match self.armed {
            None => {
                self.armed = Some(Armed { since: now, deadline: now + timeout, mark: mark() });
                None
            }
            Some(a) if now < a.deadline => None,
            Some(a) => {
                let m = mark();
                if m != a.mark {
                    // Something moved below the waiter: a fresh stretch starts now.
                    self.armed = Some(Armed { since: now, deadline: now + timeout, mark: m });
                    None
                } else {
                    Some(now.saturating_duration_since(a.since))
                }
            }
        }
    }
}

/// A wall-clock limit for one blocking setup step, checked together with an interrupt: the
/// bootstrap's waits sleep in [`POLL_SLICE`]s and call this between them.
pub fn check_wait(interrupt: Option<&Interrupt>, deadline: Instant, what: &str) -> Result<Duration> {
    if let Some(i) = interrupt {
        i.check(what)?;
    }
    let left = deadline.saturating_duration_since(Instant::now());
    if left.is_zero() {
        return Err(Error::Timeout(format!("{what}: no answer before the deadline")));
    }
    Ok(left.min(POLL_SLICE))
}

#[cfg(test)]
mod tests {
    use super::*;

    const T: Duration = Duration::from_secs(5);

    #[test]
    fn disabled_watchdog_never_fires_nor_asks_for_a_mark() {
        let mut w = Watchdog::new(None);
        assert!(!w.enabled());
        let t0 = Instant::now();
        for s in [0, 10, 1000] {
            assert_eq!(w.idle_at(t0 + Duration::from_secs(s), || panic!("mark read without a timeout")), None);
        }
    }

    #[test]
    fn fires_only_after_a_full_timeout_of_silence() {
        let mut w = Watchdog::new(Some(T));
        let t0 = Instant::now();
        assert_eq!(w.idle_at(t0, || 7), None, "first idle call arms");
        assert_eq!(w.idle_at(t0 + Duration::from_millis(4999), || 7), None);
        assert_eq!(w.idle_at(t0 + T, || 7), Some(T));
        assert_eq!(w.idle_at(t0 + T + Duration::from_secs(1), || 7), Some(T + Duration::from_secs(1)));
    }

    #[test]
    fn progress_resets_the_deadline() {
        let mut w = Watchdog::new(Some(T));
        let t0 = Instant::now();
        w.idle_at(t0, || 0);
        w.progressed();
        // Re-armed at t0 + 4 s: 8 s after t0 is only 4 s of silence.
        assert_eq!(w.idle_at(t0 + Duration::from_secs(4), || 0), None);
        assert_eq!(w.idle_at(t0 + Duration::from_secs(8), || 0), None);
        assert_eq!(w.idle_at(t0 + Duration::from_secs(9), || 0), Some(T));
    }

    #[test]
    fn a_moving_mark_rearms_instead_of_firing() {
        let mut w = Watchdog::new(Some(T));
        let t0 = Instant::now();
        w.idle_at(t0, || 1);
        // Bytes moved below the waiter during the stretch: no timeout, a new stretch.
        assert_eq!(w.idle_at(t0 + T, || 2), None);
        assert_eq!(w.idle_at(t0 + T + Duration::from_secs(4), || 2), None);
        assert_eq!(w.idle_at(t0 + T + T, || 2), Some(T));
    }

    #[test]
    fn mark_is_read_only_when_arming_or_at_the_deadline() {
        let mut w = Watchdog::new(Some(T));
        let t0 = Instant::now();
        let mut reads = 0;
        w.idle_at(t0, || {
            reads += 1;
            0
        });
        for ms in [1, 100, 4000] {
            w.idle_at(t0 + Duration::from_millis(ms), || {
                reads += 1;
                0
            });
        }
        assert_eq!(reads, 1);
    }

    #[test]
    fn interrupt_is_shared_and_sticky() {
        let a = Interrupt::new();
        let b = a.clone();
        assert!(a.check("x").is_ok());
        b.trigger();
        assert!(a.is_set());
        let e = a.check("ncclAllReduce").unwrap_err();
        assert_eq!(e.code(), crate::types::ncclResult_t::ncclInvalidUsage);
        assert!(e.to_string().contains("aborted"), "{e}");
    }

    #[test]
    fn check_wait_slices_and_expires() {
        let far = Instant::now() + Duration::from_secs(60);
        assert_eq!(check_wait(None, far, "x").unwrap(), POLL_SLICE);
        let past = Instant::now() - Duration::from_millis(1);
        assert_eq!(check_wait(None, past, "x").unwrap_err().code(), crate::types::ncclResult_t::ncclTimeout);
        let i = Interrupt::new();
        i.trigger();
        assert_eq!(check_wait(Some(&i), far, "x").unwrap_err().code(), crate::types::ncclResult_t::ncclInvalidUsage);
    }
}
