//! Core reservation at `nrt_init` (`reference/nrt-api.md` §3): which logical cores this
//! process takes, claiming their NCs, and resetting them.
//!
//! - `NEURON_RT_VISIBLE_CORES` (or neither variable: every core) fixes the set: each of its
//!   NCs is claimed, and one owned by another process fails init with NRT_EXEC_NC_BUSY naming
//!   it, as libnrt does.
//! - `NEURON_RT_NUM_CORES=N` reserves N *free* logical cores: they are tried in index order,
//!   a busy one skipped (with LNC=2 a logical core is free only when both its NCs are; a
//!   half-claimed one is given back). Fewer than N free fails init with NRT_LOAD_NOT_ENOUGH_NC
//!   naming how many were free, and gives back every NC claimed on the way.
//! - `NEURON_RT_RESET_CORES` (default on): every reserved NC is then reset through
//!   [`Device::nc_reset`] (the driver's NC_RESET), so nothing a previous user left on it —
//!   semaphores, events, queues, sequencer state — reaches this runtime.
//!
//! Invariant: on error nothing stays claimed; on success the claims are in NC order of the
//! logical cores returned, which are in index order.

use shared::NrtStatus;

use crate::backend::{ClaimedNc, Device, DeviceError};
use crate::config::CoreSelection;
use crate::error::{NrtError, NrtResult};

/// The reserved logical cores: each one's physical NCs, and the claims.
#[derive(Debug)]
pub struct Reservation {
    /// The physical NCs of each reserved logical core, in logical-core order.
    pub vncs: Vec<Vec<u32>>,
    /// One claim per physical NC.
    pub claimed: Vec<ClaimedNc>,
}

/// Gives back every NC in `claimed` (errors ignored: this is cleanup).
pub fn release_all(device: &dyn Device, claimed: &[ClaimedNc]) {
    for c in claimed {
        let _ = device.release_nc(c.nc);
    }
}

fn claim_error(nc: u32, e: DeviceError) -> NrtError {
    let mut err = NrtError::from(e);
    err.message = format!("claiming NC {nc}: {}", err.message);
    err
}

/// Claims the NCs of one logical core; all or none. `Ok(None)` when one is busy and `skip_busy`
/// (the NCs claimed before it are given back).
fn claim_vnc(
    device: &dyn Device,
    ncs: &[u32],
    skip_busy: bool,
) -> NrtResult<Option<Vec<ClaimedNc>>> {
    let mut taken = Vec::with_capacity(ncs.len());
    for &nc in ncs {
        match device.claim_nc(nc) {
            Ok(c) => taken.push(c),
            Err(e) => {
                release_all(device, &taken);
                if skip_busy && e.status() == NrtStatus::ExecNcBusy {
                    tracing::debug!(nc, "NC busy; trying the next logical core");
                    return Ok(None);
                }
                return Err(claim_error(nc, e));
            }
        }
    }
    Ok(Some(taken))
}

/// Reserves the logical cores `selection` asks for, out of `logical` cores of `lnc` NCs each,
/// and resets their NCs when `reset` (see the module doc).
///
/// # Errors
/// NRT_EXEC_NC_BUSY naming the NC (a fixed set), NRT_LOAD_NOT_ENOUGH_NC naming how many were
/// free (`Free`), or the device's error for a failed claim or reset.
pub fn reserve(
    device: &dyn Device,
    selection: CoreSelection,
    logical: u32,
    lnc: u32,
    reset: bool,
) -> NrtResult<Reservation> {
    let ncs_of = |v: u32| -> Vec<u32> { (v * lnc..(v + 1) * lnc).collect() };
    let mut vncs = Vec::new();
    let mut claimed = Vec::new();
    match selection {
        CoreSelection::Fixed { first, count } => {
            for v in first..first + count {
                let ncs = ncs_of(v);
                match claim_vnc(device, &ncs, false) {
                    Ok(taken) => claimed.extend(taken.unwrap_or_default()),
                    Err(mut e) => {
                        release_all(device, &claimed);
                        if e.status == NrtStatus::ExecNcBusy {
                            e.message = format!(
                                "logical core {v} is in use by another process ({}); choose \
                                 other cores with NEURON_RT_VISIBLE_CORES, or set \
                                 NEURON_RT_NUM_CORES to take any free ones",
                                e.message
                            );
                        }
                        return Err(e);
                    }
                }
                vncs.push(ncs);
            }
        }
        CoreSelection::Free { count } => {
            let mut busy = Vec::new();
            for v in 0..logical {
                if vncs.len() == count as usize {
                    break;
                }
                let ncs = ncs_of(v);
                match claim_vnc(device, &ncs, true) {
                    Ok(Some(taken)) => {
                        claimed.extend(taken);
                        vncs.push(ncs);
                    }
                    Ok(None) => busy.push(v),
                    Err(e) => {
                        release_all(device, &claimed);
                        return Err(e);
                    }
                }
            }
            if vncs.len() < count as usize {
                release_all(device, &claimed);
                let busy: Vec<String> = busy.iter().map(u32::to_string).collect();
                let owned = match busy.len() {
                    0 => String::new(),
                    1 => format!(" (logical core {} is owned by another process)", busy[0]),
                    _ => format!(
                        " (logical cores {} are owned by other processes)",
                        busy.join(", ")
                    ),
                };
                return Err(NrtError::new(
                    NrtStatus::LoadNotEnoughNc,
                    format!(
                        "NEURON_RT_NUM_CORES={count}: only {} of the device's {logical} logical \
                         cores are free{owned}",
                        vncs.len()
                    ),
                ));
            }
        }
    }
    if reset {
        for c in &claimed {
            if let Err(e) = device.nc_reset(c.nc) {
                release_all(device, &claimed);
                let mut err = NrtError::from(e);
                err.message = format!("resetting NC {} at init: {}", c.nc, err.message);
                return Err(err);
            }
        }
    }
    Ok(Reservation { vncs, claimed })
}
