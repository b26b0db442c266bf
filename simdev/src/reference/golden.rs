//! Golden files: a NEFF's recorded input/output pairs as a reference (issue 15, item 4).
//!
//! A golden file stands in for a reference function: an execution whose inputs equal a recorded
//! execution's inputs gets that execution's recorded outputs, byte for byte; one whose inputs
//! match none completes with an error naming the closest recorded execution. `nrt neff record`
//! writes golden files from a live run (so a run on silicon can later be replayed on simdev).
//!
//! # The format (`nrt-golden`, version 1)
//! A [safetensors](https://huggingface.co/docs/safetensors) file. For each recorded execution
//! `k` (0-based, `0..N`) it holds every input and every output the NEFF declares, by name:
//!
//! - `"{k}/in/{name}"` for input `name`, `"{k}/out/{name}"` for output `name`;
//! - each with the NEFF's dtype ([`safetensors_dtype`]: `U8`, `I8`, `I16`, `U16`, `F16`,
//!   `BF16`, `I32`, `U32`, `F32`, `I64`, `U64`, `F8_E4M3`, `F8_E5M2`; the NEFF types
//!   safetensors has no name for, `FP32R` and `FP8_E3`, cannot be recorded) and the NEFF's
//!   shape, data little-endian as on the device.
//!
//! and nothing else. The header's `__metadata__` holds strings: `"format": "nrt-golden"`,
//! `"version": "1"`, `"neff_uuid"` (the NEFF header's uuid, 32 hex digits),
//! `"neff_name"` (the header's name), `"executions"` (`N`, decimal, at least 1) and
//! `"source"` (where the outputs came from: `"silicon"`, `"simdev shape-only"` or
//! `"simdev reference"`; informative, not checked).
//!
//! # Matching
//! [`Golden::open`] checks the metadata against the NEFF (format, version, uuid) and every
//! tensor against the NEFF's I/O (each expected name present with the NEFF's dtype and shape,
//! no other tensor), then indexes the executions by the **content hash** of their inputs:
//! word-wise FNV-1a (64-bit offset basis and prime, `h = (h ^ w) · prime` per 8-byte
//! little-endian word `w`) over, for each input in the NEFF's DGE-table order
//! (`neff::Neff::dge_io_order`, the order shape-only runs read inputs in), its size in bytes
//! (one word) then all its bytes as words, the last one zero-padded. [`Golden::run`] hashes an
//! execution's inputs the same way and looks the hash up; a hit is confirmed byte for byte
//! against the recorded inputs (a hash collision is a miss, not a wrong answer).
//!
//! # Cost
//! Unlike the shape-only function, a golden match needs every input byte: each execution reads
//! its inputs whole (through the chunks' bounds-checked accessors, [`PIECE`] bytes at a time,
//! so memory stays bounded), once to hash and once to confirm. A miss reads them once more per
//! recorded execution to find the closest. [`Golden::open`] reads the whole file into memory:
//! golden files hold whole tensors, so they suit small and medium NEFFs (`nrt neff record`
//! refuses inputs above 256 MiB).

use std::collections::HashMap;
use std::ops::Range;
use std::path::Path;

use safetensors::tensor::{Dtype, TensorView};
use shared::model::DType;

use super::BoundTensor;

/// [`FORMAT_KEY`]'s value.
pub const FORMAT: &str = "nrt-golden";
/// [`VERSION_KEY`]'s value this module writes and reads.
pub const VERSION: &str = "1";
/// Metadata key: the format name.
pub const FORMAT_KEY: &str = "format";
/// Metadata key: the format version.
pub const VERSION_KEY: &str = "version";
/// Metadata key: the NEFF header's uuid (hex).
pub const NEFF_UUID_KEY: &str = "neff_uuid";
/// Metadata key: the NEFF header's name.
pub const NEFF_NAME_KEY: &str = "neff_name";
/// Metadata key: executions recorded (decimal).
pub const EXECUTIONS_KEY: &str = "executions";
/// Metadata key: where the recorded outputs came from.
pub const SOURCE_KEY: &str = "source";

/// Bytes read from device memory per accessor call while hashing or comparing.
pub const PIECE: usize = 1 << 20;

