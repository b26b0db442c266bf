//! Tensor operations against the emulated device in-process: bytes moved by the device's DMA,
//! segments, the two queues' independence, QUEUE_FULL, DMA aborts, every refusal, and what a
//! scheduled request holds.

use std::sync::Arc;
use std::time::{Duration, Instant};

use shared::NrtStatus;
use shared::ids::XuType;
use shared::protocol::{FaultKind, FaultSpec, FaultWhen, Reply, Request};

use super::{ReadBuffer, TensorOpConfig, TensorOpEngine, TensorOpRequest};
use crate::backend::Device;
use crate::builder::identity;
use crate::completion::{NqEngine, NqReader};
use crate::config::RuntimeConfig;
use crate::metrics::Metrics;
use crate::test_support::{Rig, gated_identity, io, load, pattern};
use crate::xu::{ExecInfo, ExecStatus, ExecutionUnit, Xu, XuConfig, XuHealth, XuWorkers};
use crate::{Placement, Runtime, Tensor};

fn device_tensor(rt: &Runtime, vnc: u32, bytes: u64, name: &str) -> Tensor {
    rt.tensor_allocate(Placement::Device { vnc }, bytes, name)
        .unwrap()
}

fn write(rt: &Runtime, t: &Tensor, data: &[u8], offset: u64, queue: i32) -> NrtStatus {
    let op = rt.tensor_write_schedule(t, data, offset, 0, queue).unwrap();
    rt.wait(&op).unwrap()
}

fn read(rt: &Runtime, t: &Tensor, offset: u64, size: u64, queue: i32) -> (NrtStatus, Vec<u8>) {
    let dest = ReadBuffer::new(size).unwrap();
    let op = rt
        .tensor_read_schedule(&dest, t, offset, size, 0, queue)
        .unwrap();
    let st = rt.wait(&op).unwrap();
    (st, dest.to_vec().unwrap())
}

fn arm(rig: &Rig, spec: FaultSpec) {
    let (reply, _) = rig.device.handle(
        simdev::client::ClientId(u64::MAX),
        Request::InjectFault(spec),
    );
    assert!(matches!(reply, Reply::Ok), "{reply:?}");
}

fn copy_start_fault(kind: FaultKind, queue: u32, n: u64) -> FaultSpec {
    FaultSpec {
        kind,
        nc: Some(0),
        when: FaultWhen::NthCopyStart {
            engine: super::TENSOR_OP_DMA_ENGINE,
            queue,
            n,
        },
    }
}

#[test]
fn writes_and_reads_move_through_the_devices_dma_and_close_returns_everything() {
    let rig = Rig::new();
    let rt = rig.sync_runtime();
    let t = device_tensor(&rt, 0, 200_000, "t");
    let data = pattern(200_000, 3);
    let before = rig.counters(0).dma_bytes;
    let op = rt.tensor_write_schedule(&t, &data, 0, 0, 0).unwrap();
    assert_eq!(op.seq_id().xu_id().xu_type(), Some(XuType::TensorOp));
    assert_eq!((op.seq_id().xu_id().queue(), op.seq_id().seq_num()), (0, 1));
    assert_eq!(rt.wait(&op).unwrap(), NrtStatus::Success);
    assert!(rt.is_completed(op.seq_id()).unwrap());
    let mut direct = vec![0u8; 200_000];
    t.read(&mut direct, 0).unwrap();
    assert!(direct == data, "the write landed");
    // A read of a sub-range, on the other queue.
    let (st, got) = read(&rt, &t, 1000, 70_000, 1);
    assert_eq!(st, NrtStatus::Success);
    assert!(got == data[1000..71_000], "the read delivered the bytes");
    let moved = rig.counters(0).dma_bytes - before;
    assert!(
        moved >= 270_000,
        "the device's DMA moved the bytes ({moved} bytes counted)"
    );
    assert_eq!(
        rt.tensor_op_engine()
            .unwrap()
            .dma_queue(0, 1)
            .map(|q| (q.nc, q.engine, q.queue)),
        Some((0, 15, 13))
    );
    drop(t);
    rt.close();
    let stats = rig.device.stats();
    assert_eq!(
        (stats.claimed_ncs, stats.dma_queues, stats.chunks),
        (0, 0, 0),
        "close released the tensor-op queues and staging too: {stats:?}"
    );
}

