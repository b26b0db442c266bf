//! Loading the real NEFFs against the emulated device in-process: placement bytes (header,
//! streams, constants, DGE copies), the staged requests' encoding and engine addresses, the
//! refusals (LNC, HBM, malformed files, hash, version) and frees. None of these needs simdev to
//! run a NEFF program: they read what the runtime wrote.

use std::time::Duration;

use shared::model::DType;
use shared::neff_program::{
    DGE_ENTRY_SIZE, DGE_KIND_INPUT, DGE_KIND_OUTPUT, DgeEntry, NEFF_PROGRAM_HEADER_SIZE,
    NEFF_PROGRAM_MAGIC, NeffProgramHeader, ProgramEncoding, SEQ_CONFIG_RELOAD,
};
use shared::protocol::DeviceStats;
use shared::{Arch, NrtStatus};
use zerocopy::FromBytes;

use super::LoadedModel;
use super::neff_load::{self, NEFF_EXEC_REQ_FLAGS, VncShape};
use crate::backend::{Allocation, Device};
use crate::config::RuntimeConfig;
use crate::test_support::Rig;
use crate::{ModelHandle, Placement, Runtime, Tensor, TensorSet};

fn neff_bytes(name: &str) -> Vec<u8> {
    let path = format!(
        "{}/../scenarios/data/neff/{name}.neff",
        env!("CARGO_MANIFEST_DIR")
    );
    std::fs::read(&path).unwrap_or_else(|e| panic!("{path}: {e}"))
}

fn parsed(name: &str) -> neff::Neff {
    neff::Neff::parse(&neff_bytes(name), &neff::ParseOptions::default()).expect("a valid NEFF")
}

fn config(lnc: u32) -> RuntimeConfig {
    RuntimeConfig {
        lnc: Some(lnc),
        exec_timeout: Duration::from_secs(10),
        ..RuntimeConfig::default()
    }
}

/// trn2, two NCs, NEURON_LOGICAL_NC_CONFIG=2: one logical core of NCs 0 and 1.
fn trn2_lnc2() -> (Rig, Runtime) {
    let rig = Rig::with(Arch::Trn2, 2);
    let rt = rig.runtime(config(2));
    (rig, rt)
}

fn read(rig: &Rig, chunk: &Allocation, pa: u64, len: usize) -> Vec<u8> {
    let map = rig.backend.mem_map(chunk).expect("map");
    let mut buf = vec![0; len];
    map.read(pa, &mut buf).expect("in the chunk");
    buf
}

fn stats(rig: &Rig) -> DeviceStats {
    rig.device.stats()
}