/// The safetensors dtype of a NEFF dtype.
///
/// # Errors
/// A message naming the dtype when safetensors has no name for it (`FP32R`, `FP8_E3`).
pub fn safetensors_dtype(dtype: DType) -> Result<Dtype, String> {
    Ok(match dtype {
        DType::U8 => Dtype::U8,
        DType::I8 => Dtype::I8,
        DType::I16 => Dtype::I16,
        DType::U16 => Dtype::U16,
        DType::F16 => Dtype::F16,
        DType::Bf16 => Dtype::BF16,
        DType::I32 => Dtype::I32,
        DType::U32 => Dtype::U32,
        DType::F32 => Dtype::F32,
        DType::I64 => Dtype::I64,
        DType::U64 => Dtype::U64,
        DType::Fp8E4 => Dtype::F8_E4M3,
        DType::Fp8E5 => Dtype::F8_E5M2,
        DType::Fp32r | DType::Fp8E3 => {
            return Err(format!(
                "{} has no safetensors dtype, so a golden file cannot hold it",
                dtype.nrt_name()
            ));
        }
    })
}

/// The name of recorded execution `k`'s input (`input` true) or output `name`.
pub fn tensor_name(k: usize, input: bool, name: &str) -> String {
    format!("{k}/{}/{name}", if input { "in" } else { "out" })
}

/// The content hash of [the module doc](self): word-wise FNV-1a over each input's size and
/// bytes, fed in pieces of any length.
#[derive(Clone, Copy, Debug)]
pub struct ContentHash {
    h: u64,
    pending: [u8; 8],
    filled: usize,
}

impl Default for ContentHash {
    fn default() -> Self {
        Self {
            h: 0xcbf2_9ce4_8422_2325,
            pending: [0; 8],
            filled: 0,
        }
    }
}

impl ContentHash {
    const PRIME: u64 = 0x0000_0100_0000_01b3;

    fn word(&mut self, w: u64) {
        self.h = (self.h ^ w).wrapping_mul(Self::PRIME);
    }

    /// Starts an input of `size` bytes (its bytes follow through [`Self::bytes`]).
    pub fn begin_input(&mut self, size: u64) {
        self.end_input();
        self.word(size);
    }

    /// The next bytes of the current input.
    pub fn bytes(&mut self, mut bytes: &[u8]) {
        if self.filled > 0 {
            let n = (8 - self.filled).min(bytes.len());
            self.pending[self.filled..self.filled + n].copy_from_slice(&bytes[..n]);
            self.filled += n;
            bytes = &bytes[n..];
            if self.filled < 8 {
                return;
            }
            self.word(u64::from_le_bytes(self.pending));
            self.filled = 0;
        }
        let mut words = bytes.chunks_exact(8);
        for w in &mut words {
            let mut le = [0u8; 8];
            le.copy_from_slice(w);
            self.word(u64::from_le_bytes(le));
        }
        let rest = words.remainder();
        self.pending[..rest.len()].copy_from_slice(rest);
        self.filled = rest.len();
    }

    /// Ends the current input (its last word zero-padded).
    fn end_input(&mut self) {
        if self.filled > 0 {
            self.pending[self.filled..].fill(0);
            self.word(u64::from_le_bytes(self.pending));
            self.filled = 0;
        }
    }

    /// The hash of everything fed.
    pub fn value(mut self) -> u64 {
        self.end_input();
        self.h
    }
}

/// One I/O tensor as the NEFF declares it.
#[derive(Clone, Debug)]
struct Declared {
    name: String,
    dtype: DType,
    shape: Vec<u64>,
    size: u64,
}

/// One recorded execution: where its inputs and outputs are in the file's bytes.
#[derive(Debug)]
struct Execution {
    /// In [`Golden::inputs`] order.
    inputs: Vec<Range<usize>>,
    /// In [`Golden::outputs`] order.
    outputs: Vec<Range<usize>>,
}

/// A golden file opened against its NEFF: recorded executions indexed by input content hash.
#[derive(Debug)]
pub struct Golden {
    /// The whole file.
    bytes: Vec<u8>,
    /// The NEFF's inputs in DGE-table order.
    inputs: Vec<Declared>,
    /// The NEFF's outputs in DGE-table order.
    outputs: Vec<Declared>,
    executions: Vec<Execution>,
    /// Content hash of the inputs -> executions with that hash, in recording order.
    by_hash: HashMap<u64, Vec<usize>>,
    /// Where the outputs came from (`source`; absent in a file written by another tool).
    source: Option<String>,
}

