//! A private simdev whose heap allocations the parent can count: simdev's own allocations per
//! execution (issue 17: "simdev allocates nothing per execution in steady state"), read from
//! the simdev process itself rather than guessed from the client's side.
//!
//! The child is the `counted-simdev` binary of this package (`src/bin/counted_simdev.rs`): its
//! global allocator is a [`CountingAlloc`], and its `main` is [`child_main`], which runs simdev
//! (`simdev::cli::main_with_args`, the whole simdev program) on a thread of its own while the
//! main thread serves a line protocol on stdin/stdout:
//!
//! | parent writes   | child answers                                                   |
//! |-----------------|-----------------------------------------------------------------|
//! | `allocations`   | `allocations <n>`: allocations (and reallocations) so far, all of simdev's threads |
//! | end of file     | the child exits (status 0): closing stdin stops it              |
//!
//! simdev's ready line (`simdev listening on ...`) comes first on the same stdout; stdout is
//! line-buffered and each line is written under its lock, so lines never interleave.
//! Answering costs the child no allocation once warm (the line buffer is reused and the
//! number is formatted straight into the locked stdout), so two queries in a row read the same
//! count: [`CountedSimdev::spawn`] makes the first query itself, and tests check the property.
//!
//! Why a separate binary rather than the test binary re-executed (as the benches' plain
//! private simdev is): in an integration test libtest owns `main`, so a re-executed test binary
//! cannot turn into simdev before the harness runs; cargo builds the package's binaries for its
//! tests and benches and names them in `CARGO_BIN_EXE_<name>`.

use std::ffi::OsString;
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, ExitCode, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use runtime::backend::sim::SimDevice;

use crate::bench::CountingAlloc;

/// The query line.
const QUERY: &str = "allocations";

/// How long the child may take to print its ready line or answer a query.
const ANSWER_TIMEOUT: Duration = Duration::from_secs(20);

/// The child's whole program: simdev with `args` (simdev's command line, without the program
/// name) on a thread, the allocation queries on this one. Returns when stdin closes; exits the
/// process with simdev's status when simdev stops first.
pub fn child_main(alloc: &'static CountingAlloc, args: Vec<OsString>) -> ExitCode {
    std::thread::Builder::new()
        .name("simdev".into())
        .spawn(move || {
            let argv = std::iter::once(OsString::from("simdev")).chain(args);
            let code = simdev::cli::main_with_args(argv);
            let _ = std::io::stdout().flush();
            std::process::exit(if code == ExitCode::SUCCESS { 0 } else { 1 });
        })
        .map_or(ExitCode::FAILURE, |_| serve_queries(alloc))
}

/// Answers queries until stdin closes. Allocation-free once warm: the line buffer is reused and
/// the answer is formatted into the locked stdout's own buffer.
fn serve_queries(alloc: &CountingAlloc) -> ExitCode {
    let stdin = std::io::stdin();
    let mut line = String::with_capacity(64);
    loop {
        line.clear();
        match stdin.lock().read_line(&mut line) {
            Ok(0) | Err(_) => return ExitCode::SUCCESS,
            Ok(_) => {}
        }
        let answer = if line.trim() == QUERY {
            Some(alloc.allocations())
        } else {
            None
        };
        let mut out = std::io::stdout().lock();
        let written = match answer {
            Some(n) => writeln!(out, "{QUERY} {n}"),
            None => writeln!(out, "error: unknown query (expected {QUERY:?})"),
        };
        if written.and_then(|()| out.flush()).is_err() {
            return ExitCode::FAILURE;
        }
    }
}

