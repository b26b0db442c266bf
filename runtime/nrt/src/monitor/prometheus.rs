//! The monitor's figures in Prometheus text exposition format 0.0.4, served at `GET /metrics`.
//!
//! Metric names follow neuron-monitor's Prometheus companion where it has one
//! (`neuroncore_utilization_ratio`, `execution_status_total`, `execution_errors_total`,
//! `execution_latency_seconds`, `neuroncore_memory_usage_*`, `neuron_runtime_memory_used_bytes`,
//! `neuron_hardware_info`), with a `pid` label per runtime process. Counters are totals since
//! each process's `nrt_init` (simdev's since it started); latency is a summary over the same span.
//! Only live processes are exported, one runtime per process: after `nrt_close` and a new
//! `nrt_init`, the new runtime's (its counters start again: a counter reset).

use std::fmt::Write as _;
use std::net::{SocketAddr, ToSocketAddrs};
use std::sync::{Arc, Mutex};

use runtime::datastore::snapshot::MemKind;

use super::collect::{Figures, ProcessFigures};
use super::hw::HwSample;
use super::schema::PERCENTILES;

/// The content type of the exposition.
pub const CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

/// A label value with `\`, `"` and newlines escaped.
fn escape(v: &str) -> String {
    let mut out = String::with_capacity(v.len());
    for ch in v.chars() {
        match ch {
            '\\' => out.push_str("\\\\"),
            '"' => out.push_str("\\\""),
            '\n' => out.push_str("\\n"),
            c => out.push(c),
        }
    }
    out
}

/// Builds the exposition one family at a time.
struct Writer {
    out: String,
}

impl Writer {
    fn family(&mut self, name: &str, kind: &str, help: &str) {
        let _ = writeln!(self.out, "# HELP {name} {help}");
        let _ = writeln!(self.out, "# TYPE {name} {kind}");
    }

    fn sample(&mut self, name: &str, labels: &[(&str, &str)], value: f64) {
        self.out.push_str(name);
        if !labels.is_empty() {
            self.out.push('{');
            for (i, (k, v)) in labels.iter().enumerate() {
                if i > 0 {
                    self.out.push(',');
                }
                let _ = write!(self.out, "{k}=\"{}\"", escape(v));
            }
            self.out.push('}');
        }
        let _ = writeln!(self.out, " {}", fmt_value(value));
    }
}

fn fmt_value(v: f64) -> String {
    if v.is_nan() {
        "NaN".into()
    } else if v.is_infinite() {
        if v > 0.0 {
            "+Inf".into()
        } else {
            "-Inf".into()
        }
    } else {
        format!("{v}")
    }
}

#[allow(clippy::cast_precision_loss)]
fn f(n: u64) -> f64 {
    n as f64
}