#[test]
fn a_copy_moves_device_to_device_at_offsets() {
    let rig = Rig::new();
    let rt = rig.sync_runtime();
    let a = device_tensor(&rt, 1, 8192, "a");
    let b = device_tensor(&rt, 1, 8192, "b");
    let data = pattern(8192, 9);
    a.write(&data, 0).unwrap();
    let op = rt.tensor_copy_schedule(&a, 100, &b, 4000, 3000, 1).unwrap();
    assert_eq!(op.seq_id().xu_id().vnc_id(), 1, "the tensors' logical core");
    assert_eq!(rt.wait(&op).unwrap(), NrtStatus::Success);
    let mut out = vec![0u8; 8192];
    b.read(&mut out, 0).unwrap();
    assert!(out[4000..7000] == data[100..3100]);
    assert!(out[..4000].iter().chain(&out[7000..]).all(|&x| x == 0));
    rt.close();
}

/// An engine with 32-descriptor rings on logical core 0 (NC 0) and its queue-0 XU.
fn small_ring_rig(rig: &Rig) -> (Arc<TensorOpEngine>, Arc<Xu<TensorOpEngine>>, XuWorkers) {
    let dev: Arc<dyn Device> = rig.backend.clone();
    let mut claimed = dev.claim_nc(0).unwrap();
    let nq = dev.notification_queue_init(0, 64).unwrap();
    let nq = Arc::new(NqEngine::new(vec![(
        0,
        NqReader::new(nq, claimed.notification_fd.take()),
    )]));
    let engine = Arc::new(
        TensorOpEngine::new(
            dev,
            nq,
            &[0],
            TensorOpConfig {
                ring_descs: 32,
                ..TensorOpConfig::default()
            },
        )
        .unwrap(),
    );
    let xu = Arc::new(
        Xu::new_typed(
            XuType::TensorOp,
            XuConfig {
                vnc: 0,
                queue: 0,
                tpbs: vec![0],
                capacity: 4,
                efd_pool_size: 4,
                implicit_async_mode: false,
            },
            engine.clone(),
            Arc::new(Metrics::new(2)),
        )
        .unwrap(),
    );
    let group: Vec<Arc<dyn ExecutionUnit>> = vec![xu.clone()];
    let workers = XuWorkers::start(&[group]).unwrap();
    (engine, xu, workers)
}

#[test]
fn a_request_larger_than_the_ring_is_posted_in_segments() {
    let rig = Rig::new();
    let (engine, xu, workers) = small_ring_rig(&rig);
    let dev: Arc<dyn Device> = rig.backend.clone();
    let len = 4u64 << 20;
    let dst = dev
        .mem_alloc(shared::protocol::MemLocation::Hbm { nc: 0 }, len, 0)
        .unwrap();
    let dst_map = dev.mem_map(&dst).unwrap();
    let staging = engine.staging(0, 0).unwrap().lease(len, far()).unwrap();
    let data = pattern(usize::try_from(len).unwrap(), 5);
    staging.write(&data).unwrap();
    let req = TensorOpRequest {
        kind: super::request::TensorOpKind::Write,
        src_pa: staging.pa(),
        dst_pa: dst.pa,
        len,
        staging: Some(staging),
        ..TensorOpRequest::default()
    };
    let status = Arc::new(ExecStatus::new());
    let seq = xu
        .schedule_request(
            Box::new(ExecInfo::execute(0, req)),
            Some(status.clone()),
            |_, _| Ok(()),
            |_| Ok(()),
        )
        .unwrap();
    xu.wait_for_completion(seq, None).unwrap();
    assert_eq!(status.get(), Some(NrtStatus::Success));
    // 31 pairs of 64 KiB per segment: 4 MiB = 64 pairs = 3 segments.
    assert_eq!(engine.segments_posted(0, 0), Some(3));
    let mut out = vec![0u8; data.len()];
    dst_map.read(dst.pa, &mut out).unwrap();
    assert!(out == data, "every segment landed");
    workers.destroy();
    engine.release();
}

