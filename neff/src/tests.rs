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
    assert_eq!(
        neff.dge_io_order(),
        (
            vec!["x".to_string(), "y".to_string()],
            vec!["output0".to_string()]
        )
    );
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

// ---- Builders for damaged files ---------------------------------------------------------

/// Every member of a NEFF's tar (debug members too), in archive order.
fn members_of(neff: &[u8]) -> Vec<(String, Vec<u8>)> {
    crate::pack::members(neff).unwrap()
}

/// A tar of `members`.
fn tar_of(members: &[(String, Vec<u8>)]) -> Vec<u8> {
    let mut builder = tar::Builder::new(Vec::new());
    for (name, data) in members {
        let mut h = tar::Header::new_gnu();
        h.set_size(data.len() as u64);
        h.set_mode(0o644);
        h.set_cksum();
        builder.append_data(&mut h, name, &data[..]).unwrap();
    }
    builder.into_inner().unwrap()
}

fn gzip(bytes: &[u8]) -> Vec<u8> {
    use std::io::Write;
    let mut enc = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    enc.write_all(bytes).unwrap();
    enc.finish().unwrap()
}

/// `header_from`'s header with `payload` after it, `data_size` and the hash made right.
fn with_payload(header_from: &[u8], payload: &[u8]) -> Vec<u8> {
    let mut header = NeffHeader::read(header_from).unwrap();
    header.data_size = payload.len() as u64;
    header.hash = header::hash_field(payload);
    let mut out = zerocopy::IntoBytes::as_bytes(&header).to_vec();
    out.extend_from_slice(payload);
    out
}

/// matmul_small with its members edited, repacked with a consistent header.
fn edited(edit: impl FnOnce(&mut Vec<(String, Vec<u8>)>)) -> Vec<u8> {
    let small = real("matmul_small.neff");
    let mut members = members_of(&small);
    edit(&mut members);
    crate::pack::pack(&NeffHeader::read(&small).unwrap(), &members).unwrap()
}

fn replace_member(members: &mut [(String, Vec<u8>)], name: &str, f: impl FnOnce(&mut Vec<u8>)) {
    let (_, data) = members.iter_mut().find(|(n, _)| n == name).unwrap();
    f(data);
}

fn edit_json(name: &str, f: impl FnOnce(&mut serde_json::Value)) -> Vec<u8> {
    edited(|m| {
        replace_member(m, name, |data| {
            let mut v: serde_json::Value = serde_json::from_slice(data).unwrap();
            f(&mut v);
            *data = serde_json::to_vec(&v).unwrap();
        })
    })
}

fn with_header(bytes: &[u8], f: impl FnOnce(&mut NeffHeader)) -> Vec<u8> {
    let mut header = NeffHeader::read(bytes).unwrap();
    f(&mut header);
    let mut out = bytes.to_vec();
    out[..NEFF_HEADER_SIZE].copy_from_slice(zerocopy::IntoBytes::as_bytes(&header));
    out
}

// ---- Header -----------------------------------------------------------------------------

#[test]
fn header_field_offsets_match_the_reference_table() {
    use std::mem::offset_of;
    let table = [
        (offset_of!(NeffHeader, pkg_version), 0x000),
        (offset_of!(NeffHeader, header_size), 0x008),
        (offset_of!(NeffHeader, data_size), 0x010),
        (offset_of!(NeffHeader, neff_version_major), 0x018),
        (offset_of!(NeffHeader, neff_version_minor), 0x020),
        (offset_of!(NeffHeader, neff_build_version), 0x028),
        (offset_of!(NeffHeader, num_tpb), 0x0A8),
        (offset_of!(NeffHeader, hash), 0x0AC),
        (offset_of!(NeffHeader, uuid), 0x0CC),
        (offset_of!(NeffHeader, name), 0x0DC),
        (offset_of!(NeffHeader, requested_tpb_count), 0x1DC),
        (offset_of!(NeffHeader, tpb_per_node), 0x1E0),
        (offset_of!(NeffHeader, feature_bits), 0x220),
        (offset_of!(NeffHeader, lnc_size), 0x228),
        (offset_of!(NeffHeader, pad), 0x22C),
    ];
    for (i, (got, want)) in table.into_iter().enumerate() {
        assert_eq!(got, want, "field {i}");
    }
}