#[test]
fn matmul_small_places_header_streams_constants_and_queues_per_subgraph() {
    let (rig, rt) = trn2_lnc2();
    let neff = parsed("matmul_small");
    let before = stats(&rig);
    let h = rt.load(&neff_bytes("matmul_small"), 0).expect("load");
    let m = rt.model(h).unwrap();
    assert!(m.is_neff());
    assert_eq!(m.name(), "file.neff");
    let meta = m.model();
    assert_eq!(meta.sg_count, 2);
    assert_eq!(meta.exec_req_flags, NEFF_EXEC_REQ_FLAGS);
    assert_ne!(meta.act_table_hash, [0; 32], "the activation tables' MD5");
    assert_ne!(meta.dve_table_hash, meta.act_table_hash);
    let io: Vec<_> = meta
        .inputs
        .iter()
        .chain(&meta.outputs)
        .map(|t| (t.name.as_str(), t.dtype, t.shape.clone(), t.size))
        .collect();
    assert_eq!(
        io,
        [
            ("x", DType::F16, vec![128, 256], 65536),
            ("y", DType::F16, vec![256, 128], 65536),
            ("output0", DType::F16, vec![128, 128], 32768),
        ]
    );
    let copies = rt.config().max_inflight() + 1;
    for (k, (tpb, sg)) in m.tpbs().iter().zip(&neff.subgraphs).enumerate() {
        assert_eq!(
            tpb.nc,
            u32::try_from(k).unwrap(),
            "subgraph k on the k-th NC"
        );
        let n = tpb.neff.as_ref().expect("a NEFF TPB");
        // Every stream's bytes at its engine address, 64-byte aligned.
        for (addr, stream) in tpb.engine_addresses.iter().zip(&sg.streams) {
            assert_eq!(addr % 64, 0);
            assert!(*addr >= tpb.blocks.pa && addr - tpb.blocks.pa < tpb.blocks.size);
            assert_eq!(
                read(&rig, &tpb.blocks, *addr, stream.bytes.len()),
                stream.bytes,
                "{}",
                stream.member
            );
        }
        // The program header immediately before the PE stream.
        let raw = read(
            &rig,
            &tpb.blocks,
            tpb.engine_addresses[0] - NEFF_PROGRAM_HEADER_SIZE,
            128,
        );
        let header = NeffProgramHeader::read_from_bytes(&raw).unwrap();
        assert_eq!(header, n.header);
        assert_eq!(header.magic, NEFF_PROGRAM_MAGIC);
        assert_eq!(header.records, [12, 5, 7, 2, 3]);
        assert_eq!(
            (header.subgraph, header.subgraph_count),
            (u16::try_from(k).unwrap(), 2)
        );
        assert_eq!((header.dge_entries, header.dge_copies), (3, copies));
        let dge_end = header.dge_table_pa + u64::from(copies) * 3 * DGE_ENTRY_SIZE;
        assert!(header.dge_table_pa >= tpb.engine_addresses[4]);
        assert!(dge_end <= tpb.blocks.pa + tpb.blocks.size);
        // The constant, aligned as its var asks and written once.
        let c = &sg.constants[0];
        let pa = n.var_pas[&c.var];
        assert_eq!(pa % 32768, 0);
        let chunk = tpb.buffers.iter().find(|a| a.pa == pa).expect("its chunk");
        assert_eq!(read(&rig, chunk, pa, c.data.len()), c.data);
        assert_eq!(n.state_buffer_reservations, sg.state_buffer_reservations);
        // Inputs and outputs are not allocated; two dynamic queue sets of 16 queues.
        assert!(!n.var_pas.contains_key("x") && !n.var_pas.contains_key("output0"));
        assert_eq!(n.queues.len(), 32);
        assert!(n.queues.iter().all(|&(e, _)| e == 4 || e == 5));
    }
    let loaded = stats(&rig);
    assert_eq!(
        loaded.dma_queues,
        before.dma_queues + 64,
        "32 queues per NC"
    );
    rt.unload(h).unwrap();
    assert_eq!(
        stats(&rig),
        before,
        "unload gave back every chunk and queue"
    );
    rt.close();
}

#[test]
fn matmul_large_gets_one_8_mib_scratchpad_per_subgraph() {
    let (rig, rt) = trn2_lnc2();
    let neff = parsed("matmul_large");
    let before = stats(&rig);
    let h = rt.load_neff(&neff, 0).expect("load");
    let m = rt.model(h).unwrap();
    for (tpb, sg) in m.tpbs().iter().zip(&neff.subgraphs) {
        let n = tpb.neff.as_ref().unwrap();
        let scratch = tpb
            .buffers
            .iter()
            .find(|a| a.size == 8 << 20)
            .expect("an 8 MiB scratchpad");
        for v in sg.vars.values() {
            if let neff::VarKind::Virtual {
                backing_variable_off,
            } = v.kind
            {
                assert_eq!(n.var_pas[&v.name], scratch.pa + backing_variable_off);
            }
        }
        let records: Vec<u32> = sg
            .streams
            .iter()
            .map(|s| u32::try_from(s.records()).unwrap())
            .collect();
        assert_eq!(n.header.records.to_vec(), records);
        assert!(
            !n.var_pas.contains_key("y"),
            "the 4 GiB input is bound, not allocated"
        );
    }
    rt.unload(h).unwrap();
    assert_eq!(stats(&rig), before);
    rt.close();
}

