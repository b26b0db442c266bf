//! Models of a scenario: built-in builders, container files or NEFF files, and the reference
//! each execution's outputs are checked against.
//!
//! A NEFF runs shape-only on simdev (`shared::neff_program`): its outputs are checked against
//! the documented shape-only function of its inputs ([`Reference::ShapeOnly`]), the default
//! reference of a NEFF file.

use std::path::Path;
use std::sync::Arc;

use runtime::builder::digits::{self, CLASSES, Digits, FEATURES};
use shared::model::Target;

use super::spec::ModelSpec;

/// What a model's outputs must equal.
#[derive(Debug)]
pub enum Reference {
    /// The output equals the input.
    Identity,
    /// The digits MLP: the reference logits of the test images, within `tolerance`.
    Digits {
        /// The data set (inputs and reference logits).
        data: Arc<Digits>,
        /// Images per execution.
        batch: usize,
        /// Largest accepted |output − reference|.
        tolerance: f32,
    },
    /// A NEFF run shape-only: each output is `shared::neff_program::shape_only` of the inputs,
    /// which feed the seed in DGE-table order.
    ShapeOnly {
        /// Input names in DGE-table order.
        inputs: Vec<String>,
        /// Output names in DGE-table order.
        outputs: Vec<String>,
    },
    /// Not checked.
    None,
}

/// One named input or output of a model and its bytes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Io {
    /// The name tensor sets bind it by.
    pub name: String,
    /// Bytes.
    pub size: u64,
}

/// A model ready to load.
#[derive(Debug)]
pub struct BuiltModel {
    /// The container (or NEFF) bytes.
    pub container: Vec<u8>,
    /// The inputs, in the model's order.
    pub inputs: Vec<Io>,
    /// The outputs.
    pub outputs: Vec<Io>,
    /// What outputs must equal.
    pub reference: Reference,
}

