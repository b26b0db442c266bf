//! `nrt ls --json-output` in neuron-ls's schema, with two runtime processes holding NCs of a
//! shared simdev: every field's name and type, and the values the device and processes imply.

mod common;

use std::time::Duration;

use common::*;
use serde::Deserialize;

/// neuron-ls's device object, field by field, with the documented types. Unknown fields are
/// allowed (ours: `nrt`); a missing or mistyped documented field fails to parse.
#[derive(Deserialize, Debug)]
struct NeuronDevice {
    neuron_device: u32,
    bdf: String,
    cpu_affinity: String,
    numa_node: String,
    connected_to: Vec<u32>,
    nc_count: u32,
    logical_neuroncore_config: u32,
    memory_size: u64,
    neuroncore_ids: Vec<u32>,
    neuron_processes: Vec<NeuronProcess>,
}

#[derive(Deserialize, Debug)]
#[serde(deny_unknown_fields)]
struct NeuronProcess {
    pid: u32,
    command: String,
    neuron_runtime_version: String,
}

fn ls_json(socket: &std::path::Path, flag: &str, env: &[(&str, &str)]) -> Vec<NeuronDevice> {
    let out = nrt_command(socket)
        .args(["ls", flag])
        .envs(env.iter().copied())
        .output()
        .expect("nrt ls runs");
    assert!(
        out.status.success(),
        "nrt ls failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "not neuron-ls's schema ({e}): {}",
            String::from_utf8_lossy(&out.stdout)
        )
    })
}

/// `nrt ls` until it lists every pid of `pids`.
fn ls_listing(socket: &std::path::Path, pids: &[u32], env: &[(&str, &str)]) -> Vec<NeuronDevice> {
    wait_for(Duration::from_secs(60), || {
        let devices = ls_json(socket, "--json-output", env);
        let listed = devices[0]
            .neuron_processes
            .iter()
            .filter(|p| pids.contains(&p.pid))
            .count();
        (listed == pids.len()).then_some(devices)
    })
    .expect("both runtime processes are listed within a minute")
}

#[test]
fn ls_json_output_has_neuron_ls_fields_and_lists_the_processes_holding_ncs() {
    let sim = start_simdev(&["--arch", "trn1", "--ncs", "4", "--hbm", "256M"]);
    let a = spawn_runtime(
        sim.socket(),
        1,
        100_000_000,
        &[("NEURON_RT_VISIBLE_CORES", "0")],
    );
    let b = spawn_runtime(
        sim.socket(),
        2,
        100_000_000,
        &[("NEURON_RT_VISIBLE_CORES", "2-3")],
    );
    let devices = ls_listing(sim.socket(), &[a.pid(), b.pid()], &[]);
    assert_eq!(devices.len(), 1, "one simulated device");
    let d = &devices[0];
    assert_eq!(d.neuron_device, 0);
    assert_eq!(d.bdf, "sim:00.0", "simdev is no PCI device and says so");
    assert!(
        d.cpu_affinity
            .chars()
            .all(|c| c.is_ascii_digit() || c == '-' || c == ','),
        "a cpu list: {:?}",
        d.cpu_affinity
    );
    assert!(!d.cpu_affinity.is_empty());
    assert_eq!(d.numa_node, "-1");
    assert_eq!(d.connected_to, Vec::<u32>::new());
    assert_eq!(d.nc_count, 4);
    assert_eq!(d.logical_neuroncore_config, 1);
    assert_eq!(d.memory_size, 4 * 256 * 1024 * 1024);
    assert_eq!(d.neuroncore_ids, vec![0, 1, 2, 3]);
    assert_eq!(d.neuron_processes.len(), 2, "{:?}", d.neuron_processes);
    for (p, child) in d.neuron_processes.iter().zip([&a, &b]) {
        assert_eq!(p.pid, child.pid(), "ordered by their first NC");
        assert!(
            p.command.contains("nrt bench --model identity"),
            "{:?}",
            p.command
        );
        assert_eq!(p.neuron_runtime_version, runtime::RUNTIME_VERSION);
    }
    // `--json` is an alias, and the table prints the same processes.
    let alias = ls_json(sim.socket(), "--json", &[]);
    assert_eq!(alias[0].nc_count, 4);
    let table = nrt_command(sim.socket()).arg("ls").output().unwrap();
    let text = String::from_utf8_lossy(&table.stdout);
    assert!(text.contains("logical-neuroncore-config: 1"), "{text}");
    for child in [&a, &b] {
        assert!(text.contains(&format!("| {} ", child.pid())), "{text}");
    }
    drop((a, b));
    let after = wait_for(Duration::from_secs(10), || {
        let d = ls_json(sim.socket(), "-j", &[]);
        d[0].neuron_processes.is_empty().then_some(d)
    });
    assert!(after.is_some(), "killed processes leave the list");
}

