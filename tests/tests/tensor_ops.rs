//! Tensor operations as scheduled work against a real simdev (issue 12 items 2 and 4): a
//! serving pipeline over the TENSOR_OP and COMPUTE XUs, a DMA abort injected into a tensor
//! write, and nothing freed under a scheduled request.

use std::collections::VecDeque;
use std::os::fd::{AsFd, OwnedFd};
use std::sync::Arc;
use std::time::Duration;

use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
use runtime::builder::identity;
use runtime::config::RuntimeConfig;
use runtime::xu::XuHealth;
use runtime::{Placement, ReadBuffer, Runtime, Tensor, TensorSet};
use shared::NrtStatus;
use shared::ids::SeqId;
use shared::model::Target;
use shared::protocol::{FaultKind, FaultSpec, FaultWhen};
use tests::{connect, start_simdev};

fn rig() -> (Runtime, runtime::backend::sim::PrivateSimdev) {
    let sim = start_simdev(&["--hbm", "64M"]);
    let rt = Runtime::init(
        Arc::new(connect(&sim)),
        RuntimeConfig {
            exec_timeout: Duration::from_secs(10),
            ..RuntimeConfig::default()
        },
    )
    .unwrap();
    (rt, sim)
}

fn pattern(len: usize, step: u64) -> Vec<u8> {
    let s = step.to_le_bytes();
    (0..len)
        .map(|i| (i.to_le_bytes()[0] ^ s[0] ^ s[1].rotate_left(3)).wrapping_add(i.to_le_bytes()[1]))
        .collect()
}

/// A request in flight and the eventfd its XU signals at completion (`None`: it had already
/// completed when the eventfd was registered).
struct Waiting<T> {
    step: u64,
    seq: SeqId,
    efd: Option<OwnedFd>,
    what: T,
}

/// The tensors' slot of step `step`.
fn slot_of(step: u64) -> usize {
    usize::try_from(step).unwrap() % SLOTS
}

/// Blocks until one of the front requests' eventfds is readable.
fn wait_any(fds: &[&OwnedFd]) {
    if fds.is_empty() {
        return;
    }
    let mut pfds: Vec<PollFd> = fds
        .iter()
        .map(|f| PollFd::new(f.as_fd(), PollFlags::POLLIN))
        .collect();
    let n = poll(&mut pfds, PollTimeout::from(10_000u16)).unwrap();
    assert!(n > 0, "no completion within 10 s");
}

const STEPS: u64 = 1000;
const BYTES: usize = 4096;
/// Steps whose tensors are in use at once (each step has its own input and output).
const SLOTS: usize = 9;
/// Requests kept in flight per XU.
const PER_XU: usize = 3;

