//! The backend without the `hwloc` feature: this machine as [`super::flat`] sees it; no
//! XML, no export, no binding.

use std::io;
use std::path::Path;

use super::model::Parts;
use super::CpuSet;
use crate::error::{Error, Result};

fn unsupported(what: &str) -> Error {
    Error::invalid_usage(format!("{what} needs hwloc: ferroccl was built without its `hwloc` feature"))
}

/// Never constructed: without hwloc there is no topology handle.
pub(crate) enum Handle {}

impl Handle {
    pub(crate) fn is_this_system(&self) -> bool {
        match *self {}
    }
    pub(crate) fn export_xml(&self) -> Result<String> {
        match *self {}
    }
    pub(crate) fn export_xml_file(&self, _path: &Path) -> Result<()> {
        match *self {}
    }
    pub(crate) fn bind_thread(&self, _set: &CpuSet) -> io::Result<()> {
        match *self {}
    }
    pub(crate) fn thread_binding(&self) -> io::Result<CpuSet> {
        match *self {}
    }
}

/// The processors this process may run on, as one package and one NUMA node.
pub(crate) fn load_system() -> Result<(Parts, Option<Handle>)> {
    Ok((super::flat::parts(), None))
}

pub(crate) fn load_xml(_xml: &[u8], what: &str) -> Result<(Parts, Option<Handle>)> {
    Err(unsupported(&format!("reading topology XML {what}")))
}
