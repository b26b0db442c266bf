//! Scenario control, in-process: injected faults and their effect on executions, the latency
//! model, DeviceStats, and the trace.

use std::sync::Arc;
use std::sync::atomic::AtomicUsize;

use shared::protocol::{DeviceStats, FaultKind, FaultSpec, FaultWhen, LatencyModel};

use super::*;

fn nth(kind: FaultKind, nc: Option<u32>, n: u64) -> Request {
    Request::InjectFault(FaultSpec {
        kind,
        nc,
        when: FaultWhen::NthExecution(n),
    })
}

fn stats(c: &Client<'_>) -> DeviceStats {
    match c.call(Request::DeviceStats) {
        Reply::DeviceStats(s) => s,
        other => panic!("DeviceStats answered {other:?}"),
    }
}

/// An NC whose executions copy 64 bytes of input to a fresh slot of the output through an
/// I/O queue (SP: DmaStart, DmaWait, End; the other engines End).
struct Io<'c, 'd> {
    rig: Rig<'c, 'd>,
    queue: Queue,
    input: Buf,
    output: Buf,
    addrs: [u64; 5],
    runs: u64,
}

impl<'c, 'd> Io<'c, 'd> {
    fn new(c: &'c Client<'d>, nc: u32) -> Self {
        let rig = Rig::new(c, nc);
        let queue = Queue::new(c, nc, 1, 0, 32);
        let input = c.alloc(MemLocation::Hbm { nc }, 4 * KIB);
        input.write(0, &pattern(64));
        let output = c.alloc(MemLocation::Hbm { nc }, 64 * KIB);
        let sp = rig.program(1, &sp_io_program(1, 0, 1));
        let addrs = rig.ends_but_sp(Some(sp));
        Self {
            rig,
            queue,
            input,
            output,
            addrs,
            runs: 0,
        }
    }

    /// Stages the next execution (with the given reload flags); its output offset.
    fn stage(&mut self, reload: u32, tables: u32) -> u64 {
        let offset = self.runs * 64;
        self.runs += 1;
        self.queue.push(self.input.pa, self.output.pa + offset, 64);
        self.rig.stage(self.addrs, reload, tables, &[]);
        offset
    }

    /// Stages and runs one execution; its notification, and whether it delivered its output.
    fn run(&mut self) -> (NotificationEntry, bool) {
        let offset = self.stage(0, 0);
        let entry = self.rig.run();
        (entry, self.output.read(offset, 64) == pattern(64))
    }
}

#[test]
fn error_faults_add_their_flag_and_the_program_still_runs() {
    let cases = [
        (FaultKind::NcUncorrectable, error_flags::NC_UE),
        (FaultKind::HbmUncorrectable, error_flags::HBM_UE),
        (FaultKind::HbmRepairable, error_flags::HBM_UE_REPAIRABLE),
        (FaultKind::OutOfBounds, error_flags::OOB),
        (FaultKind::Numerical, error_flags::NUMERICAL),
        (FaultKind::GenericError, error_flags::GENERIC),
    ];
    let dev = device();
    let a = Client::new(&dev, 10);
    let mut io = Io::new(&a, 0);
    for (n, (kind, flag)) in (0u32..).zip(cases) {
        a.ok(nth(kind, Some(0), 1));
        let (entry, delivered) = io.run();
        assert_eq!(summary(&entry), execution(2 * n, flag), "{kind:?}");
        assert!(delivered, "{kind:?}: the results are written all the same");
        let (entry, delivered) = io.run();
        assert_eq!(
            summary(&entry),
            execution(2 * n + 1, 0),
            "{kind:?} fired once"
        );
        assert!(delivered);
    }
    let c = a.counters(0);
    assert_eq!((c.executions, c.exec_errors), (12, 6));
    assert_eq!(dev.faults_fired(0), Some(6));
    assert_eq!(dev.faults_fired(1), Some(0));
    assert_eq!(io.rig.exec_status(), Some(dma::QueueStatus::Running));
}

