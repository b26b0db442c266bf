//! A runtime's private simdev (`--private`): the directory holding its socket was made for it
//! by the runtime that started it and holds only the socket and `simdev.log` (its stderr).
//!
//! The runtime removes that directory when it stops simdev (SIGTERM). A runtime that dies first
//! (SIGKILL, a C program's default SIGTERM) cannot, so it has the kernel send simdev
//! [`PARENT_DEATH_SIGNAL`] as it dies (`PR_SET_PDEATHSIG`), a signal it never sends itself.
//! simdev stops on it ([`watch`]) and, its runtime being gone, removes the directory itself
//! ([`Private::clean_up_if_orphaned`]). The signal, not `getppid`, tells: while a killed
//! process's other threads are still being torn down, simdev's parent is one of them. Should
//! the stop hang, a watchdog started with it ([`Private::on_stop`]) cleans up and exits after
//! [`ORPHAN_GRACE`]: no private simdev outlives its runtime for long.
//!
//! Only the socket, `simdev.log` and then the directory itself (`rmdir`, which fails on a
//! directory that holds anything else) are removed: a `--private` given a shared directory
//! (`/tmp`) removes nothing of anyone else's.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Once};
use std::time::Duration;

use nix::unistd::{Pid, getppid};

use crate::server::StopHandle;

/// The signal a private simdev gets when its runtime dies (the runtime sets it as the child's
/// `PR_SET_PDEATHSIG`). SIGUSR1: no one else sends it to a private simdev.
pub const PARENT_DEATH_SIGNAL: nix::sys::signal::Signal =
    shared::child::PRIVATE_SIMDEV_PARENT_DEATH_SIGNAL;

/// The log file the runtime gives a private simdev as its stderr.
pub const LOG_FILE: &str = "simdev.log";

/// How long an orphaned simdev's stop may take before the watchdog ends the process.
pub const ORPHAN_GRACE: Duration = Duration::from_secs(5);

/// What a private simdev cleans up when its runtime is gone.
#[derive(Debug)]
pub struct Private {
    socket: PathBuf,
    dir: PathBuf,
    /// The runtime that started simdev: its parent at start.
    parent: Pid,
    /// [`PARENT_DEATH_SIGNAL`] arrived.
    parent_died: AtomicBool,
    watchdog: Once,
}

impl Private {
    /// The private simdev listening on `socket`, started by the current parent process.
    pub fn new(socket: &Path) -> Self {
        Self {
            socket: socket.to_owned(),
            dir: socket
                .parent()
                .map_or_else(|| PathBuf::from("."), Path::to_owned),
            parent: getppid(),
            parent_died: AtomicBool::new(false),
            watchdog: Once::new(),
        }
    }

    /// Whether the runtime that started simdev is gone: its death signal arrived, or simdev
    /// was re-parented.
    pub fn orphaned(&self) -> bool {
        self.parent_died.load(Ordering::Acquire) || getppid() != self.parent
    }

    /// Records that the runtime died.
    pub fn parent_died(&self) {
        self.parent_died.store(true, Ordering::Release);
    }

    /// Called as a stop is asked for: when the runtime is gone, starts the watchdog that
    /// cleans up and exits should the stop take longer than [`ORPHAN_GRACE`].
    pub fn on_stop(self: &Arc<Self>) {
        if !self.orphaned() {
            return;
        }
        self.watchdog.call_once(|| {
            let this = Arc::clone(self);
            let started = std::thread::Builder::new()
                .name("orphan-watchdog".into())
                .spawn(move || {
                    std::thread::sleep(ORPHAN_GRACE);
                    tracing::warn!(
                        "the runtime that started this private simdev is gone and the stop \
                         took over {ORPHAN_GRACE:?}: exiting"
                    );
                    this.clean_up_if_orphaned();
                    std::process::exit(1);
                });
            if let Err(e) = started {
                tracing::warn!("starting the orphan watchdog: {e}");
            }
        });
    }

    /// When the runtime is gone, removes the socket, `simdev.log` and the directory. Returns
    /// whether it tried.
    pub fn clean_up_if_orphaned(&self) -> bool {
        if !self.orphaned() {
            return false;
        }
        for file in [self.socket.clone(), self.dir.join(LOG_FILE)] {
            if let Err(e) = std::fs::remove_file(&file)
                && e.kind() != std::io::ErrorKind::NotFound
            {
                tracing::warn!("removing {}: {e}", file.display());
            }
        }
        if let Err(e) = std::fs::remove_dir(&self.dir) {
            tracing::warn!("removing the private directory {}: {e}", self.dir.display());
        }
        true
    }
}

/// The thread that waits for [`PARENT_DEATH_SIGNAL`]: it marks `private` orphaned, then stops
/// simdev (`stop`) and starts the watchdog. Call it once per process (it registers a
/// process-wide handler); close the returned handle when simdev has stopped.
///
/// # Errors
/// Registering the handler or starting the thread failed.
pub fn watch(
    private: &Arc<Private>,
    stop: StopHandle,
) -> std::io::Result<signal_hook::iterator::Handle> {
    let mut signals = signal_hook::iterator::Signals::new([PARENT_DEATH_SIGNAL as i32])?;
    let handle = signals.handle();
    let private = Arc::clone(private);
    std::thread::Builder::new()
        .name("parent-death".into())
        .spawn(move || {
            if signals.forever().next().is_some() {
                private.parent_died();
                stop.stop();
                private.on_stop();
            }
        })?;
    Ok(handle)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_simdev_whose_parent_lives_removes_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let socket = dir.path().join("simdev.sock");
        std::fs::write(&socket, b"").unwrap();
        std::fs::write(dir.path().join(LOG_FILE), b"log").unwrap();
        let p = Private::new(&socket);
        assert!(!p.orphaned());
        assert!(!p.clean_up_if_orphaned());
        assert!(socket.exists() && dir.path().join(LOG_FILE).exists());
    }

    #[test]
    fn an_orphan_removes_its_files_and_an_empty_directory_only() {
        for extra in [false, true] {
            let dir = tempfile::tempdir().unwrap();
            let socket = dir.path().join("simdev.sock");
            std::fs::write(&socket, b"").unwrap();
            std::fs::write(dir.path().join(LOG_FILE), b"log").unwrap();
            let other = dir.path().join("someone-else");
            if extra {
                std::fs::write(&other, b"keep").unwrap();
            }
            // As if started by a parent that has since gone: pid 0 is nobody's parent.
            let p = Private::new(&socket);
            assert!(!p.orphaned());
            p.parent_died();
            assert!(p.orphaned());
            assert!(p.clean_up_if_orphaned());
            assert!(!socket.exists() && !dir.path().join(LOG_FILE).exists());
            assert_eq!(dir.path().exists(), extra, "extra file: {extra}");
            if extra {
                assert!(other.exists(), "a file not simdev's stays");
            }
        }
    }
}
