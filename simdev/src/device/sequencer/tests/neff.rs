//! NEFF programs run shape-only ([`crate::shape_only`]): programs built by hand in a client's
//! memory as the runtime places them (header before the PE stream, five streams of records, a
//! DGE table of several copies, I/O chunks), staged with the NEFF encoding bits in the
//! request's config word.

use std::os::fd::AsFd;

use shared::neff_program::{
    DGE_KIND_INPUT, DGE_KIND_OUTPUT, DgeEntry, NEFF_PROGRAM_HEADER_SIZE, NEFF_PROGRAM_MAGIC,
    NEFF_PROGRAM_VERSION, NeffProgramHeader, PROGRAM_ENCODING_SHIFT, ProgramEncoding, shape_only,
};
use shared::protocol::{FaultKind, FaultSpec, FaultWhen, LatencyModel};
use zerocopy::IntoBytes;

use super::*;

/// Records per engine of `matmul_small`'s subgraph (PE, ACT, POOL, DVE, SP).
const RECORDS: [u32; 5] = [12, 5, 7, 2, 3];
const NEFF: u32 = ProgramEncoding::Neff.config_bits();
/// DMA bytes of an exec batch's head pairs: the request and three 4-byte register writes.
const BATCH_BYTES: u64 = DEVICE_EXEC_REQUEST_SIZE as u64 + 3 * 4;
const OOB_GENERIC: u32 = error_flags::OOB | error_flags::GENERIC;

/// One NC with a NEFF subgraph's program placed in its owner's memory.
struct Neff<'c, 'd> {
    rig: Rig<'c, 'd>,
    /// Header at 0, the five streams after it.
    prog: Buf,
    dge: Buf,
    addrs: [u64; 5],
    header: NeffProgramHeader,
}

impl<'c, 'd> Neff<'c, 'd> {
    fn new(
        c: &'c Client<'d>,
        nc: u32,
        subgraph: u16,
        count: u16,
        entries: u32,
        copies: u32,
    ) -> Self {
        let rig = Rig::new(c, nc);
        let prog = c.alloc(MemLocation::Hbm { nc }, 64 * KIB);
        let mut addrs = [0; 5];
        let mut at = NEFF_PROGRAM_HEADER_SIZE;
        for engine in Engine::ALL {
            addrs[engine.index()] = prog.pa + at;
            let len = u64::from(RECORDS[engine.index()]) * 64;
            prog.write(at, &pattern(usize::try_from(len).unwrap()));
            at += len;
        }
        let dge = c.alloc(MemLocation::Hbm { nc }, 4 * KIB);
        let header = NeffProgramHeader {
            magic: NEFF_PROGRAM_MAGIC,
            version: NEFF_PROGRAM_VERSION,
            subgraph,
            subgraph_count: count,
            records: RECORDS,
            dge_entries: entries,
            dge_table_pa: dge.pa,
            dge_copies: copies,
            flags: 0,
            reserved: 0,
            neff_uuid: [0xAB; 16],
            neff_hash: [0xCD; 16],
            reserved2: [0; 4],
        };
        let neff = Self {
            rig,
            prog,
            dge,
            addrs,
            header,
        };
        neff.write_header(&header);
        neff
    }

    fn write_header(&self, header: &NeffProgramHeader) {
        self.prog.write(0, header.as_bytes());
    }

    /// Writes copy `k` of the DGE table.
    fn bind(&self, k: u32, entries: &[DgeEntry]) {
        assert_eq!(entries.len(), self.header.dge_entries as usize);
        let at = self.header.dge_copy_pa(k).unwrap() - self.dge.pa;
        self.dge.write(at, entries.as_bytes());
    }

    /// Stages one execution with config word `config` and runs it.
    fn run_with(&mut self, config: u32) -> NotificationEntry {
        self.rig.stage(self.addrs, config, 0, &[]);
        self.rig.run()
    }

    fn run(&mut self) -> NotificationEntry {
        self.run_with(NEFF)
    }
}

fn input(buf: &Buf) -> DgeEntry {
    entry(buf.pa, buf.size, 1, DGE_KIND_INPUT)
}