#[test]
fn nth_execution_counts_executions_on_the_nc_from_arming() {
    let dev = device();
    let a = Client::new(&dev, 10);
    let b = Client::new(&dev, 11);
    let mut io = Io::new(&a, 0);
    let mut other = Io::new(&b, 1);
    io.run();
    io.run();
    // Armed by another client: faults apply to the NC whatever its owner.
    b.ok(nth(FaultKind::GenericError, Some(0), 3));
    b.ok(nth(FaultKind::HbmRepairable, None, 2));
    assert_eq!(stats(&a).armed_faults, 2);
    let generic = error_flags::GENERIC;
    // Device-wide executions: NC 1's is the 1st for the `None` fault, NC 0's next the 2nd.
    assert_eq!(summary(&other.run().0), execution(0, 0));
    assert_eq!(
        summary(&io.run().0),
        execution(2, error_flags::HBM_UE_REPAIRABLE)
    );
    assert_eq!(summary(&io.run().0), execution(3, 0), "2nd on NC 0");
    assert_eq!(
        summary(&other.run().0),
        execution(1, 0),
        "NC 1 does not count"
    );
    assert_eq!(summary(&io.run().0), execution(4, generic), "3rd on NC 0");
    assert_eq!(summary(&io.run().0), execution(5, 0));
    assert_eq!(stats(&a).armed_faults, 0, "both fired once");
}

/// The compute indices among 40 executions on a fresh device that a probability fault with
/// `seed` flags.
fn probability_hits(seed: u64) -> Vec<u32> {
    let dev = device();
    let a = Client::new(&dev, 10);
    let mut io = Io::new(&a, 0);
    a.ok(Request::InjectFault(FaultSpec {
        kind: FaultKind::NcUncorrectable,
        nc: Some(0),
        when: FaultWhen::Probability {
            per_million: 300_000,
            seed,
        },
    }));
    let hits: Vec<u32> = (0..40)
        .map(|_| io.run().0)
        .filter(|e| e.error_flags == error_flags::NC_UE)
        .map(|e| e.compute_idx)
        .collect();
    assert_eq!(stats(&a).armed_faults, 1, "a probability fault stays armed");
    assert_eq!(dev.faults_fired(0), Some(hits.len() as u64));
    hits
}

#[test]
fn probability_faults_hit_the_same_executions_for_the_same_seed() {
    let first = probability_hits(7);
    assert!(!first.is_empty() && first.len() < 40, "{first:?}");
    assert_eq!(probability_hits(7), first);
    assert_ne!(probability_hits(8), first);
}

#[test]
fn a_dma_abort_fault_stops_the_exec_queue() {
    let dev = device();
    let a = Client::new(&dev, 10);
    let mut io = Io::new(&a, 0);
    a.ok(nth(FaultKind::DmaAbort, Some(0), 1));
    let (entry, delivered) = io.run();
    assert_eq!(summary(&entry), execution(0, error_flags::DMA_ABORT));
    assert!(delivered);
    let status = io.rig.exec_status();
    assert!(
        matches!(&status, Some(dma::QueueStatus::Stopped(r)) if r.contains("injected DmaAbort")),
        "{status:?}"
    );
    assert_eq!(a.counters(0).dma_aborts, 1);
    // Later counts fail fast until the exec queue is initialised again.
    let (entry, delivered) = io.run();
    assert_eq!(summary(&entry), execution(1, error_flags::GENERIC));
    assert!(!delivered);
    io.rig.reinit_exec();
    io.queue = Queue::new(&a, 0, 1, 0, 32);
    let (entry, delivered) = io.run();
    assert_eq!(summary(&entry), execution(0, 0));
    assert!(delivered);
}

