//! Compute through the whole device: tensors moved between HBM and SBUF by DMA (from SP
//! programs and from doorbells), compute instructions in staged executions, the activation
//! tables, numerical errors, bad instructions, and a fuzz of random instruction blocks.

use std::collections::BTreeMap;
use std::sync::Once;
use std::sync::atomic::AtomicUsize;

use shared::isa::{ActFunc, AluOp, Dt, Tile};

use super::*;
use crate::compute::fuzz::{Rng, random_instruction, wild_instruction_on};

fn f32_bytes(values: &[f32]) -> Vec<u8> {
    values.iter().flat_map(|v| v.to_le_bytes()).collect()
}

fn f32s(bytes: &[u8]) -> Vec<f32> {
    bytes
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect()
}

fn bf16s(bytes: &[u8]) -> Vec<f32> {
    bytes
        .chunks_exact(2)
        .map(|c| shared::isa::bf16_to_f32(u16::from_le_bytes([c[0], c[1]])))
        .collect()
}

fn u64_of(v: usize) -> u64 {
    u64::try_from(v).unwrap()
}

/// `End` programs except for the engines given.
fn programs(rig: &Rig<'_, '_>, given: &[(Engine, u64)]) -> [u64; 5] {
    let mut addrs = rig.ends_but_sp(None);
    for &(engine, pa) in given {
        addrs[engine.index()] = pa;
    }
    addrs
}

fn end() -> Instruction {
    Instruction::new(Opcode::End, &[])
}

/// NC `nc`'s SBUF bytes (read directly, as a test may).
fn sbuf(dev: &Device, nc: usize, partition: u32, offset: u64, len: usize) -> Vec<u8> {
    let mut out = vec![0u8; len];
    assert!(lock(&dev.core.ncs[nc].compute).read_sbuf(partition, offset, &mut out));
    out
}

#[test]
fn hbm_to_sbuf_then_matmul_and_activation_and_back_to_hbm() {
    let dev = device();
    let a = Client::new(&dev, 10);
    let mut rig = Rig::new(&a, 0);
    let map = *dev.address_map();
    let (k, m, n) = (4usize, 3usize, 5usize);
    let mut rng = Rng(11);
    let stat = rng.ints(k * m, 3);
    let mov = rng.ints(k * n, 3);
    let bias = rng.ints(m, 4);
    let input = a.alloc(MemLocation::Hbm { nc: 0 }, 4 * KIB);
    let output = a.alloc(MemLocation::Hbm { nc: 0 }, 4 * KIB);
    input.write(0, &f32_bytes(&stat));
    input.write(256, &f32_bytes(&mov));
    input.write(512, &f32_bytes(&bias));
    // One descriptor per partition row: stationary at SBUF byte 0, moving at 256, the
    // per-partition biases at 2048.
    let mut inq = Queue::new(&a, 0, 1, 0, 32);
    for kk in 0..k {
        let p = u32::try_from(kk).unwrap();
        inq.push(
            input.pa + u64_of(kk * m * 4),
            map.sbuf_address(0, p, 0),
            u64_of(m * 4),
        );
        inq.push(
            input.pa + 256 + u64_of(kk * n * 4),
            map.sbuf_address(0, p, 256),
            u64_of(n * 4),
        );
    }
    for p in 0..m {
        let pu = u32::try_from(p).unwrap();
        inq.push(
            input.pa + 512 + u64_of(p * 4),
            map.sbuf_address(0, pu, 2048),
            4,
        );
    }
    // The bf16 result rows go back to HBM.
    let mut outq = Queue::new(&a, 0, 2, 0, 32);
    for p in 0..m {
        let pu = u32::try_from(p).unwrap();
        outq.push(
            map.sbuf_address(0, pu, 1024),
            output.pa + u64_of(p * n * 2),
            u64_of(n * 2),
        );
    }
    let (ku, mu, nu) = (
        u32::try_from(k).unwrap(),
        u32::try_from(m).unwrap(),
        u32::try_from(n).unwrap(),
    );
    let psum = Tile::psum(0, mu, 0, nu);
    let result = Tile::sbuf(0, mu, 1024, nu).with_dtype(Dt::Bf16);
    let descs_in = u32::try_from(2 * k + m).unwrap();
    let sp = rig.program(
        1,
        &[
            Instruction::new(Opcode::DmaStart, &[1, 0, descs_in]),
            Instruction::new(Opcode::DmaWait, &[1, 0]).signal(1, 1),
            Instruction::new(Opcode::DmaStart, &[2, 0, mu]).wait(3, 1),
            Instruction::new(Opcode::DmaWait, &[2, 0]).signal(3, u32::MAX),
            end(),
        ],
    );
    let pe = rig.program(
        2,
        &[
            Instruction::with_tiles(
                Opcode::Matmul,
                &[psum, Tile::sbuf(0, ku, 0, mu), Tile::sbuf(0, ku, 256, nu)],
                &[],
            )
            .wait(1, 1)
            .signal(2, 1),
            Instruction::new(Opcode::Nop, &[]).signal(1, u32::MAX),
            end(),
        ],
    );
    let act = rig.program(
        3,
        &[
            Instruction::with_tiles(
                Opcode::Activation,
                &[result, psum],
                &[ActFunc::Relu as u32, 1.0f32.to_bits(), 2, 2048],
            )
            .wait(2, 1)
            .signal(3, 1),
            Instruction::new(Opcode::Nop, &[]).signal(2, u32::MAX),
            end(),
        ],
    );
    let addrs = programs(
        &rig,
        &[(Engine::Sp, sp), (Engine::Pe, pe), (Engine::Act, act)],
    );
    rig.stage(addrs, 1, 1, &[]);
    assert_eq!(summary(&rig.run()), execution(0, 0));
    let want: Vec<f32> = (0..m)
        .flat_map(|p| (0..n).map(move |j| (p, j)))
        .map(|(p, j)| {
            let dot: f32 = (0..k).map(|kk| stat[kk * m + p] * mov[kk * n + j]).sum();
            (dot + bias[p]).max(0.0)
        })
        .collect();
    assert_eq!(bf16s(&output.read(0, m * n * 2)), want);

    // SBUF keeps its contents between executions: DMA the result out again, alone.
    output.write(0, &vec![0u8; m * n * 2]);
    for p in 0..m {
        let pu = u32::try_from(p).unwrap();
        outq.push(
            map.sbuf_address(0, pu, 1024),
            output.pa + u64_of(p * n * 2),
            u64_of(n * 2),
        );
    }
    let sp_out = rig.program(4, &sp_io_program(2, 0, mu));
    rig.stage(rig.ends_but_sp(Some(sp_out)), 0, 0, &[]);
    assert_eq!(summary(&rig.run()), execution(1, 0));
    assert_eq!(bf16s(&output.read(0, m * n * 2)), want);
    let c = a.counters(0);
    assert_eq!((c.executions, c.exec_errors, c.dma_aborts), (2, 0, 0));
}

