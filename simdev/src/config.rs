//! What one simdev emulates and where it listens: [`Config`], its defaults and its checks.

use std::path::PathBuf;
use std::time::Duration;

use shared::address_map::{AddressMap, Arch, CHUNK_GRANULE};
use thiserror::Error;

use crate::sched::ThreadPolicy;
use crate::uring::ReceivePath;

/// Most NCs one simdev emulates, whatever the arch (trn2's count).
pub const MAX_NCS: u32 = 8;
/// Most HBM per NC, in bytes (1 TiB). Larger values would push the HBM ranges of eight NCs
/// into the register window of the address map.
pub const MAX_HBM_BYTES_PER_NC: u64 = 1 << 40;

/// A simdev's configuration.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Config {
    /// Path of the control socket (`SOCK_SEQPACKET`, created with mode 0600).
    pub socket: PathBuf,
    /// The emulated device generation; fixes the address map and per-NC resource counts.
    pub arch: Arch,
    /// Number of NCs, `1..=`[`MAX_NCS`].
    pub ncs: u32,
    /// HBM bytes per NC: a non-zero multiple of 4 KiB, at most [`MAX_HBM_BYTES_PER_NC`]; by
    /// default the arch's real size ([`Arch::hbm_bytes_per_nc`]: 16 GiB on trn1 and inf2,
    /// 12 GiB on trn2). Only what clients write costs memory: chunks are sparse memfds, never
    /// zero-filled or touched at allocation.
    pub hbm_bytes_per_nc: u64,
    /// Peer uids allowed besides simdev's own effective uid.
    pub allow_uids: Vec<u32>,
    /// Where to write a Chrome trace-event JSON trace when simdev stops; `None`: no trace.
    pub trace: Option<PathBuf>,
    /// Reference bindings, `FILE.neff=MODULE.py:FUNCTION` or `FILE.neff=GOLDEN.safetensors`
    /// ([`crate::reference`]), loaded when the device is built.
    pub references: Vec<String>,
    /// How long one execution of a Python reference may take before its worker is killed.
    pub reference_timeout: Duration,
    /// The scheduling policy of simdev's threads when it runs as a process ([`crate::run`]);
    /// an in-process [`crate::Device`] leaves its caller's threads alone.
    pub thread_policy: ThreadPolicy,
    /// How connection threads receive their client's messages: io_uring where the kernel
    /// allows it (the batch's notification writes and the wait in one system call), or
    /// `recvmmsg` ([`crate::uring`]).
    pub receive: ReceivePath,
    /// Runs as a runtime's private simdev ([`crate::private`]): when the runtime is gone as
    /// simdev stops, simdev removes its socket's directory.
    pub private: bool,
}

/// [`Config::reference_timeout`] by default: under the runtime's default execution timeout
/// (`NEURON_RT_EXEC_TIMEOUT`, 30 s), so a reference that hangs ends its execution with
/// NRT_EXEC_COMPLETED_WITH_ERR before the runtime gives up on the NC (NRT_TIMEOUT, which
/// degrades it). A private simdev gets three quarters of the runtime's own timeout instead.
pub const DEFAULT_REFERENCE_TIMEOUT: Duration = Duration::from_secs(20);

impl Default for Config {
    /// trn1 with its two NCs, 16 GiB of HBM per NC (the silicon's), [`default_socket_path`],
    /// no extra uids, no trace, `SCHED_BATCH` threads.
    fn default() -> Self {
        Self {
            socket: default_socket_path(),
            arch: Arch::Trn1,
            ncs: Arch::Trn1.default_nc_count(),
            hbm_bytes_per_nc: Arch::Trn1.hbm_bytes_per_nc(),
            allow_uids: Vec::new(),
            trace: None,
            references: Vec::new(),
            reference_timeout: DEFAULT_REFERENCE_TIMEOUT,
            thread_policy: ThreadPolicy::default(),
            receive: ReceivePath::default(),
            private: false,
        }
    }
}

