//! Reference-backed NEFF runs (issue 15; DESIGN §6 "NEFF models"): a NEFF bound to a CPU
//! reference gets its outputs computed by that reference instead of [`crate::shape_only`]'s
//! function.
//!
//! # Bindings
//! `simdev --reference FILE.neff=MODULE.py:FUNCTION` (repeatable), or the environment
//! variable [`ENV_REFERENCE`] with the same syntax, several separated by `;` (a private simdev
//! started by the runtime inherits it). `FILE.neff=GOLDEN.safetensors` binds a recorded golden
//! file instead ([`golden`]). At start, [`References::load`] parses each NEFF with the `neff`
//! crate and records its header `uuid` and `hash` (first 16 bytes), its name, and its I/O in
//! DGE-table order with dtype and shape; a NEFF or module that cannot be read is a startup
//! error naming it.
//!
//! # At execution
//! A NEFF program ([`shared::neff_program`]) whose header's `neff_uuid` and `neff_hash` match a
//! binding runs the reference where the shape-only fill would run: after the header, the
//! streams (still charged to the latency model) and the DGE table are checked. The DGE
//! table's inputs and outputs (in table order) are matched to the binding's I/O (count and
//! sizes must agree) and passed as [`BoundTensor`]s. Faults, the latency model and the
//! notification are unchanged; the trace names the reference instead of "shape-only". An
//! output that holds a NaN or an infinity ([`BoundTensor::has_non_finite`]) makes the
//! execution a numerical error, as an engine's write of one does.
//!
//! **LNC=2**: only subgraph 0 runs the reference, which writes whole outputs; the other
//! subgraphs write nothing (their share of each output is covered by subgraph 0).
//!
//! # Errors
//! Anything that goes wrong in the reference — an exception, a missing output, a wrong dtype
//! or shape, a worker that exits or outlives [`Config::reference_timeout`](crate::config::Config)
//! — ends the execution with GENERIC (the runtime reports `NRT_EXEC_COMPLETED_WITH_ERR`); the
//! execution's one failure line in simdev's log (WARN) names the NEFF, the reference and its
//! message. A dead or timed-out worker is killed and reaped; the next execution starts a fresh
//! one ([`python`]).

pub mod golden;
pub mod python;

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use shared::model::DType;

use crate::memory::Chunk;

/// Environment variable with bindings, `;`-separated, read at simdev start.
pub const ENV_REFERENCE: &str = "NEURON_SIMDEV_REFERENCE";

/// What computes a bound NEFF's outputs.
#[derive(Debug)]
pub enum Reference {
    /// `FUNCTION` of the Python file `module`, run by the worker ([`python`]).
    Python {
        /// The module's path (absolute).
        module: PathBuf,
        /// The function's name.
        function: String,
    },
    /// A recorded golden file.
    Golden(golden::Golden),
}

/// One tensor of one execution, as bound through the DGE table.
#[derive(Clone, Debug)]
pub struct BoundTensor {
    /// The NEFF's name for it.
    pub name: String,
    /// Its dtype.
    pub dtype: DType,
    /// Its shape.
    pub shape: Vec<u64>,
    /// An input (else an output).
    pub input: bool,
    /// The client chunk that holds it.
    pub chunk: Arc<Chunk>,
    /// Its byte offset in the chunk.
    pub offset: u64,
    /// Its bytes.
    pub size: u64,
}

/// One tensor a bound NEFF declares.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Declared {
    /// Name.
    pub name: String,
    /// Dtype.
    pub dtype: DType,
    /// Shape.
    pub shape: Vec<u64>,
    /// Bytes.
    pub size: u64,
}

/// A NEFF bound to a reference.
#[derive(Debug)]
pub struct Binding {
    /// The NEFF file.
    pub neff_path: PathBuf,
    /// The NEFF header's uuid.
    pub uuid: [u8; 16],
    /// The first 16 bytes of the NEFF header's hash field.
    pub hash: [u8; 16],
    /// The NEFF's name.
    pub name: String,
    /// Inputs, in DGE-table order.
    pub inputs: Vec<Declared>,
    /// Outputs, in DGE-table order.
    pub outputs: Vec<Declared>,
    /// What computes the outputs.
    pub reference: Reference,
    /// How reports name it: `"ref_matmul.py:matmul"`, or the golden file's name.
    pub label: Arc<str>,
}

