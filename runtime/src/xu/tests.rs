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

use super::handoff::CompEfd;
use super::queue::{ExecStatus, XuQueue};
use super::unit::{
    CompletionEngine, ExecInfo, PopMoment, Progress, Xu, XuConfig, XuHealth, shutdown,
};
use super::worker::XuWorkers;
use super::{ExecutionUnit, XuTable};
use crate::metrics::Metrics;

/// A completion engine double: scripted outcomes (default: done with success), counters.
#[derive(Debug, Default)]
struct Script {
    outcomes: Mutex<VecDeque<Progress>>,
    progress_calls: AtomicU64,
    stops: AtomicU64,
    unstaged: Mutex<Vec<u64>>,
    /// What [`CompletionEngine::completed`] saw, in order.
    completed: Mutex<Vec<(SeqId, NrtStatus)>>,
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
        info.resp[0].nc_ns = 2_000;
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

    fn completed(&self, _vnc: u32, seq_id: SeqId, _info: &ExecInfo<u64>, status: NrtStatus) {
        self.completed.lock().unwrap().push((seq_id, status));
    }
}

fn xu_with<E: CompletionEngine>(
    engine: Arc<E>,
    vnc: u32,
    capacity: usize,
    pool: usize,
) -> (Arc<Xu<E>>, Arc<Metrics>) {
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

fn submit<E: CompletionEngine<Request = u64>>(
    xu: &Xu<E>,
    model: u64,
) -> Result<(SeqId, Arc<ExecStatus>), NrtStatus> {
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

/// One worker per XU (each its own vNC group).
fn one_per_worker<E: CompletionEngine>(xus: &[Arc<Xu<E>>]) -> Vec<Vec<Arc<dyn ExecutionUnit>>> {
    xus.iter()
        .map(|xu| vec![xu.clone() as Arc<dyn ExecutionUnit>])
        .collect()
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

/// The engine's last look (`completed`) comes once per EXECUTE item with its seq_id and status
/// — done, failed, or stepped past on the degraded XU — before the status is published.
#[test]
fn the_engine_sees_every_execute_item_complete_with_its_seq_id_and_status() {
    let engine = Script::with(&[
        Progress::InFlight,
        Progress::Done(NrtStatus::Success),
        Progress::Error(NrtStatus::HwError),
    ]);
    let (xu, _metrics) = xu_with(engine.clone(), 1, 4, 1);
    let subs: Vec<_> = (0..3).map(|_| submit(&xu, 1).unwrap()).collect();
    assert!(matches!(xu.step(), super::StepOutcome::Ready));
    assert!(
        engine.completed.lock().unwrap().is_empty(),
        "in flight: not yet"
    );
    step_while_has_work(&xu);
    let seen = engine.completed.lock().unwrap().clone();
    assert_eq!(
        seen,
        [
            (subs[0].0, NrtStatus::Success),
            (subs[1].0, NrtStatus::HwError),
            (subs[2].0, NrtStatus::ExecUnitUnrecoverable),
        ]
    );
    for ((_, cell), (_, status)) in subs.iter().zip(&seen) {
        assert_eq!(cell.get(), Some(*status));
    }
}

/// An xu_id has a 4-bit queue and an 8-bit vNC: an XU whose queue or vNC does not fit is
/// refused with NRT_INVALID (`XuId::new` would assert).
#[test]
fn an_xu_whose_id_fields_do_not_fit_is_invalid_not_a_panic() {
    let make = |xu_type, queue: u8, vnc: u32| {
        let cfg = XuConfig {
            vnc,
            queue,
            tpbs: vec![0],
            capacity: 4,
            efd_pool_size: 1,
            ..XuConfig::default()
        };
        Xu::new_typed(xu_type, cfg, Script::with(&[]), Arc::new(Metrics::new(1)))
            .map(|xu| xu.xu_id())
    };
    for xu_type in [XuType::TensorOp, XuType::Compute, XuType::Collectives] {
        for queue in [16, 17, 200, u8::MAX] {
            assert_eq!(
                make(xu_type, queue, 0).unwrap_err().status,
                NrtStatus::Invalid,
                "queue {queue}"
            );
        }
        for vnc in [256, 1000, u32::MAX] {
            assert_eq!(
                make(xu_type, 0, vnc).unwrap_err().status,
                NrtStatus::Invalid,
                "vnc {vnc}"
            );
        }
        assert_eq!(
            make(xu_type, 15, 255).unwrap(),
            XuId::new(xu_type, 15, 255),
            "the largest fit"
        );
    }
}

/// An eventfd refused for a descriptor limit is NRT_RESOURCE naming the limit (it was
/// NRT_FAILURE with no reason: "creating an execution unit").
#[test]
fn an_eventfd_refused_for_the_fd_limit_is_a_resource_error_naming_the_limit() {
    use nix::errno::Errno;
    let e = crate::error::os_error(Errno::EMFILE, "its has_work eventfd");
    assert_eq!(e.status, NrtStatus::Resource);
    for part in ["has_work eventfd", "EMFILE", "ulimit -n"] {
        assert!(e.message.contains(part), "{part}: {}", e.message);
    }
    assert_eq!(
        crate::error::os_error(Errno::ENFILE, "x").status,
        NrtStatus::Resource
    );
    assert_eq!(
        crate::error::os_error(Errno::EINVAL, "x").status,
        NrtStatus::Failure
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
    xu.report_complete_for_test(None, NrtStatus::Success);
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
    let workers = XuWorkers::start(&one_per_worker(&xus)).unwrap();
    let prefix = workers.thread_name_prefix().to_owned();
    // A spawned thread names itself when it starts running: wait for all three names.
    assert_eq!(settled_worker_threads(&prefix, 3), 3);
    for xu in &xus {
        let status = xu
            .execute_sync(Box::new(ExecInfo::execute(1, 0)), |_, _| Ok(()), |_| Ok(()))
            .unwrap();
        assert_eq!(status, NrtStatus::Success);
    }
    workers.destroy();
    // A joined thread's /proc entry outlives its join by a moment (the kernel wakes the
    // joiner when the thread releases its memory, before the task is reaped): wait for it.
    // A thread still running — not stopped, not joined — never leaves.
    assert_eq!(settled_worker_threads(&prefix, 0), 0);
}

/// The count of `prefix`'s worker threads once it is `expected`, or after 5 s.
fn settled_worker_threads(prefix: &str, expected: usize) -> usize {
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    while worker_threads(prefix) != expected && std::time::Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(1));
    }
    worker_threads(prefix)
}

#[test]
fn sync_waiters_are_woken_through_pooled_fresh_and_polled_paths() {
    for pool in [0, 1, 4] {
        let (xu, _) = xu_with(Script::with(&[Progress::InFlight; 5]), 0, 4, pool);
        let workers = XuWorkers::start(&one_per_worker(std::slice::from_ref(&xu))).unwrap();
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
    let workers = XuWorkers::start(&one_per_worker(&xus)).unwrap();
    for xu in &xus {
        submit(xu, 5).unwrap();
    }
    xus[1].poison();
    shutdown(&xus);
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
        queue: 0,
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
fn the_xu_table_finds_xus_of_every_type_by_vcore_and_by_xu_id() {
    let mut table = XuTable::new();
    let (xu, _) = xu_with(Script::with(&[]), 5, 4, 1);
    table.insert(xu.clone()).unwrap();
    let dyn_xu: Arc<dyn ExecutionUnit> = xu.clone();
    let same = |a: &Arc<dyn ExecutionUnit>, b: &Arc<dyn ExecutionUnit>| {
        std::ptr::addr_eq(Arc::as_ptr(a), Arc::as_ptr(b))
    };
    let on5: Vec<_> = table.get_by_vcore(5).collect();
    assert_eq!(on5.len(), 1);
    assert!(same(on5[0], &dyn_xu));
    assert!(table.get_by_vcore(4).next().is_none());
    assert!(same(
        table.get(XuId::new(XuType::Compute, 0, 5)).unwrap(),
        &dyn_xu
    ));
    assert!(
        table.get(XuId::new(XuType::TensorOp, 0, 5)).is_none(),
        "no TENSOR_OP XU inserted on vNC 5"
    );
    assert_eq!(xu.xu_id(), XuId::new(XuType::Compute, 0, 5));
    // Every type and queue has its slot; a queue the type does not have names nothing.
    let mut all = vec![dyn_xu.clone()];
    for (t, q) in [
        (XuType::TensorOp, 0),
        (XuType::TensorOp, 1),
        (XuType::Collectives, 0),
        (XuType::Collectives, 1),
        (XuType::Collectives, 2),
    ] {
        let other = typed_xu(Script::with(&[]), t, q, 5);
        table.insert(other.clone()).unwrap();
        all.push(other);
    }
    for x in &all {
        assert!(same(table.get(x.xu_id()).unwrap(), x), "{:?}", x.xu_id());
        assert_eq!(x.xu_id().vnc_id(), 5);
    }
    assert_eq!(table.get_by_vcore(5).count(), 6);
    assert_eq!(table.groups().len(), 1, "one group: vNC 5");
    assert_eq!(table.groups()[0].len(), 6);
    assert!(table.get(XuId::new(XuType::Compute, 1, 5)).is_none());
    assert!(table.get(XuId::new(XuType::TensorOp, 2, 5)).is_none());
    assert!(table.get(XuId::new(XuType::Collectives, 3, 5)).is_none());
    assert!(
        table.get(XuId::from_raw(0x0503)).is_none(),
        "type 3 does not exist"
    );
    let bad = typed_xu(Script::with(&[]), XuType::Compute, 1, 5);
    assert!(table.insert(bad).is_err(), "COMPUTE has one queue");
}

/// An XU of `xu_type`, queue `queue`, on `vnc`.
fn typed_xu<E: CompletionEngine>(
    engine: Arc<E>,
    xu_type: XuType,
    queue: u8,
    vnc: u32,
) -> Arc<dyn ExecutionUnit> {
    let cfg = XuConfig {
        vnc,
        queue,
        tpbs: vec![0],
        capacity: 4,
        efd_pool_size: 1,
        ..XuConfig::default()
    };
    Arc::new(Xu::new_typed(xu_type, cfg, engine, Arc::new(Metrics::new(1))).unwrap())
}

#[test]
#[should_panic(expected = "NRTA_SEQ_NUM_MAX")]
fn the_48_bit_seq_space_is_asserted_never_to_wrap() {
    let (mut p, _c) = XuQueue::<u64>::with_capacity(XuId::new(XuType::Compute, 0, 0), 4).unwrap();
    p.queue()
        .set_cursors_for_test(shared::ids::NRTA_SEQ_NUM_MAX - 1);
    let _ = p.client_submit(Box::new(1), None);
}

#[test]
fn a_million_items_pass_through_a_small_ring_once_and_in_order() {
    const N: u64 = 1_000_000;
    let (mut p, mut c) =
        XuQueue::<u64>::with_capacity(XuId::new(XuType::Compute, 0, 0), 4).unwrap();
    let q = c.queue().clone();
    let producer = {
        std::thread::spawn(move || {
            for i in 1..=N {
                let mut item = Box::new(i);
                loop {
                    match p.client_submit(item, None) {
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
                p.client_trigger_next().unwrap();
            }
        })
    };
    let mut expected = 1;
    while expected <= N {
        if let Some(seq) = c.worker_peek_current_exec() {
            assert_eq!(seq.seq_num(), expected);
            assert_eq!(
                c.worker_take_item().map(|b| *b),
                Some(expected),
                "seen exactly once, in order"
            );
            c.worker_pop_current_exec(|_, _| Ok(())).unwrap();
            expected += 1;
        } else {
            std::hint::spin_loop();
        }
    }
    producer.join().unwrap();
    assert_eq!(c.worker_peek_current_exec(), None);
    assert_eq!(q.last_completed().seq_num(), N);
}

#[test]
fn report_complete_consumes_the_wakeup_and_publishes_the_status_before_the_pop() {
    // Observed at the pop itself (inside mark_comp_lock, before the signal): a report_complete
    // that read has_work_efd after the pop would show the count not yet consumed, one that
    // published the status after the pop would show it pending.
    let (xu, _) = xu_with(Script::with(&[Progress::Done(NrtStatus::ExecOob)]), 0, 4, 1);
    let seen = Arc::new(Mutex::new(Vec::new()));
    let sink = seen.clone();
    xu.on_pop_for_test(move |m| sink.lock().unwrap().push(m));
    let (first, _) = submit(&xu, 1).unwrap();
    let (second, _) = submit(&xu, 1).unwrap();
    assert_eq!(xu.has_work_count_for_test(), 2);
    xu.step();
    xu.step();
    assert_eq!(
        *seen.lock().unwrap(),
        [
            PopMoment {
                seq_id: first,
                status: Some(NrtStatus::ExecOob),
                has_work_count: 1
            },
            PopMoment {
                seq_id: second,
                status: Some(NrtStatus::Success),
                has_work_count: 0
            },
        ]
    );
}

#[test]
fn a_failed_completion_signal_completes_the_request_closes_the_fresh_fd_and_degrades_the_xu() {
    let (xu, _) = xu_with(Script::with(&[]), 0, 4, 1);
    let (seq, status) = submit(&xu, 1).unwrap();
    // The read end of a pipe as the completion fd: its write fails (EBADF).
    let (read_end, write_end) = nix::unistd::pipe().unwrap();
    assert!(
        xu.queue()
            .install_comp_efd(seq, CompEfd::Fresh(read_end))
            .is_installed()
    );
    xu.step();
    assert_eq!(status.get(), Some(NrtStatus::Success));
    assert!(xu.is_completed(seq), "the slot was popped");
    assert_eq!(xu.health(), XuHealth::FatalShutdown);
    assert_eq!(
        nix::unistd::write(&write_end, b"x"),
        Err(nix::errno::Errno::EPIPE),
        "the fresh fd was closed although its write failed"
    );
    assert_eq!(submit(&xu, 1).err(), Some(NrtStatus::ExecUnitUnrecoverable));
}

#[test]
fn a_read_error_on_the_completion_eventfd_is_nrt_failure_not_a_panic() {
    // Non-blocking pool eventfds: read(2) before the completion fails with EAGAIN.
    let cfg = XuConfig {
        vnc: 0,
        queue: 0,
        tpbs: vec![0],
        capacity: 4,
        efd_pool_size: 1,
        implicit_async_mode: false,
    };
    let mut xu = Xu::new(cfg, Script::with(&[]), Arc::new(Metrics::new(1))).unwrap();
    xu.use_nonblocking_efd_pool_for_test(1);
    let (seq, status) = submit(&xu, 1).unwrap();
    assert_eq!(xu.wait_for_completion(seq, None), Err(NrtStatus::Failure));
    assert_eq!(
        xu.efd_pool_available(),
        0,
        "the eventfd the slot still holds left the pool"
    );
    xu.step();
    assert!(xu.is_completed(seq));
    assert_eq!(status.get(), Some(NrtStatus::Success));
    assert_eq!(
        xu.health(),
        XuHealth::Healthy,
        "the late signal found an open fd"
    );
}

static SIGUSR1_HANDLED: AtomicU64 = AtomicU64::new(0);

extern "C" fn count_sigusr1(_: nix::libc::c_int) {
    SIGUSR1_HANDLED.fetch_add(1, Ordering::SeqCst);
}

/// Waits until thread `tid` sleeps outside a futex (here: in `read(mark_comp_efd)`).
fn wait_until_blocked_in_read(tid: nix::unistd::Pid) {
    let dir = format!("/proc/self/task/{tid}");
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        let Ok(stat) = std::fs::read_to_string(format!("{dir}/stat")) else {
            panic!("the waiter ended: its wait did not survive the signal");
        };
        let state = stat.rsplit(')').next().unwrap().split_whitespace().next();
        let wchan = std::fs::read_to_string(format!("{dir}/wchan")).unwrap_or_default();
        if state == Some("S") && !wchan.contains("futex") {
            return;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the waiter never blocked: {state:?} {wchan}"
        );
        std::thread::sleep(Duration::from_millis(1));
    }
}

#[test]
fn a_signal_during_the_wait_is_retried_and_the_wait_returns_after_completion() {
    use nix::sys::signal::{SaFlags, SigAction, SigHandler, SigSet, Signal, sigaction};
    // No SA_RESTART: the blocked read(2) returns EINTR when the handler runs.
    let action = SigAction::new(
        SigHandler::Handler(count_sigusr1),
        SaFlags::empty(),
        SigSet::empty(),
    );
    // SAFETY: the handler only increments an atomic (async-signal-safe); SIGUSR1 is used by no
    // other test of this binary.
    unsafe { sigaction(Signal::SIGUSR1, &action) }.unwrap();
    let (xu, _) = xu_with(Script::with(&[Progress::Done(NrtStatus::ExecOob)]), 0, 4, 1);
    let (seq, status) = submit(&xu, 1).unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    let waiter = {
        let xu = xu.clone();
        std::thread::spawn(move || {
            // SAFETY: pthread_self has no preconditions.
            let me = unsafe { nix::libc::pthread_self() };
            tx.send((me, nix::unistd::gettid())).unwrap();
            xu.wait_for_completion(seq, None)
        })
    };
    let (thread, tid) = rx.recv().unwrap();
    let before = SIGUSR1_HANDLED.load(Ordering::SeqCst);
    for i in 1..=3 {
        wait_until_blocked_in_read(tid);
        // SAFETY: `thread` is the waiter, alive until joined below.
        let rc = unsafe { nix::libc::pthread_kill(thread, nix::libc::SIGUSR1) };
        assert_eq!(rc, 0);
        while SIGUSR1_HANDLED.load(Ordering::SeqCst) < before + i {
            std::thread::sleep(Duration::from_millis(1));
        }
    }
    wait_until_blocked_in_read(tid);
    assert!(!waiter.is_finished(), "EINTR ended the wait");
    xu.step();
    assert_eq!(waiter.join().unwrap(), Ok(()));
    assert_eq!(status.get(), Some(NrtStatus::ExecOob));
}

/// An engine whose executions stay in flight until `exec_open`, and whose STOP waits for
/// `stop_open`; it logs completions in order (`STOP` for the stop request).
#[derive(Debug, Default)]
struct Gated {
    exec_open: std::sync::atomic::AtomicBool,
    stop_open: std::sync::atomic::AtomicBool,
    log: Mutex<Vec<u64>>,
}

const STOP: u64 = u64::MAX;

impl CompletionEngine for Gated {
    type Request = u64;

    fn progress_one_step(&self, _vnc: u32, info: &mut ExecInfo<u64>) -> Progress {
        if !self.exec_open.load(Ordering::Acquire) {
            std::thread::sleep(Duration::from_millis(1));
            return Progress::InFlight;
        }
        self.log.lock().unwrap().push(info.model_id);
        Progress::Done(NrtStatus::Success)
    }

    fn wait_model_stop(&self, _vnc: u32) -> Result<(), NrtStatus> {
        while !self.stop_open.load(Ordering::Acquire) {
            std::thread::sleep(Duration::from_millis(1));
        }
        self.log.lock().unwrap().push(STOP);
        Ok(())
    }
}

#[test]
fn shutdown_drains_a_full_xu_then_runs_the_stop_then_drains_again() {
    let engine = Arc::new(Gated::default());
    let (xu, _) = xu_with(engine.clone(), 0, 4, 1);
    let workers = XuWorkers::start(&one_per_worker(std::slice::from_ref(&xu))).unwrap();
    for model in 1..=4 {
        submit(&xu, model).unwrap();
    }
    assert_eq!(submit(&xu, 5).err(), Some(NrtStatus::QueueFull));
    let shutting = {
        let xu = xu.clone();
        std::thread::spawn(move || shutdown(&[xu]))
    };
    // All four stay in flight: a shutdown without its first drain would now schedule the STOP
    // into the full queue and be refused (QUEUE_FULL), so the STOP would never run.
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(xu.depth(), 4);
    engine.exec_open.store(true, Ordering::Release);
    // The STOP is queued and held: a shutdown without its second drain would return now.
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while engine.log.lock().unwrap().len() < 4 && std::time::Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(1));
    }
    std::thread::sleep(Duration::from_millis(300));
    let returned_early = shutting.is_finished();
    engine.stop_open.store(true, Ordering::Release);
    shutting.join().unwrap();
    assert!(
        !returned_early,
        "shutdown returned before its STOP completed"
    );
    assert_eq!(*engine.log.lock().unwrap(), [1, 2, 3, 4, STOP]);
    assert_eq!(xu.depth(), 0, "everything drained");
    assert_eq!(submit(&xu, 1).err(), Some(NrtStatus::Closed));
    workers.destroy();
}

#[test]
fn the_drain_waits_for_triggered_work_only() {
    // A request submitted but not triggered (a submitter between xuq_client_submit and the
    // trigger): wait_exec_queue_empty polls scheduled_head == exec_head and returns at once;
    // polling the tail would wait for a slot nobody will ever complete.
    let (xu, _) = xu_with(Script::with(&[]), 0, 4, 1);
    xu.submit_untriggered_for_test(Box::new(ExecInfo::execute(1, 0)));
    assert_eq!(xu.depth(), 1);
    let (tx, rx) = std::sync::mpsc::channel();
    let drain = {
        let xu = xu.clone();
        std::thread::spawn(move || {
            xu.wait_exec_queue_empty(std::time::Instant::now());
            tx.send(()).unwrap();
        })
    };
    assert!(
        rx.recv_timeout(Duration::from_secs(5)).is_ok(),
        "the drain waited on scheduled_tail"
    );
    drain.join().unwrap();
}

#[test]
fn a_pooled_completion_eventfd_goes_back_to_the_pool_after_each_wait() {
    let (xu, _) = xu_with(Script::with(&[]), 0, 4, 1);
    let workers = XuWorkers::start(&one_per_worker(std::slice::from_ref(&xu))).unwrap();
    for _ in 0..3 {
        let (seq, status) = submit(&xu, 1).unwrap();
        assert_eq!(xu.wait_for_completion(seq, None), Ok(()));
        assert_eq!(status.get(), Some(NrtStatus::Success));
        assert_eq!(xu.efd_pool_available(), 1);
    }
    workers.destroy();
}

#[test]
fn a_wait_for_a_request_never_submitted_is_invalid() {
    let (xu, _) = xu_with(Script::with(&[]), 0, 4, 1);
    let (seq, _) = submit(&xu, 1).unwrap();
    let future = SeqId::new(xu.xu_id(), seq.seq_num() + 1);
    assert_eq!(
        xu.wait_for_completion(future, None),
        Err(NrtStatus::Invalid)
    );
    assert_eq!(
        xu.install_fresh_comp_efd(future).err(),
        Some(NrtStatus::Invalid)
    );
    assert_eq!(xu.efd_pool_available(), 1);
}

// ---- XUs of every type, the per-vNC worker, completion events (issue 12) ----

/// An engine whose request stays in flight until its eventfd is written; it names that eventfd
/// as the wake fd (`within`: none), as the notification-queue engine does on simdev.
#[derive(Debug)]
struct Stalled {
    efd: nix::sys::eventfd::EventFd,
    progress_calls: AtomicU64,
}

impl Stalled {
    fn new() -> Arc<Self> {
        Arc::new(Self {
            efd: nix::sys::eventfd::EventFd::from_value_and_flags(
                0,
                nix::sys::eventfd::EfdFlags::EFD_NONBLOCK,
            )
            .unwrap(),
            progress_calls: AtomicU64::new(0),
        })
    }
}

impl CompletionEngine for Stalled {
    type Request = u64;

    fn progress_one_step(&self, _vnc: u32, _info: &mut ExecInfo<u64>) -> Progress {
        self.progress_calls.fetch_add(1, Ordering::Relaxed);
        match self.efd.read() {
            Ok(_) => Progress::Done(NrtStatus::Success),
            Err(_) => Progress::InFlight,
        }
    }

    fn wake_on(&self, _vnc: u32, _info: &ExecInfo<u64>) -> Option<super::Wake<'_>> {
        Some(super::Wake {
            fd: self.efd.as_fd(),
            within: None,
        })
    }
}

/// An XU of `xu_type`/`queue` on `vnc`, typed.
fn typed<E: CompletionEngine>(
    engine: Arc<E>,
    xu_type: XuType,
    queue: u8,
    vnc: u32,
    capacity: usize,
) -> Arc<Xu<E>> {
    let cfg = XuConfig {
        vnc,
        queue,
        tpbs: vec![vnc],
        capacity,
        efd_pool_size: 2,
        ..XuConfig::default()
    };
    Arc::new(Xu::new_typed(xu_type, cfg, engine, Arc::new(Metrics::new(4))).unwrap())
}

fn wait_until(what: &str, mut f: impl FnMut() -> bool) {
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while !f() {
        assert!(
            std::time::Instant::now() < deadline,
            "timed out waiting: {what}"
        );
        std::thread::sleep(Duration::from_micros(200));
    }
}

#[test]
fn the_xu_id_carries_type_queue_and_vnc_and_each_xu_has_its_own_sequence() {
    let a = typed(Script::with(&[]), XuType::TensorOp, 1, 7, 4);
    let b = typed(Script::with(&[]), XuType::TensorOp, 0, 7, 4);
    assert_eq!(a.xu_id(), XuId::new(XuType::TensorOp, 1, 7));
    assert_eq!(a.xu_id().queue(), 1);
    let (s1, _) = submit(&a, 1).unwrap();
    let (s2, _) = submit(&a, 1).unwrap();
    let (t1, _) = submit(&b, 1).unwrap();
    assert_eq!((s1.seq_num(), s2.seq_num(), t1.seq_num()), (1, 2, 1));
    assert_eq!(s1.xu_id(), a.xu_id());
    assert_eq!(t1.xu_id(), b.xu_id());
}

/// Seed 004 §4: one worker per vNC epolls every XU it owns. A request in flight on one XU
/// (its engine waiting on an event that does not come) must not stall the others: 50
/// requests on another XU of the vNC all complete while it is still in flight, and the
/// stalled XU is not stepped again until its wake fd fires (a worker that let the step sleep,
/// or re-stepped it on its still-readable has_work_efd, would step it once per round).
#[test]
fn a_stalled_xu_does_not_stall_the_other_xus_of_its_vnc() {
    let stalled = Stalled::new();
    let compute = typed(stalled.clone(), XuType::Compute, 0, 0, 4);
    let tensor = typed(Script::with(&[]), XuType::TensorOp, 0, 0, 64);
    let workers = XuWorkers::start(&[vec![
        tensor.clone() as Arc<dyn ExecutionUnit>,
        compute.clone(),
    ]])
    .unwrap();
    assert_eq!(workers.len(), 1, "one worker for the vNC");
    let (held, held_status) = submit(&*compute, 1).unwrap();
    wait_until("the compute request's first step", || {
        stalled.progress_calls.load(Ordering::Relaxed) >= 1
    });
    let reqs: Vec<_> = (0..50).map(|_| submit(&*tensor, 2).unwrap()).collect();
    let last = reqs.last().unwrap().0;
    wait_until("50 tensor requests", || tensor.is_completed(last));
    for (seq, status) in &reqs {
        assert!(tensor.is_completed(*seq));
        assert_eq!(status.get(), Some(NrtStatus::Success));
    }
    assert!(!compute.is_completed(held), "still in flight");
    assert_eq!(held_status.get(), None);
    assert_eq!(
        stalled.progress_calls.load(Ordering::Relaxed),
        1,
        "the stalled XU waited on its wake fd, not stepped per round"
    );
    // Its event comes: the worker steps it and it completes.
    stalled.efd.write(1).unwrap();
    wait_until("the compute request", || compute.is_completed(held));
    assert_eq!(held_status.get(), Some(NrtStatus::Success));
    // And the worker watches its has_work_efd again.
    let (next, _) = submit(&*compute, 1).unwrap();
    stalled.efd.write(1).unwrap();
    wait_until("the next compute request", || compute.is_completed(next));
    workers.destroy();
}

/// [`Stalled`], naming its eventfd as the idle wake too (as the notification-queue engine
/// names the NC's notification eventfd), watched for `within`.
#[derive(Debug)]
struct Watching {
    inner: Arc<Stalled>,
    within: Option<Duration>,
}

impl CompletionEngine for Watching {
    type Request = u64;

    fn progress_one_step(&self, vnc: u32, info: &mut ExecInfo<u64>) -> Progress {
        self.inner.progress_one_step(vnc, info)
    }

    fn wake_on(&self, vnc: u32, info: &ExecInfo<u64>) -> Option<super::Wake<'_>> {
        self.inner.wake_on(vnc, info)
    }

    fn idle_wake(&self, _vnc: u32, _info: &ExecInfo<u64>) -> Option<super::Wake<'_>> {
        Some(super::Wake {
            fd: self.inner.efd.as_fd(),
            within: self.within,
        })
    }

    /// A request released while the completing step was ending (the test submits as soon as
    /// it sees the completion, which on a loaded machine is before the worker has left that
    /// step) is covered by the watch while nothing is written to the fd yet, as the simdev
    /// engine answers: without this the worker steps it at once on its count (the trait's
    /// default), and the test saw one step more about once in sixty runs under load.
    fn progress_shows_on(&self, _vnc: u32, _info: &ExecInfo<u64>, wake: &super::Wake<'_>) -> bool {
        let mut fds = [PollFd::new(wake.fd, PollFlags::POLLIN)];
        poll(&mut fds, PollTimeout::ZERO).unwrap() == 0
    }
}

