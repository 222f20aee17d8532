//! The registration cache: memory regions registered with the HCA, shared by every request
//! that uses the same pages, as NCCL's IB plugin does.
//!
//! A registration covers whole pages; a request whose range lies inside a live registration
//! of the same kind and access takes a reference to it instead of registering again. When
//! the last reference goes the registration is released (deregistered), except for
//! registrations made with [`RegCache::pin`] (the transport's own long-lived buffers, such
//! as the CTS FIFO), which stay until the cache is dropped. Releasing at the last reference,
//! rather than keeping registrations of user memory around, is deliberate: without hooks on
//! `free`/`munmap`, a registration kept after its memory was freed and its addresses reused
//! would point the HCA at the old pages.
//!
//! Host memory is registered by address; device memory through a dma-buf file descriptor
//! (`ibv_reg_dmabuf_mr`) where the CUDA driver can export one. The actual calls are behind
//! [`Registrar`] (`verbs` implements it; the tests count calls).

use std::collections::HashMap;

use crate::error::Result;

/// What a registration must allow.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Access {
    /// Source of RDMA writes (local read only).
    Local,
    /// Destination of the peer's RDMA writes.
    RemoteWrite,
}

/// Where the memory is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum MemKind {
    Host,
    /// CUDA device memory (registered via dma-buf).
    Device,
}

/// The keys of a registration.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Keys {
    pub lkey: u32,
    pub rkey: u32,
}

/// Registers and deregisters page ranges with the HCA.
pub trait Registrar {
    /// An opaque registration (an `ibv_mr` in the verbs edge).
    type Mr;
    fn register(&mut self, kind: MemKind, addr: u64, len: usize, access: Access) -> Result<(Self::Mr, Keys)>;
    fn deregister(&mut self, mr: Self::Mr);
}

struct Entry<M> {
    mr: Option<M>,
    kind: MemKind,
    access: Access,
    start: u64,
    end: u64,
    keys: Keys,
    refs: usize,
    pinned: bool,
}

/// A reference to a cached registration; give it back with [`RegCache::release`].
#[derive(Debug, PartialEq, Eq)]
#[must_use = "a registration reference must be released"]
pub struct RegRef {
    id: u64,
    pub keys: Keys,
}

impl RegRef {
    /// A reference not backed by a cache (test fabrics).
    #[cfg(test)]
    pub(crate) fn for_tests(id: u64, keys: Keys) -> RegRef {
        RegRef { id, keys }
    }
}

/// The cache, over any [`Registrar`].
pub struct RegCache<R: Registrar> {
    registrar: R,
    page: u64,
    entries: HashMap<u64, Entry<R::Mr>>,
    next_id: u64,
    /// Registrations made (for tests and the TRACE line).
    pub registered: u64,
}

impl<R: Registrar> RegCache<R> {
    /// `page`: the page size (a power of two).
    pub fn new(registrar: R, page: u64) -> RegCache<R> {
        assert!(page.is_power_of_two(), "page size {page}");
        RegCache { registrar, page, entries: HashMap::new(), next_id: 1, registered: 0 }
    }

    pub fn registrar(&mut self) -> &mut R {
        &mut self.registrar
    }

    fn lookup(&mut self, kind: MemKind, addr: u64, len: usize, access: Access, pinned: bool) -> Result<RegRef> {
        let end = addr
            .checked_add(len as u64)
            .ok_or_else(|| crate::error::Error::invalid_argument("buffer wraps the address space"))?;
        if let Some((&id, e)) = self
            .entries
            .iter_mut()
            .find(|(_, e)| e.kind == kind && e.access == access && e.start <= addr && end <= e.end && e.mr.is_some())
        {
            e.refs += 1;
            e.pinned |= pinned;
            return Ok(RegRef { id, keys: e.keys });
        }
        let start = addr & !(self.page - 1);
        let stop = end.div_ceil(self.page).max(start / self.page + 1) * self.page;
        let (mr, keys) = self.registrar.register(kind, start, (stop - start) as usize, access)?;
        self.registered += 1;
        let id = self.next_id;
        self.next_id += 1;
        self.entries.insert(id, Entry { mr: Some(mr), kind, access, start, end: stop, keys, refs: 1, pinned });
        Ok(RegRef { id, keys })
    }

    /// A reference to a registration covering `addr..addr+len`, registering its pages if no
    /// live registration covers them.
    pub fn acquire(&mut self, kind: MemKind, addr: u64, len: usize, access: Access) -> Result<RegRef> {
        self.lookup(kind, addr, len, access, false)
    }

    /// As [`RegCache::acquire`], and kept registered after the last release (for memory the
    /// transport owns for the connection's life).
    pub fn pin(&mut self, kind: MemKind, addr: u64, len: usize, access: Access) -> Result<RegRef> {
        self.lookup(kind, addr, len, access, true)
    }

    /// Gives a reference back; the last one deregisters (unless pinned).
    pub fn release(&mut self, r: RegRef) {
        let Some(e) = self.entries.get_mut(&r.id) else {
            return;
        };
        e.refs = e.refs.saturating_sub(1);
        if e.refs == 0 && !e.pinned {
            if let Some(e) = self.entries.remove(&r.id) {
                if let Some(mr) = e.mr {
                    self.registrar.deregister(mr);
                }
            }
        }
    }

