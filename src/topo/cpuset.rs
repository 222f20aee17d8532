//! [`CpuSet`]: a set of logical processors named by their OS index (the Linux CPU number,
//! as `taskset -c` and `/sys/devices/system/cpu/cpuN` name them). Pure data: converting to
//! and from hwloc bitmaps happens in the hwloc binding.

use std::fmt;
use std::str::FromStr;

use crate::error::{Error, Result};

/// A set of logical processors (hwloc PUs) by OS index. Printed and parsed in the list
/// format `0-3,8,10-11` (`none` when empty).
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct CpuSet {
    /// Sorted, without duplicates.
    cpus: Vec<u32>,
}

impl CpuSet {
    /// The empty set.
    pub fn new() -> Self {
        Self::default()
    }

    /// The processors `first..=last`.
    pub fn range(first: u32, last: u32) -> Self {
        (first..=last).collect()
    }

    /// Parses the list format: comma-separated indices and inclusive ranges (`0-3,8`);
    /// empty text or `none` is the empty set.
    pub fn parse_list(text: &str) -> Result<Self> {
        let text = text.trim();
        if text.is_empty() || text == "none" {
            return Ok(Self::new());
        }
        let mut cpus = Vec::new();
        for part in text.split(',') {
            let part = part.trim();
            let bad = || Error::invalid_argument(format!("cpu list {text:?}: bad element {part:?}"));
            let (first, last) = match part.split_once('-') {
                Some((a, b)) => {
                    (a.trim().parse::<u32>().map_err(|_| bad())?, b.trim().parse::<u32>().map_err(|_| bad())?)
                }
                None => {
                    let cpu = part.parse::<u32>().map_err(|_| bad())?;
                    (cpu, cpu)
                }
            };
            if first > last {
                return Err(bad());
            }
            cpus.extend(first..=last);
        }
        Ok(cpus.into_iter().collect())
    }

    /// Whether the set holds no processor.
    pub fn is_empty(&self) -> bool {
        self.cpus.is_empty()
    }

    /// The number of processors.
    pub fn len(&self) -> usize {
        self.cpus.len()
    }

    /// Whether `cpu` is in the set.
    pub fn contains(&self, cpu: u32) -> bool {
        self.cpus.binary_search(&cpu).is_ok()
    }

    /// The lowest processor, if any.
    pub fn first(&self) -> Option<u32> {
        self.cpus.first().copied()
    }

    /// The processors in increasing order.
    pub fn iter(&self) -> impl Iterator<Item = u32> + '_ {
        self.cpus.iter().copied()
    }

    /// The processors in both sets.
    pub fn intersection(&self, other: &CpuSet) -> CpuSet {
        CpuSet { cpus: self.cpus.iter().copied().filter(|c| other.contains(*c)).collect() }
    }

    /// The processors in either set.
    pub fn union(&self, other: &CpuSet) -> CpuSet {
        self.iter().chain(other.iter()).collect()
    }

    /// Whether the sets share a processor.
    pub fn intersects(&self, other: &CpuSet) -> bool {
        self.cpus.iter().any(|c| other.contains(*c))
    }

    /// Whether every processor of `self` is in `other`.
    pub fn is_subset(&self, other: &CpuSet) -> bool {
        self.cpus.iter().all(|c| other.contains(*c))
    }
}

impl FromIterator<u32> for CpuSet {
    fn from_iter<I: IntoIterator<Item = u32>>(iter: I) -> Self {
        let mut cpus: Vec<u32> = iter.into_iter().collect();
        cpus.sort_unstable();
        cpus.dedup();
        CpuSet { cpus }
    }
}

impl FromStr for CpuSet {
    type Err = Error;

    fn from_str(s: &str) -> Result<Self> {
        Self::parse_list(s)
    }
}

impl fmt::Display for CpuSet {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.cpus.is_empty() {
            return f.write_str("none");
        }
        let mut first_run = true;
        let mut i = 0;
        while i < self.cpus.len() {
            let start = self.cpus[i];
            let mut end = start;
            while i + 1 < self.cpus.len() && self.cpus[i + 1] == end + 1 {
                i += 1;
                end = self.cpus[i];
            }
            if !first_run {
                f.write_str(",")?;
            }
            first_run = false;
            if start == end {
                write!(f, "{start}")?;
            } else {
                write!(f, "{start}-{end}")?;
            }
            i += 1;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn list_format_round_trips() {
        for text in ["none", "0", "0-3", "0-3,8,10-11", "1,3,5"] {
            assert_eq!(CpuSet::parse_list(text).unwrap().to_string(), text);
        }
        assert_eq!(CpuSet::parse_list(" 3, 1-2 ,2 ").unwrap().to_string(), "1-3");
        assert_eq!(CpuSet::parse_list("").unwrap(), CpuSet::new());
        assert_eq!("4-5".parse::<CpuSet>().unwrap(), CpuSet::range(4, 5));
        for bad in ["x", "3-1", "1-", "-1", "1,,2"] {
            let err = CpuSet::parse_list(bad).unwrap_err();
            assert!(matches!(err, Error::InvalidArgument(_)), "{bad}: {err}");
        }
    }

    #[test]
    fn set_operations() {
        let a = CpuSet::range(0, 7);
        let b: CpuSet = [6, 7, 8, 9].into_iter().collect();
        assert_eq!(a.intersection(&b).to_string(), "6-7");
        assert_eq!(a.union(&b).to_string(), "0-9");
        assert!(a.intersects(&b));
        assert!(!a.intersects(&CpuSet::range(8, 9)));
        assert!(CpuSet::range(2, 3).is_subset(&a));
        assert!(!b.is_subset(&a));
        assert!(CpuSet::new().is_subset(&a));
        assert_eq!((a.len(), a.first(), a.contains(7), a.contains(8)), (8, Some(0), true, false));
    }
}