/// The NEFF's inputs and outputs in DGE-table order (declared order when the DGE table does
/// not name each exactly once).
fn declared_io(neff: &neff::Neff) -> (Vec<Declared>, Vec<Declared>) {
    let decl = |t: &neff::IoTensor| Declared {
        name: t.name.clone(),
        dtype: t.dtype,
        shape: t.shape.clone(),
        size: t.size,
    };
    let order = |names: Vec<String>, declared: &[neff::IoTensor]| -> Vec<Declared> {
        let by_order: Option<Vec<Declared>> = names
            .iter()
            .map(|n| declared.iter().find(|t| &t.name == n).map(decl))
            .collect();
        match by_order {
            Some(v) if v.len() == declared.len() => v,
            _ => declared.iter().map(decl).collect(),
        }
    };
    let (ins, outs) = neff.dge_io_order();
    (order(ins, &neff.inputs), order(outs, &neff.outputs))
}

fn shape_string(shape: &[u64]) -> String {
    format!("{shape:?}")
}

impl Golden {
    /// Reads the golden file at `path` and checks it against `neff` (see the module doc).
    ///
    /// # Errors
    /// A message naming the file and what is wrong: unreadable, not safetensors, metadata
    /// missing or not this format/version/NEFF, a tensor missing, unexpected, or with a dtype
    /// or shape other than the NEFF's (naming the tensor and both).
    pub fn open(path: &Path, neff: &neff::Neff) -> Result<Self, String> {
        let file = path.display().to_string();
        let bytes = std::fs::read(path).map_err(|e| format!("golden file {file}: {e}"))?;
        Self::from_bytes(file, bytes, neff)
    }

    /// [`Self::open`] of a file already read; `file` names it in messages.
    ///
    /// # Errors
    /// As [`Self::open`].
    pub fn from_bytes(file: String, bytes: Vec<u8>, neff: &neff::Neff) -> Result<Self, String> {
        let bad = |what: String| format!("golden file {file}: {what}");
        let (header_len, metadata) = safetensors::SafeTensors::read_metadata(&bytes)
            .map_err(|e| bad(format!("not a safetensors file: {e}")))?;
        let meta = metadata.metadata().clone().unwrap_or_default();
        let get = |key: &str| {
            meta.get(key).ok_or_else(|| {
                bad(format!(
                    "__metadata__ has no {key:?} (not an {FORMAT} file)"
                ))
            })
        };
        let format = get(FORMAT_KEY)?;
        if format != FORMAT {
            return Err(bad(format!(
                "__metadata__ \"format\" is {format:?}, not {FORMAT:?}"
            )));
        }
        let version = get(VERSION_KEY)?;
        if version != VERSION {
            return Err(bad(format!(
                "__metadata__ \"version\" is {version:?}; this simdev reads version {VERSION:?}"
            )));
        }
        let uuid = get(NEFF_UUID_KEY)?;
        if !uuid.eq_ignore_ascii_case(&neff.uuid_hex()) {
            return Err(bad(format!(
                "recorded for the NEFF with uuid {uuid} ({:?}), not this NEFF (uuid {}, {:?})",
                meta.get(NEFF_NAME_KEY).map_or("", String::as_str),
                neff.uuid_hex(),
                neff.name()
            )));
        }
        let n = get(EXECUTIONS_KEY)?;
        let n: usize = n.parse().ok().filter(|&n| n > 0).ok_or_else(|| {
            bad(format!(
                "__metadata__ \"executions\" is {n:?}, not a count of at least 1"
            ))
        })?;
        let (inputs, outputs) = declared_io(neff);
        let data_start = header_len + 8;
        let mut infos = metadata.tensors();
        let mut take = |k: usize, input: bool, d: &Declared| -> Result<Range<usize>, String> {
            let name = tensor_name(k, input, &d.name);
            let info = infos.remove(&name).ok_or_else(|| {
                bad(format!(
                    "tensor {name:?} is missing ({} executions recorded, so each has every input and output of the NEFF)",
                    n
                ))
            })?;
            let want =
                safetensors_dtype(d.dtype).map_err(|e| bad(format!("tensor {name:?}: {e}")))?;
            if info.dtype != want {
                return Err(bad(format!(
                    "tensor {name:?} has dtype {:?}; the NEFF's {:?} is {} ({want:?})",
                    info.dtype,
                    d.name,
                    d.dtype.nrt_name()
                )));
            }
            let shape: Vec<u64> = info.shape.iter().map(|&s| s as u64).collect();
            if shape != d.shape {
                return Err(bad(format!(
                    "tensor {name:?} has shape {}; the NEFF's {:?} has shape {}",
                    shape_string(&shape),
                    d.name,
                    shape_string(&d.shape)
                )));
            }
            let (start, end) = info.data_offsets;
            // read_metadata checked that the offsets lie inside the file and agree with the
            // dtype and shape.
            Ok(data_start + start..data_start + end)
        };
        let mut executions = Vec::with_capacity(n);
        for k in 0..n {
            let ins = inputs
                .iter()
                .map(|d| take(k, true, d))
                .collect::<Result<Vec<_>, _>>()?;
            let outs = outputs
                .iter()
                .map(|d| take(k, false, d))
                .collect::<Result<Vec<_>, _>>()?;
            executions.push(Execution {
                inputs: ins,
                outputs: outs,
            });
        }
        if let Some(extra) = infos.keys().min() {
            return Err(bad(format!(
                "tensor {extra:?} is not an input or output of the NEFF's {n} recorded executions (names are \"{{k}}/in/{{name}}\" and \"{{k}}/out/{{name}}\")"
            )));
        }
        let mut by_hash: HashMap<u64, Vec<usize>> = HashMap::new();
        for (k, e) in executions.iter().enumerate() {
            let mut h = ContentHash::default();
            for r in &e.inputs {
                h.begin_input(r.len() as u64);
                h.bytes(&bytes[r.clone()]);
            }
            by_hash.entry(h.value()).or_default().push(k);
        }
        Ok(Self {
            bytes,
            inputs,
            outputs,
            executions,
            by_hash,
            source: meta.get(SOURCE_KEY).cloned(),
        })
    }

