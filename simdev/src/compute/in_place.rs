//! fp32 ops computed where their tiles lie in SBUF and PSUM, without gathering the operands into
//! the scratch buffers and scattering the result back: a `Matmul` of SBUF operands into PSUM,
//! an `Activation` from one space into the other, and a `Transpose` between ranges of one space
//! that do not overlap (the shapes of the layer builder's programs).
//!
//! Each computes exactly what the gather path computes: the same kernel with the same chains
//! for the matmul ([`gemm::Layout`] places it on the tiles' rows), the same f32 operations in
//! the same order for the others, and the same [`Effect::non_finite`](super::Effect) test of the
//! values stored. An op it does not cover (bf16, an offset that is not a multiple of 4, operands
//! that may overlap, a big-endian host, a buffer that does not hold an f32 view) answers `None`
//! and takes the gather path. Every range is checked again here before it is used: a tile that
//! does not lie in its buffer answers `None` too, never a panic.

use shared::isa::{ActFunc, Dt, Space, Tile};
use zerocopy::FromBytes;

use super::{
    ComputeState, ExecError, Scalar, Scratch, activate, gemm, idx, max_nan, partition_bytes,
};

/// `bytes` as f32 (native order: only used on little-endian hosts), when aligned.
fn floats(bytes: &[u8]) -> Option<&[f32]> {
    <[f32]>::ref_from_bytes(bytes).ok()
}

/// `bytes` as mutable f32 (native order: only used on little-endian hosts), when aligned.
fn floats_mut(bytes: &mut [u8]) -> Option<&mut [f32]> {
    <[f32]>::mut_from_bytes(bytes).ok()
}

/// `(start, row stride)` in f32 of an fp32 `tile` at a 4-aligned offset, when its rows lie in
/// a buffer of `len` f32.
fn place(tile: &Tile, len: usize) -> Option<(usize, usize)> {
    if !cfg!(target_endian = "little") || tile.dtype != Dt::F32 || !tile.offset.is_multiple_of(4) {
        return None;
    }
    let stride = idx(partition_bytes(tile.space)) / 4;
    let start = idx(tile.partition_start)
        .checked_mul(stride)?
        .checked_add(idx(tile.offset) / 4)?;
    let last = idx(tile.partitions)
        .checked_sub(1)?
        .checked_mul(stride)?
        .checked_add(start)?
        .checked_add(idx(tile.elems))?;
    (last <= len).then_some((start, stride))
}

/// Row `p` (`elems` values) of a matrix at `(start, stride)` of `buf`.
fn row(buf: &[f32], (start, stride): (usize, usize), p: usize, elems: usize) -> &[f32] {
    let at = start + p * stride;
    buf.get(at..at + elems).unwrap_or_default()
}

/// Row `p` (`elems` values) of a matrix at `(start, stride)` of `buf`, mutable.
fn row_mut(buf: &mut [f32], (start, stride): (usize, usize), p: usize, elems: usize) -> &mut [f32] {
    let at = start + p * stride;
    buf.get_mut(at..at + elems).unwrap_or_default()
}

/// Whether any of `values` is a NaN or an infinity.
fn any_non_finite(values: &[f32]) -> bool {
    values.iter().fold(false, |acc, v| acc | !v.is_finite())
}

impl ComputeState {
    /// SBUF and PSUM, allocated (zeroed) on first use: the f32 views of `(from, to)` spaces,
    /// which must differ.
    fn split(&mut self, from: Space, to: Space) -> Option<(&[f32], &mut [f32])> {
        self.buffer(Space::Sbuf);
        self.buffer(Space::Psum);
        match (from, to) {
            (Space::Sbuf, Space::Psum) => Some((floats(&self.sbuf)?, floats_mut(&mut self.psum)?)),
            (Space::Psum, Space::Sbuf) => Some((floats(&self.psum)?, floats_mut(&mut self.sbuf)?)),
            _ => None,
        }
    }
}

