//! The `simdev` command line: `simdev [--socket PATH] [--arch trn1|inf2|trn2] [--ncs N]
//! [--hbm SIZE] [--allow-uid UID]... [--trace FILE] [--reference FILE.neff=MODULE.py:FUNCTION]...
//! [--reference-timeout DURATION] [--sched batch|normal] [--receive io-uring|recvmmsg]`, plus the bindings
//! of the environment variable
//! `NEURON_SIMDEV_REFERENCE` ([`crate::reference`]).
//!
//! [`main_with_args`] is the whole program, callable from any binary: the `nrt` tool
//! re-executes itself as simdev through it.

use std::ffi::OsString;
use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::{Parser, ValueEnum};
use shared::address_map::{Arch, CHUNK_GRANULE};
use tracing_subscriber::EnvFilter;

use crate::config::{Config, DEFAULT_REFERENCE_TIMEOUT, MAX_NCS, default_socket_path};
use crate::dma::error_chain;
use crate::reference::{BindingSpec, ENV_REFERENCE};
use crate::sched::ThreadPolicy;
use crate::server::{SimdevError, run};
use crate::uring::ReceivePath;

/// The exit status after an injected DeviceLost fault.
pub const EXIT_DEVICE_LOST: u8 = 3;

/// The emulated device generation.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum ArchArg {
    /// Trainium1 (V2), 2 NCs by default.
    Trn1,
    /// Inferentia2 (V2), 2 NCs by default.
    Inf2,
    /// Trainium2 (V3), 8 NCs by default.
    Trn2,
}

impl From<ArchArg> for Arch {
    fn from(arch: ArchArg) -> Self {
        match arch {
            ArchArg::Trn1 => Self::Trn1,
            ArchArg::Inf2 => Self::Inf2,
            ArchArg::Trn2 => Self::Trn2,
        }
    }
}

/// simdev's command-line arguments.
#[derive(Clone, Debug, Parser)]
#[command(
    name = "simdev",
    version,
    about = "An emulated AWS Neuron device: device memory, UDMA rings, semaphores, events and \
             notification queues behind a Unix control socket.",
    after_help = "Logging: RUST_LOG (default warn), to stderr. Stops on SIGINT or SIGTERM."
)]
pub struct Args {
    /// Control socket path [default: $XDG_RUNTIME_DIR/simdev.sock, else /tmp/simdev-$EUID.sock].
    #[arg(long, value_name = "PATH")]
    pub socket: Option<PathBuf>,
    /// Device generation.
    #[arg(long, value_enum, default_value_t = ArchArg::Trn1)]
    pub arch: ArchArg,
    /// Number of NCs, 1 to 8 [default: the arch's count].
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..=i64::from(MAX_NCS)))]
    pub ncs: Option<u32>,
    /// HBM per NC: bytes, or with a K, M or G suffix (KiB, MiB, GiB); a multiple of 4 KiB
    /// [default: the silicon's, 16G on trn1 and inf2, 12G on trn2; only memory clients write
    /// costs RAM].
    #[arg(long, value_name = "SIZE", value_parser = parse_size)]
    pub hbm: Option<u64>,
    /// Also accept clients running as this uid (simdev's own effective uid is always allowed;
    /// with any, the socket is mode 0666 and each client's uid is checked when it connects).
    #[arg(long = "allow-uid", value_name = "UID")]
    pub allow_uid: Vec<u32>,
    /// Write a Chrome trace-event JSON trace (Perfetto, chrome://tracing) of instructions, DMA
    /// transfers, doorbells and notifications to FILE when simdev stops.
    #[arg(long, value_name = "FILE")]
    pub trace: Option<PathBuf>,
    /// Bind a NEFF to a CPU reference that computes its outputs instead of the shape-only
    /// function: FILE.neff=MODULE.py:FUNCTION (a Python function run in a worker process) or
    /// FILE.neff=GOLDEN.safetensors. Repeatable; NEURON_SIMDEV_REFERENCE adds more
    /// (`;`-separated).
    #[arg(long = "reference", value_name = "BINDING", value_parser = parse_binding)]
    pub reference: Vec<String>,
    /// How long one execution of a Python reference may take (e.g. 30s, 500ms), its worker's
    /// start included, before the worker is killed and the execution fails [default: 20s,
    /// under the runtime's default execution timeout of 30s].
    #[arg(long = "reference-timeout", value_name = "DURATION", value_parser = parse_duration)]
    pub reference_timeout: Option<Duration>,
    /// Scheduling policy of simdev's threads: `batch` (SCHED_BATCH with the shortest time
    /// slice, 100 us: a device thread woken by a doorbell never preempts the host thread that
    /// rang it; it runs on an idle CPU, when that thread blocks — before the other threads
    /// waiting — or at the next tick) or `normal` (SCHED_OTHER, the default slice).
    #[arg(long, value_enum, value_name = "POLICY", default_value_t = ThreadPolicy::Batch)]
    pub sched: ThreadPolicy,
    /// How a connection thread receives its client's messages: `io-uring` (where the kernel
    /// allows it: the notification eventfd writes of the executions it ran and the wait for
    /// the next message in one system call, so the woken client never preempts it in between)
    /// or `recvmmsg` (the writes, then the wait).
    #[arg(long, value_enum, value_name = "PATH", default_value_t = ReceivePath::IoUring)]
    pub receive: ReceivePath,
    /// Run as a runtime's private simdev, in a directory made for it that holds only the
    /// socket and simdev.log: on SIGUSR1 (the runtime's parent-death signal: it died), stop
    /// and remove them and the directory.
    #[arg(long)]
    pub private: bool,
}