#[test]
fn a_missing_completion_posts_nothing_and_the_index_moves_on() {
    let dev = device();
    let a = Client::new(&dev, 10);
    let mut io = Io::new(&a, 0);
    a.ok(nth(FaultKind::MissingCompletion, Some(0), 1));
    let offset = io.stage(0, 0);
    io.rig.doorbell();
    // Wait (bounded) for the execution's output, not a fixed time: on a loaded machine the
    // sequencer thread may not have run within `quiet`'s 100 ms.
    let deadline = Instant::now() + Duration::from_secs(10);
    while io.output.read(offset, 64) != pattern(64) && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(1));
    }
    io.rig.quiet(0);
    assert_eq!(
        a.semaphore(0, SEM_INFERENCE_START),
        0,
        "the count was taken"
    );
    assert_eq!(io.output.read(offset, 64), pattern(64), "the execution ran");
    let (entry, _) = io.run();
    assert_eq!(summary(&entry), execution(1, 0));
    assert_eq!(io.rig.posted().len(), 1);
    assert_eq!(a.counters(0).executions, 1, "only posted executions count");
    assert_eq!(dev.faults_fired(0), Some(1));
}

#[test]
fn a_late_completion_arrives_after_later_ones() {
    let dev = device();
    let a = Client::new(&dev, 10);
    let mut io = Io::new(&a, 0);
    a.ok(Request::InjectFault(FaultSpec {
        kind: FaultKind::LateCompletion { delay_ms: 1000 },
        nc: Some(0),
        when: FaultWhen::NthExecution(1),
    }));
    io.stage(0, 0);
    io.stage(0, 0);
    let start = Instant::now();
    io.rig.doorbell();
    io.rig.doorbell();
    let first = io.rig.wait(1);
    assert_eq!(
        summary(&first[0]),
        execution(1, 0),
        "the next execution is not held up"
    );
    assert!(start.elapsed() < Duration::from_millis(1000));
    let both = io.rig.wait(2);
    assert!(start.elapsed() >= Duration::from_millis(1000));
    assert_eq!(
        summary(&both[1]),
        execution(0, 0),
        "the stale one comes last"
    );
    assert!(
        both[1].device_ts_ns < both[0].device_ts_ns,
        "it carries the time its execution ended"
    );
    assert_eq!(a.counters(0).executions, 2);
}

#[test]
fn a_late_completion_of_a_reset_nc_is_never_posted() {
    let dev = device();
    let a = Client::new(&dev, 10);
    let mut io = Io::new(&a, 0);
    a.ok(Request::InjectFault(FaultSpec {
        kind: FaultKind::LateCompletion { delay_ms: 500 },
        nc: Some(0),
        when: FaultWhen::NthExecution(1),
    }));
    io.stage(0, 0);
    io.rig.doorbell();
    // Wait until the execution ran (the count taken and the output written).
    let deadline = Instant::now() + Duration::from_secs(10);
    while io.output.read(0, 64) != pattern(64) {
        assert!(Instant::now() < deadline);
        std::thread::sleep(Duration::from_millis(1));
    }
    std::thread::sleep(Duration::from_millis(20));
    let nq = io.rig.posted().len();
    a.ok(Request::NcReset { nc: 0 });
    std::thread::sleep(Duration::from_millis(700));
    assert_eq!(nq, 0);
    let c = a.counters(0);
    assert_eq!(
        (c.executions, c.notifications, c.nq_overflows),
        (0, 0, 0),
        "the late notification was abandoned, not even attempted"
    );
}

