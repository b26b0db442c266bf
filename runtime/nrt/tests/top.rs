//! `nrt top` in a real terminal: tmux runs a shell, the shell runs `nrt top --period 200ms`; the
//! test reads the screen with `capture-pane`, checks the view and that it refreshes, presses `q`
//! (and, in a second run, sends SIGTERM) and checks that top exited 0, the alternate screen was
//! left and the shell's screen came back.
//!
//! Skipped (with a message) only when `tmux` is not installed.

mod common;

use std::path::Path;
use std::process::{Command, Output};
use std::time::{Duration, Instant};

/// A private tmux server (its own socket name), killed at drop.
struct Tmux {
    name: String,
}

impl Tmux {
    fn available() -> bool {
        Command::new("tmux")
            .arg("-V")
            .output()
            .is_ok_and(|o| o.status.success())
    }

    fn new(tag: &str) -> Self {
        Self {
            name: format!("nrt-top-test-{tag}-{}", std::process::id()),
        }
    }

    fn run(&self, args: &[&str]) -> Output {
        let out = Command::new("tmux")
            .args(["-L", &self.name, "-f", "/dev/null"])
            .args(args)
            .output()
            .expect("tmux runs");
        assert!(
            out.status.success(),
            "tmux {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        out
    }

    fn screen(&self) -> String {
        String::from_utf8_lossy(&self.run(&["capture-pane", "-p", "-t", "t"]).stdout).into()
    }

    fn alternate_on(&self) -> bool {
        let out = self.run(&["display-message", "-p", "-t", "t", "#{alternate_on}"]);
        String::from_utf8_lossy(&out.stdout).trim() == "1"
    }

    /// Waits until the screen satisfies `ok`; returns it. A minute: on a loaded machine (this
    /// binary's four tests run at once, each with two benches flat out) a refresh took over
    /// 20 s, and one CI run failed waiting for one.
    fn wait_for(&self, what: &str, ok: impl Fn(&str) -> bool) -> String {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let s = self.screen();
            if ok(&s) {
                return s;
            }
            assert!(
                Instant::now() < deadline,
                "timed out waiting for {what}; screen:\n{s}"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

impl Drop for Tmux {
    fn drop(&mut self) {
        let _ = Command::new("tmux")
            .args(["-L", &self.name, "kill-server"])
            .output();
    }
}

/// The refresh counter in top's header.
fn refresh(screen: &str) -> Option<u64> {
    let rest = &screen[screen.find("refresh #")? + "refresh #".len()..];
    rest.split(|c: char| !c.is_ascii_digit())
        .next()?
        .parse()
        .ok()
}

/// The status `echo TOP-EXIT=$?` printed (the command line itself shows `TOP-EXIT=$?`).
fn exit_status(screen: &str) -> Option<u32> {
    screen.match_indices("TOP-EXIT=").find_map(|(i, m)| {
        let digits: String = screen[i + m.len()..]
            .chars()
            .take_while(char::is_ascii_digit)
            .collect();
        digits.parse().ok()
    })
}

/// Starts a shell in tmux, runs `nrt top` in it and waits for the first screen.
fn start_top(tmux: &Tmux, store: &Path) {
    start_top_on(tmux, store, None);
}

/// As [`start_top`], with simdev's socket when `socket` is given.
fn start_top_on(tmux: &Tmux, store: &Path, socket: Option<&Path>) {
    let shell = match socket {
        Some(s) => format!("env NEURON_SIMDEV_SOCKET={} sh", s.display()),
        None => "env -u NEURON_SIMDEV_SOCKET sh".to_owned(),
    };
    tmux.run(&[
        "new-session",
        "-d",
        "-s",
        "t",
        "-x",
        "160",
        "-y",
        "40",
        "-e",
        &format!("NEURON_RT_DATASTORE_DIR={}", store.display()),
        &shell,
    ]);
    tmux.wait_for("the shell's prompt", |s| !s.trim().is_empty());
    // The marker is printed by printf, so it is on the screen only once the shell ran it.
    let cmd = format!(
        "printf 'BEFORE-%s\\n' TOP; {} top --period 200ms; echo TOP-EXIT=$?",
        env!("CARGO_BIN_EXE_nrt")
    );
    tmux.run(&["send-keys", "-t", "t", &cmd, "Enter"]);
}

#[test]
fn top_shows_the_view_refreshes_and_q_restores_the_terminal() {
    if !Tmux::available() {
        eprintln!("skipped: tmux is not installed (.ci/run installs it)");
        return;
    }
    let store = tempfile::tempdir().unwrap();
    let tmux = Tmux::new("q");
    start_top(&tmux, store.path());
    // The screen may be caught mid-write: wait for all of it (the test times out with the
    // screen printed if a part never shows).
    let parts = [
        "nrt top",
        "NeuronCores",
        "PROCESS",
        "CORE",
        "UTIL",
        "EXEC/S",
        "P50",
        "P99",
        "ERRORS",
        "Processes",
        "DEVICE MEM",
        "runtimes 0 live, 0 stale",
        "period 200ms",
        "NEURON_SIMDEV_SOCKET is not set",
    ];
    let first = tmux.wait_for("top's whole first screen", |s| {
        refresh(s).is_some() && parts.iter().all(|p| s.contains(p))
    });
    assert!(tmux.alternate_on(), "top draws on the alternate screen");
    assert!(
        !first.contains("BEFORE-TOP"),
        "the shell's screen is hidden while top runs"
    );
    let n = refresh(&first).unwrap();
    let later = tmux.wait_for("a refresh", |s| refresh(s).is_some_and(|m| m >= n + 2));
    assert!(later.contains("NeuronCores"));

    tmux.run(&["send-keys", "-t", "t", "q"]);
    let after = tmux.wait_for("top's exit", |s| exit_status(s).is_some());
    assert_eq!(exit_status(&after), Some(0), "{after}");
    assert!(
        after.contains("BEFORE-TOP"),
        "the shell's screen is back:\n{after}"
    );
    assert!(
        !after.contains("NeuronCores"),
        "top's screen is gone:\n{after}"
    );
    assert!(!tmux.alternate_on(), "the alternate screen was left");
    // Raw mode is off: a line typed now is echoed and run by the shell.
    tmux.run(&["send-keys", "-t", "t", "echo cooked-$((6*7))", "Enter"]);
    tmux.wait_for("the shell to run a command", |s| s.contains("cooked-42"));
}

#[test]
fn top_restores_the_terminal_on_sigterm_and_esc() {
    if !Tmux::available() {
        eprintln!("skipped: tmux is not installed (.ci/run installs it)");
        return;
    }
    let store = tempfile::tempdir().unwrap();
    let tmux = Tmux::new("term");
    start_top(&tmux, store.path());
    tmux.wait_for("top's first screen", |s| refresh(s).is_some());
    // The shell's only child now is nrt top: signal it by its pid.
    let shell = tmux.run(&["display-message", "-p", "-t", "t", "#{pane_pid}"]);
    let shell = String::from_utf8_lossy(&shell.stdout).trim().to_string();
    let children = std::fs::read_to_string(format!("/proc/{shell}/task/{shell}/children"))
        .expect("the shell's children");
    let pids: Vec<i32> = children
        .split_whitespace()
        .filter_map(|p| p.parse().ok())
        .collect();
    assert_eq!(pids.len(), 1, "the shell runs one child: {children:?}");
    let comm = std::fs::read_to_string(format!("/proc/{}/comm", pids[0])).unwrap();
    assert_eq!(comm.trim(), "nrt");
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(pids[0]),
        nix::sys::signal::Signal::SIGTERM,
    )
    .unwrap();
    let after = tmux.wait_for("top's exit", |s| exit_status(s).is_some());
    assert_eq!(exit_status(&after), Some(0), "{after}");
    assert!(after.contains("BEFORE-TOP"), "{after}");
    assert!(!tmux.alternate_on());

    tmux.run(&["send-keys", "-t", "t", "clear", "Enter"]);
    tmux.wait_for("a clear screen", |s| {
        exit_status(s).is_none() && !s.contains("BEFORE")
    });
    let cmd = format!(
        "{} top --period 200ms; echo TOP-EXIT=$?",
        env!("CARGO_BIN_EXE_nrt")
    );
    tmux.run(&["send-keys", "-t", "t", &cmd, "Enter"]);
    tmux.wait_for("top's first screen", |s| refresh(s).is_some());
    tmux.run(&["send-keys", "-t", "t", "Escape"]);
    let after = tmux.wait_for("top's exit", |s| exit_status(s).is_some());
    assert_eq!(exit_status(&after), Some(0), "{after}");
    assert!(!tmux.alternate_on());
}

/// The row of `top`'s core table that names `pid`.
fn row_of(screen: &str, pid: u32) -> Option<String> {
    let pid = pid.to_string();
    screen
        .lines()
        .find(|l| l.split_whitespace().any(|w| w == pid) && l.contains("nc"))
        .map(str::to_owned)
}

#[test]
fn top_shows_two_runtime_processes_cores_and_their_figures_update() {
    if !Tmux::available() {
        eprintln!("skipped: tmux is not installed (.ci/run installs it)");
        return;
    }
    let sim = common::start_simdev(&["--arch", "trn1", "--ncs", "2", "--hbm", "64M"]);
    let store = tempfile::tempdir().unwrap();
    let dir = store.path().to_str().unwrap();
    let a = common::spawn_runtime(
        sim.socket(),
        1,
        100_000_000,
        &[
            ("NEURON_RT_VISIBLE_CORES", "0"),
            ("NEURON_RT_DATASTORE_DIR", dir),
        ],
    );
    let b = common::spawn_runtime(
        sim.socket(),
        1,
        100_000_000,
        &[
            ("NEURON_RT_VISIBLE_CORES", "1"),
            ("NEURON_RT_DATASTORE_DIR", dir),
        ],
    );
    let tmux = Tmux::new("two");
    start_top_on(&tmux, store.path(), Some(sim.socket()));
    let first = tmux.wait_for("both processes' cores", |s| {
        s.contains("runtimes 2 live, 0 stale")
            && row_of(s, a.pid()).is_some_and(|r| r.contains("nc0"))
            && row_of(s, b.pid()).is_some_and(|r| r.contains("nc1"))
    });
    assert!(first.contains("trn1"), "the device from simdev: {first}");
    // Both run flat out: each core's row shows executions per second, and the figures move.
    let n = refresh(&first).unwrap();
    let later = tmux.wait_for("two refreshes with both cores executing", |s| {
        refresh(s).is_some_and(|m| m >= n + 2)
            && [a.pid(), b.pid()].iter().all(|&pid| {
                row_of(s, pid).is_some_and(|r| {
                    r.split_whitespace()
                        .filter_map(|w| w.parse::<f64>().ok())
                        .any(|v| v > 0.0)
                })
            })
    });
    assert_ne!(
        row_of(&first, a.pid()),
        row_of(&later, a.pid()),
        "the row of a process that executes changes between refreshes"
    );
    assert!(
        later.contains("nrt bench --model"),
        "the command, not its directory: {later}"
    );
    tmux.run(&["send-keys", "-t", "t", "q"]);
    let after = tmux.wait_for("top's exit", |s| exit_status(s).is_some());
    assert_eq!(exit_status(&after), Some(0), "{after}");
    assert!(!tmux.alternate_on(), "the alternate screen was left");
}

#[test]
fn top_without_a_terminal_says_so_and_writes_nothing_to_stdout() {
    // Needs no tmux: stdout is a pipe here.
    let out = Command::new(common::nrt_bin())
        .args(["top", "--period", "200ms"])
        .stdin(std::process::Stdio::null())
        .output()
        .expect("nrt runs");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(
        out.stdout.is_empty(),
        "no screen control: {:?}",
        String::from_utf8_lossy(&out.stdout)
    );
    assert!(
        stderr.contains("nrt top: needs a terminal") && stderr.contains("nrt monitor"),
        "{stderr}"
    );
}