#[test]
fn golden_header_bytes_of_matmul_small() {
    let small = real("matmul_small.neff");
    let mut name = [0u8; 256];
    name[..9].copy_from_slice(b"file.neff");
    let mut tpb_per_node = [0u8; 64];
    tpb_per_node[0] = 1;
    let hex = |s: &str| -> Vec<u8> {
        (0..s.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
            .collect()
    };
    let mut hash = [0u8; 32];
    hash[..16].copy_from_slice(&hex("bcb3e9ef77301698cd8b4cb9471ff5ac"));
    let golden = NeffHeader {
        pkg_version: 2,
        header_size: 1024,
        data_size: 61440,
        neff_version_major: 2,
        neff_version_minor: 0,
        neff_build_version: [0; 128],
        num_tpb: 1,
        hash,
        uuid: hex("00a04c535fd94f07bffdd5eacdefc852").try_into().unwrap(),
        name,
        requested_tpb_count: 1,
        tpb_per_node,
        feature_bits: 0x20_9c00,
        lnc_size: 2,
        pad: [0; 468],
    };
    assert_eq!(
        zerocopy::IntoBytes::as_bytes(&golden),
        &small[..NEFF_HEADER_SIZE]
    );
    // The stored hash is the payload's MD5 with each 32-bit word byte-swapped.
    assert_eq!(
        golden.stored_md5(),
        &hex("efe9b3bc98163077b94c8bcdacf51f47")[..]
    );
    assert!(hash_matches(&small));
    assert!(looks_like_neff(&small));
}

#[test]
fn hash_is_checked_only_when_asked() {
    let small = real("matmul_small.neff");
    let validate = ParseOptions {
        validate_hash: true,
    };
    assert_eq!(
        Neff::parse(&small, &validate).unwrap().hash,
        HashVerdict::Valid
    );
    let bad = with_header(&small, |h| h.hash[3] ^= 1);
    assert!(!hash_matches(&bad));
    let e = Neff::parse(&bad, &validate).unwrap_err();
    let NeffError::HashMismatch { stored, computed } = &e else {
        panic!("{e:?}")
    };
    // Both in digest byte order, 16 bytes: `md5sum` of the payload prints `computed`.
    assert_eq!(computed, "efe9b3bc98163077b94c8bcdacf51f47");
    assert_eq!(stored, "eee9b3bc98163077b94c8bcdacf51f47");
    assert!(e.to_string().contains("eee9b3bc"), "{e}");
    // A non-zero byte where the field's zeros belong is named as such.
    let e = Neff::parse(&with_header(&small, |h| h.hash[20] = 7), &validate).unwrap_err();
    let NeffError::HashMismatch { stored, computed } = &e else {
        panic!("{e:?}")
    };
    assert_eq!(computed, "efe9b3bc98163077b94c8bcdacf51f47");
    assert_eq!(
        stored,
        "efe9b3bc98163077b94c8bcdacf51f47 (and 00000000070000000000000000000000 after it where zeros belong)"
    );
    // Off: accepted, marked not checked.
    assert_eq!(parse(&bad).unwrap().hash, HashVerdict::NotChecked);
    // A changed payload byte with the header's hash kept is refused too.
    let mut changed = small.clone();
    let last = changed.len() - 1;
    changed[last] ^= 0; // padding stays zero: hash still matches
    assert!(hash_matches(&changed));
    changed[NEFF_HEADER_SIZE + 100] ^= 0x40;
    assert!(matches!(
        Neff::parse(&changed, &validate),
        Err(NeffError::HashMismatch { .. })
    ));
}

#[test]
fn header_rules_each_have_their_error() {
    let small = real("matmul_small.neff");
    let e = parse(&with_header(&small, |h| h.header_size = 2048)).unwrap_err();
    assert!(matches!(e, NeffError::HeaderSize { found: 2048 }), "{e:?}");
    for pkg in [0, 3] {
        let e = parse(&with_header(&small, |h| h.pkg_version = pkg)).unwrap_err();
        assert!(
            matches!(e, NeffError::PkgVersion { found } if found == pkg),
            "{e:?}"
        );
    }
    let _ = parse(&with_header(&small, |h| h.pkg_version = 1)).unwrap();
    let e = parse(&with_header(&small, |h| {
        h.neff_version_major = 3;
        h.neff_version_minor = 1;
    }))
    .unwrap_err();
    assert!(
        matches!(e, NeffError::UnsupportedVersion { major: 3, minor: 1 }),
        "{e:?}"
    );
    assert!(e.to_string().contains("3.1"), "{e}");
    for lnc in [0, 3, u32::MAX] {
        let e = parse(&with_header(&small, |h| h.lnc_size = lnc)).unwrap_err();
        assert!(
            matches!(e, NeffError::HeaderField { field: "lnc_size", value, .. } if value == u64::from(lnc)),
            "{e:?}"
        );
        assert!(e.to_string().contains("lnc_size"), "{e}");
    }
    assert_eq!(
        parse(&with_header(&small, |h| h.lnc_size = 1))
            .unwrap()
            .lnc_size(),
        1
    );
    for tpb in [0, 65] {
        let e = parse(&with_header(&small, |h| h.num_tpb = tpb)).unwrap_err();
        assert!(
            matches!(
                e,
                NeffError::HeaderField {
                    field: "num_tpb",
                    ..
                }
            ),
            "{e:?}"
        );
    }
    for data_size in [0, 61439, 61441, u64::MAX] {
        let e = parse(&with_header(&small, |h| h.data_size = data_size)).unwrap_err();
        assert!(
            matches!(e, NeffError::DataSize { data_size: d, actual: 61440 } if d == data_size),
            "{e:?}"
        );
        assert!(e.to_string().contains(&format!("{data_size}")) && e.to_string().contains("61440"));
    }
}

#[test]
fn truncation_at_every_section_boundary_is_refused() {
    let small = real("matmul_small.neff");
    let len = small.len();
    // Inside the header.
    for cut in [0, 1, 8, 0xA8, 0x22C, 1023] {
        let e = parse(&small[..cut]).unwrap_err();
        assert!(
            matches!(e, NeffError::TooShort { len } if len == cut),
            "{cut}: {e:?}"
        );
        assert!(!looks_like_neff(&small[..cut]));
    }
    // At and after the header, data_size no longer matches.
    for cut in [
        1024,
        1025,
        1024 + 10,
        1024 + 30_000,
        len - 7839 - 1,
        len - 1,
    ] {
        let e = parse(&small[..cut]).unwrap_err();
        assert!(
            matches!(e, NeffError::DataSize { data_size: 61440, actual } if actual == (cut - 1024) as u64),
            "{cut}: {e:?}"
        );
        assert!(!looks_like_neff(&small[..cut]));
    }
    // The same cuts with data_size made consistent: the gzip stream is cut short.
    let gzip_end = len - 7839; // the rest is zero padding
    for cut in [
        1024,
        1025,
        1024 + 10,
        1024 + 30_000,
        gzip_end - 8,
        gzip_end - 1,
    ] {
        let cut_file = with_header(&small[..cut], |h| h.data_size = (cut - 1024) as u64);
        let e = parse(&cut_file).unwrap_err();
        assert!(matches!(e, NeffError::Gzip { .. }), "{cut}: {e:?}");
    }
    // Cut inside the zero padding only: still a whole NEFF.
    let padded = with_header(&small[..gzip_end + 1], |h| {
        h.data_size = (gzip_end + 1 - 1024) as u64
    });
    parse(&padded).unwrap();
}

// ---- Payload ----------------------------------------------------------------------------

#[test]
fn corrupted_gzip_is_refused() {
    let small = real("matmul_small.neff");
    for at in [1024, 1024 + 3, 1024 + 5000, 1024 + 40_000] {
        let mut bad = small.clone();
        bad[at] ^= 0x55;
        let e = parse(&bad).unwrap_err();
        assert!(matches!(e, NeffError::Gzip { .. }), "{at}: {e:?}");
    }
    // Not zero padding after the stream.
    let mut bad = small.clone();
    let last = bad.len() - 1;
    bad[last] = 1;
    assert!(matches!(
        parse(&bad),
        Err(NeffError::TrailingBytes { count: 7839 })
    ));
}

#[test]
fn payload_caps_are_enforced_by_name() {
    let small = real("matmul_small.neff");
    let opts = ParseOptions::default();
    let e = Neff::parse_with_limits(
        &small,
        &opts,
        &Limits {
            max_unpacked_bytes: 100_000,
            ..Limits::DEFAULT
        },
    )
    .unwrap_err();
    assert!(
        matches!(
            e,
            NeffError::Limit {
                what: "unpacked bytes",
                cap: 100_000
            }
        ),
        "{e:?}"
    );
    assert!(e.to_string().contains("100000"), "{e}");
    let e = Neff::parse_with_limits(
        &small,
        &opts,
        &Limits {
            max_members: 10,
            ..Limits::DEFAULT
        },
    )
    .unwrap_err();
    assert!(
        matches!(
            e,
            NeffError::Limit {
                what: "tar members",
                cap: 10
            }
        ),
        "{e:?}"
    );
    // A zip bomb: 64 MiB of zeros in a small payload, refused under a 16 MiB cap without
    // unpacking it all.
    let bomb = with_payload(&small, &gzip(&vec![0u8; 64 << 20]));
    assert!(bomb.len() < 1 << 20);
    let e = Neff::parse_with_limits(
        &bomb,
        &opts,
        &Limits {
            max_unpacked_bytes: 16 << 20,
            ..Limits::DEFAULT
        },
    )
    .unwrap_err();
    assert!(
        matches!(
            e,
            NeffError::Limit {
                what: "unpacked bytes",
                ..
            }
        ),
        "{e:?}"
    );
    // Not a tar.
    let e = parse(&with_payload(&small, &gzip(b"not a tar archive at all"))).unwrap_err();
    assert!(
        matches!(e, NeffError::Tar { .. } | NeffError::MissingMember { .. }),
        "{e:?}"
    );
}

/// A real NEFF with one unused member of 160 MiB of zeros (a few hundred KiB compressed) is
/// refused by the ratio cap under the default caps, without holding the whole member: the
/// unpacking stops once 100 bytes per compressed byte have inflated. An all-zero member that
/// fits the ratio loads.
#[test]
fn an_unused_member_inflating_far_beyond_its_compressed_size_is_refused() {
    let bomb = edited(|m| m.push(("sg00/padding.bin".into(), vec![0u8; 160 << 20])));
    assert!(bomb.len() < 1 << 20, "{}", bomb.len());
    let e = parse(&bomb).unwrap_err();
    let payload = (bomb.len() - NEFF_HEADER_SIZE) as u64;
    assert!(
        matches!(e, NeffError::Limit { cap, .. }
            if cap == (payload::MAX_RATIO * payload).max(payload::RATIO_FREE) && cap < 160 << 20),
        "{e:?}"
    );
    assert!(e.to_string().contains("100 per compressed byte"), "{e}");
    let fine = edited(|m| m.push(("sg00/padding.bin".into(), vec![0u8; 1 << 20])));
    parse(&fine).unwrap();
}

#[test]
fn missing_members_are_named() {
    for gone in [
        "neff.json",
        "info.json",
        "kelf-0.json",
        "sg01/def.json",
        "sg00/Pool.bin",
        "sg00/DVE.json",
        "sg01/value_sg0000_identity_82_CRSM.npy",
        "sg00/exp_and_others_bkt.bin",
        "sg00/act_info.json",
        "sg01/default_opcode_table.bin",
    ] {
        let e = parse(&edited(|m| m.retain(|(n, _)| n != gone))).unwrap_err();
        assert!(
            matches!(&e, NeffError::MissingMember { member } if member == gone),
            "{gone}: {e:?}"
        );
        assert!(e.to_string().contains(gone), "{e}");
    }
    // Without tensor_map.json the output has no dtype/shape (neff.json's outputs are empty).
    let e = parse(&edited(|m| m.retain(|(n, _)| n != "sg00/tensor_map.json"))).unwrap_err();
    assert!(
        matches!(&e, NeffError::Io { tensor, .. } if tensor == "output0"),
        "{e:?}"
    );
    // A member twice.
    let e = parse(&edited(|m| {
        let dup = m.iter().find(|(n, _)| n == "info.json").unwrap().clone();
        m.push(dup);
    }))
    .unwrap_err();
    assert!(
        matches!(&e, NeffError::DuplicateMember { member } if member == "info.json"),
        "{e:?}"
    );
}

#[test]
fn stream_not_whole_records_is_named() {
    let e = parse(&edited(|m| replace_member(m, "sg01/SP.bin", |d| d.push(0)))).unwrap_err();
    assert!(
        matches!(&e, NeffError::StreamLength { member, len: 193 } if member == "sg01/SP.bin"),
        "{e:?}"
    );
}

/// A JSON member, an edit of it, and the field the error must name.
type JsonCase = (&'static str, fn(&mut serde_json::Value), &'static str);

#[test]
fn bad_json_names_member_and_field() {
    let e = parse(&edited(|m| {
        replace_member(m, "sg00/def.json", |d| d.truncate(100))
    }))
    .unwrap_err();
    assert!(
        matches!(&e, NeffError::Json { member, .. } if member == "sg00/def.json"),
        "{e:?}"
    );
    let cases: [JsonCase; 6] = [
        (
            "sg00/def.json",
            |v| {
                v.as_object_mut().unwrap().remove("var");
            },
            "var",
        ),
        (
            "sg00/def.json",
            |v| v["var"]["x"]["size"] = "big".into(),
            "var.x.size",
        ),
        (
            "sg01/def.json",
            |v| v["dma_queue"]["qSPDynamicHW"]["num_queues"] = (-1).into(),
            "dma_queue.qSPDynamicHW.num_queues",
        ),
        (
            "kelf-0.json",
            |v| v["graphs"][1]["definition"] = 7.into(),
            "graphs[1].definition",
        ),
        (
            "info.json",
            |v| {
                v.as_object_mut().unwrap().remove("tool_version");
            },
            "tool_version",
        ),
        (
            "sg00/act_info.json",
            |v| v["act_func_sets"][0]["bkt_bin"] = serde_json::Value::Null,
            "act_func_sets[0].bkt_bin",
        ),
    ];
    for (member, f, field) in cases {
        let e = parse(&edit_json(member, f)).unwrap_err();
        assert!(
            matches!(&e, NeffError::Json { member: m, .. } if m == member),
            "{member}: {e:?}"
        );
        assert!(e.to_string().contains(field), "{member}: {e}");
    }
}

#[test]
fn semantic_field_errors_name_member_and_field() {
    let cases: [JsonCase; 7] = [
        (
            "sg00/def.json",
            |v| v["var"]["x"]["type"] = "weird".into(),
            "var.x.type",
        ),
        (
            "sg00/def.json",
            |v| {
                v["var"]["x"].as_object_mut().unwrap().remove("size");
            },
            "var.x.size",
        ),
        (
            "sg00/def.json",
            |v| v["var"]["y"]["var_id"] = 1.into(),
            "var.y.var_id",
        ),
        (
            "sg00/def.json",
            |v| v["var"]["DGETable0"]["list"] = serde_json::json!([1, 2, 4]),
            "var.DGETable0.list",
        ),
        (
            "sg00/def.json",
            |v| v["var"]["identity_82_sg0000"]["alignment"] = 3.into(),
            "var.identity_82_sg0000.alignment",
        ),
        (
            "sg00/def.json",
            |v| {
                v["var"]["identity_82_sg0000"]
                    .as_object_mut()
                    .unwrap()
                    .remove("file_name");
            },
            "var.identity_82_sg0000.file_name",
        ),
        (
            "sg00/Activation.json",
            |v| v["activation_function_sets"] = serde_json::json!(["nope"]),
            "activation_function_sets",
        ),
    ];
    for (member, f, field) in cases {
        let e = parse(&edit_json(member, f)).unwrap_err();
        assert!(
            matches!(&e, NeffError::Field { member: m, field: fl, .. } if m == member && fl == field),
            "{member} {field}: {e:?}"
        );
    }
    // A virtual var whose backing offset + size overflows.
    let e = parse(&edit_json("sg00/def.json", |v| {
        v["var"]["tmp"] = serde_json::json!({"type": "virtual", "var_id": 9, "size": 2, "backing_variable_off": u64::MAX});
    }))
    .unwrap_err();
    assert!(
        matches!(&e, NeffError::Field { field, .. } if field == "var.tmp.backing_variable_off"),
        "{e:?}"
    );
}

#[test]
fn io_disagreements_are_refused() {
    // A size that is not shape × width.
    let e = parse(&edit_json("sg00/def.json", |v| {
        v["var"]["x"]["size"] = 65538.into()
    }))
    .unwrap_err();
    assert!(
        matches!(&e, NeffError::Io { tensor, .. } if tensor == "x"),
        "{e:?}"
    );
    // Subgraphs disagreeing on an output's size (sg00 consistent with tensor_map, sg01 not).
    let e = parse(&edit_json("sg01/def.json", |v| {
        v["var"]["output0"]["size"] = 16.into()
    }))
    .unwrap_err();
    assert!(
        matches!(&e, NeffError::Io { tensor, .. } if tensor == "output0"),
        "{e:?}"
    );
    assert!(e.to_string().contains("sg01"), "{e}");
    // A signature input the subgraph lacks.
    let e = parse(&edit_json("neff.json", |v| {
        v["metadata"]["signatures"]["default"]["inputs"]["z"] =
            serde_json::json!({"id": 2, "dtype": "float16", "shape": [1]});
    }))
    .unwrap_err();
    assert!(
        matches!(&e, NeffError::Io { tensor, .. } if tensor == "z"),
        "{e:?}"
    );
    // A dtype with no nrt_dtype_t.
    let e = parse(&edit_json("neff.json", |v| {
        v["metadata"]["signatures"]["default"]["inputs"]["x"]["dtype"] = "complex64".into();
    }))
    .unwrap_err();
    assert!(e.to_string().contains("complex64"), "{e}");
    // Signature order decides the inputs' order.
    let neff = parse(&edit_json("neff.json", |v| {
        v["metadata"]["signatures"]["default"]["inputs"]["x"]["id"] = 5.into();
    }))
    .unwrap();
    assert_eq!(
        neff.inputs
            .iter()
            .map(|t| t.name.as_str())
            .collect::<Vec<_>>(),
        ["y", "x"]
    );
}

#[test]
fn constant_disagreeing_with_its_var_is_refused() {
    let npy = "sg00/value_sg0000_identity_82_CRSM.npy";
    let e = parse(&edited(|m| {
        replace_member(m, npy, |d| d.truncate(d.len() - 2))
    }))
    .unwrap_err();
    assert!(
        matches!(&e, NeffError::Npy { member, .. } if member == npy),
        "{e:?}"
    );
    let e = parse(&edit_json("sg00/def.json", |v| {
        v["var"]["identity_82_sg0000"]["size"] = 16.into()
    }))
    .unwrap_err();
    assert!(
        matches!(&e, NeffError::Npy { member, problem } if member == npy && problem.contains("size 16")),
        "{e:?}"
    );
    let e = parse(&edited(|m| replace_member(m, npy, |d| d[0] = b'X'))).unwrap_err();
    assert!(e.to_string().contains("magic"), "{e}");
}

// ---- No byte sequence panics ------------------------------------------------------------

/// xorshift64*: a deterministic stream without a rand crate.
struct XorShift(u64);

impl XorShift {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    fn below(&mut self, n: usize) -> usize {
        usize::try_from(self.next() % n as u64).unwrap()
    }
}

/// Runs `check` on every item of `work` over the machine's cores; returns (ok, err) counts.
fn in_parallel<T: Sync>(work: &[T], check: impl Fn(&T) -> bool + Sync) -> (usize, usize) {
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    let chunk = work.len().div_ceil(threads);
    let ok: usize = std::thread::scope(|s| {
        let handles: Vec<_> = work
            .chunks(chunk)
            .map(|c| s.spawn(|| c.iter().filter(|w| check(w)).count()))
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).sum()
    });
    (ok, work.len() - ok)
}

