//! Lifecycle and topology (`nrt.h`), status names (`nrt_status.h`) and the version
//! (`nrt_version.h`). The version, total-count and visible-count calls work before `nrt_init`.

use std::ffi::{CStr, CString, c_char, c_void};
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use runtime::backend::OpenOptions;
use runtime::backend::sim::SimdevCommand;
use runtime::{NrtError, nrt};
use shared::NrtStatus;
use zerocopy::IntoBytes;

use crate::abi::{self, NrtInstanceInfo, NrtVersion, NrtVncMemoryStats, c_field};
use crate::{boundary, raw, rt};

/// The directory of the file this code was loaded from (libnrt.so.1), from `/proc/self/maps`.
fn library_dir() -> Option<PathBuf> {
    let here = library_dir as *const () as usize;
    let maps = std::fs::read_to_string("/proc/self/maps").ok()?;
    maps.lines().find_map(|line| {
        let (range, rest) = line.split_once(' ')?;
        let (start, end) = range.split_once('-')?;
        let start = usize::from_str_radix(start, 16).ok()?;
        let end = usize::from_str_radix(end, 16).ok()?;
        if !(start..end).contains(&here) {
            return None;
        }
        // perms offset dev inode path
        let path = rest
            .split_whitespace()
            .skip(4)
            .collect::<Vec<_>>()
            .join(" ");
        Path::new(&path).parent().map(Path::to_path_buf)
    })
}

/// Where the runtime finds its device: the environment's choice; a private simdev is
/// `NEURON_SIMDEV_BIN`, else a `simdev` beside this library or in `../bin` (the layout of
/// `nrt install`), else the runtime's own search (beside the executable, then `PATH`).
pub(crate) fn open_options() -> Result<OpenOptions, NrtError> {
    let mut opts = OpenOptions::from_env()?;
    if let Some(d) = library_dir() {
        opts.simdev_searched = vec![d.join("simdev"), d.join("../bin/simdev")];
    }
    let beside = opts.simdev_searched.iter().find(|p| p.is_file()).cloned();
    if opts.simdev_bin.is_none()
        && let Some(beside) = beside
    {
        opts.simdev_command = Some(SimdevCommand {
            program: beside,
            args_prefix: Vec::new(),
            extra_args: Vec::new(),
        });
    }
    Ok(opts)
}

/// `nrt_init`: reads the environment, opens the device, reserves the logical cores.
///
/// # Safety
/// A C entry point: pointer arguments are NULL or valid as `include/nrt` documents.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nrt_init(
    framework: u32,
    fw_version: *const c_char,
    fal_version: *const c_char,
) -> u32 {
    boundary::read_log_level();
    boundary::status("nrt_init", || {
        fill_closed_standard_streams();
        if framework > abi::FRAMEWORK_TYPE_MAX {
            return Err(NrtError::new(
                NrtStatus::Invalid,
                format!("framework type {framework} is not an nrt_framework_type_t"),
            ));
        }
        let fw = raw::label(fw_version).unwrap_or_default();
        let fal = raw::label(fal_version).unwrap_or_default();
        tracing::info!(target: "nrt", framework, fw, fal, "nrt_init");
        nrt::init_with(&open_options()?)
    })
}

/// Opens `/dev/null` on each of descriptors 0, 1 and 2 that the program closed, before the
/// runtime makes any descriptor of its own: a new descriptor takes the lowest free number, so
/// with stdout closed an eventfd of the runtime's became descriptor 1, and the program's
/// `printf` wrote into it (an 8-byte write signals it); the private simdev's pipe took 2, and
/// the library's log lines went into that pipe. The streams stay what the program made them
/// otherwise.
fn fill_closed_standard_streams() {
    for fd in 0..3 {
        if std::path::Path::new(&format!("/proc/self/fd/{fd}")).exists() {
            continue;
        }
        let null = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open("/dev/null");
        match null {
            // The lowest free number: `fd` itself, and it stays open for the process's life.
            Ok(null) => {
                let _ = std::os::fd::IntoRawFd::into_raw_fd(null);
            }
            Err(_) => return,
        }
    }
}

/// `nrt_close`: stops the runtime and releases its cores.
///
/// # Safety
/// A C entry point: pointer arguments are NULL or valid as `include/nrt` documents.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nrt_close() {
    boundary::value("nrt_close", (), || {
        // The runtime drained its requests: write their `ret`, pass on their completions, drop
        // the eventfd relay's state — before a `nrt_close` racing this one on another thread
        // returns (it waits for this close). A forked child's relay state is its parent's:
        // untouched.
        let closed = nrt::close_then(|closed| {
            crate::completions::reset(closed == nrt::Closed::Drained);
            if closed == nrt::Closed::Drained {
                discard_device_tensors();
            }
        });
        if matches!(closed, nrt::Closed::Drained | nrt::Closed::Abandoned) {
            // Output-completion waits in progress end (NRT_CLOSED): nothing counts any more.
            CLOSES.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        }
        Ok(())
    });
}

