//! Plans by operation shape, per communicator: repeated calls (the common case) skip plan
//! generation. The cache lives in the communicator's upper-layer slot
//! ([`Comm::with_layer_state`]), so it is freed with the communicator.

use std::collections::HashMap;
use std::sync::Arc;

use super::algo::{self, Algorithm, CollArgs, CollKind};
use super::plan::Plan;
use crate::comm::Comm;
use crate::error::Result;

type PlanKey = (CollKind, usize, usize, bool, usize, bool, bool, Algorithm, usize);

/// Plans by shape, with the last one used in front: a loop repeating one call (the common
/// case) compares a key instead of hashing it.
#[derive(Default)]
pub(crate) struct PlanCache {
    last: Option<(PlanKey, Arc<Plan>)>,
    all: HashMap<PlanKey, Arc<Plan>>,
}

/// Plans kept per communicator before the cache starts over.
const PLAN_CACHE_ENTRIES: usize = 512;

impl PlanCache {
    fn get(&mut self, key: &PlanKey) -> Option<Arc<Plan>> {
        if let Some((k, p)) = &self.last {
            if k == key {
                return Some(p.clone());
            }
        }
        let p = self.all.get(key).cloned()?;
        self.last = Some((*key, p.clone()));
        Some(p)
    }

    fn insert(&mut self, key: PlanKey, plan: Arc<Plan>) {
        if self.all.len() >= PLAN_CACHE_ENTRIES {
            self.all.clear();
        }
        self.all.insert(key, plan.clone());
        self.last = Some((key, plan));
    }
}

fn key_of(args: &CollArgs, algorithm: Algorithm, chunk_bytes: usize) -> PlanKey {
    (
        args.kind,
        args.bytes,
        args.root,
        args.in_place,
        args.elem_size,
        args.has_pre,
        args.has_post,
        algorithm,
        chunk_bytes,
    )
}

/// `comm`'s plan for an operation shape, generated once (outside the cache's lock).
pub fn cached_plan(comm: &Comm, args: &CollArgs, algorithm: Algorithm, chunk_bytes: usize) -> Result<Arc<Plan>> {
    let key = key_of(args, algorithm, chunk_bytes);
    if let Some(plan) = comm.with_layer_state(|s: &mut super::LayerState| s.plans.get(&key)) {
        return Ok(plan);
    }
    let plan = Arc::new(algo::plan_with(args, comm.rank, comm.nranks, algorithm, chunk_bytes)?);
    comm.with_layer_state(|s: &mut super::LayerState| s.plans.insert(key, plan.clone()));
    Ok(plan)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(bytes: usize) -> PlanKey {
        (CollKind::AllReduce, bytes, 0, false, 4, false, false, Algorithm::Ring, 1 << 20)
    }

    #[test]
    fn finds_what_it_keeps_and_starts_over_when_full() {
        let mut cache = PlanCache::default();
        let plan = Arc::new(Plan::default());
        assert!(cache.get(&key(1)).is_none());
        cache.insert(key(1), plan.clone());
        cache.insert(key(2), plan.clone());
        assert!(Arc::ptr_eq(&cache.get(&key(1)).unwrap(), &plan), "found in the map");
        assert_eq!(cache.last.as_ref().map(|(k, _)| *k), Some(key(1)), "and moved to the front");
        for b in 3..=PLAN_CACHE_ENTRIES + 1 {
            cache.insert(key(b), plan.clone());
        }
        assert!(cache.all.len() < PLAN_CACHE_ENTRIES, "cleared once full");
        assert!(cache.get(&key(2)).is_none());
        assert!(cache.get(&key(PLAN_CACHE_ENTRIES + 1)).is_some());
    }
}
