//! A tensor's output completion count (`nrt_tensor_check_output_completion`,
//! `nrt_tensor_reset_output_completion`): how many executions have written the tensor as an
//! output since the count was last reset, and a wait for it to reach a number.
//!
//! The count is per tensor handle (a `nrt_tensor_t`): clones of one [`crate::Tensor`] share it,
//! a slice has its own. An execution counts once it has written its outputs — it ended with
//! NRT_SUCCESS or NRT_EXEC_COMPLETED_WITH_NUM_ERR (on silicon, once the output DMA posted its
//! completion); a failed execution does not count, so a waiter sees the failure as its timeout
//! rather than as data. The execution's status says why.
//!
//! # The fast path and its wake-up
//! [`OutputCompletion::completed`] runs on the XU worker for every output of every execution:
//! one atomic add and one load, no lock and no system call unless a thread is waiting. A waiter
//! announces itself (`waiters += 1`) before it checks the count under the lock; the worker adds
//! to the count before it reads `waiters`. The waiter reads the count with a read-modify-write
//! (adding 0), so its read and the worker's add are ordered in the count's modification order,
//! and release/acquire alone decides the race (no reliance on a store–load fence):
//! - the waiter's read comes after the worker's add: it sees the add;
//! - it comes before: the worker's add reads from it, so the waiter's `waiters += 1` happened
//!   before the worker's read of `waiters`, which sees it and notifies under the lock — after the
//!   waiter's check (the waiter holds the lock from its check into its wait), so it wakes the
//!   waiter, whose next check, under the lock, sees the count.
//!
//! No completion is missed: the loom model below checks every interleaving (loom treats
//! sequentially consistent accesses as acquire/release, which is all this argument uses).

use std::time::{Duration, Instant};

#[cfg(loom)]
use loom::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize};
#[cfg(loom)]
use loom::sync::{Condvar, Mutex};
use std::sync::atomic::Ordering;
#[cfg(not(loom))]
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize};
#[cfg(not(loom))]
use std::sync::{Condvar, Mutex};

/// How long an unbounded wait goes before it warns (libnrt: "emits a warning at the first 30
/// seconds").
pub const UNBOUNDED_WARNING: Duration = Duration::from_secs(30);

/// How often a waiter asks its `interrupted` check (a completion wakes it at once; nothing
/// wakes it for an interruption, such as `nrt_close`, which it notices within this).
pub const INTERRUPT_POLL: Duration = Duration::from_millis(100);

/// What a wait for the count ended with.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Waited {
    /// The count reached the number.
    Reached,
    /// The deadline passed first; the count then.
    TimedOut {
        /// The count when the wait gave up.
        count: u64,
    },
    /// The handle was freed ([`OutputCompletion::abandon`]): nothing can count any more.
    Abandoned,
    /// The caller's `interrupted` check said so (`nrt_close`).
    Interrupted,
}

/// One tensor handle's output completion count.
#[derive(Debug, Default)]
pub struct OutputCompletion {
    count: AtomicU64,
    /// Threads inside [`OutputCompletion::wait`] (the worker notifies only when there are any).
    waiters: AtomicUsize,
    /// The handle was freed: waits end ([`Waited::Abandoned`]).
    abandoned: AtomicBool,
    lock: Mutex<()>,
    changed: Condvar,
}

impl OutputCompletion {
    /// A count of 0.
    pub fn new() -> Self {
        Self::default()
    }

    /// The count now.
    pub fn count(&self) -> u64 {
        self.count.load(Ordering::SeqCst)
    }

    /// The count, read as a read-modify-write (the waiter's side of the race: see the module
    /// doc).
    fn count_ordered(&self) -> u64 {
        self.count.fetch_add(0, Ordering::SeqCst)
    }

    /// One more execution wrote the tensor. Wakes the waiters, if any.
    pub fn completed(&self) {
        self.count.fetch_add(1, Ordering::SeqCst);
        if self.waiters.load(Ordering::SeqCst) > 0 {
            let _held = self.lock.lock().unwrap_or_else(|e| e.into_inner());
            self.changed.notify_all();
        }
    }

    /// Back to 0 (`nrt_tensor_reset_output_completion`).
    pub fn reset(&self) {
        self.count.store(0, Ordering::SeqCst);
    }

    /// The handle is gone (`nrt_tensor_free`): every wait ends, now and later, with
    /// [`Waited::Abandoned`].
    pub fn abandon(&self) {
        self.abandoned.store(true, Ordering::SeqCst);
        let _held = self.lock.lock().unwrap_or_else(|e| e.into_inner());
        self.changed.notify_all();
    }

