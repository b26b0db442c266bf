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
}
