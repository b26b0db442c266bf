//! Who runs an execution: the doorbell's own thread (no hand-off), or the NC's sequencer
//! thread (one hand-off) when the execution must wait, sleep or call out.

use shared::protocol::{FaultKind, FaultSpec, FaultWhen, LatencyModel};

use super::*;

/// (inline_executions, sequencer_handoffs) of NC `nc`.
fn threads(c: &Client<'_>, nc: u32) -> (u64, u64) {
    let counters = c.counters(nc);
    (counters.inline_executions, counters.sequencer_handoffs)
}

fn ends(rig: &Rig<'_, '_>) -> [u64; 5] {
    rig.ends_but_sp(None)
}

#[test]
fn a_doorbell_runs_its_execution_to_the_notification_on_its_own_thread() {
    let dev = device();
    let a = Client::new(&dev, 10);
    let mut rig = Rig::new(&a, 0);
    for i in 0..3 {
        rig.stage(ends(&rig), 0, 0, &[]);
        rig.doorbell();
        // No wait: the notification was written before the doorbell's handler returned.
        let posted = rig.posted();
        assert_eq!(posted.len(), i + 1, "{posted:?}");
        assert_eq!(summary(&posted[i]), execution(u32::try_from(i).unwrap(), 0));
    }
    assert_eq!(threads(&a, 0), (3, 0), "no thread hand-off");
}

#[test]
fn an_execution_waiting_for_the_outside_world_is_handed_to_the_sequencer_thread() {
    let dev = device();
    let a = Client::new(&dev, 10);
    let mut rig = Rig::new(&a, 0);
    let waits = wait_event_program(&rig);
    // (The rig has one request buffer: both executions run the waiting program.)
    rig.stage(waits, 0, 0, &[]);
    rig.stage(waits, 0, 0, &[]);
    // On a naive doorbell thread that parks, this call would never return: the event the
    // execution waits for comes from this same thread, below.
    rig.doorbell();
    rig.doorbell();
    rig.quiet(0);
    assert_eq!(
        a.semaphore(0, SEM_INFERENCE_START),
        1,
        "the second count waits behind the suspended execution"
    );
    a.ok(Request::EventSet {
        nc: 0,
        index: 5,
        value: 1,
    });
    let posted = rig.wait(2);
    assert_eq!(
        posted.iter().map(summary).collect::<Vec<_>>(),
        [execution(0, 0), execution(1, 0)],
        "in order"
    );
    assert_eq!(
        threads(&a, 0),
        (0, 2),
        "the suspended execution and the count behind it ran on the sequencer thread"
    );
    // The role came back: the next doorbell runs inline again.
    a.ok(Request::EventSet {
        nc: 0,
        index: 5,
        value: 0,
    });
    rig.stage(ends(&rig), 0, 0, &[]);
    rig.doorbell();
    // The sequencer thread may still be releasing the role: wait for the notification.
    assert_eq!(summary(&rig.wait(3)[2]), execution(2, 0));
    let (inline, handoffs) = threads(&a, 0);
    assert_eq!(inline + handoffs, 3);
}

#[test]
fn armed_faults_latency_models_and_semaphore_writes_use_the_sequencer_thread() {
    let dev = device();
    let a = Client::new(&dev, 10);
    let mut rig = Rig::new(&a, 0);
    // A fault armed for another NC's 100th execution: it cannot fire here, but while any
    // fault is armed, executions may sleep or post late, so none holds a connection's thread.
    a.ok(Request::InjectFault(FaultSpec {
        kind: FaultKind::ExtraLatency { ns: 5 },
        nc: Some(1),
        when: FaultWhen::NthExecution(100),
    }));
    rig.stage(ends(&rig), 0, 0, &[]);
    assert_eq!(summary(&rig.run()), execution(0, 0));
    assert_eq!(threads(&a, 0), (0, 1));
    a.ok(Request::ClearFaults);
    a.ok(Request::SetLatency(LatencyModel {
        per_execution_ns: 1_000,
        ..LatencyModel::default()
    }));
    rig.stage(ends(&rig), 0, 0, &[]);
    assert_eq!(summary(&rig.run()), execution(1, 0));
    assert_eq!(threads(&a, 0), (0, 2), "a latency model may pace");
    a.ok(Request::SetLatency(LatencyModel::default()));
    // A SemaphoreWrite of INFERENCE_START is no posted doorbell: the sequencer takes it.
    rig.stage(ends(&rig), 0, 0, &[]);
    a.ok(Request::SemaphoreWrite {
        nc: 0,
        index: SEM_INFERENCE_START,
        value: 1,
    });
    assert_eq!(summary(&rig.wait(3)[2]), execution(2, 0));
    assert_eq!(threads(&a, 0), (0, 3));
    rig.stage(ends(&rig), 0, 0, &[]);
    rig.doorbell();
    assert_eq!(rig.posted().len(), 4, "back to inline");
    assert_eq!(threads(&a, 0), (1, 3));
}

#[test]
fn a_program_chunk_freed_or_reallocated_since_the_last_fetch_is_oob() {
    let dev = device();
    let a = Client::new(&dev, 10);
    let b = Client::new(&dev, 11);
    let mut rig = Rig::new(&a, 0);
    let extra = a.alloc(MemLocation::Host, 4 * KIB);
    extra.write(0, &end_program());
    rig.stage(rig.ends_but_sp(Some(extra.pa)), 0, 0, &[]);
    assert_eq!(summary(&rig.run()), execution(0, 0), "fetched, and cached");
    a.ok(Request::MemFree {
        handle: extra.handle,
    });
    let oob = error_flags::OOB | error_flags::GENERIC;
    rig.stage(rig.ends_but_sp(Some(extra.pa)), 0, 0, &[]);
    assert_eq!(rig.run().error_flags, oob, "a freed program chunk");
    // Another client's chunk at the same address is not the first client's either.
    b.claim(1);
    let theirs = b.alloc(MemLocation::Host, 4 * KIB);
    theirs.write(0, &end_program());
    rig.stage(rig.ends_but_sp(Some(theirs.pa)), 0, 0, &[]);
    assert_eq!(
        rig.run().error_flags,
        oob,
        "another client's chunk at {:#x}",
        theirs.pa
    );
}
