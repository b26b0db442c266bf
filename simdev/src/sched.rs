//! The Linux scheduling policy of simdev's threads ([`ThreadPolicy`]).
//!
//! On silicon the device runs beside the host: ringing a doorbell never takes the CPU away from
//! the thread that rang it. simdev is a process sharing the host's CPUs, so by default
//! ([`ThreadPolicy::Batch`], `SCHED_BATCH`) its threads do not preempt on wake-up either: a
//! connection thread woken by a doorbell runs on an idle CPU, when the ringing thread blocks, or
//! at the next scheduler tick, never in the middle of the submit path. Under the default policy
//! the woken device thread preempts the submitter between its doorbell and the rest of the
//! submit (publish, trigger, `has_work_efd`), and the submitter gets the CPU back only to
//! finish a few stores and block again: one more context switch per execution on a busy CPU.
//!
//! `SCHED_BATCH` keeps the fair share (same nice value, same weight); it only gives up wake-up
//! preemption. [`ThreadPolicy::Normal`] (`--sched normal`) keeps the default policy.

use std::io;

use clap::ValueEnum;

/// The scheduling policy simdev gives its threads.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, ValueEnum)]
pub enum ThreadPolicy {
    /// `SCHED_BATCH`: device threads never preempt a running thread when they wake.
    #[default]
    Batch,
    /// `SCHED_OTHER`, the default Linux policy.
    Normal,
}

impl ThreadPolicy {
    /// The `sched_setscheduler` policy number.
    pub const fn linux_policy(self) -> i32 {
        match self {
            Self::Batch => libc::SCHED_BATCH,
            Self::Normal => libc::SCHED_OTHER,
        }
    }

    /// Gives the calling thread this policy. Threads it creates afterwards inherit it (the
    /// pthread default), so [`crate::server::run`] calls this once before any device thread
    /// exists.
    ///
    /// # Errors
    /// The OS error of `sched_setscheduler` (e.g. a seccomp filter that forbids it).
    pub fn apply_to_current_thread(self) -> io::Result<()> {
        let param = libc::sched_param { sched_priority: 0 };
        // SAFETY: `param` is an initialised `sched_param` that outlives the call, which only
        // reads it; pid 0 names the calling thread, and the call changes nothing else.
        let rc = unsafe { libc::sched_setscheduler(0, self.linux_policy(), &raw const param) };
        if rc == 0 {
            Ok(())
        } else {
            Err(io::Error::last_os_error())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The policy of the calling thread, as the kernel reports it.
    fn current_policy() -> i32 {
        // SAFETY: no arguments but the calling thread's id (0); it reads scheduler state only.
        unsafe { libc::sched_getscheduler(0) }
    }

    #[test]
    fn a_thread_takes_the_policy_and_the_threads_it_creates_inherit_it() {
        std::thread::spawn(|| {
            assert_eq!(current_policy(), libc::SCHED_OTHER);
            ThreadPolicy::Batch.apply_to_current_thread().unwrap();
            assert_eq!(current_policy(), libc::SCHED_BATCH);
            let child = std::thread::spawn(current_policy).join().unwrap();
            assert_eq!(
                child,
                libc::SCHED_BATCH,
                "a device thread inherits the policy"
            );
            ThreadPolicy::Normal.apply_to_current_thread().unwrap();
            assert_eq!(current_policy(), libc::SCHED_OTHER);
        })
        .join()
        .unwrap();
    }
}
