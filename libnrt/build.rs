//! Gives the shared library libnrt's SONAME, so programs linked with `-lnrt` record
//! `libnrt.so.1` and `dlopen("libnrt.so.1")` finds an installed copy; records the source
//! revision for `nrt_get_version`.

fn main() {
    println!("cargo:rustc-cdylib-link-arg=-Wl,-soname,libnrt.so.1");
    let hash = std::process::Command::new("git")
        .args(["rev-parse", "HEAD"])
        .output()
        .ok()
        .filter(|o| o.status.success())
        .and_then(|o| String::from_utf8(o.stdout).ok())
        .map(|s| s.trim().to_string())
        .unwrap_or_default();
    println!("cargo:rustc-env=LIBNRT_GIT_HASH={hash}");
    println!("cargo:rerun-if-changed=build.rs");
    // A new commit moves HEAD or the branch it names: the hash is read again then.
    for path in git_paths(&["HEAD"]) {
        println!("cargo:rerun-if-changed={path}");
    }
    let head_ref = std::process::Command::new("git")
        .args(["symbolic-ref", "-q", "HEAD"])
        .output()
        .ok()
        .filter(|o| o.status.success())
        .and_then(|o| String::from_utf8(o.stdout).ok());
    if let Some(head_ref) = head_ref {
        for path in git_paths(&[head_ref.trim(), "packed-refs"]) {
            println!("cargo:rerun-if-changed={path}");
        }
    }
}

/// The files of the repository's git directory at `names` that exist (none outside a
/// checkout).
fn git_paths(names: &[&str]) -> Vec<String> {
    let Some(git_dir) = std::process::Command::new("git")
        .args(["rev-parse", "--absolute-git-dir"])
        .output()
        .ok()
        .filter(|o| o.status.success())
        .and_then(|o| String::from_utf8(o.stdout).ok())
    else {
        return Vec::new();
    };
    let git_dir = std::path::PathBuf::from(git_dir.trim());
    names
        .iter()
        .map(|n| git_dir.join(n))
        .filter(|p| p.exists())
        .map(|p| p.display().to_string())
        .collect()
}