/// A worker over one XU of a [`Watching`] engine whose idle watch lasts `within`, after one
/// request completed: the worker is in its idle watch.
fn idle_watching(within: Option<Duration>) -> (Arc<Stalled>, Arc<Xu<Watching>>, XuWorkers) {
    let inner = Stalled::new();
    let engine = Arc::new(Watching {
        inner: inner.clone(),
        within,
    });
    let xu = typed(engine, XuType::Compute, 0, 0, 4);
    let workers = XuWorkers::start(&[vec![xu.clone() as Arc<dyn ExecutionUnit>]]).unwrap();
    let (first, _) = submit(&*xu, 1).unwrap();
    inner.efd.write(1).unwrap();
    wait_until("the first request", || xu.is_completed(first));
    (inner, xu, workers)
}

/// The idle watch: once a request completed and nothing else is released, the worker watches
/// the engine's idle wake fd instead of `has_work_efd`, so the next request is stepped first
/// when its completion can be harvested — one step, not one at its `has_work_efd` write and
/// another at its notification. The `has_work_efd` count still pairs one write per submit
/// with one read per completion.
#[test]
fn after_an_idle_watch_begins_the_next_request_is_stepped_first_at_its_notification() {
    let (inner, xu, workers) = idle_watching(None);
    let calls = inner.progress_calls.load(Ordering::Relaxed);
    let (next, status) = submit(&*xu, 1).unwrap();
    // A worker that watched has_work_efd would step `next` now (and find it in flight). The
    // idle watch has no deadline here, so the correct worker cannot step it before the write.
    std::thread::sleep(Duration::from_millis(30));
    assert_eq!(
        inner.progress_calls.load(Ordering::Relaxed),
        calls,
        "the next request was stepped before its notification"
    );
    assert_eq!(
        xu.has_work_count_for_test(),
        1,
        "its has_work_efd count is kept"
    );
    inner.efd.write(1).unwrap();
    wait_until("the next request", || xu.is_completed(next));
    assert_eq!(status.get(), Some(NrtStatus::Success));
    assert_eq!(
        inner.progress_calls.load(Ordering::Relaxed),
        calls + 1,
        "one step for the next request"
    );
    assert_eq!(xu.has_work_count_for_test(), 0);
    workers.destroy();
}

