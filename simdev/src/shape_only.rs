//! A NEFF program run **shape-only** (DESIGN §6 "NEFF models"; the contract is
//! [`shared::neff_program`]).
//!
//! The NeuronCore instruction encoding inside a NEFF is not public, so no instruction runs.
//! One run, given the five stream addresses of the request:
//!
//! 1. **Header.** The [`NeffProgramHeader`] in the 128 bytes before the PE stream is read from
//!    the client's memory (OOB|GENERIC when those bytes are not inside one chunk of the
//!    client, as for an instruction fetch) and checked: magic, version, subgraph index below
//!    the subgraph count, at least one DGE copy, at most [`MAX_DGE_ENTRIES`] entries, zero
//!    `flags`, `reserved` and `reserved2` (GENERIC naming the field otherwise).
//! 2. **Streams.** Each engine's stream (`records` · 64 bytes at its address) must lie inside
//!    one chunk of the client (OOB|GENERIC otherwise); its records are charged as
//!    instructions ([`Host::stream`]: the latency model, one trace span per engine).
//! 3. **DGE table.** Copy [`NeffProgramHeader::dge_copy_pa`]`(compute_idx)` is read (OOB when
//!    outside the client's memory). Every entry is checked before anything is read or
//!    written: kind input or output (GENERIC naming the entry otherwise), a non-zero size,
//!    and `[pa, pa + size)` inside one chunk of the client, the same check as any DMA
//!    descriptor's address (OOB|GENERIC naming the entry otherwise). So a bad table writes
//!    nothing.
//! 4. **Inputs.** The [`shape_only::Seed`] absorbs each input in table order, reading only its
//!    first and last [`shape_only::EDGE_BYTES`]: a 4 GiB input costs 8 KiB of reads.
//! 5. **Outputs.** Output `j` (in table order) gets this subgraph's
//!    [`shape_only::share`] written with [`shape_only::fill`] (compiled for the widest vector
//!    unit this CPU has: [`crate::compute::shape_only_fill`]), in pieces of at most
//!    [`WRITE_PIECE`] bytes through the chunk's bounds-checked accessor.
//!
//! **Reference-backed runs** ([`crate::reference`]): when the header's `neff_uuid` and
//! `neff_hash` name a NEFF bound to a reference, steps 1 to 3 run as above (the streams'
//! trace spans name the reference instead of "shape-only"), then, on subgraph 0 only, the
//! table's inputs and outputs are matched to the binding's declared I/O (same count, same
//! sizes, GENERIC naming the difference otherwise) and the reference computes whole outputs
//! in place (its failure is GENERIC with its message); other subgraphs write nothing (their
//! share of each output is covered by subgraph 0). Steps 4 and 5 do not run.
//!
//! The bytes read and written count as DMA bytes ([`Host::moved`]). Between entries and
//! between pieces the run asks [`Host::live`], so an NC reset, release or reclaim abandons it
//! as it abandons an ISA program between steps.

use std::sync::Arc;

use shared::exec_request::Engine;
use shared::neff_program::{
    DGE_ENTRY_SIZE, DGE_KIND_INPUT, DGE_KIND_OUTPUT, DgeEntry, NEFF_PROGRAM_HEADER_SIZE,
    NEFF_PROGRAM_MAGIC, NEFF_PROGRAM_VERSION, NEFF_RECORD_SIZE, NeffProgramHeader, shape_only,
};
use shared::notification::error_flags;

use crate::engines::{Stats, Stop};
use crate::memory::Chunk;
use crate::reference::{Binding, BoundTensor, Declared};

/// Most entries one copy of a DGE table may have (a hostile header cannot make simdev read
/// gigabytes of table).
pub const MAX_DGE_ENTRIES: u32 = 1 << 16;

/// Bytes of output written per accessor call: each piece is filled in a buffer and then
/// copied into the output, and a piece this small is still in the first-level cache when it
/// is copied. With pieces of 1 MiB the copy read the piece back from further out:
/// `matmul_large` shape-only against a 16 MiB memset was 3.6x to 4.9x, with 32 KiB 3.5x
/// (`cargo bench -p tests --bench simdev_speed -- --only 6`, alternating runs).
pub const WRITE_PIECE: usize = 1 << 15;