#[test]
fn the_two_queues_and_compute_are_independent_and_queue_full_changes_nothing() {
    let rig = Rig::new();
    let rt = rig.sync_runtime();
    let capacity = rt.config().xu_capacity;
    let m = load(&rt, &identity(64), 0);
    let (i, o, ins, outs) = io(&rt, 64);
    let t = device_tensor(&rt, 0, 4096, "t");
    let engine = rt.tensor_op_engine().unwrap().clone();
    let pool = engine.staging(0, 0).unwrap().clone();
    let q0 = rt.tensor_op_xu(0, 0).unwrap().clone();
    {
        // Queue 0 is stalled (its requests stay in flight): its ring fills.
        let _held = engine.stall_lane_for_test(0, 0);
        let ops: Vec<_> = (0..capacity)
            .map(|k| {
                rt.tensor_write_schedule(&t, &[u8::try_from(k % 250).unwrap(); 16], 0, 0, 0)
                    .unwrap()
            })
            .collect();
        let depth = q0.depth();
        let retained = pool.retained();
        let e = rt
            .tensor_write_schedule(&t, &[0xEE; 4096], 0, 0, 0)
            .unwrap_err();
        assert_eq!(e.status, NrtStatus::QueueFull, "{e}");
        assert!(e.message.contains("nothing was scheduled"), "{e}");
        assert_eq!(q0.depth(), depth, "no slot written");
        assert_eq!(pool.retained(), retained, "its staging went back");
        // Queue 1 and the compute XU keep working while queue 0 is stalled.
        let (st, got) = read(&rt, &t, 0, 16, 1);
        assert_eq!(st, NrtStatus::Success);
        assert_eq!(got, [0; 16], "queue 0's writes have not run");
        i.write(&pattern(64, 1), 0).unwrap();
        rt.execute(m, &ins, &outs).unwrap();
        assert!(ops.iter().all(|op| op.status().is_none()));
        drop(_held);
        for op in &ops {
            assert_eq!(rt.wait(op).unwrap(), NrtStatus::Success);
        }
    }
    // No sequence was consumed by the refusal.
    let next = rt.tensor_write_schedule(&t, &[7; 16], 0, 0, 0).unwrap();
    assert_eq!(next.seq_id().seq_num(), capacity as u64 + 1);
    rt.wait(&next).unwrap();
    let mut out = [0u8; 16];
    t.read(&mut out, 0).unwrap();
    assert_eq!(out, [7; 16], "in submit order, the last write wins");
    let mut out = [0u8; 64];
    o.read(&mut out, 0).unwrap();
    assert_eq!(out.to_vec(), pattern(64, 1));
    rt.close();
}

#[test]
fn a_dma_abort_fails_that_request_with_1203_and_degrades_only_its_xu() {
    let rig = Rig::new();
    let rt = rig.sync_runtime();
    let m = load(&rt, &identity(64), 0);
    let (i, o, ins, outs) = io(&rt, 64);
    let t = device_tensor(&rt, 0, 4096, "t");
    arm(&rig, copy_start_fault(FaultKind::DmaAbort, 12, 2));
    assert_eq!(write(&rt, &t, &[1; 64], 0, 0), NrtStatus::Success);
    let op = rt.tensor_write_schedule(&t, &[2; 64], 0, 0, 0).unwrap();
    assert_eq!(rt.wait(&op).unwrap(), NrtStatus::ExecHwErrDmaAbort);
    assert_eq!(op.status(), Some(NrtStatus::ExecHwErrDmaAbort));
    assert_eq!(
        rt.tensor_op_xu(0, 0).unwrap().health(),
        XuHealth::FatalShutdown
    );
    let e = rt.tensor_write_schedule(&t, &[3; 64], 0, 0, 0).unwrap_err();
    assert_eq!(e.status, NrtStatus::ExecUnitUnrecoverable, "{e}");
    // The other queue and the compute XU are unaffected.
    assert_eq!(write(&rt, &t, &[4; 64], 0, 1), NrtStatus::Success);
    let (st, got) = read(&rt, &t, 0, 64, 1);
    assert_eq!((st, got), (NrtStatus::Success, vec![4; 64]));
    i.write(&pattern(64, 2), 0).unwrap();
    rt.execute(m, &ins, &outs).unwrap();
    let mut out = [0u8; 64];
    o.read(&mut out, 0).unwrap();
    assert_eq!(out.to_vec(), pattern(64, 2));
    assert_eq!(rt.tensor_op_xu(0, 1).unwrap().health(), XuHealth::Healthy);
    assert_eq!(rt.xu(0).unwrap().health(), XuHealth::Healthy);
    assert_eq!(rig.counters(0).dma_aborts, 1);
    rt.close();
}

