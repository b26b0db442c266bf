//! loom models of the XU ring and the completion hand-off (run with
//! `RUSTFLAGS="--cfg loom" cargo test -p runtime --release --lib xu::loom_tests`).
//! Capacities of 2 so the full and wrap edges are reached in few steps. The completion
//! eventfds are real (non-blocking) eventfds: loom only schedules the threads.

use std::sync::Arc;

use loom::thread;
use nix::errno::Errno;
use nix::sys::eventfd::{EfdFlags, EventFd};
use shared::NrtStatus;
use shared::ids::{SeqId, XuId, XuType};

use super::handoff::CompEfd;
use super::queue::{Consumer, Install, Producer, Registration, XuQueue};

fn xu() -> XuId {
    XuId::new(XuType::Compute, 0, 0)
}

fn efd() -> Arc<EventFd> {
    Arc::new(EventFd::from_value_and_flags(0, EfdFlags::EFD_NONBLOCK).unwrap())
}

fn submit_and_trigger(p: &mut Producer<u64>, value: u64) -> SeqId {
    let mut item = Box::new(value);
    loop {
        match p.client_submit(item, None) {
            Ok(seq) => {
                assert_eq!(seq.seq_num(), value);
                p.client_trigger_next().unwrap();
                return seq;
            }
            Err((_, back)) => {
                item = back;
                thread::yield_now();
            }
        }
    }
}

/// Pops with the runtime's signal: write the eventfd, if any.
fn pop(c: &mut Consumer<u64>) -> Result<SeqId, NrtStatus> {
    c.worker_pop_current_exec(|_, efd| efd.signal())
}

#[test]
fn submit_trigger_pop_across_the_wrap() {
    loom::model(|| {
        let (mut p, mut c) = XuQueue::<u64>::with_capacity(xu(), 2).unwrap();
        let producer = thread::spawn(move || {
            for v in 1..=3 {
                submit_and_trigger(&mut p, v);
            }
        });
        let mut next = 1;
        while next <= 3 {
            if c.worker_peek_current_exec().is_some() {
                assert_eq!(c.worker_take_item().map(|b| *b), Some(next));
                pop(&mut c).unwrap();
                next += 1;
            } else {
                thread::yield_now();
            }
        }
        producer.join().unwrap();
        assert_eq!(c.queue().last_completed().seq_num(), 3);
    });
}

#[test]
fn full_then_drain() {
    loom::model(|| {
        let (mut p, mut c) = XuQueue::<u64>::with_capacity(xu(), 2).unwrap();
        p.client_submit(Box::new(1), None).unwrap();
        p.client_submit(Box::new(2), None).unwrap();
        assert!(
            p.client_submit(Box::new(3), None).is_err(),
            "full counts untriggered slots"
        );
        let consumer = thread::spawn(move || {
            let mut seen = Vec::new();
            while seen.len() < 2 {
                if c.worker_peek_current_exec().is_some() {
                    seen.push(*c.worker_take_item().unwrap());
                    pop(&mut c).unwrap();
                } else {
                    thread::yield_now();
                }
            }
            seen
        });
        p.client_trigger_next().unwrap();
        p.client_trigger_next().unwrap();
        assert_eq!(consumer.join().unwrap(), [1, 2]);
        p.client_submit(Box::new(3), None).unwrap();
    });
}

/// seed 004 GOTCHA: the worker captures the slot (its completion eventfd, status cell and item)
/// *before* it bumps `exec_head`. The bump hands the slot back to the producer, whose next
/// submit overwrites it: emptying the slot after the bump is a data race loom reports, and the
/// waiter's eventfd must still be the one signalled.
#[test]
fn the_worker_captures_the_slot_before_it_is_reused() {
    loom::model(|| {
        let (mut p, mut c) = XuQueue::<u64>::with_capacity(xu(), 2).unwrap();
        let q = p.queue().clone();
        let seq = p.client_submit(Box::new(1), None).unwrap();
        p.client_submit(Box::new(2), None).unwrap();
        p.client_trigger_next().unwrap();
        let waiter = efd();
        assert!(
            q.install_comp_efd(seq, CompEfd::Pool(waiter.clone()))
                .is_installed()
        );
        // The producer waits for a free slot: seq 3 reuses seq 1's slot.
        let producer = thread::spawn(move || {
            let mut item = Box::new(3);
            loop {
                match p.client_submit(item, None) {
                    Ok(_) => break,
                    Err((_, back)) => {
                        item = back;
                        thread::yield_now();
                    }
                }
            }
        });
        assert_eq!(c.worker_take_item().map(|b| *b), Some(1));
        assert_eq!(pop(&mut c), Ok(seq));
        producer.join().unwrap();
        assert_eq!(waiter.read(), Ok(1), "the waiter's eventfd was lost");
    });
}

