//! Staging against the emulated device in-process: each request lands in the slot of its
//! `compute_idx`, across wraps, and requests staged before the device consumes them each run
//! their own program.

use std::sync::Arc;
use std::time::Duration;

use shared::NrtStatus;
use shared::exec_request::{DeviceExecRequest, Engine};
use shared::isa::{Instruction, Opcode, encode_program};

use super::{HwExecQueue, REQUEST_SLOT_SIZE, StagedProgram};
use crate::backend::Device;
use crate::builder::identity;
use crate::test_support::{Rig, gated_identity, io, load, pattern};

#[test]
fn each_request_is_written_to_the_slot_of_its_compute_idx_across_wraps() {
    let rig = Rig::new();
    rig.backend.claim_nc(0).unwrap();
    let device: Arc<dyn Device> = rig.backend.clone();
    let slots = 3;
    let queue = HwExecQueue::new(device, &[0], slots).unwrap();
    let mut req = queue.compute_req_lock.lock().unwrap();
    let flags = [0u32; 13];
    let hashes = ([0u8; 32], [0u8; 32]);
    // No doorbell rings, so the device consumes nothing: every slot keeps what was last
    // staged into it. compute_idx 0..8 wraps the three slots twice.
    for idx in 0..8u32 {
        let program = StagedProgram {
            engine_addresses: [0x1000 * u64::from(idx + 1); 5],
            exec_req_flags: &flags,
            table_hashes: (&hashes.0, &hashes.1),
            io: &[],
            cc_chain: None,
            encoding: shared::neff_program::ProgramEncoding::SimdevIsa,
            dge: None,
        };
        let compute_idx = req.next_compute_idx();
        assert_eq!(compute_idx, idx);
        let staged = req
            .tpb_mut(0)
            .unwrap()
            .add_exec_request(compute_idx, &program, false, true)
            .unwrap();
        assert_eq!(staged.compute_idx, idx);
        let state = req.tpb(0).unwrap();
        for slot in 0..slots {
            let pa = state.req_alloc.pa + u64::from(slot) * REQUEST_SLOT_SIZE;
            let mut bytes = [0u8; shared::exec_request::DEVICE_EXEC_REQUEST_SIZE];
            state.req_buf.read(pa, &mut bytes).unwrap();
            let written = DeviceExecRequest::decode(&bytes).unwrap();
            // The last request staged into `slot` (none yet: zeroes).
            let last = (0..=idx).rev().find(|k| k % slots == slot);
            let expected = last.map_or(0, |k| 0x1000 * u64::from(k + 1));
            assert_eq!(
                written.engine_address(Engine::Sp),
                expected,
                "after compute_idx {idx}: slot {slot}"
            );
        }
    }
    drop(req);
    queue.release();
}

#[test]
fn requests_staged_before_the_device_consumes_them_each_run_their_own_program() {
    // A blocker waits for event 9; three executions of models that each move their bytes
    // through their own I/O ring (queues 1..=3) are staged behind it (compute_idx 1..=3,
    // slots 1..=3) before the device fetches any of their batches. Sharing one slot would run
    // the last request's program — the last ring — for all of them.
    let rig = Rig::new();
    let rt = rig.sync_runtime();
    let blk = load(&rt, &gated_identity(64, "blocker", 9), 0);
    let (bi, bo, bins, bouts) = io(&rt, 64);
    bi.write(&pattern(64, 99), 0).unwrap();
    let first = rt.execute_schedule(blk, &bins, &bouts).unwrap();
    let mut runs = Vec::new();
    for (k, n) in (0u8..).zip([64u32, 100_000, 100]) {
        let mut model = identity(n);
        let queue = u32::from(k) + 1;
        let ring = &mut model.tpbs[0].io_rings[0];
        ring.queue = queue;
        let count = u32::try_from(ring.descs.len()).unwrap();
        let engine = ring.engine;
        model.tpbs[0].blocks[4] = encode_program(&[
            Instruction::new(Opcode::DmaStart, &[engine, queue, count]),
            Instruction::new(Opcode::DmaWait, &[engine, queue]),
            Instruction::new(Opcode::End, &[]),
        ]);
        let m = load(&rt, &model, 0);
        let (i, o, ins, outs) = io(&rt, u64::from(n));
        let data = pattern(n as usize, k);
        i.write(&data, 0).unwrap();
        let s = rt.execute_schedule(m, &ins, &outs).unwrap();
        runs.push((s, o, data, i, ins, outs));
    }
    assert_eq!(rt.compute_idx_tail(0), Some(4));
    std::thread::sleep(Duration::from_millis(20));
    assert_eq!(first.status(), None, "the blocker waits for its event");
    assert_eq!(rig.counters(0).executions, 0);
    rig.backend.event_set(0, 9, 1).unwrap();
    assert_eq!(rt.wait(&first).unwrap(), NrtStatus::Success);
    let mut out = vec![0u8; 64];
    bo.read(&mut out, 0).unwrap();
    assert!(out == pattern(64, 99), "the blocker's own output");
    for (k, (s, o, data, ..)) in runs.iter().enumerate() {
        assert_eq!(rt.wait(s).unwrap(), NrtStatus::Success, "request {k}");
        let mut out = vec![0u8; data.len()];
        o.read(&mut out, 0).unwrap();
        assert!(out == *data, "request {k}: output differs");
    }
    assert_eq!(rig.counters(0).executions, 4);
    drop(runs);
    rt.close();
}