#[test]
fn an_out_of_bounds_dma_fault_is_1006_and_degrades_that_xu() {
    let rig = Rig::new();
    let rt = rig.sync_runtime();
    let t = device_tensor(&rt, 0, 4096, "t");
    arm(&rig, copy_start_fault(FaultKind::OutOfBounds, 13, 1));
    let dest = ReadBuffer::new(64).unwrap();
    let op = rt.tensor_read_schedule(&dest, &t, 0, 64, 0, 1).unwrap();
    assert_eq!(rt.wait(&op).unwrap(), NrtStatus::ExecOob);
    assert_eq!(
        rt.tensor_op_xu(0, 1).unwrap().health(),
        XuHealth::FatalShutdown
    );
    assert_eq!(write(&rt, &t, &[4; 64], 0, 0), NrtStatus::Success);
    rt.close();
}

#[test]
fn a_stalled_compute_xu_blocks_no_tensor_op_and_its_harvest_routes_their_aborts() {
    // The compute worker harvests (and drains the NQ) while the tensor write aborts: the
    // DmaQueueError goes to the queue's record whichever reader sees it first.
    let rig = Rig::new();
    let rt = rig.sync_runtime();
    let m = load(&rt, &gated_identity(64, "gated", 9), 0);
    let (_i, _o, ins, outs) = io(&rt, 64);
    let t = device_tensor(&rt, 0, 4096, "t");
    let exec = rt.execute_schedule(m, &ins, &outs).unwrap();
    std::thread::sleep(Duration::from_millis(20));
    // The compute XU is stalled on its execution: tensor operations on its core go on.
    assert_eq!(write(&rt, &t, &[1; 64], 0, 0), NrtStatus::Success);
    assert_eq!(read(&rt, &t, 0, 64, 1), (NrtStatus::Success, vec![1; 64]));
    assert_eq!(exec.status(), None, "the execution is still in flight");
    arm(&rig, copy_start_fault(FaultKind::DmaAbort, 12, 1));
    assert_eq!(write(&rt, &t, &[2; 64], 0, 0), NrtStatus::ExecHwErrDmaAbort);
    rig.backend.event_set(0, 9, 1).unwrap();
    assert_eq!(
        rt.wait(&exec).unwrap(),
        NrtStatus::Success,
        "the execution's own entry"
    );
    assert_eq!(rt.stale_notifications(), 0);
    rt.close();
}