    /// Waits until the count is at least `expected`, until `deadline` (`None`: unbounded, with
    /// `on_long_wait` called once after [`UNBOUNDED_WARNING`]), until the handle is abandoned,
    /// or until `interrupted` says so (asked every [`INTERRUPT_POLL`]).
    pub fn wait(
        &self,
        expected: u64,
        deadline: Option<Instant>,
        on_long_wait: impl FnOnce(u64),
        interrupted: impl Fn() -> bool,
    ) -> Waited {
        if self.count() >= expected {
            return Waited::Reached;
        }
        self.waiters.fetch_add(1, Ordering::SeqCst);
        let mut warn = Some(on_long_wait);
        let warn_at = Instant::now() + UNBOUNDED_WARNING;
        let mut held = self.lock.lock().unwrap_or_else(|e| e.into_inner());
        let waited = loop {
            let count = self.count_ordered();
            if count >= expected {
                break Waited::Reached;
            }
            if self.abandoned.load(Ordering::SeqCst) {
                break Waited::Abandoned;
            }
            if interrupted() {
                break Waited::Interrupted;
            }
            let now = Instant::now();
            let until = match deadline {
                Some(d) if now >= d => break Waited::TimedOut { count },
                Some(d) => d,
                None => {
                    if now >= warn_at
                        && let Some(f) = warn.take()
                    {
                        f(count);
                    }
                    if warn.is_some() {
                        warn_at
                    } else {
                        now + UNBOUNDED_WARNING
                    }
                }
            };
            held = self
                .changed
                .wait_timeout(
                    held,
                    until.saturating_duration_since(now).min(INTERRUPT_POLL),
                )
                .unwrap_or_else(|e| e.into_inner())
                .0;
        };
        drop(held);
        self.waiters.fetch_sub(1, Ordering::SeqCst);
        waited
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use std::sync::Arc;

    use super::*;

    #[test]
    fn counts_and_resets() {
        let c = OutputCompletion::new();
        assert_eq!(c.count(), 0);
        c.completed();
        c.completed();
        assert_eq!(c.count(), 2);
        assert_eq!(
            c.wait(2, Some(Instant::now()), |_| {}, || false),
            Waited::Reached
        );
        c.reset();
        assert_eq!(c.count(), 0);
        assert_eq!(
            c.wait(0, Some(Instant::now()), |_| {}, || false),
            Waited::Reached
        );
    }

    #[test]
    fn a_wait_past_its_deadline_names_the_count() {
        let c = OutputCompletion::new();
        c.completed();
        let t = Instant::now();
        let w = c.wait(3, Some(t + Duration::from_millis(20)), |_| {}, || false);
        assert_eq!(w, Waited::TimedOut { count: 1 });
        assert!(t.elapsed() >= Duration::from_millis(20));
    }

    #[test]
    fn a_waiter_is_woken_by_the_completion_it_waits_for() {
        let c = Arc::new(OutputCompletion::new());
        let w = {
            let c = c.clone();
            std::thread::spawn(move || c.wait(2, None, |_| panic!("no long wait here"), || false))
        };
        // Whenever the waiter starts, both completions are counted; an unbounded wait returns
        // only when woken (a lost wake-up hangs this test).
        c.completed();
        c.completed();
        assert_eq!(w.join().unwrap(), Waited::Reached);
        assert_eq!(c.waiters.load(Ordering::SeqCst), 0);
    }

    #[test]
    fn an_unbounded_wait_ends_when_the_handle_is_abandoned_or_the_caller_interrupts() {
        let c = Arc::new(OutputCompletion::new());
        let w = {
            let c = c.clone();
            std::thread::spawn(move || c.wait(1, None, |_| {}, || false))
        };
        std::thread::sleep(Duration::from_millis(20));
        c.abandon();
        assert_eq!(w.join().unwrap(), Waited::Abandoned);
        assert_eq!(
            c.wait(1, None, |_| {}, || false),
            Waited::Abandoned,
            "and later"
        );
        let c = OutputCompletion::new();
        let stop = std::sync::atomic::AtomicBool::new(false);
        std::thread::scope(|s| {
            let w = s.spawn(|| c.wait(1, None, |_| {}, || stop.load(Ordering::SeqCst)));
            std::thread::sleep(Duration::from_millis(20));
            stop.store(true, Ordering::SeqCst);
            assert_eq!(w.join().unwrap(), Waited::Interrupted);
        });
    }
}

#[cfg(all(test, loom))]
mod loom_tests {
    use loom::sync::Arc;
    use loom::thread;

    use super::*;

    /// A waiter for two completions while the worker counts them: whatever the interleaving, the
    /// unbounded wait returns (loom reports a lost wake-up as a deadlock).
    #[test]
    fn no_completion_is_missed() {
        loom::model(|| {
            let c = Arc::new(OutputCompletion::new());
            let worker = {
                let c = c.clone();
                thread::spawn(move || {
                    c.completed();
                    c.completed();
                })
            };
            assert_eq!(c.wait(2, None, |_| {}, || false), Waited::Reached);
            worker.join().unwrap();
            assert_eq!(c.count(), 2);
        });
    }
}