#[test]
fn activation_tables_are_loaded_by_a_request_and_forgotten_by_exec_init_and_reset() {
    let dev = device();
    let a = Client::new(&dev, 10);
    let generic = error_flags::GENERIC;
    let t = Tile::sbuf(0, 2, 0, 4);
    let identity = Instruction::with_tiles(
        Opcode::Activation,
        &[t, t],
        &[ActFunc::Identity as u32, 1.0f32.to_bits(), 0, 0],
    );
    {
        let mut rig = Rig::new(&a, 0);
        let act = rig.program(1, &[identity, end()]);
        let addrs = programs(&rig, &[(Engine::Act, act)]);
        let mut flags = Vec::new();
        for tables in [0, 1, 0] {
            rig.stage(addrs, 0, tables, &[]);
            flags.push(rig.run().error_flags);
        }
        assert_eq!(flags, [generic, 0, 0], "loaded once, the tables stay");
        assert_eq!(a.counters(0).table_loads, 1);
        // A new DMA_QUEUE_INIT of the exec queue forgets them.
        rig.reinit_exec();
        rig.stage(addrs, 0, 0, &[]);
        assert_eq!(rig.run().error_flags, generic);
        rig.stage(addrs, 0, 1, &[]);
        assert_eq!(rig.run().error_flags, 0);
        // Another queue's init does not.
        let _other = Queue::new(&a, 0, 3, 1, 32);
        rig.stage(addrs, 0, 0, &[]);
        assert_eq!(rig.run().error_flags, 0);
    }
    // An NC reset forgets them.
    a.ok(Request::NcReset { nc: 0 });
    assert!(!lock(&dev.core.ncs[0].compute).tables_loaded());
    let mut rig = Rig::new(&a, 0);
    let act = rig.program(1, &[identity, end()]);
    rig.stage(programs(&rig, &[(Engine::Act, act)]), 0, 0, &[]);
    assert_eq!(rig.run().error_flags, generic);
}

