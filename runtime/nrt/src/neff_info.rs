//! `nrt neff info FILE [--json]`: what a NEFF holds and what loading it needs, read with the
//! `neff` crate without a device.
//!
//! The report: the header (versions, lnc_size, num_tpb, feature bits, the hash verdict this
//! tool computes whatever `NEURON_RT_VALIDATE_HASH` says, name, uuid, compiler version,
//! target), the I/O tensors, and per subgraph its constants, variable bytes by kind, DMA queue
//! sets, instruction records per engine and the device bytes a load allocates on its NC (I/O
//! excluded: the user binds those). simdev runs NEFFs shape-only, and the report says so.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use clap::Subcommand;
use neff::{DeviceBytes, IoTensor, Neff, ParseOptions};
use serde::Serialize;
use shared::Engine;

/// What simdev does with a NEFF, printed with every report.
pub const SHAPE_ONLY_NOTE: &str = "simdev runs NEFFs shape-only: no instruction semantics; \
     outputs are a documented deterministic function of the inputs \
     (shared::neff_program::shape_only), not the model's numbers — unless simdev has a \
     reference bound to the NEFF (simdev --reference FILE.neff=MODULE.py:FUNCTION or a golden \
     file), which computes real ones";

/// `nrt neff ...`.
#[derive(Subcommand, Debug)]
pub enum NeffCommand {
    /// Describe a NEFF: header, I/O tensors, subgraphs, constants, variable bytes by kind, DMA
    /// queues, instruction records per engine, and the device memory a load needs.
    ///
    /// JSON keys (--json): `file`; `header` {pkg_version, neff_version_major,
    /// neff_version_minor, build_version, lnc_size, num_tpb, requested_tpb_count, feature_bits
    /// (hex string), hash ("valid" or "mismatch", computed by this tool), name, uuid (hex),
    /// tool_version, target}; `inputs` and `outputs` [{name, dtype (NRT_DTYPE_* name),
    /// neff_dtype (numpy-style name), shape, bytes}]; `subgraphs` [{name, records {PE, ACT,
    /// POOL, DVE, SP}, streams [{engine, member, bytes, records}], var_bytes_by_kind {type:
    /// bytes}, vars_by_kind {type: count}, constants [{var, member, dtype, neff_dtype, shape,
    /// bytes, alignment}], dma_queues [{name, type, owner, num_queues, semaphores}],
    /// act_tables [member], dve_tables [member], state_buffer_reservations [{offset,
    /// base_partition, partitions, size}], runtime_event_count, runtime_semaphore_count,
    /// features, device_bytes {constants, scratchpad, tmp_buf, pointer, streams, tables, io,
    /// total}}]; `device_bytes` {per_subgraph [total], total (all subgraphs, I/O excluded),
    /// io (the I/O tensors the user binds, once)}; `execution` (the shape-only note).
    Info {
        /// The NEFF file.
        file: PathBuf,
        /// Print one JSON object instead of text.
        #[arg(long)]
        json: bool,
    },
    /// Run a NEFF on the device the runtime finds (silicon, or simdev) with seeded random
    /// inputs and record every execution's inputs and outputs in a golden file (safetensors,
    /// format `nrt-golden` 1: tensors "{k}/in/{name}" and "{k}/out/{name}"), which simdev can
    /// replay as the NEFF's reference. Tensors above 256 MiB are refused.
    Record {
        /// The NEFF file.
        file: PathBuf,
        /// The golden file to write.
        #[arg(long)]
        out: PathBuf,
        /// Executions to record.
        #[arg(long, default_value_t = 10)]
        executions: u32,
        /// Seed of the inputs (execution k uses seed + k, as `nrt bench --neff` slot k does).
        #[arg(long, default_value_t = 1)]
        seed: u64,
    },
}