#[test]
fn extra_latency_adds_simulated_time_or_real_time_without_a_model() {
    let dev = device();
    let a = Client::new(&dev, 10);
    let mut io = Io::new(&a, 0);
    a.ok(nth(FaultKind::ExtraLatency { ns: 40_000_000 }, Some(0), 1));
    let (entry, _) = io.run();
    assert!(
        entry.nc_ts_ns >= 40_000_000,
        "wall clock: {}",
        entry.nc_ts_ns
    );
    a.ok(Request::SetLatency(LatencyModel {
        per_execution_ns: 1_000,
        ..LatencyModel::default()
    }));
    a.ok(nth(FaultKind::ExtraLatency { ns: 5_000 }, Some(0), 1));
    let start = Instant::now();
    let (slow, _) = io.run();
    assert!(
        start.elapsed() < Duration::from_secs(1),
        "simulated time is not slept without pacing"
    );
    let (fast, _) = io.run();
    // No instruction cost: 1000 per execution, plus 5000 extra once.
    assert_eq!((slow.nc_ts_ns, slow.device_ts_ns), (6_000, 6_000));
    assert_eq!((fast.nc_ts_ns, fast.device_ts_ns), (1_000, 7_000));
}

#[test]
fn clear_faults_disarms_them_all_and_bad_faults_are_refused() {
    let dev = device();
    let a = Client::new(&dev, 10);
    let mut io = Io::new(&a, 0);
    a.ok(nth(FaultKind::GenericError, Some(0), 1));
    a.ok(nth(FaultKind::DeviceLost, None, 1));
    a.ok(Request::InjectFault(FaultSpec {
        kind: FaultKind::OutOfBounds,
        nc: None,
        when: FaultWhen::Probability {
            per_million: 1_000_000,
            seed: 1,
        },
    }));
    assert_eq!(stats(&a).armed_faults, 3);
    a.ok(Request::ClearFaults);
    assert_eq!(stats(&a).armed_faults, 0);
    for n in 0..3 {
        assert_eq!(summary(&io.run().0), execution(n, 0));
    }
    assert!(!dev.is_lost());
    assert_eq!(dev.faults_fired(0), Some(0));

    let refused = a.refused(nth(FaultKind::GenericError, Some(2), 1));
    assert_eq!(refused.kind, ErrorKind::OutOfRange);
    assert!(refused.message.contains("NC 2"), "{}", refused.message);
    let refused = a.refused(nth(FaultKind::GenericError, None, 0));
    assert_eq!(refused.kind, ErrorKind::InvalidArgument);
    let refused = a.refused(Request::InjectFault(FaultSpec {
        kind: FaultKind::GenericError,
        nc: None,
        when: FaultWhen::Probability {
            per_million: 1_000_001,
            seed: 0,
        },
    }));
    assert_eq!(refused.kind, ErrorKind::InvalidArgument);
    assert_eq!(stats(&a).armed_faults, 0);
}

#[test]
fn a_device_lost_fault_posts_device_lost_everywhere_and_calls_the_hook() {
    let dev = device();
    let calls = Arc::new(AtomicUsize::new(0));
    {
        let calls = Arc::clone(&calls);
        dev.on_device_lost(move || {
            calls.fetch_add(1, Ordering::SeqCst);
        });
    }
    let a = Client::new(&dev, 10);
    let b = Client::new(&dev, 11);
    let mut io = Io::new(&a, 0);
    let other = Rig::new(&b, 1);
    io.run();
    a.ok(nth(FaultKind::DeviceLost, Some(0), 1));
    io.stage(0, 0);
    io.rig.doorbell();
    let deadline = Instant::now() + Duration::from_secs(10);
    while calls.load(Ordering::SeqCst) == 0 {
        assert!(Instant::now() < deadline, "the hook was not called");
        std::thread::sleep(Duration::from_millis(1));
    }
    assert!(dev.is_lost());
    let lost = (
        NotificationKind::DeviceLost as u16,
        0,
        error_flags::DEVICE_LOST,
    );
    let posted = io.rig.posted();
    assert_eq!(
        posted.iter().map(summary).collect::<Vec<_>>(),
        [execution(0, 0), lost],
        "no notification of the execution itself"
    );
    assert_eq!(
        other.posted().iter().map(summary).collect::<Vec<_>>(),
        [lost]
    );
    // Stopping afterwards posts nothing more; no execution starts.
    dev.device_lost();
    io.stage(0, 0);
    io.rig.doorbell();
    io.rig.quiet(2);
    assert_eq!(other.posted().len(), 1);
    assert_eq!(calls.load(Ordering::SeqCst), 1);
    assert_eq!(dev.faults_fired(0), Some(1));
}

