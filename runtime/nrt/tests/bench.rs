//! The main job through the real `nrt` binary: `nrt bench` on the digits test set at batch 1
//! and 360 (accuracy 355/360, logits within 1e-4 of the reference), `--json`, `--trace`, and
//! `nrt ls --json`, each starting its own private simdev.

use std::path::{Path, PathBuf};
use std::process::Command;

fn nrt(args: &[&str]) -> serde_json::Value {
    nrt_with(args, &[])
}

/// `nrt args` with extra environment variables `env`; returns its `--json` output.
fn nrt_with(args: &[&str], env: &[(&str, &str)]) -> serde_json::Value {
    nrt_logged(args, env).0
}

/// [`nrt_with`], and what it logged (its stderr).
fn nrt_logged(args: &[&str], env: &[(&str, &str)]) -> (serde_json::Value, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_nrt"))
        .args(args)
        .env_remove("NEURON_SIMDEV_SOCKET")
        .env_remove("NEURON_RT_BACKEND")
        .env_remove("NEURON_LOGICAL_NC_CONFIG")
        .env_remove("NEURON_SIMDEV_ARCH")
        .envs(env.iter().copied())
        .output()
        .expect("nrt runs");
    assert!(
        out.status.success(),
        "nrt {args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let json = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "nrt {args:?}: not JSON ({e}): {}",
            String::from_utf8_lossy(&out.stdout)
        )
    });
    (json, String::from_utf8_lossy(&out.stderr).into_owned())
}

#[test]
fn bench_classifies_the_digits_test_set_at_batch_1_and_360() {
    for batch in ["1", "360"] {
        let r = nrt(&["bench", "--batch", batch, "--json"]);
        assert_eq!(
            r["accuracy"].as_f64(),
            Some(355.0 / 360.0),
            "batch {batch}: {r}"
        );
        assert!(
            r["max_abs_logit_diff"].as_f64().unwrap() <= 1e-4,
            "batch {batch}: {r}"
        );
        assert_eq!(r["backend"], "sim");
        assert_eq!(r["images"].as_u64(), Some(360));
        assert_eq!(
            r["batch"].as_str().map(str::to_owned),
            None,
            "a number: {r}"
        );
        assert_eq!(
            r["batch"].as_u64().map(|b| b.to_string()).as_deref(),
            Some(batch)
        );
        assert_eq!(r["nc_count"].as_u64(), Some(1), "{r}");
        for key in [
            "p50_us",
            "p90_us",
            "p99_us",
            "executions_per_second",
            "images_per_second",
        ] {
            assert!(r[key].as_f64().is_some_and(|v| v > 0.0), "{key} in {r}");
        }
    }
}

#[test]
fn bench_identity_checks_every_output() {
    let r = nrt(&[
        "bench",
        "--model",
        "identity",
        "--bytes",
        "4096",
        "--iterations",
        "50",
        "--ncs",
        "2",
        "--json",
    ]);
    assert_eq!(r["model"], "identity", "{r}");
    assert_eq!(r["nc_count"].as_u64(), Some(2), "{r}");
    assert_eq!(r["failures"].as_u64(), Some(0), "{r}");
    // `--iterations` counts executions over all NCs; each was compared with its input.
    assert_eq!(r["executions"].as_u64(), Some(50), "{r}");
}

#[test]
fn bench_without_ncs_runs_on_the_cores_neuron_rt_num_cores_asks_for() {
    let args = [
        "bench",
        "--model",
        "identity",
        "--iterations",
        "20",
        "--json",
    ];
    let r = nrt_with(&args, &[("NEURON_RT_NUM_CORES", "2")]);
    assert_eq!(r["nc_count"].as_u64(), Some(2), "{r}");
    assert_eq!(r["failures"].as_u64(), Some(0), "{r}");
    // The flag still wins.
    let mut with_flag = args.to_vec();
    with_flag.extend(["--ncs", "1"]);
    let r = nrt_with(&with_flag, &[("NEURON_RT_NUM_CORES", "2")]);
    assert_eq!(r["nc_count"].as_u64(), Some(1), "{r}");
}

/// `--ncs` above the cores NEURON_RT_VISIBLE_CORES leaves is refused, not run on fewer.
#[test]
fn bench_refuses_more_ncs_than_the_visible_cores() {
    let out = Command::new(env!("CARGO_BIN_EXE_nrt"))
        .args([
            "bench",
            "--model",
            "identity",
            "--iterations",
            "10",
            "--ncs",
            "2",
        ])
        .env_remove("NEURON_SIMDEV_SOCKET")
        .env_remove("NEURON_RT_BACKEND")
        .env("NEURON_RT_VISIBLE_CORES", "0")
        .output()
        .expect("nrt runs");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    assert!(
        stderr.contains("--ncs 2 but NEURON_RT_VISIBLE_CORES makes 1 logical core(s) visible"),
        "{stderr}"
    );
}

