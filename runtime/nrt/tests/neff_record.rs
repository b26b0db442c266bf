//! `nrt neff record` through the real binary: a golden file of `matmul_small` recorded on a
//! private simdev (trn2, LNC=2), read back with the safetensors crate: 10 executions of every
//! input and output with the NEFF's dtypes and shapes, outputs the shape-only function of the
//! inputs, replayed exactly by simdev's golden reference (an unrecorded input names the closest
//! execution); tensors too large for a golden file refused.

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

/// `nrt neff record NEFF --out OUT [extra...]` at LNC=2 on a private trn2 simdev.
fn record(neff: &str, out: &std::path::Path, extra: &[&str]) -> Output {
    let mut args = vec!["neff", "record", neff, "--out", out.to_str().unwrap()];
    args.extend(extra);
    nrt(&args, &LNC2)
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
    let o = record(&small, &out, &[]);
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
        // Random fp16 inputs are numbers: no NaN, no infinity (exponent field all ones), no
        // zero or subnormal (exponent field 0) — a golden file of NaNs would catch nothing.
        for name in &inputs {
            let data = file.tensor(&format!("{k}/in/{name}")).unwrap().data();
            for h in data.chunks_exact(2) {
                let exponent = (u16::from_le_bytes([h[0], h[1]]) >> 10) & 0x1f;
                assert!(
                    (1..0x1f).contains(&exponent),
                    "execution {k} input {name}: fp16 {h:02x?} is not a normal number"
                );
            }
        }
        previous_x = x;
    }
    // simdev opens it as the NEFF's golden reference and replays every execution exactly.
    let golden = simdev::reference::golden::Golden::open(&out, &neff).unwrap();
    assert_eq!(golden.executions(), 10);
    let device = Replay::new(&neff);
    for k in (0..10).rev() {
        for name in &inputs {
            device.write(name, file.tensor(&format!("{k}/in/{name}")).unwrap().data());
        }
        golden.run(&device.tensors).unwrap();
        assert!(
            device.read("output0") == file.tensor(&format!("{k}/out/output0")).unwrap().data(),
            "execution {k} replayed exactly"
        );
    }
    let mut x = file.tensor("4/in/x").unwrap().data().to_vec();
    x[100] ^= 0x80;
    device.write("x", &x);
    device.write("y", file.tensor("4/in/y").unwrap().data());
    let err = golden.run(&device.tensors).unwrap_err();
    assert!(
        err.contains("closest is execution 4: input \"x\" differs first at byte 100 of 65536"),
        "{err}"
    );
    // Bound as the NEFF's reference, a recording of shape-only outputs replays them, and the
    // report says they are shape-only, not the NEFF's numbers.
    let binding = format!("{small}={}", out.display());
    let mut env = LNC2.to_vec();
    env.push(("NEURON_SIMDEV_REFERENCE", &binding));
    let o = nrt(
        &["bench", "--neff", &small, "--iterations", "2", "--json"],
        &env,
    );
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let report: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(report["outputs"], "shape-only", "{report}");
}

/// The NEFF's tensors bound in chunks of an in-memory simdev address space, as simdev binds
/// them for a reference.
struct Replay {
    _space: simdev::memory::AddressSpace,
    tensors: Vec<simdev::reference::BoundTensor>,
}

impl Replay {
    fn new(neff: &neff::Neff) -> Self {
        let mut space = simdev::memory::AddressSpace::new(shared::address_map::AddressMap {
            arch: shared::address_map::Arch::Trn2,
            nc_count: 1,
            hbm_bytes_per_nc: 16 << 20,
        });
        let tensors = neff
            .inputs
            .iter()
            .map(|t| (t, true))
            .chain(neff.outputs.iter().map(|t| (t, false)))
            .map(|(t, input)| simdev::reference::BoundTensor {
                name: t.name.clone(),
                dtype: t.dtype,
                shape: t.shape.clone(),
                input,
                chunk: space
                    .allocate(
                        simdev::client::ClientId(1),
                        simdev::memory::Region::Hbm(0),
                        t.size,
                        0,
                    )
                    .unwrap(),
                offset: 0,
                size: t.size,
            })
            .collect();
        Self {
            _space: space,
            tensors,
        }
    }

    fn tensor(&self, name: &str) -> &simdev::reference::BoundTensor {
        self.tensors.iter().find(|t| t.name == name).unwrap()
    }

    fn write(&self, name: &str, bytes: &[u8]) {
        let t = self.tensor(name);
        t.chunk.memory().write(t.chunk.pa(), bytes).unwrap();
    }

    fn read(&self, name: &str) -> Vec<u8> {
        let t = self.tensor(name);
        let mut v = vec![0; usize::try_from(t.size).unwrap()];
        t.chunk.memory().read(t.chunk.pa(), &mut v).unwrap();
        v
    }
}

#[test]
fn record_refuses_tensors_a_golden_file_cannot_hold_whole() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("large.safetensors");
    let o = record(&neff_path("matmul_large"), &out, &[]);
    assert!(!o.status.success());
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains("input \"y\" is 4294967296 bytes") && err.contains("256 MiB"),
        "{err}"
    );
    assert!(!out.exists(), "nothing written");
    let o = record(&neff_path("matmul_small"), &out, &["--executions", "0"]);
    assert!(!o.status.success());
    assert!(String::from_utf8_lossy(&o.stderr).contains("--executions must be at least 1"));
}

#[test]
fn record_into_a_missing_directory_or_a_directory_is_refused_before_anything_runs() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("absent").join("g.safetensors");
    let neff = neff_path("matmul_small");
    // No trn2 asked for: had anything been loaded, the LNC=2 refusal would come first.
    for (out, says) in [
        (
            missing.clone(),
            format!(
                "--out {}: directory {} does not exist",
                missing.display(),
                dir.path().join("absent").display()
            ),
        ),
        (
            dir.path().to_path_buf(),
            format!("--out {}: is a directory", dir.path().display()),
        ),
    ] {
        let o = nrt(
            &["neff", "record", &neff, "--out", out.to_str().unwrap()],
            &[],
        );
        let stderr = String::from_utf8_lossy(&o.stderr);
        assert!(!o.status.success(), "{stderr}");
        assert!(
            stderr.contains(&says) && !stderr.contains("LNC"),
            "{stderr}"
        );
    }
}