/// Device tensors for matmul_small's I/O on core 0.
fn small_io(rt: &Runtime) -> (Vec<Tensor>, TensorSet, TensorSet) {
    let t = |size, name| {
        rt.tensor_allocate(Placement::Device { vnc: 0 }, size, name)
            .unwrap()
    };
    let (x, y, o) = (t(65536, "x"), t(65536, "y"), t(32768, "output0"));
    let (mut ins, mut outs) = (TensorSet::new(), TensorSet::new());
    ins.add("x", &x);
    ins.add("y", &y);
    outs.add("output0", &o);
    (vec![x, y, o], ins, outs)
}

/// What staging compute index `idx` wrote on every TPB: the request and the DGE copy.
fn staged(rig: &Rig, rt: &Runtime, m: &LoadedModel, idx: u32) -> Vec<(u32, u32, Vec<DgeEntry>)> {
    let q = rt.hw_exec_queue(m.tpbs()[0].nc).unwrap();
    let req = q.compute_req_lock.lock().unwrap();
    m.tpbs()
        .iter()
        .map(|tpb| {
            let r = req.tpb(tpb.nc).unwrap().read_request(idx).unwrap();
            for (i, e) in shared::Engine::ALL.iter().enumerate() {
                assert_eq!(r.engine_address(*e), tpb.engine_addresses[i], "{e:?}");
            }
            assert_eq!(ProgramEncoding::of_request(&r), ProgramEncoding::Neff);
            let h = tpb.neff.as_ref().unwrap().header;
            let raw = read(
                rig,
                &tpb.blocks,
                h.dge_copy_pa(idx).unwrap(),
                usize::try_from(3 * DGE_ENTRY_SIZE).unwrap(),
            );
            (
                r.reload_seq_config,
                r.load_act_dve_tables,
                <[DgeEntry]>::ref_from_bytes(&raw).unwrap().to_vec(),
            )
        })
        .collect()
}

fn expected_dge(t: &[Tensor]) -> Vec<DgeEntry> {
    let e = |t: &Tensor, size, var_id, kind| DgeEntry {
        pa: t.device_pa().unwrap(),
        size,
        var_id,
        kind,
        reserved: 0,
    };
    vec![
        e(&t[0], 65536, 1, DGE_KIND_INPUT),
        e(&t[1], 65536, 2, DGE_KIND_INPUT),
        e(&t[2], 32768, 3, DGE_KIND_OUTPUT),
    ]
}

fn compute_idx_tail(rt: &Runtime, m: &LoadedModel) -> u32 {
    rt.hw_exec_queue(m.tpbs()[0].nc)
        .unwrap()
        .compute_req_lock
        .lock()
        .unwrap()
        .compute_idx_tail()
}

/// Sync and explicit async (`nrta_execute_schedule`) stage the NEFF encoding on every request
/// and this execution's tensor PAs into DGE copy `compute_idx % dge_copies` of every TPB. The
/// device's verdict on the program does not matter here (simdev's NEFF support is elsewhere).
#[test]
fn every_request_names_the_neff_encoding_and_its_dge_copy_holds_the_bound_tensors() {
    let (rig, rt) = trn2_lnc2();
    let h = rt.load(&neff_bytes("matmul_small"), 0).unwrap();
    let m = rt.model(h).unwrap();
    let (a, ins_a, outs_a) = small_io(&rt);
    let (b, ins_b, outs_b) = small_io(&rt);
    let first = compute_idx_tail(&rt, &m);
    let _ = rt.execute(h, &ins_a, &outs_a);
    let s = rt.execute_schedule(h, &ins_b, &outs_b).unwrap();
    let _ = rt.wait(&s);
    let _ = rt.execute(h, &ins_a, &outs_b);
    assert_eq!(compute_idx_tail(&rt, &m), first + 3);
    let mut mixed = expected_dge(&a);
    mixed[2] = expected_dge(&b)[2];
    for (k, want) in [expected_dge(&a), expected_dge(&b), mixed]
        .into_iter()
        .enumerate()
    {
        let idx = first + u32::try_from(k).unwrap();
        for (tpb, (config, tables, dge)) in staged(&rig, &rt, &m, idx).into_iter().enumerate() {
            assert_eq!(tables, u32::from(k == 0), "the tables load once");
            assert_eq!(dge, want, "execution {k}, TPB {tpb}");
            assert_eq!(
                config & !SEQ_CONFIG_RELOAD,
                0x100,
                "execution {k}: {config:#x}"
            );
            assert_eq!(
                config & SEQ_CONFIG_RELOAD,
                u32::from(k == 0),
                "only the first reloads the config"
            );
        }
    }
    rt.unload(h).unwrap();
    rt.close();
}