#[test]
fn bench_with_lnc_2_on_trn2_gives_the_same_results_as_lnc_1() {
    let args = ["bench", "--batch", "360", "--ncs", "2", "--json"];
    let lnc1 = nrt_with(&args, &[("NEURON_SIMDEV_ARCH", "trn2")]);
    let lnc2 = nrt_with(
        &args,
        &[
            ("NEURON_SIMDEV_ARCH", "trn2"),
            ("NEURON_LOGICAL_NC_CONFIG", "2"),
        ],
    );
    for r in [&lnc1, &lnc2] {
        assert_eq!(r["accuracy"].as_f64(), Some(355.0 / 360.0), "{r}");
        assert!(r["max_abs_logit_diff"].as_f64().unwrap() <= 1e-4, "{r}");
        assert_eq!(r["nc_count"].as_u64(), Some(2), "{r}");
    }
}

#[test]
fn bench_async_and_trace_write_a_perfetto_file() {
    let dir = tempfile::tempdir().unwrap();
    let trace = dir.path().join("trace.json");
    let r = nrt(&[
        "bench",
        "--batch",
        "40",
        "--async",
        "4",
        "--json",
        "--trace",
        trace.to_str().unwrap(),
    ]);
    assert_eq!(r["accuracy"].as_f64(), Some(355.0 / 360.0), "{r}");
    assert_eq!(r["in_flight"].as_u64(), Some(4));
    let t: serde_json::Value = serde_json::from_slice(&std::fs::read(&trace).unwrap()).unwrap();
    let events = t["traceEvents"].as_array().unwrap();
    for cat in ["instruction", "dma", "doorbell", "notification"] {
        assert!(
            events.iter().any(|e| e["cat"] == cat),
            "no {cat} event in the trace"
        );
    }
}

#[test]
fn ls_describes_the_device_and_never_starts_one() {
    // No device and no socket: an empty list (a tool summing nc_count counts no cores).
    let r = nrt(&["ls", "--json"]);
    assert_eq!(r, serde_json::json!([]));
    let sim = runtime::backend::sim::PrivateSimdev::spawn(&tests::simdev_command(&[])).unwrap();
    let r = nrt_with(
        &["ls", "--json"],
        &[("NEURON_SIMDEV_SOCKET", sim.socket().to_str().unwrap())],
    );
    let d = &r[0];
    assert_eq!(d["nc_count"].as_u64(), Some(2));
    assert_eq!(d["nrt"]["backend"], "sim");
    assert_eq!(d["nrt"]["ncs"][0]["semaphores"].as_u64(), Some(256));
    assert_eq!(d["nrt"]["ncs"][1]["dma_queues"].as_u64(), Some(256));
    assert_eq!(
        d["neuron_processes"].as_array().map(Vec::len),
        Some(0),
        "the simdev has no client but ls's own: {r}"
    );
}

/// Runs `nrt args` with extra environment `env`, expects it to fail, returns its stderr.
fn nrt_fails(args: &[&str], env: &[(&str, &str)]) -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_nrt"))
        .args(args)
        .env_remove("NEURON_SIMDEV_SOCKET")
        .env_remove("NEURON_RT_BACKEND")
        .env_remove("NEURON_LOGICAL_NC_CONFIG")
        .env_remove("NEURON_SIMDEV_ARCH")
        .envs(env.iter().copied())
        .output()
        .expect("nrt runs");
    assert!(
        !out.status.success(),
        "nrt {args:?} succeeded: {}",
        String::from_utf8_lossy(&out.stdout)
    );
    String::from_utf8_lossy(&out.stderr).into_owned()
}

#[test]
fn bench_with_lnc_2_on_trn1_says_it_needs_a_trn2_device() {
    for batch in ["1", "360"] {
        let err = nrt_fails(
            &["bench", "--batch", batch, "--ncs", "2"],
            &[("NEURON_LOGICAL_NC_CONFIG", "2")],
        );
        assert!(err.contains("needs a trn2 device"), "batch {batch}: {err}");
        assert!(err.contains("trn1"), "batch {batch}: {err}");
        assert!(!err.contains("--batch"), "batch {batch}: {err}");
        assert!(!err.contains("--ncs"), "batch {batch}: {err}");
    }
}

#[test]
fn a_flag_of_the_other_model_is_refused_not_ignored() {
    let err = nrt_fails(&["bench", "--bytes", "128"], &[]);
    assert!(
        err.contains("--bytes applies to the identity model"),
        "{err}"
    );
    let err = nrt_fails(&["bench", "--model", "identity", "--batch", "8"], &[]);
    assert!(err.contains("--batch applies to the digits model"), "{err}");
}

#[test]
fn a_negative_count_is_refused_as_a_bad_value_of_its_flag() {
    for (flag, value) in [("--bytes", "-5"), ("--iterations", "-1"), ("--async", "-2")] {
        let err = nrt_fails(&["bench", "--model", "identity", flag, value], &[]);
        assert!(
            err.contains(&format!("invalid value '{value}' for '{flag}")),
            "{flag} {value}: {err}"
        );
    }
}

