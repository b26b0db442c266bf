//! The document `nrt monitor` writes once per period, in neuron-monitor's shape: field names,
//! nesting and value types as neuron-monitor's user guide documents them. Counts in
//! `execution_stats` are the period's; latencies are in seconds; memory is in bytes.
//!
//! What is not known here is filled honestly: `flops` is 0 (simdev does not count floating
//! point operations), host memory is 0 (the datastore counts device memory only), and
//! `instance_info` carries an `error` saying no EC2 metadata was read.

use std::collections::BTreeMap;

use runtime::datastore::snapshot::{Histogram, MemKind, MemoryUsage};
use serde::Serialize;

use super::classes::{ErrorSummary, ExecutionSummary};
use super::collect::{Figures, ProcessFigures};
use super::hw::HwSample;

/// One document of the stream.
#[derive(Clone, Debug, Serialize)]
pub struct MonitorDocument {
    /// One entry per runtime process (live ones, then stale ones).
    pub neuron_runtime_data: Vec<RuntimeData>,
    /// System-level groups.
    pub system_data: SystemData,
    /// The instance.
    pub instance_info: InstanceInfo,
    /// The devices.
    pub neuron_hardware_info: HardwareInfo,
}

/// One runtime process.
#[derive(Clone, Debug, Serialize)]
pub struct RuntimeData {
    /// Its pid.
    pub pid: u32,
    /// Its address (always "": runtimes are found by their datastores, not a socket).
    pub address: String,
    /// Its command line.
    pub neuron_runtime_tag: String,
    /// "" or why its figures are missing (a stale datastore).
    pub error: String,
    /// Its metric groups.
    pub report: RuntimeReport,
}

/// A runtime process's metric groups.
#[derive(Clone, Debug, Serialize)]
pub struct RuntimeReport {
    /// Utilisation per logical core.
    pub neuroncore_counters: NeuroncoreCounters,
    /// Outcomes, errors and latency of the period's executions.
    pub execution_stats: ExecutionStats,
    /// Memory in use and loaded models.
    pub memory_used: MemoryUsed,
}

/// `neuroncore_counters`.
#[derive(Clone, Debug, Serialize)]
pub struct NeuroncoreCounters {
    /// Seconds the figures cover.
    pub period: f64,
    /// "" or what went wrong.
    pub error: String,
    /// By the device's logical core index (a decimal string).
    pub neuroncores_in_use: BTreeMap<String, NeuroncoreInUse>,
}

/// One logical core in `neuroncores_in_use`.
#[derive(Clone, Debug, Serialize)]
pub struct NeuroncoreInUse {
    /// Busy percent over the period.
    pub neuroncore_utilization: f64,
    /// Floating point operations per second: 0, simdev does not count them.
    pub flops: u64,
}

/// `execution_stats`.
#[derive(Clone, Debug, Serialize)]
pub struct ExecutionStats {
    /// Seconds the figures cover.
    pub period: f64,
    /// "" or what went wrong.
    pub error: String,
    /// Failed executions by class.
    pub error_summary: ErrorSummary,
    /// Executions by outcome.
    pub execution_summary: ExecutionSummary,
    /// Latency percentiles.
    pub latency_stats: LatencyStats,
}

/// `latency_stats`: `null` percentiles when no execution ended in the period.
#[derive(Clone, Debug, Serialize)]
pub struct LatencyStats {
    /// Submit to completion, as the runtime measures it.
    pub total_latency: Option<Percentiles>,
    /// On the device.
    pub device_latency: Option<Percentiles>,
}

/// Latency percentiles, seconds.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct Percentiles {
    /// Minimum.
    pub p0: f64,
    /// 1st percentile.
    pub p1: f64,
    /// 25th.
    pub p25: f64,
    /// Median.
    pub p50: f64,
    /// 75th.
    pub p75: f64,
    /// 99th.
    pub p99: f64,
    /// Maximum.
    pub p100: f64,
}

/// The percentiles neuron-monitor reports, as `(label, p)`.
pub const PERCENTILES: [(&str, f64); 7] = [
    ("p0", 0.0),
    ("p1", 1.0),
    ("p25", 25.0),
    ("p50", 50.0),
    ("p75", 75.0),
    ("p99", 99.0),
    ("p100", 100.0),
];

#[allow(clippy::cast_precision_loss)]
fn seconds(ns: u64) -> f64 {
    ns as f64 / 1e9
}