/// The idle watch ends on the wake fd while a request is released but its submitter has not
/// yet written `has_work_efd` (preempted between the trigger and the write): the worker must
/// not step it then — stepped to completion, its `report_complete` would find no count to
/// consume (the seed's runtime-bug abort; the worker thread would die and its waiter hang).
/// It is stepped once the count is there.
#[test]
fn an_idle_watch_never_steps_a_released_request_before_its_has_work_efd_write() {
    let (inner, xu, workers) = idle_watching(None);
    let calls = inner.progress_calls.load(Ordering::Relaxed);
    // Released, its "notification" posted, its has_work_efd write not yet made.
    let next = xu.submit_before_wake_for_test(Box::new(ExecInfo::execute(1, 0)));
    inner.efd.write(1).unwrap();
    std::thread::sleep(Duration::from_millis(30));
    assert_eq!(
        inner.progress_calls.load(Ordering::Relaxed),
        calls,
        "stepped before its has_work_efd write"
    );
    assert!(!xu.is_completed(next));
    xu.wake_for_test();
    wait_until("the next request", || xu.is_completed(next));
    assert_eq!(xu.has_work_count_for_test(), 0);
    workers.destroy();
}

/// A request that makes no progress on the idle wake fd — a STOP, here — is stepped when the
/// idle watch's `within` ends (a worker that kept watching the idle fd past `within` would
/// leave the STOP pending forever).
#[test]
fn a_request_that_never_shows_on_the_idle_wake_fd_is_stepped_when_the_watch_ends() {
    let (inner, xu, workers) = idle_watching(Some(Duration::from_millis(5)));
    let stop = xu.schedule_stop(0).unwrap();
    wait_until("the STOP request", || xu.is_completed(stop));
    assert_eq!(xu.has_work_count_for_test(), 0);
    // And after the watch the worker is woken by has_work_efd again: a request whose engine
    // completes it at its first step completes without any write to the wake fd.
    std::thread::sleep(Duration::from_millis(20));
    inner.efd.write(1).unwrap(); // its "notification" is already there when it is stepped
    let (last, _) = submit(&*xu, 1).unwrap();
    wait_until("the last request", || xu.is_completed(last));
    workers.destroy();
}

