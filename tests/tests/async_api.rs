//! The explicit async API through the XU ring (nrt-api.md §2.10, async 3.x semantics; seed 004
//! §7): non-blocking schedule returning `seq_id`, NRT_QUEUE_FULL that changes nothing,
//! `is_completed`, status before completion, blocking wait, a per-queue completion eventfd,
//! in-order completion, and 101 after a fatal error.

use std::os::fd::AsFd;
use std::sync::Arc;
use std::time::Duration;

use nix::sys::eventfd::{EfdFlags, EventFd};
use runtime::builder::{identity, never_ending};
use runtime::config::RuntimeConfig;
use runtime::{Device, Placement, Runtime, TensorSet};
use shared::NrtStatus;
use shared::ids::XuType;
use shared::model::Target;
use tests::{InterposedDevice, connect, start_simdev, wait_for};

fn rig() -> (
    Runtime,
    Arc<InterposedDevice>,
    runtime::backend::sim::PrivateSimdev,
) {
    let sim = start_simdev(&["--hbm", "64M"]);
    let dev = Arc::new(InterposedDevice::new(Box::new(connect(&sim))));
    let rt = Runtime::init(
        dev.clone(),
        RuntimeConfig {
            exec_timeout: Duration::from_secs(10),
            ..RuntimeConfig::default()
        },
    )
    .unwrap();
    (rt, dev, sim)
}

fn sets(rt: &Runtime, bytes: u64) -> (runtime::Tensor, runtime::Tensor, TensorSet, TensorSet) {
    let i = rt
        .tensor_allocate(Placement::Device { vnc: 0 }, bytes, "i")
        .unwrap();
    let o = rt
        .tensor_allocate(Placement::Device { vnc: 0 }, bytes, "o")
        .unwrap();
    let (mut ins, mut outs) = (TensorSet::new(), TensorSet::new());
    ins.add("input", &i);
    outs.add("output", &o);
    (i, o, ins, outs)
}

#[test]
fn schedule_does_not_block_and_completions_come_in_order() {
    let (rt, _dev, _sim) = rig();
    let m = rt
        .load(&identity(4096).to_container(Target::Simdev).unwrap(), 0)
        .unwrap();
    let (i, o, ins, outs) = sets(&rt, 4096);
    i.write(&[9; 4096], 0).unwrap();
    let efd =
        EventFd::from_value_and_flags(0, EfdFlags::EFD_CLOEXEC | EfdFlags::EFD_NONBLOCK).unwrap();
    rt.event_register_xu_completion(0, XuType::Compute, 0, Some(efd.as_fd()))
        .unwrap();
    let reqs: Vec<_> = (0..12)
        .map(|_| rt.execute_schedule(m, &ins, &outs).unwrap())
        .collect();
    for (k, r) in reqs.iter().enumerate() {
        assert_eq!(
            r.seq_id().xu_id(),
            rt.xu(0).unwrap().xu_id(),
            "high 16 bits name the XU"
        );
        assert_eq!(r.seq_id().seq_num(), k as u64 + 1, "seq_nums count from 1");
    }
    // In-order: whenever request k shows completed, every earlier one does too, with its status.
    let last = reqs.last().unwrap();
    while !rt.is_completed(last.seq_id()).unwrap() {
        for (k, r) in reqs.iter().enumerate() {
            if rt.is_completed(r.seq_id()).unwrap() {
                assert!(
                    reqs[..k]
                        .iter()
                        .all(|e| rt.is_completed(e.seq_id()).unwrap())
                );
                assert_eq!(
                    r.status(),
                    Some(NrtStatus::Success),
                    "status visible once completed"
                );
            }
        }
        std::thread::yield_now();
    }
    for r in &reqs {
        assert_eq!(rt.wait(r).unwrap(), NrtStatus::Success);
    }
    let mut total = 0;
    while let Ok(n) = efd.read() {
        total += n;
    }
    assert_eq!(total, 12, "the registered eventfd counts every completion");
    let mut out = [0u8; 4096];
    o.read(&mut out, 0).unwrap();
    assert_eq!(out, [9; 4096]);
    rt.close();
}

#[test]
fn a_full_queue_returns_queue_full_and_changes_nothing() {
    let (rt, dev, _sim) = rig();
    let stuck = rt
        .load(&never_ending(9).to_container(Target::Simdev).unwrap(), 0)
        .unwrap();
    let (_i, _o, ins, outs) = sets(&rt, 1);
    let capacity = rt.config().xu_capacity;
    let reqs: Vec<_> = (0..capacity)
        .map(|_| rt.execute_schedule(stuck, &ins, &outs).unwrap())
        .collect();
    let doorbells = dev.calls()["semaphore_increment"];
    let depth = rt.xu(0).unwrap().depth();
    let e = rt.execute_schedule(stuck, &ins, &outs).unwrap_err();
    assert_eq!(e.status, NrtStatus::QueueFull, "{e}");
    assert_eq!(
        dev.calls()["semaphore_increment"],
        doorbells,
        "nothing staged or rung"
    );
    assert_eq!(rt.xu(0).unwrap().depth(), depth);
    // Release the waiting programs: every accepted request completes with success.
    dev.event_set(0, 9, 1).unwrap();
    for r in &reqs {
        assert_eq!(rt.wait(r).unwrap(), NrtStatus::Success);
    }
    assert!(
        wait_for(Duration::from_secs(5), || rt
            .execute_schedule(stuck, &ins, &outs)
            .ok())
        .is_some()
    );
    rt.close();
}

#[test]
fn after_a_fatal_error_every_schedule_returns_101() {
    let (rt, dev, _sim) = rig();
    let m = rt
        .load(&identity(64).to_container(Target::Simdev).unwrap(), 0)
        .unwrap();
    let (_i, _o, ins, outs) = sets(&rt, 64);
    rt.wait(&rt.execute_schedule(m, &ins, &outs).unwrap())
        .unwrap();
    dev.fail_next_doorbells(1);
    assert_ne!(
        rt.execute_schedule(m, &ins, &outs).unwrap_err().status,
        NrtStatus::Success
    );
    for _ in 0..3 {
        assert_eq!(
            rt.execute_schedule(m, &ins, &outs).unwrap_err().status,
            NrtStatus::ExecUnitUnrecoverable
        );
    }
    let host = rt.tensor_allocate(Placement::Host, 64, "h").unwrap();
    let mut hs = TensorSet::new();
    hs.add("input", &host);
    assert_eq!(
        rt.execute_schedule(m, &hs, &outs).unwrap_err().status,
        NrtStatus::Invalid,
        "device tensors only"
    );
    let foreign = shared::SeqId::new(shared::XuId::new(shared::XuType::Compute, 0, 200), 1);
    assert_eq!(
        rt.is_completed(foreign).unwrap_err().status,
        NrtStatus::Invalid
    );
    rt.close();
}