/// Gives back the memory of the device tensors the caller has not freed, as libnrt's
/// `nrt_close` frees all device memory: the device freed it when the runtime let go, but the
/// tensors' mappings kept its pages alive for as long as the caller keeps their handles (an
/// init/close loop leaking a tensor per cycle grew by its size per cycle). The handles stay
/// valid for `nrt_tensor_free` (reads and writes answer NRT_CLOSED). Runs while no runtime is
/// open (no `nrt_init` returns meanwhile), so every device tensor registered is a closed
/// runtime's.
fn discard_device_tensors() {
    let discarded = crate::handles::TENSORS
        .snapshot()
        .iter()
        .filter(|(_, entry)| entry.get().discard_device_memory())
        .count();
    if discarded > 0 {
        tracing::info!(
            discarded,
            "nrt_close: gave back the memory of device tensors not freed (their handles stay valid for nrt_tensor_free)"
        );
    }
}

/// `nrt_close` calls so far: an output-completion wait that sees it change ends.
static CLOSES: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// The count of `nrt_close` calls so far ([`CLOSES`]).
pub(crate) fn closes() -> u64 {
    CLOSES.load(std::sync::atomic::Ordering::SeqCst)
}

/// The version this library reports.
fn version() -> NrtVersion {
    let [rt_major, rt_minor, rt_patch, rt_maintenance] = runtime::RUNTIME_API_VERSION;
    NrtVersion {
        rt_major,
        rt_minor,
        rt_patch,
        rt_maintenance,
        rt_detail: c_field(&format!(
            "the API of libnrt {}, implemented by this project's Rust runtime {} (device or \
             simdev); not AWS's library",
            runtime::RUNTIME_VERSION,
            env!("CARGO_PKG_VERSION")
        )),
        git_hash: c_field(env!("LIBNRT_GIT_HASH")),
    }
}

/// `nrt_get_version`: at most `size` bytes of `nrt_version_t`.
///
/// # Safety
/// A C entry point: pointer arguments are NULL or valid as `include/nrt` documents.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nrt_get_version(ver: *mut c_void, size: usize) -> u32 {
    boundary::status("nrt_get_version", || {
        if size == 0 {
            return Err(NrtError::new(NrtStatus::Invalid, "size 0"));
        }
        let v = version();
        let bytes = v.as_bytes();
        raw::write_struct_prefix(ver, &bytes[..size.min(bytes.len())], "ver")
    })
}

/// `nrt_get_status_as_str`: the status's name (a static string; "NRT_UNKNOWN_STATUS" for a
/// value that is no status).
///
/// # Safety
/// A C entry point: pointer arguments are NULL or valid as `include/nrt` documents.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nrt_get_status_as_str(status: u32) -> *const c_char {
    static NAMES: OnceLock<Vec<(u32, CString)>> = OnceLock::new();
    const UNKNOWN: &CStr = c"NRT_UNKNOWN_STATUS";
    boundary::value("nrt_get_status_as_str", UNKNOWN.as_ptr(), || {
        let names = NAMES.get_or_init(|| {
            (0..=2000u32)
                .filter_map(NrtStatus::from_u32)
                .filter_map(|s| Some((s as u32, CString::new(s.name()).ok()?)))
                .collect()
        });
        Ok(names
            .iter()
            .find(|(v, _)| *v == status)
            .map_or(UNKNOWN.as_ptr(), |(_, n)| n.as_ptr()))
    })
}

fn count_export(
    name: &'static str,
    out: *mut u32,
    f: fn(&OpenOptions) -> runtime::NrtResult<u32>,
) -> u32 {
    boundary::status(name, || {
        raw::check_out(out, "the count")?;
        let n = f(&open_options()?)?;
        raw::write_out(out, n, "the count")
    })
}

/// `nrt_get_total_vnc_count` (callable before `nrt_init`).
///
/// # Safety
/// A C entry point: pointer arguments are NULL or valid as `include/nrt` documents.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nrt_get_total_vnc_count(vnc_count: *mut u32) -> u32 {
    count_export("nrt_get_total_vnc_count", vnc_count, nrt::total_vnc_count)
}

/// `nrt_get_total_nc_count`: the deprecated name of `nrt_get_total_vnc_count`.
///
/// # Safety
/// A C entry point: pointer arguments are NULL or valid as `include/nrt` documents.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nrt_get_total_nc_count(nc_count: *mut u32) -> u32 {
    count_export("nrt_get_total_nc_count", nc_count, nrt::total_vnc_count)
}