#[test]
fn a_neff_refuses_the_flags_that_size_a_built_in_model() {
    // A NEFF declares its tensors' sizes: --batch and --bytes would be silently ignored.
    let neff = neff("matmul_small");
    for (flag, value) in [
        ("--batch", "4"),
        ("--bytes", "4096"),
        ("--model", "identity"),
    ] {
        let err = nrt_fails(&["bench", "--neff", &neff, flag, value], &[]);
        assert!(
            err.contains(&format!("'{flag}")) && err.contains("cannot be used with"),
            "{flag} {value}: {err}"
        );
    }
}

#[test]
fn async_slots_that_do_not_fit_say_it_is_the_slots() {
    // matmul_large's I/O is 4.3 GB a set, its "y" 4 GiB: logical core 0's two NCs (12 GiB of
    // HBM each by default) hold two sets' "y" each, so --async 8's fifth set does not fit, and
    // the error says so rather than only "out of memory".
    let err = nrt_fails(
        &[
            "bench",
            "--neff",
            &neff("matmul_large"),
            "--iterations",
            "1",
            "--async",
            "8",
        ],
        &[("NEURON_SIMDEV_ARCH", "trn2")],
    );
    assert!(
        err.contains("in-flight slot 5 of 8 (--async 8: each slot allocates its own I/O tensors")
            && err.contains("a smaller --async needs less")
            && err.contains("OutOfMemory"),
        "{err}"
    );
}

#[test]
fn bench_async_beyond_the_queue_waits_for_a_completion_and_retries() {
    // The XU queue holds 16: 17 and 40 slots must wait for completions, not fail.
    for slots in ["17", "40"] {
        let r = nrt(&[
            "bench",
            "--batch",
            "40",
            "--iterations",
            "120",
            "--async",
            slots,
            "--json",
        ]);
        assert_eq!(r["accuracy"].as_f64(), Some(355.0 / 360.0), "{r}");
        assert_eq!(
            r["in_flight"].as_u64().map(|n| n.to_string()).as_deref(),
            Some(slots)
        );
        assert_eq!(r["failures"].as_u64(), Some(0), "{r}");
        assert!(
            r["in_flight_note"]
                .as_str()
                .is_some_and(|n| n.contains("at most 16 were in flight per core")),
            "the report says that no more than the queue's 16 were in flight: {r}"
        );
    }
}

#[test]
fn identity_bytes_fewer_than_the_logical_cores_ncs_are_refused_up_front() {
    // trn2's logical core is two NCs, each copying its share: one byte has no share for the
    // second, and is refused before anything is allocated, naming what to do.
    let err = nrt_fails(
        &["bench", "--model", "identity", "--bytes", "1"],
        &[("NEURON_SIMDEV_ARCH", "trn2")],
    );
    assert!(
        err.contains("--bytes 1 is fewer than the logical core's 2 physical cores")
            && err.contains("use --bytes 2 or more"),
        "{err}"
    );
    let r = nrt_with(
        &[
            "bench",
            "--model",
            "identity",
            "--bytes",
            "2",
            "--iterations",
            "20",
            "--json",
        ],
        &[("NEURON_SIMDEV_ARCH", "trn2")],
    );
    assert_eq!(r["failures"].as_u64(), Some(0), "{r}");
    assert!(
        r["host_check_share"]
            .as_f64()
            .is_some_and(|s| (0.0..1.0).contains(&s)),
        "{r}"
    );
}

#[test]
fn bench_async_beyond_the_fd_limit_is_refused_up_front() {
    let (soft, _) =
        nix::sys::resource::getrlimit(nix::sys::resource::Resource::RLIMIT_NOFILE).unwrap();
    // Each slot costs two descriptors: as many slots as the limit cannot fit.
    let slots = soft.min(u64::from(u32::MAX)).to_string();
    let started = std::time::Instant::now();
    let err = nrt_fails(&["bench", "--async", &slots], &[]);
    assert!(err.contains("RLIMIT_NOFILE"), "{err}");
    assert!(err.contains(&format!("--async {slots} on 1 core")), "{err}");
    assert!(err.contains("or fewer"), "{err}");
    assert!(
        started.elapsed() < std::time::Duration::from_secs(20),
        "refused up front, not after allocating: {:?}",
        started.elapsed()
    );
}

#[test]
fn bench_with_funtime_says_nothing_ran_on_a_device() {
    let env = [("NEURON_RT_FUNTIME", "1")];
    let r = nrt_with(&["bench", "--batch", "360", "--json"], &env);
    assert_eq!(r["ran_on_device"], false, "{r}");
    assert!(
        r["note"]
            .as_str()
            .unwrap()
            .contains("nothing ran on a device"),
        "{r}"
    );
    assert!(r["accuracy"].is_null(), "no accuracy without a device: {r}");
    let out = Command::new(env!("CARGO_BIN_EXE_nrt"))
        .args(["bench", "--batch", "360"])
        .env_remove("NEURON_SIMDEV_SOCKET")
        .env_remove("NEURON_RT_BACKEND")
        .envs(env)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}");
    assert!(text.contains("nothing ran on a device"), "{text}");
    assert!(!text.contains("accuracy 0."), "{text}");
    // A real run says it ran on the device.
    let real = nrt(&["bench", "--batch", "360", "--json"]);
    assert_eq!(real["ran_on_device"], true, "{real}");
    assert!(real["note"].is_null(), "{real}");
}