#[test]
fn the_implicit_async_pool_stages_the_dge_copy_too() {
    let rig = Rig::with(Arch::Trn2, 2);
    let rt = rig.runtime(RuntimeConfig {
        async_max_inflight: 2,
        ..config(2)
    });
    let h = rt.load(&neff_bytes("matmul_small"), 0).unwrap();
    let m = rt.model(h).unwrap();
    let (a, ins, outs) = small_io(&rt);
    let first = compute_idx_tail(&rt, &m);
    assert!(rt.implicit_async());
    let _ = rt.execute(h, &ins, &outs);
    rt.async_drain(0);
    assert_eq!(compute_idx_tail(&rt, &m), first + 1);
    for (_, _, dge) in staged(&rig, &rt, &m, first) {
        assert_eq!(dge, expected_dge(&a));
    }
    rt.unload(h).unwrap();
    rt.close();
}

#[test]
fn an_lnc2_neff_is_refused_on_a_core_of_one_nc_naming_both() {
    for arch in [Arch::Trn2, Arch::Trn1] {
        let rig = Rig::with(arch, 2);
        let rt = rig.runtime(config(1));
        let before = stats(&rig);
        let e = rt.load(&neff_bytes("matmul_small"), 0).unwrap_err();
        assert_eq!(e.status, NrtStatus::LoadNotEnoughNc, "{e}");
        let remedy = match arch {
            Arch::Trn2 => "set NEURON_LOGICAL_NC_CONFIG=2",
            _ => {
                "LNC=2 needs a trn2 device, where it is the default (for a private simdev, \
                 NEURON_SIMDEV_ARCH=trn2)"
            }
        };
        let want = format!(
            "NEFF \"file.neff\" needs LNC=2 (2 subgraphs), logical core 0 has 1 NC (LNC=1 on {}); {remedy}",
            arch.name()
        );
        assert_eq!(e.message, want);
        assert_eq!(stats(&rig), before, "nothing allocated");
        rt.close();
    }
}

/// The monitor's `loaded_models[].uuid` comes from the datastore's model slot: a NEFF's is its
/// header's uuid, as `nrt neff info` prints it.
#[test]
fn a_loaded_neff_publishes_its_uuid() {
    let (_rig, rt) = trn2_lnc2();
    let bytes = neff_bytes("matmul_small");
    let want = neff::Neff::parse(&bytes, &neff::ParseOptions::default())
        .unwrap()
        .uuid_hex();
    let h = rt.load(&bytes, 0).unwrap();
    let snap = rt.datastore().snapshot();
    let m = snap.models.iter().find(|m| m.id == h.id).unwrap();
    assert_eq!(m.uuid_hex(), want);
    assert_eq!(want, "00a04c535fd94f07bffdd5eacdefc852");
    rt.unload(h).unwrap();
    rt.close();
}

#[test]
fn a_neff_whose_header_lnc_disagrees_with_its_subgraphs_is_nrt_invalid() {
    let mut bytes = neff_bytes("matmul_small");
    // lnc_size (u32 at 0x228, nrt-api.md §4): 1, while the NEFF holds sg00 and sg01.
    bytes[0x228..0x22c].copy_from_slice(&1u32.to_le_bytes());
    for lnc in [1, 2] {
        let rig = Rig::with(Arch::Trn2, 2);
        let rt = rig.runtime(config(lnc));
        let before = stats(&rig);
        let e = rt.load(&bytes, 0).unwrap_err();
        assert_eq!(e.status, NrtStatus::Invalid, "LNC={lnc}: {e}");
        assert!(
            e.message.contains(
                "is inconsistent: its header asks for LNC=1 (lnc_size at 0x228) but it holds 2 \
                 subgraph(s)"
            ),
            "{e}"
        );
        assert_eq!(stats(&rig), before, "nothing allocated");
        rt.close();
    }
}

