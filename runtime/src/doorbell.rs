//! The doorbell (seed 000 §5): `dlr_kickoff_exec` → `kbl_infer_kickoff` →
//! `ndl_nc_semaphore_increment(nc, INFERENCE_START, 1)`, one per bound TPB, after every TPB was
//! staged (arm all, then fire all). On silicon it is `ioctl(fd, 0x80084E29, {nc, sem, 1})`; on
//! simdev a posted message. It is the only device call on the submit hot path.
//!
//! `exec_kickoff_infer` returns `ndl_nc_semaphore_increment(...) != 0`: whatever the backend's
//! error, the doorbell's status is NRT_FAILURE (1). The backend's error is logged, not returned.
//! One exception: a device that is gone (simdev's connection closed, the driver's device
//! vanished: [`DeviceError::Disconnected`]) is NRT_HW_ERROR (6), as every other call reports
//! it — else a lost device would be 1 or 6 by whether it went between executions or during
//! one, and a pipeline sorting infrastructure failures by status would misfile it.

use shared::NrtStatus;
use shared::sequencer::SEM_INFERENCE_START;

use crate::backend::{Device, DeviceError};
use crate::error::NrtError;

/// Rings the INFERENCE_START doorbell of each NC in `ncs`, in order; stops at the first
/// failure, logging "Failed to post inference request".
///
/// # Errors
/// NRT_FAILURE naming the NC and the backend's error (the caller poisons the XU);
/// NRT_HW_ERROR when the device is gone.
pub fn kickoff_exec(device: &dyn Device, ncs: &[u32]) -> Result<(), NrtError> {
    for &nc in ncs {
        tracing::trace!(target: "nrt::submit", nc, "doorbell");
        device
            .semaphore_increment(nc, SEM_INFERENCE_START, 1)
            .map_err(|e| {
                tracing::error!(nc, error = %e, "Failed to post inference request");
                let status = match e {
                    DeviceError::Disconnected { .. } => NrtStatus::HwError,
                    _ => NrtStatus::Failure,
                };
                NrtError::new(
                    status,
                    format!("Failed to post inference request on NC {nc}: {e}"),
                )
            })?;
    }
    Ok(())
}

#[cfg(test)]
mod tests;
