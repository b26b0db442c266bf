//! The directories of private simdevs that never started: a runtime killed (SIGKILL) between
//! making `simdev-*` (with its `simdev.log`) and spawning simdev leaves it, with no process to
//! remove it (a simdev that started removes its own, even orphaned). The next private simdev
//! started in that temp directory sweeps them ([`sweep`]).
//!
//! Only what is certainly abandoned goes: a directory named `simdev-*` of this user, holding
//! nothing but an empty-or-not `simdev.log` (no socket: a simdev that listened is never
//! touched), untouched for [`ABANDONED_AFTER`] (longer than any start takes); its log is
//! removed, then the directory with `rmdir`, which fails on anything else in it.

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

/// How long a socketless `simdev-*` directory is left alone: a start waits at most
/// [`super::SIMDEV_START_TIMEOUT`] for simdev to listen.
pub(super) const ABANDONED_AFTER: Duration = Duration::from_secs(120);

/// Removes the abandoned private-simdev directories of `tmp` (see the module docs); returns
/// them. Errors are skipped: a sweep is best effort.
pub(super) fn sweep(tmp: &Path) -> Vec<PathBuf> {
    let Ok(entries) = std::fs::read_dir(tmp) else {
        return Vec::new();
    };
    let uid = nix::unistd::geteuid().as_raw();
    let now = SystemTime::now();
    let old = |m: &std::fs::Metadata| {
        m.modified()
            .ok()
            .and_then(|t| now.duration_since(t).ok())
            .is_some_and(|age| age > ABANDONED_AFTER)
    };
    let mut removed = Vec::new();
    for entry in entries.flatten() {
        if !entry.file_name().to_string_lossy().starts_with("simdev-") {
            continue;
        }
        let dir = entry.path();
        // Not following a link: the directory itself, ours, and old.
        let Ok(meta) = std::fs::symlink_metadata(&dir) else {
            continue;
        };
        if !meta.is_dir() || meta.uid() != uid || !old(&meta) {
            continue;
        }
        let Ok(inside) = std::fs::read_dir(&dir) else {
            continue;
        };
        let names: Vec<_> = inside.flatten().map(|e| e.file_name()).collect();
        let log = dir.join(crate::backend::sim::PRIVATE_LOG);
        let only_log = match names.as_slice() {
            [] => true,
            [one] => {
                one == crate::backend::sim::PRIVATE_LOG
                    && std::fs::symlink_metadata(&log)
                        .is_ok_and(|m| m.is_file() && m.uid() == uid && old(&m))
            }
            _ => false,
        };
        if !only_log {
            continue;
        }
        let _ = std::fs::remove_file(&log);
        if std::fs::remove_dir(&dir).is_ok() {
            removed.push(dir);
        }
    }
    removed
}

#[cfg(test)]
mod tests {
    use std::fs::File;

    use nix::sys::stat::{UtimensatFlags, utimensat};
    use nix::sys::time::TimeSpec;

    use super::*;

    /// Sets `path`'s times `age` into the past.
    fn age(path: &Path, age: Duration) {
        let t = SystemTime::now() - age;
        let since = t.duration_since(SystemTime::UNIX_EPOCH).unwrap();
        let ts = TimeSpec::from_duration(since);
        utimensat(
            nix::fcntl::AT_FDCWD,
            path,
            &ts,
            &ts,
            UtimensatFlags::NoFollowSymlink,
        )
        .unwrap();
    }

    fn simdev_dir(tmp: &Path, name: &str, files: &[&str], old: bool) -> PathBuf {
        let dir = tmp.join(name);
        std::fs::create_dir(&dir).unwrap();
        for f in files {
            File::create(dir.join(f)).unwrap();
            if old {
                age(&dir.join(f), ABANDONED_AFTER * 2);
            }
        }
        if old {
            age(&dir, ABANDONED_AFTER * 2);
        }
        dir
    }

    #[test]
    fn only_old_socketless_simdev_directories_holding_at_most_their_log_go() {
        let tmp = tempfile::tempdir().unwrap();
        let t = tmp.path();
        let abandoned = simdev_dir(t, "simdev-a", &["simdev.log"], true);
        let empty = simdev_dir(t, "simdev-b", &[], true);
        let fresh = simdev_dir(t, "simdev-c", &["simdev.log"], false);
        let listening = simdev_dir(t, "simdev-d", &["simdev.log", "simdev.sock"], true);
        let other = simdev_dir(t, "simdev-e", &["simdev.log", "notes.txt"], true);
        let not_ours = simdev_dir(t, "tool-f", &["simdev.log"], true);
        let mut removed = sweep(t);
        removed.sort();
        assert_eq!(removed, vec![abandoned.clone(), empty.clone()]);
        assert!(!abandoned.exists() && !empty.exists());
        for kept in [fresh, listening, other, not_ours] {
            assert!(kept.exists(), "{}", kept.display());
        }
    }
}