impl Percentiles {
    /// The percentiles of `h`; `None` while it is empty.
    pub fn of(h: &Histogram) -> Option<Self> {
        let p = |q: f64| h.percentile(q).map(seconds);
        Some(Self {
            p0: p(0.0)?,
            p1: p(1.0)?,
            p25: p(25.0)?,
            p50: p(50.0)?,
            p75: p(75.0)?,
            p99: p(99.0)?,
            p100: p(100.0)?,
        })
    }
}

/// `memory_used`.
#[derive(Clone, Debug, Serialize)]
pub struct MemoryUsed {
    /// Seconds since the previous reading.
    pub period: f64,
    /// "" or what went wrong.
    pub error: String,
    /// Bytes in use now.
    pub neuron_runtime_used_bytes: RuntimeUsedBytes,
    /// The models loaded now.
    pub loaded_models: Vec<LoadedModel>,
}

/// `neuron_runtime_used_bytes`.
#[derive(Clone, Debug, Serialize)]
pub struct RuntimeUsedBytes {
    /// Host bytes (0: not counted by the datastore).
    pub host: u64,
    /// Device bytes, all cores.
    pub neuron_device: u64,
    /// By where and what.
    pub usage_breakdown: UsageBreakdown,
}

/// `usage_breakdown`.
#[derive(Clone, Debug, Serialize)]
pub struct UsageBreakdown {
    /// Host memory by kind (all 0: not counted by the datastore).
    pub host: HostUsage,
    /// Device memory per logical core, by kind.
    pub neuroncore_memory_usage: BTreeMap<String, CoreMemory>,
}

/// Host memory by kind.
#[derive(Clone, Copy, Debug, Default, Serialize)]
pub struct HostUsage {
    /// The application's host memory.
    pub application_memory: u64,
    /// Constants kept on the host.
    pub constants: u64,
    /// DMA buffers.
    pub dma_buffers: u64,
    /// Tensors on the host.
    pub tensors: u64,
}

/// One logical core's device memory by kind (neuron-monitor's kind names).
#[derive(Clone, Copy, Debug, Serialize)]
pub struct CoreMemory {
    /// Weights and constants.
    pub constants: u64,
    /// Instruction streams.
    pub model_code: u64,
    /// Scratchpads.
    pub model_shared_scratchpad: u64,
    /// The runtime's own structures.
    pub runtime_memory: u64,
    /// Application tensors.
    pub tensors: u64,
}

impl From<MemoryUsage> for CoreMemory {
    fn from(m: MemoryUsage) -> Self {
        Self {
            constants: m.get(MemKind::Constants),
            model_code: m.get(MemKind::ModelCode),
            model_shared_scratchpad: m.get(MemKind::ModelSharedScratchpad),
            runtime_memory: m.get(MemKind::RuntimeMemory),
            tensors: m.get(MemKind::Tensors),
        }
    }
}

/// Host and device bytes.
#[derive(Clone, Copy, Debug, Serialize)]
pub struct MemoryBytes {
    /// Host bytes (0: not counted).
    pub host: u64,
    /// Device bytes.
    pub neuron_device: u64,
}

/// One loaded model.
#[derive(Clone, Debug, Serialize)]
pub struct LoadedModel {
    /// Its name.
    pub name: String,
    /// The NEFF header's uuid in hex, as `nrt neff info` prints it ("" for a simdev model
    /// container, which has none).
    pub uuid: String,
    /// The runtime's id for it.
    pub model_id: u64,
    /// Whether it is loaded and runnable.
    pub is_running: bool,
    /// Its memory.
    pub memory_used_bytes: MemoryBytes,
    /// Its subgraphs by name: one, `sg00`, on the core it is loaded on.
    pub subgraphs: BTreeMap<String, Subgraph>,
}

/// One subgraph of a loaded model.
#[derive(Clone, Debug, Serialize)]
pub struct Subgraph {
    /// Its memory.
    pub memory_used_bytes: MemoryBytes,
    /// The device's logical core index it runs on.
    pub neuroncore_index: u32,
    /// The device's index (0: one device).
    pub neuron_device_index: u32,
}

