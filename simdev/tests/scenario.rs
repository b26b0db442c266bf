//! Scenario control over a real socket: an injected DeviceLost fault ends the simdev process
//! with status 3 after posting DeviceLost, and removes its socket.

mod common;

use std::sync::atomic::Ordering;

use common::{Conn, Simdev};
use shared::memory::SharedChunk;
use shared::notification::{
    NQ_HEADER_SIZE, NQ_TAIL_OFFSET, NotificationEntry, NotificationKind, error_flags,
};
use shared::protocol::{
    DeviceStats, FaultKind, FaultSpec, FaultWhen, LatencyModel, Reply, Request,
};
use shared::sequencer::SEM_INFERENCE_START;

#[test]
fn a_device_lost_fault_exits_3_and_removes_the_socket() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("simdev.sock");
    let trace = dir.path().join("trace.json");
    let mut simdev = Simdev::start(
        &path,
        &[
            "--ncs",
            "1",
            "--hbm",
            "16M",
            "--trace",
            trace.to_str().unwrap(),
        ],
    );
    let conn = Conn::hello(&path);
    let (reply, fds) = conn.call(&Request::ClaimNc { nc: 0 });
    assert_eq!((reply, fds.len()), (Reply::NcClaimed { nc: 0 }, 2));
    let (reply, _) = conn.call(&Request::NotificationInit {
        nc: 0,
        nq_type: 1,
        entries: 4,
    });
    let Reply::NotificationQueue { handle, .. } = reply else {
        panic!("{reply:?}");
    };
    let (reply, fds) = conn.call(&Request::MemMap { handle });
    let Reply::MemMapped { pa, size, .. } = reply else {
        panic!("{reply:?}");
    };
    let nq = SharedChunk::map_fd(&fds[0], pa, usize::try_from(size).unwrap(), true).unwrap();

    // A second client arms the fault and sets a latency model: scenario control is open to all.
    let control = Conn::hello(&path);
    let fault = FaultSpec {
        kind: FaultKind::DeviceLost,
        nc: Some(0),
        when: FaultWhen::NthExecution(1),
    };
    assert_eq!(control.call(&Request::InjectFault(fault)).0, Reply::Ok);
    let model = LatencyModel {
        per_execution_ns: 1_000,
        ..LatencyModel::default()
    };
    assert_eq!(control.call(&Request::SetLatency(model)).0, Reply::Ok);
    let Reply::DeviceStats(stats) = control.call(&Request::DeviceStats).0 else {
        panic!("no DeviceStats");
    };
    assert_eq!(
        stats,
        DeviceStats {
            memory_in_use: 4096,
            chunks: 1,
            clients: 2,
            claimed_ncs: 1,
            dma_queues: 0,
            armed_faults: 1,
        }
    );

    // The doorbell starts an execution (which would fail fast: nothing is staged); the fault
    // fires as it starts.
    conn.send(&Request::SemaphoreIncrement {
        nc: 0,
        index: SEM_INFERENCE_START,
        value: 1,
    });
    let (status, stderr) = simdev.wait();
    assert_eq!(status.code(), Some(3), "{stderr}");
    assert!(stderr.contains("the device was lost"), "{stderr}");
    assert!(stderr.contains("faults_fired 1"), "{stderr}");
    assert!(!path.exists(), "the socket was removed");
    assert!(conn.recv().is_none(), "the connection was closed");

    let tail = nq
        .load_u32(nq.pa() + NQ_TAIL_OFFSET as u64, Ordering::Acquire)
        .unwrap();
    assert_eq!(tail, 1, "exactly one notification");
    let entry: NotificationEntry = nq.read_obj(nq.pa() + NQ_HEADER_SIZE as u64).unwrap();
    assert_eq!(entry.kind, NotificationKind::DeviceLost as u16);
    assert_eq!(entry.error_flags, error_flags::DEVICE_LOST);
    assert_eq!(entry.device_ts_ns, 0, "the simulated clock had not moved");

    let json: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&trace).unwrap()).unwrap();
    let events = json["traceEvents"].as_array().unwrap();
    let cats: Vec<&str> = events.iter().filter_map(|e| e["cat"].as_str()).collect();
    assert_eq!(cats, ["doorbell", "fault", "notification"], "{json}");
}
