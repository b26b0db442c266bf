//! `nrt neff record` through the real binary: a golden file of `matmul_small` recorded on a
//! private simdev (trn2, LNC=2), read back with the safetensors crate: 10 executions of every
//! input and output with the NEFF's dtypes and shapes, outputs the shape-only function of the
//! inputs; tensors too large for a golden file refused.

use std::collections::HashMap;
use std::process::{Command, Output};

use safetensors::{Dtype, SafeTensors};
use shared::neff_program::shape_only;

fn neff_path(name: &str) -> String {
    format!(
        "{}/../../scenarios/data/neff/{name}.neff",
        env!("CARGO_MANIFEST_DIR")
    )
}

fn nrt(args: &[&str], env: &[(&str, &str)]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_nrt"))
        .args(args)
        .env_remove("NEURON_SIMDEV_SOCKET")
        .env_remove("NEURON_RT_BACKEND")
        .env_remove("NEURON_LOGICAL_NC_CONFIG")
        .env_remove("NEURON_SIMDEV_ARCH")
        .env_remove("NEURON_RT_FUNTIME")
        .envs(env.iter().copied())
        .output()
        .expect("nrt runs")
}

const LNC2: [(&str, &str); 2] = [
    ("NEURON_SIMDEV_ARCH", "trn2"),
    ("NEURON_LOGICAL_NC_CONFIG", "2"),
];

#[test]
fn record_writes_10_executions_of_every_tensor_with_shape_only_outputs() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("matmul_small.safetensors");
    let small = neff_path("matmul_small");
    let o = nrt(
        &["neff", "record", &small, "--out", out.to_str().unwrap()],
        &LNC2,
    );
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert!(
        String::from_utf8_lossy(&o.stdout).contains("10 executions recorded"),
        "{}",
        String::from_utf8_lossy(&o.stdout)
    );
    let neff = neff::Neff::parse(&std::fs::read(&small).unwrap(), &Default::default()).unwrap();
    let bytes = std::fs::read(&out).unwrap();
    let file = SafeTensors::deserialize(&bytes).unwrap();
    let (_, metadata) = SafeTensors::read_metadata(&bytes).unwrap();
    let meta: HashMap<String, String> = metadata.metadata().clone().unwrap();
    assert_eq!(meta["format"], "nrt-golden");
    assert_eq!(meta["version"], "1");
    assert_eq!(meta["executions"], "10");
    assert_eq!(meta["neff_uuid"], neff.uuid_hex());
    assert_eq!(meta["neff_name"], neff.name());
    assert_eq!(meta["source"], "simdev shape-only");
    assert_eq!(file.len(), 30, "10 executions × (x, y, output0)");
    let expect = [
        ("in/x", vec![128, 256]),
        ("in/y", vec![256, 128]),
        ("out/output0", vec![128, 128]),
    ];
    let (inputs, outputs) = neff.dge_io_order();
    assert_eq!(outputs, ["output0"]);
    let mut previous_x = Vec::new();
    for k in 0..10 {
        for (name, shape) in &expect {
            let t = file.tensor(&format!("{k}/{name}")).unwrap();
            assert_eq!(t.dtype(), Dtype::F16, "{k}/{name}");
            assert_eq!(t.shape(), &shape[..], "{k}/{name}");
        }
        let mut seed = shape_only::Seed::default();
        for name in &inputs {
            seed.input_bytes(file.tensor(&format!("{k}/in/{name}")).unwrap().data());
        }
        let output = file.tensor(&format!("{k}/out/output0")).unwrap();
        assert!(
            output.data() == shape_only::expected_output(seed, 0, 128 * 128 * 2),
            "execution {k}: output0 is the shape-only function of its inputs"
        );
        let x = file.tensor(&format!("{k}/in/x")).unwrap().data().to_vec();
        assert_ne!(x, previous_x, "execution {k} has its own inputs");
        previous_x = x;
    }
    // simdev opens it as the NEFF's golden reference.
    let golden = simdev::reference::golden::Golden::open(&out, &neff).unwrap();
    assert_eq!(golden.executions(), 10);
}

#[test]
fn record_refuses_tensors_a_golden_file_cannot_hold_whole() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("large.safetensors");
    let o = nrt(
        &[
            "neff",
            "record",
            &neff_path("matmul_large"),
            "--out",
            out.to_str().unwrap(),
        ],
        &LNC2,
    );
    assert!(!o.status.success());
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains("input \"y\" is 4294967296 bytes") && err.contains("256 MiB"),
        "{err}"
    );
    assert!(!out.exists(), "nothing written");
    let o = nrt(
        &[
            "neff",
            "record",
            &neff_path("matmul_small"),
            "--out",
            out.to_str().unwrap(),
            "--executions",
            "0",
        ],
        &LNC2,
    );
    assert!(!o.status.success());
    assert!(String::from_utf8_lossy(&o.stderr).contains("--executions must be at least 1"));
}
