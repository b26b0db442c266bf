//! Tensor operations as scheduled work against a real simdev (issue 12 items 2 and 4): a
//! serving pipeline over the TENSOR_OP and COMPUTE XUs, a DMA abort injected into a tensor
//! write, and nothing freed under a scheduled request.

use std::collections::VecDeque;
use std::os::fd::AsFd;
use std::sync::Arc;
use std::time::Duration;

use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
use nix::sys::eventfd::{EfdFlags, EventFd};
use runtime::builder::identity;
use runtime::config::RuntimeConfig;
use runtime::xu::XuHealth;
use runtime::{Placement, ReadBuffer, Runtime, ScheduledRequest, Tensor, TensorSet};
use shared::NrtStatus;
use shared::ids::{SeqId, XuId, XuType};
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

/// A request in flight and the eventfd the test registered for its sequence id
/// (`nrta_event_register_seq_id_completion`): the runtime writes 1 to it when the request
/// completes, or at once if it already had.
struct Waiting {
    step: u64,
    req: ScheduledRequest,
    efd: EventFd,
}

impl Waiting {
    fn register(rt: &Runtime, step: u64, req: ScheduledRequest) -> Self {
        let efd = EventFd::from_value_and_flags(0, EfdFlags::EFD_NONBLOCK | EfdFlags::EFD_CLOEXEC)
            .unwrap();
        rt.event_register_seq_id_completion(req.seq_id(), Some(efd.as_fd()))
            .unwrap();
        Self { step, req, efd }
    }

    /// Whether its eventfd fired (consuming the count): then the request completed and its
    /// `ret` is written.
    fn fired(&self, rt: &Runtime) -> bool {
        match self.efd.read() {
            Ok(n) => {
                assert_eq!(n, 1, "one signal per registration");
                assert!(rt.is_completed(self.req.seq_id()).unwrap());
                assert!(
                    self.req.status().is_some(),
                    "ret is written before the signal"
                );
                true
            }
            Err(nix::errno::Errno::EAGAIN) => false,
            Err(e) => panic!("reading a seq-id eventfd: {e}"),
        }
    }
}

/// The tensors' slot of step `step`.
fn slot_of(step: u64) -> usize {
    usize::try_from(step).unwrap() % SLOTS
}

