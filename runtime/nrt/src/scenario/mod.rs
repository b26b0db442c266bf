//! `nrt scenario run FILE... [--json]`: scripted device scenarios (`scenarios/README.md`).
//!
//! Each file gets its own private simdev (re-executing this program as `nrt simdev`), a control
//! connection to it (faults, latency model, counters, device stats) and a runtime configured
//! from the file's `[runtime]` table. Steps run in order; every expectation prints one line
//! `PASS|FAIL <scenario> <where>: <expected> — <seen>` (or, with `--json`, each file prints one
//! JSON object). The exit code is non-zero when anything failed.

mod client;
mod models;
mod report;
mod runner;
mod spec;

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::mpsc;
use std::time::{Duration, Instant};

use clap::Subcommand;

use report::{FileReport, Outcome, Recorder};

/// `nrt scenario ...`.
#[derive(Subcommand, Debug)]
pub enum ScenarioCommand {
    /// Run scenario files; print a PASS/FAIL line per expectation; exit non-zero on any failure.
    Run {
        /// Scenario files (TOML).
        #[arg(required = true)]
        files: Vec<PathBuf>,
        /// Print one JSON object per file instead of text lines.
        #[arg(long)]
        json: bool,
    },
    /// Check scenario files without running them: each parses and its models build (what
    /// `run` refuses before its first step). Prints `ok FILE` or the error; exits non-zero
    /// on any error.
    Check {
        /// Scenario files (TOML).
        #[arg(required = true)]
        files: Vec<PathBuf>,
    },
    /// Write a built-in model as a container file (for `file = ...` models).
    BuildModel {
        /// `identity`, `identity_split`, `identity_cc`, `never_ending` or `digits`.
        #[arg(long)]
        builder: String,
        /// Tensor bytes (identity builders).
        #[arg(long)]
        bytes: Option<u32>,
        /// Images per execution (digits).
        #[arg(long)]
        batch: Option<u32>,
        /// The file to write.
        out: PathBuf,
    },
    /// A client process started by the runner (internal).
    #[command(hide = true)]
    Client(client::ClientArgs),
}

/// Logging for `nrt scenario`: `NEURON_RT_LOG_LEVEL` or `RUST_LOG`, else off for `run` (the
/// scenarios provoke errors on purpose; the PASS/FAIL lines say what happened) and `warn` for
/// the client processes (their stderr goes to a log file beside simdev's).
pub fn init_tracing(cmd: &ScenarioCommand) {
    let default = match cmd {
        ScenarioCommand::Run { .. } => "off",
        _ => "warn",
    };
    let filter = crate::log_filter(default);
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        // A log write that fails (a full disk, a closed stderr) is dropped: the default
        // reports it with `eprintln!`, which panics when stderr is what failed.
        .log_internal_errors(false)
        .try_init();
}

/// Runs `nrt scenario ...`.
pub fn main(cmd: ScenarioCommand) -> ExitCode {
    match cmd {
        ScenarioCommand::Run { files, json } => run_files(&files, json),
        ScenarioCommand::Check { files } => check_files(&files),
        ScenarioCommand::Client(args) => client::main(&args),
        ScenarioCommand::BuildModel {
            builder,
            bytes,
            batch,
            out,
        } => {
            let spec = spec::ModelSpec {
                builder: Some(builder),
                bytes,
                batch,
                ..spec::ModelSpec::default()
            };
            let written = models::BuiltModel::build(&file_name(&out), &spec, Path::new("."))
                .and_then(|m| {
                    std::fs::write(&out, &m.container)
                        .map_err(|e| format!("{}: {e}", out.display()))
                });
            match written {
                Ok(()) => ExitCode::SUCCESS,
                Err(e) => {
                    eprintln!("nrt scenario build-model: {e}");
                    ExitCode::FAILURE
                }
            }
        }
    }
}