/// `nrt model` writes the very container the builder makes (what a C program passes to
/// `nrt_load`), and refuses an unknown model or a zero size naming it.
#[test]
fn nrt_model_writes_the_builders_container_for_c_programs() {
    use runtime::builder::digits::{self, Digits};
    use shared::model::Target;
    let dir = tempfile::tempdir().unwrap();
    let run = |args: &[&str]| {
        Command::new(env!("CARGO_BIN_EXE_nrt"))
            .arg("model")
            .args(args)
            .output()
            .expect("nrt runs")
    };
    let digits_file = dir.path().join("digits.nrtm");
    let o = run(&[
        "digits",
        "--batch",
        "4",
        "--out",
        digits_file.to_str().unwrap(),
    ]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let expected = Digits::load(&digits::default_path())
        .unwrap()
        .mlp()
        .build_split(4, 1)
        .unwrap()
        .to_container(Target::Simdev)
        .unwrap();
    assert_eq!(std::fs::read(&digits_file).unwrap(), expected);
    let id_file = dir.path().join("id.nrtm");
    let o = run(&[
        "identity",
        "--bytes",
        "512",
        "--out",
        id_file.to_str().unwrap(),
    ]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let expected = runtime::builder::identity(512)
        .to_container(Target::Simdev)
        .unwrap();
    assert_eq!(std::fs::read(&id_file).unwrap(), expected);
    for (args, says) in [
        (&["resnet", "--out"][..], "unknown model \"resnet\""),
        (
            &["identity", "--bytes", "0", "--out"][..],
            "--bytes must be at least 1",
        ),
    ] {
        let out = dir.path().join("refused.nrtm");
        let mut a = args.to_vec();
        a.push(out.to_str().unwrap());
        let o = run(&a);
        assert!(!o.status.success());
        assert!(
            String::from_utf8_lossy(&o.stderr).contains(says),
            "{args:?}"
        );
        assert!(!out.exists(), "nothing written for {args:?}");
    }
}

fn neff(name: &str) -> String {
    format!(
        "{}/../../scenarios/data/neff/{name}.neff",
        env!("CARGO_MANIFEST_DIR")
    )
}

#[test]
fn bench_neff_runs_a_real_neff_sync_and_async_and_says_shape_only() {
    let lnc2 = [
        ("NEURON_SIMDEV_ARCH", "trn2"),
        ("NEURON_LOGICAL_NC_CONFIG", "2"),
    ];
    let small = neff("matmul_small");
    for extra in [&[][..], &["--async", "4"][..]] {
        let mut args = vec![
            "bench",
            "--neff",
            &small,
            "--warmup",
            "3",
            "--iterations",
            "40",
            "--json",
        ];
        args.extend_from_slice(extra);
        let r = nrt_with(&args, &lnc2);
        assert_eq!(r["model"], "matmul_small.neff", "{r}");
        assert_eq!(r["outputs"], "shape-only", "{r}");
        assert!(r["note"].as_str().unwrap().contains("shape-only"), "{r}");
        assert!(!r["note"].as_str().unwrap().contains("above 64 MiB"), "{r}");
        assert_eq!(r["failures"].as_u64(), Some(0), "outputs checked: {r}");
        assert_eq!(r["executions"].as_u64(), Some(40), "{r}");
        assert_eq!(r["warmup"].as_u64(), Some(3), "{r}");
        let (min, p50, p99, max) = (
            r["min_us"].as_f64().unwrap(),
            r["p50_us"].as_f64().unwrap(),
            r["p99_us"].as_f64().unwrap(),
            r["max_us"].as_f64().unwrap(),
        );
        assert!(0.0 < min && min <= p50 && p50 <= p99 && p99 <= max, "{r}");
        assert!(r["mean_us"].as_f64().unwrap() >= min, "{r}");
        assert!(r["std_us"].as_f64().unwrap() >= 0.0, "{r}");
        assert!(r["executions_per_second"].as_f64().unwrap() > 0.0, "{r}");
        assert!(r["load_seconds"].as_f64().unwrap() > 0.0, "{r}");
    }
    // matmul_large's 4 GiB input is filled sparsely, and the note says so (small's is not).
    let large = neff("matmul_large");
    let r = nrt_with(
        &["bench", "--neff", &large, "--iterations", "1", "--json"],
        &[("NEURON_SIMDEV_ARCH", "trn2")],
    );
    assert_eq!(r["failures"].as_u64(), Some(0), "{r}");
    assert!(
        r["note"]
            .as_str()
            .unwrap()
            .contains("first and last MiB only, zeros between: \"y\" (4096 MiB)"),
        "{r}"
    );
    // The digits model is not shape-only.
    let r = nrt(&[
        "bench",
        "--model",
        "identity",
        "--iterations",
        "5",
        "--json",
    ]);
    assert_eq!(r["outputs"], "computed", "{r}");
    // On trn2 the logical core is two NCs unless said otherwise (libnrt's default): the
    // LNC=2 NEFF runs with nothing set, as the same program does on a trn2 instance.
    let r = nrt_with(
        &["bench", "--neff", &small, "--iterations", "2", "--json"],
        &[("NEURON_SIMDEV_ARCH", "trn2")],
    );
    assert_eq!(r["failures"].as_u64(), Some(0), "{r}");
    // An LNC=2 NEFF at LNC=1 is refused naming the mismatch.
    let e = nrt_fails(
        &["bench", "--neff", &small, "--iterations", "1"],
        &[
            ("NEURON_SIMDEV_ARCH", "trn2"),
            ("NEURON_LOGICAL_NC_CONFIG", "1"),
        ],
    );
    assert!(
        e.contains("needs LNC=2") && e.contains("set NEURON_LOGICAL_NC_CONFIG=2"),
        "{e}"
    );
    // An arch that does not exist is refused by name before any simdev starts.
    let e = nrt_fails(
        &["bench", "--iterations", "1"],
        &[("NEURON_SIMDEV_ARCH", "trn9")],
    );
    assert!(
        e.contains("NEURON_SIMDEV_ARCH=\"trn9\" is not one of trn1, inf2, trn2")
            && !e.contains("--help"),
        "{e}"
    );
    // On a trn1 simdev it names the arch to ask for too, and the file (both shipped NEFFs
    // call themselves "file.neff" inside).
    let e = nrt_fails(&["bench", "--neff", &small, "--iterations", "1"], &[]);
    assert!(
        e.contains("needs LNC=2")
            && e.contains("NEURON_SIMDEV_ARCH=trn2")
            && e.contains(&format!("loading {small}: ")),
        "{e}"
    );
}

#[test]
fn bench_neff_with_a_reference_bound_through_the_environment_says_reference() {
    // A private simdev inherits NEURON_SIMDEV_REFERENCE: nrt bench runs the NEFF through the
    // example reference (numpy's x @ y) and says where its outputs came from.
    let small = neff("matmul_small");
    let binding = format!(
        "{small}={}/../../simdev/python/ref_matmul.py:matmul",
        env!("CARGO_MANIFEST_DIR")
    );
    let r = nrt_with(
        &["bench", "--neff", &small, "--iterations", "3", "--json"],
        &[
            ("NEURON_SIMDEV_ARCH", "trn2"),
            ("NEURON_LOGICAL_NC_CONFIG", "2"),
            ("NEURON_SIMDEV_REFERENCE", &binding),
        ],
    );
    assert_eq!(r["outputs"], "reference", "{r}");
    assert_eq!(r["reference"], "ref_matmul.py:matmul", "{r}");
    assert!(
        r["note"]
            .as_str()
            .unwrap()
            .starts_with("reference ref_matmul.py:matmul: simdev computed every output"),
        "{r}"
    );
    assert_eq!(r["failures"].as_u64(), Some(0), "{r}");
}

#[test]
fn a_reference_variable_the_simdev_in_use_never_read_is_named_beside_shape_only() {
    let small = neff("matmul_small");
    let binding = format!(
        "{small}={}/../../simdev/python/ref_matmul.py:matmul",
        env!("CARGO_MANIFEST_DIR")
    );
    // A shared simdev, started without the binding: it never reads the client's variable.
    let sim =
        runtime::backend::sim::PrivateSimdev::spawn(&tests::simdev_command(&["--arch", "trn2"]))
            .unwrap();
    let socket = sim.socket().to_str().unwrap().to_owned();
    let args = ["bench", "--neff", &small, "--iterations", "2", "--json"];
    let shared = [
        ("NEURON_SIMDEV_SOCKET", socket.as_str()),
        ("NEURON_LOGICAL_NC_CONFIG", "2"),
    ];
    let (r, log) = nrt_logged(
        &args,
        &[&shared[..], &[("NEURON_SIMDEV_REFERENCE", &binding)]].concat(),
    );
    assert_eq!(r["outputs"], "shape-only", "{r}");
    let hint = "NEURON_SIMDEV_REFERENCE is set in this process";
    let line = log
        .lines()
        .find(|l| l.contains("runs shape-only"))
        .unwrap_or_else(|| panic!("the shape-only line:\n{log}"));
    assert!(
        line.contains(&format!("{hint} ({binding:?})"))
            && line
                .contains("a shared simdev (NEURON_SIMDEV_SOCKET) needs it in its own environment"),
        "{line}"
    );
    // The line names the NEFF by its uuid too: both shipped NEFFs call themselves
    // "file.neff", so a program that loads several could not tell which one it is.
    let uuid = line
        .split_once("(uuid ")
        .and_then(|(_, rest)| rest.split_once(')'))
        .map(|(hex, _)| hex)
        .unwrap_or_else(|| panic!("a uuid in: {line}"));
    assert!(
        uuid.len() == 32 && uuid.bytes().all(|b| b.is_ascii_hexdigit()),
        "{line}"
    );
    // Unset, or empty: the shape-only line without the hint.
    for env in [
        &shared[..],
        &[&shared[..], &[("NEURON_SIMDEV_REFERENCE", "")]].concat(),
    ] {
        let (r, log) = nrt_logged(&args, env);
        assert_eq!(r["outputs"], "shape-only", "{r}");
        assert!(
            log.contains("runs shape-only") && !log.contains(hint),
            "{env:?}: {log}"
        );
    }
}

/// `nrt bench` of the identity model that runs until stopped, with a private simdev and its
/// datastore in `tmp`; stdout discarded (the caller may pipe it), stderr piped.
fn endless_bench(tmp: &Path) -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_nrt"));
    cmd.args(["bench", "--model", "identity", "--iterations", "100000000"])
        .env_remove("NEURON_SIMDEV_SOCKET")
        .env_remove("NEURON_RT_BACKEND")
        .env("TMPDIR", tmp)
        .env("NEURON_RT_DATASTORE_DIR", tmp)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped());
    cmd
}