#[test]
fn a_serving_pipeline_writes_executes_and_reads_a_thousand_steps_with_requests_in_flight() {
    let (rt, _sim) = rig();
    let m = rt
        .load(
            &identity(u32::try_from(BYTES).unwrap())
                .to_container(Target::Simdev)
                .unwrap(),
            0,
        )
        .unwrap();
    let slots: Vec<(Tensor, Tensor, TensorSet, TensorSet, ReadBuffer)> = (0..SLOTS)
        .map(|k| {
            let i = rt
                .tensor_allocate(
                    Placement::Device { vnc: 0 },
                    BYTES as u64,
                    &format!("in{k}"),
                )
                .unwrap();
            let o = rt
                .tensor_allocate(
                    Placement::Device { vnc: 0 },
                    BYTES as u64,
                    &format!("out{k}"),
                )
                .unwrap();
            let (mut ins, mut outs) = (TensorSet::new(), TensorSet::new());
            ins.add("input", &i);
            outs.add("output", &o);
            (i, o, ins, outs, ReadBuffer::new(BYTES as u64).unwrap())
        })
        .collect();
    let (q0, q1, compute) = (
        rt.tensor_op_xu(0, 0).unwrap().clone(),
        rt.tensor_op_xu(0, 1).unwrap().clone(),
        rt.xu(0).unwrap().clone(),
    );
    let mut writes: VecDeque<Waiting<runtime::ScheduledTensorOp>> = VecDeque::new();
    let mut execs: VecDeque<Waiting<runtime::ScheduledExecution>> = VecDeque::new();
    let mut reads: VecDeque<Waiting<runtime::ScheduledTensorOp>> = VecDeque::new();
    let mut written: VecDeque<u64> = VecDeque::new();
    let mut executed: VecDeque<u64> = VecDeque::new();
    let (mut next, mut checked) = (0u64, 0u64);
    let mut most_in_flight = [0usize; 3];
    while checked < STEPS {
        let mut progressed = false;
        // Writes on queue 0, while a slot is free (step `next - SLOTS` was checked).
        while next < STEPS && writes.len() < PER_XU && next < checked + SLOTS as u64 {
            let slot = &slots[slot_of(next)];
            let op = rt
                .tensor_write_schedule(&slot.0, &pattern(BYTES, next), 0, 0, 0)
                .unwrap();
            let efd = q0.install_fresh_comp_efd(op.seq_id()).unwrap();
            writes.push_back(Waiting {
                step: next,
                seq: op.seq_id(),
                efd,
                what: op,
            });
            next += 1;
            progressed = true;
        }
        while writes.front().is_some_and(|w| q0.is_completed(w.seq)) {
            let w = writes.pop_front().unwrap();
            assert_eq!(
                w.what.status(),
                Some(NrtStatus::Success),
                "write {}",
                w.step
            );
            written.push_back(w.step);
            progressed = true;
        }
        // The execution of each written step, in order.
        while execs.len() < PER_XU && !written.is_empty() {
            let step = written.pop_front().unwrap();
            let slot = &slots[slot_of(step)];
            let e = rt.execute_schedule(m, &slot.2, &slot.3).unwrap();
            let efd = compute.install_fresh_comp_efd(e.seq_id()).unwrap();
            execs.push_back(Waiting {
                step,
                seq: e.seq_id(),
                efd,
                what: e,
            });
            progressed = true;
        }
        while execs.front().is_some_and(|e| compute.is_completed(e.seq)) {
            let e = execs.pop_front().unwrap();
            assert_eq!(
                e.what.status(),
                Some(NrtStatus::Success),
                "execution {}",
                e.step
            );
            executed.push_back(e.step);
            progressed = true;
        }
        // Reads of the outputs on queue 1.
        while reads.len() < PER_XU && !executed.is_empty() {
            let step = executed.pop_front().unwrap();
            let slot = &slots[slot_of(step)];
            let op = rt
                .tensor_read_schedule(&slot.4, &slot.1, 0, BYTES as u64, 0, 1)
                .unwrap();
            let efd = q1.install_fresh_comp_efd(op.seq_id()).unwrap();
            reads.push_back(Waiting {
                step,
                seq: op.seq_id(),
                efd,
                what: op,
            });
            progressed = true;
        }
        while reads.front().is_some_and(|r| q1.is_completed(r.seq)) {
            let r = reads.pop_front().unwrap();
            assert_eq!(r.what.status(), Some(NrtStatus::Success), "read {}", r.step);
            assert_eq!(r.step, checked, "steps complete in order");
            let slot = &slots[slot_of(r.step)];
            let got = slot.4.to_vec().unwrap();
            assert!(
                got == pattern(BYTES, r.step),
                "step {}: wrong output",
                r.step
            );
            checked += 1;
            progressed = true;
        }
        for (k, n) in [writes.len(), execs.len(), reads.len()]
            .into_iter()
            .enumerate()
        {
            most_in_flight[k] = most_in_flight[k].max(n);
        }
        if !progressed {
            let fronts: Vec<&OwnedFd> = [
                writes.front().and_then(|w| w.efd.as_ref()),
                execs.front().and_then(|e| e.efd.as_ref()),
                reads.front().and_then(|r| r.efd.as_ref()),
            ]
            .into_iter()
            .flatten()
            .collect();
            wait_any(&fronts);
        }
    }
    assert!(
        most_in_flight.iter().all(|&n| n >= 2),
        "2-3 requests in flight per XU at some point: {most_in_flight:?}"
    );
    assert_eq!(q0.last_completed().seq_num(), STEPS);
    assert_eq!(q1.last_completed().seq_num(), STEPS);
    assert_eq!(compute.last_completed().seq_num(), STEPS);
    drop(slots);
    rt.close();
}