/// An engine whose notifications are posted by the test: a step drains its eventfd (as the
/// notification-queue engine does) and completes the request when a notification is posted,
/// and [`CompletionEngine::progress_posted`] says whether one is.
#[derive(Debug)]
struct Posting {
    efd: Arc<nix::sys::eventfd::EventFd>,
    posted: AtomicU64,
    progress_calls: AtomicU64,
    /// Each completion appends `tag` here.
    log: Arc<Mutex<Vec<char>>>,
    tag: char,
}

impl Posting {
    fn new(
        efd: Arc<nix::sys::eventfd::EventFd>,
        log: Arc<Mutex<Vec<char>>>,
        tag: char,
    ) -> Arc<Self> {
        Arc::new(Self {
            efd,
            posted: AtomicU64::new(0),
            progress_calls: AtomicU64::new(0),
            log,
            tag,
        })
    }
}

fn nonblocking_efd() -> Arc<nix::sys::eventfd::EventFd> {
    Arc::new(
        nix::sys::eventfd::EventFd::from_value_and_flags(
            0,
            nix::sys::eventfd::EfdFlags::EFD_NONBLOCK,
        )
        .unwrap(),
    )
}

impl CompletionEngine for Posting {
    type Request = u64;

    fn progress_one_step(&self, _vnc: u32, _info: &mut ExecInfo<u64>) -> Progress {
        self.progress_calls.fetch_add(1, Ordering::Relaxed);
        let _ = self.efd.read();
        let taken = self
            .posted
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| n.checked_sub(1));
        if taken.is_ok() {
            Progress::Done(NrtStatus::Success)
        } else {
            Progress::InFlight
        }
    }

    fn wake_on(&self, _vnc: u32, _info: &ExecInfo<u64>) -> Option<super::Wake<'_>> {
        Some(super::Wake {
            fd: self.efd.as_fd(),
            within: None,
        })
    }

    fn progress_posted(&self, _vnc: u32, _info: &ExecInfo<u64>) -> bool {
        self.posted.load(Ordering::Acquire) > 0
    }

    fn completed(&self, _vnc: u32, _seq_id: SeqId, _info: &ExecInfo<u64>, _status: NrtStatus) {
        self.log.lock().unwrap().push(self.tag);
    }
}