/// Blocks (poll(2)) until one of the front requests' eventfds is readable.
fn wait_any(fds: &[&EventFd]) {
    assert!(!fds.is_empty(), "waiting with nothing in flight");
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

/// The pipeline serving code writes: for each step, write its input on TENSOR_OP queue 0, wait
/// for that write's seq-id eventfd, schedule the execution, wait for its eventfd, read the
/// output on queue 1 and check it — up to three requests queued on each XU.
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
    let mut writes: VecDeque<Waiting> = VecDeque::new();
    let mut execs: VecDeque<Waiting> = VecDeque::new();
    let mut reads: VecDeque<Waiting> = VecDeque::new();
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
            assert_eq!(
                (op.xu_type(), op.queue(), op.lnc()),
                (XuType::TensorOp, 0, 0)
            );
            writes.push_back(Waiting::register(&rt, next, op));
            next += 1;
            progressed = true;
        }
        // Sampled with the queues full, before anything is harvested.
        for (k, n) in [writes.len(), execs.len(), reads.len()]
            .into_iter()
            .enumerate()
        {
            most_in_flight[k] = most_in_flight[k].max(n);
        }
        while writes.front().is_some_and(|w| w.fired(&rt)) {
            let w = writes.pop_front().unwrap();
            assert_eq!(w.req.status(), Some(NrtStatus::Success), "write {}", w.step);
            written.push_back(w.step);
            progressed = true;
        }
        // The execution of each written step, in order.
        while execs.len() < PER_XU && !written.is_empty() {
            let step = written.pop_front().unwrap();
            let slot = &slots[slot_of(step)];
            let e = rt.execute_schedule(m, &slot.2, &slot.3).unwrap();
            assert_eq!(e.xu_type(), XuType::Compute);
            execs.push_back(Waiting::register(&rt, step, e));
            progressed = true;
        }
        most_in_flight[1] = most_in_flight[1].max(execs.len());
        while execs.front().is_some_and(|e| e.fired(&rt)) {
            let e = execs.pop_front().unwrap();
            assert_eq!(
                e.req.status(),
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
            assert_eq!((op.xu_type(), op.queue()), (XuType::TensorOp, 1));
            reads.push_back(Waiting::register(&rt, step, op));
            progressed = true;
        }
        most_in_flight[2] = most_in_flight[2].max(reads.len());
        while reads.front().is_some_and(|r| r.fired(&rt)) {
            let r = reads.pop_front().unwrap();
            assert_eq!(r.req.status(), Some(NrtStatus::Success), "read {}", r.step);
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
        if !progressed {
            let fronts: Vec<&EventFd> = [writes.front(), execs.front(), reads.front()]
                .into_iter()
                .flatten()
                .map(|w| &w.efd)
                .collect();
            wait_any(&fronts);
        }
    }
    assert!(
        most_in_flight.iter().all(|&n| (2..=PER_XU).contains(&n)),
        "2-3 requests in flight per XU (writes, executions, reads): {most_in_flight:?}"
    );
    let last = |xu_type, q| rt.get_sequence(0, xu_type, q).unwrap().seq_num();
    assert_eq!(last(XuType::TensorOp, 0), STEPS);
    assert_eq!(last(XuType::TensorOp, 1), STEPS);
    assert_eq!(last(XuType::Compute, 0), STEPS);
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
    let statuses: Vec<_> = ops.iter().map(|op| rt.wait(op).unwrap()).collect();
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
    assert_eq!(rt.wait(&op).unwrap(), NrtStatus::Success);
    rt.execute(m, &ins, &outs).unwrap();
    let dest = ReadBuffer::new(64).unwrap();
    let op = rt.tensor_read_schedule(&dest, &o, 0, 64, 0, 1).unwrap();
    assert_eq!(rt.wait(&op).unwrap(), NrtStatus::Success);
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
    assert_eq!(rt.wait(&w).unwrap(), NrtStatus::Success);
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
    assert_eq!(rt.wait(&r).unwrap(), NrtStatus::Success);
    assert!(dest.to_vec().unwrap() == data);
    rt.close();
}

fn nonblocking_eventfd() -> EventFd {
    EventFd::from_value_and_flags(0, EfdFlags::EFD_NONBLOCK | EfdFlags::EFD_CLOEXEC).unwrap()
}