fn f32_bytes(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

/// A deterministic byte of execution `e`'s input pattern.
fn pattern_byte(seed: u64, e: u64, i: u64) -> u8 {
    let mut z = seed
        .wrapping_add(e.wrapping_mul(0x9E37_79B9_7F4A_7C15))
        .wrapping_add(i.wrapping_mul(0xBF58_476D_1CE4_E5B9));
    z ^= z >> 31;
    z = z.wrapping_mul(0x94D0_49BB_1331_11EB);
    (z >> 29).to_le_bytes()[0]
}

impl BuiltModel {
    /// Builds `[models.name]`; files are relative to `dir`.
    ///
    /// # Errors
    /// A message naming the model and what is wrong.
    pub fn build(name: &str, spec: &ModelSpec, dir: &Path) -> Result<Self, String> {
        let err = |m: String| format!("model {name:?}: {m}");
        let bytes = spec.bytes.unwrap_or(4096);
        let ios = |specs: &[shared::model::TensorSpec]| -> Vec<Io> {
            specs
                .iter()
                .map(|t| Io {
                    name: t.name.clone(),
                    size: t.size,
                })
                .collect()
        };
        let finish = |m: shared::model::Model, reference: Reference| -> Result<Self, String> {
            let (inputs, outputs) = (ios(&m.inputs), ios(&m.outputs));
            let container = m
                .to_container(Target::Simdev)
                .map_err(|e| err(e.to_string()))?;
            Ok(Self {
                container,
                inputs,
                outputs,
                reference,
            })
        };
        match (&spec.builder, &spec.file) {
            (Some(_), Some(_)) => Err(err("give either builder or file, not both".into())),
            (None, None) => Err(err("needs builder = \"...\" or file = \"...\"".into())),
            (None, Some(file)) => {
                let path = dir.join(file);
                let container =
                    std::fs::read(&path).map_err(|e| err(format!("{}: {e}", path.display())))?;
                if shared::model::looks_like_neff(&container).is_some() {
                    return Self::neff(container, spec.reference.as_deref())
                        .map_err(|e| err(format!("{}: {e}", path.display())));
                }
                let m = shared::model::Model::from_container(&container, Target::Simdev)
                    .map_err(|e| err(format!("{}: {e}", path.display())))?;
                let reference = match spec.reference.as_deref() {
                    Some("identity") => Reference::Identity,
                    None | Some("none") => Reference::None,
                    Some(other) => {
                        return Err(err(format!("reference {other:?} is not identity or none")));
                    }
                };
                Ok(Self {
                    inputs: ios(&m.inputs),
                    outputs: ios(&m.outputs),
                    container,
                    reference,
                })
            }
            (Some(builder), None) => {
                if spec.reference.is_some() {
                    return Err(err("reference applies to file models".into()));
                }
                let flags = [spec.exec_req_flags.unwrap_or(0); 13];
                let hash = [spec.table_hash.unwrap_or(0); 32];
                match builder.as_str() {
                    "identity" => finish(
                        runtime::builder::identity_with(bytes.max(1), name, flags, hash),
                        Reference::Identity,
                    ),
                    "identity_split" => {
                        let mut m = runtime::builder::identity_split(bytes.max(2));
                        m.name = name.into();
                        m.exec_req_flags = flags;
                        m.act_table_hash = hash;
                        finish(m, Reference::Identity)
                    }
                    "identity_cc" => finish(
                        runtime::builder::identity_with_collectives(
                            bytes.max(1),
                            spec.ctx_bytes.unwrap_or(4096),
                        ),
                        Reference::Identity,
                    ),
                    "never_ending" => finish(
                        runtime::builder::never_ending(spec.event.unwrap_or(3)),
                        Reference::None,
                    ),
                    "semaphore_leak" => finish(
                        runtime::builder::semaphore_leak(bytes.max(1), spec.semaphore.unwrap_or(5)),
                        Reference::Identity,
                    ),
                    "digits" => {
                        let data = Digits::load(&digits::default_path()).map_err(err)?;
                        let batch = spec.batch.unwrap_or(1);
                        let m = data.mlp().build(batch).map_err(|e| err(e.to_string()))?;
                        finish(
                            m,
                            Reference::Digits {
                                data: Arc::new(data),
                                batch: usize::try_from(batch).unwrap_or(1),
                                tolerance: spec.tolerance.unwrap_or(1e-4),
                            },
                        )
                    }
                    other => Err(err(format!(
                        "builder {other:?} is not one of identity, identity_split, identity_cc, \
                         never_ending, semaphore_leak, digits"
                    ))),
                }
            }
        }
    }

    /// A NEFF file model: its I/O from the NEFF, checked shape-only unless `reference` is
    /// `none`.
    fn neff(container: Vec<u8>, reference: Option<&str>) -> Result<Self, String> {
        let neff = neff::Neff::parse(&container, &neff::ParseOptions::default())
            .map_err(|e| e.to_string())?;
        let io = |ts: &[neff::IoTensor]| -> Vec<Io> {
            ts.iter()
                .map(|t| Io {
                    name: t.name.clone(),
                    size: t.size,
                })
                .collect()
        };
        let reference = match reference {
            None | Some("shape-only") => {
                let (inputs, outputs) = neff.dge_io_order();
                Reference::ShapeOnly { inputs, outputs }
            }
            Some("none") => Reference::None,
            Some(other) => {
                return Err(format!(
                    "reference {other:?} of a NEFF is not shape-only or none"
                ));
            }
        };
        Ok(Self {
            inputs: io(&neff.inputs),
            outputs: io(&neff.outputs),
            container,
            reference,
        })
    }

    /// The bytes of every input of execution `e`, in [`BuiltModel::inputs`] order.
    pub fn input(&self, seed: u64, e: u64) -> Vec<Vec<u8>> {
        if let Reference::Digits { .. } = self.reference {
            return vec![self.single_input(seed, e)];
        }
        // Each input its own pattern: the index runs on over the inputs before it.
        let mut start = 0;
        self.inputs
            .iter()
            .map(|io| {
                let v = (start..start + io.size)
                    .map(|i| pattern_byte(seed, e, i))
                    .collect();
                start += io.size;
                v
            })
            .collect()
    }

    fn single_input(&self, seed: u64, e: u64) -> Vec<u8> {
        match &self.reference {
            Reference::Digits { data, batch, .. } => {
                let count = data.count();
                let mut v = vec![0f32; batch * FEATURES];
                for r in 0..*batch {
                    let row = (usize::try_from(e).unwrap_or(0) * batch + r) % count;
                    v[r * FEATURES..(r + 1) * FEATURES]
                        .copy_from_slice(&data.inputs[row * FEATURES..(row + 1) * FEATURES]);
                }
                f32_bytes(&v)
            }
            _ => (0..self.inputs.first().map_or(0, |t| t.size))
                .map(|i| pattern_byte(seed, e, i))
                .collect(),
        }
    }

    /// Whether outputs are checked at all.
    pub fn checkable(&self) -> bool {
        !matches!(self.reference, Reference::None)
    }

    /// Checks execution `e`'s outputs (in [`BuiltModel::outputs`] order) against the
    /// reference; `Err` says where they differ.
    ///
    /// # Errors
    /// The first difference.
    pub fn check(
        &self,
        seed: u64,
        e: u64,
        inputs: &[Vec<u8>],
        outputs: &[Vec<u8>],
    ) -> Result<(), String> {
        let (input, output) = (
            inputs.first().map_or(&[][..], Vec::as_slice),
            outputs.first().map_or(&[][..], Vec::as_slice),
        );
        match &self.reference {
            Reference::None => Ok(()),
            Reference::ShapeOnly {
                inputs: in_order,
                outputs: out_order,
            } => {
                let by_name = |names: &[Io], bufs: &[Vec<u8>], name: &str| {
                    names
                        .iter()
                        .position(|io| io.name == name)
                        .and_then(|i| bufs.get(i))
                        .cloned()
                        .unwrap_or_default()
                };
                let mut s = shared::neff_program::shape_only::Seed::default();
                for name in in_order {
                    s.input_bytes(&by_name(&self.inputs, inputs, name));
                }
                for (j, name) in out_order.iter().enumerate() {
                    let got = by_name(&self.outputs, outputs, name);
                    let want = shared::neff_program::shape_only::expected_output(
                        s,
                        u32::try_from(j).unwrap_or(u32::MAX),
                        got.len(),
                    );
                    if let Some(i) = (0..got.len()).find(|&i| got[i] != want[i]) {
                        return Err(format!(
                            "execution {e}: byte {i} of output {name:?} is {:#04x}, the \
                             shape-only function of the inputs gives {:#04x}",
                            got[i], want[i]
                        ));
                    }
                }
                Ok(())
            }
            Reference::Identity => {
                let n = input.len().min(output.len());
                match (0..n).find(|&i| input[i] != output[i]) {
                    None => Ok(()),
                    Some(i) => Err(format!(
                        "execution {e}: output byte {i} is {:#04x}, the input's is {:#04x}",
                        output[i], input[i]
                    )),
                }
            }
            Reference::Digits {
                data,
                batch,
                tolerance,
            } => {
                let _ = seed;
                let count = data.count();
                let mut worst = (0f32, 0usize, 0usize);
                for r in 0..*batch {
                    let row = (usize::try_from(e).unwrap_or(0) * batch + r) % count;
                    for c in 0..CLASSES {
                        let off = (r * CLASSES + c) * 4;
                        let Some(b) = output.get(off..off + 4) else {
                            return Err(format!("execution {e}: output too short"));
                        };
                        let got = f32::from_le_bytes([b[0], b[1], b[2], b[3]]);
                        let want = data.logits[row * CLASSES + c];
                        let d = (got - want).abs();
                        if d.is_nan() || d > worst.0 {
                            worst = (if d.is_nan() { f32::INFINITY } else { d }, row, c);
                        }
                    }
                }
                if worst.0 <= *tolerance {
                    Ok(())
                } else {
                    Err(format!(
                        "execution {e}: logit {} of test image {} differs from the reference \
                         by {} (tolerance {tolerance})",
                        worst.2, worst.1, worst.0
                    ))
                }
            }
        }
    }
}
