//! The reader against the two real NEFFs (`scenarios/data/neff/`) and against every way a file
//! can be damaged.

use super::*;

pub(crate) fn real(name: &str) -> Vec<u8> {
    let path = format!(
        "{}/../scenarios/data/neff/{name}",
        env!("CARGO_MANIFEST_DIR")
    );
    std::fs::read(&path).unwrap_or_else(|e| panic!("{path}: {e}"))
}

fn parse(bytes: &[u8]) -> Result<Neff, NeffError> {
    Neff::parse(bytes, &ParseOptions::default())
}

fn io(name: &str, dtype: DType, shape: &[u64]) -> IoTensor {
    IoTensor {
        name: name.into(),
        dtype,
        shape: shape.to_vec(),
        size: shape.iter().product::<u64>() * dtype.size(),
    }
}

#[test]
fn matmul_small_parses_with_the_issue_facts() {
    let neff = parse(&real("matmul_small.neff")).unwrap();
    assert_eq!(neff.hash, HashVerdict::NotChecked);
    assert_eq!(neff.lnc_size(), 2);
    assert_eq!(neff.header.num_tpb, 1);
    assert_eq!(
        (
            neff.header.neff_version_major,
            neff.header.neff_version_minor
        ),
        (2, 0)
    );
    assert_eq!(neff.header.feature_bits, 0x20_9c00);
    assert_eq!(neff.name(), "file.neff");
    assert_eq!(neff.uuid_hex(), "00a04c535fd94f07bffdd5eacdefc852");
    assert_eq!(neff.tool_version, "2.23.6484.0+3b612583");
    assert_eq!(neff.target, "cayman");
    assert_eq!(
        neff.inputs,
        [
            io("x", DType::F16, &[128, 256]),
            io("y", DType::F16, &[256, 128])
        ]
    );
    assert_eq!(neff.outputs, [io("output0", DType::F16, &[128, 128])]);
    assert_eq!(neff.subgraphs.len(), 2);
    for (i, sg) in neff.subgraphs.iter().enumerate() {
        assert_eq!(sg.name, format!("sg0{i}"));
        assert_eq!(sg.records(), [12, 5, 7, 2, 3], "{}", sg.name);
        assert_eq!(sg.streams[0].member, format!("sg0{i}/PE.bin"));
        assert_eq!(
            sg.dma_queues,
            [
                DmaQueueSet {
                    name: "qPoolDynamic".into(),
                    kind: "dynamic".into(),
                    owner: "pool".into(),
                    num_queues: 16,
                    semaphores: (24..40).collect(),
                },
                DmaQueueSet {
                    name: "qSPDynamicHW".into(),
                    kind: "dynamic".into(),
                    owner: "sp".into(),
                    num_queues: 16,
                    semaphores: (8..24).collect(),
                },
            ]
        );
        let kinds: Vec<_> = sg
            .vars
            .values()
            .map(|v| (v.name.as_str(), v.var_id, v.size, v.kind.type_name()))
            .collect();
        assert_eq!(
            kinds,
            [
                ("DGETable0", 5, 0, "dge-table"),
                ("SB", 0, 0, "state-buffer"),
                ("identity_82_sg0000", 4, 32768, "file"),
                ("output0", 3, 32768, "output"),
                ("x", 1, 65536, "input"),
                ("y", 2, 65536, "input"),
            ]
        );
        assert_eq!(
            sg.vars["DGETable0"].kind,
            VarKind::DgeTable {
                list: vec![1, 2, 3]
            }
        );
        assert_eq!(sg.constants.len(), 1);
        let c = &sg.constants[0];
        assert_eq!(c.var, "identity_82_sg0000");
        assert_eq!(
            c.member,
            format!("sg0{i}/value_sg0000_identity_82_CRSM.npy")
        );
        assert_eq!(
            (c.dtype, c.shape.as_slice(), c.data.len(), c.alignment),
            (DType::F16, &[128, 128, 1, 1][..], 32768, 32768)
        );
        let act: Vec<_> = sg
            .act_tables
            .iter()
            .map(|t| (t.member.as_str(), t.bytes.len()))
            .collect();
        let p = format!("sg0{i}/");
        assert_eq!(
            act,
            [
                (&*format!("{p}act_info.json"), 15859),
                (&*format!("{p}exp_and_others.json"), 28093),
                (&*format!("{p}exp_and_others_bkt.bin"), 30112),
                (&*format!("{p}exp_and_others_ctrl.bin"), 2848),
            ]
        );
        assert_eq!(sg.dve_tables.len(), 4);
        assert_eq!(
            sg.state_buffer_reservations,
            [StateBufferReservation {
                offset: 229_368,
                base_partition: 0,
                partitions: 128,
                size: 8
            }]
        );
        assert_eq!(
            (sg.runtime_event_count, sg.runtime_semaphore_count),
            (12, 3)
        );
        assert_eq!(sg.features, ["neff_feature_vnc"]);
        let b = sg.device_bytes();
        assert_eq!(b.constants, 32768);
        assert_eq!(b.scratchpad, 0);
        assert_eq!(b.streams, (12 + 5 + 7 + 2 + 3) * 64);
        assert_eq!(
            b.tables,
            15859 + 28093 + 30112 + 2848 + 4096 + 4096 + 16384 + 1024
        );
        assert_eq!(b.io, 65536 * 2 + 32768);
    }
    assert_eq!(neff.device_bytes().io, 65536 * 2 + 32768);
    assert_eq!(
        neff.device_bytes().total(),
        2 * neff.subgraphs[0].device_bytes().total()
    );
}

#[test]
fn matmul_large_parses_with_the_issue_facts() {
    let neff = parse(&real("matmul_large.neff")).unwrap();
    assert_eq!(neff.lnc_size(), 2);
    assert_eq!(
        neff.inputs,
        [
            io("x", DType::F16, &[128, 32768]),
            io("y", DType::F16, &[32768, 65536])
        ]
    );
    assert_eq!(neff.inputs[1].size, 4 << 30);
    assert_eq!(neff.outputs, [io("output0", DType::F16, &[128, 65536])]);
    assert_eq!(neff.outputs[0].size, 16 << 20);
    assert_eq!(neff.subgraphs.len(), 2);
    for sg in &neff.subgraphs {
        assert_eq!(sg.records(), [21269, 103, 6873, 1101, 449], "{}", sg.name);
        let virtuals = sg
            .vars
            .values()
            .filter(|v| matches!(v.kind, VarKind::Virtual { .. }));
        assert_eq!(virtuals.clone().count(), 16);
        assert_eq!(virtuals.map(|v| v.size).sum::<u64>(), 8 << 20);
        assert_eq!(sg.device_bytes().scratchpad, 8 << 20);
        assert_eq!(
            sg.vars["DGETable0"].kind,
            VarKind::DgeTable {
                list: vec![1, 2, 3]
            }
        );
        assert_eq!(sg.constants.len(), 1);
    }
}
