//! Reference-backed NEFF runs (issue 15).
//!
//! TEMPORARY (branch `golden` only): the minimal module the golden files need, until the
//! reference path's own `mod.rs` (bindings, Python worker) lands; on merge keep theirs, which
//! defines the same [`BoundTensor`] and declares `pub mod golden;`.

use std::sync::Arc;

use shared::model::DType;

pub mod golden;

/// One NEFF input or output bound for an execution: where its bytes are in device memory.
#[derive(Clone, Debug)]
pub struct BoundTensor {
    /// The NEFF's tensor name.
    pub name: String,
    /// The NEFF's dtype.
    pub dtype: DType,
    /// The NEFF's shape.
    pub shape: Vec<u64>,
    /// Whether it is an input (else an output).
    pub input: bool,
    /// The chunk holding it.
    pub chunk: Arc<crate::memory::Chunk>,
    /// PA offset of its first byte inside the chunk.
    pub offset: u64,
    /// Bytes.
    pub size: u64,
}
