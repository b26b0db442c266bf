//! The device bytes a load needs, per subgraph ([`crate::Subgraph::device_bytes`]) and for the
//! whole NEFF ([`crate::Neff::device_bytes`]): what the runtime allocates on each NC, with the
//! I/O tensors (which the user binds per execution) counted apart.

use serde::Serialize;

use crate::{Subgraph, VarKind};

/// Device bytes by what they hold. [`DeviceBytes::total`] is what a load allocates; `io` is
/// what the user binds per execution and is not part of it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct DeviceBytes {
    /// `file` constants, each placed at its alignment (sum of sizes rounded up to alignment).
    pub constants: u64,
    /// The `virtual` vars' shared scratchpad: max of `backing_variable_off + size`.
    pub scratchpad: u64,
    /// `tmp-buf` vars.
    pub tmp_buf: u64,
    /// `pointer` vars.
    pub pointer: u64,
    /// The five instruction streams.
    pub streams: u64,
    /// Activation and DVE tables.
    pub tables: u64,
    /// Input and output tensors (bound by the user, not allocated by the load).
    pub io: u64,
}

impl DeviceBytes {
    /// Bytes a load allocates (everything but `io`), saturating.
    pub fn total(&self) -> u64 {
        [
            self.constants,
            self.scratchpad,
            self.tmp_buf,
            self.pointer,
            self.streams,
            self.tables,
        ]
        .iter()
        .fold(0u64, |a, &b| a.saturating_add(b))
    }

    /// Field-wise saturating sum.
    pub fn add(&self, other: &Self) -> Self {
        Self {
            constants: self.constants.saturating_add(other.constants),
            scratchpad: self.scratchpad.saturating_add(other.scratchpad),
            tmp_buf: self.tmp_buf.saturating_add(other.tmp_buf),
            pointer: self.pointer.saturating_add(other.pointer),
            streams: self.streams.saturating_add(other.streams),
            tables: self.tables.saturating_add(other.tables),
            io: self.io.saturating_add(other.io),
        }
    }
}

/// `size` rounded up to `alignment` (a power of two), saturating.
fn align_up(size: u64, alignment: u64) -> u64 {
    let mask = alignment.max(1) - 1;
    size.saturating_add(mask) & !mask
}

pub(crate) fn of(sg: &Subgraph) -> DeviceBytes {
    let mut b = DeviceBytes::default();
    for var in sg.vars.values() {
        match &var.kind {
            VarKind::Input | VarKind::Output => b.io = b.io.saturating_add(var.size),
            VarKind::File { alignment, .. } => {
                b.constants = b.constants.saturating_add(align_up(var.size, *alignment));
            }
            VarKind::Virtual {
                backing_variable_off,
            } => {
                b.scratchpad = b
                    .scratchpad
                    .max(backing_variable_off.saturating_add(var.size))
            }
            VarKind::TmpBuf => b.tmp_buf = b.tmp_buf.saturating_add(var.size),
            VarKind::Pointer => b.pointer = b.pointer.saturating_add(var.size),
            VarKind::StateBuffer | VarKind::DgeTable { .. } => {}
        }
    }
    b.streams = sg.streams.iter().map(|s| s.bytes.len() as u64).sum();
    b.tables = sg
        .act_tables
        .iter()
        .chain(&sg.dve_tables)
        .map(|t| t.bytes.len() as u64)
        .sum();
    b
}
