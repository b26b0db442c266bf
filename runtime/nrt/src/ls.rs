//! `nrt ls`: the device in neuron-ls's shapes.
//!
//! `--json-output` (alias `--json`) prints neuron-ls's JSON: an array with one object per
//! device — `neuron_device`, `bdf`, `cpu_affinity`, `numa_node`, `connected_to`, `nc_count`,
//! `logical_neuroncore_config`, `memory_size`, `neuroncore_ids`, `neuron_processes` (`pid`,
//! `command`, `neuron_runtime_version`) — with neuron-ls's names and value types, so scripts
//! that parse neuron-ls (Ray sums `nc_count`) work unchanged. One key is ours: `nrt` (the
//! backend and each NC's resources), which neuron-ls parsers ignore.
//!
//! What a simulated device cannot know it says: simdev is not a PCI device, so its `bdf` is
//! `"sim:00.0"` and its `numa_node` `"-1"` (Linux's "no node"); it has no neighbours
//! (`connected_to` is empty). The process list is simdev's clients that hold NCs or memory,
//! known from their sockets' credentials, `/proc/PID/cmdline` and the version each runtime
//! announced. On the neuron backend the process list is not read yet: it is empty and a
//! warning says so.

use serde::Serialize;

use runtime::backend::Device;
use runtime::config::RuntimeConfig;
use shared::protocol::ClientSummary;

/// One process holding the device (neuron-ls's `neuron_processes` entry).
#[derive(Serialize, Debug, Clone, PartialEq, Eq)]
pub struct NeuronProcess {
    /// The process id.
    pub pid: u32,
    /// Its command line.
    pub command: String,
    /// The runtime version it runs ("" when it did not say).
    pub neuron_runtime_version: String,
    /// The logical cores it holds (not in neuron-ls's JSON: the table prints them).
    #[serde(skip)]
    pub neuroncore_ids: Vec<u32>,
}

/// One NC's resources (the `nrt` key).
#[derive(Serialize, Debug)]
pub struct NcResources {
    nc: u32,
    hbm_base: u64,
    hbm_bytes: u64,
    semaphores: u32,
    events: u32,
    dma_engines: u32,
    dma_queues_per_engine: u32,
    dma_queues: u32,
}

/// What neuron-ls does not say and we can: the backend and the NCs' resources.
#[derive(Serialize, Debug)]
pub struct NrtDetails {
    backend: &'static str,
    description: String,
    arch: &'static str,
    arch_version: u32,
    physical_nc_count: u32,
    hbm_bytes_per_nc: u64,
    host_base: u64,
    ncs: Vec<NcResources>,
}

/// One device, as neuron-ls's JSON prints it.
#[derive(Serialize, Debug)]
pub struct NeuronDevice {
    /// The device index.
    pub neuron_device: u32,
    /// PCI bus/device/function (`"sim:00.0"` on simdev).
    pub bdf: String,
    /// CPUs near the device, as a list of ranges (`"0-1"`).
    pub cpu_affinity: String,
    /// The NUMA node, as a string (`"-1"`: none known).
    pub numa_node: String,
    /// Devices this one is connected to.
    pub connected_to: Vec<u32>,
    /// NeuronCores as configured: physical NCs / LNC.
    pub nc_count: u32,
    /// Physical NCs per logical core (1 or 2).
    pub logical_neuroncore_config: u32,
    /// Device memory, bytes.
    pub memory_size: u64,
    /// Global ids of the device's (logical) cores.
    pub neuroncore_ids: Vec<u32>,
    /// Processes holding the device.
    pub neuron_processes: Vec<NeuronProcess>,
    /// Ours: the backend and the NCs' resources.
    pub nrt: NrtDetails,
}

/// Ranges of CPU indexes, as the kernel prints cpu lists: `"0-3,8"`.
pub fn cpu_list(cpus: &[usize]) -> String {
    let mut out = Vec::new();
    let mut i = 0;
    while i < cpus.len() {
        let start = cpus[i];
        let mut end = start;
        while i + 1 < cpus.len() && cpus[i + 1] == end + 1 {
            i += 1;
            end = cpus[i];
        }
        out.push(if start == end {
            start.to_string()
        } else {
            format!("{start}-{end}")
        });
        i += 1;
    }
    out.join(",")
}

/// The CPUs this process may run on (the device's host is this host).
fn own_cpu_affinity() -> String {
    let Ok(set) = nix::sched::sched_getaffinity(nix::unistd::Pid::from_raw(0)) else {
        return String::new();
    };
    let cpus: Vec<usize> = (0..nix::sched::CpuSet::count())
        .filter(|&c| set.is_set(c).unwrap_or(false))
        .collect();
    cpu_list(&cpus)
}