#[test]
fn sigterm_stops_a_bench_and_leaves_nothing_behind() {
    let tmp = tempfile::tempdir().unwrap();
    let child = endless_bench(tmp.path()).spawn().unwrap();
    let listed = || {
        std::fs::read_dir(tmp.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect::<Vec<_>>()
    };
    // Running: its private simdev's directory and its datastore file exist.
    let t = std::time::Instant::now();
    while listed().len() < 2 {
        assert!(
            t.elapsed() < std::time::Duration::from_secs(60),
            "{:?}",
            listed()
        );
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(i32::try_from(child.id()).unwrap()),
        nix::sys::signal::Signal::SIGTERM,
    )
    .unwrap();
    let out = child.wait_with_output().unwrap();
    assert_eq!(
        out.status.code(),
        Some(130),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // Nothing but its datastore, closed (it lingers for monitors: their last period).
    let left = listed();
    assert_eq!(left.len(), 1, "{left:?}");
    let closed = runtime::datastore::read_file(&tmp.path().join(&left[0])).unwrap();
    assert_eq!(
        closed.liveness,
        runtime::datastore::snapshot::Liveness::Closed,
        "{left:?}"
    );
}

/// A signal stops a bench in order: what ran is reported (marked interrupted, no more
/// executions than it ran), its `--trace` is written, and it exits 130.
#[test]
fn an_interrupted_bench_reports_what_ran_and_writes_its_trace() {
    let tmp = tempfile::tempdir().unwrap();
    let trace = tmp.path().join("t.json");
    let mut cmd = endless_bench(tmp.path());
    cmd.arg("--json")
        .arg("--trace")
        .arg(&trace)
        .stdout(std::process::Stdio::piped());
    let child = cmd.spawn().unwrap();
    // Running: its datastore file counts executions.
    let t = std::time::Instant::now();
    loop {
        let ran = std::fs::read_dir(tmp.path())
            .unwrap()
            .filter_map(|e| runtime::datastore::read_file(&e.unwrap().path()).ok())
            .any(|s| s.cores.iter().any(|c| c.executions.total() > 100));
        if ran {
            break;
        }
        assert!(t.elapsed() < std::time::Duration::from_secs(60));
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(i32::try_from(child.id()).unwrap()),
        nix::sys::signal::Signal::SIGINT,
    )
    .unwrap();
    let out = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(130), "{stderr}");
    let r: serde_json::Value = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&out.stdout)));
    assert_eq!(r["interrupted"], true, "{r}");
    let executions = r["executions"].as_u64().unwrap();
    assert!(
        executions > 0 && executions < 100_000_000,
        "{executions}: {r}"
    );
    assert_eq!(r["failures"], 0, "{r}");
    let t: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&trace).unwrap()).expect("a complete trace");
    let spans = t["traceEvents"].as_array().unwrap();
    assert!(
        spans.iter().any(|e| e["name"] == "execute"),
        "no execute span in {} events",
        spans.len()
    );
    assert!(stderr.contains("trace written to"), "{stderr}");
}