/// Runs `nrt neff ...`.
pub fn main(command: NeffCommand) -> ExitCode {
    match command {
        NeffCommand::Record {
            file,
            out,
            executions,
            seed,
        } => match crate::neff_record::record(&file, &out, executions, seed) {
            Ok(r) => {
                println!(
                    "{}: {} executions recorded to {} ({} bytes; outputs from {})",
                    file.display(),
                    r.executions,
                    out.display(),
                    r.bytes,
                    r.source
                );
                ExitCode::SUCCESS
            }
            Err(e) => {
                eprintln!("nrt neff record: {e}");
                ExitCode::FAILURE
            }
        },
        NeffCommand::Info { file, json } => match info(&file) {
            Ok(report) => {
                if json {
                    match serde_json::to_string(&report) {
                        Ok(s) => println!("{s}"),
                        Err(e) => {
                            eprintln!("nrt neff info: {e}");
                            return ExitCode::FAILURE;
                        }
                    }
                } else {
                    print_report(&report);
                }
                ExitCode::SUCCESS
            }
            Err(e) => {
                eprintln!("nrt neff info: {}: {e}", file.display());
                ExitCode::FAILURE
            }
        },
    }
}

#[derive(Serialize, Debug)]
struct Report {
    file: String,
    header: HeaderReport,
    inputs: Vec<TensorReport>,
    outputs: Vec<TensorReport>,
    subgraphs: Vec<SubgraphReport>,
    device_bytes: TotalReport,
    execution: &'static str,
}

#[derive(Serialize, Debug)]
struct HeaderReport {
    pkg_version: u64,
    neff_version_major: u64,
    neff_version_minor: u64,
    build_version: String,
    lnc_size: u32,
    num_tpb: u32,
    requested_tpb_count: u32,
    feature_bits: String,
    hash: &'static str,
    name: String,
    uuid: String,
    tool_version: String,
    target: String,
}

#[derive(Serialize, Debug)]
struct TensorReport {
    name: String,
    dtype: &'static str,
    neff_dtype: &'static str,
    shape: Vec<u64>,
    bytes: u64,
}

#[derive(Serialize, Debug)]
struct StreamReport {
    engine: &'static str,
    member: String,
    bytes: u64,
    records: u64,
}

#[derive(Serialize, Debug)]
struct ConstantReport {
    var: String,
    member: String,
    dtype: &'static str,
    neff_dtype: &'static str,
    shape: Vec<u64>,
    bytes: u64,
    alignment: u64,
}

#[derive(Serialize, Debug)]
struct QueueReport {
    name: String,
    #[serde(rename = "type")]
    kind: String,
    owner: String,
    num_queues: u32,
    semaphores: Vec<u32>,
}

#[derive(Serialize, Debug)]
struct ReservationReport {
    offset: u64,
    base_partition: u32,
    partitions: u32,
    size: u64,
}

#[derive(Serialize, Debug)]
struct BytesReport {
    #[serde(flatten)]
    bytes: DeviceBytes,
    total: u64,
}

#[derive(Serialize, Debug)]
struct SubgraphReport {
    name: String,
    records: BTreeMap<&'static str, u64>,
    streams: Vec<StreamReport>,
    var_bytes_by_kind: BTreeMap<&'static str, u64>,
    vars_by_kind: BTreeMap<&'static str, u64>,
    constants: Vec<ConstantReport>,
    dma_queues: Vec<QueueReport>,
    act_tables: Vec<String>,
    dve_tables: Vec<String>,
    state_buffer_reservations: Vec<ReservationReport>,
    runtime_event_count: u32,
    runtime_semaphore_count: u32,
    features: Vec<String>,
    device_bytes: BytesReport,
}

#[derive(Serialize, Debug)]
struct TotalReport {
    per_subgraph: Vec<u64>,
    total: u64,
    io: u64,
}

fn tensor(t: &IoTensor) -> TensorReport {
    TensorReport {
        name: t.name.clone(),
        dtype: t.dtype.nrt_name(),
        neff_dtype: t.dtype.neff_name(),
        shape: t.shape.clone(),
        bytes: t.size,
    }
}