fn model() -> LatencyModel {
    LatencyModel {
        per_execution_ns: 1_000,
        per_instruction_ns: 10,
        per_config_reload_ns: 500_000,
        per_table_load_ns: 70_000,
        per_nc_reset_ns: 0,
        wall_clock_pacing: false,
    }
}

/// Runs executions with the given reload flags on a fresh device under [`model`]; their
/// notifications.
fn timed_run(flags: &[(u32, u32)]) -> Vec<NotificationEntry> {
    let dev = device();
    let a = Client::new(&dev, 10);
    let mut io = Io::new(&a, 0);
    a.ok(Request::SetLatency(model()));
    flags
        .iter()
        .map(|&(reload, tables)| {
            io.stage(reload, tables);
            io.rig.run()
        })
        .collect()
}

#[test]
fn the_latency_model_charges_executions_exactly() {
    // 7 instructions: four Ends and SP's DmaStart, DmaWait, End.
    let plain = 1_000 + 7 * 10;
    let reloaded = timed_run(&[(1, 1), (0, 0), (1, 0)]);
    let times: Vec<(u64, u64)> = reloaded
        .iter()
        .map(|e| (e.nc_ts_ns, e.device_ts_ns))
        .collect();
    let first = plain + 500_000 + 70_000;
    let third = plain + 500_000;
    assert_eq!(
        times,
        [
            (first, first),
            (plain, first + plain),
            (third, first + plain + third)
        ]
    );
    let without = timed_run(&[(0, 1), (0, 0), (0, 0)]);
    assert_eq!(
        reloaded[2].device_ts_ns - without[2].device_ts_ns,
        2 * 500_000,
        "two runs differing only in config reloads differ by exactly their cost"
    );
}

#[test]
fn setting_a_model_restarts_the_clock_and_the_default_returns_to_wall_time() {
    let dev = device();
    let a = Client::new(&dev, 10);
    let mut io = Io::new(&a, 0);
    a.ok(Request::SetLatency(model()));
    io.run();
    let (second, _) = io.run();
    assert_eq!(second.device_ts_ns, 2 * 1_070);
    a.ok(Request::SetLatency(model()));
    let (restarted, _) = io.run();
    assert_eq!(restarted.device_ts_ns, 1_070);
    a.ok(Request::SetLatency(LatencyModel::default()));
    let before = dev.core.now_ns();
    let (wall, _) = io.run();
    assert!(wall.device_ts_ns >= before, "wall clock again");
    assert_ne!(wall.nc_ts_ns, 1_070);
}

#[test]
fn pacing_takes_at_least_the_simulated_time() {
    let dev = device();
    let a = Client::new(&dev, 10);
    let mut io = Io::new(&a, 0);
    let paced = LatencyModel {
        per_execution_ns: 30_000_000,
        per_instruction_ns: 1_000_000,
        wall_clock_pacing: true,
        ..LatencyModel::default()
    };
    a.ok(Request::SetLatency(paced));
    for _ in 0..2 {
        let start = Instant::now();
        let (entry, _) = io.run();
        let wall = start.elapsed();
        assert_eq!(entry.nc_ts_ns, 37_000_000);
        assert!(
            wall >= Duration::from_nanos(entry.nc_ts_ns),
            "{wall:?} of wall time for {} ns simulated",
            entry.nc_ts_ns
        );
    }
}

