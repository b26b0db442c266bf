//! A stand-in for the datastore reader's directory scan, replaced by the datastore reader at
//! merge (issue 16): `nrt monitor` and `nrt top` call [`scan`] and are tested against it until
//! then.

use std::path::Path;

use super::snapshot::ProcessSnapshot;

/// Every runtime process's datastore found in `dir` (`NEURON_RT_DATASTORE_DIR` or `/dev/shm`),
/// live ones and stale ones.
///
/// Replaced by the datastore reader at merge: this stub finds none.
pub fn scan(dir: &Path) -> Vec<ProcessSnapshot> {
    let _ = dir;
    Vec::new()
}