fn info(path: &Path) -> Result<Report, String> {
    let bytes = std::fs::read(path).map_err(|e| e.to_string())?;
    let neff = Neff::parse(&bytes, &ParseOptions::default()).map_err(|e| e.to_string())?;
    let h = &neff.header;
    let header = HeaderReport {
        pkg_version: h.pkg_version,
        neff_version_major: h.neff_version_major,
        neff_version_minor: h.neff_version_minor,
        build_version: h.build_version(),
        lnc_size: h.lnc_size,
        num_tpb: h.num_tpb,
        requested_tpb_count: h.requested_tpb_count,
        feature_bits: format!("{:#x}", h.feature_bits),
        hash: if neff::hash_matches(&bytes) {
            "valid"
        } else {
            "mismatch"
        },
        name: neff.name(),
        uuid: neff.uuid_hex(),
        tool_version: neff.tool_version.clone(),
        target: neff.target.clone(),
    };
    let subgraphs: Vec<SubgraphReport> = neff.subgraphs.iter().map(subgraph).collect();
    let total = neff.device_bytes();
    Ok(Report {
        file: path.display().to_string(),
        header,
        inputs: neff.inputs.iter().map(tensor).collect(),
        outputs: neff.outputs.iter().map(tensor).collect(),
        device_bytes: TotalReport {
            per_subgraph: subgraphs.iter().map(|s| s.device_bytes.total).collect(),
            total: total.total(),
            io: total.io,
        },
        subgraphs,
        execution: SHAPE_ONLY_NOTE,
    })
}

fn subgraph(sg: &neff::Subgraph) -> SubgraphReport {
    let mut var_bytes_by_kind = BTreeMap::new();
    let mut vars_by_kind = BTreeMap::new();
    for var in sg.vars.values() {
        let kind = var.kind.type_name();
        *var_bytes_by_kind.entry(kind).or_insert(0u64) += var.size;
        *vars_by_kind.entry(kind).or_insert(0u64) += 1;
    }
    let bytes = sg.device_bytes();
    SubgraphReport {
        name: sg.name.clone(),
        records: Engine::ALL
            .iter()
            .zip(&sg.streams)
            .map(|(e, s)| (e.name(), s.records()))
            .collect(),
        streams: Engine::ALL
            .iter()
            .zip(&sg.streams)
            .map(|(e, s)| StreamReport {
                engine: e.name(),
                member: s.member.clone(),
                bytes: s.bytes.len() as u64,
                records: s.records(),
            })
            .collect(),
        var_bytes_by_kind,
        vars_by_kind,
        constants: sg
            .constants
            .iter()
            .map(|c| ConstantReport {
                var: c.var.clone(),
                member: c.member.clone(),
                dtype: c.dtype.nrt_name(),
                neff_dtype: c.dtype.neff_name(),
                shape: c.shape.clone(),
                bytes: c.data.len() as u64,
                alignment: c.alignment,
            })
            .collect(),
        dma_queues: sg
            .dma_queues
            .iter()
            .map(|q| QueueReport {
                name: q.name.clone(),
                kind: q.kind.clone(),
                owner: q.owner.clone(),
                num_queues: q.num_queues,
                semaphores: q.semaphores.clone(),
            })
            .collect(),
        act_tables: sg.act_tables.iter().map(|t| t.member.clone()).collect(),
        dve_tables: sg.dve_tables.iter().map(|t| t.member.clone()).collect(),
        state_buffer_reservations: sg
            .state_buffer_reservations
            .iter()
            .map(|r| ReservationReport {
                offset: r.offset,
                base_partition: r.base_partition,
                partitions: r.partitions,
                size: r.size,
            })
            .collect(),
        runtime_event_count: sg.runtime_event_count,
        runtime_semaphore_count: sg.runtime_semaphore_count,
        features: sg.features.clone(),
        device_bytes: BytesReport {
            total: bytes.total(),
            bytes,
        },
    }
}

/// A semaphore list as ranges ("8-23").
fn ranges(values: &[u32]) -> String {
    let mut out: Vec<String> = Vec::new();
    let mut i = 0;
    while i < values.len() {
        let mut j = i;
        while j + 1 < values.len() && values[j].checked_add(1) == Some(values[j + 1]) {
            j += 1;
        }
        out.push(if i == j {
            values[i].to_string()
        } else {
            format!("{}-{}", values[i], values[j])
        });
        i = j + 1;
    }
    out.join(",")
}

