//! What transports need from the setup channel while connecting: an all-gather among the
//! communicator's ranks. `bootstrap::Bootstrap` implements it; keeping the trait here lets
//! the transports sit below the bootstrap (which uses their TCP building blocks).

use crate::error::Result;

/// An all-gather among the ranks of one communicator, in rank order.
pub trait Exchange {
    fn rank(&self) -> usize;
    fn nranks(&self) -> usize;
    /// Every rank's `mine` (all the same length), concatenated in rank order.
    fn all_gather(&mut self, mine: &[u8]) -> Result<Vec<u8>>;
}