/// The device as one shape-only run sees it.
pub trait Host {
    /// The chunk of the execution's client that holds all of `pa..pa+len`, or `None` (outside
    /// memory, straddling chunks, or another client's).
    fn resolve(&mut self, pa: u64, len: u64) -> Option<Arc<Chunk>>;

    /// The execution's `compute_idx` (selects the DGE table copy).
    fn compute_idx(&self) -> u32;

    /// Whether the execution may go on.
    ///
    /// # Errors
    /// [`Stop::Abandoned`] when the NC was reset, released or reclaimed, or the device is
    /// going away.
    fn live(&mut self) -> Result<(), Stop>;

    /// `engine`'s stream of `records` 64-byte records at `pa` was checked: charge it.
    /// `reference` is the label of the reference that computes the outputs, `None` when the
    /// run is shape-only.
    fn stream(&mut self, engine: Engine, pa: u64, records: u32, reference: Option<&Arc<str>>);

    /// The reference bound to the NEFF with header `uuid` and `hash` (the program header's
    /// `neff_uuid` and `neff_hash`), if any.
    fn reference(&mut self, uuid: &[u8; 16], hash: &[u8; 16]) -> Option<Arc<Binding>>;

    /// Runs `binding`'s reference on `tensors`.
    ///
    /// # Errors
    /// The reference's message.
    fn run_reference(&mut self, binding: &Binding, tensors: &[BoundTensor]) -> Result<(), String>;

    /// `bytes` were read from or written to the client's memory.
    fn moved(&mut self, bytes: u64);
}

/// An access outside the client's memory.
fn oob(what: String) -> Stop {
    Stop::failed(
        error_flags::OOB | error_flags::GENERIC,
        format!("{what}, which is not inside one chunk of the NC's owner"),
    )
}

/// Reads and checks the program header before the PE stream at `pe`.
fn header(pe: u64, host: &mut impl Host) -> Result<NeffProgramHeader, Stop> {
    let at = pe.checked_sub(NEFF_PROGRAM_HEADER_SIZE).ok_or_else(|| {
        oob(format!(
            "the NEFF program header before the PE stream at {pe:#x} starts below address 0"
        ))
    })?;
    let what = || {
        format!(
            "the NEFF program header at {at:#x} ({NEFF_PROGRAM_HEADER_SIZE} bytes before the PE \
             stream)"
        )
    };
    let chunk = host
        .resolve(at, NEFF_PROGRAM_HEADER_SIZE)
        .ok_or_else(|| oob(what()))?;
    let h: NeffProgramHeader = chunk.memory().read_obj(at).map_err(|_| oob(what()))?;
    let bad = |field: &str, why: String| {
        Stop::generic(format!(
            "{}: field {field} {why}; not a NEFF program header",
            what()
        ))
    };
    if h.magic != NEFF_PROGRAM_MAGIC {
        return Err(bad(
            "magic",
            format!(
                "is {:?}, not {:?}",
                String::from_utf8_lossy(&h.magic),
                String::from_utf8_lossy(&NEFF_PROGRAM_MAGIC)
            ),
        ));
    }
    if h.version != NEFF_PROGRAM_VERSION {
        return Err(bad(
            "version",
            format!("is {}, simdev reads {NEFF_PROGRAM_VERSION}", h.version),
        ));
    }
    if h.subgraph >= h.subgraph_count {
        return Err(bad(
            "subgraph",
            format!(
                "is {}, not below subgraph_count {}",
                h.subgraph, h.subgraph_count
            ),
        ));
    }
    if h.dge_copies == 0 {
        return Err(bad("dge_copies", "is 0 (at least 1)".to_owned()));
    }
    if h.dge_entries > MAX_DGE_ENTRIES {
        return Err(bad(
            "dge_entries",
            format!("is {}, more than {MAX_DGE_ENTRIES}", h.dge_entries),
        ));
    }
    if h.flags != 0 {
        return Err(bad("flags", format!("is {:#x}, not 0", h.flags)));
    }
    if h.reserved != 0 {
        return Err(bad("reserved", format!("is {:#x}, not 0", h.reserved)));
    }
    if h.reserved2 != [0; 4] {
        return Err(bad("reserved2", format!("is {:x?}, not 0", h.reserved2)));
    }
    Ok(h)
}