    /// Where the outputs came from: the `source` metadata (`"silicon"`, `"simdev shape-only"`,
    /// ...), if the file has one.
    pub fn source(&self) -> Option<&str> {
        self.source.as_deref()
    }

    /// Whether some recorded outputs are simdev's shape-only fill, not numbers the NEFF
    /// computes: replaying them is no reference.
    pub fn shape_only(&self) -> bool {
        self.source().is_some_and(|s| s.contains("shape-only"))
    }

    /// Executions recorded.
    pub fn executions(&self) -> usize {
        self.executions.len()
    }

    /// The bound tensor of declared tensor `d`, checked to be an input (`input`) or output of
    /// `d`'s size.
    fn bound<'t>(
        &self,
        tensors: &'t [BoundTensor],
        d: &Declared,
        input: bool,
    ) -> Result<&'t BoundTensor, String> {
        let kind = if input { "input" } else { "output" };
        let t = tensors
            .iter()
            .find(|t| t.name == d.name && t.input == input)
            .ok_or_else(|| format!("golden reference: no {kind} {:?} bound", d.name))?;
        if t.size != d.size {
            return Err(format!(
                "golden reference: {kind} {:?} is bound with {} bytes; the NEFF declares {}",
                d.name, t.size, d.size
            ));
        }
        Ok(t)
    }

    /// Calls `f` with each piece of bound tensor `t`, in order, read through its chunk's
    /// accessor; `f` returns false to stop early.
    fn each_piece(
        t: &BoundTensor,
        buf: &mut Vec<u8>,
        mut f: impl FnMut(u64, &[u8]) -> bool,
    ) -> Result<(), String> {
        let pa = t.chunk.pa().checked_add(t.offset).ok_or_else(|| {
            format!(
                "golden reference: tensor {:?}: offset {:#x} overflows",
                t.name, t.offset
            )
        })?;
        let mut off = 0u64;
        while off < t.size {
            let n = usize::try_from(t.size - off).unwrap_or(PIECE).min(PIECE);
            buf.resize(n, 0);
            t.chunk.memory().read(pa.saturating_add(off), buf).map_err(|e| {
                format!(
                    "golden reference: reading {:?} ({} bytes at offset {:#x} of chunk {:#x}): {e}",
                    t.name,
                    t.size,
                    t.offset,
                    t.chunk.pa()
                )
            })?;
            if !f(off, buf) {
                break;
            }
            off += n as u64;
        }
        Ok(())
    }

    /// The first byte offset at which bound input `t` differs from `recorded`, or `None` when
    /// they are equal.
    fn first_difference(
        t: &BoundTensor,
        recorded: &[u8],
        buf: &mut Vec<u8>,
    ) -> Result<Option<u64>, String> {
        let mut at = None;
        Self::each_piece(t, buf, |off, piece| {
            let start = usize::try_from(off).unwrap_or(usize::MAX);
            let want = recorded.get(start..start + piece.len()).unwrap_or_default();
            match piece.iter().zip(want).position(|(a, b)| a != b) {
                Some(i) => {
                    at = Some(off + i as u64);
                    false
                }
                None if want.len() < piece.len() => {
                    at = Some(off + want.len() as u64);
                    false
                }
                None => true,
            }
        })?;
        Ok(at)
    }

    /// Writes the outputs of the recorded execution whose inputs equal the bound inputs of
    /// `tensors` into its bound outputs.
    ///
    /// # Errors
    /// An input or output of the NEFF not bound, or bound with another size; a tensor outside
    /// its chunk; or no recorded execution with these inputs: "no recorded execution has these
    /// inputs; closest is execution 3: input "y" differs first at byte 1024 of 65536" (the
    /// closest has the most inputs equal, the first recorded among ties).
    pub fn run(&self, tensors: &[BoundTensor]) -> Result<(), String> {
        let ins = self
            .inputs
            .iter()
            .map(|d| self.bound(tensors, d, true))
            .collect::<Result<Vec<_>, _>>()?;
        let outs = self
            .outputs
            .iter()
            .map(|d| self.bound(tensors, d, false))
            .collect::<Result<Vec<_>, _>>()?;
        let mut buf = Vec::new();
        let mut h = ContentHash::default();
        for t in &ins {
            h.begin_input(t.size);
            Self::each_piece(t, &mut buf, |_, piece| {
                h.bytes(piece);
                true
            })?;
        }
        let candidates = self.by_hash.get(&h.value()).map_or(&[][..], Vec::as_slice);
        let mut hit = None;
        'candidates: for &k in candidates {
            for (t, r) in ins.iter().zip(&self.executions[k].inputs) {
                if Self::first_difference(t, &self.bytes[r.clone()], &mut buf)?.is_some() {
                    continue 'candidates;
                }
            }
            hit = Some(k);
            break;
        }
        let Some(k) = hit else {
            return Err(self.closest(&ins, &mut buf)?);
        };
        for (t, r) in outs.iter().zip(&self.executions[k].outputs) {
            let pa = t.chunk.pa().saturating_add(t.offset);
            let mut off = 0usize;
            for piece in self.bytes[r.clone()].chunks(PIECE) {
                t.chunk
                    .memory()
                    .write(pa.saturating_add(off as u64), piece)
                    .map_err(|e| {
                        format!(
                            "golden reference: writing output {:?} ({} bytes at offset {:#x} of chunk {:#x}): {e}",
                            t.name,
                            t.size,
                            t.offset,
                            t.chunk.pa()
                        )
                    })?;
                off += piece.len();
            }
        }
        Ok(())
    }

    /// The message of a miss: the recorded execution with the most inputs equal to `ins` and
    /// where its first differing input differs.
    fn closest(&self, ins: &[&BoundTensor], buf: &mut Vec<u8>) -> Result<String, String> {
        // (equal inputs, execution, first differing input index, its byte offset)
        let mut best: Option<(usize, usize, usize, u64)> = None;
        for (k, e) in self.executions.iter().enumerate() {
            let mut equal = 0;
            let mut first = None;
            for (i, (t, r)) in ins.iter().zip(&e.inputs).enumerate() {
                match Self::first_difference(t, &self.bytes[r.clone()], buf)? {
                    None => equal += 1,
                    Some(at) => {
                        first.get_or_insert((i, at));
                    }
                }
            }
            let (i, at) = first.unwrap_or((0, 0));
            if best.is_none_or(|(b, ..)| equal > b) {
                best = Some((equal, k, i, at));
            }
        }
        let (_, k, i, at) = best.unwrap_or_default();
        let name = self.inputs.get(i).map_or("", |d| d.name.as_str());
        let size = self.inputs.get(i).map_or(0, |d| d.size);
        // The caller names the reference (the file) before this.
        Ok(format!(
            "no recorded execution has these inputs; closest is execution {k}: input {name:?} differs first at byte {at} of {size}"
        ))
    }
}