/// `nrt_get_visible_vnc_count` (callable before `nrt_init`).
///
/// # Safety
/// A C entry point: pointer arguments are NULL or valid as `include/nrt` documents.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nrt_get_visible_vnc_count(vnc_count: *mut u32) -> u32 {
    count_export(
        "nrt_get_visible_vnc_count",
        vnc_count,
        nrt::visible_vnc_count,
    )
}

/// `nrt_get_visible_nc_count`: the deprecated name of `nrt_get_visible_vnc_count`.
///
/// # Safety
/// A C entry point: pointer arguments are NULL or valid as `include/nrt` documents.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nrt_get_visible_nc_count(nc_count: *mut u32) -> u32 {
    count_export("nrt_get_visible_nc_count", nc_count, nrt::visible_vnc_count)
}

/// `nrt_host_device_id_get`: the host's id of device `neuron_dev`. This process sees one
/// device, 0 (`/dev/neuron0` or simdev), under its host id.
///
/// # Safety
/// A C entry point: pointer arguments are NULL or valid as `include/nrt` documents.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nrt_host_device_id_get(neuron_dev: i32, host_device_id: *mut u32) -> u32 {
    boundary::status("nrt_host_device_id_get", || {
        let _rt = rt()?;
        raw::check_out(host_device_id, "host_device_id")?;
        if neuron_dev != 0 {
            return Err(NrtError::new(
                NrtStatus::Invalid,
                format!("Neuron device {neuron_dev} is not this process's (it has device 0)"),
            ));
        }
        raw::write_out(host_device_id, 0, "host_device_id")
    })
}

/// `nrt_host_device_id_rid_map_get`: the routing-ID table indexed by host device id. This
/// process sees one device, host id 0, whose routing id is 0: one entry. `*count` is the
/// array's capacity on entry and the entries written on return; a capacity of 0 is
/// NRT_RESOURCE with `*count` set to the entries needed.
///
/// # Safety
/// A C entry point: pointer arguments are NULL or valid as `include/nrt` documents.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nrt_host_device_id_rid_map_get(
    count: *mut u32,
    host_did_to_rid_map: *mut u32,
) -> u32 {
    boundary::status("nrt_host_device_id_rid_map_get", || {
        let _rt = rt()?;
        const ROUTING_IDS: [u32; 1] = [0];
        let capacity = raw::read_in(count, "count")?;
        let needed = u32::try_from(ROUTING_IDS.len()).unwrap_or(u32::MAX);
        if capacity < needed {
            raw::write_out(count, needed, "count")?;
            return Err(NrtError::new(
                NrtStatus::Resource,
                format!("host_did_to_rid_map holds {capacity} entries; {needed} are needed"),
            ));
        }
        raw::check_out(host_did_to_rid_map, "host_did_to_rid_map")?;
        for (i, rid) in ROUTING_IDS.iter().enumerate() {
            // The array holds `capacity` >= `needed` entries (the caller's word).
            raw::write_out(
                host_did_to_rid_map.wrapping_add(i),
                *rid,
                "host_did_to_rid_map",
            )?;
        }
        raw::write_out(count, needed, "count")
    })
}

/// `nrt_get_libnccl_net`: no NCCL network plugin (simdev has no network): NULL, `*err` = 1 and
/// the reason in `err_msg` (truncated to `err_msg_size` with its terminator). NULL `err` or
/// `err_msg` are skipped.
///
/// # Safety
/// A C entry point: pointer arguments are NULL or valid as `include/nrt` documents.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nrt_get_libnccl_net(
    err: *mut i32,
    err_msg: *mut c_char,
    err_msg_size: usize,
) -> *mut c_void {
    const WHY: &str = "no NCCL network plugin: this libnrt runs collectives on one host (simdev)";
    let _ = std::panic::catch_unwind(|| {
        if !err.is_null() {
            let _ = raw::write_out(err, 1, "err");
        }
        if !err_msg.is_null() && err_msg_size > 0 {
            let n = WHY.len().min(err_msg_size - 1);
            if let Ok(out) = raw::bytes_mut(err_msg.cast(), n + 1, "err_msg") {
                out[..n].copy_from_slice(&WHY.as_bytes()[..n]);
                out[n] = 0;
            }
        }
    });
    std::ptr::null_mut()
}

/// `nrt_get_device_id`: the device holding visible logical core `lnc_idx` — device 0.
///
/// # Safety
/// A C entry point: pointer arguments are NULL or valid as `include/nrt` documents.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nrt_get_device_id(lnc_idx: i32, device_id: *mut i32) -> u32 {
    boundary::status("nrt_get_device_id", || {
        let rt = rt()?;
        raw::check_out(device_id, "device_id")?;
        rt.visible_core(i64::from(lnc_idx))?;
        raw::write_out(device_id, 0, "device_id")
    })
}

