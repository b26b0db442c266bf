//! The scenario suite: `nrt scenario run` over every `scenarios/*.toml` must pass, and the runner
//! must fail a deliberately wrong scenario (`tests/data/`) with a readable message.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn scenario_files() -> Vec<PathBuf> {
    let dir = repo().join("scenarios");
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .filter_map(Result::ok)
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|x| x == "toml"))
        .collect();
    files.sort();
    files
}

fn nrt(args: &[&str], files: &[PathBuf]) -> (Output, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_nrt"))
        .args(args)
        .args(files)
        .output()
        .expect("run nrt");
    let text = format!(
        "{}\n--- stderr ---\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out, text)
}

#[test]
fn every_scenario_file_passes() {
    let files = scenario_files();
    assert!(
        files.len() >= 15,
        "expected the 15 scenarios of the issue at least, found {}",
        files.len()
    );
    let started = std::time::Instant::now();
    let (out, text) = nrt(&["scenario", "run"], &files);
    let took = started.elapsed();
    assert!(out.status.success(), "the scenario suite failed:\n{text}");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        !stdout.lines().any(|l| l.starts_with("FAIL")),
        "a FAIL line with a zero exit:\n{text}"
    );
    for f in &files {
        let stem = f.file_stem().unwrap().to_string_lossy().into_owned();
        assert!(
            stdout
                .lines()
                .any(|l| l.starts_with(&format!("PASSED {stem} "))
                    || l.contains(&format!("({})", f.display()))),
            "no PASSED line for {stem}:\n{text}"
        );
    }
    assert!(
        took.as_secs() < 90,
        "the suite must stay well under 2 minutes; it took {took:?}"
    );
}

#[test]
fn a_broken_expectation_fails_with_a_readable_message() {
    let file = repo().join("runtime/nrt/tests/data/wrong_expectations.toml");
    let (out, text) = nrt(&["scenario", "run"], &[file]);
    assert!(!out.status.success(), "a wrong scenario must fail:\n{text}");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let want = "FAIL wrong_expectations step 2 wrongly expects success: every call returns \
                NRT_SUCCESS — NRT_EXEC_COMPLETED_WITH_ERR ×1, NRT_SUCCESS ×2";
    assert!(
        stdout.lines().any(|l| l.starts_with(want)),
        "no line starting {want:?}:\n{text}"
    );
    assert!(
        stdout
            .lines()
            .any(|l| l
                == "FAIL wrong_expectations expect 1 counters: NC 0: executions 4 — executions 3"),
        "no readable counters failure:\n{text}"
    );
    assert!(
        stdout
            .lines()
            .any(|l| l.starts_with("PASS wrong_expectations step 1 load(id): NRT_SUCCESS")),
        "expectations that hold still pass:\n{text}"
    );
}

#[test]
fn a_misplaced_key_is_refused_with_its_step() {
    let file = repo().join("runtime/nrt/tests/data/misplaced_key.toml");
    let (out, text) = nrt(&["scenario", "run"], &[file]);
    assert!(!out.status.success(), "{text}");
    assert!(
        String::from_utf8_lossy(&out.stdout).contains(
            "FAIL misplaced_key parse: a valid scenario file — step 1 (sleep): unknown field \
             `threads`, expected `ms`"
        ),
        "{text}"
    );
}

#[test]
fn check_reads_every_file_without_running_it() {
    let mut files = scenario_files();
    let (out, text) = nrt(&["scenario", "check"], &files);
    assert!(out.status.success(), "{text}");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        stdout.contains(&format!(
            "scenario files: {n} of {n} valid",
            n = files.len()
        )),
        "{text}"
    );
    // A wrong file among them: named with its error, the others still checked, exit 1.
    let dir = tempfile::tempdir().unwrap();
    let typo = dir.path().join("typo.toml");
    std::fs::write(
        &typo,
        "[models.id]\nbuilder = \"identity\"\n[[steps]]\naction = \"load\"\nmodel = \"di\"\n",
    )
    .unwrap();
    files.insert(0, typo.clone());
    let (out, text) = nrt(&["scenario", "check"], &files);
    assert!(!out.status.success(), "{text}");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        stdout.contains(&format!(
            "{}: step 1 (load): model \"di\" is not in [models]",
            typo.display()
        )),
        "{text}"
    );
    assert!(
        stdout.contains(&format!("{} of {} valid", files.len() - 1, files.len())),
        "{text}"
    );
    // Nothing ran: no simdev directory was made.
    assert!(
        !stdout.contains("PASS") && !stdout.contains("FAIL"),
        "{text}"
    );
}