/// A queue of capacity 2 (with `mark_comp_lock` narrowed to the eventfd cells if
/// `narrowed_lock`) holding one triggered request, and a worker thread popping it: the queue's
/// shared view, the request's seq_id and the worker to join.
fn one_request_popped_by_a_worker(
    narrowed_lock: bool,
) -> (Arc<XuQueue<u64>>, SeqId, thread::JoinHandle<()>) {
    let (mut p, mut c) = if narrowed_lock {
        XuQueue::<u64>::new_with_narrowed_lock_for_test(xu(), 2).unwrap()
    } else {
        XuQueue::<u64>::with_capacity(xu(), 2).unwrap()
    };
    let q = p.queue().clone();
    let seq = submit_and_trigger(&mut p, 1);
    let worker = thread::spawn(move || {
        pop(&mut c).unwrap();
    });
    (q, seq, worker)
}

/// The waiter installs its eventfd while the worker pops: if the install succeeded, the worker
/// must have signalled that eventfd.
fn install_vs_signal(narrowed_lock: bool) {
    loom::model(move || {
        let (q, seq, worker) = one_request_popped_by_a_worker(narrowed_lock);
        let waiter = efd();
        let installed = q
            .install_comp_efd(seq, CompEfd::Pool(waiter.clone()))
            .is_installed();
        worker.join().unwrap();
        if installed {
            assert_eq!(
                waiter.read(),
                Ok(1),
                "lost wake-up: installed but never signalled"
            );
        } else {
            assert_eq!(waiter.read(), Err(Errno::EAGAIN), "signalled but refused");
        }
    });
}

#[test]
fn install_vs_signal_never_loses_a_wakeup_under_mark_comp_lock() {
    install_vs_signal(false);
}

#[test]
fn install_vs_signal_loses_wakeups_without_mark_comp_lock() {
    // The narrowed lock still guards the eventfd cells, but not the exec_head check (install)
    // or the exec_head bump (pop) next to them: the seed's race comes back.
    loom_finds(|| install_vs_signal(true), "lost wake-up");
}

/// The seq-id event registration (what `nrta` event registration builds on): a caller
/// registers a fresh eventfd for request 2 while the worker completes requests 1 and 2.
/// Registration before the completion: the worker writes the eventfd exactly once, at request
/// 2's pop, never at request 1's. Registration after it: `AlreadyComplete`, the eventfd comes
/// back unwritten and is never written (the caller reads the completion from the queue).
#[test]
fn a_seq_id_registration_fires_exactly_once_before_or_after_completion() {
    loom::model(|| {
        let (mut p, mut c) = XuQueue::<u64>::with_capacity(xu(), 2).unwrap();
        let q = p.queue().clone();
        let first = submit_and_trigger(&mut p, 1);
        let second = submit_and_trigger(&mut p, 2);
        let worker = thread::spawn(move || {
            let mut signalled = Vec::new();
            for _ in 0..2 {
                c.worker_pop_current_exec(|seq, efd| {
                    signalled.push((seq, efd.is_some()));
                    efd.signal()
                })
                .unwrap();
            }
            signalled
        });
        let registered = EventFd::from_value_and_flags(0, EfdFlags::EFD_NONBLOCK).unwrap();
        let mine = registered.as_fd_clone();
        let install = q.install_comp_efd(second, CompEfd::Fresh(registered.into()));
        let signalled = worker.join().unwrap();
        assert_eq!(
            signalled[0],
            (first, false),
            "request 1 fired the registration"
        );
        match install {
            Install::Installed => {
                assert_eq!(signalled[1], (second, true));
                assert_eq!(read(&mine), Ok(1), "fired exactly once");
            }
            Install::AlreadyComplete(_) => {
                assert_eq!(signalled[1], (second, false));
                assert!(q.is_completed(second));
                assert_eq!(read(&mine), Err(Errno::EAGAIN), "fired after refusal");
            }
            other => panic!("unexpected registration result {other:?}"),
        }
    });
}