fn output(buf: &Buf) -> DgeEntry {
    entry(buf.pa, buf.size, 2, DGE_KIND_OUTPUT)
}

fn entry(pa: u64, size: u64, var_id: u32, kind: u32) -> DgeEntry {
    DgeEntry {
        pa,
        size,
        var_id,
        kind,
        reserved: 0,
    }
}

/// The seed of `inputs`, each read whole from the client's view.
fn seed_of(inputs: &[&Buf]) -> shape_only::Seed {
    let mut seed = shape_only::Seed::default();
    for b in inputs {
        seed.input_bytes(&b.read(0, usize::try_from(b.size).unwrap()));
    }
    seed
}

fn whole(buf: &Buf) -> Vec<u8> {
    buf.read(0, usize::try_from(buf.size).unwrap())
}

#[test]
fn a_neff_program_writes_the_documented_function_of_its_inputs_through_the_dge_table() {
    let dev = device();
    let a = Client::new(&dev, 10);
    let mut neff = Neff::new(&a, 0, 0, 1, 4, 1);
    let x = a.alloc(MemLocation::Hbm { nc: 0 }, 12 * KIB);
    let y = a.alloc(MemLocation::Hbm { nc: 0 }, 4 * KIB);
    let out0 = a.alloc(MemLocation::Hbm { nc: 0 }, 20 * KIB);
    let out1 = a.alloc(MemLocation::Hbm { nc: 0 }, 8 * KIB);
    x.write(0, &pattern(12 * 1024));
    y.write(0, b"second input");
    neff.bind(0, &[input(&x), output(&out0), input(&y), output(&out1)]);
    let before = a.counters(0);
    assert_eq!(summary(&neff.run()), execution(0, 0));
    let seed = seed_of(&[&x, &y]);
    assert_eq!(
        whole(&out0),
        shape_only::expected_output(seed, 0, 20 * 1024)
    );
    assert_eq!(whole(&out1), shape_only::expected_output(seed, 1, 8 * 1024));
    let c = a.counters(0);
    assert_eq!((c.executions, c.neff_shape_only_executions), (1, 1));
    // The exec batch's head pairs (the 52-byte request and three 4-byte words), the table (4
    // entries), both inputs' edges (x is 12 KiB: two 4 KiB edges; y 4 KiB: the whole of it,
    // twice) and both outputs.
    assert_eq!(
        c.dma_bytes - before.dma_bytes,
        BATCH_BYTES + 4 * 32 + 2 * 4096 + 2 * 4096 + 28 * 1024,
        "DGE traffic counts as DMA bytes"
    );

    // A different input gives a different output, the documented one.
    let first = whole(&out0);
    y.write(0, b"Second input");
    assert_eq!(summary(&neff.run()), execution(1, 0));
    assert_ne!(whole(&out0), first);
    assert_eq!(
        whole(&out0),
        shape_only::expected_output(seed_of(&[&x, &y]), 0, 20 * 1024)
    );
    // An ISA execution on the same NC is not counted as shape-only.
    neff.rig.stage(neff.rig.ends_but_sp(None), 0, 0, &[]);
    assert_eq!(summary(&neff.rig.run()), execution(2, 0));
    assert_eq!(a.counters(0).neff_shape_only_executions, 2);
}

#[test]
fn two_subgraphs_on_two_ncs_write_their_shares_and_together_the_whole() {
    let dev = device();
    let a = Client::new(&dev, 10);
    let mut sg0 = Neff::new(&a, 0, 0, 2, 2, 1);
    let mut sg1 = Neff::new(&a, 1, 1, 2, 2, 1);
    let x = a.alloc(MemLocation::Hbm { nc: 0 }, 4 * KIB);
    x.write(0, &pattern(4096));
    let out = a.alloc(MemLocation::Hbm { nc: 0 }, 40 * KIB);
    for sg in [&sg0, &sg1] {
        sg.bind(0, &[input(&x), output(&out)]);
    }
    let expected = shape_only::expected_output(seed_of(&[&x]), 0, 40 * 1024);
    assert_eq!(summary(&sg0.run()), execution(0, 0));
    let half = usize::try_from(shape_only::share(40 * 1024, 0, 2).end).unwrap();
    assert_eq!(half, 20 * 1024);
    let written = whole(&out);
    assert_eq!(written[..half], expected[..half], "subgraph 0's share");
    assert!(
        written[half..].iter().all(|&b| b == 0),
        "subgraph 0 writes only its share"
    );
    assert_eq!(summary(&sg1.run()), execution(0, 0));
    assert_eq!(
        whole(&out),
        expected,
        "the two shares make the whole output"
    );
}