/// Checks a `--reference` binding's syntax (the files are read when the device is built).
fn parse_binding(text: &str) -> Result<String, String> {
    BindingSpec::parse(text).map(|_| text.to_owned())
}

/// Parses a duration: a number of seconds, or a number with an `s` or `ms` suffix.
///
/// # Errors
/// A message naming the text.
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    let t = text.trim();
    let (digits, millis) = match t.strip_suffix("ms") {
        Some(d) => (d, true),
        None => (t.strip_suffix('s').unwrap_or(t), false),
    };
    let n: u64 = digits
        .parse()
        .map_err(|_| format!("{text:?} is not a duration (seconds, or a number with s or ms)"))?;
    let d = if millis {
        Duration::from_millis(n)
    } else {
        Duration::from_secs(n)
    };
    if d.is_zero() {
        return Err(format!("{text:?}: the duration must be positive"));
    }
    Ok(d)
}

impl Args {
    /// The [`Config`] these arguments describe.
    pub fn config(&self) -> Config {
        let arch = Arch::from(self.arch);
        Config {
            socket: self.socket.clone().unwrap_or_else(default_socket_path),
            arch,
            ncs: self.ncs.unwrap_or_else(|| arch.default_nc_count()),
            hbm_bytes_per_nc: self.hbm.unwrap_or_else(|| arch.hbm_bytes_per_nc()),
            allow_uids: self.allow_uid.clone(),
            trace: self.trace.clone(),
            references: self.reference.clone(),
            reference_timeout: self.reference_timeout.unwrap_or(DEFAULT_REFERENCE_TIMEOUT),
            thread_policy: self.sched,
            receive: self.receive,
            private: self.private,
        }
    }

    /// [`Args::config`] plus the bindings of `env` (the value of `NEURON_SIMDEV_REFERENCE`:
    /// `;`-separated), after the command line's.
    pub fn config_with_env(&self, env: Option<&str>) -> Config {
        let mut config = self.config();
        config.references.extend(
            env.unwrap_or_default()
                .split(';')
                .map(str::trim)
                .filter(|s| !s.is_empty())
                .map(str::to_owned),
        );
        config
    }
}

