//! A program that ignores SIGCHLD (the kernel then reaps its children itself) stops its private
//! simdev as fast as any other, and never signals the pid after the child is gone (a reused pid
//! may name another process). Its own test binary: the disposition is the whole process's.

use std::time::{Duration, Instant};

use nix::sys::signal::{SigHandler, Signal, signal};
use tests::start_simdev;

#[test]
fn a_private_simdev_stops_without_its_grace_when_sigchld_is_ignored() {
    // SAFETY: SIG_IGN installs no handler; no other test runs in this binary.
    unsafe { signal(Signal::SIGCHLD, SigHandler::SigIgn) }.unwrap();
    for _ in 0..3 {
        let sim = start_simdev(&[]);
        let pid = nix::unistd::Pid::from_raw(i32::try_from(sim.pid()).unwrap());
        let t = Instant::now();
        drop(sim);
        let took = t.elapsed();
        // The stop sends SIGTERM and polls for the exit; a child reaped by the kernel reads as
        // ECHILD, which is its exit. Read as "still running", the stop waited out its 2 s
        // grace every time, then sent SIGKILL to a pid that was no longer its child's.
        assert!(
            took < Duration::from_secs(2),
            "the stop waited {took:?}: the child's exit was not seen"
        );
        assert_eq!(
            nix::sys::signal::kill(pid, None),
            Err(nix::errno::Errno::ESRCH),
            "simdev {pid} is gone"
        );
    }
}