/// The runner takes where its runtimes publish their counters from the environment (a CI job
/// with a monitor beside it, or one that wants no shared file), and nothing else.
#[test]
fn the_datastore_goes_where_the_environment_says() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("ds.toml");
    std::fs::write(
        &file,
        "[runtime]\nvisible_cores = \"0\"\n[models.id]\nbuilder = \"identity\"\n[[steps]]\naction = \"load\"\nmodel = \"id\"\n\
         [[steps]]\naction = \"execute\"\nmodel = \"id\"\ncount = 3\n\
         [[steps]]\naction = \"spawn_client\"\nvisible_cores = \"1\"\ncount = 2\n[[steps]]\naction = \"wait_client\"\n",
    )
    .unwrap();
    let run = |vars: &[(&str, &std::path::Path)]| {
        let out = Command::new(env!("CARGO_BIN_EXE_nrt"))
            .args(["scenario", "run"])
            .arg(&file)
            .envs(vars.iter().copied())
            .output()
            .expect("run nrt");
        assert!(
            out.status.success(),
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    };
    let files = |d: &std::path::Path| -> Vec<String> {
        let mut v: Vec<String> = std::fs::read_dir(d)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        v.sort();
        v
    };
    let published = tempfile::tempdir().unwrap();
    run(&[("NEURON_RT_DATASTORE_DIR", published.path())]);
    // The runner's runtime and its client's, each closed and left for readers.
    let names = files(published.path());
    assert_eq!(names.len(), 2, "{names:?}");
    assert!(
        names.iter().all(|n| n.starts_with("nrt-datastore-")),
        "{names:?}"
    );
    let off = tempfile::tempdir().unwrap();
    run(&[
        ("NEURON_RT_DATASTORE_DIR", off.path()),
        ("NEURON_RT_DATASTORE", std::path::Path::new("off")),
    ]);
    assert_eq!(files(off.path()), Vec::<String>::new());
}

#[test]
fn json_prints_one_object_per_file() {
    let files = [
        repo().join("runtime/nrt/tests/data/wrong_expectations.toml"),
        repo().join("scenarios/14_foreign_tensors.toml"),
    ];
    let (out, text) = nrt(&["scenario", "run", "--json"], &files);
    assert!(!out.status.success(), "{text}");
    let reports: Vec<serde_json::Value> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}")))
        .collect();
    assert_eq!(reports.len(), 2, "{text}");
    assert_eq!(reports[0]["scenario"], "wrong_expectations");
    assert_eq!(reports[0]["passed"], false);
    assert_eq!(reports[0]["fail_count"], 2);
    assert_eq!(reports[1]["passed"], true, "{text}");
    let failed = reports[0]["results"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["pass"] == false)
        .unwrap();
    assert_eq!(failed["expected"], "every call returns NRT_SUCCESS");
}

#[test]
fn every_fault_kind_is_used_by_some_scenario() {
    let text: String = scenario_files()
        .iter()
        .map(|f| std::fs::read_to_string(f).unwrap())
        .collect();
    for kind in [
        "nc_uncorrectable",
        "hbm_uncorrectable",
        "hbm_repairable",
        "dma_abort",
        "out_of_bounds",
        "numerical",
        "generic_error",
        "missing_completion",
        "late_completion",
        "extra_latency",
        "device_lost",
    ] {
        assert!(
            text.contains(&format!("kind = \"{kind}\"")),
            "no scenario uses fault kind {kind}"
        );
    }
}

#[test]
fn a_scenario_past_its_time_limit_reports_what_held_before_it() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("slow.toml");
    std::fs::write(
        &file,
        "time_limit_s = 0.5\n[models.id]\nbuilder = \"identity\"\nbytes = 64\n\
         [[steps]]\naction = \"load\"\nmodel = \"id\"\n\
         [[steps]]\naction = \"sleep\"\nms = 30000\n",
    )
    .unwrap();
    // A file after it is not run, and says so.
    let after = repo().join("scenarios/01_timeout.toml");
    let (out, text) = nrt(
        &["scenario", "run", "--json"],
        &[file.clone(), after.clone()],
    );
    assert_eq!(out.status.code(), Some(2), "{text}");
    let records: Vec<serde_json::Value> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).expect(&text))
        .collect();
    assert_eq!(records.len(), 2, "one record per file: {text}");
    let r = &records[0];
    assert_eq!(r["passed"], false, "{r}");
    assert_eq!(r["pass_count"], 1, "the load held: {r}");
    assert_eq!(r["fail_count"], 1, "{r}");
    assert_eq!(
        r["results"][0]["at"], "step 1 load(id)",
        "what held is listed: {r}"
    );
    assert!(
        r["results"][1]["expected"]
            .as_str()
            .is_some_and(|e| e.contains("within 0.5 s")),
        "{r}"
    );
    let n = &records[1];
    assert_eq!(n["passed"], false, "{n}");
    assert!(
        n["results"][0]["seen"]
            .as_str()
            .is_some_and(|s| s.contains("not run: slow ran past its time limit")),
        "{n}"
    );
    // In text, the file's FAILED line and the run's summary still come.
    let (out, text) = nrt(&["scenario", "run"], &[file, after]);
    assert_eq!(out.status.code(), Some(2), "{text}");
    assert!(
        text.contains("FAILED slow (")
            && text.contains("scenario files: 0 of 2 passed (1 not run after the time limit)"),
        "{text}"
    );
}

