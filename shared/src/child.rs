//! Child processes that do not outlive their parent: a simdev started by the runtime, a
//! client process started by the scenario runner.
//!
//! Linux delivers the parent-death signal (`PR_SET_PDEATHSIG`) when the *thread* that spawned
//! the child exits, not only when the whole process does: spawn from a thread that lives as
//! long as the child should.

use std::process::Command;

use nix::sys::signal::Signal;

/// The parent-death signal of a runtime's private simdev (`simdev --private`), which stops
/// and removes its directory on it: SIGUSR1, which nothing else sends a private simdev, so
/// simdev can tell its runtime's death from the runtime's own SIGTERM.
pub const PRIVATE_SIMDEV_PARENT_DEATH_SIGNAL: Signal = Signal::SIGUSR1;

/// Makes the child that `cmd` spawns get `SIGKILL` when the thread spawning it exits
/// (`prctl(PR_SET_PDEATHSIG, SIGKILL)` between fork and exec). Returns `cmd`, for chaining.
pub fn kill_with_parent(cmd: &mut Command) -> &mut Command {
    signal_with_parent(cmd, Signal::SIGKILL)
}

/// Makes the child that `cmd` spawns get `signal` when the thread spawning it exits
/// (`prctl(PR_SET_PDEATHSIG, signal)` between fork and exec): `SIGTERM` for a child that
/// cleans up after itself as it stops. Returns `cmd`, for chaining.
pub fn signal_with_parent(cmd: &mut Command, signal: Signal) -> &mut Command {
    // SAFETY: the closure runs in the forked child before exec and only calls prctl(2), which
    // is async-signal-safe; it allocates nothing and touches no memory shared with the parent.
    unsafe {
        std::os::unix::process::CommandExt::pre_exec(cmd, move || {
            nix::sys::prctl::set_pdeathsig(signal).map_err(std::io::Error::from)
        })
    }
}

#[cfg(test)]
mod tests {
    use std::os::unix::process::ExitStatusExt;
    use std::process::Child;
    use std::time::{Duration, Instant};

    use super::*;

    /// Spawns `sleep 60` from a thread that then exits.
    fn spawn_from_a_thread(die: bool) -> Child {
        std::thread::spawn(move || {
            let mut cmd = Command::new("sleep");
            cmd.arg("60");
            if die {
                kill_with_parent(&mut cmd);
            }
            cmd.spawn().unwrap()
        })
        .join()
        .unwrap()
    }

    #[test]
    fn the_child_is_killed_when_its_spawning_thread_exits() {
        let mut child = spawn_from_a_thread(true);
        let deadline = Instant::now() + Duration::from_secs(10);
        let status = loop {
            if let Some(status) = child.try_wait().unwrap() {
                break status;
            }
            assert!(
                Instant::now() < deadline,
                "the child outlived its parent thread"
            );
            std::thread::sleep(Duration::from_millis(5));
        };
        assert_eq!(status.signal(), Some(Signal::SIGKILL as i32));
    }

    #[test]
    fn without_it_the_child_lives_on() {
        let mut child = spawn_from_a_thread(false);
        std::thread::sleep(Duration::from_millis(100));
        let alive = child.try_wait().unwrap().is_none();
        child.kill().unwrap();
        child.wait().unwrap();
        assert!(alive, "a plain child survives its spawning thread");
    }
}