/// Tensor operations answer the general calls: `get_sequence(lnc, TENSOR_OP, q)` is the last
/// completed operation of that queue (the queues apart), `is_completed` takes their seq ids, and
/// an XU completion eventfd on a TENSOR_OP queue counts exactly that queue's completions.
#[test]
fn tensor_ops_answer_get_sequence_is_completed_and_count_on_an_xu_completion_eventfd() {
    let (rt, _sim) = rig();
    let t = rt
        .tensor_allocate(Placement::Device { vnc: 0 }, 4096, "t")
        .unwrap();
    for q in 0..2u8 {
        let s = rt.get_sequence(0, XuType::TensorOp, u32::from(q)).unwrap();
        assert_eq!(
            s,
            SeqId::new(XuId::new(XuType::TensorOp, q, 0), 0),
            "none yet"
        );
        assert!(rt.is_completed(s).unwrap());
    }
    let counted = nonblocking_eventfd();
    rt.event_register_xu_completion(0, XuType::TensorOp, 1, Some(counted.as_fd()))
        .unwrap();
    let mut last = [None, None];
    // Five on queue 1, three on queue 0, interleaved.
    for k in 0..8u8 {
        let q: i32 = if k % 3 == 0 { 0 } else { 1 };
        let op = rt
            .tensor_write_schedule(&t, &[k; 512], u64::from(k) * 512, 0, q)
            .unwrap();
        assert_eq!(
            op.seq_id().xu_id(),
            XuId::new(XuType::TensorOp, op.queue(), 0)
        );
        assert_eq!(rt.wait(&op).unwrap(), NrtStatus::Success);
        assert!(rt.is_completed(op.seq_id()).unwrap());
        assert_eq!(
            rt.get_sequence(0, XuType::TensorOp, u32::try_from(q).unwrap())
                .unwrap(),
            op.seq_id(),
            "the last completed of queue {q}"
        );
        last[usize::try_from(q).unwrap()] = Some(op);
    }
    let [Some(l0), Some(l1)] = &last else {
        panic!("both queues used")
    };
    assert_eq!(l0.seq_id().seq_num(), 3);
    assert_eq!(l1.seq_id().seq_num(), 5);
    assert_eq!(
        rt.get_sequence(0, XuType::TensorOp, 0).unwrap(),
        l0.seq_id()
    );
    assert_eq!(
        rt.get_sequence(0, XuType::TensorOp, 1).unwrap(),
        l1.seq_id()
    );
    assert_eq!(counted.read(), Ok(5), "exactly queue 1's five completions");
    // A read completes on queue 1 too; then deregistered, nothing more is counted.
    let dest = ReadBuffer::new(512).unwrap();
    let r = rt.tensor_read_schedule(&dest, &t, 512, 512, 0, 1).unwrap();
    assert_eq!(rt.wait(&r).unwrap(), NrtStatus::Success);
    assert_eq!(dest.to_vec().unwrap(), vec![1; 512]);
    assert_eq!(counted.read(), Ok(1));
    rt.event_register_xu_completion(0, XuType::TensorOp, 1, None)
        .unwrap();
    let op = rt.tensor_write_schedule(&t, &[9; 8], 0, 0, 1).unwrap();
    assert_eq!(rt.wait(&op).unwrap(), NrtStatus::Success);
    assert_eq!(
        counted.read(),
        Err(nix::errno::Errno::EAGAIN),
        "deregistered"
    );
    drop(t);
    rt.close();
}

/// Bad input to the completion calls on TENSOR_OP XUs: an unknown queue index, and sequence ids
/// of another runtime's (or process's) TENSOR_OP XU — each NRT_INVALID naming it.
#[test]
fn unknown_tensor_op_queues_and_foreign_tensor_op_seq_ids_are_invalid_naming_them() {
    let (rt, _sim) = rig();
    let (other, _other_sim) = rig();
    let t = other
        .tensor_allocate(Placement::Device { vnc: 0 }, 64, "t")
        .unwrap();
    // The other runtime's queue 0 runs three writes; this one's ran none.
    let foreign: Vec<_> = (0..3u8)
        .map(|k| other.tensor_write_schedule(&t, &[k; 64], 0, 0, 0).unwrap())
        .collect();
    for op in &foreign {
        assert_eq!(other.wait(op).unwrap(), NrtStatus::Success);
    }
    let efd = nonblocking_eventfd();
    for op in &foreign {
        let id = format!("{:#x}", op.seq_id().raw());
        let e = rt.is_completed(op.seq_id()).unwrap_err();
        assert_eq!(e.status, NrtStatus::Invalid, "{e}");
        assert!(e.message.contains(&id), "{e}");
        let e = rt.wait(op).unwrap_err();
        assert_eq!(e.status, NrtStatus::Invalid, "{e}");
        assert!(e.message.contains(&id), "{e}");
        let e = rt
            .event_register_seq_id_completion(op.seq_id(), Some(efd.as_fd()))
            .unwrap_err();
        assert_eq!(e.status, NrtStatus::Invalid, "{e}");
        assert!(e.message.contains(&id), "{e}");
    }
    // A TENSOR_OP queue, or logical core, that no XU has.
    for bad in [
        SeqId::new(XuId::new(XuType::TensorOp, 2, 0), 1),
        SeqId::new(XuId::new(XuType::TensorOp, 15, 0), 1),
        SeqId::new(XuId::new(XuType::TensorOp, 0, 200), 1),
    ] {
        let e = rt.is_completed(bad).unwrap_err();
        assert_eq!(e.status, NrtStatus::Invalid, "{e}");
        assert!(e.message.contains(&format!("{:#x}", bad.raw())), "{e}");
    }
    for q in [2u32, 3, 16, u32::MAX] {
        let e = rt.get_sequence(0, XuType::TensorOp, q).unwrap_err();
        assert_eq!(e.status, NrtStatus::Invalid, "{e}");
        assert!(e.message.contains(&format!("queue {q}")), "{e}");
        let e = rt
            .event_register_xu_completion(0, XuType::TensorOp, q, Some(efd.as_fd()))
            .unwrap_err();
        assert_eq!(e.status, NrtStatus::Invalid, "{e}");
        assert!(e.message.contains(&format!("queue {q}")), "{e}");
    }
    assert_eq!(
        efd.read(),
        Err(nix::errno::Errno::EAGAIN),
        "nothing signalled"
    );
    for q in 0..2 {
        assert_eq!(
            rt.get_sequence(0, XuType::TensorOp, q).unwrap().seq_num(),
            0,
            "nothing changed"
        );
    }
    drop((foreign, t));
    other.close();
    rt.close();
}