/// `system_data`.
#[derive(Clone, Debug, Serialize)]
pub struct SystemData {
    /// simdev's per-NC counters.
    pub neuron_hw_counters: HwCounters,
    /// Host CPU use over the period (`/proc/stat`).
    pub vcpu_usage: VcpuUsage,
    /// Host memory (`/proc/meminfo`).
    pub memory_info: MemoryInfo,
}

/// `vcpu_usage`: the host's CPU time over the period, in percent, as neuron-monitor reports it.
#[derive(Clone, Debug, Default, Serialize)]
pub struct VcpuUsage {
    /// Seconds since the previous reading.
    pub period: f64,
    /// "" or why `/proc/stat` could not be read.
    pub error: String,
    /// Every vCPU together.
    pub average_usage: CpuUsage,
    /// By vCPU index.
    pub usage_data: BTreeMap<String, CpuUsage>,
    /// Context switches in the period.
    pub context_switch_count: u64,
}

/// One vCPU's (or all vCPUs') time by kind, percent of the period.
#[derive(Clone, Copy, Debug, Default, Serialize, PartialEq)]
pub struct CpuUsage {
    /// User mode.
    pub user: f64,
    /// User mode at low priority.
    pub nice: f64,
    /// Kernel mode.
    pub system: f64,
    /// Idle.
    pub idle: f64,
    /// Idle waiting for I/O.
    pub io_wait: f64,
    /// Serving interrupts.
    pub irq: f64,
    /// Serving softirqs.
    pub soft_irq: f64,
}

/// One reading of `/proc/stat`: jiffies by kind (user, nice, system, idle, iowait, irq,
/// softirq, steal; steal counts in the total only), all vCPUs and each, and `ctxt`.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct CpuTimes {
    all: [u64; 8],
    per_cpu: BTreeMap<u32, [u64; 8]>,
    context_switches: u64,
}

impl CpuTimes {
    /// Reads `/proc/stat`.
    ///
    /// # Errors
    /// The file cannot be read.
    pub fn read() -> std::io::Result<Self> {
        std::fs::read_to_string("/proc/stat").map(|t| Self::parse(&t))
    }

    /// Parses `/proc/stat`'s text (lines it does not know are skipped).
    pub fn parse(text: &str) -> Self {
        let mut t = Self::default();
        for line in text.lines() {
            let mut words = line.split_whitespace();
            let Some(key) = words.next() else { continue };
            let numbers: Vec<u64> = words.filter_map(|w| w.parse().ok()).collect();
            if key == "ctxt" {
                t.context_switches = numbers.first().copied().unwrap_or(0);
                continue;
            }
            let Some(rest) = key.strip_prefix("cpu") else {
                continue;
            };
            // user and nice include guest and guest_nice (fields 9 and 10): not counted twice.
            let mut v = [0u64; 8];
            for (slot, n) in v.iter_mut().zip(&numbers) {
                *slot = *n;
            }
            if rest.is_empty() {
                t.all = v;
            } else if let Ok(cpu) = rest.parse() {
                t.per_cpu.insert(cpu, v);
            }
        }
        t
    }
}

fn usage(before: &[u64; 8], after: &[u64; 8]) -> CpuUsage {
    // Each kind's growth; a counter that went back (a tickless CPU's idle or iowait is
    // computed on the fly and may) grew by 0. The total is the sum of the growths, so the
    // kinds never add up to more than 100 %.
    let d = |i: usize| after[i].saturating_sub(before[i]) as f64;
    let total: f64 = (0..8).map(d).sum();
    let pct = |i: usize| {
        if total > 0.0 {
            100.0 * d(i) / total
        } else {
            0.0
        }
    };
    CpuUsage {
        user: pct(0),
        nice: pct(1),
        system: pct(2),
        idle: pct(3),
        io_wait: pct(4),
        irq: pct(5),
        soft_irq: pct(6),
    }
}

/// The CPU use between two readings of `/proc/stat` (`after` an error: that error).
pub fn vcpu_usage(period: f64, before: &CpuTimes, after: &std::io::Result<CpuTimes>) -> VcpuUsage {
    let after = match after {
        Ok(a) => a,
        Err(e) => {
            return VcpuUsage {
                period,
                error: format!("reading /proc/stat: {e}"),
                ..VcpuUsage::default()
            };
        }
    };
    VcpuUsage {
        period,
        error: String::new(),
        average_usage: usage(&before.all, &after.all),
        usage_data: after
            .per_cpu
            .iter()
            .map(|(cpu, a)| {
                let b = before.per_cpu.get(cpu).copied().unwrap_or_default();
                (cpu.to_string(), usage(&b, a))
            })
            .collect(),
        context_switch_count: after
            .context_switches
            .saturating_sub(before.context_switches),
    }
}