/// What [`posting_in_flight`] sets up: the engine, its XU, the worker, the requests.
type PostingInFlight = (
    Arc<Posting>,
    Arc<Xu<Posting>>,
    XuWorkers,
    Vec<(SeqId, Arc<ExecStatus>)>,
);

/// A worker over one XU of a [`Posting`] engine with `depth` requests released and in flight
/// (the first stepped once and waiting on the wake fd): returns them once the worker sleeps.
fn posting_in_flight(depth: usize) -> PostingInFlight {
    let engine = Posting::new(nonblocking_efd(), Arc::default(), 'a');
    let xu = typed(engine.clone(), XuType::Compute, 0, 0, 64);
    let workers = XuWorkers::start(&[vec![xu.clone() as Arc<dyn ExecutionUnit>]]).unwrap();
    let mut reqs = vec![submit(&*xu, 1).unwrap()];
    wait_until("the first request's step", || {
        engine.progress_calls.load(Ordering::Relaxed) >= 1
    });
    // The worker waits on the wake fd and no longer watches has_work_efd: these submits do
    // not wake it.
    reqs.extend((1..depth).map(|_| submit(&*xu, 1).unwrap()));
    (engine, xu, workers, reqs)
}

/// Harvest bursts: with 8 executions in flight and all their notifications posted at once
/// (simdev posts a batch), one wake-up of the worker harvests all 8 — each later one is stepped
/// right after the previous completion, not after another `epoll_wait` — and each is stepped
/// once (no step finds its request still in flight). Every completion still consumed one
/// `has_work_efd` count. (The worker before bursts returned from `epoll_wait` once per
/// execution: 8 times here.)
#[test]
fn posted_notifications_are_harvested_in_one_burst_without_epoll_waits_between() {
    let (engine, xu, workers, reqs) = posting_in_flight(8);
    let before = workers.epoll_returns();
    let calls = engine.progress_calls.load(Ordering::Relaxed);
    engine.posted.store(8, Ordering::Release);
    engine.efd.write(1).unwrap();
    let last = reqs.last().unwrap().0;
    wait_until("the 8 requests", || xu.is_completed(last));
    for (_, status) in &reqs {
        assert_eq!(status.get(), Some(NrtStatus::Success));
    }
    assert_eq!(
        engine.progress_calls.load(Ordering::Relaxed) - calls,
        8,
        "one step per request"
    );
    assert_eq!(
        workers.epoll_returns() - before,
        1,
        "one epoll_wait return (the wake fd) for the whole batch"
    );
    assert_eq!(xu.has_work_count_for_test(), 0);
    workers.destroy();
}

/// A burst never steps a released request whose `has_work_efd` write has not come, even with
/// its notification posted: its completion would find no count to read (the seed's
/// runtime-bug abort; a burst that stepped every *released* request would kill the worker
/// thread here). It is stepped at its `has_work_efd` write.
#[test]
fn a_burst_never_steps_a_released_request_before_its_has_work_efd_write() {
    let (engine, xu, workers, reqs) = posting_in_flight(2);
    // Released, posted, its has_work_efd write not yet made.
    let third = xu.submit_before_wake_for_test(Box::new(ExecInfo::execute(1, 0)));
    let calls = engine.progress_calls.load(Ordering::Relaxed);
    engine.posted.store(3, Ordering::Release);
    engine.efd.write(1).unwrap();
    wait_until("the 2 counted requests", || xu.is_completed(reqs[1].0));
    std::thread::sleep(Duration::from_millis(30));
    assert!(
        !xu.is_completed(third),
        "stepped before its has_work_efd write"
    );
    assert_eq!(engine.progress_calls.load(Ordering::Relaxed) - calls, 2);
    xu.wake_for_test();
    wait_until("the third request", || xu.is_completed(third));
    assert_eq!(xu.has_work_count_for_test(), 0);
    workers.destroy();
}

/// What a [`Racing`] engine runs in its `idle_wake`, before the drain: the submitter that the
/// completion woke, running before the worker's step ends.
type RaceHook = Box<dyn FnOnce() + Send>;

/// A [`Posting`] engine with an idle watch on its eventfd (drained there, as the
/// notification-queue engine drains the NC's eventfd) and a hook run in `idle_wake` just
/// before the drain; [`CompletionEngine::progress_shows_on`] is "nothing posted yet".
struct Racing {
    inner: Arc<Posting>,
    hook: Mutex<Option<RaceHook>>,
}

impl std::fmt::Debug for Racing {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Racing")
            .field("inner", &self.inner)
            .finish_non_exhaustive()
    }
}

impl CompletionEngine for Racing {
    type Request = u64;

