//! Backend selection (`runtime::backend::open`, DESIGN §5): auto prefers the device node, then
//! `NEURON_SIMDEV_SOCKET`, then a private simdev child with the requested arch, which stops
//! when the device is dropped. Options are built directly (no process environment), so these
//! tests run in parallel with the rest.

use std::path::PathBuf;
use std::time::Duration;

use runtime::backend::{BackendKind, DeviceError, OpenOptions, open};
use shared::address_map::Arch;
use tests::{simdev_command, start_simdev, wait_for};

fn pid_of(description: &str) -> u32 {
    description
        .split_whitespace()
        .skip_while(|w| *w != "pid")
        .nth(1)
        .and_then(|p| p.parse().ok())
        .unwrap_or_else(|| panic!("no pid in {description:?}"))
}

#[test]
fn auto_prefers_the_device_node_when_it_exists() {
    let dir = tempfile::tempdir().unwrap();
    // A file that is not a Neuron device: auto must try it (and fail on its ioctls), not
    // fall back to simdev.
    let node = dir.path().join("neuron0");
    std::fs::write(&node, b"").unwrap();
    let opts = OpenOptions {
        kind: BackendKind::Auto,
        neuron_device: node.clone(),
        simdev_bin: Some(PathBuf::from("/nonexistent/simdev")),
        ..OpenOptions::default()
    };
    let e = open(&opts).unwrap_err();
    assert!(
        matches!(
            e,
            DeviceError::Ioctl {
                op: "DEVICE_BASIC_INFO",
                source: nix::Error::ENOTTY,
                ..
            }
        ),
        "the neuron backend opened the node and asked the driver: {e:?}"
    );
}

#[test]
fn auto_without_a_node_connects_to_the_socket_before_spawning() {
    let sim = start_simdev(&["--arch", "trn2", "--hbm", "64M"]);
    let opts = OpenOptions {
        kind: BackendKind::Auto,
        neuron_device: PathBuf::from("/nonexistent/neuron0"),
        simdev_socket: Some(sim.socket().to_owned()),
        // Would fail if it were used.
        simdev_bin: Some(PathBuf::from("/nonexistent/simdev")),
        ..OpenOptions::default()
    };
    let dev = open(&opts).unwrap();
    assert_eq!(dev.backend_name(), "sim");
    assert_eq!(dev.info().arch, Arch::Trn2);
    assert_eq!(pid_of(&dev.info().description), sim.pid());
}

#[test]
fn a_private_simdev_gets_the_requested_arch_and_stops_with_the_device() {
    let opts = OpenOptions {
        kind: BackendKind::Auto,
        neuron_device: PathBuf::from("/nonexistent/neuron0"),
        simdev_bin: Some(simdev_command(&[]).program),
        simdev_args: vec!["--arch".into(), "trn2".into(), "--hbm".into(), "64M".into()],
        ..OpenOptions::default()
    };
    let dev = open(&opts).unwrap();
    assert_eq!(dev.info().arch, Arch::Trn2);
    let pid = pid_of(&dev.info().description);
    let proc_dir = PathBuf::from(format!("/proc/{pid}"));
    assert!(proc_dir.exists(), "the private simdev runs");
    drop(dev);
    assert!(
        wait_for(Duration::from_secs(5), || (!proc_dir.exists())
            .then_some(()))
        .is_some(),
        "the private simdev {pid} is gone (stopped and reaped) after the device is dropped"
    );
}

#[test]
fn the_default_private_simdev_is_trn1() {
    let opts = OpenOptions {
        kind: BackendKind::Sim,
        simdev_bin: Some(simdev_command(&[]).program),
        simdev_args: vec!["--hbm".into(), "64M".into()],
        ..OpenOptions::default()
    };
    let dev = open(&opts).unwrap();
    assert_eq!(dev.info().arch, Arch::Trn1);
}

/// The parent-death signal follows the thread that spawned a child, not the process: a private
/// simdev opened on a thread that then exits (a C program's `nrt_init` on a worker thread) must
/// outlive that thread and serve the device.
#[test]
fn a_private_simdev_outlives_the_thread_that_opened_it() {
    let opts = OpenOptions {
        kind: BackendKind::Sim,
        simdev_bin: Some(simdev_command(&[]).program),
        simdev_args: vec!["--hbm".into(), "64M".into()],
        ..OpenOptions::default()
    };
    let dev = std::thread::spawn(move || open(&opts).unwrap())
        .join()
        .unwrap();
    let pid = pid_of(&dev.info().description);
    // Time for a parent-death signal to arrive and act, were one sent.
    std::thread::sleep(Duration::from_millis(300));
    assert!(
        PathBuf::from(format!("/proc/{pid}")).exists(),
        "the private simdev {pid} died with the thread that opened it"
    );
    let _claimed = dev.claim_nc(0).expect("the device serves");
    assert_eq!(dev.semaphore_read(0, 0).unwrap(), 0);
}