/// Parses a size: plain bytes, or a number with a `K`, `M` or `G` suffix (binary multiples,
/// optionally followed by `iB` or `B`, any case). The result must be a non-zero multiple of
/// 4 KiB.
///
/// # Errors
/// A message naming the rule the text broke.
pub fn parse_size(text: &str) -> Result<u64, String> {
    let t = text.trim();
    let lower = t.to_ascii_lowercase();
    let body = lower
        .strip_suffix("ib")
        .or_else(|| lower.strip_suffix('b'))
        .unwrap_or(&lower);
    let (digits, shift) = match body.chars().last() {
        Some('k') => (&body[..body.len() - 1], 10),
        Some('m') => (&body[..body.len() - 1], 20),
        Some('g') => (&body[..body.len() - 1], 30),
        _ if body.len() == lower.len() => (body, 0),
        _ => return Err(format!("{text:?}: a unit must be K, M or G")),
    };
    let number: u64 = digits
        .parse()
        .map_err(|_| format!("{text:?} is not a size (bytes, or a number with K, M or G)"))?;
    let bytes = number
        .checked_mul(1 << shift)
        .ok_or_else(|| format!("{text:?} is too large"))?;
    if bytes == 0 || !bytes.is_multiple_of(CHUNK_GRANULE) {
        return Err(format!(
            "{text:?} = {bytes} bytes; must be a non-zero multiple of 4 KiB"
        ));
    }
    Ok(bytes)
}