#[test]
fn a_nan_marks_the_execution_numerical_and_the_results_are_delivered() {
    let dev = device();
    let a = Client::new(&dev, 10);
    let mut rig = Rig::new(&a, 0);
    let map = *dev.address_map();
    let output = a.alloc(MemLocation::Hbm { nc: 0 }, 4 * KIB);
    let mut outq = Queue::new(&a, 0, 2, 0, 32);
    outq.push(map.sbuf_address(0, 0, 64), output.pa, 16);
    let x = Tile::sbuf(0, 1, 0, 4);
    let q = Tile::sbuf(0, 1, 64, 4);
    // POOL: x = 0, 1, 2, 3; DVE: q = x / x; SP: q out to HBM.
    let pool = rig.program(
        1,
        &[
            Instruction::with_tiles(Opcode::Iota, &[x], &[0, 0, 1]).signal(1, 1),
            end(),
        ],
    );
    let dve = rig.program(
        2,
        &[
            Instruction::with_tiles(Opcode::TensorTensor, &[q, x, x], &[AluOp::Divide as u32])
                .wait(1, 1)
                .signal(2, 1),
            Instruction::new(Opcode::Nop, &[]).signal(1, u32::MAX),
            end(),
        ],
    );
    let sp = rig.program(
        3,
        &[
            Instruction::new(Opcode::DmaStart, &[2, 0, 1]).wait(2, 1),
            Instruction::new(Opcode::DmaWait, &[2, 0]).signal(2, u32::MAX),
            end(),
        ],
    );
    let addrs = programs(
        &rig,
        &[(Engine::Pool, pool), (Engine::Dve, dve), (Engine::Sp, sp)],
    );
    rig.stage(addrs, 0, 0, &[]);
    assert_eq!(summary(&rig.run()), execution(0, error_flags::NUMERICAL));
    let got = f32s(&output.read(0, 16));
    assert!(got[0].is_nan(), "0/0: {got:?}");
    assert_eq!(&got[1..], [1.0, 1.0, 1.0], "the results were delivered");
    assert_eq!(a.counters(0).exec_errors, 1);
    // The next execution is clean.
    rig.stage(rig.ends_but_sp(None), 0, 0, &[]);
    assert_eq!(summary(&rig.run()), execution(1, 0));
}

#[test]
fn bad_compute_instructions_end_with_generic_and_the_nc_keeps_working() {
    let dev = device();
    let a = Client::new(&dev, 10);
    let mut rig = Rig::new(&a, 0);
    let t = Tile::sbuf(0, 4, 0, 8);
    let mut undefined_space = Instruction::with_tiles(Opcode::Copy, &[t, t], &[]);
    undefined_space.args[0] |= 3;
    let cases = [
        (
            Engine::Pool,
            Instruction::with_tiles(Opcode::Copy, &[t, Tile::sbuf(126, 4, 0, 8)], &[]),
        ),
        (
            Engine::Pool,
            Instruction::with_tiles(Opcode::Copy, &[t, Tile::sbuf(0, 4, 65535, 8)], &[]),
        ),
        (
            Engine::Act,
            Instruction::with_tiles(Opcode::Matmul, &[Tile::psum(0, 8, 0, 8), t, t], &[]),
        ),
        (
            Engine::Sp,
            Instruction::with_tiles(Opcode::Copy, &[t, t], &[]),
        ),
        (
            Engine::Dve,
            Instruction::with_tiles(
                Opcode::TensorTensor,
                &[t, t, Tile::sbuf(0, 4, 0, 9)],
                &[AluOp::Add as u32],
            ),
        ),
        (
            Engine::Pe,
            Instruction::with_tiles(Opcode::Matmul, &[t, t, t], &[]),
        ),
        (Engine::Dve, undefined_space),
    ];
    let mut idx = 0;
    for (engine, inst) in cases {
        let program = rig.program(1, &[inst, end()]);
        rig.stage(programs(&rig, &[(engine, program)]), 0, 0, &[]);
        assert_eq!(
            summary(&rig.run()),
            execution(idx, error_flags::GENERIC),
            "{engine:?} {inst:?}"
        );
        idx += 1;
    }
    // The NC computes normally afterwards.
    let pool = rig.program(
        1,
        &[
            Instruction::with_tiles(Opcode::Iota, &[t], &[5, 10, 1]),
            end(),
        ],
    );
    rig.stage(programs(&rig, &[(Engine::Pool, pool)]), 0, 0, &[]);
    assert_eq!(summary(&rig.run()), execution(idx, 0));
    assert_eq!(f32s(&sbuf(&dev, 0, 3, 0, 8)), [35.0, 36.0]);
}

