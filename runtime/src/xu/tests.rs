//! XU tests with real threads and eventfds (no processes, no device). Each QUIRK/GOTCHA of
//! seed 004 has a test that a naive implementation fails.

use std::collections::VecDeque;
use std::os::fd::AsFd;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
use shared::NrtStatus;
use shared::ids::{SeqId, XuId, XuType};

use super::queue::{ExecStatus, XuQueue};
use super::unit::{
    CompletionEngine, ExecInfo, Progress, Xu, XuConfig, XuHealth, XuTable, shutdown,
};
use super::worker::XuWorkers;
use crate::metrics::Metrics;

/// A completion engine double: scripted outcomes (default: done with success), counters.
#[derive(Debug, Default)]
struct Script {
    outcomes: Mutex<VecDeque<Progress>>,
    progress_calls: AtomicU64,
    stops: AtomicU64,
    unstaged: Mutex<Vec<u64>>,
}

impl Script {
    fn with(outcomes: &[Progress]) -> Arc<Self> {
        let s = Self::default();
        s.outcomes.lock().unwrap().extend(outcomes.iter().copied());
        Arc::new(s)
    }
}

impl CompletionEngine for Script {
    type Request = u64;

    fn progress_one_step(&self, _vnc: u32, info: &mut ExecInfo<u64>) -> Progress {
        self.progress_calls.fetch_add(1, Ordering::Relaxed);
        info.resp[0].device_ns = 2_000;
        self.outcomes
            .lock()
            .unwrap()
            .pop_front()
            .unwrap_or(Progress::Done(NrtStatus::Success))
    }

    fn wait_model_stop(&self, _vnc: u32) -> Result<(), NrtStatus> {
        self.stops.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }

    fn unstage_model(&self, model_id: u64) {
        self.unstaged.lock().unwrap().push(model_id);
    }
}

fn xu_with(
    engine: Arc<Script>,
    vnc: u32,
    capacity: usize,
    pool: usize,
) -> (Arc<Xu<Script>>, Arc<Metrics>) {
    let metrics = Arc::new(Metrics::new(4));
    let cfg = XuConfig {
        vnc,
        tpbs: vec![vnc],
        capacity,
        efd_pool_size: pool,
        ..XuConfig::default()
    };
    (
        Arc::new(Xu::new(cfg, engine, metrics.clone()).unwrap()),
        metrics,
    )
}

fn submit(xu: &Xu<Script>, model: u64) -> Result<(SeqId, Arc<ExecStatus>), NrtStatus> {
    let status = Arc::new(ExecStatus::new());
    let seq = xu.schedule_request(
        Box::new(ExecInfo::execute(model, 0)),
        Some(status.clone()),
        |_, _| Ok(()),
        |_| Ok(()),
    )?;
    Ok((seq, status))
}

fn has_work(xu: &Xu<Script>) -> bool {
    let mut fds = [PollFd::new(xu.has_work_fd(), PollFlags::POLLIN)];
    poll(&mut fds, PollTimeout::ZERO).unwrap() > 0
}

/// Steps the XU as a level-triggered epoll would: while `has_work_efd` is readable.
fn step_while_has_work(xu: &Xu<Script>) -> u64 {
    let mut steps = 0;
    while has_work(xu) && steps < 1000 {
        xu.step();
        steps += 1;
    }
    steps
}

fn worker_threads(prefix: &str) -> usize {
    std::fs::read_dir("/proc/self/task")
        .unwrap()
        .filter_map(|t| std::fs::read_to_string(t.ok()?.path().join("comm")).ok())
        .filter(|comm| comm.trim_end().starts_with(prefix))
        .count()
}

#[test]
fn n_submits_give_exactly_n_steps_through_the_semaphore_eventfd() {
    // A non-semaphore has_work_efd would be drained by the first completion's read: one step
    // for five submits, and four requests never completed.
    let (xu, _) = xu_with(Script::with(&[]), 0, 8, 1);
    let statuses: Vec<_> = (0..5).map(|_| submit(&xu, 1).unwrap().1).collect();
    assert_eq!(step_while_has_work(&xu), 5);
    assert_eq!(xu.queue().last_completed().seq_num(), 5);
    assert!(statuses.iter().all(|s| s.get() == Some(NrtStatus::Success)));
}