/// The processes of `clients` with their NCs as logical core ids at `lnc`.
pub fn processes(clients: &[ClientSummary], lnc: u32) -> Vec<NeuronProcess> {
    clients
        .iter()
        .map(|c| {
            let mut ids: Vec<u32> = c.ncs.iter().map(|nc| nc / lnc.max(1)).collect();
            ids.dedup();
            NeuronProcess {
                pid: c.pid,
                command: c.command.clone(),
                neuron_runtime_version: c.runtime_version.clone(),
                neuroncore_ids: ids,
            }
        })
        .collect()
}

/// The device as neuron-ls describes it, at the logical-core config `config` gives it (its
/// `NEURON_LOGICAL_NC_CONFIG`, else the device's default: 2 on trn2, 1 elsewhere).
///
/// # Errors
/// An LNC the device's arch does not have (2 off trn2), naming both.
pub fn describe(dev: &dyn Device, config: &RuntimeConfig) -> Result<Vec<NeuronDevice>, String> {
    let info = dev.info();
    let lnc = config.lnc_on(info.arch)?;
    let simulated = dev.backend_name() == "sim";
    let clients = match dev.processes() {
        Ok(list) => list,
        Err(e) => {
            eprintln!(
                "nrt ls: the processes holding the device are not listed: {}",
                crate::error_chain(&e)
            );
            Vec::new()
        }
    };
    let nc_count = info.nc_count / lnc;
    let ncs = (0..info.nc_count)
        .map(|nc| NcResources {
            nc,
            hbm_base: info.hbm_bases.get(nc as usize).copied().unwrap_or_default(),
            hbm_bytes: info.hbm_bytes_per_nc,
            semaphores: info.semaphores_per_nc,
            events: info.events_per_nc,
            dma_engines: info.dma_engines_per_nc,
            dma_queues_per_engine: info.dma_queues_per_engine,
            dma_queues: info.dma_engines_per_nc * info.dma_queues_per_engine,
        })
        .collect();
    Ok(vec![NeuronDevice {
        neuron_device: 0,
        bdf: if simulated { "sim:00.0" } else { "" }.to_owned(),
        cpu_affinity: own_cpu_affinity(),
        numa_node: "-1".to_owned(),
        connected_to: Vec::new(),
        nc_count,
        logical_neuroncore_config: lnc,
        memory_size: info.hbm_bytes_per_nc * u64::from(info.nc_count),
        neuroncore_ids: (0..nc_count).collect(),
        neuron_processes: processes(&clients, lnc),
        nrt: NrtDetails {
            backend: dev.backend_name(),
            description: info.description.clone(),
            arch: info.arch.name(),
            arch_version: info.arch.version(),
            physical_nc_count: info.nc_count,
            hbm_bytes_per_nc: info.hbm_bytes_per_nc,
            host_base: info.host_base,
            ncs,
        },
    }])
}

/// The configuration `nrt ls` reports at: the environment's, as the runtime reads it.
///
/// # Errors
/// A malformed variable (`NEURON_LOGICAL_NC_CONFIG`, ...).
pub fn configured() -> Result<RuntimeConfig, String> {
    RuntimeConfig::from_env().map_err(|e| crate::error_chain(&e))
}

