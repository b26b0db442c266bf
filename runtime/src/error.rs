//! The runtime's error: an `NRT_STATUS` and a message naming what was wrong.

use shared::NrtStatus;

/// A failed runtime call: the status libnrt returns and a sentence saying why (naming the
/// tensor, model, core or value at fault).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{status}: {message}")]
pub struct NrtError {
    /// The status code.
    pub status: NrtStatus,
    /// What was wrong.
    pub message: String,
}

impl NrtError {
    /// An error with `status` and `message`.
    pub fn new(status: NrtStatus, message: impl Into<String>) -> Self {
        Self {
            status,
            message: message.into(),
        }
    }
}

/// An error and its sources, joined with ": ": what a message shows of a layered error.
pub fn chain(e: &dyn std::error::Error) -> String {
    let mut message = e.to_string();
    let mut src = e.source();
    while let Some(s) = src {
        message.push_str(": ");
        message.push_str(&s.to_string());
        src = s.source();
    }
    message
}

impl From<crate::backend::DeviceError> for NrtError {
    fn from(e: crate::backend::DeviceError) -> Self {
        Self {
            status: e.status(),
            message: chain(&e),
        }
    }
}

/// Result of a runtime call.
pub type NrtResult<T> = Result<T, NrtError>;
