//! The runtime datastore: each runtime process's counters in a small shared-memory file that
//! other processes (`nrt monitor`, `nrt top`) map read-only — the counterpart of libnrt's
//! Neuron DataStore (`nrt/nds/neuron_ds.h`).
//!
//! [`snapshot`] holds what a reader sees (plain values). The file's layout, the writer on the
//! execute path and the reader are built on it.

mod scan_stub;
pub mod snapshot;
pub use scan_stub::scan;
