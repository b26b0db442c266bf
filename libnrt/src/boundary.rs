//! The entry of every export: logging set up once, the call run under `catch_unwind` (a panic
//! never crosses into C: it is logged and answered with NRT_FAILURE), its error logged with the
//! function's name and mapped to its NRT_STATUS.

use std::panic::{AssertUnwindSafe, catch_unwind};

use runtime::NrtError;
use shared::NrtStatus;

/// Installs a stderr logger filtered by `NEURON_RT_LOG_LEVEL` (libnrt's level names, or
/// `tracing` directives; default: errors only, and the warning that a NEFF runs shape-only on
/// simdev), unless the process already has one. A value that is neither is said on stderr,
/// and the default used.
fn init_logging() {
    use tracing_subscriber::EnvFilter;
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        let default = || {
            EnvFilter::new(format!(
                "error,{}=warn",
                runtime::kmgr::neff_load::SHAPE_ONLY_TARGET
            ))
        };
        let filter = match std::env::var("NEURON_RT_LOG_LEVEL") {
            Ok(v) if !v.trim().is_empty() => runtime::config::log_directive(&v)
                .and_then(|d| EnvFilter::try_new(&d).map_err(|e| format!("{v:?}: {e}")))
                .unwrap_or_else(|e| {
                    eprintln!("libnrt: {e}; logging errors only");
                    default()
                }),
            _ => default(),
        };
        let _ = tracing_subscriber::fmt()
            .with_env_filter(filter)
            .with_writer(std::io::stderr)
            .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
            .try_init();
    });
}

fn panic_message(p: &(dyn std::any::Any + Send)) -> &str {
    p.downcast_ref::<&str>()
        .copied()
        .or_else(|| p.downcast_ref::<String>().map(String::as_str))
        .unwrap_or("(no message)")
}

/// Runs `f` for export `name` and returns its value, or `fallback` after an error or a panic
/// (both logged).
pub fn value<T>(name: &'static str, fallback: T, f: impl FnOnce() -> Result<T, NrtError>) -> T {
    match run(name, f) {
        Ok(v) => v,
        Err(_) => fallback,
    }
}

/// Runs `f` for export `name` and returns its NRT_STATUS: NRT_SUCCESS, the error's status
/// (logged), or NRT_FAILURE after a panic (logged).
pub fn status(name: &'static str, f: impl FnOnce() -> Result<(), NrtError>) -> u32 {
    match run(name, f) {
        Ok(()) => NrtStatus::Success as u32,
        Err(s) => s as u32,
    }
}

/// As [`status`], but an NRT_FAILURE is an answer, not an error: logged at debug level (a
/// tensor-set lookup miss).
pub fn status_quiet_failure(name: &'static str, f: impl FnOnce() -> Result<(), NrtError>) -> u32 {
    status_answering(name, NrtStatus::Failure, f)
}

/// As [`status`], but `answer` is an answer the caller asked for, not an error: logged at
/// debug level (a lookup miss, a poll that finds the work not done).
pub fn status_answering(
    name: &'static str,
    answer: NrtStatus,
    f: impl FnOnce() -> Result<(), NrtError>,
) -> u32 {
    init_logging();
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(Ok(())) => NrtStatus::Success as u32,
        Ok(Err(e)) if e.status == answer => {
            tracing::debug!(target: "nrt", "{name}: {}", e.message);
            e.status as u32
        }
        // The status's name once, as `run` says it.
        Ok(Err(e)) if e.message.contains(e.status.name()) => {
            tracing::error!(target: "nrt", "{name}: {}", e.message);
            e.status as u32
        }
        Ok(Err(e)) => {
            tracing::error!(target: "nrt", "{name}: {} ({})", e.message, e.status.name());
            e.status as u32
        }
        Err(p) => {
            tracing::error!(target: "nrt", "{name}: internal error: {}", panic_message(&*p));
            NrtStatus::Failure as u32
        }
    }
}

fn run<T>(name: &'static str, f: impl FnOnce() -> Result<T, NrtError>) -> Result<T, NrtStatus> {
    init_logging();
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(Ok(v)) => Ok(v),
        // A full queue is an answer the caller retries on, not an error.
        Ok(Err(e)) if e.status == NrtStatus::QueueFull => {
            tracing::debug!(target: "nrt", "{name}: {} ({})", e.message, e.status.name());
            Err(e.status)
        }
        // The status's name once: many messages name it already.
        Ok(Err(e)) if e.message.contains(e.status.name()) => {
            tracing::error!(target: "nrt", "{name}: {}", e.message);
            Err(e.status)
        }
        Ok(Err(e)) => {
            tracing::error!(target: "nrt", "{name}: {} ({})", e.message, e.status.name());
            Err(e.status)
        }
        Err(p) => {
            tracing::error!(target: "nrt", "{name}: internal error: {}", panic_message(&*p));
            Err(NrtStatus::Failure)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_panic_is_nrt_failure_and_an_error_its_status() {
        assert_eq!(status("t", || panic!("boom")), NrtStatus::Failure as u32);
        assert_eq!(
            status("t", || Err(NrtError::new(NrtStatus::Closed, "closed"))),
            14
        );
        assert_eq!(status("t", || Ok(())), 0);
        assert_eq!(value("t", 9usize, || panic!("boom")), 9);
        assert_eq!(
            status_quiet_failure("t", || Err(NrtError::new(NrtStatus::Failure, "miss"))),
            1
        );
    }
}