/// One checked DGE entry with the chunk that holds it.
struct Bound {
    entry: DgeEntry,
    chunk: Arc<Chunk>,
}

/// Reads copy `compute_idx % dge_copies` of the DGE table and checks every entry.
fn dge_table(h: &NeffProgramHeader, host: &mut impl Host) -> Result<Vec<Bound>, Stop> {
    let compute_idx = host.compute_idx();
    let at = h.dge_copy_pa(compute_idx).ok_or_else(|| {
        Stop::generic(format!(
            "NEFF program header: DGE table copy {} of {} at dge_table_pa {:#x} overflows the \
             address space",
            compute_idx % h.dge_copies.max(1),
            h.dge_copies,
            h.dge_table_pa
        ))
    })?;
    let copy = compute_idx % h.dge_copies;
    let bytes = u64::from(h.dge_entries) * DGE_ENTRY_SIZE;
    let what = || {
        format!(
            "DGE table copy {copy} ({} entries) at {at:#x} for execution {compute_idx}",
            h.dge_entries
        )
    };
    let mut bound = Vec::new();
    if h.dge_entries == 0 {
        return Ok(bound);
    }
    let table = host.resolve(at, bytes).ok_or_else(|| oob(what()))?;
    for i in 0..u64::from(h.dge_entries) {
        host.live()?;
        let pa = at + i * DGE_ENTRY_SIZE;
        let entry: DgeEntry = table.memory().read_obj(pa).map_err(|_| oob(what()))?;
        let name = || {
            format!(
                "DGE entry {i} (var_id {}, kind {}, {} bytes at {:#x}) of {}",
                entry.var_id,
                entry.kind,
                entry.size,
                entry.pa,
                what()
            )
        };
        if entry.kind != DGE_KIND_INPUT && entry.kind != DGE_KIND_OUTPUT {
            return Err(Stop::generic(format!(
                "{}: kind {} is neither input ({DGE_KIND_INPUT}) nor output ({DGE_KIND_OUTPUT})",
                name(),
                entry.kind
            )));
        }
        if entry.size == 0 {
            return Err(Stop::generic(format!("{}: a tensor of 0 bytes", name())));
        }
        let chunk = host
            .resolve(entry.pa, entry.size)
            .ok_or_else(|| oob(name()))?;
        bound.push(Bound { entry, chunk });
    }
    host.moved(bytes);
    Ok(bound)
}

/// Matches the checked table's inputs and outputs (in table order) to `binding`'s declared
/// I/O (in DGE order).
fn bind(binding: &Binding, table: &[Bound]) -> Result<Vec<BoundTensor>, Stop> {
    let mut tensors = Vec::with_capacity(table.len());
    for (input, declared) in [(true, &binding.inputs), (false, &binding.outputs)] {
        let kind = if input {
            DGE_KIND_INPUT
        } else {
            DGE_KIND_OUTPUT
        };
        let what = if input { "inputs" } else { "outputs" };
        let entries: Vec<&Bound> = table.iter().filter(|b| b.entry.kind == kind).collect();
        if entries.len() != declared.len() {
            return Err(Stop::generic(format!(
                "reference {}: the DGE table has {} {what}, the bound NEFF {} ({}) declares {}",
                binding.label,
                entries.len(),
                binding.name,
                binding.neff_path.display(),
                declared.len()
            )));
        }
        for (Bound { entry, chunk }, d) in entries.into_iter().zip(declared.iter()) {
            let Declared {
                name,
                dtype,
                shape,
                size,
            } = d;
            if entry.size != *size {
                return Err(Stop::generic(format!(
                    "reference {}: DGE entry var_id {} is {} bytes, the bound NEFF's {name:?} \
                     is {size}",
                    binding.label, entry.var_id, entry.size
                )));
            }
            tensors.push(BoundTensor {
                name: name.clone(),
                dtype: *dtype,
                shape: shape.clone(),
                input,
                chunk: chunk.clone(),
                offset: entry.pa - chunk.pa(),
                size: *size,
            });
        }
    }
    Ok(tensors)
}

