//! A simdev whose log cannot be written (stderr on a full disk, here `/dev/full`) keeps serving:
//! a failed log write is dropped, never reported with the `eprintln!` that panics — which
//! killed the connection thread at its first log line, so the client's execution waited out
//! its timeout and the NC stayed claimed for every later client.

use std::fs::OpenOptions;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::Duration;

use runtime::Runtime;
use runtime::backend::sim::SimDevice;
use runtime::config::RuntimeConfig;
use tests::bench::IdentityIo;
use tests::wait_for;

/// Kills and reaps the simdev when dropped.
struct Simdev(Child);

impl Drop for Simdev {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[test]
fn a_simdev_whose_stderr_is_full_keeps_serving_client_after_client() {
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("simdev.sock");
    let full = OpenOptions::new().write(true).open("/dev/full").unwrap();
    let program = tests::simdev_command(&[]).program;
    let mut sim = Simdev(
        Command::new(program)
            .arg("--socket")
            .arg(&socket)
            // Every connection and execution logs (a line per message at trace).
            .env("RUST_LOG", "trace")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(full)
            .spawn()
            .expect("simdev starts"),
    );
    wait_for(Duration::from_secs(20), || socket.exists().then_some(())).expect("simdev listens");
    for client in 0..3 {
        let dev = Arc::new(SimDevice::connect(&socket).expect("connect"));
        let cfg = RuntimeConfig {
            exec_timeout: Duration::from_secs(10),
            ..RuntimeConfig::default()
        };
        let rt = Runtime::init(dev, cfg).unwrap_or_else(|e| panic!("client {client}: {e}"));
        let io = IdentityIo::load(&rt, 64);
        let data: Vec<u8> = (0..64u8)
            .map(|b| b.wrapping_mul(7).wrapping_add(client))
            .collect();
        io.input.write(&data, 0).unwrap();
        for e in 0..5 {
            rt.execute(io.model, &io.inputs, &io.outputs)
                .unwrap_or_else(|err| panic!("client {client}, execution {e}: {err}"));
        }
        let mut out = vec![0u8; 64];
        io.output.read(&mut out, 0).unwrap();
        assert_eq!(out, data, "client {client}");
        rt.close();
    }
    assert!(
        sim.0.try_wait().unwrap().is_none(),
        "simdev is still running"
    );
}
