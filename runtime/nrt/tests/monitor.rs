//! `nrt monitor` as a process: documents in neuron-monitor's schema (deserialised field by
//! field into this file's own structs, unknown fields refused), `--count`, SIGINT/SIGTERM,
//! simdev's counters read as a plain client (never a private simdev), and the Prometheus
//! endpoint scraped over plain HTTP and checked with an exposition-format validator.
//!
//! Until the datastore reader lands, the runtime processes come from an empty
//! `NEURON_RT_DATASTORE_DIR`; the figures of non-empty datastores are covered by the unit tests.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use runtime::backend::sim::{PrivateSimdev, SimdevCommand};
use serde::Deserialize;

mod support {
    pub mod exposition;
}
use support::exposition;

// ---- neuron-monitor's document, as a consumer would declare it ----

#[derive(Deserialize, Debug)]
#[serde(deny_unknown_fields)]
struct Document {
    neuron_runtime_data: Vec<RuntimeData>,
    system_data: SystemData,
    instance_info: InstanceInfo,
    neuron_hardware_info: HardwareInfo,
}

#[derive(Deserialize, Debug)]
#[serde(deny_unknown_fields)]
#[allow(dead_code)]
struct RuntimeData {
    pid: u32,
    address: String,
    neuron_runtime_tag: String,
    error: String,
    report: Report,
}

#[derive(Deserialize, Debug)]
#[serde(deny_unknown_fields)]
#[allow(dead_code)]
struct Report {
    neuroncore_counters: NeuroncoreCounters,
    execution_stats: ExecutionStats,
    memory_used: MemoryUsed,
}

#[derive(Deserialize, Debug)]
#[serde(deny_unknown_fields)]
#[allow(dead_code)]
struct NeuroncoreCounters {
    period: f64,
    error: String,
    neuroncores_in_use: BTreeMap<String, NeuroncoreInUse>,
}

#[derive(Deserialize, Debug)]
#[serde(deny_unknown_fields)]
#[allow(dead_code)]
struct NeuroncoreInUse {
    neuroncore_utilization: f64,
    flops: u64,
}

#[derive(Deserialize, Debug)]
#[serde(deny_unknown_fields)]
#[allow(dead_code)]
struct ExecutionStats {
    period: f64,
    error: String,
    error_summary: BTreeMap<String, u64>,
    execution_summary: BTreeMap<String, u64>,
    latency_stats: LatencyStats,
}

#[derive(Deserialize, Debug)]
#[serde(deny_unknown_fields)]
#[allow(dead_code)]
struct LatencyStats {
    total_latency: Option<Percentiles>,
    device_latency: Option<Percentiles>,
}

#[derive(Deserialize, Debug)]
#[serde(deny_unknown_fields)]
#[allow(dead_code)]
struct Percentiles {
    p0: f64,
    p1: f64,
    p25: f64,
    p50: f64,
    p75: f64,
    p99: f64,
    p100: f64,
}

#[derive(Deserialize, Debug)]
#[serde(deny_unknown_fields)]
#[allow(dead_code)]
struct MemoryUsed {
    period: f64,
    error: String,
    neuron_runtime_used_bytes: UsedBytes,
    loaded_models: Vec<serde_json::Value>,
}

#[derive(Deserialize, Debug)]
#[serde(deny_unknown_fields)]
#[allow(dead_code)]
struct UsedBytes {
    host: u64,
    neuron_device: u64,
    usage_breakdown: UsageBreakdown,
}

#[derive(Deserialize, Debug)]
#[serde(deny_unknown_fields)]
#[allow(dead_code)]
struct UsageBreakdown {
    host: BTreeMap<String, u64>,
    neuroncore_memory_usage: BTreeMap<String, BTreeMap<String, u64>>,
}

#[derive(Deserialize, Debug)]
#[serde(deny_unknown_fields)]
struct SystemData {
    neuron_hw_counters: HwCounters,
    vcpu_usage: VcpuUsage,
    memory_info: MemoryInfo,
}

#[derive(Deserialize, Debug)]
#[serde(deny_unknown_fields)]
struct VcpuUsage {
    period: f64,
    error: String,
    average_usage: CpuUsage,
    usage_data: BTreeMap<String, CpuUsage>,
    context_switch_count: u64,
}