/// One execution to record: every input and output of the NEFF by name, its bytes.
#[derive(Clone, Debug, Default)]
pub struct Recorded {
    /// Inputs, by name.
    pub inputs: Vec<(String, Vec<u8>)>,
    /// Outputs, by name.
    pub outputs: Vec<(String, Vec<u8>)>,
}

/// A golden file's tensors by name and its `__metadata__`, ready to serialize.
type Views<'a> = (Vec<(String, TensorView<'a>)>, HashMap<String, String>);

/// The tensors and metadata of the golden file of `executions` of `neff`.
fn views<'a>(
    neff: &neff::Neff,
    source: &str,
    executions: &'a [Recorded],
) -> Result<Views<'a>, String> {
    if executions.is_empty() {
        return Err("a golden file records at least one execution".into());
    }
    let (inputs, outputs) = declared_io(neff);
    let mut views = Vec::new();
    for (k, e) in executions.iter().enumerate() {
        for (declared, recorded, input) in
            [(&inputs, &e.inputs, true), (&outputs, &e.outputs, false)]
        {
            for d in declared {
                let name = tensor_name(k, input, &d.name);
                let bytes = recorded
                    .iter()
                    .find(|(n, _)| *n == d.name)
                    .map(|(_, b)| b.as_slice())
                    .ok_or_else(|| format!("execution {k} has no {:?}", d.name))?;
                let dtype = safetensors_dtype(d.dtype).map_err(|e| format!("{name:?}: {e}"))?;
                let shape = d
                    .shape
                    .iter()
                    .map(|&s| usize::try_from(s))
                    .collect::<Result<Vec<_>, _>>()
                    .map_err(|_| format!("{name:?}: shape {:?} does not fit in memory", d.shape))?;
                let view = TensorView::new(dtype, shape, bytes).map_err(|e| {
                    format!(
                        "{name:?}: {} bytes for {} {}: {e}",
                        bytes.len(),
                        d.dtype.nrt_name(),
                        shape_string(&d.shape)
                    )
                })?;
                views.push((name, view));
            }
        }
    }
    let metadata: HashMap<String, String> = [
        (FORMAT_KEY, FORMAT.to_owned()),
        (VERSION_KEY, VERSION.to_owned()),
        (NEFF_UUID_KEY, neff.uuid_hex()),
        (NEFF_NAME_KEY, neff.name()),
        (EXECUTIONS_KEY, executions.len().to_string()),
        (SOURCE_KEY, source.to_owned()),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_owned(), v))
    .collect();
    Ok((views, metadata))
}