#[test]
fn a_neff_larger_than_the_free_hbm_is_nrt_resource_before_anything_is_allocated() {
    let device = std::sync::Arc::new(
        simdev::Device::new(&simdev::config::Config {
            arch: Arch::Trn2,
            ncs: 2,
            hbm_bytes_per_nc: 8 << 20,
            ..simdev::config::Config::default()
        })
        .unwrap(),
    );
    let sim = crate::backend::sim::SimDevice::in_process(device.clone()).unwrap();
    let rt = Runtime::init(std::sync::Arc::new(sim), config(2)).unwrap();
    let before = device.stats();
    let e = rt.load(&neff_bytes("matmul_large"), 0).unwrap_err();
    assert_eq!(e.status, NrtStatus::Resource, "{e}");
    for part in [
        "NEFF \"file.neff\" subgraph sg00 needs ",
        " bytes of HBM on NC 0 (largest: var ",
        " 524288 bytes), NC 0 has ",
        " bytes free",
    ] {
        assert!(e.message.contains(part), "{part:?} in {e}");
    }
    assert_eq!(device.stats(), before, "nothing allocated");
    rt.close();
}

#[test]
fn malformed_neffs_are_refused_with_nothing_allocated() {
    let (rig, rt) = trn2_lnc2();
    let good = neff_bytes("matmul_small");
    let before = stats(&rig);
    // Truncated: data_size no longer matches.
    let e = rt.load(&good[..good.len() - 100], 0).unwrap_err();
    assert_eq!(e.status, NrtStatus::Invalid);
    assert!(e.message.starts_with("loading NEFF \"file.neff\": "), "{e}");
    assert!(e.message.contains("data_size"), "{e}");
    // Corrupted gzip.
    let mut bad = good.clone();
    for b in &mut bad[1100..1200] {
        *b ^= 0xA5;
    }
    let e = rt.load(&bad, 0).unwrap_err();
    assert_eq!(e.status, NrtStatus::Invalid, "{e}");
    assert!(e.message.starts_with("loading NEFF \"file.neff\": "), "{e}");
    // An unsupported major version.
    let mut v3 = good.clone();
    v3[0x18] = 3;
    let e = rt.load(&v3, 0).unwrap_err();
    assert_eq!(e.status, NrtStatus::UnsupportedNeffVersion, "{e}");
    // A broken header is the NEFF reader's to name, not "not a model container".
    let mut no_header_size = good.clone();
    no_header_size[8..16].fill(0);
    let e = rt.load(&no_header_size, 0).unwrap_err();
    assert_eq!(e.status, NrtStatus::Invalid, "{e}");
    assert!(e.message.contains("header_size"), "{e}");
    assert!(!e.message.contains("NRTMODEL\")"), "{e}");
    let mut pkg_99 = good.clone();
    pkg_99[..8].copy_from_slice(&99u64.to_le_bytes());
    let e = rt.load(&pkg_99, 0).unwrap_err();
    assert!(e.message.contains("pkg_version"), "{e}");
    // Bytes that are no model at all say both readers refused them.
    let e = rt.load(&[0x5a; 4096], 0).unwrap_err();
    assert_eq!(e.status, NrtStatus::Invalid, "{e}");
    assert!(
        e.message.starts_with(
            "the model is neither a model container (no \"NRTMODEL\" magic) nor a NEFF: "
        ),
        "{e}"
    );
    assert_eq!(stats(&rig), before);
    rt.close();
}

#[test]
fn a_wrong_hash_is_refused_only_under_validate_hash() {
    let mut bytes = neff_bytes("matmul_small");
    bytes[0xAC] ^= 1;
    let rig = Rig::with(Arch::Trn2, 2);
    let rt = rig.runtime(RuntimeConfig {
        validate_hash: true,
        ..config(2)
    });
    let before = stats(&rig);
    let e = rt.load(&bytes, 0).unwrap_err();
    assert_eq!(e.status, NrtStatus::Invalid, "{e}");
    assert!(e.message.contains("hash"), "{e}");
    assert_eq!(stats(&rig), before);
    let h = rt
        .load(&neff_bytes("matmul_small"), 0)
        .expect("the real hash");
    rt.unload(h).unwrap();
    rt.close();
    let (_rig, rt) = trn2_lnc2();
    let h = rt.load(&bytes, 0).expect("no hash check by default");
    rt.unload(h).unwrap();
    rt.close();
}