#[test]
fn compute_idx_selects_the_dge_table_copy() {
    let dev = device();
    let a = Client::new(&dev, 10);
    let mut neff = Neff::new(&a, 0, 0, 1, 2, 2);
    let x = a.alloc(MemLocation::Hbm { nc: 0 }, 4 * KIB);
    x.write(0, &pattern(4096));
    let (out_a, out_b) = (
        a.alloc(MemLocation::Hbm { nc: 0 }, 4 * KIB),
        a.alloc(MemLocation::Hbm { nc: 0 }, 4 * KIB),
    );
    neff.bind(0, &[input(&x), output(&out_a)]);
    neff.bind(1, &[input(&x), output(&out_b)]);
    let expected = shape_only::expected_output(seed_of(&[&x]), 0, 4096);
    assert_eq!(summary(&neff.run()), execution(0, 0));
    assert_eq!(whole(&out_a), expected, "execution 0 used copy 0");
    assert_eq!(whole(&out_b), vec![0; 4096], "copy 1 was not used");
    assert_eq!(summary(&neff.run()), execution(1, 0));
    assert_eq!(whole(&out_b), expected, "execution 1 used copy 1");
}

#[test]
fn a_bad_dge_entry_is_refused_before_anything_is_written() {
    let dev = device();
    let a = Client::new(&dev, 10);
    let b = Client::new(&dev, 11);
    let mut neff = Neff::new(&a, 0, 0, 1, 3, 1);
    let x = a.alloc(MemLocation::Hbm { nc: 0 }, 4 * KIB);
    let out = a.alloc(MemLocation::Hbm { nc: 0 }, 4 * KIB);
    let theirs = b.alloc(MemLocation::Host, 4 * KIB);
    theirs.write(0, b"another client's tensor");
    let cases = [
        // Runs past the end of the output's chunk.
        (entry(out.pa, 8 * KIB, 3, DGE_KIND_OUTPUT), OOB_GENERIC),
        // Nothing allocated there.
        (entry(0x1000, 64, 3, DGE_KIND_INPUT), OOB_GENERIC),
        // Another client's chunk, as input and as output.
        (entry(theirs.pa, 64, 3, DGE_KIND_INPUT), OOB_GENERIC),
        (entry(theirs.pa, 4 * KIB, 3, DGE_KIND_OUTPUT), OOB_GENERIC),
        // Neither input nor output.
        (entry(out.pa, 64, 3, 3), error_flags::GENERIC),
        (entry(out.pa, 0, 3, DGE_KIND_OUTPUT), error_flags::GENERIC),
    ];
    let mut n = 0;
    for (bad, flags) in cases {
        // The good output comes first: it must not be written either.
        neff.bind(0, &[input(&x), output(&out), bad]);
        assert_eq!(summary(&neff.run()), execution(n, flags), "{bad:?}");
        assert_eq!(whole(&out), vec![0; 4096], "{bad:?}: nothing written");
        n += 1;
    }
    assert_eq!(theirs.read(0, 23), b"another client's tensor");
    // The DGE table itself outside the client's memory.
    neff.write_header(&NeffProgramHeader {
        dge_table_pa: theirs.pa,
        ..neff.header
    });
    assert_eq!(summary(&neff.run()), execution(n, OOB_GENERIC));
    let c = a.counters(0);
    assert_eq!(c.neff_shape_only_executions, 0);
    // Fixed, the same NC runs it.
    neff.write_header(&neff.header);
    neff.bind(0, &[input(&x), output(&out), input(&x)]);
    assert_eq!(summary(&neff.run()), execution(n + 1, 0));
    assert_eq!(
        whole(&out),
        shape_only::expected_output(seed_of(&[&x, &x]), 0, 4096)
    );
}