#[test]
fn bad_requests_are_refused_with_nrt_invalid_naming_what_and_change_nothing() {
    let rig = Rig::new();
    let rt = rig.runtime(RuntimeConfig {
        visible_cores: Some((0, 1)),
        exec_timeout: Duration::from_secs(10),
        ..RuntimeConfig::default()
    });
    let other_rt = rig.runtime(RuntimeConfig {
        visible_cores: Some((1, 1)),
        exec_timeout: Duration::from_secs(10),
        ..RuntimeConfig::default()
    });
    let t = device_tensor(&rt, 0, 4096, "t");
    t.write(&[5; 4096], 0).unwrap();
    let host = rt.tensor_allocate(Placement::Host, 4096, "h").unwrap();
    let foreign = device_tensor(&other_rt, 0, 4096, "foreign");
    let dest = ReadBuffer::new(4096).unwrap();
    let small = ReadBuffer::new(8).unwrap();
    let cases: Vec<(&str, crate::NrtResult<crate::ScheduledRequest>, &str)> = vec![
        (
            "beyond",
            rt.tensor_write_schedule(&t, &[1; 8], 4090, 0, 0),
            "offset 4090 + size 8 is beyond its 4096 bytes",
        ),
        (
            "overflow",
            rt.tensor_write_schedule(&t, &[1; 8], u64::MAX - 2, 0, 0),
            "is beyond its 4096 bytes",
        ),
        (
            "read beyond",
            rt.tensor_read_schedule(&dest, &t, 0, 4097, 0, 0),
            "size 4097 is beyond",
        ),
        (
            "size 0",
            rt.tensor_write_schedule(&t, &[], 0, 0, 0),
            "size 0",
        ),
        (
            "read size 0",
            rt.tensor_read_schedule(&dest, &t, 0, 0, 0, 1),
            "size 0",
        ),
        (
            "host",
            rt.tensor_write_schedule(&host, &[1; 8], 0, 0, 0),
            "\"h\" is in host memory",
        ),
        (
            "other runtime",
            rt.tensor_write_schedule(&foreign, &[1; 8], 0, 0, 0),
            "\"foreign\" was allocated by runtime #",
        ),
        (
            "queue 2",
            rt.tensor_write_schedule(&t, &[1; 8], 0, 0, 2),
            "tensor-op queue 2 does not exist",
        ),
        (
            "queue -1",
            rt.tensor_read_schedule(&dest, &t, 0, 8, 0, -1),
            "tensor-op queue -1 does not exist",
        ),
        (
            "lnc",
            rt.tensor_write_schedule(&t, &[1; 8], 0, 1, 0),
            "logical core 1 is not visible",
        ),
        (
            "short destination",
            rt.tensor_read_schedule(&small, &t, 0, 64, 0, 0),
            "holds 8 bytes, the read is 64",
        ),
        (
            "copy host",
            rt.tensor_copy_schedule(&host, 0, &t, 0, 8, 0),
            "\"h\" is in host memory",
        ),
        (
            "copy beyond",
            rt.tensor_copy_schedule(&t, 0, &t, 4095, 2, 0),
            "offset 4095 + size 2",
        ),
        (
            "copy other runtime",
            rt.tensor_copy_schedule(&t, 0, &foreign, 0, 8, 0),
            "\"foreign\" was allocated by",
        ),
    ];
    for (what, r, needle) in cases {
        let e = r.expect_err(what);
        assert_eq!(e.status, NrtStatus::Invalid, "{what}: {e}");
        assert!(e.message.contains(needle), "{what}: {e}");
    }
    for q in 0..2 {
        assert_eq!(
            rt.tensor_op_xu(0, q).unwrap().depth(),
            0,
            "nothing scheduled"
        );
        assert_eq!(
            rt.tensor_op_engine().unwrap().segments_posted(0, q),
            Some(0)
        );
    }
    assert!(dest.to_vec().unwrap().iter().all(|&b| b == 0));
    // The first accepted request gets sequence number 1.
    let op = rt.tensor_write_schedule(&t, &[1; 8], 0, 0, 0).unwrap();
    assert_eq!(op.seq_id().seq_num(), 1);
    rt.wait(&op).unwrap();
    drop(foreign);
    other_rt.close();
    rt.close();
}

#[test]
fn a_copy_across_logical_cores_is_refused() {
    let rig = Rig::new();
    let rt = rig.sync_runtime();
    let a = device_tensor(&rt, 0, 64, "a");
    let b = device_tensor(&rt, 1, 64, "b");
    let e = rt.tensor_copy_schedule(&a, 0, &b, 0, 64, 0).unwrap_err();
    assert_eq!(e.status, NrtStatus::Invalid);
    assert!(
        e.message.contains("a copy stays on one logical core"),
        "{e}"
    );
    assert!(e.message.contains("\"b\" is on logical core 1"), "{e}");
    rt.close();
}

#[test]
fn lnc_idx_chooses_the_dma_engines_of_a_read_or_write_whatever_core_the_tensor_is_on() {
    let rig = Rig::new();
    let rt = rig.sync_runtime();
    let b = device_tensor(&rt, 1, 64, "b");
    let data: Vec<u8> = (0..64).map(|i| i * 3 + 1).collect();
    // Written through logical core 0's queue, read back through core 1's and core 0's.
    let w = rt.tensor_write_schedule(&b, &data, 0, 0, 0).unwrap();
    assert_eq!(w.seq_id().xu_id().vnc_id(), 0, "core 0's TENSOR_OP XU");
    assert_eq!(rt.wait(&w).unwrap(), NrtStatus::Success);
    for lnc in [1, 0] {
        let dest = ReadBuffer::new(64).unwrap();
        let r = rt.tensor_read_schedule(&dest, &b, 0, 64, lnc, 1).unwrap();
        assert_eq!(rt.wait(&r).unwrap(), NrtStatus::Success);
        assert_eq!(dest.to_vec().unwrap(), data, "read through core {lnc}");
    }
    rt.close();
}