    fn progress_one_step(&self, vnc: u32, info: &mut ExecInfo<u64>) -> Progress {
        self.inner.progress_one_step(vnc, info)
    }

    fn wake_on(&self, vnc: u32, info: &ExecInfo<u64>) -> Option<super::Wake<'_>> {
        self.inner.wake_on(vnc, info)
    }

    fn idle_wake(&self, _vnc: u32, _info: &ExecInfo<u64>) -> Option<super::Wake<'_>> {
        if let Some(hook) = self.hook.lock().unwrap().take() {
            hook();
        }
        let _ = self.inner.efd.read();
        Some(super::Wake {
            fd: self.inner.efd.as_fd(),
            within: None,
        })
    }

    fn progress_posted(&self, vnc: u32, info: &ExecInfo<u64>) -> bool {
        self.inner.progress_posted(vnc, info)
    }

    fn progress_shows_on(&self, _vnc: u32, _info: &ExecInfo<u64>, _wake: &super::Wake<'_>) -> bool {
        self.inner.posted.load(Ordering::Acquire) == 0
    }
}

/// A worker over one XU of a [`Racing`] engine whose first request, posted, completes at its
/// first step; while that step ends, `race` runs with the XU (the submitter woken by the
/// completion). Returns once the first request completed, with the request `race` submitted.
fn racing(
    race: impl FnOnce(&Posting, &Xu<Racing>) -> SeqId + Send + 'static,
) -> (Arc<Posting>, Arc<Xu<Racing>>, XuWorkers, SeqId) {
    let posting = Posting::new(nonblocking_efd(), Arc::default(), 'a');
    posting.posted.store(1, Ordering::Release);
    let engine = Arc::new(Racing {
        inner: posting.clone(),
        hook: Mutex::new(None),
    });
    let xu = typed(engine.clone(), XuType::Compute, 0, 0, 4);
    let next = Arc::new(Mutex::new(None));
    let (weak_xu, weak_posting, slot) =
        (Arc::downgrade(&xu), Arc::downgrade(&posting), next.clone());
    *engine.hook.lock().unwrap() = Some(Box::new(move || {
        let (xu, posting) = (weak_xu.upgrade().unwrap(), weak_posting.upgrade().unwrap());
        *slot.lock().unwrap() = Some(race(&posting, &xu));
    }));
    let workers = XuWorkers::start(&[vec![xu.clone() as Arc<dyn ExecutionUnit>]]).unwrap();
    let (first, _) = submit(&*xu, 1).unwrap();
    wait_until("the first request", || xu.is_completed(first));
    let next = next.lock().unwrap().expect("the race ran");
    (posting, xu, workers, next)
}

/// The idle watch covers a request released while its predecessor's step was still ending —
/// the submitter, woken by the completion, ran first (on one busy CPU it usually does): the
/// request is stepped first at its notification, once, not at once on its `has_work_efd`
/// count to be found in flight and waited for on the same fd. (The worker before stepped it
/// at once: two steps and an extra `epoll_wait` per execution for 40 % of back-to-back sync
/// executions on simdev.)
#[test]
fn a_request_released_while_the_last_one_completes_is_stepped_first_at_its_notification() {
    let (engine, xu, workers, next) = racing(|_, xu| submit(xu, 1).unwrap().0);
    std::thread::sleep(Duration::from_millis(30));
    assert_eq!(
        engine.progress_calls.load(Ordering::Relaxed),
        1,
        "the next request was stepped before its notification"
    );
    assert!(!xu.is_completed(next));
    assert_eq!(xu.has_work_count_for_test(), 1, "its count is kept");
    engine.posted.store(1, Ordering::Release);
    engine.efd.write(1).unwrap();
    wait_until("the next request", || xu.is_completed(next));
    assert_eq!(
        engine.progress_calls.load(Ordering::Relaxed),
        2,
        "one step for the next request"
    );
    assert_eq!(xu.has_work_count_for_test(), 0);
    workers.destroy();
}

/// ... but not one whose notification was posted before the watch's fd was drained: that
/// write is gone, and a watch (here without a deadline) would wait for it forever. It is
/// harvested at once (a worker that entered the watch for any request released meanwhile
/// never completes it).
#[test]
fn a_request_released_and_posted_before_the_idle_drain_is_harvested_at_once() {
    let (engine, xu, workers, next) = racing(|engine, xu| {
        let (next, _) = submit(xu, 1).unwrap();
        engine.posted.store(1, Ordering::Release);
        engine.efd.write(1).unwrap();
        next
    });
    wait_until("the request posted before the drain", || {
        xu.is_completed(next)
    });
    assert_eq!(engine.progress_calls.load(Ordering::Relaxed), 2);
    assert_eq!(xu.has_work_count_for_test(), 0);
    workers.destroy();
}

/// Fairness across a vNC's XUs: a harvest burst is bounded by `MAX_BURST`. Two XUs of one
/// worker wait on the same wake fd with everything posted — 40 requests on the first, 1 on
/// the second; the one wake-up resumes the first (a burst) and then the second, whose request
/// completes after at most `MAX_BURST` of the first's, not after all 40 (an unbounded burst
/// would starve it).
#[test]
fn a_harvest_burst_is_bounded_so_the_other_xus_of_the_vnc_get_their_turn() {
    const {
        assert!(
            super::worker::MAX_BURST < 40,
            "the test needs a burst shorter than a's queue"
        )
    };
    let (efd, log) = (nonblocking_efd(), Arc::new(Mutex::new(Vec::new())));
    let a = Posting::new(efd.clone(), log.clone(), 'a');
    let b = Posting::new(efd.clone(), log.clone(), 'b');
    let xa = typed(a.clone(), XuType::Compute, 0, 0, 64);
    let xb = typed(b.clone(), XuType::TensorOp, 0, 0, 64);
    let workers =
        XuWorkers::start(&[vec![xa.clone() as Arc<dyn ExecutionUnit>, xb.clone()]]).unwrap();
    let first_a = submit(&*xa, 1).unwrap();
    wait_until("a's first step", || {
        a.progress_calls.load(Ordering::Relaxed) >= 1
    });
    let (last_b, _) = submit(&*xb, 1).unwrap();
    wait_until("b's first step", || {
        b.progress_calls.load(Ordering::Relaxed) >= 1
    });
    let rest: Vec<_> = (1..40).map(|_| submit(&*xa, 1).unwrap()).collect();
    a.posted.store(40, Ordering::Release);
    b.posted.store(1, Ordering::Release);
    efd.write(1).unwrap();
    let last_a = rest.last().unwrap().0;
    wait_until("all requests", || {
        xa.is_completed(last_a) && xb.is_completed(last_b)
    });
    assert!(xa.is_completed(first_a.0));
    let log = log.lock().unwrap().clone();
    let b_at = log.iter().position(|t| *t == 'b').unwrap();
    assert_eq!(log.len(), 41);
    assert!(
        b_at <= super::worker::MAX_BURST as usize,
        "b completed only after {b_at} of a's completions: {log:?}"
    );
    workers.destroy();
}

/// An engine that names a wake fd nobody writes but a `within`: the worker steps it again when
/// `within` elapses.
#[derive(Debug)]
struct Ticking(Arc<Stalled>);

impl CompletionEngine for Ticking {
    type Request = u64;

    fn progress_one_step(&self, vnc: u32, info: &mut ExecInfo<u64>) -> Progress {
        let calls = self.0.progress_calls.load(Ordering::Relaxed);
        self.0.progress_one_step(vnc, info);
        if calls >= 3 {
            Progress::Done(NrtStatus::Success)
        } else {
            Progress::InFlight
        }
    }

    fn wake_on(&self, _vnc: u32, _info: &ExecInfo<u64>) -> Option<super::Wake<'_>> {
        Some(super::Wake {
            fd: self.0.efd.as_fd(),
            within: Some(Duration::from_millis(5)),
        })
    }
}

#[test]
fn a_waiting_xu_is_stepped_again_when_its_within_elapses() {
    let inner = Stalled::new();
    let xu = typed(Arc::new(Ticking(inner.clone())), XuType::Compute, 0, 0, 4);
    let workers = XuWorkers::start(&one_per_worker(std::slice::from_ref(&xu))).unwrap();
    let (seq, status) = submit(&*xu, 1).unwrap();
    wait_until("completion after 4 steps", || xu.is_completed(seq));
    assert_eq!(status.get(), Some(NrtStatus::Success));
    assert_eq!(inner.progress_calls.load(Ordering::Relaxed), 4);
    workers.destroy();
}