impl Binding {
    /// Whether it replays a golden file recorded from simdev's shape-only outputs: its
    /// executions' outputs are not the NEFF's numbers.
    pub fn replays_shape_only(&self) -> bool {
        matches!(&self.reference, Reference::Golden(g) if g.shape_only())
    }
}

impl BoundTensor {
    /// Whether the tensor holds a NaN or an infinity: a float value whose exponent field is
    /// all ones (IEEE fp32, fp16, bf16, fp8 e5m2 and, by the same rule, fp8 e3m4), or, for
    /// fp8 e4m3 (OCP "fn": no infinity), the NaN pattern `S.1111.111`. Integer types never do.
    /// Read in 64 KiB pieces.
    ///
    /// # Errors
    /// The tensor's bytes cannot be read from its chunk.
    pub fn has_non_finite(&self) -> Result<bool, String> {
        let (width, is_special): (usize, fn(u64) -> bool) = match self.dtype {
            DType::F32 | DType::Fp32r => (4, |v| v & 0x7f80_0000 == 0x7f80_0000),
            DType::F16 => (2, |v| v & 0x7c00 == 0x7c00),
            DType::Bf16 => (2, |v| v & 0x7f80 == 0x7f80),
            DType::Fp8E5 => (1, |v| v & 0x7c == 0x7c),
            DType::Fp8E3 => (1, |v| v & 0x70 == 0x70),
            DType::Fp8E4 => (1, |v| v & 0x7f == 0x7f),
            _ => return Ok(false),
        };
        const PIECE: u64 = 64 * 1024;
        let mut buf = vec![0u8; usize::try_from(PIECE.min(self.size)).unwrap_or(0)];
        let mut done = 0;
        while done < self.size {
            let n = usize::try_from((self.size - done).min(PIECE)).unwrap_or(0);
            let piece = &mut buf[..n];
            self.chunk
                .memory()
                .read(
                    self.chunk
                        .pa()
                        .saturating_add(self.offset)
                        .saturating_add(done),
                    piece,
                )
                .map_err(|e| format!("reading output {:?}: {e}", self.name))?;
            let found = piece.chunks_exact(width).any(|e| {
                let mut v = [0u8; 8];
                v[..width].copy_from_slice(e);
                is_special(u64::from_le_bytes(v))
            });
            if found {
                return Ok(true);
            }
            done += n as u64;
        }
        Ok(false)
    }
}

/// One binding's text, split: `FILE.neff=MODULE.py:FUNCTION` or `FILE.neff=GOLDEN.safetensors`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BindingSpec {
    /// The NEFF file.
    pub neff: PathBuf,
    /// What it is bound to.
    pub target: Target,
}

/// The right-hand side of a binding.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Target {
    /// A Python function.
    Python {
        /// The `.py` file.
        module: PathBuf,
        /// The function.
        function: String,
    },
    /// A golden `.safetensors` file.
    Golden(PathBuf),
}

impl BindingSpec {
    /// Parses `FILE.neff=MODULE.py:FUNCTION` or `FILE.neff=GOLDEN.safetensors`.
    ///
    /// # Errors
    /// A message naming the text and the rule it broke.
    pub fn parse(text: &str) -> Result<Self, String> {
        let t = text.trim();
        let bad = |why: &str| {
            format!(
                "reference binding {t:?}: {why} (expected FILE.neff=MODULE.py:FUNCTION or \
                 FILE.neff=GOLDEN.safetensors)"
            )
        };
        let (neff, rhs) = t.split_once(".neff=").ok_or_else(|| bad("no \".neff=\""))?;
        if neff.is_empty() {
            return Err(bad("no NEFF file before \".neff=\""));
        }
        let neff = PathBuf::from(format!("{neff}.neff"));
        if rhs.ends_with(".safetensors") {
            return Ok(Self {
                neff,
                target: Target::Golden(PathBuf::from(rhs)),
            });
        }
        let (module, function) = rhs
            .rsplit_once(':')
            .ok_or_else(|| bad("no \":FUNCTION\" after the module"))?;
        if !module.ends_with(".py") || module.len() == 3 {
            return Err(bad("the module must be a .py file"));
        }
        let ident = function
            .chars()
            .next()
            .is_some_and(|c| c.is_alphabetic() || c == '_')
            && function.chars().all(|c| c.is_alphanumeric() || c == '_');
        if !ident {
            return Err(bad(&format!("{function:?} is not a Python function name")));
        }
        Ok(Self {
            neff,
            target: Target::Python {
                module: PathBuf::from(module),
                function: function.to_owned(),
            },
        })
    }