/// Why a counted simdev could not be started or asked.
#[derive(Debug, thiserror::Error)]
pub enum CountedSimdevError {
    /// Starting the child failed.
    #[error("starting {program}: {source}")]
    Spawn {
        /// The executable.
        program: PathBuf,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// A temporary directory for the socket could not be made.
    #[error("creating the socket directory: {0}")]
    TempDir(#[source] std::io::Error),
    /// The child did not print its ready line (it exited, or timed out); its log follows.
    #[error("simdev did not start ({what}); its log:\n{log}")]
    NotReady {
        /// What happened instead.
        what: String,
        /// simdev's stderr.
        log: String,
    },
    /// A query got no answer, or an answer that does not parse.
    #[error("the allocation query failed: {0}")]
    Query(String),
    /// Connecting the sim backend failed.
    #[error("connecting to simdev: {0}")]
    Connect(#[source] runtime::DeviceError),
}

/// A `counted-simdev` child on a private socket. Dropping it closes the child's stdin (it
/// exits) and reaps it, killing it if it has not exited within 2 s; it also gets SIGKILL when
/// the thread that spawned it exits (`PR_SET_PDEATHSIG`).
#[derive(Debug)]
pub struct CountedSimdev {
    child: Child,
    stdin: Option<ChildStdin>,
    lines: mpsc::Receiver<String>,
    socket: PathBuf,
    dir: tempfile::TempDir,
}

impl CountedSimdev {
    /// Starts `program` (the `counted-simdev` binary: `env!("CARGO_BIN_EXE_counted-simdev")`)
    /// as `program --socket <tmp>/simdev.sock extra_args...`, waits for simdev's ready line and
    /// makes one query (so the answer path is warm).
    ///
    /// # Errors
    /// [`CountedSimdevError`] naming the step that failed.
    pub fn spawn(program: &Path, extra_args: &[&str]) -> Result<Self, CountedSimdevError> {
        let dir = tempfile::Builder::new()
            .prefix("counted-simdev-")
            .tempdir()
            .map_err(CountedSimdevError::TempDir)?;
        let socket = dir.path().join("simdev.sock");
        let log = std::fs::File::create(dir.path().join("simdev.log"))
            .map_err(CountedSimdevError::TempDir)?;
        let mut cmd = Command::new(program);
        cmd.arg("--socket")
            .arg(&socket)
            .args(extra_args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(log);
        shared::child::kill_with_parent(&mut cmd);
        let mut child = cmd.spawn().map_err(|source| CountedSimdevError::Spawn {
            program: program.to_path_buf(),
            source,
        })?;
        let stdin = child.stdin.take();
        let stdout = child.stdout.take();
        let (tx, lines) = mpsc::channel();
        std::thread::spawn(move || {
            let Some(stdout) = stdout else { return };
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { return };
                if tx.send(line).is_err() {
                    return;
                }
            }
        });
        let mut this = Self {
            child,
            stdin,
            lines,
            socket,
            dir,
        };
        match this.lines.recv_timeout(ANSWER_TIMEOUT) {
            Ok(line) if line.starts_with("simdev listening on") => {}
            other => {
                let what = match other {
                    Ok(line) => format!("first line {line:?}"),
                    Err(mpsc::RecvTimeoutError::Disconnected) => "it exited".into(),
                    Err(mpsc::RecvTimeoutError::Timeout) => {
                        format!("no ready line within {ANSWER_TIMEOUT:?}")
                    }
                };
                this.stop();
                return Err(CountedSimdevError::NotReady {
                    what,
                    log: this.log(),
                });
            }
        }
        this.allocations()?;
        Ok(this)
    }

    /// The socket simdev listens on.
    pub fn socket(&self) -> &Path {
        &self.socket
    }

    /// The child's pid.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Times the simdev process's threads were preempted so far: the sum of their
    /// `nonvoluntary_ctxt_switches` (`/proc/<pid>/task/*/status`; 0 where `/proc` says nothing).
    pub fn preemptions(&self) -> u64 {
        let Ok(tasks) = std::fs::read_dir(format!("/proc/{}/task", self.pid())) else {
            return 0;
        };
        tasks
            .filter_map(|task| std::fs::read_to_string(task.ok()?.path().join("status")).ok())
            .filter_map(|status| {
                let line = status
                    .lines()
                    .find(|l| l.starts_with("nonvoluntary_ctxt_switches"))?;
                line.rsplit(':').next()?.trim().parse::<u64>().ok()
            })
            .sum()
    }

    /// simdev's stderr so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("simdev.log")).unwrap_or_default()
    }

    /// Connects the runtime's sim backend.
    ///
    /// # Errors
    /// [`CountedSimdevError::Connect`].
    pub fn connect(&self) -> Result<SimDevice, CountedSimdevError> {
        SimDevice::connect(&self.socket).map_err(CountedSimdevError::Connect)
    }

    /// simdev's heap allocations so far (all its threads).
    ///
    /// # Errors
    /// [`CountedSimdevError::Query`] when the child does not answer.
    pub fn allocations(&mut self) -> Result<u64, CountedSimdevError> {
        let stdin = self
            .stdin
            .as_mut()
            .ok_or_else(|| CountedSimdevError::Query("the child was stopped".into()))?;
        writeln!(stdin, "{QUERY}")
            .and_then(|()| stdin.flush())
            .map_err(|e| CountedSimdevError::Query(format!("writing the query: {e}")))?;
        let deadline = Instant::now() + ANSWER_TIMEOUT;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            let line = self.lines.recv_timeout(left).map_err(|e| {
                CountedSimdevError::Query(format!("no answer ({e}); simdev's log:\n{}", self.log()))
            })?;
            // Anything else simdev prints on stdout is not an answer.
            if let Some(n) = line.strip_prefix(QUERY).map(str::trim) {
                return n
                    .parse()
                    .map_err(|e| CountedSimdevError::Query(format!("answer {line:?}: {e}")));
            }
        }
    }

    /// Waits (up to 10 s) until simdev is quiescent: every thread of the child asleep
    /// (state `S` in `/proc/<pid>/task/*/stat`), twice in a row 1 ms apart. On a pinned CPU, a
    /// thread that was preempted after sending a reply or posting a notification is runnable,
    /// not asleep, so waiting for this puts the trailing work of the last request (a receive
    /// buffer made for the next message, an execution's clean-up after its notification) on
    /// one side of an allocation reading, deterministically.
    ///
    /// # Errors
    /// [`CountedSimdevError::Query`] when simdev does not go quiet in time.
    pub fn wait_quiescent(&self) -> Result<(), CountedSimdevError> {
        let tasks = PathBuf::from(format!("/proc/{}/task", self.pid()));
        let asleep = || -> Result<bool, String> {
            let dir = std::fs::read_dir(&tasks).map_err(|e| format!("{}: {e}", tasks.display()))?;
            for task in dir {
                let stat = task
                    .and_then(|t| std::fs::read_to_string(t.path().join("stat")))
                    .map_err(|e| format!("{}: {e}", tasks.display()))?;
                // `pid (comm) state ...`: comm may hold spaces and parentheses; the state
                // follows the last ')'.
                let state = stat
                    .rsplit_once(')')
                    .and_then(|(_, rest)| rest.trim_start().chars().next());
                if state != Some('S') {
                    return Ok(false);
                }
            }
            Ok(true)
        };
        let deadline = Instant::now() + Duration::from_secs(10);
        let mut quiet_checks = 0;
        while quiet_checks < 2 {
            if asleep().map_err(CountedSimdevError::Query)? {
                quiet_checks += 1;
            } else {
                quiet_checks = 0;
            }
            if Instant::now() > deadline {
                return Err(CountedSimdevError::Query(
                    "simdev did not go quiet within 10 s".into(),
                ));
            }
            std::thread::sleep(Duration::from_millis(1));
        }
        Ok(())
    }

    /// Closes the child's stdin (it exits) and reaps it; SIGKILL after 2 s.
    fn stop(&mut self) {
        drop(self.stdin.take());
        let deadline = Instant::now() + Duration::from_secs(2);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for CountedSimdev {
    fn drop(&mut self) {
        self.stop();
    }
}

/// What a run of executions cost simdev: its heap allocations (counted in the simdev process)
/// and the change of its NC counters over the run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SimdevCost {
    /// Executions the caller ran (the divisor of [`SimdevCost::per_call`]).
    pub calls: u64,
    /// simdev's heap allocations during the run, all its threads.
    pub allocations: u64,
    /// Executions simdev finished on the NC (`NcCounters::executions`).
    pub executions: u64,
    /// Executions run on the thread that delivered their doorbell.
    pub inline_executions: u64,
    /// Executions handed to the NC's sequencer thread.
    pub sequencer_handoffs: u64,
    /// Times simdev's threads were preempted (involuntary context switches) during the run.
    pub preemptions: u64,
}

impl SimdevCost {
    /// Runs `run` (which performs `calls` executions on `nc` and returns once they all
    /// completed) between two readings of `sim`'s allocation count and `dev`'s counters of
    /// `nc`. The counter requests themselves fall outside the allocation window, and both
    /// allocation readings are taken with simdev quiescent ([`CountedSimdev::wait_quiescent`]).
    ///
    /// # Errors
    /// A query or counter request that failed.
    pub fn measure(
        sim: &mut CountedSimdev,
        dev: &SimDevice,
        nc: u32,
        calls: u64,
        run: impl FnOnce(),
    ) -> Result<Self, String> {
        use runtime::Device;
        let counters = |dev: &SimDevice| dev.nc_counters(nc).map_err(|e| e.to_string());
        let c0 = counters(dev)?;
        sim.wait_quiescent().map_err(|e| e.to_string())?;
        let a0 = sim.allocations().map_err(|e| e.to_string())?;
        let p0 = sim.preemptions();
        run();
        let p1 = sim.preemptions();
        sim.wait_quiescent().map_err(|e| e.to_string())?;
        let a1 = sim.allocations().map_err(|e| e.to_string())?;
        let c1 = counters(dev)?;
        Ok(Self {
            calls,
            allocations: a1 - a0,
            executions: c1.executions - c0.executions,
            inline_executions: c1.inline_executions - c0.inline_executions,
            sequencer_handoffs: c1.sequencer_handoffs - c0.sequencer_handoffs,
            preemptions: p1.saturating_sub(p0),
        })
    }

    /// `count` per execution the caller ran.
    pub fn per_call(&self, count: u64) -> f64 {
        count as f64 / self.calls.max(1) as f64
    }
}