#[test]
fn the_sbuf_window_takes_dma_of_owned_ncs_only_and_is_zeroed_by_reset_and_release() {
    let dev = device();
    let a = Client::new(&dev, 10);
    let b = Client::new(&dev, 11);
    a.claim(0);
    b.claim(1);
    let nq = a.nq(0, 8);
    let map = *dev.address_map();
    let src = a.alloc(MemLocation::Hbm { nc: 0 }, 64 * KIB);
    let dst = a.alloc(MemLocation::Host, 64 * KIB);
    src.write(0, &pattern(65536));
    let mut q = Queue::new(&a, 0, 2, 2, 32);
    // A whole partition in and out, a short range in and out, SBUF to SBUF.
    q.push(src.pa, map.sbuf_address(0, 127, 0), 65536);
    q.push(src.pa + 7, map.sbuf_address(0, 5, 100), 1000);
    q.push(map.sbuf_address(0, 5, 100), map.sbuf_address(0, 6, 3), 1000);
    q.start(&a, 3);
    q.push(map.sbuf_address(0, 127, 0), dst.pa, 65536);
    q.start(&a, 1);
    assert_eq!(dst.read(0, 65536), pattern(65536));
    q.push(map.sbuf_address(0, 6, 3), dst.pa, 1000);
    q.start(&a, 1);
    assert_eq!(dst.read(0, 1000), pattern(1007)[7..]);
    // An SBUF word as the source of a register write.
    lock(&dev.core.ncs[0].compute).write_sbuf(9, 0, &7u32.to_le_bytes());
    q.push(
        map.sbuf_address(0, 9, 0),
        register(&dev, Register::Event { nc: 0, index: 3 }),
        4,
    );
    q.start(&a, 1);
    assert_eq!(
        a.call(Request::EventGet { nc: 0, index: 3 }),
        Reply::Value(7)
    );
    assert!(entries(&nq, 8).is_empty(), "no abort so far");

    // Crossing a partition's end, another client's NC (as destination and as source), and an
    // NC past the device's count: each an OOB abort.
    let bad = [
        (src.pa, map.sbuf_address(0, 3, 65535), 2),
        (src.pa, map.sbuf_address(0, 127, 1), 65536),
        (src.pa, map.sbuf_address(1, 0, 0), 4),
        (map.sbuf_address(1, 0, 0), dst.pa, 4),
        (map.sbuf_address(0, 3, 65535), dst.pa, 2),
        (src.pa, map.sbuf_address(2, 0, 0), 4),
        // A good SBUF range with a memory side that leaves its chunk: into SBUF from past
        // the source chunk's end, out of SBUF past the destination chunk's end (the direct
        // copies between a chunk and a partition are refused before they copy anything).
        (src.pa + 64 * KIB - 2, map.sbuf_address(0, 3, 0), 4),
        (map.sbuf_address(0, 3, 0), dst.pa + 64 * KIB - 2, 4),
    ];
    for (n, &(from, to, len)) in (3u32..).zip(&bad) {
        let mut q = Queue::new(&a, 0, 3, n, 32);
        q.push(from, to, len);
        q.start(&a, 1);
    }
    let flags: Vec<u32> = entries(&nq, 8).iter().map(|e| e.error_flags).collect();
    assert_eq!(flags, [error_flags::DMA_ABORT | error_flags::OOB; 8]);
    assert_eq!(sbuf(&dev, 0, 3, 0, 4), [0; 4], "nothing copied into SBUF");
    assert_eq!(
        dst.read(64 * KIB - 2, 2),
        pattern(65536)[65534..],
        "nothing copied out of SBUF (the whole-partition copy's bytes are still there)"
    );
    assert_eq!(sbuf(&dev, 1, 0, 0, 4), [0; 4], "NC 1's SBUF untouched");
    assert_eq!(
        sbuf(&dev, 0, 3, 65534, 2),
        [0; 2],
        "nothing of a refused pair"
    );

    // NC reset zeroes SBUF and PSUM; so do release and reclaim.
    {
        let mut compute = lock(&dev.core.ncs[0].compute);
        compute.write_sbuf(0, 0, &[1; 8]);
        compute.set_tables_loaded(true);
    }
    a.ok(Request::NcReset { nc: 0 });
    assert_eq!(sbuf(&dev, 0, 127, 0, 16), [0; 16]);
    assert_eq!(sbuf(&dev, 0, 0, 0, 8), [0; 8]);
    lock(&dev.core.ncs[0].compute).write_sbuf(0, 0, &[1; 8]);
    a.ok(Request::ReleaseNc { nc: 0 });
    assert_eq!(sbuf(&dev, 0, 0, 0, 8), [0; 8], "released");
    lock(&dev.core.ncs[1].compute).write_sbuf(0, 0, &[1; 8]);
    dev.disconnect(b.id);
    assert_eq!(sbuf(&dev, 1, 0, 0, 8), [0; 8], "reclaimed");
}