/// `nrta_event_register_seq_id_completion` against the completion (seed 004 §5's
/// install-vs-signal race, for registered eventfds): a caller registers an eventfd for request
/// 1 while the worker pops it. Whether the registration lands before the pop (signalled by the
/// pop) or after it (signalled at once by the registration), the eventfd is written exactly
/// once: never lost, never twice.
fn registration_vs_pop(narrowed_lock: bool) {
    loom::model(move || {
        let (q, seq, worker) = one_request_popped_by_a_worker(narrowed_lock);
        let caller = EventFd::from_value_and_flags(0, EfdFlags::EFD_NONBLOCK).unwrap();
        let outcome = q.register_seq_efd(seq, Some(caller.as_fd_clone()));
        worker.join().unwrap();
        assert!(
            matches!(
                outcome,
                Registration::Registered | Registration::AlreadyComplete
            ),
            "{outcome:?}"
        );
        assert_eq!(caller.read(), Ok(1), "lost or doubled signal ({outcome:?})");
        assert_eq!(caller.read(), Err(Errno::EAGAIN));
    });
}

#[test]
fn a_seq_id_event_registration_is_signalled_exactly_once_against_the_pop() {
    registration_vs_pop(false);
}

#[test]
fn a_seq_id_event_registration_is_lost_when_the_pop_bumps_outside_mark_comp_lock() {
    // The narrowed lock lets the pop take the slot's registrations, release the lock, then
    // move exec_head: a registration landing in between sees "not completed", is added to the
    // emptied slot, and is never signalled.
    loom_finds(|| registration_vs_pop(true), "lost or doubled");
}

/// Runs a model of a deliberately broken variant and asserts that loom finds its bug: the
/// model panics, with a message containing `needle` (not for another reason).
fn loom_finds(model: impl FnOnce() + std::panic::UnwindSafe, needle: &str) {
    let payload =
        std::panic::catch_unwind(model).expect_err("loom must find the bug of the broken variant");
    let message = payload
        .downcast_ref::<String>()
        .map(String::as_str)
        .or_else(|| payload.downcast_ref::<&str>().copied())
        .unwrap_or_default();
    assert!(
        message.contains(needle),
        "failed for another reason: {message}"
    );
}

/// Deregistration (fd −1) against the pop: once the deregistration returned, the eventfd is
/// never written; before it, it was written at most once (the pop won).
#[test]
fn a_deregistered_seq_id_eventfd_is_never_signalled_after_deregistration_returns() {
    loom::model(|| {
        let (mut p, mut c) = XuQueue::<u64>::with_capacity(xu(), 2).unwrap();
        let q = p.queue().clone();
        let seq = submit_and_trigger(&mut p, 1);
        let caller = EventFd::from_value_and_flags(0, EfdFlags::EFD_NONBLOCK).unwrap();
        assert_eq!(
            q.register_seq_efd(seq, Some(caller.as_fd_clone())),
            Registration::Registered
        );
        let worker = thread::spawn(move || {
            pop(&mut c).unwrap();
        });
        q.register_seq_efd(seq, None);
        let before = caller.read().unwrap_or(0);
        worker.join().unwrap();
        assert!(before <= 1);
        assert_eq!(
            caller.read(),
            Err(Errno::EAGAIN),
            "signalled after its deregistration returned"
        );
    });
}

trait AsFdClone {
    fn as_fd_clone(&self) -> std::os::fd::OwnedFd;
}

impl AsFdClone for EventFd {
    fn as_fd_clone(&self) -> std::os::fd::OwnedFd {
        use std::os::fd::AsFd;
        self.as_fd().try_clone_to_owned().unwrap()
    }
}

/// Reads an eventfd's count (non-blocking).
fn read(fd: &std::os::fd::OwnedFd) -> Result<u64, Errno> {
    let mut buf = [0u8; 8];
    nix::unistd::read(fd, &mut buf)?;
    Ok(u64::from_ne_bytes(buf))
}