#[test]
fn bad_headers_streams_and_encodings_are_execution_errors() {
    let dev = device();
    let a = Client::new(&dev, 10);
    let mut neff = Neff::new(&a, 0, 0, 1, 0, 1);
    let h = neff.header;
    let bad_headers = [
        (
            NeffProgramHeader {
                magic: *b"NEFFPROH",
                ..h
            },
            error_flags::GENERIC,
        ),
        (NeffProgramHeader { version: 1, ..h }, error_flags::GENERIC),
        (NeffProgramHeader { subgraph: 1, ..h }, error_flags::GENERIC),
        (
            NeffProgramHeader { dge_copies: 0, ..h },
            error_flags::GENERIC,
        ),
        (NeffProgramHeader { flags: 1, ..h }, error_flags::GENERIC),
        (
            NeffProgramHeader {
                reserved2: [0, 0, 1, 0],
                ..h
            },
            error_flags::GENERIC,
        ),
        (
            NeffProgramHeader {
                dge_entries: u32::MAX,
                ..h
            },
            error_flags::GENERIC,
        ),
        // SP's stream runs past the end of the program's chunk.
        (
            NeffProgramHeader {
                records: [12, 5, 7, 2, 2000],
                ..h
            },
            OOB_GENERIC,
        ),
    ];
    let mut n = 0;
    for (header, flags) in bad_headers {
        neff.write_header(&header);
        assert_eq!(summary(&neff.run()), execution(n, flags), "{header:?}");
        n += 1;
    }
    neff.write_header(&h);
    // An unknown encoding, and a NEFF whose header would be outside the client's memory.
    assert_eq!(
        summary(&neff.run_with(7 << PROGRAM_ENCODING_SHIFT)),
        execution(n, error_flags::GENERIC)
    );
    let addrs = neff.addrs;
    neff.addrs[Engine::Pe.index()] = 0x40;
    assert_eq!(summary(&neff.run()), execution(n + 1, OOB_GENERIC));
    neff.addrs = addrs;
    assert_eq!(summary(&neff.run()), execution(n + 2, 0));
    let c = a.counters(0);
    assert_eq!(
        (c.exec_errors, c.neff_shape_only_executions),
        (u64::from(n) + 2, 1)
    );
}

fn model() -> LatencyModel {
    LatencyModel {
        per_execution_ns: 1_000,
        per_instruction_ns: 10,
        per_config_reload_ns: 500_000,
        ..LatencyModel::default()
    }
}

#[test]
fn the_latency_model_charges_every_record_and_the_trace_has_one_span_per_engine() {
    let dir = tempfile::tempdir().unwrap();
    let dev = Device::new(&Config {
        trace: Some(dir.path().join("trace.json")),
        ..config()
    })
    .unwrap();
    let a = Client::new(&dev, 10);
    a.ok(Request::SetLatency(model()));
    let mut neff = Neff::new(&a, 0, 0, 1, 0, 1);
    let records: u64 = RECORDS.iter().map(|&r| u64::from(r)).sum();
    let plain = 1_000 + records * 10;
    let first = neff.run_with(NEFF | 1);
    assert_eq!(
        (first.error_flags, first.nc_ts_ns),
        (0, plain + 500_000),
        "29 records and a config reload (bit 0 of the word) charged"
    );
    let second = neff.run();
    assert_eq!(
        (second.nc_ts_ns, second.device_ts_ns),
        (plain, 2 * plain + 500_000)
    );
    assert_eq!(a.counters(0).config_reloads, 1);
    let summary = dev.write_trace().unwrap().unwrap();
    let text = std::fs::read_to_string(&summary.path).unwrap();
    let json: serde_json::Value = serde_json::from_str(&text).unwrap();
    let spans: Vec<_> = json["traceEvents"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["cat"] == "instruction" && e["args"]["compute_idx"] == 1)
        .cloned()
        .collect();
    let names: Vec<_> = spans.iter().map(|e| e["name"].as_str().unwrap()).collect();
    assert_eq!(
        names,
        [
            "PE stream: 12 records (NEFF, shape-only)",
            "ACT stream: 5 records (NEFF, shape-only)",
            "POOL stream: 7 records (NEFF, shape-only)",
            "DVE stream: 2 records (NEFF, shape-only)",
            "SP stream: 3 records (NEFF, shape-only)",
        ]
    );
    // PE's span lasts its 12 records (0.12 µs) and ACT's starts where it ends.
    assert_eq!(spans[0]["dur"].as_f64(), Some(0.12));
    let ts = |i: usize| spans[i]["ts"].as_f64().unwrap();
    assert!((ts(1) - ts(0) - 0.12).abs() < 1e-6, "{spans:?}");
}