#[test]
fn a_dma_abort_injected_into_a_tensor_write_is_1203_there_and_nowhere_else() {
    let (rt, sim) = rig();
    let m = rt
        .load(&identity(64).to_container(Target::Simdev).unwrap(), 0)
        .unwrap();
    let i = rt
        .tensor_allocate(Placement::Device { vnc: 0 }, 64, "i")
        .unwrap();
    let o = rt
        .tensor_allocate(Placement::Device { vnc: 0 }, 64, "o")
        .unwrap();
    let (mut ins, mut outs) = (TensorSet::new(), TensorSet::new());
    ins.add("input", &i);
    outs.add("output", &o);
    let dq = rt.tensor_op_engine().unwrap().dma_queue(0, 0).unwrap();
    connect(&sim)
        .inject_fault(FaultSpec {
            kind: FaultKind::DmaAbort,
            nc: Some(dq.nc),
            when: FaultWhen::NthCopyStart {
                engine: dq.engine,
                queue: dq.queue,
                n: 3,
            },
        })
        .unwrap();
    let ops: Vec<_> = (0..3u8)
        .map(|k| rt.tensor_write_schedule(&i, &[k; 64], 0, 0, 0).unwrap())
        .collect();
    let statuses: Vec<_> = ops
        .iter()
        .map(|op| rt.wait_tensor_op(op).unwrap())
        .collect();
    assert_eq!(
        statuses,
        [
            NrtStatus::Success,
            NrtStatus::Success,
            NrtStatus::ExecHwErrDmaAbort
        ],
        "the third write's DMA aborted"
    );
    assert_eq!(ops[2].status(), Some(NrtStatus::ExecHwErrDmaAbort), "ret");
    let q0 = rt.tensor_op_xu(0, 0).unwrap();
    assert_eq!(q0.health(), XuHealth::FatalShutdown);
    assert_eq!(
        rt.tensor_write_schedule(&i, &[9; 64], 0, 0, 0)
            .unwrap_err()
            .status,
        NrtStatus::ExecUnitUnrecoverable
    );
    // Queue 1 and the compute XU keep working.
    let op = rt.tensor_write_schedule(&i, &[7; 64], 0, 0, 1).unwrap();
    assert_eq!(rt.wait_tensor_op(&op).unwrap(), NrtStatus::Success);
    rt.execute(m, &ins, &outs).unwrap();
    let dest = ReadBuffer::new(64).unwrap();
    let op = rt.tensor_read_schedule(&dest, &o, 0, 64, 0, 1).unwrap();
    assert_eq!(rt.wait_tensor_op(&op).unwrap(), NrtStatus::Success);
    assert_eq!(dest.to_vec().unwrap(), vec![7; 64]);
    assert_eq!(rt.xu(0).unwrap().health(), XuHealth::Healthy);
    assert_eq!(rt.tensor_op_xu(0, 1).unwrap().health(), XuHealth::Healthy);
    drop((i, o, ins, outs));
    rt.close();
}

#[test]
fn a_tensor_under_a_scheduled_request_is_not_freed_and_unload_waits_for_scheduled_executions() {
    let (rt, _sim) = rig();
    let m = rt
        .load(&identity(1 << 20).to_container(Target::Simdev).unwrap(), 0)
        .unwrap();
    let i = rt
        .tensor_allocate(Placement::Device { vnc: 0 }, 1 << 20, "i")
        .unwrap();
    let o = rt
        .tensor_allocate(Placement::Device { vnc: 0 }, 1 << 20, "o")
        .unwrap();
    let (mut ins, mut outs) = (TensorSet::new(), TensorSet::new());
    ins.add("input", &i);
    outs.add("output", &o);
    let data = pattern(1 << 20, 77);
    let w = rt.tensor_write_schedule(&i, &data, 0, 0, 0).unwrap();
    assert_eq!(rt.wait_tensor_op(&w).unwrap(), NrtStatus::Success);
    // Several executions scheduled: unload returns only after each completed.
    let execs: Vec<_> = (0..8)
        .map(|_| rt.execute_schedule(m, &ins, &outs).unwrap())
        .collect();
    let mut o_handle = Some(o.clone());
    let freed = rt.tensor_free(&mut o_handle);
    let before = rt.device().nc_counters(0).unwrap().executions;
    rt.unload(m).unwrap();
    // Each work item holds the model until the worker frees it, after the device ran it.
    let ran = rt.device().nc_counters(0).unwrap().executions;
    assert_eq!(
        ran, 8,
        "unload returned after every scheduled execution ran (from {before})"
    );
    for e in &execs {
        assert_eq!(rt.wait(e).unwrap(), NrtStatus::Success);
    }
    // The free raced with the executions: refused naming one of them, or they had all ended.
    match freed {
        Err(e) => {
            assert_eq!(e.status, NrtStatus::Invalid);
            assert!(
                e.message.contains("COMPUTE queue 0 of logical core 0"),
                "{e}"
            );
            assert!(o_handle.is_some());
            drop((ins, outs));
            rt.tensor_free(&mut o_handle).unwrap();
        }
        Ok(()) => assert!(o_handle.is_none()),
    }
    let dest = ReadBuffer::new(1 << 20).unwrap();
    let r = rt
        .tensor_read_schedule(&dest, &o, 0, 1 << 20, 0, 1)
        .unwrap();
    assert_eq!(rt.wait_tensor_op(&r).unwrap(), NrtStatus::Success);
    assert!(dest.to_vec().unwrap() == data);
    rt.close();
}
