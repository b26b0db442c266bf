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

/// The error of a system call that made `what` (an eventfd, an epoll instance, a thread):
/// `NRT_RESOURCE` for a limit — the process's descriptors (`EMFILE`, named with its
/// `ulimit -n`), the system's (`ENFILE`), memory (`ENOMEM`) or threads (`EAGAIN`) — else
/// `NRT_FAILURE`; the message names the errno.
pub fn os_error(e: nix::errno::Errno, what: &str) -> NrtError {
    use nix::errno::Errno;
    match e {
        Errno::EMFILE => {
            let limit = nix::sys::resource::getrlimit(nix::sys::resource::Resource::RLIMIT_NOFILE)
                .map_or_else(|_| "?".to_owned(), |(soft, _)| soft.to_string());
            NrtError::new(
                NrtStatus::Resource,
                format!(
                    "creating {what}: {e}: this process's open-file limit (RLIMIT_NOFILE, \
                     ulimit -n) is {limit}, too few for the runtime's eventfds (one per queue \
                     slot of each execution unit) beside the program's own descriptors"
                ),
            )
        }
        Errno::ENFILE | Errno::ENOMEM | Errno::EAGAIN => {
            NrtError::new(NrtStatus::Resource, format!("creating {what}: {e}"))
        }
        _ => NrtError::new(NrtStatus::Failure, format!("creating {what}: {e}")),
    }
}

/// [`os_error`] of an `io::Error` (one that carries no errno is `NRT_FAILURE`).
pub fn io_os_error(e: &std::io::Error, what: &str) -> NrtError {
    match e.raw_os_error() {
        Some(errno) => os_error(nix::errno::Errno::from_raw(errno), what),
        None => NrtError::new(NrtStatus::Failure, format!("creating {what}: {e}")),
    }
}
