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

use runtime::datastore::snapshot::{Liveness, ProcessSnapshot};

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

/// The datastores' directory: `NEURON_RT_DATASTORE_DIR`, else where runtimes put them by
/// default ([`runtime::datastore::default_dir`]).
pub fn datastore_dir() -> PathBuf {
    std::env::var_os("NEURON_RT_DATASTORE_DIR")
        .filter(|d| !d.is_empty())
        .map_or_else(runtime::datastore::default_dir, PathBuf::from)
}

/// The real source: the datastores in [`datastore_dir`]. With `say` (`nrt monitor`; `nrt top`
/// owns the terminal), a directory that cannot be listed and a file that cannot be read are
/// said on stderr, each once, rather than shown as no runtime.
pub fn datastore_source(say: bool) -> impl Source {
    let dir = datastore_dir();
    let mut said = std::collections::HashSet::new();
    move || {
        // The one call site of the datastore reader.
        let scanned = match runtime::datastore::scan_detailed(&dir) {
            Ok(files) => files,
            Err(e) => {
                if say && said.insert(dir.clone()) {
                    eprintln!(
                        "nrt monitor: the datastore directory {} cannot be listed ({e}): no runtime can be shown; runtimes write there unless NEURON_RT_DATASTORE_DIR says otherwise",
                        dir.display()
                    );
                }
                return Vec::new();
            }
        };
        let mut out = Vec::new();
        for (path, r) in scanned {
            match r {
                Ok(snapshot) => {
                    said.remove(&path);
                    out.push(snapshot);
                }
                Err(e) => {
                    if say && said.insert(path.clone()) {
                        eprintln!(
                            "nrt monitor: {} is not a readable datastore ({e}): skipped",
                            path.display()
                        );
                    }
                }
            }
        }
        out.sort_by_key(|s| s.pid);
        out
    }
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
    if d > MAX_PERIOD {
        return Err(format!(
            "{s:?}: the period must be at most a day ({})",
            humantime::format_duration(MAX_PERIOD)
        ));
    }
    Ok(d)
}

