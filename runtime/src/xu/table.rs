//! The XU table (`tpb_xus`): every XU of every type of every visible vNC, found by vNC
//! (`tpb_xu_get_by_vcore`) or by xu_id (`tpb_xu_get`).
//!
//! Per vNC (seed 004 §3, async 3.x): COMPUTE queue 0, TENSOR_OP queues 0 and 1, COLLECTIVES
//! queues 0..2. The table holds them as [`ExecutionUnit`]s, since each type has its own
//! completion engine; whoever schedules keeps its typed XU beside the table.

use std::sync::Arc;

use shared::ids::{MAX_VIRTUAL_TPB, XuId, XuType};

use super::execution_unit::ExecutionUnit;

/// Queues per XU type (async 3.x: TENSOR_OP 2, COMPUTE 1, COLLECTIVES 3).
pub const fn queue_count(xu_type: XuType) -> u8 {
    match xu_type {
        XuType::TensorOp => 2,
        XuType::Compute => 1,
        XuType::Collectives => 3,
    }
}

/// Slots per vNC: one per (type, queue).
const SLOTS_PER_VNC: usize = 6;

/// The slot of `(xu_type, queue)` within a vNC's row, if that queue exists.
fn slot(xu_type: XuType, queue: u8) -> Option<usize> {
    if queue >= queue_count(xu_type) {
        return None;
    }
    let base = match xu_type {
        XuType::TensorOp => 0,
        XuType::Compute => 2,
        XuType::Collectives => 3,
    };
    Some(base + usize::from(queue))
}

/// The XU table: [`MAX_VIRTUAL_TPB`] rows of one slot per (type, queue).
#[derive(Debug)]
pub struct XuTable {
    rows: Vec<[Option<Arc<dyn ExecutionUnit>>; SLOTS_PER_VNC]>,
}

impl XuTable {
    /// An empty table.
    pub fn new() -> Self {
        Self {
            rows: (0..MAX_VIRTUAL_TPB).map(|_| Default::default()).collect(),
        }
    }

    /// Puts `xu` at the slot its xu_id names (replacing any XU there).
    ///
    /// # Errors
    /// `xu` back when its xu_id names no slot (a type or queue index that does not exist).
    pub fn insert(&mut self, xu: Arc<dyn ExecutionUnit>) -> Result<(), Arc<dyn ExecutionUnit>> {
        let id = xu.xu_id();
        let Some(cell) = id
            .xu_type()
            .and_then(|t| slot(t, id.queue()))
            .and_then(|s| Some(&mut self.rows.get_mut(usize::from(id.vnc_id()))?[s]))
        else {
            return Err(xu);
        };
        *cell = Some(xu);
        Ok(())
    }

    /// `tpb_xu_get`: the XU `xu_id` names — any type, queue and vNC — or `None` when it names
    /// nothing (an unknown type or queue index, or an uninitialised vNC).
    pub fn get(&self, xu_id: XuId) -> Option<&Arc<dyn ExecutionUnit>> {
        let s = slot(xu_id.xu_type()?, xu_id.queue())?;
        self.rows.get(usize::from(xu_id.vnc_id()))?[s].as_ref()
    }

    /// The XU of `(vnc, xu_type, queue)`, if there is one.
    pub fn get_by(&self, vnc: u32, xu_type: XuType, queue: u8) -> Option<&Arc<dyn ExecutionUnit>> {
        let s = slot(xu_type, queue)?;
        self.rows.get(usize::try_from(vnc).ok()?)?[s].as_ref()
    }

    /// `tpb_xu_get_by_vcore`: every XU of vNC `vnc` (the worker's owned list), in table order
    /// (TENSOR_OP, COMPUTE, COLLECTIVES; by queue).
    pub fn get_by_vcore(&self, vnc: u32) -> impl Iterator<Item = &Arc<dyn ExecutionUnit>> {
        usize::try_from(vnc)
            .ok()
            .and_then(|v| self.rows.get(v))
            .into_iter()
            .flatten()
            .flatten()
    }

    /// The per-vNC groups of XUs, one per vNC with any (what [`super::XuWorkers::start`]
    /// takes).
    pub fn groups(&self) -> Vec<Vec<Arc<dyn ExecutionUnit>>> {
        self.rows
            .iter()
            .map(|row| row.iter().flatten().cloned().collect::<Vec<_>>())
            .filter(|g| !g.is_empty())
            .collect()
    }

    /// Every XU, by vNC then slot.
    pub fn iter(&self) -> impl Iterator<Item = &Arc<dyn ExecutionUnit>> {
        self.rows.iter().flatten().flatten()
    }
}

impl Default for XuTable {
    fn default() -> Self {
        Self::new()
    }
}