#[test]
fn a_tensor_a_scheduled_tensor_op_uses_is_not_freed_until_it_completes() {
    let rig = Rig::new();
    let rt = rig.sync_runtime();
    let engine = rt.tensor_op_engine().unwrap().clone();
    let mut t = Some(device_tensor(&rt, 0, 4096, "t"));
    let held = engine.stall_lane_for_test(0, 1);
    let dest = ReadBuffer::new(64).unwrap();
    let op = rt
        .tensor_read_schedule(&dest, t.as_ref().unwrap(), 0, 64, 0, 1)
        .unwrap();
    let e = rt.tensor_free(&mut t).unwrap_err();
    assert_eq!(e.status, NrtStatus::Invalid);
    assert!(
        e.message.contains(&format!(
            "{:#x} (TENSOR_OP queue 1 of logical core 0)",
            op.seq_id().raw()
        )),
        "{e}"
    );
    assert!(t.is_some(), "the handle stays");
    drop(held);
    assert_eq!(rt.wait(&op).unwrap(), NrtStatus::Success);
    rt.tensor_free(&mut t).unwrap();
    assert!(t.is_none());
    rt.tensor_free(&mut t).unwrap();
    rt.close();
}

#[test]
fn a_tensor_a_scheduled_execution_uses_is_not_freed_until_it_completes() {
    let rig = Rig::new();
    let rt = rig.sync_runtime();
    let m = load(&rt, &gated_identity(64, "gated", 9), 0);
    let (i, o, ins, outs) = io(&rt, 64);
    let (mut i, o) = (Some(i), Some(o));
    let exec = rt.execute_schedule(m, &ins, &outs).unwrap();
    drop((ins, outs));
    let e = rt.tensor_free(&mut i).unwrap_err();
    assert!(
        e.message.contains(&format!(
            "{:#x} (COMPUTE queue 0 of logical core 0)",
            exec.seq_id().raw()
        )),
        "{e}"
    );
    rig.backend.event_set(0, 9, 1).unwrap();
    assert_eq!(rt.wait(&exec).unwrap(), NrtStatus::Success);
    rt.tensor_free(&mut i).unwrap();
    drop(o);
    rt.close();
}

#[test]
fn a_refused_schedule_leaves_no_hold() {
    let rig = Rig::new();
    let rt = rig.sync_runtime();
    let engine = rt.tensor_op_engine().unwrap().clone();
    let mut t = Some(device_tensor(&rt, 0, 64, "t"));
    let capacity = rt.config().xu_capacity;
    let other = device_tensor(&rt, 0, 64, "other");
    let held = engine.stall_lane_for_test(0, 0);
    let ops: Vec<_> = (0..capacity)
        .map(|_| rt.tensor_write_schedule(&other, &[1; 8], 0, 0, 0).unwrap())
        .collect();
    let e = rt
        .tensor_write_schedule(t.as_ref().unwrap(), &[1; 8], 0, 0, 0)
        .unwrap_err();
    assert_eq!(e.status, NrtStatus::QueueFull);
    rt.tensor_free(&mut t).unwrap();
    drop(held);
    for op in &ops {
        rt.wait(op).unwrap();
    }
    rt.close();
}

#[test]
fn a_raw_read_destination_receives_the_bytes() {
    let rig = Rig::new();
    let rt = rig.sync_runtime();
    let t = device_tensor(&rt, 0, 256, "t");
    t.write(&pattern(256, 4), 0).unwrap();
    let mut out = vec![0u8; 256];
    // SAFETY: `out` outlives the read, which the test waits for before touching `out`.
    let dest = unsafe { ReadBuffer::from_raw(out.as_mut_ptr(), out.len()) }.unwrap();
    assert!(dest.to_vec().is_none());
    let op = rt.tensor_read_schedule(&dest, &t, 0, 256, 0, 0).unwrap();
    assert_eq!(rt.wait(&op).unwrap(), NrtStatus::Success);
    drop(dest);
    assert_eq!(out, pattern(256, 4));
    // SAFETY: a null pointer is refused before anything is dereferenced.
    let e = unsafe { ReadBuffer::from_raw(std::ptr::null_mut(), 8) }.unwrap_err();
    assert_eq!(e.status, NrtStatus::Invalid);
    rt.close();
}

