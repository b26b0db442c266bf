//! `nrt neff info` through the real binary on the two real NEFFs (`scenarios/data/neff/`):
//! the `--json` figures, the text report, and refusals of damaged files.

use std::path::PathBuf;
use std::process::{Command, Output};

fn neff_path(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../scenarios/data/neff")
        .join(name)
}

fn nrt(args: &[&std::ffi::OsStr]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_nrt"))
        .args(args)
        .output()
        .expect("nrt runs")
}

fn info_json(path: &std::path::Path) -> serde_json::Value {
    let out = nrt(&[
        "neff".as_ref(),
        "info".as_ref(),
        path.as_os_str(),
        "--json".as_ref(),
    ]);
    assert!(
        out.status.success(),
        "nrt neff info {}: {}",
        path.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("one JSON object")
}

fn tensor(name: &str, shape: &[u64], bytes: u64) -> serde_json::Value {
    serde_json::json!({
        "name": name, "dtype": "NRT_DTYPE_FLOAT16", "neff_dtype": "float16",
        "shape": shape, "bytes": bytes,
    })
}

#[test]
fn matmul_small_figures() {
    let r = info_json(&neff_path("matmul_small.neff"));
    let h = &r["header"];
    assert_eq!(h["pkg_version"], 2);
    assert_eq!(
        (
            h["neff_version_major"].as_u64(),
            h["neff_version_minor"].as_u64()
        ),
        (Some(2), Some(0))
    );
    assert_eq!(h["lnc_size"], 2);
    assert_eq!(h["num_tpb"], 1);
    assert_eq!(h["feature_bits"], "0x209c00");
    assert_eq!(h["hash"], "valid");
    assert_eq!(h["name"], "file.neff");
    assert_eq!(h["uuid"], "00a04c535fd94f07bffdd5eacdefc852");
    assert_eq!(h["tool_version"], "2.23.6484.0+3b612583");
    assert_eq!(h["target"], "cayman");
    assert_eq!(
        r["inputs"],
        serde_json::json!([
            tensor("x", &[128, 256], 65536),
            tensor("y", &[256, 128], 65536)
        ])
    );
    assert_eq!(
        r["outputs"],
        serde_json::json!([tensor("output0", &[128, 128], 32768)])
    );
    let sgs = r["subgraphs"].as_array().unwrap();
    assert_eq!(sgs.len(), 2);
    for (i, sg) in sgs.iter().enumerate() {
        assert_eq!(sg["name"], format!("sg0{i}"));
        assert_eq!(
            sg["records"],
            serde_json::json!({"PE": 12, "ACT": 5, "POOL": 7, "DVE": 2, "SP": 3})
        );
        assert_eq!(sg["streams"][0]["member"], format!("sg0{i}/PE.bin"));
        assert_eq!(sg["streams"][0]["bytes"], 12 * 64);
        assert_eq!(
            sg["var_bytes_by_kind"],
            serde_json::json!({"dge-table": 0, "file": 32768, "input": 131072, "output": 32768, "state-buffer": 0})
        );
        assert_eq!(sg["constants"][0]["neff_dtype"], "float16");
        assert_eq!(
            sg["constants"][0]["shape"],
            serde_json::json!([128, 128, 1, 1])
        );
        assert_eq!(
            (
                sg["constants"][0]["bytes"].as_u64(),
                sg["constants"][0]["alignment"].as_u64()
            ),
            (Some(32768), Some(32768))
        );
        let queues: Vec<_> = sg["dma_queues"]
            .as_array()
            .unwrap()
            .iter()
            .map(|q| {
                (
                    q["name"].as_str().unwrap(),
                    q["owner"].as_str().unwrap(),
                    q["num_queues"].as_u64().unwrap(),
                    q["semaphores"][0].as_u64().unwrap(),
                )
            })
            .collect();
        assert_eq!(
            queues,
            [
                ("qPoolDynamic", "pool", 16, 24),
                ("qSPDynamicHW", "sp", 16, 8)
            ]
        );
        let b = &sg["device_bytes"];
        assert_eq!(b["constants"], 32768);
        assert_eq!(b["streams"], 29 * 64);
        assert_eq!(b["io"], 163_840);
        assert_eq!(b["total"], 32768 + 29 * 64 + b["tables"].as_u64().unwrap());
    }
    let total = &r["device_bytes"];
    assert_eq!(total["io"], 163_840);
    assert_eq!(
        total["total"].as_u64(),
        Some(2 * sgs[0]["device_bytes"]["total"].as_u64().unwrap())
    );
    assert!(r["execution"].as_str().unwrap().contains("shape-only"));
}

#[test]
fn matmul_large_figures() {
    let r = info_json(&neff_path("matmul_large.neff"));
    assert_eq!(r["header"]["lnc_size"], 2);
    assert_eq!(
        r["inputs"],
        serde_json::json!([
            tensor("x", &[128, 32768], 8 << 20),
            tensor("y", &[32768, 65536], 4 << 30)
        ])
    );
    assert_eq!(
        r["outputs"],
        serde_json::json!([tensor("output0", &[128, 65536], 16 << 20)])
    );
    for sg in r["subgraphs"].as_array().unwrap() {
        assert_eq!(
            sg["records"],
            serde_json::json!({"PE": 21269, "ACT": 103, "POOL": 6873, "DVE": 1101, "SP": 449})
        );
        assert_eq!(sg["vars_by_kind"]["virtual"], 16);
        assert_eq!(sg["var_bytes_by_kind"]["virtual"], 8 << 20);
        assert_eq!(sg["device_bytes"]["scratchpad"], 8 << 20);
        assert_eq!(
            sg["device_bytes"]["streams"],
            (21269 + 103 + 6873 + 1101 + 449) * 64
        );
        assert_eq!(sg["dma_queues"].as_array().unwrap().len(), 3);
    }
    assert_eq!(
        r["device_bytes"]["io"],
        (8 << 20) + (4u64 << 30) + (16 << 20)
    );
}

#[test]
fn text_report_names_the_figures_and_says_shape_only() {
    let out = nrt(&[
        "neff".as_ref(),
        "info".as_ref(),
        neff_path("matmul_small.neff").as_os_str(),
    ]);
    assert!(out.status.success());
    let text = String::from_utf8(out.stdout).unwrap();
    for needle in [
        "lnc_size 2",
        "hash          valid",
        "PE 12, ACT 5, POOL 7, DVE 2, SP 3",
        "NRT_DTYPE_FLOAT16",
        "[128, 256]",
        "semaphores 8-23",
        "shape-only",
        "device memory a load needs",
    ] {
        assert!(text.contains(needle), "{needle:?} not in:\n{text}");
    }
}

#[test]
fn damaged_files_exit_non_zero_naming_the_problem() {
    let small = std::fs::read(neff_path("matmul_small.neff")).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let write = |name: &str, bytes: &[u8]| {
        let p = dir.path().join(name);
        std::fs::write(&p, bytes).unwrap();
        p
    };
    let mut bad_gzip = small.clone();
    bad_gzip[1024 + 5000] ^= 0x55;
    let mut v3 = small.clone();
    v3[0x18] = 3;
    let cases = [
        (
            write("truncated.neff", &small[..5000]),
            "data_size is 61440 bytes but the file has 3976",
        ),
        (
            write("short.neff", &small[..100]),
            "not a NEFF: the file is 100 bytes, shorter than a NEFF's 1024-byte header",
        ),
        (
            write(
                "text.neff",
                &[b"# a README, not a NEFF\n".as_slice(); 64].concat(),
            ),
            "not a NEFF: header_size (bytes 0x8..0x10, little-endian) reads ",
        ),
        (write("gzip.neff", &bad_gzip), "not valid gzip"),
        (write("v3.neff", &v3), "version 3.0 is not supported"),
        (dir.path().join("absent.neff"), "No such file"),
    ];
    for (path, needle) in cases {
        let out = nrt(&[
            "neff".as_ref(),
            "info".as_ref(),
            path.as_os_str(),
            "--json".as_ref(),
        ]);
        assert!(!out.status.success(), "{}", path.display());
        assert!(out.stdout.is_empty());
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            err.contains(needle) && err.contains("nrt neff info"),
            "{needle:?} not in {err}"
        );
    }
    // A wrong hash is reported, not refused (the tool computes the verdict).
    let mut bad_hash = small.clone();
    bad_hash[0xAC] ^= 1;
    let r = info_json(&write("hash.neff", &bad_hash));
    assert_eq!(r["header"]["hash"], "mismatch");
}
