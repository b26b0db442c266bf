//! `nrt install --prefix DIR`: the C library and headers laid out like `/opt/aws/neuron`, so
//! `cc app.c -IDIR/include -LDIR/lib -lnrt` and `dlopen("libnrt.so.1")` work:
//!
//! - `DIR/lib/libnrt.so.1` (the built `libnrt.so`, found beside this executable — or in cargo's
//!   `deps/` there, if newer — or given with `--lib`) and the `DIR/lib/libnrt.so` link to it;
//! - `DIR/include/nrt/*.h` (carried inside this executable);
//! - `DIR/bin/nrt` (this executable) and the `DIR/bin/simdev` link to it: the library starts
//!   that simdev when no device is present (it looks beside itself, then in `../bin`).

use std::path::{Path, PathBuf};

/// The public headers, by file name.
pub const HEADERS: &[(&str, &str)] = &[
    ("nrt.h", include_str!("../../../libnrt/include/nrt/nrt.h")),
    (
        "nrt_status.h",
        include_str!("../../../libnrt/include/nrt/nrt_status.h"),
    ),
    (
        "nrt_version.h",
        include_str!("../../../libnrt/include/nrt/nrt_version.h"),
    ),
    (
        "nrt_async.h",
        include_str!("../../../libnrt/include/nrt/nrt_async.h"),
    ),
    (
        "nrt_experimental.h",
        include_str!("../../../libnrt/include/nrt/nrt_experimental.h"),
    ),
    (
        "nrt_profile.h",
        include_str!("../../../libnrt/include/nrt/nrt_profile.h"),
    ),
    (
        "nrt_sys_trace.h",
        include_str!("../../../libnrt/include/nrt/nrt_sys_trace.h"),
    ),
    (
        "ndebug_stream.h",
        include_str!("../../../libnrt/include/nrt/ndebug_stream.h"),
    ),
];

/// What was installed.
#[derive(Debug)]
pub struct Installed {
    /// `DIR/lib/libnrt.so.1`.
    pub library: PathBuf,
    /// `DIR/include/nrt`.
    pub headers: PathBuf,
    /// `DIR/bin/nrt`: this executable, copied.
    pub nrt: PathBuf,
    /// `DIR/bin/simdev`: a link to it.
    pub simdev: PathBuf,
    /// `DIR/share/nrt/libnrt.supp`: valgrind suppressions for programs using the library.
    pub suppressions: PathBuf,
}

/// What `valgrind --suppressions` needs for a leak check of a program using the library.
const SUPPRESSIONS: &str = include_str!("../../../libnrt/valgrind/libnrt.supp");

fn io_err(what: &Path, e: std::io::Error) -> String {
    format!("{}: {e}", what.display())
}

/// Replaces `dst` (a file or link, if any) with a copy of `src`: never writes into a file that
/// a running program may have mapped.
fn replace_with_copy(src: &Path, dst: &Path) -> Result<(), String> {
    if dst.symlink_metadata().is_ok() {
        std::fs::remove_file(dst).map_err(|e| io_err(dst, e))?;
    }
    std::fs::copy(src, dst).map_err(|e| io_err(dst, e))?;
    Ok(())
}

/// Replaces `link` (if any) with a symbolic link to `target`.
fn replace_with_link(target: &str, link: &Path) -> Result<(), String> {
    if link.symlink_metadata().is_ok() {
        std::fs::remove_file(link).map_err(|e| io_err(link, e))?;
    }
    std::os::unix::fs::symlink(target, link).map_err(|e| io_err(link, e))
}

/// The library beside this executable: `libnrt.so`, or cargo's `deps/libnrt.so` when that one
/// is newer (cargo refreshes only the latter when tests, not the package, needed the library).
fn library_beside(exe: &Path) -> Option<PathBuf> {
    let dir = exe.parent()?;
    let modified = |p: &Path| p.metadata().and_then(|m| m.modified()).ok();
    [dir.join("libnrt.so"), dir.join("deps").join("libnrt.so")]
        .into_iter()
        .filter(|p| p.is_file())
        .max_by_key(|p| modified(p))
        .or_else(|| Some(dir.join("libnrt.so")))
}

/// The cargo command that builds libnrt beside `exe`: a release build for an `nrt` in a
/// `release` directory (where `cargo build --release` puts it), a dev build otherwise.
fn build_command(exe: &Path) -> &'static str {
    match exe.parent().and_then(Path::file_name) {
        Some(dir) if dir == "release" => "cargo build --release -p libnrt",
        _ => "cargo build -p libnrt",
    }
}

/// Checks that `path` is an ELF shared object (`e_type` ET_DYN), so that a wrong `--lib` is
/// said now rather than by the linker of every program built against the prefix.
fn check_shared_object(path: &Path) -> Result<(), String> {
    let mut head = [0u8; 18];
    let read = std::fs::File::open(path)
        .and_then(|mut f| std::io::Read::read_exact(&mut f, &mut head))
        .map_err(|e| io_err(path, e));
    let kind = match (read, &head[..4], head[5]) {
        (Err(e), ..) => return Err(e),
        (Ok(()), b"\x7fELF", 1) => u16::from_le_bytes([head[16], head[17]]),
        (Ok(()), b"\x7fELF", _) => u16::from_be_bytes([head[16], head[17]]),
        _ => {
            return Err(format!(
                "{}: not an ELF file (not a built libnrt.so)",
                path.display()
            ));
        }
    };
    if kind != 3 {
        return Err(format!(
            "{}: an ELF file of type {kind}, not a shared object (ET_DYN): not a built libnrt.so",
            path.display()
        ));
    }
    Ok(())
}