/// The longest period `monitor` and `top` take: a day (a sample per day already says little
/// about a process; longer ones only risk overflowing the deadline arithmetic).
const MAX_PERIOD: Duration = Duration::from_secs(24 * 3600);

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
    /// Stop after N documents, 1 or more (default: until SIGINT or SIGTERM).
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..))]
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
    let mut cpu_prev = schema::CpuTimes::read().unwrap_or_default();
    let first = sample(&mut source);
    if let Some(page) = &page {
        let text = prometheus::render(&collect(None, &first), &hw.read());
        if let Ok(mut p) = page.lock() {
            *p = text;
        }
    }
    // The first document's baseline holds no live process: a process's first period runs from
    // its nrt_init, so every execution is counted in exactly one document and the documents'
    // sum is what the process did (neuron-monitor's counts are per period). Runtimes already
    // closed (or stale) are the baseline: they ended before this monitor started.
    let mut prev = Sample {
        at: first.at,
        processes: first
            .processes
            .iter()
            .filter(|p| p.liveness != Liveness::Live)
            .cloned()
            .collect(),
    };
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
        let cpu_now = schema::CpuTimes::read();
        let vcpu = schema::vcpu_usage(fig.period.as_secs_f64(), &cpu_prev, &cpu_now);
        if let Ok(c) = cpu_now {
            cpu_prev = c;
        }
        let doc = schema::document(
            &fig,
            &hw_sample,
            vcpu,
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

/// The exposition validator the scrape test uses, shared with the unit tests.
#[cfg(test)]
#[path = "../../tests/support/exposition.rs"]
#[allow(dead_code)]
mod exposition;

#[cfg(test)]
mod tests {
    use super::collect::tests::{core, process};
    use super::hw::{DeviceSummary, HwSample};
    use super::*;
    use runtime::datastore::snapshot::Liveness;
    use serde_json::Value;
    use shared::protocol::NcCounters;

    use super::exposition;

    /// Two samples a second apart: pid 101 with two cores (one idle in the period), pid 303
    /// stale in both (its last executions were counted before).
    fn figures() -> collect::Figures {
        let t0 = Instant::now();
        let mut stale = process(303, 9, vec![core(0, 5, 0, 1, 0)]);
        stale.liveness = Liveness::Stale;
        let prev = Sample {
            at: t0,
            processes: vec![
                process(101, 5, vec![core(0, 10, 0, 100, 0), core(1, 3, 0, 5, 0)]),
                stale.clone(),
            ],
        };
        let cur = Sample {
            at: t0 + Duration::from_secs(1),
            processes: vec![
                process(101, 6, vec![core(0, 50, 2, 2000, 250), core(1, 3, 0, 5, 0)]),
                stale,
            ],
        };
        collect(Some(&prev), &cur)
    }

    fn hw() -> HwSample {
        HwSample {
            error: String::new(),
            device: Some(DeviceSummary {
                arch: "trn2",
                nc_count: 8,
                hbm_bytes_per_nc: 1 << 30,
                lnc: 2,
            }),
            ncs: vec![(
                0,
                NcCounters {
                    executions: 42,
                    dma_bytes: 4096,
                    doorbells: 43,
                    ..NcCounters::default()
                },
            )],
        }
    }

    fn num(v: &Value) -> f64 {
        v.as_f64().unwrap_or_else(|| panic!("not a number: {v}"))
    }

    #[test]
    fn the_document_has_neuron_monitors_fields_and_figures() {
        let cpu = schema::CpuTimes::parse(
            "cpu  100 0 50 800 10 0 5 0 0 0\ncpu0 100 0 50 800 10 0 5 0 0 0\nctxt 7\n",
        );
        let later = schema::CpuTimes::parse(
            "cpu  300 0 150 1265 10 0 5 35 0 0\ncpu0 300 0 150 1265 10 0 5 35 0 0\nctxt 107\n",
        );
        let vcpu = schema::vcpu_usage(1.0, &cpu, &Ok(later));
        // A counter that went back (iowait here) counts 0, and the kinds stay within 100 %.
        let back = schema::vcpu_usage(
            1.0,
            &schema::CpuTimes::parse("cpu  0 0 0 100 50 0 0 0\n"),
            &Ok(schema::CpuTimes::parse("cpu  0 0 0 200 20 0 0 0\n")),
        );
        assert_eq!(
            (back.average_usage.idle, back.average_usage.io_wait),
            (100.0, 0.0)
        );
        let doc = schema::document(&figures(), &hw(), vcpu, schema::memory_info(1.0));
        let v = serde_json::to_value(&doc).unwrap();
        let rt = &v["neuron_runtime_data"];
        assert_eq!(rt.as_array().map(Vec::len), Some(2));
        let live = &rt[0];
        assert_eq!(live["pid"], 101);
        assert_eq!(live["address"], "");
        assert_eq!(live["neuron_runtime_tag"], "app-101 --serve");
        assert_eq!(live["error"], "");
        let r = &live["report"];
        let nc = &r["neuroncore_counters"];
        assert_eq!(num(&nc["period"]), 1.0);
        assert_eq!(nc["error"], "");
        // Keyed by the device's logical core index (vnc + 4 in the fixture).
        assert_eq!(
            num(&nc["neuroncores_in_use"]["4"]["neuroncore_utilization"]),
            25.0
        );
        assert_eq!(nc["neuroncores_in_use"]["4"]["flops"], 0);
        assert_eq!(
            num(&nc["neuroncores_in_use"]["5"]["neuroncore_utilization"]),
            0.0
        );
        let es = &r["execution_stats"];
        assert_eq!(es["execution_summary"]["completed"], 40);
        assert_eq!(es["execution_summary"]["timed_out"], 2);
        assert_eq!(es["execution_summary"]["failed_to_queue"], 0);
        assert_eq!(es["error_summary"]["transient"], 2);
        for k in ["generic", "numerical", "model", "runtime", "hardware"] {
            assert_eq!(es["error_summary"][k], 0, "{k}");
        }
        let total = &es["latency_stats"]["total_latency"];
        for p in ["p0", "p1", "p25", "p50", "p75", "p99", "p100"] {
            let s = num(&total[p]);
            assert!(
                (s - 0.002).abs() <= 0.002 / 8.0,
                "{p}: {s} s, not about 2 ms"
            );
        }
        assert!((num(&es["latency_stats"]["device_latency"]["p50"]) - 0.001).abs() <= 0.001 / 8.0);
        let mu = &r["memory_used"];
        let used = &mu["neuron_runtime_used_bytes"];
        assert_eq!(used["host"], 0);
        assert_eq!(used["neuron_device"], 2 * 1500);
        let core4 = &used["usage_breakdown"]["neuroncore_memory_usage"]["4"];
        assert_eq!(
            [
                &core4["constants"],
                &core4["model_code"],
                &core4["model_shared_scratchpad"],
                &core4["runtime_memory"],
                &core4["tensors"]
            ],
            [100, 200, 300, 400, 500]
        );
        assert_eq!(used["usage_breakdown"]["host"]["dma_buffers"], 0);
        let model = &mu["loaded_models"][0];
        assert_eq!(model["name"], "digits");
        assert_eq!(model["is_running"], true);
        assert_eq!(model["memory_used_bytes"]["neuron_device"], 1500);
        assert_eq!(model["subgraphs"]["sg00"]["neuroncore_index"], 4);

        let stale = &rt[1];
        assert_eq!(stale["pid"], 303);
        assert!(stale["error"].as_str().unwrap().contains("stale"));
        assert_eq!(
            stale["report"]["execution_stats"]["execution_summary"]["completed"],
            0
        );
        assert!(stale["report"]["execution_stats"]["latency_stats"]["total_latency"].is_null());
        assert_eq!(
            stale["report"]["neuroncore_counters"]["neuroncores_in_use"],
            serde_json::json!({})
        );

        let hwc = &v["system_data"]["neuron_hw_counters"];
        assert_eq!(hwc["error"], "");
        assert_eq!(hwc["neuron_devices"][0]["neuron_device_index"], 0);
        let nc0 = &hwc["neuron_devices"][0]["neuroncores"]["0"];
        assert_eq!(
            (&nc0["executions"], &nc0["dma_bytes"], &nc0["doorbells"]),
            (&42.into(), &4096.into(), &43.into())
        );
        assert_eq!(nc0["notifications"], 0);
        // The live runtime's LNC (1, set by the process on this trn2)...
        let hi = &v["neuron_hardware_info"];
        assert_eq!(hi["neuron_device_count"], 1);
        assert_eq!(hi["neuroncore_per_device_count"], 8);
        assert_eq!(hi["logical_neuroncore_config"], 1);
        assert_eq!(hi["neuron_device_type"], "trn2");
        // ... and with none live, the one a runtime started now would use (trn2's 2).
        let idle = collect::Figures {
            period: Duration::from_secs(1),
            processes: Vec::new(),
        };
        let doc = schema::document(
            &idle,
            &hw(),
            schema::VcpuUsage::default(),
            schema::memory_info(1.0),
        );
        let idle_doc: Value = serde_json::to_value(&doc).unwrap();
        let hi = &idle_doc["neuron_hardware_info"];
        assert_eq!(hi["neuroncore_per_device_count"], 4);
        assert_eq!(hi["logical_neuroncore_config"], 2);
        assert!(
            v["instance_info"]["error"]
                .as_str()
                .is_some_and(|e| !e.is_empty())
        );
        assert!(num(&v["system_data"]["memory_info"]["memory_total_bytes"]) > 0.0);
        // vcpu_usage: percent of the period's jiffies (800 of them: 200 user, 100 system,
        // 465 idle, 35 steal: steal counts in the total only), and the context switches in it.
        let vcpu = &v["system_data"]["vcpu_usage"];
        assert_eq!(num(&vcpu["average_usage"]["user"]), 25.0);
        assert_eq!(num(&vcpu["average_usage"]["system"]), 12.5);
        assert_eq!(num(&vcpu["usage_data"]["0"]["idle"]), 58.125);
        assert_eq!(num(&vcpu["context_switch_count"]), 100.0);
        assert_eq!(vcpu["error"], "");
    }

    #[test]
    fn latency_is_null_in_a_period_without_executions() {
        let fig = figures();
        let idle = collect::Figures {
            period: fig.period,
            processes: vec![collect::ProcessFigures {
                total_latency: Default::default(),
                device_latency: Default::default(),
                ..fig.processes[0].clone()
            }],
        };
        let v = serde_json::to_value(schema::document(
            &idle,
            &HwSample::default(),
            Default::default(),
            Default::default(),
        ))
        .unwrap();
        let ls = &v["neuron_runtime_data"][0]["report"]["execution_stats"]["latency_stats"];
        assert!(
            ls["total_latency"].is_null() && ls["device_latency"].is_null(),
            "{ls}"
        );
        assert_eq!(v["neuron_hardware_info"]["neuron_device_count"], 0);
    }

    #[test]
    fn the_exposition_is_valid_and_holds_the_figures() {
        exposition::self_test();
        let text = prometheus::render(&figures(), &hw());
        let e = exposition::validate(&text).unwrap_or_else(|err| panic!("{err}\n{text}"));
        let one = |name: &str, labels: &[(&str, &str)]| -> f64 {
            let hits: Vec<_> = e
                .named(name)
                .filter(|s| labels.iter().all(|(k, v)| s.label(k) == Some(*v)))
                .collect();
            assert_eq!(hits.len(), 1, "{name} {labels:?} in\n{text}");
            hits[0].value
        };
        assert_eq!(e.types["execution_status_total"], "counter");
        assert_eq!(e.types["execution_latency_seconds"], "summary");
        assert_eq!(one("neuron_runtime_processes", &[("state", "live")]), 1.0);
        assert_eq!(one("neuron_runtime_processes", &[("state", "stale")]), 1.0);
        assert_eq!(
            one(
                "neuroncore_utilization_ratio",
                &[("pid", "101"), ("neuroncore", "4")]
            ),
            0.25
        );
        // Counters are totals since start: 50 + 3 completed, 2 timed out.
        assert_eq!(
            one(
                "execution_status_total",
                &[("pid", "101"), ("status_type", "completed")]
            ),
            53.0
        );
        assert_eq!(
            one(
                "execution_status_total",
                &[("pid", "101"), ("status_type", "timed_out")]
            ),
            2.0
        );
        assert_eq!(
            one(
                "execution_errors_total",
                &[("pid", "101"), ("error_type", "transient")]
            ),
            2.0
        );
        assert_eq!(
            one(
                "neuroncore_executions_total",
                &[("pid", "101"), ("neuroncore", "5")]
            ),
            3.0
        );
        assert_eq!(
            one(
                "execution_latency_seconds_count",
                &[("pid", "101"), ("latency_type", "total")]
            ),
            55.0
        );
        let p100 = one(
            "execution_latency_seconds",
            &[("pid", "101"), ("latency_type", "total"), ("quantile", "1")],
        );
        assert!((p100 - 0.002).abs() < 1e-9, "{p100}");
        assert_eq!(
            one(
                "neuroncore_memory_usage_tensors",
                &[("pid", "101"), ("neuroncore", "4")]
            ),
            500.0
        );
        assert_eq!(
            one(
                "neuron_runtime_memory_used_bytes",
                &[("pid", "101"), ("memory_location", "neuron_device")]
            ),
            3000.0
        );
        assert_eq!(one("neuron_hw_counters_up", &[]), 1.0);
        assert_eq!(one("neuron_hw_executions_total", &[("nc", "0")]), 42.0);
        assert_eq!(one("neuron_hw_dma_bytes_total", &[("nc", "0")]), 4096.0);
        assert!(
            e.named("execution_status_total")
                .all(|s| s.label("pid") != Some("303")),
            "stale"
        );
    }

    /// A process that closed its runtime and started another has both in the period: one
    /// series per label set, the new runtime's.
    #[test]
    fn a_process_with_two_runtimes_exports_one_series_per_label_set() {
        let t0 = Instant::now();
        let old = ProcessSnapshot {
            liveness: Liveness::Closed,
            ..process(101, 3, vec![core(0, 50, 0, 10, 0)])
        };
        let new = ProcessSnapshot {
            created_unix_ns: old.created_unix_ns + 2_000_000_000,
            ..process(101, 1, vec![core(0, 70, 0, 10, 0)])
        };
        let cur = Sample {
            at: t0,
            processes: vec![old, new],
        };
        let text = prometheus::render(&collect(None, &cur), &hw());
        let e = exposition::validate(&text).unwrap_or_else(|err| panic!("{err}\n{text}"));
        let runs: Vec<f64> = e
            .named("neuroncore_executions_total")
            .map(|s| s.value)
            .collect();
        assert_eq!(runs, [70.0], "{text}");
    }

    #[test]
    fn label_values_are_escaped() {
        let mut fig = figures();
        fig.processes[0].command = "a \"quoted\" \\ path\nnext".into();
        let text = prometheus::render(&fig, &HwSample::default());
        let e = exposition::validate(&text).unwrap_or_else(|err| panic!("{err}\n{text}"));
        let tag = e
            .named("execution_status_total")
            .next()
            .and_then(|s| s.label("runtime_tag").map(str::to_owned));
        assert_eq!(tag.as_deref(), Some("a \"quoted\" \\ path\nnext"));
        assert_eq!(
            e.named("neuron_hw_counters_up").next().map(|s| s.value),
            Some(0.0)
        );
    }

    #[test]
    fn prometheus_binds_loopback_only_unless_allowed() {
        use prometheus::{AddrError, bind_addr};
        assert!(bind_addr("127.0.0.1:0", false).is_ok());
        assert!(bind_addr("[::1]:9090", false).is_ok());
        assert!(bind_addr("localhost:0", false).is_ok());
        let refused = bind_addr("0.0.0.0:9090", false);
        assert!(matches!(refused, Err(AddrError::Remote(_))), "{refused:?}");
        assert!(
            refused
                .unwrap_err()
                .to_string()
                .contains("--prometheus-allow-remote")
        );
        assert!(bind_addr("0.0.0.0:9090", true).is_ok());
        assert!(matches!(
            bind_addr("nonsense", false),
            Err(AddrError::Invalid(_))
        ));
        assert!(matches!(
            bind_addr("127.0.0.1", false),
            Err(AddrError::Invalid(_))
        ));
    }

    #[test]
    fn periods_are_humantime_and_positive() {
        assert_eq!(parse_period("100ms"), Ok(Duration::from_millis(100)));
        assert_eq!(parse_period("1s"), Ok(Duration::from_secs(1)));
        assert!(parse_period("0s").unwrap_err().contains("more than zero"));
        assert!(parse_period("fast").is_err());
        assert_eq!(parse_period("1day"), Ok(Duration::from_secs(86400)));
        assert!(
            parse_period("500000000000y")
                .unwrap_err()
                .contains("at most a day")
        );
    }
}