    /// The same binding with its files' paths made canonical where they exist (a path that
    /// does not is kept, for the load to name).
    #[must_use]
    pub fn canonical(self) -> Self {
        let canon = |p: PathBuf| std::fs::canonicalize(&p).unwrap_or(p);
        Self {
            neff: canon(self.neff),
            target: match self.target {
                Target::Python { module, function } => Target::Python {
                    module: canon(module),
                    function,
                },
                Target::Golden(g) => Target::Golden(canon(g)),
            },
        }
    }

    /// Splits `text` (the [`ENV_REFERENCE`] syntax) at `;`, skipping empty items.
    ///
    /// # Errors
    /// The first item's error.
    pub fn parse_list(text: &str) -> Result<Vec<Self>, String> {
        text.split(';')
            .filter(|s| !s.trim().is_empty())
            .map(Self::parse)
            .collect()
    }
}

/// File name of `path` for messages and labels.
fn file_name(path: &Path) -> String {
    path.file_name().map_or_else(
        || path.display().to_string(),
        |n| n.to_string_lossy().into_owned(),
    )
}

impl Binding {
    /// Reads and parses the NEFF and checks the target exists.
    ///
    /// # Errors
    /// A message naming the file that cannot be used and why.
    pub fn load(spec: &BindingSpec) -> Result<Self, String> {
        let path = &spec.neff;
        let bytes =
            std::fs::read(path).map_err(|e| format!("reference NEFF {}: {e}", path.display()))?;
        let neff = neff::Neff::parse(&bytes, &neff::ParseOptions::default())
            .map_err(|e| format!("reference NEFF {}: {e}", path.display()))?;
        let first = neff
            .subgraphs
            .first()
            .ok_or_else(|| format!("reference NEFF {}: no subgraphs", path.display()))?;
        let (in_order, out_order) = first.dge_io_order();
        let declared = |names: &[String], io: &[neff::IoTensor]| -> Result<Vec<Declared>, String> {
            names
                .iter()
                .map(|n| {
                    let t = io.iter().find(|t| &t.name == n).ok_or_else(|| {
                        format!(
                            "reference NEFF {}: the DGE table lists {n:?}, which is not one of \
                             the model's inputs or outputs",
                            path.display()
                        )
                    })?;
                    Ok(Declared {
                        name: t.name.clone(),
                        dtype: t.dtype,
                        shape: t.shape.clone(),
                        size: t.size,
                    })
                })
                .collect()
        };
        let inputs = declared(&in_order, &neff.inputs)?;
        let outputs = declared(&out_order, &neff.outputs)?;
        let (reference, label) = match &spec.target {
            Target::Python { module, function } => {
                let abs = std::fs::canonicalize(module).map_err(|e| {
                    format!(
                        "reference module {} (for {}): {e}",
                        module.display(),
                        path.display()
                    )
                })?;
                let label = format!("{}:{function}", file_name(module));
                (
                    Reference::Python {
                        module: abs,
                        function: function.clone(),
                    },
                    label,
                )
            }
            Target::Golden(file) => {
                let g = golden::Golden::open(file, &neff).map_err(|e| {
                    format!(
                        "golden file {} (for {}): {e}",
                        file.display(),
                        path.display()
                    )
                })?;
                // Replaying shape-only outputs is no reference: say so wherever the label goes
                // (the bench's report, execution errors).
                let label = if g.shape_only() {
                    let label = format!(
                        "{} (recorded from {}: not the NEFF's numbers)",
                        file_name(file),
                        g.source().unwrap_or_default()
                    );
                    tracing::warn!(
                        "golden file {} (for {}) was recorded from {}: simdev replays those \
                         outputs, which are not the NEFF's numbers; record on silicon for a \
                         reference",
                        file.display(),
                        path.display(),
                        g.source().unwrap_or_default()
                    );
                    label
                } else {
                    file_name(file)
                };
                (Reference::Golden(g), label)
            }
        };
        let mut hash = [0u8; 16];
        hash.copy_from_slice(&neff.header.hash[..16]);
        Ok(Self {
            neff_path: path.clone(),
            uuid: neff.header.uuid,
            hash,
            name: neff.header.name(),
            inputs,
            outputs,
            reference,
            label: label.into(),
        })
    }
}