/// Installs into `prefix`; the library is `lib`, else the one beside this executable.
///
/// # Errors
/// A message naming what is missing or which file could not be written.
pub fn install(prefix: &Path, lib: Option<&Path>) -> Result<Installed, String> {
    let exe = std::env::current_exe().map_err(|e| format!("this executable: {e}"))?;
    let source = match lib {
        Some(l) => l.to_path_buf(),
        None => library_beside(&exe).ok_or("this executable has no directory")?,
    };
    if !source.is_file() {
        return Err(format!(
            "{} not found: build it with `{}` (beside nrt) or pass --lib FILE",
            source.display(),
            build_command(&exe)
        ));
    }
    check_shared_object(&source)?;
    let lib_dir = prefix.join("lib");
    let include = prefix.join("include").join("nrt");
    let bin = prefix.join("bin");
    let share = prefix.join("share").join("nrt");
    for d in [&lib_dir, &include, &bin, &share] {
        std::fs::create_dir_all(d).map_err(|e| io_err(d, e))?;
    }
    let library = lib_dir.join("libnrt.so.1");
    replace_with_copy(&source, &library)?;
    replace_with_link("libnrt.so.1", &lib_dir.join("libnrt.so"))?;
    for (name, text) in HEADERS {
        let path = include.join(name);
        std::fs::write(&path, text).map_err(|e| io_err(&path, e))?;
    }
    let suppressions = share.join("libnrt.supp");
    std::fs::write(&suppressions, SUPPRESSIONS).map_err(|e| io_err(&suppressions, e))?;
    let nrt = bin.join("nrt");
    replace_with_copy(&exe, &nrt)?;
    let simdev = bin.join("simdev");
    replace_with_link("nrt", &simdev)?;
    Ok(Installed {
        library,
        headers: include,
        nrt,
        simdev,
        suppressions,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_build_hint_matches_the_profile_nrt_was_built_in() {
        assert_eq!(
            build_command(Path::new("/w/target/release/nrt")),
            "cargo build --release -p libnrt",
            "a release nrt looks for a release libnrt beside it"
        );
        assert_eq!(
            build_command(Path::new("/w/target/debug/nrt")),
            "cargo build -p libnrt"
        );
    }

    #[test]
    fn every_header_is_carried() {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../libnrt/include/nrt");
        let mut on_disk: Vec<String> = std::fs::read_dir(&dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        on_disk.sort();
        let mut carried: Vec<String> = HEADERS.iter().map(|(n, _)| n.to_string()).collect();
        carried.sort();
        assert_eq!(carried, on_disk);
    }

    #[test]
    fn only_an_elf_shared_object_is_taken_as_the_library() {
        let dir = tempfile::tempdir().unwrap();
        let file = |name: &str, bytes: &[u8]| {
            let p = dir.path().join(name);
            std::fs::write(&p, bytes).unwrap();
            p
        };
        let mut elf = *b"\x7fELF\x02\x01\x01\0\0\0\0\0\0\0\0\0\x03\0";
        check_shared_object(&file("so", &elf)).unwrap();
        elf[16] = 2; // ET_EXEC
        let e = check_shared_object(&file("exec", &elf)).unwrap_err();
        assert!(e.contains("type 2, not a shared object"), "{e}");
        let e = check_shared_object(&file("text", b"# README, long enough to read\n")).unwrap_err();
        assert!(e.contains("not an ELF file"), "{e}");
        let e = check_shared_object(&file("short", b"\x7fELF")).unwrap_err();
        assert!(e.contains("short"), "{e}");
    }

    #[test]
    fn the_newer_of_the_library_and_cargos_deps_copy_is_installed() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir(dir.path().join("deps")).unwrap();
        let exe = dir.path().join("nrt");
        let (top, deps) = (
            dir.path().join("libnrt.so"),
            dir.path().join("deps/libnrt.so"),
        );
        std::fs::write(&top, "old").unwrap();
        std::fs::write(&deps, "new").unwrap();
        let at = |p: &Path, secs| {
            let f = std::fs::File::options().write(true).open(p).unwrap();
            f.set_modified(std::time::UNIX_EPOCH + std::time::Duration::from_secs(secs))
                .unwrap();
        };
        at(&top, 1_000_000);
        at(&deps, 2_000_000);
        assert_eq!(library_beside(&exe), Some(deps.clone()));
        std::fs::remove_file(&deps).unwrap();
        assert_eq!(library_beside(&exe), Some(top));
    }

    #[test]
    fn a_missing_library_is_named() {
        let dir = tempfile::tempdir().unwrap();
        let e = install(dir.path(), Some(&dir.path().join("nope.so"))).unwrap_err();
        assert!(e.contains("nope.so not found"), "{e}");
    }
}
