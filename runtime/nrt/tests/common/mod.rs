//! Helpers of the operator-tool tests: a shared simdev (`nrt simdev` on a private socket) and
//! runtime processes (`nrt bench` children) that hold its NCs while a tool looks at them.

#![allow(dead_code)] // each test binary uses its own subset

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

use runtime::backend::sim::{PrivateSimdev, SimdevCommand};

/// The `nrt` binary under test.
pub fn nrt_bin() -> &'static str {
    env!("CARGO_BIN_EXE_nrt")
}

/// A simdev (`nrt simdev ARGS`) on a private socket, stopped on drop.
pub fn start_simdev(args: &[&str]) -> PrivateSimdev {
    PrivateSimdev::spawn(&SimdevCommand {
        program: PathBuf::from(nrt_bin()),
        args_prefix: vec!["simdev".into()],
        extra_args: args.iter().map(Into::into).collect(),
    })
    .expect("simdev starts")
}

/// `nrt` with the environment cleaned of device selection, pointed at `socket`.
pub fn nrt_command(socket: &Path) -> Command {
    let mut c = Command::new(nrt_bin());
    c.env_remove("NEURON_RT_BACKEND")
        .env_remove("NEURON_LOGICAL_NC_CONFIG")
        .env_remove("NEURON_RT_VISIBLE_CORES")
        .env_remove("NEURON_RT_NUM_CORES")
        .env_remove("NEURON_RT_TRACE")
        .env("NEURON_SIMDEV_SOCKET", socket);
    c
}

/// A child process killed (SIGKILL) and reaped on drop, with the temporary directory its
/// datastore went to (removed after it).
pub struct Reaped(pub Child, Option<tempfile::TempDir>);

impl Reaped {
    /// `child`, killed and reaped on drop.
    pub fn new(child: Child) -> Self {
        Self(child, None)
    }

    /// The child's pid.
    pub fn pid(&self) -> u32 {
        self.0.id()
    }
}

impl Drop for Reaped {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// A runtime process: `nrt bench --model identity` for `iterations` executions on `ncs`
/// logical cores, with `env` added. Its datastore goes to a temporary directory of its own
/// unless `env` names one (`NEURON_RT_DATASTORE_DIR`): tests never write `/dev/shm`.
pub fn spawn_runtime(socket: &Path, ncs: u32, iterations: u64, env: &[(&str, &str)]) -> Reaped {
    let own_dir = tempfile::tempdir().expect("a temporary datastore directory");
    let child = nrt_command(socket)
        .env("NEURON_RT_DATASTORE_DIR", own_dir.path())
        .args(["bench", "--model", "identity", "--json"])
        .args([
            "--ncs",
            &ncs.to_string(),
            "--iterations",
            &iterations.to_string(),
        ])
        .envs(env.iter().copied())
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("nrt bench starts");
    Reaped(child, Some(own_dir))
}

/// Polls `f` until it returns `Some`, for at most a timeout (the workspace harness's).
#[allow(unused_imports)] // not every test binary polls
pub use tests::wait_for;
