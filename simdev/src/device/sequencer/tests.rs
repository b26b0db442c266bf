//! Execution tests: batches staged by hand exactly as the runtime stages them (the request in
//! a client chunk, pairs 1–3 and the chain written into the exec queue's rings with
//! [`m2m_copy_descriptors`] and the current ring ids), programs in client memory, the doorbell
//! as a posted SemaphoreIncrement of INFERENCE_START, and a bounded wait for the notification.

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use shared::Engine;
use shared::address_map::Register;
use shared::exec_request::{CC_DMA_INCREMENT_OFFSET, DEVICE_EXEC_REQUEST_SIZE, DeviceExecRequest};
use shared::isa::{Instruction, Opcode, encode_program, end_program};
use shared::notification::{
    NQ_HEAD_OFFSET, NQ_TAIL_OFFSET, NotificationEntry, NotificationKind, error_flags,
};
use shared::protocol::{ErrorKind, MemLocation, Reply, Request};
use shared::sequencer::{
    EVENT_COLLECTIVES_CTX_LOAD, EVENT_HW_EXEC_QUEUE_REQUEST_LOAD, EXEC_QUEUE, EXEC_QUEUE_ENGINE,
    SEM_INFERENCE_START, SEMAPHORE_LEAK_SOURCE,
};
use shared::udma::RingId;

use crate::config::Config;
use crate::device::test_utils::*;
use crate::device::*;
use crate::dma;

const NQ_ENTRIES: u32 = 64;
const EXEC_DESCS: u32 = 64;
/// Where the request buffer keeps the event-poke word (1).
const ONE_AT: u64 = 0x100;
/// Where the request buffer keeps the word `m` (the tail increment of a batch with `m` chain
/// pairs).
const fn m_at(m: u32) -> u64 {
    0x200 + 4 * m as u64
}
/// Bytes between two programs in the code chunk.
const PROGRAM_SLOT: u64 = 0x1000;

/// One NC set up as the runtime sets it up: claimed, a notification queue, the exec queue,
/// a request buffer and a chunk for instruction blocks.
struct Rig<'c, 'd> {
    c: &'c Client<'d>,
    nc: u32,
    nq: Buf,
    exec: Queue,
    req: Buf,
    code: Buf,
}

impl<'c, 'd> Rig<'c, 'd> {
    fn new(c: &'c Client<'d>, nc: u32) -> Self {
        c.claim(nc);
        let nq = c.nq(nc, NQ_ENTRIES);
        let exec = Queue::new(c, nc, EXEC_QUEUE_ENGINE, EXEC_QUEUE, EXEC_DESCS);
        let req = c.alloc(MemLocation::Host, 4 * KIB);
        req.write(ONE_AT, &1u32.to_le_bytes());
        let code = c.alloc(MemLocation::Hbm { nc }, MIB);
        code.write(0, &end_program());
        Self {
            c,
            nc,
            nq,
            exec,
            req,
            code,
        }
    }

    fn dev(&self) -> &Device {
        self.c.dev
    }

    /// Writes `program` into slot `slot` of the code chunk; its address.
    fn program(&self, slot: u64, program: &[Instruction]) -> u64 {
        let at = slot * PROGRAM_SLOT;
        self.code.write(at, &encode_program(program));
        self.code.pa + at
    }

    /// Addresses of five `End` programs, with `sp` for SP when given.
    fn ends_but_sp(&self, sp: Option<u64>) -> [u64; 5] {
        let mut addrs = [self.code.pa; 5];
        if let Some(sp) = sp {
            addrs[Engine::Sp.index()] = sp;
        }
        addrs
    }

    /// Builds the request (a model switch: the device accepts any programs then) and writes it
    /// into the request buffer; [`Rig::tail_pairs`] writes the trailer.
    fn write_request(&self, addrs: [u64; 5], reload: u32, tables: u32) {
        let mut request = DeviceExecRequest {
            do_model_switch: 1,
            reload_seq_config: reload,
            load_act_dve_tables: tables,
            ..DeviceExecRequest::default()
        };
        for engine in Engine::ALL {
            request.set_engine_address(engine, addrs[engine.index()]);
        }
        self.req.write(0, zerocopy::IntoBytes::as_bytes(&request));
    }

    fn request_pair(&mut self) {
        let dmem = self.dev().address_map().dmem_address(self.nc, 0);
        self.exec
            .push(self.req.pa, dmem, DEVICE_EXEC_REQUEST_SIZE as u64);
    }

    fn event_pair(&mut self) {
        let event = register(
            self.dev(),
            Register::Event {
                nc: self.nc,
                index: EVENT_HW_EXEC_QUEUE_REQUEST_LOAD,
            },
        );
        self.exec.push(self.req.pa + ONE_AT, event, 4);
    }