/// The exposition of `fig` and `hw`.
pub fn render(fig: &Figures, hw: &HwSample) -> String {
    let mut w = Writer { out: String::new() };
    // One runtime per pid, the one initialised last: a process that closed a runtime and
    // started another has both in the period, and two series of one label set are invalid.
    // Its counters start again with the new runtime (a counter reset).
    let mut live: Vec<&ProcessFigures> = Vec::new();
    for p in fig.live() {
        match live.iter_mut().find(|q| q.pid == p.pid) {
            Some(q) if q.created_unix_ns < p.created_unix_ns => *q = p,
            Some(_) => {}
            None => live.push(p),
        }
    }

    w.family(
        "neuron_runtime_processes",
        "gauge",
        "Runtime processes with a datastore, by state (live or stale).",
    );
    w.sample(
        "neuron_runtime_processes",
        &[("state", "live")],
        f(live.len() as u64),
    );
    w.sample(
        "neuron_runtime_processes",
        &[("state", "stale")],
        f(fig.stale_count() as u64),
    );

    w.family(
        "neuroncore_utilization_ratio",
        "gauge",
        "NeuronCore busy time over wall time in the last period (0..1).",
    );
    for p in &live {
        let pid = p.pid.to_string();
        for c in &p.cores {
            let core = c.logical_id.to_string();
            w.sample(
                "neuroncore_utilization_ratio",
                &[("pid", &pid), ("neuroncore", &core)],
                c.utilization_pct / 100.0,
            );
        }
    }

    w.family(
        "neuroncore_executions_total",
        "counter",
        "Executions that ended on the logical core since the process started.",
    );
    for p in &live {
        let pid = p.pid.to_string();
        for c in &p.cores {
            let core = c.logical_id.to_string();
            w.sample(
                "neuroncore_executions_total",
                &[("pid", &pid), ("neuroncore", &core)],
                f(c.executions_total),
            );
        }
    }

    w.family(
        "execution_status_total",
        "counter",
        "Executions by outcome (neuron-monitor's execution_summary classes) since start.",
    );
    for p in &live {
        let pid = p.pid.to_string();
        for (class, n) in p.execution_total.iter() {
            w.sample(
                "execution_status_total",
                &[
                    ("pid", &pid),
                    ("runtime_tag", &p.command),
                    ("status_type", class),
                ],
                f(n),
            );
        }
    }

    w.family(
        "execution_errors_total",
        "counter",
        "Failed executions by error class (neuron-monitor's error_summary) since start.",
    );
    for p in &live {
        let pid = p.pid.to_string();
        for (class, n) in p.error_total.iter() {
            w.sample(
                "execution_errors_total",
                &[
                    ("pid", &pid),
                    ("runtime_tag", &p.command),
                    ("error_type", class),
                ],
                f(n),
            );
        }
    }

    w.family(
        "execution_latency_seconds",
        "summary",
        "Execution latency since start: total (submit to completion) and device.",
    );
    for p in &live {
        let pid = p.pid.to_string();
        for (kind, h) in [
            ("total", &p.total_latency_all),
            ("device", &p.device_latency_all),
        ] {
            for (_, q) in PERCENTILES {
                if let Some(ns) = h.percentile(q) {
                    let quantile = fmt_value(q / 100.0);
                    w.sample(
                        "execution_latency_seconds",
                        &[
                            ("pid", &pid),
                            ("latency_type", kind),
                            ("quantile", &quantile),
                        ],
                        f(ns) / 1e9,
                    );
                }
            }
            let labels = [("pid", pid.as_str()), ("latency_type", kind)];
            w.sample("execution_latency_seconds_sum", &labels, f(h.sum_ns) / 1e9);
            w.sample("execution_latency_seconds_count", &labels, f(h.count));
        }
    }

    for kind in MemKind::ALL {
        let name = format!("neuroncore_memory_usage_{}", kind.name());
        w.family(
            &name,
            "gauge",
            &format!(
                "Device bytes of kind {} held on the logical core.",
                kind.name()
            ),
        );
        for p in &live {
            let pid = p.pid.to_string();
            for c in &p.cores {
                let core = c.logical_id.to_string();
                w.sample(
                    &name,
                    &[("pid", &pid), ("neuroncore", &core)],
                    f(c.memory.get(kind)),
                );
            }
        }
    }

    w.family(
        "neuron_runtime_memory_used_bytes",
        "gauge",
        "Memory the runtime process uses, by location (host is not counted: 0).",
    );
    for p in &live {
        let pid = p.pid.to_string();
        w.sample(
            "neuron_runtime_memory_used_bytes",
            &[("pid", &pid), ("memory_location", "host")],
            0.0,
        );
        w.sample(
            "neuron_runtime_memory_used_bytes",
            &[("pid", &pid), ("memory_location", "neuron_device")],
            f(p.device_bytes()),
        );
    }

    w.family(
        "neuron_hw_counters_up",
        "gauge",
        "1 when simdev's hardware counters were read, 0 when no simdev was reachable.",
    );
    w.sample(
        "neuron_hw_counters_up",
        &[],
        if hw.error.is_empty() && hw.device.is_some() {
            1.0
        } else {
            0.0
        },
    );
    if let Some((_, first)) = hw.ncs.first() {
        for (counter, _) in first.iter() {
            let name = format!("neuron_hw_{counter}_total");
            w.family(
                &name,
                "counter",
                &format!("simdev's {counter} counter of the NC since simdev started."),
            );
            for (nc, c) in &hw.ncs {
                let nc = nc.to_string();
                w.sample(
                    &name,
                    &[("neuron_device", "0"), ("nc", &nc)],
                    f(c.get(counter).unwrap_or(0)),
                );
            }
        }
    }
    if let Some(d) = &hw.device {
        w.family(
            "neuron_hardware_info",
            "gauge",
            "The device (labels); the value is 1.",
        );
        let ncs = d.nc_count.to_string();
        w.sample(
            "neuron_hardware_info",
            &[
                ("neuron_device_type", d.arch),
                ("neuron_device_count", "1"),
                ("neuroncore_count", &ncs),
            ],
            1.0,
        );
    }
    w.out
}

