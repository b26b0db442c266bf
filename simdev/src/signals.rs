//! The signal state simdev starts from: what its parent left that would break it is undone
//! first thing ([`reset_inherited`]), before any thread starts (threads inherit the mask).
//!
//! Both survive `exec`, and Rust's `Command` resets neither: a program that blocks every
//! signal (or ignores SIGCHLD) before `nrt_init` hands that to its private simdev.
//! - A blocked mask left simdev deaf to SIGTERM (its runtime's stop, which then waited out its
//!   grace and killed it) and to the parent-death signal (its runtime killed, it stayed
//!   orphaned with its directory).
//! - An ignored SIGCHLD has the kernel reap simdev's children itself, so the reference
//!   worker's exit could not be waited for.
//!
//! SIGXFSZ is ignored: a file-size limit refuses one allocation instead of ending the device.

use nix::sys::signal::{SigHandler, SigSet, Signal, signal};

use crate::private::PARENT_DEATH_SIGNAL;

/// Unblocks every signal on the calling thread but the parent-death signal, restores SIGCHLD's
/// default action and ignores SIGXFSZ. Call it before any other thread starts.
///
/// SIGXFSZ: under a file-size limit (`ulimit -f`), sizing a chunk's memfd past it would end
/// the device, every client's, with the kernel's signal; ignored, the `ftruncate` fails with
/// EFBIG and that one allocation is refused, naming the error.
pub fn reset_inherited() -> nix::Result<()> {
    // All but the parent-death signal, which its spawner blocked so that it stays pending
    // until simdev's handler is in place ([`unblock_parent_death`]).
    let mut keep = SigSet::empty();
    if SigSet::thread_get_mask()?.contains(PARENT_DEATH_SIGNAL) {
        keep.add(PARENT_DEATH_SIGNAL);
    }
    keep.thread_set_mask()?;
    // SAFETY: `SIG_DFL` and `SIG_IGN` install no handler, so no code of ours runs in signal
    // context; the calls only change dispositions, before any other thread exists to race
    // with them.
    unsafe {
        signal(Signal::SIGCHLD, SigHandler::SigDfl)?;
        signal(Signal::SIGXFSZ, SigHandler::SigIgn)?;
    }
    Ok(())
}

/// Unblocks the parent-death signal on the calling thread (simdev's main thread, which serves
/// until the end): call it once its handler (a private simdev's watch) is in place, or at once
/// otherwise. A death signal that arrived before is delivered now, to that handler.
pub fn unblock_parent_death() -> nix::Result<()> {
    SigSet::from(PARENT_DEATH_SIGNAL).thread_unblock()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// On a thread of its own (the mask is per thread; the disposition is the process's, and
    /// SIGCHLD's default is what every test runs with).
    #[test]
    fn a_blocked_mask_is_cleared() {
        std::thread::spawn(|| {
            let mut blocked = SigSet::empty();
            blocked.add(Signal::SIGTERM);
            blocked.add(Signal::SIGINT);
            blocked.add(PARENT_DEATH_SIGNAL);
            blocked.thread_block().unwrap();
            reset_inherited().unwrap();
            let now = SigSet::thread_get_mask().unwrap();
            assert!(!now.contains(Signal::SIGTERM));
            assert!(!now.contains(Signal::SIGINT));
            assert!(
                now.contains(PARENT_DEATH_SIGNAL),
                "kept until its handler is in"
            );
            unblock_parent_death().unwrap();
            assert!(
                !SigSet::thread_get_mask()
                    .unwrap()
                    .contains(PARENT_DEATH_SIGNAL)
            );
        })
        .join()
        .unwrap();
    }
}