/// Seed 004's worker steps every XU of its vNC, so no step may wait on the device longer than
/// its request's deadline. With simdev stopped (SIGSTOP), a tensor write's DMA doorbell — on
/// simdev a request simdev answers — and an execution on the same logical core both end
/// NRT_TIMEOUT after `NEURON_RT_EXEC_TIMEOUT` (1 s here), not after the connection's control
/// timeout (10 minutes here: the old worker sat in the doorbell's reply wait that long). Once
/// simdev runs again the connection still works: the late reply is taken as the one owed,
/// not as the answer to the next request, and the other tensor-op queue moves data.
#[test]
fn a_tensor_write_to_a_stopped_simdev_times_out_by_the_execution_timeout_and_blocks_no_other_xu() {
    let logs = ErrorLogs::install();
    let sim = start_simdev(&["--hbm", "64M"]);
    let dev = Arc::new(
        runtime::backend::sim::SimDevice::connect_with_timeout(
            sim.socket(),
            Duration::from_secs(600),
        )
        .unwrap(),
    );
    let rt = Runtime::init(
        dev.clone(),
        RuntimeConfig {
            exec_timeout: Duration::from_secs(1),
            ..RuntimeConfig::default()
        },
    )
    .unwrap();
    let m = rt
        .load(&identity(64).to_container(Target::Simdev).unwrap(), 0)
        .unwrap();
    let on = Placement::Device { vnc: 0 };
    let i = rt.tensor_allocate(on, 64, "i").unwrap();
    let o = rt.tensor_allocate(on, 64, "o").unwrap();
    let (mut ins, mut outs) = (TensorSet::new(), TensorSet::new());
    ins.add("input", &i);
    outs.add("output", &o);
    // Both queues' staging is allocated now, while simdev answers.
    for q in 0..2 {
        let op = rt.tensor_write_schedule(&i, &[1; 64], 0, 0, q).unwrap();
        assert_eq!(rt.wait(&op).unwrap(), NrtStatus::Success);
    }
    let resume = stop(&sim);
    let write = Waiting::register(
        &rt,
        0,
        rt.tensor_write_schedule(&i, &[2; 64], 0, 0, 0).unwrap(),
    );
    let exec = rt.execute_schedule(m, &ins, &outs).unwrap();
    let exec_efd = nonblocking_eventfd();
    rt.event_register_seq_id_completion(exec.seq_id(), Some(exec_efd.as_fd()))
        .unwrap();
    for (what, efd) in [
        ("the tensor write", &write.efd),
        ("the execution", &exec_efd),
    ] {
        let mut pfd = [PollFd::new(efd.as_fd(), PollFlags::POLLIN)];
        let n = poll(&mut pfd, PollTimeout::from(60_000u16)).unwrap();
        assert!(
            n > 0,
            "{what} did not complete within 60 s of a 1 s execution timeout"
        );
    }
    assert_eq!(
        rt.wait(&write.req).unwrap(),
        NrtStatus::Timeout,
        "the write"
    );
    assert_eq!(rt.wait(&exec).unwrap(), NrtStatus::Timeout, "the execution");
    // Said at NEURON_RT_LOG_LEVEL=ERROR, libnrt's default, as a failed execution is.
    let said = logs.text();
    assert!(
        said.contains("a tensor operation's DMA doorbell failed; degrading the execution unit")
            && said.contains("NRT_TIMEOUT"),
        "{said}"
    );
    drop(resume);
    // The first request after the stop reads the write's late reply (an Ok) first, then its
    // own: a semaphore's value, which an Ok in its place would not be.
    use runtime::Device;
    dev.semaphore_read(0, 0)
        .expect("the late reply is not taken as this request's");
    // Tensor-op queue 1 was not involved: it writes once simdev answers again.
    let op = rt.tensor_write_schedule(&i, &[3; 64], 0, 0, 1).unwrap();
    assert_eq!(rt.wait(&op).unwrap(), NrtStatus::Success);
    let dest = ReadBuffer::new(64).unwrap();
    let op = rt.tensor_read_schedule(&dest, &i, 0, 64, 0, 1).unwrap();
    assert_eq!(rt.wait(&op).unwrap(), NrtStatus::Success);
    assert_eq!(dest.to_vec().unwrap(), vec![3; 64]);
    drop((i, o, ins, outs));
    rt.close();
}