/// Consumes every posted notification (the ring holds only [`NQ_ENTRIES`]).
fn consume(rig: &Rig<'_, '_>) {
    let tail = rig
        .nq
        .view
        .load_u32(rig.nq.pa + NQ_TAIL_OFFSET as u64, Ordering::Acquire)
        .unwrap();
    rig.nq
        .view
        .store_u32(rig.nq.pa + NQ_HEAD_OFFSET as u64, tail, Ordering::Release)
        .unwrap();
}

/// Panics on sequencer threads (caught there and reported as GENERIC, so a test would not
/// see them otherwise).
static SEQUENCER_PANICS: AtomicUsize = AtomicUsize::new(0);

fn count_sequencer_panics() {
    static HOOK: Once = Once::new();
    HOOK.call_once(|| {
        let previous = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            if std::thread::current()
                .name()
                .is_some_and(|n| n.starts_with("simdev-seq-"))
            {
                SEQUENCER_PANICS.fetch_add(1, Ordering::SeqCst);
            }
            previous(info);
        }));
    });
}

#[test]
fn random_instruction_blocks_always_end_in_a_notification() {
    count_sequencer_panics();
    let panics_before = SEQUENCER_PANICS.load(Ordering::SeqCst);
    let dev = device();
    let a = Client::new(&dev, 10);
    let mut rig = Rig::new(&a, 0);
    // WaitEvent never parks: every event is set.
    for index in 0..dev.info().events_per_nc {
        a.ok(Request::EventSet {
            nc: 0,
            index,
            value: 1,
        });
    }
    let mut rng = Rng(0x5EED);
    let runs = 3000u32;
    let mut slowest = Duration::ZERO;
    let mut outcomes: BTreeMap<u32, u32> = BTreeMap::new();
    for run in 0..runs {
        let mut addrs = rig.ends_but_sp(None);
        for engine in Engine::ALL {
            // Half the engines run a random block, the others just end.
            if rng.below(2) == 0 {
                continue;
            }
            let len = 1 + rng.below(6);
            let mut block: Vec<Instruction> = (0..len)
                .map(|_| {
                    if rng.below(4) == 0 {
                        random_instruction(&mut rng)
                    } else {
                        wild_instruction_on(&mut rng, engine)
                    }
                })
                .collect();
            block.push(end());
            addrs[engine.index()] = rig.program(1 + u64_of(engine.index()), &block);
        }
        let tables = u32::try_from(rng.below(2)).unwrap();
        rig.stage(addrs, 0, tables, &[]);
        let started = Instant::now();
        let entry = rig.run();
        slowest = slowest.max(started.elapsed());
        assert_eq!(
            (entry.kind, entry.compute_idx),
            (NotificationKind::Execution as u16, run)
        );
        *outcomes.entry(entry.error_flags).or_default() += 1;
        consume(&rig);
    }
    assert!(
        slowest < Duration::from_secs(5),
        "slowest execution {slowest:?}"
    );
    assert_eq!(
        SEQUENCER_PANICS.load(Ordering::SeqCst),
        panics_before,
        "no execution panicked"
    );
    assert!(outcomes.get(&0).copied().unwrap_or(0) > 20, "{outcomes:?}");
    assert!(
        outcomes.keys().any(|f| f & error_flags::NUMERICAL != 0),
        "{outcomes:?}"
    );
    assert!(
        outcomes.get(&error_flags::GENERIC).copied().unwrap_or(0) > 100,
        "{outcomes:?}"
    );
    // simdev keeps serving: the NC computes, and another client claims the other NC.
    let t = Tile::sbuf(0, 1, 0, 2);
    let pool = rig.program(
        1,
        &[
            Instruction::with_tiles(Opcode::Iota, &[t], &[40, 0, 2]),
            end(),
        ],
    );
    rig.stage(programs(&rig, &[(Engine::Pool, pool)]), 0, 0, &[]);
    assert_eq!(summary(&rig.run()), execution(runs, 0));
    assert_eq!(f32s(&sbuf(&dev, 0, 0, 0, 8)), [40.0, 42.0]);
    assert_eq!(a.counters(0).executions, u64::from(runs) + 1);
    let b = Client::new(&dev, 11);
    let mut other = Rig::new(&b, 1);
    other.stage(other.ends_but_sp(None), 0, 0, &[]);
    assert_eq!(summary(&other.run()), execution(0, 0));
}