#[derive(Deserialize, Debug)]
#[serde(deny_unknown_fields)]
struct CpuUsage {
    user: f64,
    nice: f64,
    system: f64,
    idle: f64,
    io_wait: f64,
    irq: f64,
    soft_irq: f64,
}

impl CpuUsage {
    fn sum(&self) -> f64 {
        self.user + self.nice + self.system + self.idle + self.io_wait + self.irq + self.soft_irq
    }
}

#[derive(Deserialize, Debug)]
#[serde(deny_unknown_fields)]
struct HwCounters {
    period: f64,
    error: String,
    neuron_devices: Vec<HwDevice>,
}

#[derive(Deserialize, Debug)]
#[serde(deny_unknown_fields)]
struct HwDevice {
    neuron_device_index: u32,
    neuroncores: BTreeMap<String, BTreeMap<String, u64>>,
}

#[derive(Deserialize, Debug)]
#[serde(deny_unknown_fields)]
#[allow(dead_code)]
struct MemoryInfo {
    period: f64,
    error: String,
    memory_total_bytes: u64,
    memory_used_bytes: u64,
    swap_total_bytes: u64,
    swap_used_bytes: u64,
}

#[derive(Deserialize, Debug)]
#[serde(deny_unknown_fields)]
#[allow(dead_code)]
struct InstanceInfo {
    instance_name: String,
    instance_id: String,
    instance_type: String,
    instance_availability_zone: String,
    instance_region: String,
    error: String,
}

#[derive(Deserialize, Debug)]
#[serde(deny_unknown_fields)]
struct HardwareInfo {
    neuron_device_type: String,
    neuron_device_count: u32,
    neuroncore_per_device_count: u32,
    logical_neuroncore_config: u32,
    neuron_device_memory_size: u64,
    error: String,
}

// ---- helpers ----

/// `nrt monitor ARGS` with an empty datastore directory and `simdev` as the simdev socket (or
/// none).
fn monitor(args: &[&str], store: &std::path::Path, simdev: Option<&std::path::Path>) -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_nrt"));
    cmd.arg("monitor")
        .args(args)
        .env("NEURON_RT_DATASTORE_DIR", store)
        .env_remove("NEURON_SIMDEV_SOCKET")
        .env_remove("NEURON_RT_BACKEND");
    if let Some(s) = simdev {
        cmd.env("NEURON_SIMDEV_SOCKET", s);
    }
    cmd
}

fn documents(stdout: &[u8]) -> Vec<Document> {
    String::from_utf8_lossy(stdout)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}")))
        .collect()
}

fn simdev() -> PrivateSimdev {
    PrivateSimdev::spawn(&SimdevCommand {
        program: env!("CARGO_BIN_EXE_nrt").into(),
        args_prefix: vec!["simdev".into()],
        extra_args: Vec::new(),
    })
    .expect("simdev starts")
}

/// Kills `child` if a test fails before it does.
struct Reap(Child);