fn human_bytes(bytes: u64) -> String {
    const UNITS: [(&str, u64); 3] = [("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)];
    for (name, size) in UNITS {
        if bytes >= size && bytes.is_multiple_of(size) {
            return format!("{} {name}", bytes / size);
        }
    }
    format!("{bytes} B")
}

/// A text table: a header row and rows, columns padded to their widest cell, framed like
/// neuron-ls's tables.
fn table(header: &[&str], rows: &[Vec<String>]) -> String {
    let mut widths: Vec<usize> = header.iter().map(|h| h.len()).collect();
    for row in rows {
        for (w, cell) in widths.iter_mut().zip(row) {
            *w = (*w).max(cell.len());
        }
    }
    let rule = format!(
        "+{}+\n",
        widths
            .iter()
            .map(|w| "-".repeat(w + 2))
            .collect::<Vec<_>>()
            .join("+")
    );
    let line = |cells: &mut dyn Iterator<Item = &str>| {
        let cells: Vec<String> = cells
            .zip(&widths)
            .map(|(c, w)| format!(" {c:<w$} "))
            .collect();
        format!("|{}|\n", cells.join("|"))
    };
    let mut out = rule.clone();
    out += &line(&mut header.iter().copied());
    out += &rule;
    for row in rows {
        out += &line(&mut row.iter().map(String::as_str));
    }
    out += &rule;
    out
}

/// The same as the JSON, as neuron-ls's tables, then our resource details.
pub fn print(devices: &[NeuronDevice]) {
    let Some(first) = devices.first() else {
        println!("no Neuron device");
        return;
    };
    let simulated = first.nrt.backend == "sim";
    println!(
        "instance-type: {}",
        if simulated {
            format!("simulated {} (simdev)", first.nrt.arch)
        } else {
            "unknown".to_owned()
        }
    );
    println!(
        "instance-id: {}",
        if simulated {
            "none (simdev)"
        } else {
            "unknown"
        }
    );
    println!(
        "logical-neuroncore-config: {}",
        first.logical_neuroncore_config
    );
    let rows: Vec<Vec<String>> = devices
        .iter()
        .map(|d| {
            let ids = match (d.neuroncore_ids.first(), d.neuroncore_ids.last()) {
                (Some(a), Some(b)) if a != b => format!("{a}-{b}"),
                (Some(a), _) => a.to_string(),
                _ => String::new(),
            };
            vec![
                d.neuron_device.to_string(),
                d.nc_count.to_string(),
                ids,
                human_bytes(d.memory_size),
                d.connected_to
                    .iter()
                    .map(u32::to_string)
                    .collect::<Vec<_>>()
                    .join(", "),
                d.bdf.clone(),
                d.cpu_affinity.clone(),
                d.numa_node.clone(),
            ]
        })
        .collect();
    print!(
        "{}",
        table(
            &[
                "NEURON DEVICE",
                "NEURON CORES",
                "NEURON CORE IDS",
                "NEURON MEMORY",
                "CONNECTED DEVICES",
                "PCI BDF",
                "CPU AFFINITY",
                "NUMA NODE",
            ],
            &rows,
        )
    );
    let procs: Vec<Vec<String>> = devices
        .iter()
        .flat_map(|d| {
            d.neuron_processes.iter().map(move |p| {
                vec![
                    d.neuron_device.to_string(),
                    p.neuroncore_ids
                        .iter()
                        .map(u32::to_string)
                        .collect::<Vec<_>>()
                        .join(", "),
                    p.pid.to_string(),
                    p.command.clone(),
                    p.neuron_runtime_version.clone(),
                ]
            })
        })
        .collect();
    if !procs.is_empty() {
        print!(
            "{}",
            table(
                &[
                    "NEURON DEVICE",
                    "NEURON CORES",
                    "PID",
                    "COMMAND",
                    "RUNTIME VERSION"
                ],
                &procs,
            )
        );
    }
    for d in devices {
        let n = &d.nrt;
        println!();
        println!(
            "device {}: backend {} ({})",
            d.neuron_device, n.backend, n.description
        );
        println!(
            "arch {} (V{}), {} physical NCs, HBM {} per NC",
            n.arch,
            n.arch_version,
            n.physical_nc_count,
            human_bytes(n.hbm_bytes_per_nc)
        );
        let rows: Vec<Vec<String>> = n
            .ncs
            .iter()
            .map(|nc| {
                vec![
                    nc.nc.to_string(),
                    format!("{:#x}", nc.hbm_base),
                    human_bytes(nc.hbm_bytes),
                    nc.semaphores.to_string(),
                    nc.events.to_string(),
                    format!(
                        "{} ({}x{})",
                        nc.dma_queues, nc.dma_engines, nc.dma_queues_per_engine
                    ),
                ]
            })
            .collect();
        print!(
            "{}",
            table(
                &[
                    "NC",
                    "HBM BASE",
                    "HBM",
                    "SEMAPHORES",
                    "EVENTS",
                    "DMA QUEUES"
                ],
                &rows,
            )
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu_lists_fold_runs_into_ranges() {
        assert_eq!(cpu_list(&[]), "");
        assert_eq!(cpu_list(&[0]), "0");
        assert_eq!(cpu_list(&[0, 1, 2, 3, 8, 10, 11]), "0-3,8,10-11");
    }

    #[test]
    fn processes_name_logical_cores_at_lnc_2() {
        let c = ClientSummary {
            pid: 7,
            command: "python3 train.py".into(),
            runtime_version: "2.0.0.0".into(),
            ncs: vec![2, 3, 6, 7],
            memory_bytes: 0,
        };
        let p = processes(std::slice::from_ref(&c), 2);
        assert_eq!(p[0].neuroncore_ids, vec![1, 3]);
        assert_eq!(processes(&[c], 1)[0].neuroncore_ids, vec![2, 3, 6, 7]);
    }

    #[test]
    fn tables_pad_columns_to_the_widest_cell() {
        let t = table(&["A", "LONG"], &[vec!["xyz".into(), "1".into()]]);
        assert_eq!(
            t,
            "+-----+------+\n| A   | LONG |\n+-----+------+\n| xyz | 1    |\n+-----+------+\n"
        );
    }
}