/// Runs simdev with `args` (the first item is the program name, as in `std::env::args_os`):
/// parses them, sets up logging (`RUST_LOG`, default `warn`, to stderr), and serves until
/// SIGINT or SIGTERM. Exit codes: 0 after a clean stop (and for `--help`/`--version`), 1 when
/// simdev cannot start or fails, 2 for bad arguments, [`EXIT_DEVICE_LOST`] (3) after an
/// injected DeviceLost fault.
pub fn main_with_args(args: impl IntoIterator<Item = OsString>) -> ExitCode {
    // First, before any thread: a parent's blocked signals or ignored SIGCHLD would break
    // simdev's stop, its runtime's death and its reference worker (`signals`).
    let reset = crate::signals::reset_inherited();
    let args = match Args::try_parse_from(args) {
        Ok(args) => args,
        Err(e) => {
            let _ = e.print();
            return ExitCode::from(u8::try_from(e.exit_code()).unwrap_or(2));
        }
    };
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("warn"));
    // Another subscriber (the embedding binary's) may already be installed; keep it.
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        // A log write that fails (a full disk, a closed stderr) is dropped: the default
        // reports it with `eprintln!`, which panics when stderr is what failed.
        .log_internal_errors(false)
        // Colour only on a terminal: a private simdev's stderr is its log file.
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .try_init();
    if let Err(e) = reset {
        tracing::warn!(
            "resetting the signal mask, SIGCHLD and SIGXFSZ inherited from the parent: {e}"
        );
    }
    if let Ok((soft, _)) = nix::sys::resource::getrlimit(nix::sys::resource::Resource::RLIMIT_FSIZE)
        && soft != nix::sys::resource::RLIM_INFINITY
    {
        tracing::warn!(
            "simdev's file-size limit (ulimit -f) is {soft} bytes: device memory is memfds, so \
             an NC's registers or a chunk larger than that is refused (EFBIG)"
        );
    }
    let env = std::env::var(ENV_REFERENCE).ok();
    match run(args.config_with_env(env.as_deref())) {
        Ok(()) => ExitCode::SUCCESS,
        Err(SimdevError::DeviceLost) => {
            let _ = writeln!(
                std::io::stderr(),
                "simdev: the device was lost (an injected DeviceLost fault); exiting with status \
                 {EXIT_DEVICE_LOST}"
            );
            ExitCode::from(EXIT_DEVICE_LOST)
        }
        Err(e) => {
            let _ = writeln!(std::io::stderr(), "simdev: {}", error_chain(&e));
            ExitCode::FAILURE
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    #[test]
    fn the_command_line_is_well_formed() {
        Args::command().debug_assert();
    }

    /// The help is written from doc comments, which rustdoc reads too: an intra-doc link there
    /// would print as "[`NAME`]" in `simdev --help`.
    #[test]
    fn the_help_carries_no_rustdoc_links() {
        let help = Args::command().render_long_help().to_string();
        assert!(!help.contains("[`") && !help.contains("`]"), "{help}");
    }

    #[test]
    fn sizes_take_binary_suffixes_and_4k_multiples() {
        assert_eq!(parse_size("4096"), Ok(4096));
        assert_eq!(parse_size("64K"), Ok(64 << 10));
        assert_eq!(parse_size("256M"), Ok(256 << 20));
        assert_eq!(parse_size("2g"), Ok(2 << 30));
        assert_eq!(parse_size("1GiB"), Ok(1 << 30));
        assert_eq!(parse_size("8KB"), Ok(8 << 10));
        for bad in ["0", "4095", "1000", "", "M", "12X", "-4K", "99999999999G"] {
            assert!(parse_size(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn defaults_follow_the_arch() {
        let parse = |argv: &[&str]| Args::try_parse_from(argv).map(|a| a.config());
        let trn1 = parse(&["simdev", "--socket", "/tmp/x.sock"]).unwrap();
        assert_eq!(
            (trn1.arch, trn1.ncs, trn1.hbm_bytes_per_nc),
            (Arch::Trn1, 2, 16 << 30),
            "the silicon's HBM per NC"
        );
        let real = |arch: &str| parse(&["simdev", "--arch", arch]).unwrap().hbm_bytes_per_nc;
        assert_eq!((real("inf2"), real("trn2")), (16 << 30, 12 << 30));
        let trn2 = parse(&["simdev", "--arch", "trn2", "--hbm", "1G"]).unwrap();
        assert_eq!((trn2.ncs, trn2.hbm_bytes_per_nc), (8, 1 << 30));
        let inf2 = parse(&["simdev", "--arch", "inf2", "--ncs", "8", "--allow-uid", "7"]).unwrap();
        assert_eq!((inf2.ncs, inf2.allow_uids), (8, vec![7]));
        assert_eq!(inf2.trace, None);
        let traced = parse(&["simdev", "--trace", "/tmp/t.json"]).unwrap();
        assert_eq!(traced.trace, Some(PathBuf::from("/tmp/t.json")));
        assert!(parse(&["simdev", "--ncs", "0"]).is_err());
        assert!(parse(&["simdev", "--ncs", "9"]).is_err());
        assert!(parse(&["simdev", "--arch", "inf1"]).is_err());
        assert!(parse(&["simdev", "--hbm", "5000"]).is_err());
        assert_eq!(
            trn1.thread_policy,
            ThreadPolicy::Batch,
            "device threads never preempt"
        );
        let normal = parse(&["simdev", "--sched", "normal"]).unwrap();
        assert_eq!(normal.thread_policy, ThreadPolicy::Normal);
        assert!(parse(&["simdev", "--sched", "fifo"]).is_err());
        assert_eq!(trn1.receive, ReceivePath::IoUring, "io_uring by default");
        let recvmmsg = parse(&["simdev", "--receive", "recvmmsg"]).unwrap();
        assert_eq!(recvmmsg.receive, ReceivePath::Recvmmsg);
        assert!(parse(&["simdev", "--receive", "epoll"]).is_err());
    }

    #[test]
    fn references_come_from_the_command_line_then_the_environment() {
        let args = Args::try_parse_from([
            "simdev",
            "--reference",
            "a.neff=r.py:f",
            "--reference",
            "b.neff=g.safetensors",
            "--reference-timeout",
            "250ms",
        ])
        .unwrap();
        let c = args.config_with_env(Some(" c.neff=s.py:g ;; d.neff=t.py:h"));
        assert_eq!(
            c.references,
            [
                "a.neff=r.py:f",
                "b.neff=g.safetensors",
                "c.neff=s.py:g",
                "d.neff=t.py:h"
            ]
        );
        assert_eq!(c.reference_timeout, Duration::from_millis(250));
        let plain = Args::try_parse_from(["simdev"])
            .unwrap()
            .config_with_env(None);
        assert_eq!(
            (plain.references.len(), plain.reference_timeout),
            (0, DEFAULT_REFERENCE_TIMEOUT)
        );
        assert!(Args::try_parse_from(["simdev", "--reference", "a.neff"]).is_err());
        assert!(Args::try_parse_from(["simdev", "--reference-timeout", "0"]).is_err());
        assert_eq!(parse_duration("2"), Ok(Duration::from_secs(2)));
        assert_eq!(parse_duration("3s"), Ok(Duration::from_secs(3)));
        assert!(parse_duration("x").is_err());
    }
}