#[test]
fn faults_apply_to_a_neff_execution_as_to_an_isa_one() {
    let dev = device();
    let a = Client::new(&dev, 10);
    a.ok(Request::SetLatency(model()));
    let mut neff = Neff::new(&a, 0, 0, 1, 2, 1);
    let x = a.alloc(MemLocation::Hbm { nc: 0 }, 4 * KIB);
    x.write(0, &pattern(4096));
    let out = a.alloc(MemLocation::Hbm { nc: 0 }, 4 * KIB);
    neff.bind(0, &[input(&x), output(&out)]);
    let nth = |kind, n| {
        Request::InjectFault(FaultSpec {
            kind,
            nc: Some(0),
            when: FaultWhen::NthExecution(n),
        })
    };
    a.ok(nth(FaultKind::NcUncorrectable, 2));
    a.ok(nth(FaultKind::ExtraLatency { ns: 5_000 }, 3));
    let plain = 1_000 + 29 * 10;
    let first = neff.run();
    assert_eq!((summary(&first), first.nc_ts_ns), (execution(0, 0), plain));
    let second = neff.run();
    assert_eq!(summary(&second), execution(1, error_flags::NC_UE));
    let expected = shape_only::expected_output(seed_of(&[&x]), 0, 4096);
    assert_eq!(whole(&out), expected, "the program still ran");
    let third = neff.run();
    assert_eq!(
        (summary(&third), third.nc_ts_ns),
        (execution(2, 0), plain + 5_000)
    );
    // A missing completion: nothing posted, the next execution takes the next index.
    a.ok(nth(FaultKind::MissingCompletion, 1));
    neff.rig.stage(neff.addrs, NEFF, 0, &[]);
    neff.rig.doorbell();
    neff.rig.quiet(3);
    assert_eq!(summary(&neff.run()), execution(4, 0));
    assert_eq!(a.counters(0).neff_shape_only_executions, 5);
}

/// Blocks (512 bytes each) the memfd of the chunk at `pa` has allocated.
fn allocated_blocks(dev: &Device, client: ClientId, pa: u64) -> i64 {
    let chunk = read(&dev.core.memory).resolve(client, pa, 1).unwrap();
    nix::sys::stat::fstat(chunk.memfd().as_fd())
        .unwrap()
        .st_blocks
}

#[test]
fn a_large_input_is_read_only_at_its_edges() {
    let dev = device();
    let a = Client::new(&dev, 10);
    let mut neff = Neff::new(&a, 0, 0, 1, 2, 1);
    let size = 64 * MIB;
    let x = a.alloc(MemLocation::Host, size);
    let out = a.alloc(MemLocation::Hbm { nc: 0 }, 4 * KIB);
    x.write(0, &pattern(4096));
    x.write(size - 4096, &pattern(4096));
    neff.bind(0, &[input(&x), output(&out)]);
    let before = a.counters(0).dma_bytes;
    assert_eq!(summary(&neff.run()), execution(0, 0));
    assert_eq!(
        a.counters(0).dma_bytes - before,
        BATCH_BYTES + 2 * 32 + 2 * 4096 + 4096,
        "8 KiB of a 64 MiB input read"
    );
    let blocks = allocated_blocks(&dev, a.id, x.pa);
    assert!(
        blocks <= 64,
        "the input's memfd holds {blocks} blocks: it was read whole"
    );
    let mut seed = shape_only::Seed::default();
    seed.input(size, &pattern(4096), &pattern(4096));
    assert_eq!(whole(&out), shape_only::expected_output(seed, 0, 4096));
    // A change in the middle does not change the output; one at an edge does.
    x.write(size / 2, b"middle");
    assert_eq!(summary(&neff.run()), execution(1, 0));
    assert_eq!(whole(&out), shape_only::expected_output(seed, 0, 4096));
    x.write(size - 1, b"!");
    assert_eq!(summary(&neff.run()), execution(2, 0));
    assert_ne!(whole(&out), shape_only::expected_output(seed, 0, 4096));
}