#[test]
fn device_stats_follow_allocations_claims_queues_and_reclaim() {
    let dev = device();
    let a = Client::new(&dev, 10);
    let zero = DeviceStats {
        clients: 1,
        ..DeviceStats::default()
    };
    assert_eq!(stats(&a), zero);
    a.claim(0);
    let buf = a.alloc(MemLocation::Hbm { nc: 0 }, 5 * KIB);
    assert_eq!(
        stats(&a),
        DeviceStats {
            memory_in_use: 8 * KIB,
            chunks: 1,
            claimed_ncs: 1,
            ..zero
        }
    );
    a.nq(0, 64); // 128 + 64 * 32 bytes: one 4 KiB chunk.
    let _q = Queue::new(&a, 0, 2, 1, 32); // two 512-byte rings: two 4 KiB chunks.
    let full = DeviceStats {
        memory_in_use: 8 * KIB + 3 * 4 * KIB,
        chunks: 4,
        claimed_ncs: 1,
        dma_queues: 1,
        ..zero
    };
    assert_eq!(stats(&a), full);
    let b = Client::new(&dev, 11);
    b.claim(1);
    b.alloc(MemLocation::Host, 4 * KIB);
    let _qb = Queue::new(&b, 1, 0, 0, 32);
    assert_eq!(
        stats(&a),
        DeviceStats {
            memory_in_use: full.memory_in_use + 3 * 4 * KIB,
            chunks: 7,
            clients: 2,
            claimed_ncs: 2,
            dma_queues: 2,
            ..zero
        }
    );
    dev.disconnect(b.id);
    assert_eq!(stats(&a), full, "b's NC, memory and queue reclaimed");
    a.ok(Request::MemFree { handle: buf.handle });
    assert_eq!(stats(&a).memory_in_use, 3 * 4 * KIB);
    // Release frees the NQ ring and forgets the queue; the ring chunks stay the client's.
    a.ok(Request::ReleaseNc { nc: 0 });
    assert_eq!(
        stats(&a),
        DeviceStats {
            memory_in_use: 2 * 4 * KIB,
            chunks: 2,
            ..zero
        }
    );
    a.claim(0);
    a.ok(nth(FaultKind::Numerical, Some(0), 5));
    assert_eq!(stats(&a).claimed_ncs, 1);
    assert_eq!(stats(&a).armed_faults, 1);
    let id = a.id;
    dev.disconnect(id);
    assert_eq!(
        dev.stats(),
        DeviceStats {
            armed_faults: 1,
            ..DeviceStats::default()
        },
        "a gone client leaves nothing behind; faults belong to the device"
    );
}

/// A device writing its trace into a fresh temporary directory.
fn traced() -> (tempfile::TempDir, Device) {
    let dir = tempfile::tempdir().unwrap();
    let config = Config {
        trace: Some(dir.path().join("trace.json")),
        ..config()
    };
    (dir, Device::new(&config).unwrap())
}

fn trace_events(dev: &Device) -> Vec<serde_json::Value> {
    let summary = dev.write_trace().unwrap().unwrap();
    let text = std::fs::read_to_string(&summary.path).unwrap();
    let json: serde_json::Value = serde_json::from_str(&text).unwrap();
    let events = json["traceEvents"].as_array().unwrap().clone();
    assert_eq!(
        events.iter().filter(|e| e["ph"] != "M").count(),
        summary.events
    );
    events
}

fn of_cat<'e>(events: &'e [serde_json::Value], cat: &str) -> Vec<&'e serde_json::Value> {
    events.iter().filter(|e| e["cat"] == cat).collect()
}