/// Lets a stopped simdev run again however the test ends (else closing the runtime would wait
/// out the control timeout).
struct Resume(nix::unistd::Pid);

impl Drop for Resume {
    fn drop(&mut self) {
        let _ = nix::sys::signal::kill(self.0, nix::sys::signal::Signal::SIGCONT);
    }
}

/// Stops `sim` (SIGSTOP) and waits until every thread of it is stopped: kill(2) returns before
/// the stop takes effect.
fn stop(sim: &runtime::backend::sim::PrivateSimdev) -> Resume {
    use nix::sys::signal::{Signal, kill};
    let pid = nix::unistd::Pid::from_raw(i32::try_from(sim.pid()).unwrap());
    kill(pid, Signal::SIGSTOP).unwrap();
    let resume = Resume(pid);
    let stopped = || {
        let tasks = std::fs::read_dir(format!("/proc/{pid}/task")).ok()?;
        tasks
            .map(|t| std::fs::read_to_string(t.ok()?.path().join("stat")).ok())
            .all(|stat| {
                stat.and_then(|s| {
                    s.rsplit_once(')')
                        .map(|(_, rest)| rest.trim_start().starts_with('T'))
                }) == Some(true)
            })
            .then_some(())
    };
    tests::wait_for(Duration::from_secs(10), stopped).expect("simdev stops on SIGSTOP");
    resume
}

