//! The real-data model: a 64 → 64 → 32 → 10 ReLU MLP trained on the UCI hand-written digits
//! (8×8, as shipped with scikit-learn), with its 360 held-out test images, labels and fp32
//! reference logits, read from `scenarios/data/digits_mlp.safetensors` (weights `fcN.weight`
//! stored `[in, out]`, `fcN.bias`; `test.inputs` `[360, 64]` in [0, 1], `test.labels` i32,
//! `test.logits` `[360, 10]`).

use std::path::{Path, PathBuf};

use safetensors::{Dtype, SafeTensors};
use shared::isa::ActFunc;

use super::mlp::MlpBuilder;

/// The digits data set and trained weights.
#[derive(Clone, Debug, PartialEq)]
pub struct Digits {
    /// `(weights [in × out], bias [out])` of fc1, fc2, fc3.
    pub layers: Vec<(Vec<f32>, Vec<f32>)>,
    /// Test images, row-major `[count, 64]`.
    pub inputs: Vec<f32>,
    /// Test labels (0..=9).
    pub labels: Vec<i32>,
    /// Reference logits, row-major `[count, 10]`.
    pub logits: Vec<f32>,
}

/// Input features (8 × 8 pixels).
pub const FEATURES: usize = 64;
/// Classes.
pub const CLASSES: usize = 10;

/// The data file in this repository.
pub fn default_path() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../scenarios/data/digits_mlp.safetensors")
}

fn f32s(st: &SafeTensors<'_>, name: &str, shape: &[usize]) -> Result<Vec<f32>, String> {
    let t = st.tensor(name).map_err(|e| format!("{name}: {e}"))?;
    if t.dtype() != Dtype::F32 || t.shape() != shape {
        return Err(format!(
            "{name}: expected F32 {shape:?}, found {:?} {:?}",
            t.dtype(),
            t.shape()
        ));
    }
    Ok(t.data()
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect())
}

impl Digits {
    /// Reads the data file.
    ///
    /// # Errors
    /// A message naming the file or tensor that is missing or malformed.
    pub fn load(path: &Path) -> Result<Self, String> {
        let bytes = std::fs::read(path).map_err(|e| format!("{}: {e}", path.display()))?;
        let st =
            SafeTensors::deserialize(&bytes).map_err(|e| format!("{}: {e}", path.display()))?;
        let dims = [(64, 64), (64, 32), (32, 10)];
        let mut layers = Vec::new();
        for (i, (k, n)) in dims.iter().enumerate() {
            let w = f32s(&st, &format!("fc{}.weight", i + 1), &[*k, *n])?;
            let b = f32s(&st, &format!("fc{}.bias", i + 1), &[*n])?;
            layers.push((w, b));
        }
        let inputs = f32s(&st, "test.inputs", &[360, FEATURES])?;
        let logits = f32s(&st, "test.logits", &[360, CLASSES])?;
        let t = st
            .tensor("test.labels")
            .map_err(|e| format!("test.labels: {e}"))?;
        if t.dtype() != Dtype::I32 {
            return Err(format!("test.labels: expected I32, found {:?}", t.dtype()));
        }
        let labels = t
            .data()
            .chunks_exact(4)
            .map(|c| i32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect();
        Ok(Self {
            layers,
            inputs,
            labels,
            logits,
        })
    }

    /// Test images.
    pub fn count(&self) -> usize {
        self.labels.len()
    }

    /// The MLP as a builder stack: fc1 + ReLU, fc2 + ReLU, fc3 (logits).
    pub fn mlp(&self) -> MlpBuilder {
        let [(w1, b1), (w2, b2), (w3, b3)] =
            [&self.layers[0], &self.layers[1], &self.layers[2]].map(Clone::clone);
        MlpBuilder::new("digits-mlp", 64)
            .dense(w1, b1)
            .activation(ActFunc::Relu)
            .dense(w2, b2)
            .activation(ActFunc::Relu)
            .dense(w3, b3)
    }
}

/// Index of the largest logit of each row of `[rows, CLASSES]`.
pub fn argmax_rows(logits: &[f32]) -> Vec<usize> {
    logits
        .chunks(CLASSES)
        .map(|r| {
            r.iter()
                .enumerate()
                .fold(
                    (0, f32::NEG_INFINITY),
                    |b, (i, &v)| if v > b.1 { (i, v) } else { b },
                )
                .0
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_data_file_loads_and_the_host_reference_reaches_the_reference_accuracy() {
        let d = Digits::load(&default_path()).unwrap();
        assert_eq!(d.count(), 360);
        let host = d.mlp().reference_forward(&d.inputs).unwrap();
        let max_diff = host
            .iter()
            .zip(&d.logits)
            .map(|(a, b)| (a - b).abs())
            .fold(0f32, f32::max);
        assert!(
            max_diff <= 1e-4,
            "host forward pass differs from the reference logits by {max_diff}"
        );
        let correct = argmax_rows(&host)
            .iter()
            .zip(&d.labels)
            .filter(|(p, l)| i32::try_from(**p).ok() == Some(**l))
            .count();
        assert_eq!(correct, 355, "reference accuracy 0.986111 = 355/360");
    }
}