/// A device whose matmul_small is bound to `function` of a module written in `dir`, and the
/// NEFF's header identity.
fn bound_device(dir: &std::path::Path, source: &str) -> (Device, [u8; 16], [u8; 16]) {
    let neff_file = format!(
        "{}/../scenarios/data/neff/matmul_small.neff",
        env!("CARGO_MANIFEST_DIR")
    );
    let module = dir.join("r.py");
    std::fs::write(&module, source).unwrap();
    let config = Config {
        references: vec![format!("{neff_file}={}:f", module.display())],
        reference_timeout: std::time::Duration::from_secs(10),
        ..crate::device::test_utils::config()
    };
    let h = ::neff::NeffHeader::read(&std::fs::read(&neff_file).unwrap()).unwrap();
    let mut hash = [0; 16];
    hash.copy_from_slice(&h.hash[..16]);
    (Device::new(&config).unwrap(), h.uuid, hash)
}

#[test]
fn a_bound_neff_runs_its_reference_on_subgraph_0_only_and_checks_the_table_against_it() {
    let dir = tempfile::tempdir().unwrap();
    let source = "import numpy as np\n\
                  def f(x, y):\n    \
                  return {'output0': np.full((128, 128), x[0, 0] + y[-1, -1], dtype=np.float16)}\n";
    let (dev, uuid, hash) = bound_device(dir.path(), source);
    let a = Client::new(&dev, 10);
    let mut sg0 = Neff::new(&a, 0, 0, 2, 3, 1);
    let mut sg1 = Neff::new(&a, 1, 1, 2, 3, 1);
    for sg in [&mut sg0, &mut sg1] {
        sg.header.neff_uuid = uuid;
        sg.header.neff_hash = hash;
        sg.write_header(&sg.header);
    }
    let x = a.alloc(MemLocation::Hbm { nc: 0 }, 64 * KIB);
    let y = a.alloc(MemLocation::Hbm { nc: 0 }, 64 * KIB);
    let out = a.alloc(MemLocation::Hbm { nc: 0 }, 32 * KIB);
    x.write(0, &0x3C00u16.to_le_bytes()); // 1.0
    y.write(64 * 1024 - 2, &0x4000u16.to_le_bytes()); // 2.0
    // Subgraph 1 writes nothing and starts no worker.
    sg1.bind(0, &[input(&x), input(&y), output(&out)]);
    assert_eq!(summary(&sg1.run()), execution(0, 0));
    assert_eq!(whole(&out), vec![0; 32 * 1024]);
    assert_eq!(dev.reference_worker_pid(), None);
    let c = a.counters(1);
    assert_eq!(
        (c.neff_reference_executions, c.neff_shape_only_executions),
        (1, 0)
    );
    // A table that does not match the bound NEFF's I/O is GENERIC, before any worker runs.
    sg0.bind(0, &[input(&x), input(&y), input(&x)]);
    assert_eq!(summary(&sg0.run()), execution(0, error_flags::GENERIC));
    assert_eq!(dev.reference_worker_pid(), None);
    // Subgraph 0 runs the reference: the whole output, in place.
    sg0.bind(0, &[input(&x), input(&y), output(&out)]);
    assert_eq!(summary(&sg0.run()), execution(1, 0));
    let want: Vec<u8> = std::iter::repeat_n(0x4200u16.to_le_bytes(), 128 * 128)
        .flatten()
        .collect(); // 3.0
    assert_eq!(whole(&out), want);
    assert!(dev.reference_worker_pid().is_some(), "the worker stays");
    let c = a.counters(0);
    assert_eq!(
        (
            c.neff_reference_executions,
            c.neff_shape_only_executions,
            c.exec_errors
        ),
        (1, 0, 1)
    );
}