#[test]
fn a_pool_keeps_one_chunk_larger_than_its_budget_and_reuses_it() {
    use super::staging::StagingPool;
    const MIB: u64 = 1 << 20;
    let rig = Rig::new();
    let device: Arc<dyn Device> = rig.backend.clone();
    let chunks = || rig.device.stats().chunks;
    let base = chunks();
    // A budget of 1 MiB; requests of 3 and 4 MiB (chunks of 4 MiB).
    let pool = Arc::new(StagingPool::new(device, MIB));
    drop(pool.lease(4 * MIB, far()).unwrap());
    assert_eq!(pool.retained(), 4 * MIB, "the large chunk is kept");
    let a = pool.lease(3 * MIB, far()).unwrap();
    assert_eq!(chunks(), base + 1, "and reused: nothing allocated");
    let b = pool.lease(4 * MIB, far()).unwrap();
    assert_eq!(chunks(), base + 2, "a second one in flight is allocated");
    drop((a, b));
    assert_eq!(
        (pool.retained(), chunks()),
        (4 * MIB, base + 1),
        "one of the two is kept, the other freed"
    );
    // A small one given back does not join it: the pool stays at one chunk.
    let big = pool.lease(4 * MIB, far()).unwrap();
    let small = pool.lease(64 * 1024, far()).unwrap();
    assert_eq!(chunks(), base + 2, "the small one is allocated");
    drop((big, small));
    assert_eq!((pool.retained(), chunks()), (4 * MIB, base + 1));
    pool.release();
    assert_eq!((pool.retained(), chunks()), (0, base));
    // After release a chunk given back is freed.
    drop(pool.lease(4 * MIB, far()).unwrap());
    assert_eq!((pool.retained(), chunks()), (0, base));
}

/// A deadline no test here reaches.
fn far() -> Instant {
    Instant::now() + Duration::from_secs(600)
}

#[test]
fn a_chunk_above_the_cap_is_freed_once_and_kept_from_its_second_use() {
    use super::staging::{KEEP_ONE_MAX, StagingPool};
    const MIB: u64 = 1 << 20;
    let rig = Rig::new();
    let device: Arc<dyn Device> = rig.backend.clone();
    let chunks = || rig.device.stats().chunks;
    let base = chunks();
    let pool = Arc::new(StagingPool::new(device, MIB));
    // One byte over the cap: a chunk of twice the cap (sparse: never touched here).
    let huge = KEEP_ONE_MAX + 1;
    drop(pool.lease(huge, far()).unwrap());
    assert_eq!(
        (pool.retained(), chunks()),
        (0, base),
        "a single huge request leaves nothing held"
    );
    drop(pool.lease(huge, far()).unwrap());
    assert_eq!(
        pool.retained(),
        2 * KEEP_ONE_MAX,
        "the second is kept for the next"
    );
    let again = pool.lease(huge, far()).unwrap();
    assert_eq!(chunks(), base + 1, "and reused: nothing allocated");
    drop(again);
    pool.release();
    assert_eq!((pool.retained(), chunks()), (0, base));
}

/// A write staged apart from its submit (libnrt copies a large buffer outside the lock it
/// schedules under): requests are ordered, and numbered, by their submit, and one staged but
/// never submitted schedules nothing and gives its staging back.
#[test]
fn a_staged_write_is_ordered_by_its_submit_and_one_dropped_schedules_nothing() {
    let rig = Rig::new();
    let rt = rig.sync_runtime();
    let t = device_tensor(&rt, 0, 4096, "t");
    let first = rt
        .tensor_write_stage(&t, &pattern(4096, 1), 0, 0, 0)
        .unwrap();
    let second = rt
        .tensor_write_stage(&t, &pattern(4096, 2), 0, 0, 0)
        .unwrap();
    let b = rt.tensor_write_submit(second).unwrap();
    let a = rt.tensor_write_submit(first).unwrap();
    assert_eq!((b.seq_id().seq_num(), a.seq_id().seq_num()), (1, 2));
    assert_eq!(rt.wait(&b).unwrap(), NrtStatus::Success);
    assert_eq!(rt.wait(&a).unwrap(), NrtStatus::Success);
    let mut got = vec![0u8; 4096];
    t.read(&mut got, 0).unwrap();
    assert!(got == pattern(4096, 1), "the later submit landed last");
    for _ in 0..64 {
        drop(
            rt.tensor_write_stage(&t, &pattern(4096, 3), 0, 0, 0)
                .unwrap(),
        );
    }
    let next = rt
        .tensor_write_schedule(&t, &pattern(4096, 4), 0, 0, 0)
        .unwrap();
    assert_eq!(next.seq_id().seq_num(), 3, "nothing dropped was scheduled");
    assert_eq!(rt.wait(&next).unwrap(), NrtStatus::Success);
    t.read(&mut got, 0).unwrap();
    assert!(got == pattern(4096, 4));
    rt.close();
}