#[test]
fn ls_at_lnc_2_counts_logical_cores() {
    let sim = start_simdev(&["--arch", "trn2", "--ncs", "8", "--hbm", "64M"]);
    let lnc2 = [("NEURON_LOGICAL_NC_CONFIG", "2")];
    let a = spawn_runtime(
        sim.socket(),
        1,
        100_000_000,
        &[("NEURON_LOGICAL_NC_CONFIG", "2")],
    );
    // Set, or unset (on trn2 libnrt's default is 2): the same listing.
    for env in [&lnc2[..], &[]] {
        let devices = ls_listing(sim.socket(), &[a.pid()], env);
        let d = &devices[0];
        assert_eq!((d.nc_count, d.logical_neuroncore_config), (4, 2), "{env:?}");
        assert_eq!(d.neuroncore_ids, vec![0, 1, 2, 3]);
        assert_eq!(d.memory_size, 8 * 64 * 1024 * 1024);
    }
    // LNC=1 asked for: eight logical cores.
    let devices = ls_listing(
        sim.socket(),
        &[a.pid()],
        &[("NEURON_LOGICAL_NC_CONFIG", "1")],
    );
    assert_eq!(
        (devices[0].nc_count, devices[0].logical_neuroncore_config),
        (8, 1)
    );
    // On trn1, LNC=2 does not exist: refused, naming both.
    let trn1 = start_simdev(&["--arch", "trn1", "--hbm", "64M"]);
    let out = nrt_command(trn1.socket())
        .args(["ls", "-j"])
        .envs(lnc2)
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("trn2") && err.contains("trn1"), "{err}");
}

#[test]
fn ls_and_monitor_give_up_on_a_stopped_simdev_instead_of_hanging() {
    use nix::sys::signal::{Signal, kill};
    use nix::unistd::Pid;
    let sim = start_simdev(&["--hbm", "16M"]);
    let pid = Pid::from_raw(i32::try_from(sim.pid()).unwrap());
    kill(pid, Signal::SIGSTOP).unwrap();
    let t = std::time::Instant::now();
    let ls = nrt_command(sim.socket())
        .args(["ls", "-j"])
        .output()
        .unwrap();
    let monitor = nrt_command(sim.socket())
        .args(["monitor", "--period", "100ms", "--count", "1"])
        .output()
        .unwrap();
    let took = t.elapsed();
    kill(pid, Signal::SIGCONT).unwrap();
    let err = String::from_utf8_lossy(&ls.stderr);
    assert!(!ls.status.success(), "{err}");
    assert!(
        err.contains("did not answer within 5s (is simdev stopped or stuck?)"),
        "{err}"
    );
    // The monitor still writes its document, the hardware counters' error naming the cause.
    let doc: serde_json::Value = serde_json::from_slice(&monitor.stdout).unwrap();
    let hw_error = doc["system_data"]["neuron_hw_counters"]["error"]
        .as_str()
        .unwrap();
    assert!(hw_error.contains("did not answer within 5s"), "{doc}");
    assert!(took < Duration::from_secs(30), "both gave up ({took:?})");
}

#[test]
fn monitor_says_when_the_datastore_directory_or_a_file_cannot_be_read() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("missing");
    let garbage = dir.path().join("nrt-datastore-1");
    std::fs::write(&garbage, b"garbage").unwrap();
    for (at, said) in [
        (missing.as_path(), "cannot be listed"),
        (dir.path(), "is not a readable datastore"),
    ] {
        let o = std::process::Command::new(env!("CARGO_BIN_EXE_nrt"))
            .args(["monitor", "--count", "2", "--period", "50ms"])
            .env("NEURON_RT_DATASTORE_DIR", at)
            .env_remove("NEURON_SIMDEV_SOCKET")
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(o.status.success(), "{err}");
        assert_eq!(
            err.matches(said).count(),
            1,
            "said once, not per period:\n{err}"
        );
        assert!(err.contains(&at.display().to_string()), "{err}");
    }
}