const ALL_TYPES: [XuType; 3] = [XuType::TensorOp, XuType::Compute, XuType::Collectives];

/// An engine that records which model each step ran.
#[derive(Debug, Default)]
struct Recorder(Mutex<Vec<u64>>);

impl CompletionEngine for Recorder {
    type Request = u64;

    fn progress_one_step(&self, _vnc: u32, info: &mut ExecInfo<u64>) -> Progress {
        self.0.lock().unwrap().push(info.model_id);
        Progress::Done(NrtStatus::ExecCompletedWithErr)
    }
}

/// The per-request `ret` is published before the request shows as completed, on every XU
/// type, seen through the trait.
#[test]
fn ret_is_written_before_the_request_shows_completed_on_every_xu_type() {
    for t in ALL_TYPES {
        let xu = typed(Arc::new(Recorder::default()), t, 0, 1, 4);
        let view: Arc<dyn ExecutionUnit> = xu.clone();
        let seen = Arc::new(Mutex::new(Vec::new()));
        let s2 = seen.clone();
        // At the pop (the moment exec_head moves, inside mark_comp_lock, before any signal):
        // the status cell must already read the request's status.
        xu.on_pop_for_test(move |m| s2.lock().unwrap().push(m.status));
        let (seq, status) = submit(&*xu, 1).unwrap();
        assert!(!view.is_completed(seq));
        assert_eq!(status.get(), None);
        view.step(super::WorkerKey::new());
        assert_eq!(
            *seen.lock().unwrap(),
            [Some(NrtStatus::ExecCompletedWithErr)],
            "{t:?}"
        );
        assert!(view.is_completed(seq));
        assert_eq!(status.get(), Some(NrtStatus::ExecCompletedWithErr));
        assert_eq!(view.last_completed(), seq);
    }
}

/// NRT_QUEUE_FULL changes nothing on every XU type: no stage, no sequence consumed, no slot
/// written, no wake-up counted.
#[test]
fn queue_full_changes_nothing_on_every_xu_type() {
    for t in ALL_TYPES {
        let engine = Arc::new(Recorder::default());
        let xu = typed(engine.clone(), t, 0, 2, 2);
        submit(&*xu, 1).unwrap();
        submit(&*xu, 2).unwrap();
        let (tail, count) = (xu.queue().scheduled_tail(), xu.has_work_count_for_test());
        let staged = std::cell::Cell::new(false);
        let refused = xu.schedule_request(
            Box::new(ExecInfo::execute(3, 0)),
            Some(Arc::new(ExecStatus::new())),
            |_, _| {
                staged.set(true);
                Ok(())
            },
            |_| Ok(()),
        );
        assert_eq!(refused, Err(NrtStatus::QueueFull), "{t:?}");
        assert!(!staged.get(), "{t:?}: nothing staged");
        assert_eq!(
            xu.queue().scheduled_tail(),
            tail,
            "{t:?}: no sequence consumed"
        );
        assert_eq!(
            xu.has_work_count_for_test(),
            count,
            "{t:?}: no wake-up counted"
        );
        assert_eq!(xu.depth(), 2);
        step_while_has_work_any(&xu);
        // The slot the refused request would have overwritten (cursor 3 shares request 1's)
        // still ran request 1; the next request gets seq_num 3.
        assert_eq!(*engine.0.lock().unwrap(), [1, 2], "{t:?}: no slot written");
        assert_eq!(submit(&*xu, 4).unwrap().0.seq_num(), 3, "{t:?}");
    }
}

fn step_while_has_work_any<E: CompletionEngine>(xu: &Xu<E>) {
    let mut steps = 0;
    loop {
        let mut fds = [PollFd::new(xu.has_work_fd(), PollFlags::POLLIN)];
        if poll(&mut fds, PollTimeout::ZERO).unwrap() == 0 || steps > 1000 {
            break;
        }
        xu.step();
        steps += 1;
    }
}

/// Progress::Error degrades only its own XU: 101 there, the vNC's other XUs (same worker)
/// keep working.
#[test]
fn a_fatal_error_degrades_only_its_own_xu() {
    let compute = typed(
        Script::with(&[Progress::Error(NrtStatus::ExecHwErrDmaAbort)]),
        XuType::Compute,
        0,
        0,
        4,
    );
    let q0 = typed(Script::with(&[]), XuType::TensorOp, 0, 0, 4);
    let q1 = typed(Script::with(&[]), XuType::TensorOp, 1, 0, 4);
    let workers = XuWorkers::start(&[vec![
        q0.clone() as Arc<dyn ExecutionUnit>,
        compute.clone(),
        q1.clone(),
    ]])
    .unwrap();
    let (seq, status) = submit(&*compute, 1).unwrap();
    wait_until("the failing request", || compute.is_completed(seq));
    assert_eq!(status.get(), Some(NrtStatus::ExecHwErrDmaAbort));
    assert_eq!(compute.health(), XuHealth::FatalShutdown);
    assert_eq!(
        submit(&*compute, 1).err(),
        Some(NrtStatus::ExecUnitUnrecoverable)
    );
    for xu in [&q0, &q1] {
        assert_eq!(xu.health(), XuHealth::Healthy);
        let (s, st) = submit(&**xu, 2).unwrap();
        xu.wait_for_completion(s, Some(Duration::from_secs(20)))
            .unwrap();
        assert_eq!(st.get(), Some(NrtStatus::Success));
    }
    workers.destroy();
}

#[test]
fn collectives_xus_exist_but_refuse_work_without_consuming_a_sequence() {
    let xu = typed(
        Arc::new(super::CollectivesEngine),
        XuType::Collectives,
        2,
        3,
        4,
    );
    assert_eq!(xu.xu_id(), XuId::new(XuType::Collectives, 2, 3));
    let staged = std::cell::Cell::new(false);
    let r = xu.schedule_request(
        Box::new(ExecInfo::execute(1, ())),
        Some(Arc::new(ExecStatus::new())),
        |_, _| {
            staged.set(true);
            Ok(())
        },
        |_| Ok(()),
    );
    assert_eq!(r, Err(NrtStatus::Invalid));
    assert!(!staged.get());
    assert_eq!(xu.queue().scheduled_tail(), 1, "no sequence consumed");
    assert_eq!(xu.has_work_count_for_test(), 0);
    // A STOP at shutdown still passes.
    let workers = XuWorkers::start(&one_per_worker(std::slice::from_ref(&xu))).unwrap();
    shutdown(std::slice::from_ref(&xu));
    assert_eq!(xu.last_completed().seq_num(), 1, "the STOP ran");
    workers.destroy();
}

fn nb_efd() -> nix::sys::eventfd::EventFd {
    nix::sys::eventfd::EventFd::from_value_and_flags(0, nix::sys::eventfd::EfdFlags::EFD_NONBLOCK)
        .unwrap()
}

#[test]
fn a_seq_id_registration_is_signalled_once_and_two_registrations_both() {
    let (xu, _) = xu_with(Script::with(&[]), 0, 4, 1);
    let (seq, _) = submit(&xu, 1).unwrap();
    let (a, b) = (nb_efd(), nb_efd());
    xu.register_seq_completion(seq, Some(a.as_fd())).unwrap();
    xu.register_seq_completion(seq, Some(b.as_fd())).unwrap();
    assert_eq!(
        a.read(),
        Err(nix::errno::Errno::EAGAIN),
        "not before completion"
    );
    // The caller keeps its fd: the XU holds duplicates, so its own stays usable and the
    // signal reaches the same eventfd.
    xu.step();
    assert_eq!(a.read(), Ok(1));
    assert_eq!(b.read(), Ok(1));
    // Another request completing does not signal them again.
    submit(&xu, 1).unwrap();
    xu.step();
    assert_eq!(a.read(), Err(nix::errno::Errno::EAGAIN));
    assert_eq!(b.read(), Err(nix::errno::Errno::EAGAIN));
}