#[test]
fn a_spurious_wake_on_an_empty_xu_is_a_successful_no_op() {
    // seed 004 step: peek empty → return success, consume nothing, report nothing.
    let engine = Script::with(&[]);
    let (xu, _) = xu_with(engine.clone(), 0, 4, 1);
    xu.step();
    xu.step();
    assert_eq!(xu.steps(), 2);
    assert_eq!(engine.progress_calls.load(Ordering::Relaxed), 0);
    assert_eq!(xu.health(), XuHealth::Healthy);
    assert_eq!(xu.queue().last_completed().seq_num(), 0);
    // The XU still works: a later submit is stepped and completed as usual.
    let (seq, status) = submit(&xu, 1).unwrap();
    assert_eq!(step_while_has_work(&xu), 1);
    assert!(xu.queue().is_completed(seq));
    assert_eq!(status.get(), Some(NrtStatus::Success));
}

#[test]
fn in_flight_keeps_the_wakeup_counted_until_done() {
    let engine = Script::with(&[Progress::InFlight, Progress::InFlight]);
    let (xu, _) = xu_with(engine.clone(), 0, 4, 1);
    let (seq, status) = submit(&xu, 1).unwrap();
    xu.step();
    assert!(
        has_work(&xu),
        "in flight: the count is not consumed, epoll wakes the worker again"
    );
    assert_eq!(status.get(), None);
    assert_eq!(step_while_has_work(&xu), 2);
    assert!(xu.queue().is_completed(seq));
    assert_eq!(engine.progress_calls.load(Ordering::Relaxed), 3);
}

#[test]
fn an_error_poisons_the_xu_and_later_submits_get_101() {
    let (xu, _) = xu_with(
        Script::with(&[Progress::Error(NrtStatus::ExecHwErrDmaAbort)]),
        0,
        4,
        1,
    );
    let (_, status) = submit(&xu, 1).unwrap();
    xu.step();
    assert_eq!(status.get(), Some(NrtStatus::ExecHwErrDmaAbort));
    assert_eq!(xu.health(), XuHealth::FatalShutdown);
    assert_eq!(submit(&xu, 1).err(), Some(NrtStatus::ExecUnitUnrecoverable));
}

#[test]
fn fatal_shutdown_steps_past_queued_work_with_101_without_running_it() {
    let engine = Script::with(&[]);
    let (xu, metrics) = xu_with(engine.clone(), 1, 4, 1);
    let a = submit(&xu, 1).unwrap().1;
    let b = submit(&xu, 1).unwrap().1;
    xu.poison();
    assert_eq!(step_while_has_work(&xu), 2);
    assert_eq!(
        engine.progress_calls.load(Ordering::Relaxed),
        0,
        "nothing ran"
    );
    assert_eq!(a.get(), Some(NrtStatus::ExecUnitUnrecoverable));
    assert_eq!(b.get(), Some(NrtStatus::ExecUnitUnrecoverable));
    assert_eq!(
        metrics.snapshot(1).unwrap().executions(),
        2,
        "EXECUTE items are counted"
    );
}

#[test]
fn a_stop_item_never_touches_metrics() {
    let engine = Script::with(&[]);
    let (xu, metrics) = xu_with(engine.clone(), 2, 4, 1);
    xu.schedule_stop(0).unwrap();
    assert_eq!(step_while_has_work(&xu), 1);
    assert_eq!(engine.stops.load(Ordering::Relaxed), 1);
    assert_eq!(engine.progress_calls.load(Ordering::Relaxed), 0);
    let m = metrics.snapshot(2).unwrap();
    assert_eq!(
        (m.executions(), m.e2e.count, m.device.count),
        (0, 0, 0),
        "STOP carries no timings"
    );
    submit(&xu, 1).unwrap();
    step_while_has_work(&xu);
    let m = metrics.snapshot(2).unwrap();
    assert_eq!(
        (m.executions_with(NrtStatus::Success), m.device.last_us),
        (1, 2)
    );
}

#[test]
#[should_panic(expected = "submit/complete pairing broken")]
fn report_complete_without_a_wakeup_count_is_the_seeds_abort() {
    let (xu, _) = xu_with(Script::with(&[]), 0, 4, 1);
    xu.report_complete(None, NrtStatus::Success);
}

#[test]
fn funnel_gates_come_in_the_seeds_order() {
    // Full and fatal at once: 101 wins.
    let (xu, _) = xu_with(Script::with(&[]), 0, 1, 1);
    submit(&xu, 1).unwrap();
    assert_eq!(submit(&xu, 1).err(), Some(NrtStatus::QueueFull));
    xu.poison();
    assert_eq!(submit(&xu, 1).err(), Some(NrtStatus::ExecUnitUnrecoverable));
    // Full and shutting down: 7 wins; a STOP still passes the shutdown gate.
    let (xu, _) = xu_with(Script::with(&[]), 0, 2, 1);
    submit(&xu, 1).unwrap();
    xu.begin_shutdown();
    assert_eq!(submit(&xu, 1).err(), Some(NrtStatus::Closed));
    xu.schedule_stop(0).unwrap();
    assert_eq!(submit(&xu, 1).err(), Some(NrtStatus::QueueFull));
}

