//! The I/O of the real matmul NEFFs (`scenarios/data/neff/`): inputs `x`, `y` and output
//! `output0`, one tensor each, bound in their sets by those names.

use runtime::{Placement, Runtime, Tensor, TensorSet};

/// matmul_small's tensor sizes in bytes (x[128,256], y[256,128], output0[128,128], float16).
pub const SMALL: (u64, u64, u64) = (128 * 256 * 2, 256 * 128 * 2, 128 * 128 * 2);

/// One tensor per I/O of a matmul NEFF and the two sets that bind them.
pub struct MatmulIo {
    /// Input `x`.
    pub x: Tensor,
    /// Input `y`.
    pub y: Tensor,
    /// Output `output0`.
    pub out: Tensor,
    /// `x` and `y`.
    pub ins: TensorSet,
    /// `output0`.
    pub outs: TensorSet,
}

/// Allocates the tensors where `placement` says, of `sizes` (x, y, output0) bytes.
///
/// # Panics
/// When an allocation fails (a test helper).
pub fn io(rt: &Runtime, placement: Placement, sizes: (u64, u64, u64)) -> MatmulIo {
    let x = rt.tensor_allocate(placement, sizes.0, "x").unwrap();
    let y = rt.tensor_allocate(placement, sizes.1, "y").unwrap();
    let out = rt.tensor_allocate(placement, sizes.2, "output0").unwrap();
    let (mut ins, mut outs) = (TensorSet::new(), TensorSet::new());
    ins.add("x", &x);
    ins.add("y", &y);
    outs.add("output0", &out);
    MatmulIo {
        x,
        y,
        out,
        ins,
        outs,
    }
}