/// Runs the NEFF program whose streams start at `addresses` (in [`Engine::ALL`] order)
/// shape-only (see the module doc); its stats count each engine's records as instructions.
///
/// # Errors
/// The [`Stop`] that ended it: OOB|GENERIC for the header, a stream or a DGE entry outside the
/// client's memory, GENERIC for an inconsistent header or entry, or the execution abandoned.
pub fn run(addresses: [u64; 5], host: &mut impl Host) -> Result<Stats, Stop> {
    let pe = addresses[Engine::Pe.index()];
    let h = header(pe, host)?;
    let mut stats = Stats::default();
    for engine in Engine::ALL {
        let (pa, records) = (addresses[engine.index()], h.records[engine.index()]);
        if records > 0 {
            let len = u64::from(records) * NEFF_RECORD_SIZE;
            host.resolve(pa, len).ok_or_else(|| {
                oob(format!(
                    "the {} stream ({records} records, {len} bytes at {pa:#x})",
                    engine.name()
                ))
            })?;
        }
        stats.instructions[engine.index()] = records;
    }
    let binding = host.reference(&h.neff_uuid, &h.neff_hash);
    let label = binding.as_ref().map(|b| b.label.clone());
    for engine in Engine::ALL {
        let (pa, records) = (addresses[engine.index()], h.records[engine.index()]);
        host.stream(engine, pa, records, label.as_ref());
    }
    let table = dge_table(&h, host)?;
    if let Some(binding) = binding {
        if h.subgraph == 0 {
            let tensors = bind(&binding, &table)?;
            host.live()?;
            host.run_reference(&binding, &tensors)
                .map_err(Stop::generic)?;
            host.moved(tensors.iter().map(|t| t.size).sum());
            // A NaN or an infinity in an output is a numerical error, as an engine's is.
            for t in tensors.iter().filter(|t| !t.input) {
                if t.has_non_finite().map_err(Stop::generic)? {
                    stats.non_finite += 1;
                }
            }
        }
        return Ok(stats);
    }
    let mut seed = shape_only::Seed::default();
    for Bound { entry, chunk } in table.iter().filter(|b| b.entry.kind == DGE_KIND_INPUT) {
        host.live()?;
        let n = usize::try_from(entry.size.min(shape_only::EDGE_BYTES as u64))
            .unwrap_or(shape_only::EDGE_BYTES);
        let mut head = vec![0; n];
        let mut tail = vec![0; n];
        let read = |pa: u64, buf: &mut [u8]| {
            chunk.memory().read(pa, buf).map_err(|e| {
                oob(format!(
                    "input var_id {} ({} bytes at {:#x}): {e}",
                    entry.var_id, entry.size, entry.pa
                ))
            })
        };
        read(entry.pa, &mut head)?;
        read(entry.pa + entry.size - n as u64, &mut tail)?;
        seed.input(entry.size, &head, &tail);
        host.moved(2 * n as u64);
    }
    let mut piece = Vec::new();
    let outputs = table.iter().filter(|b| b.entry.kind == DGE_KIND_OUTPUT);
    for (j, Bound { entry, chunk }) in (0u32..).zip(outputs) {
        let stream = seed.output_stream(j);
        let share = shape_only::share(
            entry.size,
            u32::from(h.subgraph),
            u32::from(h.subgraph_count),
        );
        let mut offset = share.start;
        while offset < share.end {
            host.live()?;
            let n = usize::try_from(share.end - offset)
                .unwrap_or(WRITE_PIECE)
                .min(WRITE_PIECE);
            piece.resize(n, 0);
            crate::compute::shape_only_fill(stream, offset, &mut piece);
            chunk
                .memory()
                .write(entry.pa + offset, &piece)
                .map_err(|e| {
                    oob(format!(
                        "output var_id {} ({} bytes at {:#x}): {e}",
                        entry.var_id, entry.size, entry.pa
                    ))
                })?;
            host.moved(n as u64);
            offset += n as u64;
        }
    }
    Ok(stats)
}

#[cfg(test)]
mod tests {
    use super::*;
    use shared::address_map::{AddressMap, Arch};
    use zerocopy::IntoBytes;

    use crate::client::ClientId;
    use crate::memory::{AddressSpace, Region};

    const A: ClientId = ClientId(1);
    const MIB: u64 = 1 << 20;

    /// The device as a shape-only run sees it, with a budget of [`Host::live`] answers.
    struct Fake {
        space: AddressSpace,
        lives: usize,
        streams: Vec<(Engine, u32)>,
        moved: u64,
    }