/// Why a `--prometheus` address is refused.
#[derive(Debug, PartialEq, Eq)]
pub enum AddrError {
    /// Not `HOST:PORT`, or the host does not resolve.
    Invalid(String),
    /// Not a loopback address and remote access was not allowed.
    Remote(SocketAddr),
}

impl std::fmt::Display for AddrError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Invalid(s) => write!(
                f,
                "--prometheus {s}: expected HOST:PORT, e.g. 127.0.0.1:9090"
            ),
            Self::Remote(a) => write!(
                f,
                "--prometheus {a}: not a loopback address; the metrics would be readable from other \
                 hosts. Pass --prometheus-allow-remote to serve them there anyway"
            ),
        }
    }
}

/// The address to bind for `--prometheus ADDR`: loopback only unless `allow_remote`.
///
/// # Errors
/// [`AddrError`].
pub fn bind_addr(addr: &str, allow_remote: bool) -> Result<SocketAddr, AddrError> {
    let addrs: Vec<SocketAddr> = addr
        .to_socket_addrs()
        .map_err(|_| AddrError::Invalid(addr.into()))?
        .collect();
    let first = *addrs
        .first()
        .ok_or_else(|| AddrError::Invalid(addr.into()))?;
    if !allow_remote && let Some(remote) = addrs.iter().find(|a| !a.ip().is_loopback()) {
        return Err(AddrError::Remote(*remote));
    }
    Ok(first)
}

/// The exposition served, replaced once per period.
pub type Shared = Arc<Mutex<String>>;

/// Serves `GET /metrics` (and `HEAD`; another method is 405) on `addr` from a thread; returns
/// the bound address.
///
/// # Errors
/// The bind's error.
pub fn serve(addr: SocketAddr, page: Shared) -> Result<SocketAddr, String> {
    let server = tiny_http::Server::http(addr).map_err(|e| format!("binding {addr}: {e}"))?;
    let bound = server
        .server_addr()
        .to_ip()
        .ok_or_else(|| format!("binding {addr}: not an IP listener"))?;
    let content_type =
        tiny_http::Header::from_bytes(&b"Content-Type"[..], CONTENT_TYPE.as_bytes()).ok();
    std::thread::Builder::new()
        .name("prometheus".into())
        .spawn(move || {
            for request in server.incoming_requests() {
                use tiny_http::Method;
                let metrics = request.url().split('?').next() == Some("/metrics");
                let response = match request.method() {
                    // tiny_http sends a HEAD response's headers only.
                    Method::Get | Method::Head if metrics => {
                        let body = page.lock().map(|p| p.clone()).unwrap_or_default();
                        let mut response = tiny_http::Response::from_string(body);
                        if let Some(h) = &content_type {
                            response.add_header(h.clone());
                        }
                        response
                    }
                    _ if metrics => {
                        let mut response =
                            tiny_http::Response::from_string("method not allowed: GET /metrics\n")
                                .with_status_code(405);
                        if let Ok(h) =
                            tiny_http::Header::from_bytes(&b"Allow"[..], &b"GET, HEAD"[..])
                        {
                            response.add_header(h);
                        }
                        response
                    }
                    _ => tiny_http::Response::from_string("not found: try GET /metrics\n")
                        .with_status_code(404),
                };
                let _ = request.respond(response);
            }
        })
        .map_err(|e| format!("starting the metrics thread: {e}"))?;
    Ok(bound)
}