impl Drop for Reap {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

// ---- tests ----

#[test]
fn count_documents_one_per_period_in_neuron_monitors_schema() {
    let store = tempfile::tempdir().unwrap();
    let t0 = Instant::now();
    let out = monitor(&["--period", "100ms", "--count", "3"], store.path(), None)
        .output()
        .unwrap();
    let took = t0.elapsed();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let docs = documents(&out.stdout);
    assert_eq!(docs.len(), 3);
    assert!(
        took >= Duration::from_millis(300),
        "3 periods of 100 ms took {took:?}"
    );
    for d in &docs {
        assert!(
            d.neuron_runtime_data.is_empty(),
            "no datastores in an empty dir"
        );
        let hw = &d.system_data.neuron_hw_counters;
        assert!(
            (0.05..1.0).contains(&hw.period),
            "period {} s for --period 100ms",
            hw.period
        );
        assert!(
            hw.error.contains("NEURON_SIMDEV_SOCKET is not set"),
            "{}",
            hw.error
        );
        assert!(hw.neuron_devices.is_empty());
        assert_eq!(d.neuron_hardware_info.neuron_device_count, 0);
        assert!(!d.neuron_hardware_info.error.is_empty());
        assert!(!d.instance_info.error.is_empty());
        assert!(d.system_data.memory_info.memory_total_bytes > 0);
        // The host's vCPUs over the period, each within 0..=100 % (steal is outside them).
        let v = &d.system_data.vcpu_usage;
        assert_eq!(v.error, "");
        assert!(v.period > 0.0);
        assert!(!v.usage_data.is_empty());
        for u in std::iter::once(&v.average_usage).chain(v.usage_data.values()) {
            assert!((0.0..=100.0 + 1e-9).contains(&u.sum()), "{u:?}");
        }
        let _ = v.context_switch_count;
    }
}

#[test]
fn hw_counters_come_from_the_named_simdev_as_a_plain_client() {
    let sim = simdev();
    let store = tempfile::tempdir().unwrap();
    let out = monitor(
        &["--period", "50ms", "--count", "1"],
        store.path(),
        Some(sim.socket()),
    )
    .output()
    .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let d = documents(&out.stdout).pop().expect("one document");
    let hw = &d.system_data.neuron_hw_counters;
    assert_eq!(hw.error, "");
    assert_eq!(hw.neuron_devices.len(), 1);
    assert_eq!(hw.neuron_devices[0].neuron_device_index, 0);
    let ncs = &hw.neuron_devices[0].neuroncores;
    let info = &d.neuron_hardware_info;
    assert_eq!((info.neuron_device_count, info.error.as_str()), (1, ""));
    assert!(info.neuroncore_per_device_count >= 1);
    assert!(!info.neuron_device_type.is_empty() && info.neuron_device_memory_size > 0);
    assert_eq!(
        u32::try_from(ncs.len()).unwrap(),
        info.neuroncore_per_device_count * info.logical_neuroncore_config
    );
    for (nc, counters) in ncs {
        for name in [
            "executions",
            "exec_errors",
            "dma_bytes",
            "doorbells",
            "notifications",
        ] {
            assert_eq!(
                counters.get(name),
                Some(&0),
                "NC {nc} {name} on an idle simdev"
            );
        }
    }
}

#[test]
fn no_simdev_listening_is_an_error_string_not_a_private_simdev() {
    let store = tempfile::tempdir().unwrap();
    let socket = store.path().join("nobody-listens.sock");
    let out = monitor(
        &["--period", "20ms", "--count", "2"],
        store.path(),
        Some(&socket),
    )
    .output()
    .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    for d in documents(&out.stdout) {
        let hw = &d.system_data.neuron_hw_counters;
        assert!(hw.error.contains("no simdev reachable at"), "{}", hw.error);
        assert!(hw.error.contains("nobody-listens.sock"), "{}", hw.error);
        assert!(hw.neuron_devices.is_empty());
    }
    assert!(
        !socket.exists(),
        "the monitor must not start a simdev there"
    );
}

#[test]
fn sigint_and_sigterm_end_the_stream_with_status_0() {
    use nix::sys::signal::{Signal, kill};
    use nix::unistd::Pid;
    for sig in [Signal::SIGINT, Signal::SIGTERM] {
        let store = tempfile::tempdir().unwrap();
        let child = monitor(&["--period", "50ms"], store.path(), None)
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let mut child = Reap(child);
        let mut lines = BufReader::new(child.0.stdout.take().unwrap()).lines();
        // A document is out, so the handler is installed.
        let first = lines.next().unwrap().unwrap();
        serde_json::from_str::<Document>(&first).unwrap();
        kill(Pid::from_raw(child.0.id() as i32), sig).unwrap();
        let deadline = Instant::now() + Duration::from_secs(10);
        let status = loop {
            if let Some(s) = child.0.try_wait().unwrap() {
                break s;
            }
            assert!(Instant::now() < deadline, "{sig} did not stop nrt monitor");
            std::thread::sleep(Duration::from_millis(10));
        };
        assert!(status.success(), "{sig}: {status}");
    }
}

#[test]
fn bad_options_are_refused_with_a_reason() {
    let store = tempfile::tempdir().unwrap();
    for (args, why) in [
        (
            &["--prometheus", "0.0.0.0:0"][..],
            "--prometheus-allow-remote",
        ),
        (&["--prometheus", "not-an-address"][..], "HOST:PORT"),
        (&["--period", "0s"][..], "more than zero"),
        (&["--period", "soon"][..], "e.g. 100ms"),
        // Zero documents would print nothing and succeed, checking nothing.
        (&["--count", "0"][..], "not in 1.."),
    ] {
        let out = monitor(args, store.path(), None).output().unwrap();
        assert!(!out.status.success(), "{args:?} accepted");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains(why), "{args:?}: {err}");
        assert!(out.stdout.is_empty(), "{args:?}");
    }
}

