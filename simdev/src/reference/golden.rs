//! Golden-file references (issue 15 item 4): a recorded `.safetensors` file of input/output
//! pairs. Not implemented yet; this placeholder keeps the API the bindings call.

use std::path::Path;

use super::BoundTensor;

/// A golden file, opened.
#[derive(Debug)]
pub struct Golden;

impl Golden {
    /// Opens the golden file at `path` for `neff`.
    ///
    /// # Errors
    /// Always, until golden files are implemented.
    pub fn open(path: &Path, neff: &neff::Neff) -> Result<Self, String> {
        let _ = (path, neff);
        Err("golden files are not implemented yet".to_owned())
    }

    /// Writes the recorded outputs of the execution whose inputs are in `tensors`.
    ///
    /// # Errors
    /// Always, until golden files are implemented.
    pub fn run(&self, tensors: &[BoundTensor]) -> Result<(), String> {
        let _ = tensors;
        Err("golden files are not implemented yet".to_owned())
    }
}
