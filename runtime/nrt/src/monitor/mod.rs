//! `nrt monitor`: a neuron-monitor-style stream of the runtime processes' figures, one JSON
//! document per period on stdout, optionally served in Prometheus format too.
//!
//! - [`classes`]: NrtStatus → neuron-monitor's outcome and error classes (one table).
//! - [`collect`]: figures of a period from two samples of the datastores.
//! - [`hw`]: simdev's per-NC counters, read as a plain client.
//! - [`schema`]: the document, typed.
//! - [`prometheus`]: the exposition and its HTTP endpoint.

pub mod classes;
pub mod collect;
pub mod hw;
pub mod prometheus;
pub mod schema;

use std::io::Write as _;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::mpsc;
use std::time::{Duration, Instant};

use runtime::datastore::snapshot::ProcessSnapshot;

use collect::{Sample, collect};

/// Where the runtime datastores are read from: anything that returns every process's snapshot.
pub trait Source {
    /// Every runtime process's datastore, read now.
    fn scan(&mut self) -> Vec<ProcessSnapshot>;
}

impl<F: FnMut() -> Vec<ProcessSnapshot>> Source for F {
    fn scan(&mut self) -> Vec<ProcessSnapshot> {
        self()
    }
}

/// The datastores' directory: `NEURON_RT_DATASTORE_DIR`, else `/dev/shm`.
pub fn datastore_dir() -> PathBuf {
    std::env::var_os("NEURON_RT_DATASTORE_DIR")
        .filter(|d| !d.is_empty())
        .map_or_else(|| PathBuf::from("/dev/shm"), PathBuf::from)
}

/// The real source: the datastores in [`datastore_dir`].
pub fn datastore_source() -> impl Source {
    let dir = datastore_dir();
    // The one call site of the datastore reader.
    move || runtime::datastore::scan(&dir)
}

/// Takes a sample from `source` now.
pub fn sample(source: &mut dyn Source) -> Sample {
    let processes = source.scan();
    Sample {
        at: Instant::now(),
        processes,
    }
}

/// `--period`: a humantime duration (`100ms`, `1s`, `2m`), more than zero.
///
/// # Errors
/// Not a duration, or zero.
pub fn parse_period(s: &str) -> Result<Duration, String> {
    let d = humantime::parse_duration(s).map_err(|e| format!("{s:?}: {e} (e.g. 100ms, 1s)"))?;
    if d.is_zero() {
        return Err(format!("{s:?}: the period must be more than zero"));
    }
    Ok(d)
}

/// A channel that receives once on SIGINT or SIGTERM (`None` when a handler could not be
/// installed: then only `--count` or a kill ends the program).
pub fn stop_signal() -> Option<mpsc::Receiver<()>> {
    let (tx, rx) = mpsc::channel();
    ctrlc::set_handler(move || {
        let _ = tx.send(());
    })
    .ok()?;
    Some(rx)
}

/// `nrt monitor`'s options.
#[derive(clap::Args, Debug)]
pub struct MonitorArgs {
    /// Time between documents (`100ms`, `1s`, ...).
    #[arg(long, default_value = "1s", value_parser = parse_period)]
    pub period: Duration,
    /// Stop after N documents (default: until SIGINT or SIGTERM).
    #[arg(long)]
    pub count: Option<u64>,
    /// Also serve the figures in Prometheus text format at http://ADDR/metrics (ADDR is
    /// HOST:PORT; port 0 picks a free one, printed on stderr).
    #[arg(long, value_name = "ADDR")]
    pub prometheus: Option<String>,
    /// Allow --prometheus on a non-loopback address.
    #[arg(long, requires = "prometheus")]
    pub prometheus_allow_remote: bool,
}

/// Runs `nrt monitor` on `source`.
pub fn main(args: &MonitorArgs, mut source: impl Source) -> ExitCode {
    let page = match &args.prometheus {
        None => None,
        Some(addr) => {
            let addr = match prometheus::bind_addr(addr, args.prometheus_allow_remote) {
                Ok(a) => a,
                Err(e) => {
                    eprintln!("nrt monitor: {e}");
                    return ExitCode::FAILURE;
                }
            };
            let page = prometheus::Shared::default();
            match prometheus::serve(addr, page.clone()) {
                Ok(bound) => eprintln!("listening on http://{bound}/metrics"),
                Err(e) => {
                    eprintln!("nrt monitor: --prometheus: {e}");
                    return ExitCode::FAILURE;
                }
            }
            Some(page)
        }
    };
    let stop = stop_signal();
    let mut hw = hw::HwReader::from_env();
    let mut prev = sample(&mut source);
    if let Some(page) = &page {
        let text = prometheus::render(&collect(None, &prev), &hw.read());
        if let Ok(mut p) = page.lock() {
            *p = text;
        }
    }
    let mut written = 0u64;
    let mut deadline = prev.at + args.period;
    while args.count.is_none_or(|n| written < n) {
        let wait = deadline.saturating_duration_since(Instant::now());
        let stopped = match &stop {
            Some(rx) => !matches!(rx.recv_timeout(wait), Err(mpsc::RecvTimeoutError::Timeout)),
            None => {
                std::thread::sleep(wait);
                false
            }
        };
        if stopped {
            break;
        }
        // Keep the cadence: the next deadline is a period after this one, not after the work.
        deadline += args.period;
        let now = Instant::now();
        if deadline < now {
            deadline = now + args.period;
        }
        let cur = sample(&mut source);
        let fig = collect(Some(&prev), &cur);
        let hw_sample = hw.read();
        if let Some(page) = &page {
            let text = prometheus::render(&fig, &hw_sample);
            if let Ok(mut p) = page.lock() {
                *p = text;
            }
        }
        let doc = schema::document(
            &fig,
            &hw_sample,
            schema::memory_info(fig.period.as_secs_f64()),
        );
        let mut out = std::io::stdout().lock();
        let written_ok = serde_json::to_writer(&mut out, &doc)
            .map_err(std::io::Error::from)
            .and_then(|()| writeln!(out))
            .and_then(|()| out.flush());
        if let Err(e) = written_ok {
            eprintln!("nrt monitor: writing to stdout: {e}");
            return ExitCode::FAILURE;
        }
        written += 1;
        prev = cur;
    }
    ExitCode::SUCCESS
}