#[test]
fn a_stage_or_doorbell_failure_poisons_only_that_xu() {
    let (a, _) = xu_with(Script::with(&[]), 0, 4, 1);
    let (b, _) = xu_with(Script::with(&[]), 1, 4, 1);
    let r = a.schedule_request(
        Box::new(ExecInfo::execute(1, 0)),
        None,
        |_, _| Err(NrtStatus::Resource),
        |_| Ok(()),
    );
    assert_eq!(r.err(), Some(NrtStatus::Resource));
    assert_eq!(submit(&a, 1).err(), Some(NrtStatus::ExecUnitUnrecoverable));
    let r = b.schedule_request(
        Box::new(ExecInfo::execute(1, 0)),
        None,
        |_, _| Ok(()),
        |_| Err(NrtStatus::HwError),
    );
    assert_eq!(r.err(), Some(NrtStatus::HwError));
    let (c, _) = xu_with(Script::with(&[]), 2, 4, 1);
    assert!(submit(&c, 1).is_ok(), "other vNCs unaffected");
    assert_eq!(a.queue().depth(), 0, "nothing published on failure");
}

#[test]
fn model_switch_follows_the_last_posted_model() {
    let (xu, _) = xu_with(Script::with(&[]), 0, 8, 1);
    let switches = Mutex::new(Vec::new());
    for model in [7, 7, 8, 7, 7] {
        xu.schedule_request(
            Box::new(ExecInfo::execute(model, 0)),
            None,
            |_, sw| {
                switches.lock().unwrap().push(sw);
                Ok(())
            },
            |_| Ok(()),
        )
        .unwrap();
    }
    assert_eq!(*switches.lock().unwrap(), [true, false, true, true, false]);
}

#[test]
fn workers_are_joinable_and_thread_count_returns_to_baseline() {
    let xus: Vec<_> = (0..3)
        .map(|v| xu_with(Script::with(&[]), v, 4, 2).0)
        .collect();
    let workers = XuWorkers::start(&xus).unwrap();
    let prefix = workers.thread_name_prefix().to_owned();
    // A spawned thread names itself when it starts running: wait for all three names.
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    while worker_threads(&prefix) < 3 && std::time::Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(1));
    }
    assert_eq!(worker_threads(&prefix), 3);
    for xu in &xus {
        let status = xu
            .execute_sync(Box::new(ExecInfo::execute(1, 0)), |_, _| Ok(()), |_| Ok(()))
            .unwrap();
        assert_eq!(status, NrtStatus::Success);
    }
    workers.destroy();
    assert_eq!(worker_threads(&prefix), 0);
}

#[test]
fn sync_waiters_are_woken_through_pooled_fresh_and_polled_paths() {
    for pool in [0, 1, 4] {
        let (xu, _) = xu_with(Script::with(&[Progress::InFlight; 5]), 0, 4, pool);
        let workers = XuWorkers::start(std::slice::from_ref(&xu)).unwrap();
        for _ in 0..50 {
            let st = xu
                .execute_sync(Box::new(ExecInfo::execute(1, 0)), |_, _| Ok(()), |_| Ok(()))
                .unwrap();
            assert_eq!(st, NrtStatus::Success);
        }
        let (seq, status) = submit(&xu, 1).unwrap();
        if let Some(fd) = xu.install_fresh_comp_efd(seq).unwrap() {
            let mut fds = [PollFd::new(fd.as_fd(), PollFlags::POLLIN)];
            assert_eq!(
                poll(&mut fds, PollTimeout::from(5000u16)).unwrap(),
                1,
                "fresh efd signalled"
            );
        }
        assert!(xu.queue().is_completed(seq));
        assert_eq!(status.get(), Some(NrtStatus::Success));
        workers.destroy();
    }
}

#[test]
#[should_panic(expected = "runtime bug")]
fn a_wakeup_before_completion_is_the_seeds_runtime_bug_abort() {
    let (xu, _) = xu_with(Script::with(&[]), 0, 4, 1);
    let (seq, _) = submit(&xu, 1).unwrap();
    xu.efd_pool_poke_for_test();
    let _ = xu.wait_for_completion(seq, None);
}

#[test]
fn polling_fallback_respects_its_budget() {
    let (xu, _) = xu_with(Script::with(&[]), 0, 4, 0);
    let (seq, _) = submit(&xu, 1).unwrap();
    assert_eq!(
        xu.wait_for_completion(seq, Some(Duration::from_millis(20))),
        Err(NrtStatus::Timeout)
    );
}