fn print_tensors(label: &str, tensors: &[TensorReport]) {
    for t in tensors {
        println!(
            "  {label:<6} {:<12} {:<18} {:<9} {:<20} {} B",
            t.name,
            t.dtype,
            t.neff_dtype,
            format!("{:?}", t.shape),
            t.bytes
        );
    }
}

fn print_report(r: &Report) {
    let h = &r.header;
    println!("file          {}", r.file);
    println!("name          {}", h.name);
    println!("uuid          {}", h.uuid);
    println!(
        "versions      pkg {}, NEFF {}.{}{}",
        h.pkg_version,
        h.neff_version_major,
        h.neff_version_minor,
        if h.build_version.is_empty() {
            String::new()
        } else {
            format!(" (build {})", h.build_version)
        }
    );
    println!("compiler      {} (target {})", h.tool_version, h.target);
    println!(
        "cores         lnc_size {}, num_tpb {}, requested {}",
        h.lnc_size, h.num_tpb, h.requested_tpb_count
    );
    println!("feature bits  {}", h.feature_bits);
    println!("hash          {} (MD5 of the payload)", h.hash);
    println!("subgraphs     {}", r.subgraphs.len());
    println!();
    println!("I/O tensors (bound by the user per execution):");
    print_tensors("input", &r.inputs);
    print_tensors("output", &r.outputs);
    for sg in &r.subgraphs {
        println!();
        println!("subgraph {}:", sg.name);
        // In engine order, not the map's alphabetical one.
        let records: Vec<String> = sg
            .streams
            .iter()
            .map(|s| format!("{} {}", s.engine, s.records))
            .collect();
        println!(
            "  records     {} (64-byte instruction records; their encoding is not public, simdev does not decode them)",
            records.join(", ")
        );
        let kinds: Vec<String> = sg
            .var_bytes_by_kind
            .iter()
            .map(|(k, b)| format!("{k} {} ({b} B)", sg.vars_by_kind[k]))
            .collect();
        println!("  vars        {}", kinds.join(", "));
        for c in &sg.constants {
            println!(
                "  constant    {} <- {} {} {:?} {} B, align {}",
                c.var, c.member, c.neff_dtype, c.shape, c.bytes, c.alignment
            );
        }
        for q in &sg.dma_queues {
            println!(
                "  dma queue   {} ({}, owner {}, {} queues, semaphores {})",
                q.name,
                q.kind,
                q.owner,
                q.num_queues,
                ranges(&q.semaphores)
            );
        }
        println!(
            "  tables      {} activation, {} DVE",
            sg.act_tables.len(),
            sg.dve_tables.len()
        );
        for s in &sg.state_buffer_reservations {
            println!(
                "  SBUF rsv    offset {}, partitions {}..{}, {} B each",
                s.offset,
                s.base_partition,
                u64::from(s.base_partition) + u64::from(s.partitions),
                s.size
            );
        }
        let b = &sg.device_bytes;
        println!(
            "  device      {} B: constants {}, scratchpad {}, tmp-buf {}, pointer {}, streams {}, tables {}",
            b.total,
            b.bytes.constants,
            b.bytes.scratchpad,
            b.bytes.tmp_buf,
            b.bytes.pointer,
            b.bytes.streams,
            b.bytes.tables
        );
    }
    println!();
    println!(
        "device memory a load needs with this runtime's layout (libnrt's may differ): {} B over {} subgraph(s) ({}), plus {} B of I/O tensors the user binds",
        r.device_bytes.total,
        r.device_bytes.per_subgraph.len(),
        r.device_bytes
            .per_subgraph
            .iter()
            .map(|b| format!("{b} B"))
            .collect::<Vec<_>>()
            .join(" + "),
        r.device_bytes.io
    );
    println!("{}", r.execution);
}

#[cfg(test)]
mod tests {
    use super::ranges;

    #[test]
    fn semaphore_lists_print_as_ranges() {
        assert_eq!(ranges(&[8, 9, 10, 11]), "8-11");
        assert_eq!(ranges(&[1, 3, 4, 7]), "1,3-4,7");
        assert_eq!(ranges(&[]), "");
        assert_eq!(ranges(&[u32::MAX, 0]), format!("{},0", u32::MAX));
    }
}