/// `nrt scenario check`: what `run` checks before its first step, for every file.
fn check_files(files: &[PathBuf]) -> ExitCode {
    let mut failed = 0usize;
    for f in files {
        match check_file(f) {
            Ok(steps) => println!("ok {} ({steps} steps)", f.display()),
            Err(e) => {
                failed += 1;
                println!("{}: {}", f.display(), e.trim_end().replace('\n', "; "));
            }
        }
    }
    println!(
        "scenario files: {} of {} valid",
        files.len() - failed,
        files.len()
    );
    exit_code(failed)
}

/// Success when no file failed.
fn exit_code(failed: usize) -> ExitCode {
    if failed == 0 {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}

/// One file read, parsed and its models built; its step count.
fn check_file(path: &Path) -> Result<usize, String> {
    let text = std::fs::read_to_string(path).map_err(|e| format!("reading the file: {e}"))?;
    let sc = spec::parse(&text)?;
    let dir = path.parent().unwrap_or(Path::new("."));
    for (name, spec) in &sc.models {
        models::BuiltModel::build(name, spec, dir).map_err(|e| format!("model {name:?}: {e}"))?;
    }
    Ok(sc.steps.len())
}

fn file_name(path: &Path) -> String {
    path.file_stem().map_or_else(
        || path.display().to_string(),
        |s| s.to_string_lossy().into_owned(),
    )
}

/// Where a file stands in the run: the files after it and how many before it failed (the
/// time-limit watchdog, which ends the process, reports the run's end too).
struct RunPosition<'a> {
    after: &'a [PathBuf],
    total: usize,
    failed_before: usize,
}

/// The report of a file that was not run because an earlier one ran past its time limit.
fn not_run(path: &Path, because: &str) -> FileReport {
    FileReport {
        file: path.display().to_string(),
        scenario: file_name(path),
        description: None,
        passed: false,
        pass_count: 0,
        fail_count: 1,
        seconds: 0.0,
        results: vec![Outcome {
            pass: false,
            at: "file".into(),
            expected: "the file runs".into(),
            seen: format!("not run: {because} ran past its time limit"),
        }],
    }
}

