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
///
/// Two races are closed in the child, before exec:
/// - a parent that died before the `prctl` never sends the signal: the child checks that its
///   parent is still the process that spawned it, and otherwise fails the spawn (it never
///   runs, so it is never orphaned);
/// - a signal that arrives before the program it execs has its handler would take its
///   default action (for SIGUSR1, termination, with nothing cleaned up): it is blocked, and
///   stays pending across exec until the program unblocks it, its handler in place (a
///   private simdev does; SIGKILL cannot be blocked and needs no handler).
pub fn signal_with_parent(cmd: &mut Command, signal: Signal) -> &mut Command {
    let parent = nix::unistd::getpid();
    // SAFETY: the closure runs in the forked child before exec and only calls prctl(2),
    // getppid(2) and sigprocmask(2), which are async-signal-safe; it allocates nothing (its
    // errors are errnos) and touches no memory shared with the parent.
    unsafe {
        std::os::unix::process::CommandExt::pre_exec(cmd, move || {
            if signal != Signal::SIGKILL {
                nix::sys::signal::SigSet::from(signal)
                    .thread_block()
                    .map_err(std::io::Error::from)?;
            }
            nix::sys::prctl::set_pdeathsig(signal).map_err(std::io::Error::from)?;
            if nix::unistd::getppid() != parent {
                // ESRCH ("No such process"): the parent is gone. An errno, not a message,
                // which would allocate, unsafe between fork and exec.
                return Err(std::io::Error::from(nix::errno::Errno::ESRCH));
            }
            Ok(())
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

    /// The blocked signals of a child spawned with `signal_with_parent(signal)`, from its
    /// `/proc/self/status` (the `SigBlk` mask, bit `n - 1` for signal `n`).
    fn child_mask(signal: Signal) -> u64 {
        let mut cmd = Command::new("grep");
        cmd.args(["SigBlk", "/proc/self/status"]);
        signal_with_parent(&mut cmd, signal);
        let out = cmd.output().unwrap();
        let line = String::from_utf8(out.stdout).unwrap();
        let hex = line.trim().strip_prefix("SigBlk:").unwrap().trim();
        u64::from_str_radix(hex, 16).unwrap()
    }

    /// The parent-death signal reaches the program blocked (pending until its handler is in
    /// place, where it unblocks it), and nothing else is blocked for it.
    #[test]
    fn the_death_signal_is_blocked_across_exec_until_the_program_unblocks_it() {
        let usr1 = 1u64 << (Signal::SIGUSR1 as i32 - 1);
        // A thread with nothing blocked spawns, as the runtime's spawning thread may.
        let masks = std::thread::spawn(|| {
            nix::sys::signal::SigSet::empty().thread_set_mask().unwrap();
            (child_mask(Signal::SIGUSR1), child_mask(Signal::SIGKILL))
        })
        .join()
        .unwrap();
        assert_eq!(masks.0, usr1, "only SIGUSR1: {:#x}", masks.0);
        assert_eq!(masks.1, 0, "SIGKILL needs no blocking: {:#x}", masks.1);
    }
}
