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
use shared::ids::{SeqId, XuId, XuType};
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

/// `nrta_get_sequence` / `nrta_is_completed` on every XU of a logical core: COMPUTE runs, the
/// three COLLECTIVES XUs exist and refuse work (nothing consumed); bad ids and queues are
/// NRT_INVALID naming them.
#[test]
fn completion_calls_reach_every_xu_and_collectives_refuse_work() {
    let (rt, _dev, _sim) = rig();
    let compute0 = rt.get_sequence(0, XuType::Compute, 0).unwrap();
    assert_eq!(compute0.seq_num(), 0, "nothing completed yet");
    assert_eq!(compute0.xu_id(), XuId::new(XuType::Compute, 0, 0));
    assert!(
        rt.is_completed(compute0).unwrap(),
        "seq_num 0 is the 'none yet'"
    );
    for q in 0..3u8 {
        let s = rt
            .get_sequence(0, XuType::Collectives, u32::from(q))
            .unwrap();
        assert_eq!(s, SeqId::new(XuId::new(XuType::Collectives, q, 0), 0));
        assert!(rt.xu_by_id(s.xu_id()).is_some(), "reachable by id");
        let e = rt.cc_schedule(0, u32::from(q)).unwrap_err();
        assert_eq!(e.status, NrtStatus::Invalid);
        assert!(e.message.contains("not simulated"), "{e}");
        assert_eq!(
            rt.get_sequence(0, XuType::Collectives, u32::from(q))
                .unwrap(),
            s
        );
        assert_eq!(rt.xu_by_id(s.xu_id()).unwrap().depth(), 0, "nothing queued");
        let beyond = SeqId::new(s.xu_id(), 1);
        let e = rt.is_completed(beyond).unwrap_err();
        assert_eq!(e.status, NrtStatus::Invalid);
        assert!(e.message.contains(&format!("{:#x}", beyond.raw())), "{e}");
    }
    let e = rt.cc_schedule(0, 3).unwrap_err();
    assert!(e.message.contains("queue 3"), "{e}");
    let e = rt.get_sequence(0, XuType::Compute, 1).unwrap_err();
    assert_eq!(e.status, NrtStatus::Invalid);
    assert!(e.message.contains("queue 1"), "{e}");
    let e = rt.get_sequence(77, XuType::Compute, 0).unwrap_err();
    assert!(e.message.contains("logical core 77"), "{e}");

    let m = rt
        .load(&identity(64).to_container(Target::Simdev).unwrap(), 0)
        .unwrap();
    let (_i, _o, ins, outs) = sets(&rt, 64);
    let r = rt.execute_schedule(m, &ins, &outs).unwrap();
    assert_eq!(rt.wait(&r).unwrap(), NrtStatus::Success);
    assert_eq!(rt.get_sequence(0, XuType::Compute, 0).unwrap(), r.seq_id());
    // Ids naming no XU, or a request beyond the last submitted (another runtime's or
    // process's id), are refused, naming the id.
    for bad in [
        SeqId::new(r.seq_id().xu_id(), 2),
        SeqId::new(XuId::new(XuType::Compute, 1, 0), 1),
        SeqId::new(XuId::new(XuType::Compute, 0, 9), 1),
        SeqId::from_raw(0xF000_0000_0000_0001),
    ] {
        let e = rt.is_completed(bad).unwrap_err();
        assert_eq!(e.status, NrtStatus::Invalid, "{bad:?}");
        assert!(e.message.contains(&format!("{:#x}", bad.raw())), "{e}");
        let efd = EventFd::from_value_and_flags(0, EfdFlags::EFD_NONBLOCK).unwrap();
        let e = rt
            .event_register_seq_id_completion(bad, Some(efd.as_fd()))
            .unwrap_err();
        assert_eq!(e.status, NrtStatus::Invalid, "{bad:?}");
    }
    rt.close();
}

/// Seq-id completion eventfds on real executions: two on one request are both signalled, a
/// deregistered one never is, an already completed request signals at once; an XU completion
/// eventfd counts exactly the completions while registered.
#[test]
fn seq_id_and_xu_completion_events_on_real_executions() {
    let (rt, dev, _sim) = rig();
    let stuck = rt
        .load(&never_ending(9).to_container(Target::Simdev).unwrap(), 0)
        .unwrap();
    let (_i, _o, ins, outs) = sets(&rt, 1);
    let nb = || EventFd::from_value_and_flags(0, EfdFlags::EFD_NONBLOCK).unwrap();
    let (a, b, c, counted) = (nb(), nb(), nb(), nb());
    rt.event_register_xu_completion(0, XuType::Compute, 0, Some(counted.as_fd()))
        .unwrap();
    let r1 = rt.execute_schedule(stuck, &ins, &outs).unwrap();
    let r2 = rt.execute_schedule(stuck, &ins, &outs).unwrap();
    // The caller keeps ownership of its fd: the runtime registers a duplicate, so the fd
    // passed may be closed right after (here a second descriptor of `a`'s eventfd).
    let passed = a.as_fd().try_clone_to_owned().unwrap();
    rt.event_register_seq_id_completion(r1.seq_id(), Some(passed.as_fd()))
        .unwrap();
    drop(passed);
    rt.event_register_seq_id_completion(r1.seq_id(), Some(b.as_fd()))
        .unwrap();
    rt.event_register_seq_id_completion(r2.seq_id(), Some(c.as_fd()))
        .unwrap();
    rt.event_register_seq_id_completion(r2.seq_id(), None)
        .unwrap();
    assert_eq!(a.read(), Err(nix::errno::Errno::EAGAIN), "still in flight");
    dev.event_set(0, 9, 1).unwrap();
    assert_eq!(rt.wait(&r2).unwrap(), NrtStatus::Success);
    assert_eq!(a.read(), Ok(1));
    assert_eq!(b.read(), Ok(1));
    assert_eq!(c.read(), Err(nix::errno::Errno::EAGAIN), "deregistered");
    let d = nb();
    rt.event_register_seq_id_completion(r1.seq_id(), Some(d.as_fd()))
        .unwrap();
    assert_eq!(d.read(), Ok(1), "already completed: signalled at once");
    assert_eq!(counted.read(), Ok(2), "exactly the two completions");
    rt.event_register_xu_completion(0, XuType::Compute, 0, None)
        .unwrap();
    let r3 = rt.execute_schedule(stuck, &ins, &outs).unwrap();
    assert_eq!(rt.wait(&r3).unwrap(), NrtStatus::Success);
    assert_eq!(
        counted.read(),
        Err(nix::errno::Errno::EAGAIN),
        "deregistered"
    );
    rt.close();
}