#[test]
fn a_file_that_checks_nothing_a_bad_time_limit_and_a_multi_line_reason_each_fail_on_one_line() {
    let dir = tempfile::tempdir().unwrap();
    let write = |name: &str, text: &str| {
        let p = dir.path().join(name);
        std::fs::write(&p, text).unwrap();
        p
    };
    let cases = [
        (
            write("nothing.toml", "description = \"no checks\"\n"),
            "FAIL nothing file: at least one expectation",
        ),
        (
            write(
                "limit.toml",
                "time_limit_s = 0\n[[steps]]\naction = \"sleep\"\nms = 1\n",
            ),
            "0 seconds: must be a positive number of seconds",
        ),
        (
            // Not "0 or more", as it said for a negative limit while refusing 0.
            write(
                "negative.toml",
                "time_limit_s = -1\n[[steps]]\naction = \"sleep\"\nms = 1\n",
            ),
            "-1 seconds: must be a positive number of seconds",
        ),
        (
            write(
                "hbm.toml",
                "[device]\nhbm = \"lots\"\n[[steps]]\naction = \"sleep\"\nms = 1\n",
            ),
            "FAIL hbm setup: simdev starts",
        ),
    ];
    for (file, said) in cases {
        let (out, text) = nrt(&["scenario", "run"], &[file]);
        assert!(!out.status.success(), "{text}");
        let stdout = String::from_utf8_lossy(&out.stdout);
        let fails: Vec<&str> = stdout.lines().filter(|l| l.starts_with("FAIL ")).collect();
        assert_eq!(fails.len(), 1, "{text}");
        assert!(fails[0].contains(said), "{text}");
        // Every line of the report is a FAIL/PASS line, a file's verdict or the summary.
        assert!(
            stdout.lines().all(
                |l| ["FAIL ", "PASS ", "FAILED ", "PASSED ", "scenario files: "]
                    .iter()
                    .any(|p| l.starts_with(p))
            ),
            "{text}"
        );
    }
}

#[test]
fn a_client_whose_device_is_gone_stops_executing_and_waits_for_its_signal() {
    use std::io::BufRead;
    let mut sim =
        runtime::backend::sim::PrivateSimdev::spawn(&tests::simdev_command(&["--hbm", "16M"]))
            .unwrap();
    let mut client = Command::new(env!("CARGO_BIN_EXE_nrt"))
        .args(["scenario", "client", "--bytes", "64", "--socket"])
        .arg(sim.socket())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = std::io::BufReader::new(client.stdout.take().unwrap()).lines();
    let ready = lines.next().unwrap().unwrap();
    assert!(ready.starts_with("ready "), "{ready}");
    // Some executions, then the device goes away under the client.
    let progress = lines.next().unwrap().unwrap();
    assert!(progress.starts_with("progress "), "{progress}");
    sim.stop();
    std::thread::sleep(std::time::Duration::from_millis(500));
    let pid = nix::unistd::Pid::from_raw(i32::try_from(client.id()).unwrap());
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM).unwrap();
    let done = lines
        .map_while(Result::ok)
        .find_map(|l| l.strip_prefix("done ").map(str::to_owned))
        .expect("a done line");
    assert!(client.wait().unwrap().success());
    let d: serde_json::Value = serde_json::from_str(&done).unwrap();
    let (executions, failures) = (
        d["executions"].as_u64().unwrap(),
        d["failures"].as_u64().unwrap(),
    );
    // Each of its two cores failed at most twice (the doorbell to a gone device, NRT_HW_ERROR,
    // degrades the core; the next call is 101) and took no more: half a second of retrying
    // would have been tens of thousands.
    assert!((1..=4).contains(&failures) && executions < 10_000, "{done}");
}