#[test]
fn registering_an_already_completed_seq_signals_at_once() {
    let (xu, _) = xu_with(Script::with(&[]), 0, 4, 1);
    let (seq, _) = submit(&xu, 1).unwrap();
    xu.step();
    let a = nb_efd();
    xu.register_seq_completion(seq, Some(a.as_fd())).unwrap();
    assert_eq!(a.read(), Ok(1));
    // seq_num 0 (what get_sequence returns before any completion) is completed too.
    let zero = SeqId::new(xu.xu_id(), 0);
    xu.register_seq_completion(zero, Some(a.as_fd())).unwrap();
    assert_eq!(a.read(), Ok(1));
    // Deregistering a completed request changes nothing.
    xu.register_seq_completion(seq, None).unwrap();
}

#[test]
fn a_deregistered_seq_id_eventfd_is_never_signalled() {
    let (xu, _) = xu_with(Script::with(&[]), 0, 4, 1);
    let (seq, _) = submit(&xu, 1).unwrap();
    let (a, b) = (nb_efd(), nb_efd());
    xu.register_seq_completion(seq, Some(a.as_fd())).unwrap();
    xu.register_seq_completion(seq, Some(b.as_fd())).unwrap();
    xu.register_seq_completion(seq, None).unwrap();
    xu.step();
    assert!(xu.is_completed(seq));
    assert_eq!(a.read(), Err(nix::errno::Errno::EAGAIN));
    assert_eq!(b.read(), Err(nix::errno::Errno::EAGAIN));
}

#[test]
fn a_seq_id_of_another_xu_or_beyond_the_last_submitted_is_invalid_to_register() {
    let (xu, _) = xu_with(Script::with(&[]), 0, 4, 1);
    let (seq, _) = submit(&xu, 1).unwrap();
    let a = nb_efd();
    let beyond = SeqId::new(xu.xu_id(), seq.seq_num() + 1);
    let other = SeqId::new(XuId::new(XuType::TensorOp, 0, 0), 1);
    for s in [beyond, other] {
        assert_eq!(
            xu.register_seq_completion(s, Some(a.as_fd())),
            Err(NrtStatus::Invalid)
        );
        assert!(!xu.knows(s));
    }
    assert!(xu.knows(seq));
    assert!(xu.knows(SeqId::new(xu.xu_id(), 0)));
}

#[test]
fn an_xu_completion_eventfd_counts_exactly_the_completions_until_deregistered() {
    let (xu, _) = xu_with(Script::with(&[]), 0, 8, 1);
    let a = nb_efd();
    submit(&xu, 1).unwrap();
    xu.step();
    xu.register_xu_completion(Some(a.as_fd())).unwrap();
    for _ in 0..5 {
        submit(&xu, 1).unwrap();
    }
    step_while_has_work(&xu);
    assert_eq!(
        a.read(),
        Ok(5),
        "the completions after registration, exactly"
    );
    xu.register_xu_completion(None).unwrap();
    submit(&xu, 1).unwrap();
    xu.step();
    assert_eq!(a.read(), Err(nix::errno::Errno::EAGAIN), "deregistered");
}

/// CPU ticks (user + system) the threads named `prefix*` used so far.
fn cpu_ticks(prefix: &str) -> u64 {
    std::fs::read_dir("/proc/self/task")
        .unwrap()
        .filter_map(|t| {
            let path = t.ok()?.path();
            let comm = std::fs::read_to_string(path.join("comm")).ok()?;
            if !comm.trim_end().starts_with(prefix) {
                return None;
            }
            let stat = std::fs::read_to_string(path.join("stat")).ok()?;
            // Fields after the parenthesised comm: state is field 3; utime 14, stime 15.
            let rest = &stat[stat.rfind(')')? + 2..];
            let f: Vec<&str> = rest.split_whitespace().collect();
            Some(f[11].parse::<u64>().ok()? + f[12].parse::<u64>().ok()?)
        })
        .sum()
}

/// A wake fd written while no request waits on it (a late event) is one event, dropped, not
/// spun on: watched level-triggered and undrained, it would wake the worker until a later
/// step drains it. Idle, the worker uses (next to) no CPU; spinning, it uses what it gets of
/// the 500 ms.
#[test]
fn a_wake_fd_firing_with_nobody_waiting_does_not_spin_the_worker() {
    let stalled = Stalled::new();
    let xu = typed(stalled.clone(), XuType::Compute, 0, 0, 4);
    let workers = XuWorkers::start(&one_per_worker(std::slice::from_ref(&xu))).unwrap();
    let prefix = workers.thread_name_prefix().to_owned();
    let (seq, _) = submit(&*xu, 1).unwrap();
    wait_until("the first step", || {
        stalled.progress_calls.load(Ordering::Relaxed) >= 1
    });
    stalled.efd.write(1).unwrap();
    wait_until("completion", || xu.is_completed(seq));
    // A late event: nobody waits, nobody drains it.
    stalled.efd.write(1).unwrap();
    std::thread::sleep(Duration::from_millis(20));
    let before = cpu_ticks(&prefix);
    std::thread::sleep(Duration::from_millis(500));
    let used = cpu_ticks(&prefix) - before;
    assert!(
        used < 5,
        "the worker spun: {used} ticks (of 10 ms) in 500 ms"
    );
    // The next request still completes (its first step drains the late event: the engine
    // double reads it as done, which is fine here).
    let (next, _) = submit(&*xu, 1).unwrap();
    wait_until("the next request", || xu.is_completed(next));
    workers.destroy();
}

/// Shutdown's drain re-checks soon after it starts (the STOP it schedules drains in
/// microseconds) and never sleeps longer than the seed's 100 ms between checks.
#[test]
fn the_drain_poll_backs_off_from_1_ms_to_the_seeds_100_ms() {
    use super::unit::drain_poll_interval;
    let ms: Vec<u128> = (0..10)
        .map(|n| drain_poll_interval(n).as_millis())
        .collect();
    assert_eq!(ms, [1, 2, 4, 8, 16, 32, 64, 100, 100, 100]);
    assert_eq!(drain_poll_interval(u32::MAX), Duration::from_millis(100));
}

/// An engine whose requests hold a token: what a work item holds is observable.
#[derive(Debug, Default)]
struct Holding;

impl CompletionEngine for Holding {
    type Request = Option<Arc<()>>;

    fn progress_one_step(&self, _vnc: u32, _info: &mut ExecInfo<Option<Arc<()>>>) -> Progress {
        Progress::Done(NrtStatus::Success)
    }

    fn wait_model_stop(&self, _vnc: u32) -> Result<(), NrtStatus> {
        Ok(())
    }
}

#[test]
fn a_freed_work_item_releases_what_it_holds_and_its_box_serves_a_later_submit() {
    let (xu, _) = xu_with(Arc::new(Holding), 0, 4, 1);
    let token = Arc::new(());
    let submit_one = |item: Box<ExecInfo<Option<Arc<()>>>>| {
        xu.schedule_request(item, None, |_, _| Ok(()), |_| Ok(()))
            .unwrap();
    };
    let mut boxes = Vec::new();
    for _ in 0..3 {
        let item = xu.work_item(ExecInfo::execute(1, Some(token.clone())));
        boxes.push(std::ptr::from_ref(&*item) as usize);
        submit_one(item);
    }
    assert_eq!(
        Arc::strong_count(&token),
        4,
        "three requests in flight hold it"
    );
    for _ in 0..3 {
        xu.step();
    }
    // Freed (as the seed frees the work item): nothing of the requests is held any more, but
    // their boxes are kept for the next submits.
    assert_eq!(Arc::strong_count(&token), 1);
    assert_eq!(xu.spare_work_items(), 3);
    let again = xu.work_item(ExecInfo::execute(1, Some(token.clone())));
    assert!(boxes.contains(&(std::ptr::from_ref(&*again) as usize)));
    assert_eq!(xu.spare_work_items(), 2);
    submit_one(again);
    xu.step();
    assert_eq!(Arc::strong_count(&token), 1);
    // At most the ring's capacity of boxes is kept, however many were allocated elsewhere.
    for _ in 0..3 {
        for _ in 0..4 {
            submit_one(Box::new(ExecInfo::execute(1, None)));
        }
        for _ in 0..4 {
            xu.step();
        }
    }
    assert_eq!(xu.spare_work_items(), 4);
}
