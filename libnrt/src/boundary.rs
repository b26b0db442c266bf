//! The entry of every export: logging set up once, the call run under `catch_unwind` (a panic
//! never crosses into C: it is logged and answered with NRT_FAILURE) with the calling thread's
//! POSIX cancellation deferred to its return ([`CancelDeferred`]), its error logged with the
//! function's name and mapped to its NRT_STATUS.

use std::panic::{AssertUnwindSafe, catch_unwind};

use runtime::NrtError;
use shared::NrtStatus;

/// The filter of the logger [`init_logging`] installed, which `nrt_init` sets anew
/// ([`read_log_level`]); unset when the process had a logger of its own.
static FILTER: std::sync::OnceLock<
    tracing_subscriber::reload::Handle<tracing_subscriber::EnvFilter, tracing_subscriber::Registry>,
> = std::sync::OnceLock::new();

/// The filter `NEURON_RT_LOG_LEVEL` asks for now (libnrt's level names, or `tracing`
/// directives; default: errors only, and the warning that a NEFF runs shape-only on simdev). A
/// value that is neither is said on stderr, and the default used.
fn filter_from_env() -> tracing_subscriber::EnvFilter {
    use tracing_subscriber::EnvFilter;
    let default = || {
        EnvFilter::new(format!(
            "error,{}=warn",
            runtime::kmgr::neff_load::SHAPE_ONLY_TARGET
        ))
    };
    match std::env::var("NEURON_RT_LOG_LEVEL") {
        Ok(v) if !v.trim().is_empty() => runtime::config::log_directive(&v)
            .and_then(|d| EnvFilter::try_new(&d).map_err(|e| format!("{v:?}: {e}")))
            .unwrap_or_else(|e| {
                eprintln!("libnrt: {e}; logging errors only");
                default()
            }),
        _ => default(),
    }
}

static LOGGING: std::sync::Once = std::sync::Once::new();

/// Installs a stderr logger filtered by `NEURON_RT_LOG_LEVEL` ([`filter_from_env`]) at the
/// library's first call of any kind, unless the process already has one.
fn init_logging() {
    use tracing_subscriber::layer::SubscriberExt;
    use tracing_subscriber::util::SubscriberInitExt;
    LOGGING.call_once(|| {
        let (filter, handle) = tracing_subscriber::reload::Layer::new(filter_from_env());
        let installed = tracing_subscriber::registry()
            .with(filter)
            .with(
                tracing_subscriber::fmt::layer()
                    .with_writer(std::io::stderr)
                    // A log write that fails (stderr closed or full) is dropped: the default
                    // reports it with `eprintln!`, which panics (in whichever thread logged)
                    // when stderr is what failed.
                    .log_internal_errors(false)
                    .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr())),
            )
            .try_init();
        if installed.is_ok() {
            let _ = FILTER.set(handle);
        }
    });
}

/// `nrt_init` reads `NEURON_RT_LOG_LEVEL`, as libnrt does: a caller that set it after an
/// earlier call (a core count asked before init) or between a close and the next init gets
/// the level it set. Before the logger exists it is installed with that level.
pub fn read_log_level() {
    if !LOGGING.is_completed() {
        init_logging();
        return;
    }
    if let Some(handle) = FILTER.get() {
        let _ = handle.reload(filter_from_env());
    }
}

/// The calling thread's cancellation disabled while this lives, then set back as it was.
///
/// `pthread_cancel` of a thread blocked in a library call acts at the call's next cancellation
/// point (a `read`, `poll` or `nanosleep` of the runtime's), as glibc's forced unwind through
/// the Rust frames; `catch_unwind` cannot let that unwind pass and the process aborted
/// ("FATAL: exception not rethrown"), with the runtime's locks and queues mid-change. With
/// cancellation disabled for the call, a cancel sent meanwhile stays pending and acts at the
/// caller's next cancellation point after the call returned, in the caller's own frames.
struct CancelDeferred {
    old: libc::c_int,
}

// The `libc` crate leaves thread cancellation out (Rust has none); these are POSIX's, with
// glibc's and musl's values.
const PTHREAD_CANCEL_ENABLE: libc::c_int = 0;
const PTHREAD_CANCEL_DISABLE: libc::c_int = 1;
unsafe extern "C" {
    fn pthread_setcancelstate(state: libc::c_int, oldstate: *mut libc::c_int) -> libc::c_int;
}

impl CancelDeferred {
    fn new() -> Self {
        let mut old = PTHREAD_CANCEL_ENABLE;
        // SAFETY: `pthread_setcancelstate` only sets the calling thread's cancellability and
        // writes the previous state into `old`, a valid, exclusively borrowed c_int.
        unsafe { pthread_setcancelstate(PTHREAD_CANCEL_DISABLE, &raw mut old) };
        Self { old }
    }
}

impl Drop for CancelDeferred {
    fn drop(&mut self) {
        let mut ignored = 0;
        // SAFETY: as in `new`; `self.old` is a state `pthread_setcancelstate` itself returned.
        unsafe { pthread_setcancelstate(self.old, &raw mut ignored) };
    }
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
    let _cancel = CancelDeferred::new();
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
    let _cancel = CancelDeferred::new();
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