/// Schedule calls never block (nrt-api.md §2.10), and nothing in the runtime's teardown waits
/// on a stopped simdev for the control timeout (10 minutes here): with simdev stopped, a
/// queue's first write (whose staging chunk is allocated as it is scheduled) answers
/// NRT_TIMEOUT by `NEURON_RT_EXEC_TIMEOUT` (1 s here), a tensor free returns at once, and so
/// does `nrt_close` after the execution timeout. Nothing is lost: once simdev runs, the chunk
/// it allocated for the write that stopped waiting is freed, and so is the freed tensor's
/// memory, and after close simdev holds nothing of the runtime.
#[test]
fn a_stopped_simdev_holds_no_first_write_free_or_close_past_the_execution_timeout() {
    const KIB: usize = 1024;
    let sim = start_simdev(&["--hbm", "64M"]);
    let dev = runtime::backend::sim::SimDevice::connect_with_timeout(
        sim.socket(),
        Duration::from_secs(600),
    )
    .unwrap();
    let rt = Runtime::init(
        Arc::new(dev),
        RuntimeConfig {
            exec_timeout: Duration::from_secs(1),
            ..RuntimeConfig::default()
        },
    )
    .unwrap();
    let observer = connect(&sim);
    let held = || -> Option<u64> {
        let clients = observer.clients().unwrap();
        let runtime = clients.iter().find(|c| !c.ncs.is_empty())?;
        Some(runtime.memory_bytes)
    };
    let on = Placement::Device { vnc: 0 };
    let t = rt.tensor_allocate(on, 256 * KIB as u64, "t").unwrap();
    let spare = rt.tensor_allocate(on, 1024 * KIB as u64, "spare").unwrap();
    // Queue 1's staging is allocated while simdev answers; queue 0 has none.
    let op = rt.tensor_write_schedule(&t, &[1; 4096], 0, 0, 1).unwrap();
    assert_eq!(rt.wait(&op).unwrap(), NrtStatus::Success);
    let before = held().expect("the runtime is a client");

    let resume = stop(&sim);
    let (tx, rx) = std::sync::mpsc::channel();
    let rt = Arc::new(rt);
    let worker = {
        let (rt, t) = (rt.clone(), t.clone());
        std::thread::spawn(move || {
            let write = rt.tensor_write_schedule(&t, &[2; 256 * KIB], 0, 0, 0);
            tx.send((
                "the first write on queue 0",
                write.map(|_| ()).map_err(|e| e.status),
            ))
            .unwrap();
            drop(spare);
            tx.send(("freeing a tensor", Ok(()))).unwrap();
        })
    };
    let within = Duration::from_secs(60);
    let (what, write) = rx
        .recv_timeout(within)
        .expect("the first write returns within 60 s of a 1 s execution timeout");
    assert_eq!(write, Err(NrtStatus::Timeout), "{what}");
    let (what, _) = rx
        .recv_timeout(within)
        .expect("a tensor free returns within 60 s");
    assert_eq!(what, "freeing a tensor");
    worker.join().unwrap();
    drop(resume);

    // The next request takes the late replies first: the chunk allocated for the write that
    // stopped waiting is freed, and the free of `spare` is confirmed.
    let op = rt.tensor_write_schedule(&t, &[3; 4096], 0, 0, 1).unwrap();
    assert_eq!(rt.wait(&op).unwrap(), NrtStatus::Success);
    let after = before - 1024 * KIB as u64;
    let settled = tests::wait_for(Duration::from_secs(10), || {
        (held() == Some(after)).then_some(())
    });
    assert!(
        settled.is_some(),
        "simdev holds {:?} bytes of the runtime's, not {after} ({before} before the stop, less \
         the freed tensor)",
        held()
    );

    let resume = stop(&sim);
    drop(t);
    let rt = Arc::into_inner(rt).expect("the worker thread is done");
    let (tx, rx) = std::sync::mpsc::channel();
    let closer = std::thread::spawn(move || {
        rt.close();
        tx.send(()).unwrap();
    });
    rx.recv_timeout(within)
        .expect("nrt_close returns within 60 s of a 1 s execution timeout");
    closer.join().unwrap();
    drop(resume);
    let gone = tests::wait_for(Duration::from_secs(10), || held().is_none().then_some(()));
    assert!(
        gone.is_some(),
        "simdev still lists the closed runtime: {:?}",
        observer.clients()
    );
}

/// This binary's ERROR events, captured (a global subscriber: the worker threads log too).
#[derive(Clone, Default)]
struct ErrorLogs(Arc<std::sync::Mutex<Vec<u8>>>);

impl ErrorLogs {
    fn install() -> Self {
        let logs = Self::default();
        let subscriber = tracing_subscriber::fmt()
            .with_max_level(tracing::Level::ERROR)
            .with_ansi(false)
            .with_writer(logs.clone())
            .finish();
        tracing::subscriber::set_global_default(subscriber).expect("one global subscriber");
        logs
    }

    fn text(&self) -> String {
        String::from_utf8_lossy(&self.0.lock().unwrap()).into_owned()
    }
}

impl std::io::Write for ErrorLogs {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl<'a> tracing_subscriber::fmt::MakeWriter<'a> for ErrorLogs {
    type Writer = Self;

    fn make_writer(&'a self) -> Self {
        self.clone()
    }
}
