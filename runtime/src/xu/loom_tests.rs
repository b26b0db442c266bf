//! loom models of the XU ring and the completion hand-off (run with
//! `RUSTFLAGS="--cfg loom" cargo test -p runtime --release --lib xu::loom_tests`).
//! Capacities of 2 so the full and wrap edges are reached in few steps.

use loom::sync::Arc;
use loom::sync::atomic::{AtomicI32, Ordering};
use loom::thread;

use shared::ids::{XuId, XuType};

use super::handoff::{MarkCompLock, install_comp_efd, pop_and_signal};
use super::queue::{Install, NO_EFD, XuQueue};

fn xu() -> XuId {
    XuId::new(XuType::Compute, 0, 0)
}

fn submit_and_trigger(q: &XuQueue<u64>, value: u64) {
    let mut item = Box::new(value);
    loop {
        match q.client_submit(item, None) {
            Ok(seq) => {
                assert_eq!(seq.seq_num(), value);
                break;
            }
            Err((_, back)) => {
                item = back;
                thread::yield_now();
            }
        }
    }
    q.client_trigger_next().unwrap();
}

#[test]
fn submit_trigger_pop_across_the_wrap() {
    loom::model(|| {
        let q = Arc::new(XuQueue::<u64>::new(xu(), 2).unwrap());
        let producer = {
            let q = q.clone();
            thread::spawn(move || {
                for v in 1..=3 {
                    submit_and_trigger(&q, v);
                }
            })
        };
        let mut next = 1;
        while next <= 3 {
            if q.worker_peek_current_exec().is_some() {
                assert_eq!(q.worker_take_item().map(|b| *b), Some(next));
                q.worker_pop_current_exec().unwrap();
                next += 1;
            } else {
                thread::yield_now();
            }
        }
        producer.join().unwrap();
        assert_eq!(q.last_completed().seq_num(), 3);
    });
}

#[test]
fn full_then_drain() {
    loom::model(|| {
        let q = Arc::new(XuQueue::<u64>::new(xu(), 2).unwrap());
        q.client_submit(Box::new(1), None).unwrap();
        q.client_submit(Box::new(2), None).unwrap();
        assert!(
            q.client_submit(Box::new(3), None).is_err(),
            "full counts untriggered slots"
        );
        let consumer = {
            let q = q.clone();
            thread::spawn(move || {
                let mut seen = Vec::new();
                while seen.len() < 2 {
                    if q.worker_peek_current_exec().is_some() {
                        seen.push(*q.worker_take_item().unwrap());
                        q.worker_pop_current_exec().unwrap();
                    } else {
                        thread::yield_now();
                    }
                }
                seen
            })
        };
        q.client_trigger_next().unwrap();
        q.client_trigger_next().unwrap();
        assert_eq!(consumer.join().unwrap(), [1, 2]);
        q.client_submit(Box::new(3), None).unwrap();
    });
}

/// seed 004 GOTCHA: the worker captures `mark_comp_efd`/`efd_from_pool` *before* it bumps
/// `exec_head`. The bump hands the slot back to the producer, whose next submit resets
/// `mark_comp_efd` to -1; a capture after the bump can read that -1 and the waiter is never
/// woken. (Moving the two loads below the `fetch_add` makes this model fail.)
#[test]
fn the_worker_captures_the_completion_eventfd_before_the_slot_is_reused() {
    loom::model(|| {
        let q = Arc::new(XuQueue::<u64>::new(xu(), 2).unwrap());
        let seq = q.client_submit(Box::new(1), None).unwrap();
        q.client_submit(Box::new(2), None).unwrap();
        q.client_trigger_next().unwrap();
        assert_eq!(q.install_comp_efd(seq, 7, true), Install::Installed);
        // The producer waits for a free slot: seq 3 reuses seq 1's slot.
        let producer = {
            let q = q.clone();
            thread::spawn(move || {
                let mut item = Box::new(3);
                loop {
                    match q.client_submit(item, None) {
                        Ok(_) => break,
                        Err((_, back)) => {
                            item = back;
                            thread::yield_now();
                        }
                    }
                }
            })
        };
        assert_eq!(q.worker_take_item().map(|b| *b), Some(1));
        let popped = q.worker_pop_current_exec().unwrap();
        producer.join().unwrap();
        assert_eq!(popped.seq_id, seq);
        assert_eq!(popped.mark_comp_efd, 7, "the waiter's eventfd was lost");
        assert!(popped.efd_from_pool);
    });
}

/// The waiter installs its eventfd while the worker pops: if the install succeeded, the worker
/// must have signalled that eventfd. Returns nothing; asserts inside the model.
fn install_vs_signal(lock: fn() -> MarkCompLock) {
    loom::model(move || {
        let q = Arc::new(XuQueue::<u64>::new(xu(), 2).unwrap());
        let mark_comp_lock = Arc::new(lock());
        let seq = q.client_submit(Box::new(1), None).unwrap();
        q.client_trigger_next().unwrap();
        let signalled = Arc::new(AtomicI32::new(NO_EFD));
        let worker = {
            let (q, l, s) = (q.clone(), mark_comp_lock.clone(), signalled.clone());
            thread::spawn(move || {
                pop_and_signal(&q, &l, |p| {
                    if p.mark_comp_efd != NO_EFD {
                        s.store(p.mark_comp_efd, Ordering::Release);
                    }
                })
                .unwrap();
            })
        };
        let install = install_comp_efd(&q, &mark_comp_lock, seq, 7, true);
        worker.join().unwrap();
        if install == Install::Installed {
            assert_eq!(
                signalled.load(Ordering::Acquire),
                7,
                "lost wake-up: installed but never signalled"
            );
        }
    });
}

#[test]
fn install_vs_signal_never_loses_a_wakeup_under_mark_comp_lock() {
    install_vs_signal(MarkCompLock::new);
}

#[test]
fn install_vs_signal_loses_wakeups_without_mark_comp_lock() {
    let result = std::panic::catch_unwind(|| install_vs_signal(MarkCompLock::disabled_for_test));
    let payload = result.expect_err("loom must find the lost wake-up when the lock is removed");
    let message = payload
        .downcast_ref::<String>()
        .map(String::as_str)
        .or_else(|| payload.downcast_ref::<&str>().copied())
        .unwrap_or_default();
    assert!(
        message.contains("lost wake-up"),
        "failed for another reason: {message}"
    );
}
