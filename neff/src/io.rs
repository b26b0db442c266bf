//! The model's inputs and outputs: the `input`/`output` vars of the first subgraph, with dtype
//! and shape from `neff.json`'s signature or the subgraph's `tensor_map.json`.
//!
//! `neff.json`'s `outputs` map is empty in the observed files (and its kernel node lists
//! "output0" twice), so outputs come from `def.json`'s vars, typed by `tensor_map.json`.
//! Invariants of the result: each tensor's `size` is its elements × dtype width and equals its
//! var's `size`; every subgraph declares the same I/O vars (name, type, size).

use std::collections::BTreeMap;

use shared::model::DType;

use crate::def::{Signature, TensorMapEntry};
use crate::{IoTensor, NeffError, Subgraph, VarKind};

/// `tensor_map.json` of a subgraph, by tensor name (empty when the member is absent).
pub(crate) type TensorMap = BTreeMap<String, TensorMapEntry>;

/// The model's inputs (signature order, then var id) and outputs (var id order).
pub(crate) fn model_io(
    signature: &Signature,
    tensor_map: &TensorMap,
    subgraphs: &[Subgraph],
) -> Result<(Vec<IoTensor>, Vec<IoTensor>), NeffError> {
    let first = subgraphs.first().ok_or_else(|| NeffError::Field {
        member: "kelf-0.json".into(),
        field: "graphs".into(),
        problem: "no subgraphs".into(),
    })?;
    same_io(first, &subgraphs[1..])?;
    for name in signature.inputs.keys() {
        if !first
            .vars
            .get(name)
            .is_some_and(|v| v.kind == VarKind::Input)
        {
            return Err(NeffError::Io {
                tensor: name.clone(),
                problem: format!(
                    "neff.json's signature names it as an input but {}'s def.json has no input var of that name",
                    first.name
                ),
            });
        }
    }
    let mut inputs = Vec::new();
    let mut outputs = Vec::new();
    for var in first.vars.values() {
        let (is_input, sig) = match var.kind {
            VarKind::Input => (true, signature.inputs.get(&var.name)),
            VarKind::Output => (false, signature.outputs.get(&var.name)),
            _ => continue,
        };
        let map = tensor_map.get(&var.name).and_then(|e| {
            let shape = e.tf_shape.clone()?;
            Some((e.dtype.as_str(), shape))
        });
        // Inputs prefer the signature; outputs prefer tensor_map.json (the signature's outputs
        // are empty in real files).
        let from_sig = sig.map(|s| (s.dtype.as_str(), s.shape.clone()));
        let (dtype_name, shape) = if is_input {
            from_sig.or(map)
        } else {
            map.or(from_sig)
        }
        .ok_or_else(|| NeffError::Io {
            tensor: var.name.clone(),
            problem: "neither neff.json's signature nor tensor_map.json gives its dtype and shape"
                .into(),
        })?;
        let dtype = DType::from_neff_name(dtype_name).ok_or_else(|| NeffError::Io {
            tensor: var.name.clone(),
            problem: format!("dtype {dtype_name:?} has no nrt_dtype_t"),
        })?;
        let size = shape
            .iter()
            .try_fold(dtype.size(), |acc, &d| acc.checked_mul(d))
            .ok_or_else(|| NeffError::Io {
                tensor: var.name.clone(),
                problem: format!("shape {shape:?} × {} bytes overflows", dtype.size()),
            })?;
        if size != var.size {
            return Err(NeffError::Io {
                tensor: var.name.clone(),
                problem: format!(
                    "shape {shape:?} of {dtype_name} is {size} bytes but its var's size is {}",
                    var.size
                ),
            });
        }
        let tensor = IoTensor {
            name: var.name.clone(),
            dtype,
            shape,
            size,
        };
        let key = (sig.map_or(u32::MAX, |s| s.id), var.var_id);
        if is_input {
            inputs.push((key, tensor));
        } else {
            outputs.push((var.var_id, tensor));
        }
    }
    inputs.sort_by_key(|(k, _)| *k);
    outputs.sort_by_key(|(k, _)| *k);
    Ok((
        inputs.into_iter().map(|(_, t)| t).collect(),
        outputs.into_iter().map(|(_, t)| t).collect(),
    ))
}

/// Every subgraph declares the same I/O vars as the first: name, type and size.
fn same_io(first: &Subgraph, others: &[Subgraph]) -> Result<(), NeffError> {
    let io = |sg: &Subgraph| -> BTreeMap<String, (bool, u64)> {
        sg.vars
            .values()
            .filter_map(|v| match v.kind {
                VarKind::Input => Some((v.name.clone(), (true, v.size))),
                VarKind::Output => Some((v.name.clone(), (false, v.size))),
                _ => None,
            })
            .collect()
    };
    let want = io(first);
    let describe = |d: Option<&(bool, u64)>| match d {
        Some((true, size)) => format!("an input of {size} bytes"),
        Some((false, size)) => format!("an output of {size} bytes"),
        None => "absent".to_owned(),
    };
    for sg in others {
        let got = io(sg);
        if got == want {
            continue;
        }
        let name = want
            .keys()
            .chain(got.keys())
            .find(|n| want.get(*n) != got.get(*n))
            .cloned()
            .unwrap_or_default();
        return Err(NeffError::Io {
            problem: format!(
                "{} declares it {} but {} {}",
                first.name,
                describe(want.get(&name)),
                sg.name,
                describe(got.get(&name))
            ),
            tensor: name,
        });
    }
    Ok(())
}
