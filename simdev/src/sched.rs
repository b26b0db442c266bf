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
//! `Batch` threads also ask for the shortest time slice the kernel grants ([`DEVICE_SLICE`],
//! `sched_attr.sched_runtime` of a fair policy). The EEVDF scheduler (Linux 6.6 and later) runs
//! the eligible thread with the earliest virtual deadline, and a thread's deadline is its
//! virtual runtime plus its slice (custom slices: Linux 6.12 and later; older kernels ignore
//! the request). A device thread runs one short burst per batch of doorbells; with the short
//! slice, when the submitter blocks after ringing, the CPU goes to the woken device thread
//! rather than back to a runtime thread that the submitter preempted earlier, which would run a
//! few instructions and block again: on one busy CPU, a context switch there and back that
//! delays the execution (identity sync executions pinned to one CPU: 3.93 → 3.85 context
//! switches each, and a lower p99 in `cargo bench -p tests --bench simdev_speed`). The slice
//! changes no weight: the fair share stays the same.
//!
//! [`ThreadPolicy::Normal`] (`--sched normal`) keeps Linux's defaults, policy and slice.

use std::io;
use std::time::Duration;

use clap::ValueEnum;

/// The time slice [`ThreadPolicy::Batch`] threads ask for: the shortest Linux grants a fair
/// policy (100 µs).
pub const DEVICE_SLICE: Duration = Duration::from_micros(100);

/// The scheduling policy simdev gives its threads.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, ValueEnum)]
pub enum ThreadPolicy {
    /// `SCHED_BATCH` with a 100 us time slice (`DEVICE_SLICE`): device threads never preempt a
    /// running thread when they wake, and run first among the threads waiting once it blocks.
    #[default]
    Batch,
    /// `SCHED_OTHER` with the kernel's default slice, Linux's defaults.
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

    /// The time slice the policy asks for (`None`: the kernel's default).
    pub const fn slice(self) -> Option<Duration> {
        match self {
            Self::Batch => Some(DEVICE_SLICE),
            Self::Normal => None,
        }
    }

    /// Gives the calling thread this policy and slice. Threads it creates afterwards inherit
    /// both (the pthread default), so [`crate::server::run`] calls this once before any device
    /// thread exists. Where `sched_setattr` is refused (a seccomp filter that knows only the
    /// older call), the policy alone is set with `sched_setscheduler`.
    ///
    /// # Errors
    /// The OS error of `sched_setscheduler` when both calls fail.
    pub fn apply_to_current_thread(self) -> io::Result<()> {
        self.set_attr().or_else(|_| self.set_scheduler())
    }

    /// `sched_setattr(2)`: policy and slice together.
    fn set_attr(self) -> io::Result<()> {
        let slice_ns = self
            .slice()
            .map_or(0, |d| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX));
        let attr = sched_attr(self.linux_policy().unsigned_abs(), slice_ns);
        // SAFETY: `attr` is an initialised `sched_attr` whose `size` field is its own size; it
        // outlives the call, which only reads it. Pid 0 names the calling thread; flags 0.
        let rc = unsafe { libc::syscall(libc::SYS_sched_setattr, 0, &raw const attr, 0u32) };
        if rc == 0 {
            Ok(())
        } else {
            Err(io::Error::last_os_error())
        }
    }

    /// `sched_setscheduler(2)`: the policy alone.
    fn set_scheduler(self) -> io::Result<()> {
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

/// A `sched_attr` of `policy` at nice 0 and, for a fair policy, a slice of `slice_ns` (0: the
/// kernel's default); its `size` is its own.
fn sched_attr(policy: u32, slice_ns: u64) -> libc::sched_attr {
    libc::sched_attr {
        size: u32::try_from(std::mem::size_of::<libc::sched_attr>()).unwrap_or(u32::MAX),
        sched_policy: policy,
        sched_flags: 0,
        sched_nice: 0,
        sched_priority: 0,
        sched_runtime: slice_ns,
        sched_deadline: 0,
        sched_period: 0,
    }
}

/// Whether the running kernel grants fair policies the slice they ask for (Linux 6.12 and
/// later; older kernels accept the request and keep their own slice).
pub fn kernel_grants_custom_slices() -> bool {
    let Ok(uts) = nix::sys::utsname::uname() else {
        return false;
    };
    let release = uts.release().to_string_lossy();
    let mut numbers = release
        .split(['.', '-'])
        .map(|n| n.parse::<u32>().unwrap_or(0));
    let major = numbers.next().unwrap_or(0);
    let minor = numbers.next().unwrap_or(0);
    (major, minor) >= (6, 12)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The policy of the calling thread, as the kernel reports it.
    fn current_policy() -> i32 {
        // SAFETY: no arguments but the calling thread's id (0); it reads scheduler state only.
        unsafe { libc::sched_getscheduler(0) }
    }

    /// The slice of the calling thread (`sched_getattr`'s `sched_runtime` for a fair policy;
    /// 0 where the kernel reports none).
    fn current_slice() -> Duration {
        let mut attr = sched_attr(0, 0);
        let size = attr.size;
        // SAFETY: `attr` is a writable `sched_attr` of `size` bytes that outlives the call; pid 0
        // names the calling thread; flags 0.
        let rc = unsafe { libc::syscall(libc::SYS_sched_getattr, 0, &raw mut attr, size, 0u32) };
        assert_eq!(rc, 0, "sched_getattr: {}", io::Error::last_os_error());
        Duration::from_nanos(attr.sched_runtime)
    }

    #[test]
    fn a_thread_takes_the_policy_and_the_threads_it_creates_inherit_it() {
        std::thread::spawn(|| {
            assert_eq!(current_policy(), libc::SCHED_OTHER);
            let default_slice = current_slice();
            ThreadPolicy::Batch.apply_to_current_thread().unwrap();
            assert_eq!(current_policy(), libc::SCHED_BATCH);
            let (child_policy, child_slice) =
                std::thread::spawn(|| (current_policy(), current_slice()))
                    .join()
                    .unwrap();
            assert_eq!(
                child_policy,
                libc::SCHED_BATCH,
                "a device thread inherits the policy"
            );
            if kernel_grants_custom_slices() {
                assert_eq!(current_slice(), DEVICE_SLICE, "the device slice is granted");
                assert_eq!(
                    child_slice, DEVICE_SLICE,
                    "a device thread inherits the slice"
                );
            }
            ThreadPolicy::Normal.apply_to_current_thread().unwrap();
            assert_eq!(current_policy(), libc::SCHED_OTHER);
            assert_eq!(
                current_slice(),
                default_slice,
                "normal restores the default slice"
            );
        })
        .join()
        .unwrap();
    }
}
