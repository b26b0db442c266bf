//! Golden-file references (issue 15 item 4) through the real simdev binary: a golden file of 10
//! recorded matmul_small executions bound with `--reference FILE.neff=GOLDEN.safetensors`;
//! replaying the recorded inputs gives exactly the recorded outputs, and an input that was never
//! recorded completes with NRT_EXEC_COMPLETED_WITH_ERR (1004) naming the closest recording.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use runtime::config::RuntimeConfig;
use runtime::{Placement, Runtime, TensorSet};
use shared::NrtStatus;
use shared::neff_program::shape_only::splitmix64;
use simdev::reference::golden::{self, Recorded};
use tests::{connect, start_simdev};

fn neff_path() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../scenarios/data/neff/matmul_small.neff")
}

/// Deterministic bytes: recording `k`, input `salt`.
fn pattern(len: usize, salt: u64, k: u64) -> Vec<u8> {
    (0..len)
        .map(|i| splitmix64(salt << 40 ^ k << 20 ^ (i as u64 / 8)).to_le_bytes()[i % 8])
        .collect()
}

#[test]
fn a_golden_file_replays_its_recorded_outputs_and_names_the_closest_for_a_new_input() {
    let neff_bytes = std::fs::read(neff_path()).unwrap();
    let neff = neff::Neff::parse(&neff_bytes, &neff::ParseOptions::default()).unwrap();
    // Ten recordings whose outputs are arbitrary bytes (not the shape-only function): only a
    // replay can produce them.
    let recorded: Vec<Recorded> = (0..10)
        .map(|k| Recorded {
            inputs: vec![
                ("x".into(), pattern(65536, 1, k)),
                ("y".into(), pattern(65536, 2, k)),
            ],
            outputs: vec![("output0".into(), pattern(32768, 3, k))],
        })
        .collect();
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("matmul_small.safetensors");
    golden::write(&file, &neff, "test", &recorded).unwrap();

    let spec = format!("{}={}", neff_path().display(), file.display());
    let sim = start_simdev(&["--arch", "trn2", "--hbm", "1G", "--reference", &spec]);
    let dev = Arc::new(connect(&sim));
    let cfg = RuntimeConfig {
        lnc: Some(2),
        exec_timeout: Duration::from_secs(30),
        ..RuntimeConfig::default()
    };
    let rt = Runtime::init(dev, cfg).unwrap();
    let h = rt.load(&neff_bytes, 0).unwrap();
    let vnc0 = Placement::Device { vnc: 0 };
    let x = rt.tensor_allocate(vnc0, 65536, "x").unwrap();
    let y = rt.tensor_allocate(vnc0, 65536, "y").unwrap();
    let out = rt.tensor_allocate(vnc0, 32768, "output0").unwrap();
    let (mut ins, mut outs) = (TensorSet::new(), TensorSet::new());
    ins.add("x", &x);
    ins.add("y", &y);
    outs.add("output0", &out);
    // Replayed in another order than recorded: the inputs' content picks the recording.
    for k in [7usize, 0, 9, 3, 3, 1, 2, 4, 5, 6, 8] {
        x.write(&recorded[k].inputs[0].1, 0).unwrap();
        y.write(&recorded[k].inputs[1].1, 0).unwrap();
        rt.execute(h, &ins, &outs).unwrap();
        let mut got = vec![0u8; 32768];
        out.read(&mut got, 0).unwrap();
        assert!(
            got == recorded[k].outputs[0].1,
            "recording {k} replayed exactly"
        );
    }
    // Recording 4's x with one byte of y changed at 1024: never recorded.
    let mut y4 = recorded[4].inputs[1].1.clone();
    y4[1024] ^= 0xFF;
    x.write(&recorded[4].inputs[0].1, 0).unwrap();
    y.write(&y4, 0).unwrap();
    let e = rt.execute(h, &ins, &outs).unwrap_err();
    assert_eq!(e.status, NrtStatus::ExecCompletedWithErr, "{e}");
    // simdev keeps serving:
    x.write(&recorded[5].inputs[0].1, 0).unwrap();
    y.write(&recorded[5].inputs[1].1, 0).unwrap();
    rt.execute(h, &ins, &outs).unwrap();
    let mut got = vec![0u8; 32768];
    out.read(&mut got, 0).unwrap();
    assert!(got == recorded[5].outputs[0].1, "served after the miss");
    rt.unload(h).unwrap();
    rt.close();
    let log = std::fs::read_to_string(sim.dir().join("simdev.log")).unwrap();
    assert!(
        log.contains("closest is execution 4: input \"y\" differs first at byte 1024 of 65536"),
        "the miss names the closest recording in simdev's log:\n{log}"
    );
    drop(sim);
}