#[test]
fn two_neffs_share_the_dynamic_queues_and_a_failed_load_frees_everything() {
    let (rig, rt) = trn2_lnc2();
    let baseline = stats(&rig);
    let a = rt.load(&neff_bytes("matmul_small"), 0).unwrap();
    let one = stats(&rig);
    let b = rt.load(&neff_bytes("matmul_small"), 0).unwrap();
    assert_eq!(stats(&rig).dma_queues, one.dma_queues, "queues shared");
    rt.unload(a).unwrap();
    assert_eq!(stats(&rig).dma_queues, one.dma_queues, "still used by b");
    rt.unload(b).unwrap();
    assert_eq!(stats(&rig), baseline);
    // A container's I/O ring on (4, 0) of NC 1: the NEFF's queues collide there after its
    // chunks are allocated, and the load gives everything back.
    let mut c = crate::builder::identity(64);
    c.sg_count = 2;
    c.tpbs.push(c.tpbs[0].clone());
    for t in &mut c.tpbs {
        t.io_rings[0].engine = 4;
        t.io_rings[0].queue = 0;
    }
    let ch = crate::test_support::load(&rt, &c, 0);
    let with_container = stats(&rig);
    let e = rt.load(&neff_bytes("matmul_small"), 0).unwrap_err();
    assert_eq!(e.status, NrtStatus::Invalid, "{e}");
    assert!(e.message.contains("(4, 0)"), "{e}");
    assert_eq!(
        stats(&rig),
        with_container,
        "the failed load freed all it took"
    );
    rt.unload(ch).unwrap();
    rt.close();
}

#[test]
fn bind_checks_names_and_sizes_against_the_neff_io() {
    let (_rig, rt) = trn2_lnc2();
    let h: ModelHandle = rt.load(&neff_bytes("matmul_small"), 0).unwrap();
    let (_t, ins, _) = small_io(&rt);
    let small = rt
        .tensor_allocate(Placement::Device { vnc: 0 }, 100, "o")
        .unwrap();
    let mut outs = TensorSet::new();
    outs.add("output0", &small);
    let e = rt.execute(h, &ins, &outs).unwrap_err();
    assert_eq!(e.status, NrtStatus::Invalid);
    assert!(e.message.contains("\"output0\" is 100 bytes"), "{e}");
    rt.unload(h).unwrap();
    rt.close();
}

#[test]
fn plan_refuses_what_does_not_fit_naming_it() {
    let info = Rig::with(Arch::Trn2, 2).backend.info().clone();
    let shape = VncShape {
        vnc: 0,
        ncs: &[0, 1],
        dge_copies: 4,
    };
    let base = parsed("matmul_small");
    let refused = |edit: &dyn Fn(&mut neff::Neff)| {
        let mut n = base.clone();
        edit(&mut n);
        neff_load::plan(&n, &info, &shape).unwrap_err().message
    };
    let e = refused(&|n| n.subgraphs[1].dma_queues[0].semaphores[3] = 248);
    assert!(e.contains("\"qPoolDynamic\" uses semaphore 248"), "{e}");
    let e = refused(&|n| {
        if let Some(v) = n.subgraphs[0].vars.get_mut("DGETable0") {
            v.kind = neff::VarKind::DgeTable { list: vec![1, 4] };
        }
    });
    assert!(e.contains("not an input or output"), "{e}");
    let e = refused(&|n| n.subgraphs[0].state_buffer_reservations[0].offset = 229_376);
    assert!(e.contains("does not fit the trn2 SBUF"), "{e}");
    let e = refused(&|n| n.inputs[0].shape[0] = 1 << 32);
    assert!(e.contains("dimension 4294967296"), "{e}");
    // The real reservation (the top 8 bytes of a 224 KiB partition) fits trn2.
    assert!(neff_load::plan(&base, &info, &shape).is_ok());
}