    /// Registrations alive now.
    pub fn live(&self) -> usize {
        self.entries.len()
    }
}

impl<R: Registrar> Drop for RegCache<R> {
    fn drop(&mut self) {
        for (_, e) in self.entries.drain() {
            if let Some(mr) = e.mr {
                self.registrar.deregister(mr);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::Error;

    /// Counts calls; registration `n` gets keys (n, n + 1000).
    #[derive(Default)]
    struct Counting {
        calls: Vec<(MemKind, u64, usize, Access)>,
        deregistered: Vec<u32>,
        fail: bool,
    }

    impl Registrar for Counting {
        type Mr = u32;
        fn register(&mut self, kind: MemKind, addr: u64, len: usize, access: Access) -> Result<(u32, Keys)> {
            if self.fail {
                return Err(Error::system("ibv_reg_mr", std::io::Error::from_raw_os_error(libc::ENOMEM)));
            }
            self.calls.push((kind, addr, len, access));
            let n = self.calls.len() as u32;
            Ok((n, Keys { lkey: n, rkey: n + 1000 }))
        }
        fn deregister(&mut self, mr: u32) {
            self.deregistered.push(mr);
        }
    }

    #[test]
    fn ranges_within_a_live_registration_share_it() {
        let mut c = RegCache::new(Counting::default(), 4096);
        let a = c.acquire(MemKind::Host, 0x10010, 100, Access::Local).unwrap();
        assert_eq!(c.registrar().calls, vec![(MemKind::Host, 0x10000, 4096, Access::Local)], "whole pages");
        let b = c.acquire(MemKind::Host, 0x10800, 0x800, Access::Local).unwrap();
        assert_eq!(b.keys, a.keys, "same pages, same registration");
        assert_eq!(c.registered, 1);
        // Crossing the page end, another access or another kind: new registrations.
        let d = c.acquire(MemKind::Host, 0x10ff0, 0x20, Access::Local).unwrap();
        assert_eq!(c.registrar().calls[1], (MemKind::Host, 0x10000, 8192, Access::Local));
        let e = c.acquire(MemKind::Host, 0x10010, 100, Access::RemoteWrite).unwrap();
        let f = c.acquire(MemKind::Device, 0x10010, 100, Access::Local).unwrap();
        assert_eq!(c.registered, 4);
        assert_eq!(c.live(), 4);
        for r in [a, d, e, f] {
            c.release(r);
        }
        assert_eq!(c.live(), 1, "b still holds the first registration");
        c.release(b);
        assert_eq!(c.live(), 0);
        assert_eq!(c.registrar().deregistered.len(), 4);
    }

    #[test]
    fn the_last_release_deregisters_so_reused_addresses_register_again() {
        let mut c = RegCache::new(Counting::default(), 4096);
        let a = c.acquire(MemKind::Host, 0x20000, 10, Access::RemoteWrite).unwrap();
        c.release(a);
        assert_eq!(c.registrar().deregistered, vec![1]);
        let b = c.acquire(MemKind::Host, 0x20000, 10, Access::RemoteWrite).unwrap();
        assert_eq!(b.keys.lkey, 2, "registered afresh");
        c.release(b);
    }

    #[test]
    fn pinned_registrations_stay_until_the_cache_goes() {
        let mut c = RegCache::new(Counting::default(), 4096);
        let p = c.pin(MemKind::Host, 0x30000, 4096, Access::RemoteWrite).unwrap();
        c.release(p);
        assert_eq!(c.live(), 1);
        let again = c.acquire(MemKind::Host, 0x30100, 16, Access::RemoteWrite).unwrap();
        assert_eq!(c.registered, 1, "the pinned one serves later requests");
        c.release(again);
        assert_eq!(c.live(), 1);
        let registrar_calls = c.registrar().deregistered.len();
        assert_eq!(registrar_calls, 0);
        // Dropping the cache deregisters what is left.
        struct Probe(std::rc::Rc<std::cell::Cell<u32>>);
        impl Registrar for Probe {
            type Mr = ();
            fn register(&mut self, _: MemKind, _: u64, _: usize, _: Access) -> Result<((), Keys)> {
                Ok(((), Keys { lkey: 1, rkey: 2 }))
            }
            fn deregister(&mut self, _: ()) {
                self.0.set(self.0.get() + 1);
            }
        }
        let count = std::rc::Rc::new(std::cell::Cell::new(0));
        let mut c2 = RegCache::new(Probe(count.clone()), 4096);
        let p = c2.pin(MemKind::Host, 0x1000, 1, Access::Local).unwrap();
        c2.release(p);
        drop(c2);
        assert_eq!(count.get(), 1);
    }

    #[test]
    fn zero_length_and_failures() {
        let mut c = RegCache::new(Counting::default(), 4096);
        let z = c.acquire(MemKind::Host, 0x5000, 0, Access::Local).unwrap();
        assert_eq!(c.registrar().calls[0].2, 4096, "an empty range still gets a page");
        c.release(z);
        c.registrar().fail = true;
        let e = c.acquire(MemKind::Host, 0x9000, 1, Access::Local).unwrap_err();
        assert!(e.to_string().contains("ibv_reg_mr"), "{e}");
        assert_eq!(c.live(), 0);
        assert!(c.acquire(MemKind::Host, u64::MAX - 1, 10, Access::Local).is_err());
    }
}
