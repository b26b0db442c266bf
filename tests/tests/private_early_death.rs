//! A private simdev told of its runtime's death before its handler is in place (the runtime
//! killed as `nrt_init` starts it) still cleans up: the spawner blocks the death signal, which
//! stays pending across exec until simdev unblocks it with its handler installed. Taking the
//! signal's default action instead, simdev died at once and left its directory behind.

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;

#[test]
fn a_death_signal_at_once_still_has_a_private_simdev_remove_its_directory() {
    for round in 0..5 {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("simdev-x");
        std::fs::create_dir(&dir).unwrap();
        std::fs::write(dir.join("simdev.log"), b"").unwrap();
        let program = tests::simdev_command(&[]).program;
        let mut cmd = Command::new(program);
        cmd.arg("--socket")
            .arg(dir.join("simdev.sock"))
            .arg("--private")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        shared::child::signal_with_parent(
            &mut cmd,
            shared::child::PRIVATE_SIMDEV_PARENT_DEATH_SIGNAL,
        );
        let mut child = cmd.spawn().unwrap();
        // At once: before simdev has got anywhere near its handler.
        let pid = Pid::from_raw(i32::try_from(child.id()).unwrap());
        kill(pid, shared::child::PRIVATE_SIMDEV_PARENT_DEATH_SIGNAL).unwrap();
        let t = Instant::now();
        let status = loop {
            if let Some(status) = child.try_wait().unwrap() {
                break status;
            }
            assert!(
                t.elapsed() < Duration::from_secs(30),
                "round {round}: simdev stops"
            );
            std::thread::sleep(Duration::from_millis(5));
        };
        use std::os::unix::process::ExitStatusExt;
        assert_ne!(
            status.signal(),
            Some(Signal::SIGUSR1 as i32),
            "round {round}: killed by the signal's default action"
        );
        assert!(
            !dir.exists(),
            "round {round}: {} is left ({status:?})",
            dir.display()
        );
    }
}