/// `Matmul` of SBUF operands into its PSUM `dst`, on the tiles themselves; whether a value
/// stored is not finite. `None`: not covered (see the module doc).
pub(super) fn matmul(
    state: &mut ComputeState,
    dst: &Tile,
    stationary: &Tile,
    moving: &Tile,
    accumulate: bool,
) -> Option<bool> {
    if (stationary.space, moving.space, dst.space) != (Space::Sbuf, Space::Sbuf, Space::Psum) {
        return None;
    }
    let (sbuf, psum) = state.split(Space::Sbuf, Space::Psum)?;
    let layout = gemm::Layout {
        stat: place(stationary, sbuf.len())?,
        mov: place(moving, sbuf.len())?,
        out: place(dst, psum.len())?,
    };
    let (k, m, n) = (
        idx(stationary.partitions),
        idx(stationary.elems),
        idx(moving.elems),
    );
    gemm::gemm(sbuf, sbuf, (k, m, n), layout, psum, accumulate);
    Some((0..m).any(|p| any_non_finite(row(psum, layout.out, p, n))))
}

/// `dst[p][i] = func(src[p][i] · scale + bias[p])` from one row to another, each function in
/// its own loop (the gather path's `activate_rows`).
fn activate_row(src: &[f32], dst: &mut [f32], bias: f32, func: ActFunc, scale: f32) {
    match func {
        ActFunc::Identity => {
            for (y, &x) in dst.iter_mut().zip(src) {
                *y = x * scale + bias;
            }
        }
        ActFunc::Relu => {
            for (y, &x) in dst.iter_mut().zip(src) {
                *y = max_nan(x * scale + bias, 0.0);
            }
        }
        f => {
            for (y, &x) in dst.iter_mut().zip(src) {
                *y = activate(f, x * scale + bias);
            }
        }
    }
}

/// `Activation` from a tile of one space into a tile of the other, on the tiles themselves;
/// whether a value stored is not finite. `None`: not covered (see the module doc). The caller
/// checked the activation tables.
pub(super) fn activation(
    state: &mut ComputeState,
    s: &mut Scratch,
    (dst, src): (&Tile, &Tile),
    func: ActFunc,
    scale: f32,
    bias: Scalar,
) -> Option<Result<bool, ExecError>> {
    if src.space == dst.space || place(src, usize::MAX).is_none() {
        return None;
    }
    if let Err(e) = state.scalars_into(bias, dst, &mut s.c) {
        return Some(Err(e));
    }
    let (from, to) = state.split(src.space, dst.space)?;
    let (at_src, at_dst) = (place(src, from.len())?, place(dst, to.len())?);
    let elems = idx(src.elems);
    let mut non_finite = false;
    for (p, &b) in s.c.iter().enumerate().take(idx(dst.partitions)) {
        let y = row_mut(to, at_dst, p, elems);
        activate_row(row(from, at_src, p, elems), y, b, func, scale);
        non_finite |= any_non_finite(y);
    }
    Some(Ok(non_finite))
}

/// Whether the byte ranges of `a` and `b` (in one space) may share a byte.
fn overlap(a: &Tile, b: &Tile) -> bool {
    let span = |t: &Tile| {
        let bytes = u64::from(t.elems) * u64::from(t.dtype.size());
        (
            u64::from(t.partition_start)..u64::from(t.partition_start) + u64::from(t.partitions),
            u64::from(t.offset)..u64::from(t.offset) + bytes,
        )
    };
    let ((pa, ba), (pb, bb)) = (span(a), span(b));
    pa.start < pb.end && pb.start < pa.end && ba.start < bb.end && bb.start < ba.end
}

/// `Transpose` between tiles of one space that do not overlap, on the tiles themselves;
/// whether a value stored is not finite. `None`: not covered (see the module doc).
pub(super) fn transpose(state: &mut ComputeState, dst: &Tile, src: &Tile) -> Option<bool> {
    if src.space != dst.space || overlap(src, dst) {
        return None;
    }
    let buf = floats_mut(state.buffer(src.space))?;
    let (at_src, at_dst) = (place(src, buf.len())?, place(dst, buf.len())?);
    let (rows, elems) = (idx(src.partitions), idx(src.elems));
    // A source row (at most 128 values, decode's rule) read whole, then written as a column.
    let mut line = [0f32; 128];
    let line = line.get_mut(..elems)?;
    let mut non_finite = false;
    for i in 0..rows {
        for (l, &v) in line.iter_mut().zip(row(buf, at_src, i, elems)) {
            *l = v;
        }
        non_finite |= any_non_finite(line);
        for (j, &v) in line.iter().enumerate() {
            if let Some(slot) = buf.get_mut(at_dst.0 + j * at_dst.1 + i) {
                *slot = v;
            }
        }
    }
    Some(non_finite)
}