/// Starts `nrt scenario run` of scenario 11 (two client processes) with its temporary files
/// in `tmp`; returns once a client is running.
fn two_clients_running(tmp: &Path) -> std::process::Child {
    use std::io::BufRead;
    let mut run = Command::new(env!("CARGO_BIN_EXE_nrt"))
        .args(["scenario", "run"])
        .arg(repo().join("scenarios/11_two_clients.toml"))
        .env("TMPDIR", tmp)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let mut lines = std::io::BufReader::new(run.stdout.take().unwrap()).lines();
    let first = lines.next().unwrap().unwrap();
    assert!(first.contains("spawn_client(a)"), "{first}");
    // The rest is read on (a closed pipe would end the run with SIGPIPE first).
    std::thread::spawn(move || lines.for_each(drop));
    run
}

/// Whether `dir` becomes empty within 10 s.
fn empties(dir: &Path) -> bool {
    let t0 = std::time::Instant::now();
    while t0.elapsed() < std::time::Duration::from_secs(10) {
        if std::fs::read_dir(dir).unwrap().next().is_none() {
            return true;
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    false
}

#[test]
fn a_scenario_run_stopped_by_a_signal_or_killed_leaves_nothing_in_tmpdir() {
    use nix::sys::signal::{Signal, kill};
    for signal in [Signal::SIGTERM, Signal::SIGINT, Signal::SIGKILL] {
        let tmp = tempfile::tempdir().unwrap();
        let mut run = two_clients_running(tmp.path());
        kill(
            nix::unistd::Pid::from_raw(i32::try_from(run.id()).unwrap()),
            signal,
        )
        .unwrap();
        let status = run.wait().unwrap();
        if signal == Signal::SIGKILL {
            assert!(!status.success(), "{signal}: {status}");
        } else {
            assert_eq!(status.code(), Some(130), "{signal}: {status}");
        }
        // The private simdev (and its clients' stderr) left nothing: a signal runs the exit
        // hook; after SIGKILL simdev, orphaned, removes its own directory.
        let left: Vec<_> = std::fs::read_dir(tmp.path())
            .unwrap()
            .filter_map(Result::ok)
            .map(|e| e.path())
            .collect();
        assert!(empties(tmp.path()), "{signal}: {left:?}");
    }
}

#[test]
fn a_lifecycle_that_could_not_initialise_fails_without_expect_codes() {
    // The scenario's own runtime holds NC 0, so the lifecycle client's init is refused: it
    // used to pass, as the client still exits 0.
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("vacuous_lifecycle.toml");
    std::fs::write(
        &file,
        "description = \"a lifecycle on a held NC\"\n\
         [device]\nncs = 1\nhbm = \"16M\"\n\
         [models.id]\nbuilder = \"identity\"\n\
         [[steps]]\naction = \"lifecycle\"\n",
    )
    .unwrap();
    let (out, text) = nrt(&["scenario", "run"], &[file]);
    assert_eq!(out.status.code(), Some(1), "{text}");
    assert!(
        text.contains(
            "FAIL vacuous_lifecycle step 1 lifecycle: init returns NRT_SUCCESS — NRT_EXEC_NC_BUSY"
        ) && text.contains("execute returns NRT_SUCCESS — NRT_UNINITIALIZED"),
        "{text}"
    );
}

#[test]
fn a_failed_step_is_followed_on_stderr_by_what_simdev_logged() {
    // The reference worker cannot start: the executions end with 1004, and why is in simdev's
    // log, which goes with its private directory.
    let out = Command::new(env!("CARGO_BIN_EXE_nrt"))
        .args(["scenario", "run"])
        .arg(repo().join("scenarios/29_neff_reference.toml"))
        .env("NEURON_SIMDEV_PYTHON", "/bin/false")
        .output()
        .unwrap();
    let (stdout, stderr) = (
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
    );
    assert_eq!(out.status.code(), Some(1), "{stdout}\n{stderr}");
    assert!(
        stderr.contains(
            "29_neff_reference step 2 reference-backed executions: simdev: NC 0 execution 0 failed"
        ) && stderr.contains("the reference worker (\"/bin/false\""),
        "{stderr}"
    );
    // stdout keeps its one-line-per-expectation format.
    assert!(
        stdout.lines().all(|l| l.starts_with("PASS ")
            || l.starts_with("FAIL ")
            || l.starts_with("FAILED ")
            || l.starts_with("PASSED ")
            || l.starts_with("scenario files:")),
        "{stdout}"
    );
}