    impl Host for Fake {
        fn resolve(&mut self, pa: u64, len: u64) -> Option<Arc<Chunk>> {
            self.space.resolve(A, pa, usize::try_from(len).ok()?).ok()
        }
        fn compute_idx(&self) -> u32 {
            0
        }
        fn live(&mut self) -> Result<(), Stop> {
            self.lives = self.lives.checked_sub(1).ok_or(Stop::Abandoned)?;
            Ok(())
        }
        fn stream(&mut self, engine: Engine, _pa: u64, records: u32, _: Option<&Arc<str>>) {
            self.streams.push((engine, records));
        }
        fn reference(&mut self, _: &[u8; 16], _: &[u8; 16]) -> Option<Arc<Binding>> {
            None
        }
        fn run_reference(&mut self, _: &Binding, _: &[BoundTensor]) -> Result<(), String> {
            Ok(())
        }
        fn moved(&mut self, bytes: u64) {
            self.moved += bytes;
        }
    }

    #[test]
    fn an_abandoned_run_stops_between_output_pieces() {
        let mut space = AddressSpace::new(AddressMap {
            arch: Arch::Trn1,
            nc_count: 1,
            hbm_bytes_per_nc: 64 * MIB,
        });
        let mut alloc = |size| space.allocate(A, Region::Hbm(0), size, 0).unwrap();
        let prog = alloc(4096);
        let table = alloc(4096);
        let input = alloc(4096);
        let output = alloc(4 * MIB);
        let header = NeffProgramHeader {
            magic: NEFF_PROGRAM_MAGIC,
            version: NEFF_PROGRAM_VERSION,
            subgraph: 0,
            subgraph_count: 1,
            records: [1, 2, 3, 4, 5],
            dge_entries: 2,
            dge_table_pa: table.pa(),
            dge_copies: 1,
            flags: 0,
            reserved: 0,
            neff_uuid: [1; 16],
            neff_hash: [2; 16],
            reserved2: [0; 4],
        };
        prog.memory().write(prog.pa(), header.as_bytes()).unwrap();
        let entries = [
            DgeEntry {
                pa: input.pa(),
                size: 4096,
                var_id: 0,
                kind: DGE_KIND_INPUT,
                reserved: 0,
            },
            DgeEntry {
                pa: output.pa(),
                size: 4 * MIB,
                var_id: 1,
                kind: DGE_KIND_OUTPUT,
                reserved: 0,
            },
        ];
        table
            .memory()
            .write(table.pa(), entries.as_bytes())
            .unwrap();
        let addresses = [0, 1, 2, 3, 4].map(|i| prog.pa() + NEFF_PROGRAM_HEADER_SIZE + 64 * i);
        // Two entries, one input, then one piece: the second piece finds the run abandoned.
        let mut host = Fake {
            space,
            lives: 4,
            streams: Vec::new(),
            moved: 0,
        };
        assert_eq!(run(addresses, &mut host), Err(Stop::Abandoned));
        assert_eq!(
            host.streams,
            Engine::ALL.into_iter().zip(1..).collect::<Vec<_>>()
        );
        let mut seed = shape_only::Seed::default();
        seed.input_bytes(&[0; 4096]);
        let expected = shape_only::expected_output(seed, 0, WRITE_PIECE);
        let mut written = vec![0; 2 * WRITE_PIECE];
        output.memory().read(output.pa(), &mut written).unwrap();
        assert_eq!(written[..WRITE_PIECE], expected, "the first piece");
        assert!(
            written[WRITE_PIECE..].iter().all(|&b| b == 0),
            "nothing after the run was abandoned"
        );
        assert_eq!(host.moved, 2 * 32 + 2 * 4096 + WRITE_PIECE as u64);
        // With every answer live, the whole output is written.
        host.lives = usize::MAX;
        let stats = run(addresses, &mut host).unwrap();
        assert_eq!(stats.instructions, [1, 2, 3, 4, 5]);
        let mut whole = vec![0; 4 * 1024 * 1024];
        output.memory().read(output.pa(), &mut whole).unwrap();
        assert_eq!(whole, shape_only::expected_output(seed, 0, whole.len()));
    }
}