/// A bench running an identity model with a private simdev in `tmp`, once its simdev's
/// directory exists: (the bench, the directory).
#[allow(clippy::zombie_processes, reason = "returned: the caller waits for it")]
fn bench_with_a_private_simdev(tmp: &Path) -> (std::process::Child, PathBuf) {
    let mut child = endless_bench(tmp).spawn().unwrap();
    let t = std::time::Instant::now();
    loop {
        let dir = std::fs::read_dir(tmp)
            .unwrap()
            .map(|e| e.unwrap().path())
            .find(|p| p.join("simdev.sock").exists());
        if let Some(dir) = dir {
            return (child, dir);
        }
        if t.elapsed() > std::time::Duration::from_secs(60) {
            let _ = child.kill();
            let out = child.wait_with_output().unwrap();
            panic!("no simdev: {}", String::from_utf8_lossy(&out.stderr));
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
}

/// The pids of the simdev processes listening in `dir`.
fn simdevs_in(dir: &Path) -> Vec<i32> {
    let needle = dir.join("simdev.sock").display().to_string();
    std::fs::read_dir("/proc")
        .unwrap()
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<i32>().ok())
        .filter(|pid| {
            std::fs::read(format!("/proc/{pid}/cmdline")).is_ok_and(|c| {
                String::from_utf8_lossy(&c)
                    .split('\0')
                    .any(|arg| arg == needle)
            })
        })
        .collect()
}

/// A runtime killed outright (SIGKILL: no handler, no exit hook) takes its private simdev with
/// it, and the simdev removes its directory as it stops (`--private`, parent-death SIGTERM).
#[test]
fn a_killed_bench_leaves_no_simdev_and_no_simdev_directory() {
    let tmp = tempfile::tempdir().unwrap();
    killed_bench_takes_its_simdev(bench_with_a_private_simdev(tmp.path()));
}

/// The same for a bench started with every signal blocked (a program that blocks them before
/// `nrt_init`): the mask is inherited across `exec` (Rust's `Command` does not reset it), and
/// a simdev that kept it never saw its parent's death and stayed, orphaned.
#[test]
fn a_killed_bench_started_with_every_signal_blocked_takes_its_simdev_too() {
    let tmp = tempfile::tempdir().unwrap();
    let path = tmp.path().to_owned();
    let started = std::thread::spawn(move || {
        nix::sys::signal::SigSet::all().thread_block().unwrap();
        bench_with_a_private_simdev(&path)
    })
    .join()
    .unwrap();
    killed_bench_takes_its_simdev(started);
}

fn killed_bench_takes_its_simdev((mut child, dir): (std::process::Child, PathBuf)) {
    assert_eq!(simdevs_in(&dir).len(), 1, "its simdev runs");
    child.kill().unwrap();
    child.wait().unwrap();
    let t = std::time::Instant::now();
    while dir.exists() || !simdevs_in(&dir).is_empty() {
        assert!(
            t.elapsed() < std::time::Duration::from_secs(20),
            "{} still exists or its simdev {:?} still runs",
            dir.display(),
            simdevs_in(&dir)
        );
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
}

/// Ctrl-C at a terminal signals the whole foreground process group: the bench stops in order
/// (130), and its private simdev, in a group of its own, is not stopped under it (before, the
/// bench reported the interrupted executions as a lost device).
#[test]
fn sigint_to_the_process_group_stops_a_bench_without_losing_its_device() {
    use std::os::unix::process::CommandExt as _;
    let tmp = tempfile::tempdir().unwrap();
    // A foreground job of its own, as a shell would start it.
    let child = endless_bench(tmp.path()).process_group(0).spawn().unwrap();
    let pgid = nix::unistd::Pid::from_raw(i32::try_from(child.id()).unwrap());
    let t = std::time::Instant::now();
    let dir = loop {
        let dir = std::fs::read_dir(tmp.path())
            .unwrap()
            .map(|e| e.unwrap().path())
            .find(|p| p.join("simdev.sock").exists());
        if let Some(dir) = dir {
            break dir;
        }
        assert!(t.elapsed() < std::time::Duration::from_secs(60));
        std::thread::sleep(std::time::Duration::from_millis(20));
    };
    // The group's signal does not reach the simdev (whether an identity execution would
    // notice is down to timing; a long NEFF execution does).
    let simdevs = simdevs_in(&dir);
    assert_eq!(simdevs.len(), 1);
    let simdev_group = nix::unistd::getpgid(Some(nix::unistd::Pid::from_raw(simdevs[0]))).unwrap();
    assert_ne!(
        simdev_group, pgid,
        "the simdev is in the bench's process group"
    );
    // Executions are running.
    std::thread::sleep(std::time::Duration::from_millis(300));
    nix::sys::signal::killpg(pgid, nix::sys::signal::Signal::SIGINT).unwrap();
    let out = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(130), "{stderr}");
    for bad in ["lost", "gone", "NRT_HW_ERROR", "ERROR"] {
        assert!(!stderr.contains(bad), "{bad:?} in:\n{stderr}");
    }
    let left: Vec<_> = std::fs::read_dir(tmp.path())
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .filter(|n| n.to_string_lossy().starts_with("simdev-"))
        .collect();
    assert!(left.is_empty(), "{left:?}");
}

/// A Python reference that hangs fails its execution with NRT_EXEC_COMPLETED_WITH_ERR (1004,
/// simdev's reference timeout) rather than the runtime's NRT_TIMEOUT, which would degrade the
/// core: a private simdev's references get three quarters of NEURON_RT_EXEC_TIMEOUT (6 s of 8).
#[test]
fn a_hung_reference_fails_its_execution_before_the_runtime_times_it_out() {
    let dir = tempfile::tempdir().unwrap();
    let module = dir.path().join("hang.py");
    std::fs::write(
        &module,
        "import time\n\ndef hang(x, y):\n    time.sleep(60)\n    return {}\n",
    )
    .unwrap();
    // A worker that starts slowly (3 s before it is ready, as a cold numpy import can take):
    // its start counts against the reference timeout too, else 3 s + 6 s would outlive the
    // runtime's 8 s. Python imports `sitecustomize` from its path as it starts.
    let site = dir.path().join("site");
    std::fs::create_dir(&site).unwrap();
    std::fs::write(
        site.join("sitecustomize.py"),
        "import time\ntime.sleep(3)\n",
    )
    .unwrap();
    let pythonpath = site.display().to_string();
    let small = neff("matmul_small");
    let binding = format!("{small}={}:hang", module.display());
    let started = std::time::Instant::now();
    let e = nrt_fails(
        &["bench", "--neff", &small, "--iterations", "1"],
        &[
            ("NEURON_SIMDEV_ARCH", "trn2"),
            ("NEURON_RT_EXEC_TIMEOUT", "8"),
            ("NEURON_SIMDEV_REFERENCE", &binding),
            ("PYTHONPATH", &pythonpath),
        ],
    );
    assert!(e.contains("NRT_EXEC_COMPLETED_WITH_ERR (1004)"), "{e}");
    assert!(
        e.contains("no reply within the reference timeout of 6s"),
        "{e}"
    );
    assert!(!e.contains("NRT_TIMEOUT"), "{e}");
    // Reported, not asserted on: the whole run took about the reference timeout.
    println!("took {:?}", started.elapsed());
}

/// A bench whose device is lost mid-run reports what ran before it — the figures of those
/// executions and the error (in the JSON's `error`; before, stdout was empty and a script's
/// parser failed on it) — and exits 1.
#[test]
fn a_bench_losing_its_device_mid_run_reports_what_ran_and_the_error() {
    let tmp = tempfile::tempdir().unwrap();
    let mut child = endless_bench(tmp.path())
        .arg("--json")
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    // Its simdev, once some executions completed (its datastore counts them).
    let t = std::time::Instant::now();
    let simdev = loop {
        let paths: Vec<PathBuf> = std::fs::read_dir(tmp.path())
            .unwrap()
            .map(|e| e.unwrap().path())
            .collect();
        let ran = paths.iter().any(|p| {
            runtime::datastore::read_file(p)
                .is_ok_and(|d| d.cores.iter().map(|c| c.executions.total()).sum::<u64>() > 100)
        });
        let simdev = paths
            .iter()
            .find(|p| p.join("simdev.sock").exists())
            .and_then(|dir| simdevs_in(dir).first().copied());
        if let (true, Some(pid)) = (ran, simdev) {
            break pid;
        }
        if t.elapsed() > std::time::Duration::from_secs(60) {
            let _ = child.kill();
            panic!("no simdev, or no executions");
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    };
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(simdev),
        nix::sys::signal::Signal::SIGKILL,
    )
    .unwrap();
    let out = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    let doc: serde_json::Value = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("stdout is not JSON ({e}): {:?}", out.stdout));
    let error = doc["error"].as_str().unwrap_or_default();
    assert!(
        error.contains("NRT_HW_ERROR") && stderr.contains(error),
        "the error, as stderr says it: {doc} / {stderr}"
    );
    assert!(doc["executions"].as_u64().unwrap() > 100, "{doc}");
    assert!(doc["p50_us"].as_f64().unwrap() > 0.0, "{doc}");
    assert!(doc["accuracy"].is_null(), "{doc}");
}

/// Output that cannot be written (`> /dev/full`) ends the bench with one line and status 1,
/// its private simdev stopped: `println!`'s panic printed a backtrace and exited 101.
#[test]
fn a_bench_whose_stdout_is_full_says_so_in_one_line() {
    let tmp = tempfile::tempdir().unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_nrt"))
        .args(["bench", "--model", "identity", "--iterations", "5"])
        .env_remove("NEURON_SIMDEV_SOCKET")
        .env_remove("NEURON_RT_BACKEND")
        .env("TMPDIR", tmp.path())
        .stdout(
            std::fs::OpenOptions::new()
                .write(true)
                .open("/dev/full")
                .unwrap(),
        )
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("nrt: failed printing to stdout"),
        "{stderr}"
    );
    assert!(!stderr.contains("panicked"), "{stderr}");
    assert_eq!(
        std::fs::read_dir(tmp.path()).unwrap().count(),
        0,
        "its simdev stopped and removed its directory"
    );
}
