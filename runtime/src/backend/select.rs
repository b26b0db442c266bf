//! Backend selection (placeholder until filled in).
use super::{Device, DeviceError};

/// Which backend to use.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BackendKind {
    /// Pick automatically.
    Auto,
}

/// Options for [`open`].
#[derive(Clone, Debug, Default)]
pub struct OpenOptions;

/// Opens a device.
///
/// # Errors
/// Always, for now.
pub fn open(_opts: &OpenOptions) -> Result<Box<dyn Device>, DeviceError> {
    Err(DeviceError::NoDevice { hint: "not yet".into() })
}