/// `neuron_hw_counters`: simdev's counters since it started, per device and NC.
#[derive(Clone, Debug, Serialize)]
pub struct HwCounters {
    /// Seconds since the previous reading.
    pub period: f64,
    /// "" or why there are no counters (no simdev reachable).
    pub error: String,
    /// One entry per device (empty without a simdev).
    pub neuron_devices: Vec<HwDevice>,
}

/// One device's counters.
#[derive(Clone, Debug, Serialize)]
pub struct HwDevice {
    /// The device's index.
    pub neuron_device_index: u32,
    /// By physical NC index: every simdev counter by name (executions, exec_errors,
    /// dma_bytes, doorbells, notifications, ...).
    pub neuroncores: BTreeMap<String, BTreeMap<&'static str, u64>>,
}

/// `memory_info`.
#[derive(Clone, Debug, Default, Serialize)]
pub struct MemoryInfo {
    /// Seconds since the previous reading.
    pub period: f64,
    /// "" or why `/proc/meminfo` could not be read.
    pub error: String,
    /// Host memory, bytes.
    pub memory_total_bytes: u64,
    /// In use (total - available), bytes.
    pub memory_used_bytes: u64,
    /// Swap, bytes.
    pub swap_total_bytes: u64,
    /// Swap in use, bytes.
    pub swap_used_bytes: u64,
}

/// `instance_info`.
#[derive(Clone, Debug, Serialize)]
pub struct InstanceInfo {
    /// The instance's name ("").
    pub instance_name: String,
    /// Its id ("").
    pub instance_id: String,
    /// Its type ("").
    pub instance_type: String,
    /// Its availability zone ("").
    pub instance_availability_zone: String,
    /// Its region ("").
    pub instance_region: String,
    /// Why these are empty.
    pub error: String,
}

/// `neuron_hardware_info`.
#[derive(Clone, Debug, Serialize)]
pub struct HardwareInfo {
    /// The device type (the architecture's name, e.g. `trn2`; "" when unknown).
    pub neuron_device_type: String,
    /// Devices (1 with a simdev reachable, else 0).
    pub neuron_device_count: u32,
    /// Logical cores per device.
    pub neuroncore_per_device_count: u32,
    /// NCs per logical core.
    pub logical_neuroncore_config: u32,
    /// Device memory per device, bytes.
    pub neuron_device_memory_size: u64,
    /// "" or why the figures are unknown.
    pub error: String,
}

/// Host memory from `/proc/meminfo`.
pub fn memory_info(period: f64) -> MemoryInfo {
    let text = match std::fs::read_to_string("/proc/meminfo") {
        Ok(t) => t,
        Err(e) => {
            return MemoryInfo {
                period,
                error: format!("reading /proc/meminfo: {e}"),
                ..MemoryInfo::default()
            };
        }
    };
    let field = |name: &str| -> u64 {
        text.lines()
            .find_map(|l| l.strip_prefix(name)?.strip_prefix(':'))
            .and_then(|v| v.split_whitespace().next()?.parse::<u64>().ok())
            .unwrap_or(0)
            .saturating_mul(1024)
    };
    let total = field("MemTotal");
    let swap = field("SwapTotal");
    MemoryInfo {
        period,
        error: String::new(),
        memory_total_bytes: total,
        memory_used_bytes: total.saturating_sub(field("MemAvailable")),
        swap_total_bytes: swap,
        swap_used_bytes: swap.saturating_sub(field("SwapFree")),
    }
}