    fn tail_pairs(&mut self, rx_m: u32, tx_m: u32) {
        let (tx, rx) = self.exec.tail_registers();
        for m in [rx_m, tx_m] {
            self.req.write(m_at(m), &m.to_le_bytes());
        }
        // The cc_dma_increment trailer says what the RX increment posts.
        self.req
            .write(CC_DMA_INCREMENT_OFFSET as u64, &rx_m.to_le_bytes());
        let (rx, tx) = (register(self.dev(), rx), register(self.dev(), tx));
        self.exec.push(self.req.pa + m_at(rx_m), rx, 4);
        self.exec.push(self.req.pa + m_at(tx_m), tx, 4);
    }

    /// Stages one whole batch: the request and pairs 1–3, then `chain` (src, dst, len).
    fn stage(&mut self, addrs: [u64; 5], reload: u32, tables: u32, chain: &[(u64, u64, u64)]) {
        self.write_request(addrs, reload, tables);
        self.request_pair();
        self.event_pair();
        let m = u32::try_from(chain.len()).unwrap();
        self.tail_pairs(m, m);
        for &(src, dst, len) in chain {
            self.exec.push(src, dst, len);
        }
    }

    fn doorbell(&self) {
        let (reply, _) = self.dev().handle(
            self.c.id,
            Request::SemaphoreIncrement {
                nc: self.nc,
                index: SEM_INFERENCE_START,
                value: 1,
            },
        );
        assert_eq!(reply, Reply::Ok, "the doorbell is accepted at once");
    }

    fn posted(&self) -> Vec<NotificationEntry> {
        entries(&self.nq, NQ_ENTRIES)
    }