/// A [`Config`] that simdev cannot emulate.
#[derive(Clone, Debug, PartialEq, Eq, Error)]
pub enum ConfigError {
    /// `ncs` outside `1..=8`.
    #[error("{ncs} NCs requested; simdev emulates 1 to {MAX_NCS}")]
    NcCount {
        /// The value given.
        ncs: u32,
    },
    /// HBM size zero, not a multiple of 4 KiB, or too large.
    #[error(
        "HBM size {bytes} bytes per NC must be a non-zero multiple of {CHUNK_GRANULE} bytes and at most {MAX_HBM_BYTES_PER_NC}"
    )]
    HbmSize {
        /// The value given.
        bytes: u64,
    },
    /// A reference binding that cannot be loaded.
    #[error("{0}")]
    Reference(String),
}

impl Config {
    /// Checks the ranges documented on each field.
    ///
    /// # Errors
    /// [`ConfigError`] naming the first bad field.
    pub fn validate(&self) -> Result<(), ConfigError> {
        if !(1..=MAX_NCS).contains(&self.ncs) {
            return Err(ConfigError::NcCount { ncs: self.ncs });
        }
        let bytes = self.hbm_bytes_per_nc;
        if bytes == 0 || !bytes.is_multiple_of(CHUNK_GRANULE) || bytes > MAX_HBM_BYTES_PER_NC {
            return Err(ConfigError::HbmSize { bytes });
        }
        Ok(())
    }

    /// The device address map this configuration describes.
    pub const fn address_map(&self) -> AddressMap {
        AddressMap {
            arch: self.arch,
            nc_count: self.ncs,
            hbm_bytes_per_nc: self.hbm_bytes_per_nc,
        }
    }
}

/// The socket path used when none is given: `$XDG_RUNTIME_DIR/simdev.sock` when that variable
/// is set and non-empty, else `/tmp/simdev-<euid>.sock`.
pub fn default_socket_path() -> PathBuf {
    match std::env::var_os("XDG_RUNTIME_DIR") {
        Some(dir) if !dir.is_empty() => PathBuf::from(dir).join("simdev.sock"),
        _ => PathBuf::from(format!(
            "/tmp/simdev-{}.sock",
            nix::unistd::geteuid().as_raw()
        )),
    }
}

/// Formats a byte count for people: whole GiB, MiB or KiB when exact, else bytes.
pub fn format_bytes(bytes: u64) -> String {
    const UNITS: [(u64, &str); 3] = [(1 << 30, "GiB"), (1 << 20, "MiB"), (1 << 10, "KiB")];
    for (unit, name) in UNITS {
        if bytes >= unit && bytes.is_multiple_of(unit) {
            return format!("{} {name}", bytes / unit);
        }
    }
    format!("{bytes} B")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_default_is_a_valid_trn1() {
        let config = Config::default();
        assert_eq!(config.validate(), Ok(()));
        assert_eq!((config.ncs, config.hbm_bytes_per_nc), (2, 16 << 30));
    }

    #[test]
    fn bad_sizes_and_counts_are_refused() {
        let bad_ncs = Config {
            ncs: 9,
            ..Config::default()
        };
        assert_eq!(bad_ncs.validate(), Err(ConfigError::NcCount { ncs: 9 }));
        for bytes in [0, 4095, 4097, MAX_HBM_BYTES_PER_NC + 4096] {
            let config = Config {
                hbm_bytes_per_nc: bytes,
                ..Config::default()
            };
            assert_eq!(config.validate(), Err(ConfigError::HbmSize { bytes }));
        }
    }

    #[test]
    fn byte_counts_read_naturally() {
        assert_eq!(format_bytes(256 << 20), "256 MiB");
        assert_eq!(format_bytes(2 << 30), "2 GiB");
        assert_eq!(format_bytes(12 << 10), "12 KiB");
        assert_eq!(format_bytes(100), "100 B");
    }
}