fn runtime_data(p: &ProcessFigures) -> RuntimeData {
    let period = p.period.as_secs_f64();
    let error = if p.stale && !p.period.is_zero() {
        format!(
            "stale datastore: process {} ended without nrt_close; the period's figures are its \
             last executions, reported once",
            p.pid
        )
    } else if p.stale {
        format!(
            "stale datastore: process {} is gone; its last counts are not live figures",
            p.pid
        )
    } else {
        String::new()
    };
    let neuroncores_in_use = p
        .cores
        .iter()
        .map(|c| {
            (
                c.logical_id.to_string(),
                NeuroncoreInUse {
                    neuroncore_utilization: c.utilization_pct,
                    flops: 0,
                },
            )
        })
        .collect();
    let neuroncore_memory_usage = p
        .cores
        .iter()
        .map(|c| (c.logical_id.to_string(), CoreMemory::from(c.memory)))
        .collect();
    let logical_of = |vnc: u32| {
        p.cores
            .iter()
            .find(|c| c.vnc == vnc)
            .map_or(vnc, |c| c.logical_id)
    };
    let loaded_models = p
        .models
        .iter()
        .filter(|m| m.loaded)
        .map(|m| {
            let bytes = MemoryBytes {
                host: 0,
                neuron_device: m.memory_bytes,
            };
            LoadedModel {
                name: m.name.clone(),
                uuid: m.uuid_hex(),
                model_id: m.id,
                is_running: m.loaded,
                memory_used_bytes: bytes,
                subgraphs: BTreeMap::from([(
                    "sg00".to_string(),
                    Subgraph {
                        memory_used_bytes: bytes,
                        neuroncore_index: logical_of(m.vnc),
                        neuron_device_index: 0,
                    },
                )]),
            }
        })
        .collect();
    RuntimeData {
        pid: p.pid,
        address: String::new(),
        neuron_runtime_tag: p.command.clone(),
        error: error.clone(),
        report: RuntimeReport {
            neuroncore_counters: NeuroncoreCounters {
                period,
                error: error.clone(),
                neuroncores_in_use,
            },
            execution_stats: ExecutionStats {
                period,
                error: error.clone(),
                error_summary: p.error_summary,
                execution_summary: p.execution_summary,
                latency_stats: LatencyStats {
                    total_latency: Percentiles::of(&p.total_latency),
                    device_latency: Percentiles::of(&p.device_latency),
                },
            },
            memory_used: MemoryUsed {
                period,
                error,
                neuron_runtime_used_bytes: RuntimeUsedBytes {
                    host: 0,
                    neuron_device: p.device_bytes(),
                    usage_breakdown: UsageBreakdown {
                        host: HostUsage::default(),
                        neuroncore_memory_usage,
                    },
                },
                loaded_models,
            },
        },
    }
}

/// The document of one period.
pub fn document(
    fig: &Figures,
    hw: &HwSample,
    vcpu: VcpuUsage,
    memory: MemoryInfo,
) -> MonitorDocument {
    let period = fig.period.as_secs_f64();
    // The live runtimes' LNC; with none, what a runtime started now would use (as `nrt ls`).
    let lnc = fig
        .live()
        .map(|p| p.lnc)
        .max()
        .or(hw.device.as_ref().map(|d| d.lnc))
        .unwrap_or(1)
        .max(1);
    let neuron_devices = if hw.ncs.is_empty() {
        Vec::new()
    } else {
        vec![HwDevice {
            neuron_device_index: 0,
            neuroncores: hw
                .ncs
                .iter()
                .map(|(nc, c)| (nc.to_string(), c.to_map()))
                .collect(),
        }]
    };
    let neuron_hardware_info = match &hw.device {
        Some(d) => HardwareInfo {
            neuron_device_type: d.arch.to_string(),
            neuron_device_count: 1,
            neuroncore_per_device_count: d.nc_count / lnc,
            logical_neuroncore_config: lnc,
            neuron_device_memory_size: d.hbm_bytes_per_nc.saturating_mul(u64::from(d.nc_count)),
            error: String::new(),
        },
        None => HardwareInfo {
            neuron_device_type: String::new(),
            neuron_device_count: 0,
            neuroncore_per_device_count: 0,
            logical_neuroncore_config: lnc,
            neuron_device_memory_size: 0,
            error: format!("device unknown: {}", hw.error),
        },
    };
    MonitorDocument {
        neuron_runtime_data: fig.processes.iter().map(runtime_data).collect(),
        system_data: SystemData {
            neuron_hw_counters: HwCounters {
                period,
                error: hw.error.clone(),
                neuron_devices,
            },
            vcpu_usage: vcpu,
            memory_info: memory,
        },
        instance_info: InstanceInfo {
            instance_name: String::new(),
            instance_id: String::new(),
            instance_type: String::new(),
            instance_availability_zone: String::new(),
            instance_region: String::new(),
            error: "no EC2 instance metadata read: the device is simdev".into(),
        },
        neuron_hardware_info,
    }
}