    /// Waits (at most 10 s) until `n` notifications were posted; returns them all.
    fn wait(&self, n: usize) -> Vec<NotificationEntry> {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let posted = self.posted();
            if posted.len() >= n {
                return posted;
            }
            assert!(
                Instant::now() < deadline,
                "NC {}: {} of {n} notifications after 10 s: {posted:?}",
                self.nc,
                posted.len()
            );
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    /// Runs one staged execution: doorbell, wait; the new notification.
    fn run(&self) -> NotificationEntry {
        let before = self.posted().len();
        self.doorbell();
        self.wait(before + 1)[before]
    }

    fn exec_status(&self) -> Option<dma::QueueStatus> {
        lock(&self.dev().core.ncs[usize::try_from(self.nc).unwrap()].state)
            .queues
            .status(EXEC_QUEUE_ENGINE, EXEC_QUEUE)
            .cloned()
    }

    fn reinit_exec(&mut self) {
        self.exec = Queue::new(self.c, self.nc, EXEC_QUEUE_ENGINE, EXEC_QUEUE, EXEC_DESCS);
    }

    /// Asserts that nothing more is posted for a while (an execution parked or abandoned).
    fn quiet(&self, expected: usize) {
        std::thread::sleep(Duration::from_millis(100));
        assert_eq!(self.posted().len(), expected, "{:?}", self.posted());
    }
}

fn execution(compute_idx: u32, flags: u32) -> (u16, u32, u32) {
    (NotificationKind::Execution as u16, compute_idx, flags)
}

fn summary(entry: &NotificationEntry) -> (u16, u32, u32) {
    (entry.kind, entry.compute_idx, entry.error_flags)
}

fn sp_io_program(engine: u32, queue: u32, count: u32) -> Vec<Instruction> {
    vec![
        Instruction::new(Opcode::DmaStart, &[engine, queue, count]),
        Instruction::new(Opcode::DmaWait, &[engine, queue]),
        Instruction::new(Opcode::End, &[]),
    ]
}

#[test]
fn executions_run_the_batch_and_the_programs_and_count_compute_indices() {
    let dev = device();
    let a = Client::new(&dev, 10);
    let mut rig = Rig::new(&a, 0);
    let fds = a.claim(0);
    let input = a.alloc(MemLocation::Hbm { nc: 0 }, 4 * KIB);
    let output = a.alloc(MemLocation::Hbm { nc: 0 }, 4 * KIB);
    let data = pattern(200);
    input.write(0, &data);
    let mut io = Queue::new(&a, 0, 1, 0, 32);
    // SP moves the input through the I/O ring, then signals PE, which waits for it.
    let sp = rig.program(
        1,
        &[
            Instruction::new(Opcode::DmaStart, &[1, 0, 2]),
            Instruction::new(Opcode::DmaWait, &[1, 0]).signal(7, 1),
            Instruction::new(Opcode::End, &[]),
        ],
    );
    let pe = rig.program(
        2,
        &[Instruction::new(Opcode::End, &[])
            .wait(7, 1)
            .signal(7, u32::MAX)],
    );
    let mut addrs = rig.ends_but_sp(Some(sp));
    addrs[Engine::Pe.index()] = pe;
    let flags = [(1, 1), (0, 0), (0, 1)];
    for (n, (reload, tables)) in (0u32..).zip(flags) {
        let offset = u64::from(n) * 0x400;
        io.push(input.pa, output.pa + offset, 100);
        io.push(input.pa + 100, output.pa + offset + 100, 100);
        a.ok(Request::SemaphoreWrite {
            nc: 0,
            index: 7,
            value: 0,
        });
        rig.stage(addrs, reload, tables, &[]);
        let entry = rig.run();
        assert_eq!(summary(&entry), execution(n, 0), "{entry:?}");
        assert!(entry.device_ts_ns > 0);
        assert_eq!(
            output.read(offset, 200),
            data,
            "execution {n} copied its input"
        );
    }
    let c = a.counters(0);
    assert_eq!(
        (c.executions, c.exec_errors, c.config_reloads, c.table_loads),
        (3, 0, 1, 2)
    );
    assert_eq!(c.cc_chains, 0);
    assert_eq!(c.doorbells, 3);
    assert_eq!(a.semaphore(0, SEM_INFERENCE_START), 0, "every count taken");
    assert_eq!(
        a.call(Request::EventGet {
            nc: 0,
            index: EVENT_HW_EXEC_QUEUE_REQUEST_LOAD
        }),
        Reply::Value(1),
        "pair 2 poked the request-load event"
    );
    let dmem = lock(&dev.core.ncs[0].dmem)[..DEVICE_EXEC_REQUEST_SIZE].to_vec();
    assert_eq!(
        DeviceExecRequest::decode(&dmem)
            .unwrap()
            .load_act_dve_tables,
        1
    );
    let mut count = [0u8; 8];
    nix::unistd::read(&fds[1], &mut count).unwrap();
    assert!(u64::from_ne_bytes(count) >= 1, "the eventfd was signalled");

    // A new DMA_QUEUE_INIT of the exec queue restarts the count.
    rig.reinit_exec();
    rig.stage(rig.ends_but_sp(None), 0, 0, &[]);
    assert_eq!(summary(&rig.run()), execution(0, 0));
    // Several counts at once run in order.
    for _ in 0..3 {
        rig.stage(rig.ends_but_sp(None), 0, 0, &[]);
    }
    a.ok(Request::SemaphoreWrite {
        nc: 0,
        index: SEM_INFERENCE_START,
        value: 3,
    });
    let posted = rig.wait(7);
    let idx: Vec<u32> = posted[4..].iter().map(|e| e.compute_idx).collect();
    assert_eq!(idx, [1, 2, 3]);
}

#[test]
fn an_m2_chain_runs_and_counts_a_cc_chain() {
    let dev = device();
    let a = Client::new(&dev, 10);
    let mut rig = Rig::new(&a, 0);
    let buf = a.alloc(MemLocation::Host, 4 * KIB);
    buf.write(0, b"collectives context");
    buf.write(64, &1u32.to_le_bytes());
    let cc_event = register(
        &dev,
        Register::Event {
            nc: 0,
            index: EVENT_COLLECTIVES_CTX_LOAD,
        },
    );
    rig.stage(
        rig.ends_but_sp(None),
        1,
        1,
        &[(buf.pa, buf.pa + 1024, 19), (buf.pa + 64, cc_event, 4)],
    );
    assert_eq!(summary(&rig.run()), execution(0, 0));
    assert_eq!(buf.read(1024, 19), b"collectives context");
    assert_eq!(
        a.call(Request::EventGet {
            nc: 0,
            index: EVENT_COLLECTIVES_CTX_LOAD
        }),
        Reply::Value(1)
    );
    assert_eq!(a.counters(0).cc_chains, 1);
    assert_eq!(a.counters(0).dma_descriptors, 4 + 2);

    // A chain whose last pair is not the collectives poke is no cc chain; the next batch
    // follows it in the ring.
    rig.stage(rig.ends_but_sp(None), 0, 0, &[(buf.pa, buf.pa + 2048, 19)]);
    assert_eq!(summary(&rig.run()), execution(1, 0));
    assert_eq!(buf.read(2048, 19), b"collectives context");
    rig.stage(rig.ends_but_sp(None), 0, 0, &[]);
    assert_eq!(summary(&rig.run()), execution(2, 0));
    assert_eq!(a.counters(0).cc_chains, 1);
}

#[test]
fn the_exec_ring_wraps_with_its_ring_ids() {
    let dev = device();
    let a = Client::new(&dev, 10);
    let mut rig = Rig::new(&a, 1);
    // 4 pairs per batch in a 64-descriptor ring: 40 batches make two and a half passes.
    for n in 0..40 {
        rig.stage(rig.ends_but_sp(None), 0, 0, &[]);
        assert_eq!(summary(&rig.run()), execution(n, 0));
    }
    assert_eq!(rig.exec.ring_id, RingId::INITIAL.next().next());
}

#[test]
fn malformed_batches_end_with_generic_and_stop_the_exec_queue() {
    let dev = device();
    let a = Client::new(&dev, 10);
    let mut rig = Rig::new(&a, 0);
    let generic = error_flags::GENERIC;

    // Nothing staged: the head pair carries a stale ring id, a DMA abort.
    assert_eq!(summary(&rig.run()), execution(0, generic));
    assert!(
        matches!(rig.exec_status(), Some(dma::QueueStatus::Stopped(r)) if r.contains("ring id"))
    );
    assert_eq!(a.counters(0).dma_aborts, 1);
    assert_eq!(
        rig.posted().len(),
        1,
        "no separate DmaQueueError notification"
    );

    // Pair 2 missing.
    rig.reinit_exec();
    rig.write_request(rig.ends_but_sp(None), 0, 0);
    rig.request_pair();
    rig.tail_pairs(0, 0);
    assert_eq!(summary(&rig.run()), execution(0, generic));
    let status = rig.exec_status();
    assert!(
        matches!(&status, Some(dma::QueueStatus::Stopped(r)) if r.contains("malformed exec batch") && r.contains("pair 2")),
        "{status:?}"
    );
    assert_eq!(
        a.counters(0).dma_aborts,
        1,
        "a shape error is not a DMA abort"
    );
    // Until a new DMA_QUEUE_INIT every count fails at once.
    assert_eq!(summary(&rig.run()), execution(1, generic));

    // RX and TX increments that differ.
    rig.reinit_exec();
    rig.write_request(rig.ends_but_sp(None), 0, 0);
    rig.request_pair();
    rig.event_pair();
    rig.tail_pairs(1, 2);
    assert_eq!(summary(&rig.run()), execution(0, generic));

    // Pairs in the wrong order.
    rig.reinit_exec();
    rig.write_request(rig.ends_but_sp(None), 0, 0);
    rig.event_pair();
    rig.request_pair();
    rig.tail_pairs(0, 0);
    assert_eq!(summary(&rig.run()), execution(0, generic));

    // The request copied to the wrong place (another offset of the DMEM).
    rig.reinit_exec();
    let dmem = dev.address_map().dmem_address(0, 64);
    rig.exec.push(rig.req.pa, dmem, 52);
    rig.event_pair();
    rig.tail_pairs(0, 0);
    assert_eq!(summary(&rig.run()), execution(0, generic));

    // A chain that aborts (its source is a raw offset, not client memory).
    rig.reinit_exec();
    rig.stage(
        rig.ends_but_sp(None),
        0,
        0,
        &[(0x1000, rig.req.pa + 0x800, 4)],
    );
    assert_eq!(summary(&rig.run()), execution(0, generic));

    // Descriptors posted on the exec queue by the client are not a batch.
    rig.reinit_exec();
    rig.stage(rig.ends_but_sp(None), 0, 0, &[]);
    a.ok(Request::DmaQueueCopyStart {
        nc: 0,
        engine: EXEC_QUEUE_ENGINE,
        queue: EXEC_QUEUE,
        tx_desc_count: 0,
        rx_desc_count: 1,
    });
    assert_eq!(summary(&rig.run()), execution(0, generic));

    // No exec queue at all.
    a.ok(Request::DmaQueueRelease {
        nc: 0,
        engine: EXEC_QUEUE_ENGINE,
        queue: EXEC_QUEUE,
    });
    assert_eq!(summary(&rig.run()), execution(1, generic));

    // A well-formed batch after a new init runs.
    rig.reinit_exec();
    rig.stage(rig.ends_but_sp(None), 0, 0, &[]);
    assert_eq!(summary(&rig.run()), execution(0, 0));
    let c = a.counters(0);
    assert_eq!((c.executions, c.exec_errors), (10, 9));
}

#[test]
fn a_bad_opcode_ends_with_generic_and_the_next_execution_runs() {
    let dev = device();
    let a = Client::new(&dev, 10);
    let mut rig = Rig::new(&a, 0);
    let bad = rig.program(
        1,
        &[Instruction {
            opcode: 0xEE,
            ..Instruction::new(Opcode::Nop, &[])
        }],
    );
    let mut addrs = rig.ends_but_sp(None);
    addrs[Engine::Pool.index()] = bad;
    rig.stage(addrs, 1, 1, &[]);
    assert_eq!(summary(&rig.run()), execution(0, error_flags::GENERIC));
    assert_eq!(rig.exec_status(), Some(dma::QueueStatus::Running));
    // DMA control on another engine, and the exec queue as a DmaStart target.
    let wrong_engine = rig.program(2, &sp_io_program(1, 0, 1));
    addrs[Engine::Pool.index()] = wrong_engine;
    rig.stage(addrs, 0, 0, &[]);
    assert_eq!(summary(&rig.run()), execution(1, error_flags::GENERIC));
    let exec_start = rig.program(3, &sp_io_program(EXEC_QUEUE_ENGINE, EXEC_QUEUE, 1));
    rig.stage(rig.ends_but_sp(Some(exec_start)), 0, 0, &[]);
    assert_eq!(summary(&rig.run()), execution(2, error_flags::GENERIC));
    // The batch was consumed whole: the next execution needs no re-init.
    rig.stage(rig.ends_but_sp(None), 0, 0, &[]);
    assert_eq!(summary(&rig.run()), execution(3, 0));
    assert_eq!(a.counters(0).exec_errors, 3);
}

#[test]
fn an_instruction_fetch_outside_the_clients_memory_is_oob() {
    let dev = device();
    let a = Client::new(&dev, 10);
    let b = Client::new(&dev, 11);
    b.claim(1);
    let theirs = b.alloc(MemLocation::Host, 4 * KIB);
    theirs.write(0, &end_program());
    let mut rig = Rig::new(&a, 0);
    let oob = error_flags::OOB | error_flags::GENERIC;
    for address in [0x1000, theirs.pa, rig.code.pa + rig.code.size - 32] {
        rig.stage(rig.ends_but_sp(Some(address)), 0, 0, &[]);
        let entry = rig.run();
        assert_eq!(entry.error_flags, oob, "{address:#x}");
    }
}

/// The engines fetch through the NC's read cache, which travels with the sequencer role from
/// one execution to the next: steady-state executions search the address space zero times, and a code
/// chunk freed (and re-allocated at the same PA by another client) after the cache saw it is
/// not fetched from.
#[test]
fn steady_state_fetches_search_nothing_and_a_freed_code_chunk_is_oob() {
    let dev = device();
    let a = Client::new(&dev, 10);
    let b = Client::new(&dev, 11);
    let mut rig = Rig::new(&a, 0);
    let code = a.alloc(MemLocation::Host, 4 * KIB);
    code.write(0, &end_program());
    for n in 0..3 {
        rig.stage([code.pa; 5], 0, 0, &[]);
        assert_eq!(summary(&rig.run()), execution(n, 0));
    }
    let warm = read(&dev.core.memory).searches();
    for n in 3..23 {
        rig.stage([code.pa; 5], 0, 0, &[]);
        assert_eq!(summary(&rig.run()), execution(n, 0));
    }
    assert_eq!(
        read(&dev.core.memory).searches() - warm,
        0,
        "20 executions after warm-up fetched, read the trailer and ran the batch from caches"
    );

    a.ok(Request::MemFree {
        handle: code.handle,
    });
    let theirs = b.alloc(MemLocation::Host, 4 * KIB);
    assert_eq!(
        theirs.pa, code.pa,
        "first fit placed B's chunk at the freed PA"
    );
    theirs.write(0, &end_program());
    rig.stage([code.pa; 5], 0, 0, &[]);
    assert_eq!(
        summary(&rig.run()),
        execution(23, error_flags::OOB | error_flags::GENERIC),
        "A's engines do not fetch from B's chunk"
    );
}

#[test]
fn a_dma_abort_inside_the_program_ends_with_dma_abort() {
    let dev = device();
    let a = Client::new(&dev, 10);
    let mut rig = Rig::new(&a, 0);
    let buf = a.alloc(MemLocation::Host, 4 * KIB);
    let sp = rig.program(1, &sp_io_program(2, 3, 1));
    // A source outside the client's memory: DMA_ABORT | OOB.
    let mut io = Queue::new(&a, 0, 2, 3, 32);
    io.push(0x1000, buf.pa, 16);
    rig.stage(rig.ends_but_sp(Some(sp)), 0, 0, &[]);
    assert_eq!(
        summary(&rig.run()),
        execution(0, error_flags::DMA_ABORT | error_flags::OOB)
    );
    assert_eq!(rig.posted().len(), 1, "no DmaQueueError notification");
    assert_eq!(a.counters(0).dma_aborts, 1);
    // A stale ring id: DMA_ABORT alone.
    let mut io = Queue::new(&a, 0, 2, 3, 32);
    io.ring_id = RingId::INITIAL.next();
    io.push(buf.pa, buf.pa + 64, 16);
    rig.stage(rig.ends_but_sp(Some(sp)), 0, 0, &[]);
    assert_eq!(summary(&rig.run()), execution(1, error_flags::DMA_ABORT));
    // DmaWait on the queue the abort stopped (no DmaStart this time).
    let wait_only = rig.program(
        2,
        &[
            Instruction::new(Opcode::DmaWait, &[2, 3]),
            Instruction::new(Opcode::End, &[]),
        ],
    );
    rig.stage(rig.ends_but_sp(Some(wait_only)), 0, 0, &[]);
    assert_eq!(summary(&rig.run()), execution(2, error_flags::DMA_ABORT));
    // DmaStart on a queue nobody initialised is a program error.
    let unknown = rig.program(3, &sp_io_program(5, 5, 1));
    rig.stage(rig.ends_but_sp(Some(unknown)), 0, 0, &[]);
    assert_eq!(summary(&rig.run()), execution(3, error_flags::GENERIC));
}

#[test]
fn engines_waiting_on_each_other_deadlock_with_generic() {
    let dev = device();
    let a = Client::new(&dev, 10);
    let mut rig = Rig::new(&a, 0);
    // Each engine consumes what it waited for, so a run leaves the semaphores as it found them
    // (the contract in `shared::sequencer`, "What an execution leaves behind").
    let act = rig.program(
        1,
        &[
            Instruction::new(Opcode::Nop, &[])
                .wait(1, 1)
                .signal(1, u32::MAX),
            Instruction::new(Opcode::End, &[]).signal(2, 1),
        ],
    );
    let dve = rig.program(
        2,
        &[
            Instruction::new(Opcode::Nop, &[])
                .wait(2, 1)
                .signal(2, u32::MAX),
            Instruction::new(Opcode::End, &[]).signal(1, 1),
        ],
    );
    let mut addrs = rig.ends_but_sp(None);
    addrs[Engine::Act.index()] = act;
    addrs[Engine::Dve.index()] = dve;
    rig.stage(addrs, 0, 0, &[]);
    assert_eq!(summary(&rig.run()), execution(0, error_flags::GENERIC));
    // The host breaking the cycle first makes the same programs run.
    a.ok(Request::SemaphoreWrite {
        nc: 0,
        index: 1,
        value: 1,
    });
    rig.stage(addrs, 0, 0, &[]);
    assert_eq!(summary(&rig.run()), execution(1, 0));
    assert_eq!((a.semaphore(0, 1), a.semaphore(0, 2)), (1, 0));
}

/// Issue 11 item 2: an execution whose program leaves a program semaphore at another value
/// than it found carries the error (GENERIC, `source` naming the semaphore), the semaphore is
/// restored, and the next execution — of another program that waits on it — is unaffected.
#[test]
fn an_execution_that_leaves_a_semaphore_changed_carries_the_error_and_it_is_restored() {
    let dev = device();
    let a = Client::new(&dev, 10);
    let mut rig = Rig::new(&a, 0);
    let leaks = rig.program(1, &[Instruction::new(Opcode::End, &[]).signal(7, 1)]);
    rig.stage(rig.ends_but_sp(Some(leaks)), 1, 1, &[]);
    let e = rig.run();
    assert_eq!(summary(&e), execution(0, error_flags::GENERIC));
    assert_eq!(e.source, SEMAPHORE_LEAK_SOURCE | 7, "names semaphore 7");
    assert_eq!(a.semaphore(0, 7), 0, "restored");
    // Another model: ACT produces semaphore 7 late, DVE waits for it and consumes it. With 7
    // left at 1, DVE would run before ACT and the execution would leave 7 at 1.
    let act = rig.program(
        2,
        &[
            Instruction::new(Opcode::Nop, &[]),
            Instruction::new(Opcode::Nop, &[]),
            Instruction::new(Opcode::End, &[]).signal(7, 1),
        ],
    );
    let dve = rig.program(
        3,
        &[Instruction::new(Opcode::End, &[])
            .wait(7, 1)
            .signal(7, u32::MAX)],
    );
    let mut addrs = rig.ends_but_sp(None);
    addrs[Engine::Act.index()] = act;
    addrs[Engine::Dve.index()] = dve;
    for i in 1..4 {
        rig.stage(addrs, 1, 1, &[]);
        let e = rig.run();
        assert_eq!(summary(&e), execution(i, 0));
        assert_eq!(e.source, 0);
    }
    assert_eq!(a.semaphore(0, 7), 0);
    assert_eq!(rig.exec_status(), Some(dma::QueueStatus::Running));
    assert_eq!(a.counters(0).exec_errors, 1);
}

/// An SP program that waits for event 5 and ends.
fn wait_event_program(rig: &Rig<'_, '_>) -> [u64; 5] {
    let sp = rig.program(
        1,
        &[
            Instruction::new(Opcode::WaitEvent, &[5]),
            Instruction::new(Opcode::End, &[]),
        ],
    );
    rig.ends_but_sp(Some(sp))
}

#[test]
fn wait_event_parks_until_the_event_is_set() {
    let dev = device();
    let a = Client::new(&dev, 10);
    let mut rig = Rig::new(&a, 0);
    let addrs = wait_event_program(&rig);
    rig.stage(addrs, 0, 0, &[]);
    rig.stage(addrs, 0, 0, &[]);
    rig.doorbell();
    rig.doorbell();
    rig.quiet(0);
    // The connection is answered while the execution is parked; the second count waits.
    assert_eq!(a.semaphore(0, SEM_INFERENCE_START), 1);
    assert_eq!(a.counters(0).executions, 0);
    // An unrelated semaphore change wakes the scheduler, which parks again.
    a.ok(Request::SemaphoreWrite {
        nc: 0,
        index: 9,
        value: 1,
    });
    rig.quiet(0);
    a.ok(Request::EventSet {
        nc: 0,
        index: 5,
        value: 1,
    });
    let posted = rig.wait(2);
    assert_eq!(
        posted.iter().map(summary).collect::<Vec<_>>(),
        [execution(0, 0), execution(1, 0)]
    );
    assert!(
        posted[0].nc_ts_ns >= 100_000_000,
        "the parked execution took at least the 100 ms it waited: {}",
        posted[0].nc_ts_ns
    );
    assert_eq!(a.semaphore(0, SEM_INFERENCE_START), 0);
}

#[test]
fn a_dma_register_write_of_the_event_unparks_and_of_inference_start_starts() {
    let dev = device();
    let a = Client::new(&dev, 10);
    let mut rig = Rig::new(&a, 0);
    let addrs = wait_event_program(&rig);
    rig.stage(addrs, 0, 0, &[]);
    let one = rig.req.pa + ONE_AT;
    // The doorbell and, later, the event arrive by DMA on an ordinary queue.
    let mut q = Queue::new(&a, 0, 3, 3, 32);
    q.push(
        one,
        register(
            &dev,
            Register::SemaphoreIncrement {
                nc: 0,
                index: SEM_INFERENCE_START,
            },
        ),
        4,
    );
    q.start(&a, 1);
    rig.quiet(0);
    q.push(one, register(&dev, Register::Event { nc: 0, index: 5 }), 4);
    q.start(&a, 1);
    assert_eq!(summary(&rig.wait(1)[0]), execution(0, 0));
}

#[test]
fn nc_reset_release_and_reclaim_abandon_a_parked_execution() {
    let dev = device();
    let a = Client::new(&dev, 10);
    {
        let mut rig = Rig::new(&a, 0);
        let addrs = wait_event_program(&rig);
        rig.stage(addrs, 0, 0, &[]);
        rig.doorbell();
        rig.quiet(0);
        a.ok(Request::NcReset { nc: 0 });
        a.ok(Request::EventSet {
            nc: 0,
            index: 5,
            value: 1,
        });
        rig.quiet(0);
        assert_eq!(a.counters(0).executions, 0, "abandoned, not counted");
    }
    // The NC works afterwards (compute_idx restarts), the event set above being still there.
    {
        let mut rig = Rig::new(&a, 0);
        let addrs = wait_event_program(&rig);
        rig.stage(addrs, 0, 0, &[]);
        assert_eq!(summary(&rig.run()), execution(0, 0));
        // Park again, then release the NC.
        a.ok(Request::EventSet {
            nc: 0,
            index: 5,
            value: 0,
        });
        rig.stage(addrs, 0, 0, &[]);
        rig.doorbell();
        rig.quiet(1);
        a.ok(Request::ReleaseNc { nc: 0 });
    }
    // Another client claims it, parks, and goes away.
    let b = Client::new(&dev, 11);
    {
        let mut rig = Rig::new(&b, 0);
        let addrs = wait_event_program(&rig);
        rig.stage(addrs, 0, 0, &[]);
        rig.doorbell();
        rig.quiet(0);
    }
    dev.disconnect(b.id);
    let c = Client::new(&dev, 12);
    let mut rig = Rig::new(&c, 0);
    rig.stage(rig.ends_but_sp(None), 0, 0, &[]);
    assert_eq!(summary(&rig.run()), execution(0, 0));
    assert_eq!(c.counters(0).executions, 2);
}

#[test]
fn device_lost_ends_a_parked_execution_with_the_device_lost_notification() {
    let dev = device();
    let a = Client::new(&dev, 10);
    let mut rig = Rig::new(&a, 0);
    let addrs = wait_event_program(&rig);
    rig.stage(addrs, 0, 0, &[]);
    rig.doorbell();
    rig.quiet(0);
    dev.device_lost();
    a.ok(Request::EventSet {
        nc: 0,
        index: 5,
        value: 1,
    });
    rig.quiet(1);
    assert_eq!(rig.posted()[0].kind, NotificationKind::DeviceLost as u16);
}

#[test]
fn two_ncs_of_two_clients_execute_independently() {
    let dev = device();
    let a = Client::new(&dev, 10);
    let b = Client::new(&dev, 11);
    let mut parked = Rig::new(&a, 0);
    let mut busy = Rig::new(&b, 1);
    let addrs = wait_event_program(&parked);
    parked.stage(addrs, 0, 0, &[]);
    parked.doorbell();
    // NC 1 runs 20 executions, one of them failing, while NC 0 stays parked.
    let bad = busy.program(1, &[Instruction::new(Opcode::DmaWait, &[1, 1])]);
    for n in 0..20 {
        let sp = (n == 7).then_some(bad);
        busy.stage(busy.ends_but_sp(sp), 0, 0, &[]);
        let flags = if n == 7 { error_flags::GENERIC } else { 0 };
        assert_eq!(summary(&busy.run()), execution(n, flags));
    }
    assert!(parked.posted().is_empty());
    // Both NCs at once: each has a program running 10k instructions per engine.
    let nop = Instruction::new(Opcode::Nop, &[]);
    let mut long = vec![nop; 10_000];
    long.push(Instruction::new(Opcode::End, &[]));
    let long_b = busy.program(16, &long);
    busy.stage([long_b; 5], 0, 0, &[]);
    busy.doorbell();
    a.ok(Request::EventSet {
        nc: 0,
        index: 5,
        value: 1,
    });
    assert_eq!(summary(&parked.wait(1)[0]), execution(0, 0));
    assert_eq!(summary(&busy.wait(21)[20]), execution(20, 0));
}

#[test]
fn dma_writes_into_the_dmem_of_owned_ncs_only() {
    let dev = device();
    let a = Client::new(&dev, 10);
    let b = Client::new(&dev, 11);
    a.claim(0);
    a.claim(1);
    let nq = a.nq(0, 8);
    let src = a.alloc(MemLocation::Host, 4 * KIB);
    src.write(0, &pattern(4096));
    let map = *dev.address_map();
    let mut q = Queue::new(&a, 0, 2, 2, 32);
    q.push(src.pa, map.dmem_address(0, 0), 4096);
    q.push(src.pa, map.dmem_address(1, 1000), 3);
    q.start(&a, 2);
    assert_eq!(*lock(&dev.core.ncs[0].dmem), pattern(4096));
    assert_eq!(lock(&dev.core.ncs[1].dmem)[1000..1003], pattern(3));
    // Past the window: not a register, an OOB abort; another client's NC: OOB too.
    q.push(src.pa, map.dmem_address(0, 4090), 8);
    q.start(&a, 1);
    a.ok(Request::ReleaseNc { nc: 1 });
    b.claim(1);
    let mut q = Queue::new(&a, 0, 2, 4, 32);
    q.push(src.pa, map.dmem_address(1, 0), 4);
    q.start(&a, 1);
    let flags: Vec<u32> = entries(&nq, 8).iter().map(|e| e.error_flags).collect();
    assert_eq!(flags, [error_flags::DMA_ABORT | error_flags::OOB; 2]);
    assert_eq!(
        lock(&dev.core.ncs[1].dmem)[..4],
        [0; 4],
        "NC 1's DMEM untouched"
    );
    assert_eq!(
        lock(&dev.core.ncs[0].dmem)[4090..],
        pattern(4096)[4090..],
        "nothing written by the refused pair"
    );
}

mod compute;
mod neff;
mod scenario;
mod threads;

#[test]
fn a_trailer_that_disagrees_with_the_tail_increments_ends_with_generic_naming_it() {
    let dev = device();
    let a = Client::new(&dev, 10);
    let mut rig = Rig::new(&a, 0);
    // The staged shape with a good trailer runs.
    rig.stage(rig.ends_but_sp(None), 0, 0, &[]);
    assert_eq!(summary(&rig.run()), execution(0, 0));
    // The same batch whose cc_dma_increment trailer says 3 while the increments post 0.
    rig.write_request(rig.ends_but_sp(None), 0, 0);
    rig.request_pair();
    rig.event_pair();
    rig.tail_pairs(0, 0);
    rig.req
        .write(CC_DMA_INCREMENT_OFFSET as u64, &3u32.to_le_bytes());
    assert_eq!(summary(&rig.run()), execution(1, error_flags::GENERIC));
    let status = rig.exec_status();
    assert!(
        matches!(&status, Some(dma::QueueStatus::Stopped(r))
            if r.contains("cc_dma_increment") && r.contains("says 3") && r.contains("post 0")),
        "{status:?}"
    );
}

#[test]
fn an_event_poke_that_does_not_write_1_ends_with_generic() {
    let dev = device();
    let a = Client::new(&dev, 10);
    let mut rig = Rig::new(&a, 0);
    rig.write_request(rig.ends_but_sp(None), 0, 0);
    rig.request_pair();
    // The poke's source word off by 4 bytes: it reads the word after the 1.
    let event = register(
        rig.dev(),
        Register::Event {
            nc: 0,
            index: EVENT_HW_EXEC_QUEUE_REQUEST_LOAD,
        },
    );
    rig.exec.push(rig.req.pa + ONE_AT + 4, event, 4);
    rig.tail_pairs(0, 0);
    assert_eq!(summary(&rig.run()), execution(0, error_flags::GENERIC));
    let status = rig.exec_status();
    assert!(
        matches!(&status, Some(dma::QueueStatus::Stopped(r)) if r.contains("pair 2 must write 1")),
        "{status:?}"
    );
}

#[test]
fn a_request_without_do_model_switch_must_run_the_previous_programs() {
    let dev = device();
    let a = Client::new(&dev, 10);
    let mut rig = Rig::new(&a, 0);
    let first = rig.ends_but_sp(None);
    let other = rig.ends_but_sp(Some(rig.program(1, &[Instruction::new(Opcode::End, &[])])));
    let stage = |rig: &mut Rig<'_, '_>, addrs: [u64; 5], switch: u32| {
        rig.stage(addrs, 0, 0, &[]);
        let mut request = DeviceExecRequest::decode(&rig.req.read(0, 52)).unwrap();
        request.do_model_switch = switch;
        rig.req.write(0, zerocopy::IntoBytes::as_bytes(&request));
    };
    // The first request since the claim must switch.
    stage(&mut rig, first, 0);
    assert_eq!(summary(&rig.run()), execution(0, error_flags::GENERIC));
    // A (switch), A (no switch), B (switch), A (switch): 1, 0, 1, 1 all run.
    for (k, (addrs, switch)) in [(first, 1), (first, 0), (other, 1), (first, 1)]
        .into_iter()
        .enumerate()
    {
        stage(&mut rig, addrs, switch);
        let idx = u32::try_from(k).unwrap() + 1;
        assert_eq!(summary(&rig.run()), execution(idx, 0), "request {k}");
    }
    // Another model without the flag: GENERIC, and the NC keeps working.
    stage(&mut rig, other, 0);
    assert_eq!(summary(&rig.run()), execution(5, error_flags::GENERIC));
    stage(&mut rig, other, 1);
    assert_eq!(summary(&rig.run()), execution(6, 0));
}