/// `GET path` over plain HTTP/1.0; returns the status line, headers and body.
fn http_get(port: u16, path: &str) -> (String, String, String) {
    http(port, "GET", path)
}

/// (status line, lower-cased headers, body) of `method path`.
fn http(port: u16, method: &str, path: &str) -> (String, String, String) {
    let mut s = TcpStream::connect(("127.0.0.1", port)).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    write!(s, "{method} {path} HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n").unwrap();
    let mut raw = String::new();
    s.read_to_string(&mut raw).unwrap();
    let (head, body) = raw.split_once("\r\n\r\n").expect("a header block");
    let (status, headers) = head.split_once("\r\n").unwrap_or((head, ""));
    (status.to_string(), headers.to_lowercase(), body.to_string())
}

#[test]
fn prometheus_scrape_is_valid_exposition_with_the_counters() {
    exposition::self_test();
    let sim = simdev();
    let store = tempfile::tempdir().unwrap();
    let child = monitor(
        &["--period", "100ms", "--prometheus", "127.0.0.1:0"],
        store.path(),
        Some(sim.socket()),
    )
    .stdout(Stdio::piped())
    .stderr(Stdio::piped())
    .spawn()
    .unwrap();
    let mut child = Reap(child);
    let mut err_lines = BufReader::new(child.0.stderr.take().unwrap()).lines();
    let listening = err_lines.next().unwrap().unwrap();
    let port: u16 = listening
        .strip_prefix("listening on http://127.0.0.1:")
        .and_then(|r| r.strip_suffix("/metrics"))
        .and_then(|p| p.parse().ok())
        .unwrap_or_else(|| panic!("stderr's first line: {listening:?}"));
    // The JSON stream goes on beside the endpoint.
    let mut out_lines = BufReader::new(child.0.stdout.take().unwrap()).lines();
    serde_json::from_str::<Document>(&out_lines.next().unwrap().unwrap()).unwrap();

    let (status, headers, body) = http_get(port, "/metrics");
    assert!(status.contains(" 200"), "{status}");
    assert!(
        headers.contains("content-type: text/plain; version=0.0.4"),
        "{headers}"
    );
    let e = exposition::validate(&body).unwrap_or_else(|err| panic!("{err}\n{body}"));
    for family in [
        "neuron_runtime_processes",
        "neuroncore_utilization_ratio",
        "execution_status_total",
        "execution_errors_total",
        "execution_latency_seconds",
        "neuroncore_memory_usage_constants",
        "neuron_runtime_memory_used_bytes",
        "neuron_hw_counters_up",
        "neuron_hw_executions_total",
        "neuron_hw_dma_bytes_total",
        "neuron_hardware_info",
    ] {
        assert!(
            e.types.contains_key(family),
            "{family} not declared:\n{body}"
        );
    }
    assert_eq!(e.types["neuron_hw_executions_total"], "counter");
    assert_eq!(
        e.named("neuron_hw_counters_up").next().map(|s| s.value),
        Some(1.0)
    );
    let ncs: Vec<_> = e.named("neuron_hw_executions_total").collect();
    assert!(!ncs.is_empty());
    assert!(
        ncs.iter()
            .all(|s| s.label("nc").is_some() && s.value == 0.0)
    );
    assert_eq!(
        e.named("neuron_runtime_processes")
            .find(|s| s.label("state") == Some("live"))
            .map(|s| s.value),
        Some(0.0)
    );

    let (status, _, _) = http_get(port, "/other");
    assert!(status.contains(" 404"), "{status}");
    // HEAD answers as GET without the body; another method on /metrics is 405, naming GET.
    let (status, headers, body) = http(port, "HEAD", "/metrics");
    assert!(
        status.contains(" 200") && headers.contains("content-type: text/plain; version=0.0.4"),
        "{status}\n{headers}"
    );
    assert!(body.is_empty(), "{body}");
    let (status, headers, _) = http(port, "POST", "/metrics");
    assert!(
        status.contains(" 405") && headers.contains("allow: get, head"),
        "{status}\n{headers}"
    );
}