/// Every binding of one simdev, and the Python worker they share.
#[derive(Debug)]
pub struct References {
    bindings: Vec<Arc<Binding>>,
    worker: Mutex<python::WorkerSlot>,
    /// Stops the worker without its slot's lock ([`References::stop_worker`]).
    stop: python::WorkerStop,
}

impl References {
    /// Loads every binding of `specs` (see the module doc); `timeout` bounds one execution of
    /// a Python reference. A spec given twice (on the command line and in
    /// `NEURON_SIMDEV_REFERENCE`, say) counts once.
    ///
    /// # Errors
    /// The first binding that cannot be loaded, named; or two different bindings of one NEFF
    /// (the same header uuid and hash), both named: which one would run is not the user's
    /// to guess.
    pub fn load(specs: &[String], timeout: Duration) -> Result<Self, String> {
        let mut bindings: Vec<(&str, Arc<Binding>)> = Vec::new();
        // One binding spelled two ways (`./ref.py` and `ref.py`) is one binding.
        let mut seen: Vec<BindingSpec> = Vec::new();
        for spec in specs {
            if bindings.iter().any(|(s, _)| s == spec) {
                continue;
            }
            let parsed = BindingSpec::parse(spec)?.canonical();
            if seen.contains(&parsed) {
                continue;
            }
            seen.push(parsed.clone());
            let b = Binding::load(&parsed).map(Arc::new)?;
            if let Some((first, _)) = bindings
                .iter()
                .find(|(_, o)| o.uuid == b.uuid && o.hash == b.hash)
            {
                return Err(format!(
                    "two references for one NEFF ({:?}, the same uuid and hash): {first:?} and \
                     {spec:?}; bind each NEFF once (simdev's --reference and \
                     NEURON_SIMDEV_REFERENCE are combined)",
                    b.name
                ));
            }
            bindings.push((spec, b));
        }
        let bindings = bindings.into_iter().map(|(_, b)| b).collect();
        let slot = python::WorkerSlot::new(timeout);
        Ok(Self {
            bindings,
            stop: slot.stopper(),
            worker: Mutex::new(slot),
        })
    }

    /// Every binding as [`Request::References`](shared::protocol::Request::References) answers
    /// it: the NEFF's identity and the reference's label.
    pub fn described(&self) -> Vec<shared::protocol::ReferenceBinding> {
        self.bindings
            .iter()
            .map(|b| shared::protocol::ReferenceBinding {
                neff_uuid: b.uuid,
                neff_hash: b.hash,
                label: b.label.to_string(),
            })
            .collect()
    }

    /// Whether there is no binding.
    pub fn is_empty(&self) -> bool {
        self.bindings.is_empty()
    }

    /// The binding of the NEFF with this header `uuid` and `hash`.
    pub fn find(&self, uuid: &[u8; 16], hash: &[u8; 16]) -> Option<Arc<Binding>> {
        self.bindings
            .iter()
            .find(|b| &b.uuid == uuid && &b.hash == hash)
            .cloned()
    }

    /// Ends the reference in progress, if any, at once (its execution fails, 1004: the device is
    /// going away), and every later one: a stopping simdev does not wait out a reference's
    /// timeout.
    pub fn stop_worker(&self) {
        self.stop.stop();
    }

    /// The pid of the running Python worker, if one runs.
    pub fn worker_pid(&self) -> Option<u32> {
        self.worker
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .pid()
    }