#[test]
fn ten_thousand_single_byte_mutations_never_panic() {
    let small = real("matmul_small.neff");
    let mut rng = XorShift(0x6e65_6666_2d31_3421);
    // Half the mutations in the header, half anywhere: the header's fields are where
    // decisions are taken, the payload is where most bytes are.
    let mutations: Vec<(usize, u8)> = (0..10_000)
        .map(|i| {
            let at = if i % 2 == 0 {
                rng.below(NEFF_HEADER_SIZE)
            } else {
                rng.below(small.len())
            };
            (at, u8::try_from(rng.next() & 0xff).unwrap())
        })
        .collect();
    let start = std::time::Instant::now();
    let (ok, err) = in_parallel(&mutations, |&(at, byte)| {
        let mut file = small.clone();
        file[at] = byte;
        let _ = looks_like_neff(&file);
        if at < NEFF_HEADER_SIZE {
            let _ = hash_matches(&file);
        }
        Neff::parse(&file, &ParseOptions::default()).is_ok()
    });
    eprintln!(
        "10,000 mutations: {ok} parsed, {err} refused, {:?}",
        start.elapsed()
    );
    assert!(ok > 0 && err > 0, "{ok} ok {err} err");
}

#[test]
fn ten_thousand_mutations_of_the_unpacked_tar_never_panic() {
    // Mutating the compressed file mostly hits the gzip CRC; this reaches the tar, JSON and
    // .npy readers behind it by mutating the tar itself (without the debug members) and
    // reading it as the parser does after gunzip.
    let small = real("matmul_small.neff");
    let header = NeffHeader::read(&small).unwrap();
    let mut members = members_of(&small);
    members.retain(|(n, _)| {
        !n.contains("debug_info") && !n.ends_with(".dbg") && !n.contains("hlo_stats")
    });
    let tar = tar_of(&members);
    // Where parsing happens: the tar headers and the first 4 KiB of each JSON and .npy member.
    let mut ranges = Vec::new();
    for entry in tar::Archive::new(&tar[..]).entries().unwrap() {
        let entry = entry.unwrap();
        let name = entry.path().unwrap().to_string_lossy().into_owned();
        if name.ends_with(".json") || name.ends_with(".npy") {
            let start = usize::try_from(entry.raw_file_position()).unwrap();
            ranges.push((
                start - 512,
                start + usize::try_from(entry.size()).unwrap().min(4096),
            ));
        }
    }
    let mut rng = XorShift(0x7461_722d_6d75_7421);
    let mutations: Vec<(usize, u8)> = (0..10_000)
        .map(|_| {
            let (lo, hi) = ranges[rng.below(ranges.len())];
            (
                lo + rng.below(hi - lo),
                u8::try_from(rng.next() & 0xff).unwrap(),
            )
        })
        .collect();
    let start = std::time::Instant::now();
    let (ok, err) = in_parallel(&mutations, |&(at, byte)| {
        let mut t = tar.clone();
        t[at] = byte;
        payload::untar(&t[..], &Limits::DEFAULT)
            .and_then(|m| Neff::from_members(header, HashVerdict::NotChecked, &m))
            .is_ok()
    });
    eprintln!(
        "10,000 tar mutations: {ok} parsed, {err} refused, {:?}",
        start.elapsed()
    );
    assert!(ok > 0 && err > 0, "{ok} ok {err} err");
}

#[test]
fn the_fuzz_seed_is_a_whole_neff_tar() {
    // fuzz/seeds/neff/small_trimmed.tar: matmul_small's members with the opaque ones trimmed;
    // the fuzz target wraps it in a header and gzip as this test does, so it reaches every
    // reader.
    let path = format!(
        "{}/../fuzz/seeds/neff/small_trimmed.tar",
        env!("CARGO_MANIFEST_DIR")
    );
    let tar = std::fs::read(path).unwrap();
    let neff = Neff::parse(
        &with_payload(&real("matmul_small.neff"), &gzip(&tar)),
        &ParseOptions {
            validate_hash: true,
        },
    )
    .unwrap();
    assert_eq!(neff.subgraphs.len(), 2);
    assert_eq!(neff.outputs[0].name, "output0");
    assert_eq!(neff.subgraphs[0].records(), [2, 2, 2, 2, 2]);
}