#[test]
fn the_trace_holds_instructions_dma_doorbells_and_notifications() {
    let (_dir, dev) = traced();
    let a = Client::new(&dev, 10);
    let mut io = Io::new(&a, 0);
    a.ok(nth(FaultKind::NcUncorrectable, Some(0), 1));
    io.run();
    let events = trace_events(&dev);
    let named = |name: &str, tid: u64| {
        events.iter().any(|e| {
            e["ph"] == "M" && e["pid"] == 0 && e["tid"] == tid && e["args"]["name"] == name
        })
    };
    assert!(named("NC 0", 0) && named("sequencer", 1) && named("SP", 6) && named("DMA", 7));

    let instructions = of_cat(&events, "instruction");
    let on = |tid: u64| {
        instructions
            .iter()
            .filter(|e| e["tid"] == tid)
            .map(|e| e["name"].as_str().unwrap())
            .collect::<Vec<_>>()
    };
    assert_eq!(on(6), ["DmaStart", "DmaWait", "End"], "SP's program");
    for tid in 2..=5 {
        assert_eq!(on(tid), ["End"]);
    }
    assert!(
        instructions.iter().all(|e| e["ph"] == "X"
            && e["dur"].as_f64().is_some()
            && e["args"]["compute_idx"] == 0)
    );

    let dma = of_cat(&events, "dma");
    let io_run = dma
        .iter()
        .find(|e| e["args"]["engine"] == 1 && e["args"]["queue"] == 0)
        .expect("the I/O queue's run");
    assert_eq!(
        (&io_run["args"]["pairs"], &io_run["args"]["bytes"]),
        (&1.into(), &64.into())
    );
    assert!(
        dma.iter()
            .any(|e| e["name"] == "exec batch" && e["args"]["pairs"] == 4)
    );
    assert!(dma.iter().any(|e| e["name"] == "DMA 1.0"), "{dma:?}");

    let doorbells = of_cat(&events, "doorbell");
    assert_eq!(doorbells.len(), 1);
    assert_eq!(doorbells[0]["ph"], "i");
    assert_eq!(doorbells[0]["args"]["semaphore"], SEM_INFERENCE_START);

    let notes = of_cat(&events, "notification");
    assert_eq!(notes.len(), 1);
    assert_eq!(notes[0]["name"], "Execution");
    assert_eq!(notes[0]["args"]["compute_idx"], 0);
    assert_eq!(notes[0]["args"]["flags"], error_flags::NC_UE);
    assert_eq!(notes[0]["tid"], 1);

    let exec = of_cat(&events, "execution");
    assert_eq!(exec.len(), 1);
    assert_eq!(exec[0]["args"]["instructions"], 7);
    assert_eq!(of_cat(&events, "fault")[0]["name"], "fault NcUncorrectable");
}

#[test]
fn under_a_latency_model_the_trace_runs_on_simulated_time() {
    let (_dir, dev) = traced();
    let a = Client::new(&dev, 10);
    let mut io = Io::new(&a, 0);
    a.ok(Request::SetLatency(model()));
    io.stage(1, 0);
    io.rig.run();
    let events = trace_events(&dev);
    let exec = of_cat(&events, "execution");
    assert_eq!(exec[0]["ts"].as_f64(), Some(0.0));
    assert_eq!(exec[0]["dur"].as_f64(), Some(501.07), "1070 + 500000 ns");
    let reload = of_cat(&events, "sequencer");
    assert_eq!(reload[0]["name"], "config reload");
    assert_eq!(
        (reload[0]["ts"].as_f64(), reload[0]["dur"].as_f64()),
        (Some(1.0), Some(500.0))
    );
    // Instructions follow each other at 10 ns each, after the reload.
    let mut ts: Vec<f64> = of_cat(&events, "instruction")
        .iter()
        .map(|e| e["ts"].as_f64().unwrap())
        .collect();
    ts.sort_by(f64::total_cmp);
    let expected: Vec<f64> = (0..7)
        .map(|i| (501_000.0 + 10.0 * f64::from(i)) / 1000.0)
        .collect();
    assert_eq!(ts, expected);
    assert!(
        of_cat(&events, "instruction")
            .iter()
            .all(|e| e["dur"].as_f64() == Some(0.01))
    );
    let note = of_cat(&events, "notification");
    assert_eq!(note[0]["ts"].as_f64(), Some(501.07));
}

#[test]
fn without_a_trace_nothing_is_recorded() {
    let dev = device();
    let a = Client::new(&dev, 10);
    let mut io = Io::new(&a, 0);
    io.run();
    assert!(dev.write_trace().unwrap().is_none());
    assert!(dev.trace_summary().is_none());
}