    /// Runs `binding`'s reference on `tensors` (inputs and outputs, matched to the binding's
    /// declared I/O by the caller).
    ///
    /// # Errors
    /// The reference's message, prefixed with its label.
    pub fn run(&self, binding: &Binding, tensors: &[BoundTensor]) -> Result<(), String> {
        let result = match &binding.reference {
            Reference::Python { module, function } => self
                .worker
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .run(module, function, tensors),
            Reference::Golden(g) => g.run(tensors),
        };
        result.map_err(|e| format!("reference {}: {e}", binding.label))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bindings_parse_python_and_golden_targets() {
        let b = BindingSpec::parse("data/neff/m.neff=refs/ref_matmul.py:matmul").unwrap();
        assert_eq!(b.neff, PathBuf::from("data/neff/m.neff"));
        assert_eq!(
            b.target,
            Target::Python {
                module: PathBuf::from("refs/ref_matmul.py"),
                function: "matmul".into()
            }
        );
        let g = BindingSpec::parse(" a=b.neff=rec.safetensors ").unwrap();
        assert_eq!(g.neff, PathBuf::from("a=b.neff"));
        assert_eq!(g.target, Target::Golden(PathBuf::from("rec.safetensors")));
        // A Windows-ish or odd module path keeps its colons; the function is after the last.
        let c = BindingSpec::parse("m.neff=/x:y/r.py:_f2").unwrap();
        assert!(matches!(c.target, Target::Python { ref function, .. } if function == "_f2"));
        for bad in [
            "m.neff",
            "=r.py:f",
            ".neff=r.py:f",
            "m.neff=r.py",
            "m.neff=r.txt:f",
            "m.neff=.py:f",
            "m.neff=r.py:",
            "m.neff=r.py:2f",
            "m.neff=r.py:f-g",
        ] {
            let e = BindingSpec::parse(bad).unwrap_err();
            assert!(e.contains("reference binding"), "{bad}: {e}");
        }
        let list = BindingSpec::parse_list("a.neff=r.py:f; ;b.neff=g.safetensors;").unwrap();
        assert_eq!(list.len(), 2);
        assert!(BindingSpec::parse_list("a.neff=r.py:f;oops").is_err());
    }

    fn data(name: &str) -> String {
        format!(
            "{}/../scenarios/data/neff/{name}",
            env!("CARGO_MANIFEST_DIR")
        )
    }

    #[test]
    fn loading_records_the_neff_identity_and_io_in_dge_order() {
        let module = format!("{}/python/ref_matmul.py", env!("CARGO_MANIFEST_DIR"));
        let spec = format!("{}={module}:matmul", data("matmul_small.neff"));
        let refs = References::load(&[spec], Duration::from_secs(1)).unwrap();
        let b = &refs.bindings[0];
        let bytes = std::fs::read(data("matmul_small.neff")).unwrap();
        let h = neff::NeffHeader::read(&bytes).unwrap();
        assert_eq!((b.uuid, &b.hash[..]), (h.uuid, &h.hash[..16]));
        assert_eq!(&*b.label, "ref_matmul.py:matmul");
        let names = |d: &[Declared]| d.iter().map(|t| t.name.clone()).collect::<Vec<_>>();
        assert_eq!(
            (names(&b.inputs), names(&b.outputs)),
            (vec!["x".to_owned(), "y".into()], vec!["output0".to_owned()])
        );
        assert_eq!(b.inputs[0].shape, [128, 256]);
        assert_eq!(
            (b.outputs[0].dtype, b.outputs[0].size),
            (DType::F16, 128 * 128 * 2)
        );
        assert!(refs.find(&h.uuid, &b.hash).is_some());
        let mut other = b.hash;
        other[0] ^= 1;
        assert!(refs.find(&h.uuid, &other).is_none());
    }

    #[test]
    fn one_binding_spelled_two_ways_counts_once_and_two_different_ones_are_refused() {
        let dir = env!("CARGO_MANIFEST_DIR");
        let neff = data("matmul_small.neff");
        let plain = format!("{neff}={dir}/python/ref_matmul.py:matmul");
        let dotted = format!("{neff}={dir}/python/./ref_matmul.py:matmul");
        let refs = References::load(&[plain.clone(), dotted], Duration::from_secs(1)).unwrap();
        assert_eq!(refs.bindings.len(), 1);
        let other = format!("{neff}={dir}/python/ref_matmul.py:other");
        let e = References::load(&[plain, other], Duration::from_secs(1)).unwrap_err();
        assert!(e.contains("two references for one NEFF"), "{e}");
    }

    /// A golden file recorded from simdev's shape-only outputs is bound (its replay is what
    /// the recording held), but its label says the outputs are not the NEFF's numbers.
    #[test]
    fn a_golden_of_shape_only_outputs_is_labelled_so() {
        let bytes = std::fs::read(data("matmul_small.neff")).unwrap();
        let neff = neff::Neff::parse(&bytes, &neff::ParseOptions::default()).unwrap();
        let recorded = vec![golden::Recorded {
            inputs: vec![
                ("x".into(), vec![0u8; 65536]),
                ("y".into(), vec![0u8; 65536]),
            ],
            outputs: vec![("output0".into(), vec![0u8; 32768])],
        }];
        let dir = tempfile::tempdir().unwrap();
        for (source, honest) in [("silicon", true), ("simdev shape-only", false)] {
            let file = dir.path().join("g.safetensors");
            golden::write(&file, &neff, source, &recorded).unwrap();
            let spec = format!("{}={}", data("matmul_small.neff"), file.display());
            let refs = References::load(&[spec], Duration::from_secs(1)).unwrap();
            let label = &*refs.bindings[0].label;
            if honest {
                assert_eq!(label, "g.safetensors");
            } else {
                assert_eq!(
                    label,
                    "g.safetensors (recorded from simdev shape-only: not the NEFF's numbers)"
                );
            }
        }
    }

    #[test]
    fn a_neff_bound_twice_differently_is_refused_naming_both_and_a_repeat_counts_once() {
        let t = Duration::from_secs(1);
        let module = format!("{}/python/ref_matmul.py", env!("CARGO_MANIFEST_DIR"));
        let a = format!("{}={module}:matmul", data("matmul_small.neff"));
        let b = format!("{}={module}:other", data("matmul_small.neff"));
        let e = References::load(&[a.clone(), b.clone()], t).unwrap_err();
        assert!(
            e.starts_with("two references for one NEFF") && e.contains(&a) && e.contains(&b),
            "{e}"
        );
        // The same spec twice (command line and environment): one binding.
        let refs = References::load(&[a.clone(), a], t).unwrap();
        assert_eq!(refs.bindings.len(), 1);
        // Two NEFFs, one binding each: both kept.
        let large = format!("{}={module}:matmul", data("matmul_large.neff"));
        let small = format!("{}={module}:matmul", data("matmul_small.neff"));
        assert_eq!(
            References::load(&[small, large], t).unwrap().bindings.len(),
            2
        );
    }

    #[test]
    fn bad_bindings_are_startup_errors_naming_the_file() {
        let t = Duration::from_secs(1);
        let e = References::load(&["/nope/m.neff=r.py:f".into()], t).unwrap_err();
        assert!(e.contains("/nope/m.neff"), "{e}");
        let spec = format!("{}=/nope/ref.py:f", data("matmul_small.neff"));
        let e = References::load(&[spec], t).unwrap_err();
        assert!(e.contains("/nope/ref.py"), "{e}");
        // A file that is not a NEFF: the parser's error, naming the file.
        let module = format!("{}/python/ref_matmul.py", env!("CARGO_MANIFEST_DIR"));
        let dir = tempfile::tempdir().unwrap();
        let junk = dir.path().join("junk.neff");
        std::fs::write(&junk, b"not a NEFF").unwrap();
        let e = References::load(&[format!("{}={module}:f", junk.display())], t).unwrap_err();
        assert!(
            e.starts_with("reference NEFF ") && e.contains("junk.neff"),
            "{e}"
        );
        // A golden file, until golden files exist, is refused at start, named.
        let spec = format!("{}=rec.safetensors", data("matmul_small.neff"));
        let e = References::load(&[spec], t).unwrap_err();
        assert!(e.contains("golden file rec.safetensors"), "{e}");
    }
}