/// Runs one file; returns its report.
fn run_file(path: &Path, json: bool, exe: &Path, pos: &RunPosition<'_>) -> FileReport {
    let start = Instant::now();
    let stem = file_name(path);
    let fail_report = |name: String, at: &str, expected: &str, seen: String| {
        let o = Outcome {
            pass: false,
            at: at.into(),
            expected: expected.into(),
            seen,
        };
        if !json {
            println!("{}", report::line(&name, &o));
        }
        FileReport {
            file: path.display().to_string(),
            scenario: name,
            description: None,
            passed: false,
            pass_count: 0,
            fail_count: 1,
            seconds: start.elapsed().as_secs_f64(),
            results: vec![o],
        }
    };
    let text = match std::fs::read_to_string(path) {
        Ok(t) => t,
        Err(e) => return fail_report(stem, "file", "the file can be read", e.to_string()),
    };
    let sc = match spec::parse(&text) {
        Ok(sc) => sc,
        Err(e) => {
            return fail_report(
                stem,
                "parse",
                "a valid scenario file",
                e.trim_end().replace('\n', "; "),
            );
        }
    };
    let name = sc.name.clone().unwrap_or(stem);
    let limit = Duration::from_secs_f64(sc.time_limit_s.unwrap_or(60.0));
    // A scenario that hangs (a runtime bug) must not hang the suite: past its time limit the
    // watchdog reports it and ends the process (simdev and clients die with it).
    let (done_tx, done_rx) = mpsc::channel::<()>();
    let (wname, wfile) = (name.clone(), path.display().to_string());
    let wdescription = sc.description.clone();
    let after: Vec<PathBuf> = pos.after.to_vec();
    let (total, failed_before) = (pos.total, pos.failed_before);
    let tally = std::sync::Arc::new(report::Tally::default());
    let counted = tally.clone();
    let watchdog = std::thread::spawn(move || {
        if let Err(mpsc::RecvTimeoutError::Timeout) = done_rx.recv_timeout(limit) {
            let o = Outcome {
                pass: false,
                at: "time limit".into(),
                expected: format!("the scenario finishes within {} s", limit.as_secs_f64()),
                seen: "it did not (a step hung, or the limit is too short); stopping: the files after this one are not run".into(),
            };
            let mut results = counted.outcomes();
            results.push(o.clone());
            let fail_count = results.iter().filter(|r| !r.pass).count();
            let r = FileReport {
                file: wfile,
                scenario: wname,
                description: wdescription,
                passed: false,
                pass_count: results.len() - fail_count,
                fail_count,
                seconds: limit.as_secs_f64(),
                results,
            };
            if json {
                println!("{}", serde_json::to_string(&r).unwrap_or_default());
                for f in &after {
                    let n = not_run(f, &r.scenario);
                    println!("{}", serde_json::to_string(&n).unwrap_or_default());
                }
            } else {
                println!("{}", report::line(&r.scenario, &o));
                print_file_line(&r);
                println!(
                    "scenario files: {} of {total} passed ({} not run after the time limit)",
                    total - failed_before - 1 - after.len(),
                    after.len()
                );
            }
            std::process::exit(2);
        }
    });
    let dir = path.parent().unwrap_or(Path::new(".")).to_owned();
    let mut runner = runner::Runner::new(&sc, &name, &dir, exe, !json);
    runner.rec.count_in(tally);
    runner.run();
    let mut outcomes = std::mem::replace(&mut runner.rec, Recorder::new(&name, false)).outcomes;
    drop(runner);
    if outcomes.is_empty() {
        // A file that checks nothing passes nothing: say why it fails.
        let o = Outcome {
            pass: false,
            at: "file".into(),
            expected:
                "at least one expectation (a step's expect keys, a check step or an [[expect]])"
                    .into(),
            seen: "the scenario checks nothing".into(),
        };
        if !json {
            println!("{}", report::line(&name, &o));
        }
        outcomes.push(o);
    }
    let _ = done_tx.send(());
    let _ = watchdog.join();
    let fail_count = outcomes.iter().filter(|o| !o.pass).count();
    FileReport {
        file: path.display().to_string(),
        scenario: name,
        description: sc.description.clone(),
        passed: fail_count == 0 && !outcomes.is_empty(),
        pass_count: outcomes.len() - fail_count,
        fail_count,
        seconds: start.elapsed().as_secs_f64(),
        results: outcomes,
    }
}

/// The `PASSED|FAILED <scenario> (<file>): ...` line.
fn print_file_line(r: &FileReport) {
    println!(
        "{} {} ({}): {} expectations held, {} did not, {:.2} s",
        if r.passed { "PASSED" } else { "FAILED" },
        r.scenario,
        r.file,
        r.pass_count,
        r.fail_count,
        r.seconds
    );
}

/// Runs every file in turn.
fn run_files(files: &[PathBuf], json: bool) -> ExitCode {
    let exe = match std::env::current_exe() {
        Ok(e) => e,
        Err(e) => {
            eprintln!("nrt scenario: cannot find this program: {e}");
            return ExitCode::FAILURE;
        }
    };
    let mut failed = 0usize;
    for (i, f) in files.iter().enumerate() {
        let pos = RunPosition {
            after: &files[i + 1..],
            total: files.len(),
            failed_before: failed,
        };
        let r = run_file(f, json, &exe, &pos);
        if !r.passed {
            failed += 1;
        }
        if json {
            println!("{}", serde_json::to_string(&r).unwrap_or_default());
        } else {
            print_file_line(&r);
        }
    }
    if !json {
        println!(
            "scenario files: {} of {} passed",
            files.len() - failed,
            files.len()
        );
    }
    exit_code(failed)
}