/// The golden file of `executions` of `neff` (see the module doc), whose outputs came from
/// `source` (`"silicon"`, `"simdev shape-only"`, `"simdev reference"`).
///
/// # Errors
/// No execution, a tensor of the NEFF missing from an execution or of the wrong size, a dtype
/// safetensors cannot name, or the serializer's error.
pub fn serialize(
    neff: &neff::Neff,
    source: &str,
    executions: &[Recorded],
) -> Result<Vec<u8>, String> {
    let (views, metadata) = views(neff, source, executions)?;
    safetensors::serialize(views, &Some(metadata)).map_err(|e| e.to_string())
}

/// [`serialize`] straight into the file at `path` (no second copy of the tensors in memory);
/// returns the file's size.
///
/// # Errors
/// As [`serialize`], or writing the file.
pub fn write(
    path: &Path,
    neff: &neff::Neff,
    source: &str,
    executions: &[Recorded],
) -> Result<u64, String> {
    let (views, metadata) = views(neff, source, executions)?;
    safetensors::serialize_to_file(views, &Some(metadata), path).map_err(|e| match e {
        // safetensors shows an I/O error as its Debug form.
        safetensors::SafeTensorError::IoError(io) => format!("{}: {io}", path.display()),
        e => format!("{}: {e}", path.display()),
    })?;
    std::fs::metadata(path)
        .map(|m| m.len())
        .map_err(|e| format!("{}: {e}", path.display()))
}

#[cfg(test)]
mod tests;