#[test]
fn shutdown_drains_stops_and_closes() {
    let engine = Script::with(&[]);
    let xus: Vec<_> = (0..2).map(|v| xu_with(engine.clone(), v, 4, 2).0).collect();
    let workers = XuWorkers::start(&xus).unwrap();
    for xu in &xus {
        submit(xu, 5).unwrap();
    }
    xus[1].poison();
    shutdown(&xus, || 0);
    assert_eq!(
        engine.stops.load(Ordering::Relaxed),
        1,
        "a STOP ran on the healthy XU"
    );
    assert_eq!(submit(&xus[0], 5).err(), Some(NrtStatus::Closed));
    assert_eq!(
        submit(&xus[1], 5).err(),
        Some(NrtStatus::ExecUnitUnrecoverable)
    );
    assert_eq!(xus[0].queue().scheduled_head(), xus[0].queue().exec_head());
    workers.destroy();
}

#[test]
fn deferred_unstage_runs_after_the_last_execution_of_the_model() {
    let engine = Script::with(&[Progress::InFlight]);
    let (xu, _) = xu_with(engine.clone(), 0, 4, 1);
    submit(&xu, 3).unwrap();
    step_while_has_work(&xu);
    submit(&xu, 3).unwrap();
    assert!(
        xu.defer_unstage(3),
        "model 3 is the last executed and work is queued"
    );
    assert!(engine.unstaged.lock().unwrap().is_empty());
    step_while_has_work(&xu);
    assert_eq!(*engine.unstaged.lock().unwrap(), [3]);
    assert!(!xu.defer_unstage(3), "idle: unstage now");
}

#[test]
#[should_panic(expected = "implicit_async_mode")]
fn an_execution_reaching_the_step_in_implicit_async_mode_trips_the_assert() {
    let cfg = XuConfig {
        vnc: 0,
        tpbs: vec![0],
        capacity: 4,
        efd_pool_size: 1,
        implicit_async_mode: true,
    };
    let xu = Xu::new(cfg, Script::with(&[]), Arc::new(Metrics::new(1))).unwrap();
    submit(&xu, 1).unwrap();
    xu.step();
}

#[test]
fn the_xu_table_finds_xus_by_vcore_and_by_compute_xu_id() {
    let mut table = XuTable::new();
    let (xu, _) = xu_with(Script::with(&[]), 5, 4, 1);
    table.insert(xu.clone());
    assert!(Arc::ptr_eq(table.get_by_vcore(5).unwrap(), &xu));
    assert!(table.get_by_vcore(4).is_none());
    assert!(Arc::ptr_eq(
        table.get(XuId::new(XuType::Compute, 0, 5)).unwrap(),
        &xu
    ));
    assert!(
        table.get(XuId::new(XuType::TensorOp, 0, 5)).is_none(),
        "only COMPUTE ids name an XU"
    );
    assert_eq!(xu.xu_id(), XuId::new(XuType::Compute, 0, 5));
}

#[test]
#[should_panic(expected = "NRTA_SEQ_NUM_MAX")]
fn the_48_bit_seq_space_is_asserted_never_to_wrap() {
    let q = XuQueue::<u64>::new(XuId::new(XuType::Compute, 0, 0), 4).unwrap();
    q.set_cursors_for_test(shared::ids::NRTA_SEQ_NUM_MAX - 1);
    let _ = q.client_submit(Box::new(1), None);
}

#[test]
fn a_million_items_pass_through_a_small_ring_once_and_in_order() {
    const N: u64 = 1_000_000;
    let q = Arc::new(XuQueue::<u64>::new(XuId::new(XuType::Compute, 0, 0), 4).unwrap());
    let producer = {
        let q = q.clone();
        std::thread::spawn(move || {
            for i in 1..=N {
                let mut item = Box::new(i);
                loop {
                    match q.client_submit(item, None) {
                        Ok(seq) => {
                            assert_eq!(seq.seq_num(), i);
                            break;
                        }
                        Err((_, back)) => {
                            item = back;
                            std::hint::spin_loop();
                        }
                    }
                }
                q.client_trigger_next().unwrap();
            }
        })
    };
    let mut expected = 1;
    while expected <= N {
        if let Some(seq) = q.worker_peek_current_exec() {
            assert_eq!(seq.seq_num(), expected);
            assert_eq!(
                q.worker_take_item().map(|b| *b),
                Some(expected),
                "seen exactly once, in order"
            );
            q.worker_pop_current_exec().unwrap();
            expected += 1;
        } else {
            std::hint::spin_loop();
        }
    }
    producer.join().unwrap();
    assert_eq!(q.worker_peek_current_exec(), None);
    assert_eq!(q.last_completed().seq_num(), N);
}