/// `nrt_get_instance_info`: at most `instance_info_len` bytes of `nrt_instance_info_t`.
///
/// # Safety
/// A C entry point: pointer arguments are NULL or valid as `include/nrt` documents.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nrt_get_instance_info(info: *mut c_void, instance_info_len: usize) -> u32 {
    boundary::status("nrt_get_instance_info", || {
        raw::check_out(info, "info")?;
        if instance_info_len == 0 {
            return Err(NrtError::new(NrtStatus::Invalid, "instance_info_len 0"));
        }
        let i = rt()?.instance_info();
        let out = NrtInstanceInfo {
            family: i.family,
            size: i.size,
            arch_name: c_field(&i.arch_name),
            device_revision: c_field(&i.device_revision),
        };
        let bytes = out.as_bytes();
        raw::write_struct_prefix(info, &bytes[..instance_info_len.min(bytes.len())], "info")
    })
}

/// `nrt_get_vnc_memory_stats`: at most `stats_size_in` bytes of `nrt_vnc_memory_stats_t`,
/// the count written to `*stats_size_out`.
///
/// # Safety
/// A C entry point: pointer arguments are NULL or valid as `include/nrt` documents.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nrt_get_vnc_memory_stats(
    vnc: u32,
    stats: *mut c_void,
    stats_size_in: usize,
    stats_size_out: *mut usize,
) -> u32 {
    boundary::status("nrt_get_vnc_memory_stats", || {
        raw::check_out(stats, "stats")?;
        raw::check_out(stats_size_out, "stats_size_out")?;
        let s = rt()?.vnc_memory_stats(vnc)?;
        let out = NrtVncMemoryStats {
            bytes_used: s.bytes_used,
            bytes_limit: s.bytes_limit,
        };
        let bytes = out.as_bytes();
        let n = stats_size_in.min(bytes.len());
        raw::write_struct_prefix(stats, &bytes[..n], "stats")?;
        raw::write_out(stats_size_out, n, "stats_size_out")
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn status_names_are_the_enum_names() {
        let name = |s| {
            // SAFETY: nrt_get_status_as_str takes no pointer and returns static
            // NUL-terminated strings.
            let p = unsafe { nrt_get_status_as_str(s) };
            // SAFETY: as above: a static NUL-terminated string.
            unsafe { CStr::from_ptr(p) }.to_str().unwrap()
        };
        assert_eq!(name(0), "NRT_SUCCESS");
        assert_eq!(name(13), "NRT_UNINITIALIZED");
        assert_eq!(name(1206), "NRT_NETWORK_PROXY_FAILURE");
        assert_eq!(name(8), "NRT_UNKNOWN_STATUS");
    }

    #[test]
    fn the_version_is_size_versioned_and_checks_its_arguments() {
        let mut buf = [0xEEu8; 240];
        let version = |p: *mut u8, n| {
            // SAFETY: `p` is `buf` (valid for the size passed) or NULL.
            unsafe { nrt_get_version(p.cast(), n) }
        };
        assert_eq!(version(buf.as_mut_ptr(), 8), 0);
        assert_eq!(&buf[..8], &2u64.to_le_bytes());
        assert_eq!(buf[8], 0xEE, "nothing beyond the caller's size");
        assert_eq!(version(buf.as_mut_ptr(), 240), 0);
        assert_eq!(&buf[224..], &[0xEE; 16], "nothing beyond nrt_version_t");
        assert_eq!(version(std::ptr::null_mut(), 224), 2);
        assert_eq!(version(buf.as_mut_ptr(), 0), 2);
    }

    #[test]
    fn calls_before_init_answer_uninitialized() {
        let mut n = 0usize;
        let mut stats = [0u8; 16];
        let call = |p: *mut u8, n: &mut usize| {
            // SAFETY: `p` is `stats` (16 bytes) or NULL; `n` is a usize.
            unsafe { nrt_get_vnc_memory_stats(0, p.cast(), 16, n) }
        };
        assert_eq!(
            call(stats.as_mut_ptr(), &mut n),
            NrtStatus::Uninitialized as u32
        );
        assert_eq!(
            call(std::ptr::null_mut(), &mut n),
            NrtStatus::Invalid as u32
        );
    }

    #[test]
    fn the_library_directory_is_found() {
        // In the test harness this code is part of the test executable.
        let exe = std::env::current_exe().unwrap();
        assert_eq!(library_dir().as_deref(), exe.parent());
    }
}
