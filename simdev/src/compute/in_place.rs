//! fp32 results computed where their tiles lie in SBUF and PSUM, without a result buffer and a
//! scatter (the shapes of the layer builder's programs): a `Matmul` writes its PSUM tile
//! directly, an `Activation` from one space into the other reads and writes the tiles
//! themselves, row by row, and a `Transpose` writes its destination rows in place, reading an
//! fp32 source where it lies unless it overlaps the destination (then it is gathered first, so
//! every source value is read before any is written). A matmul's kernel reads fp32 SBUF
//! operands, stationary and moving, from SBUF itself (SBUF lies on huge pages, see `pages`:
//! walking down the partitions costs no TLB misses); other operands are gathered.
//!
//! Each computes exactly what the gather path computes: the same kernel with the same chains
//! for the matmul ([`gemm::Layout`] places its output on the PSUM tile's rows), the same f32
//! operations in
//! the same order for the others, and the same [`Effect::non_finite`](super::Effect) test of the
//! values stored. An op it does not cover (bf16, an offset that is not a multiple of 4, operands
//! that may overlap, a big-endian host, a buffer that does not hold an f32 view) answers `None`
//! and takes the gather path. Every range is checked again here before it is used: a tile that
//! does not lie in its buffer answers `None` too, never a panic.

use shared::isa::{ActFunc, Dt, Space, Tile};
use zerocopy::FromBytes;

#[cfg(target_arch = "x86_64")]
use super::simd::{self, Level};
use super::{
    ComputeState, ExecError, Scalar, Scratch, activate, gemm, idx, max_nan, partition_stride,
};

#[cfg(target_arch = "x86_64")]
mod avx2;

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
    let stride = idx(partition_stride(tile.space)) / 4;
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
            (Space::Sbuf, Space::Psum) => Some((
                floats(self.sbuf.as_deref()?)?,
                floats_mut(self.psum.as_deref_mut()?)?,
            )),
            (Space::Psum, Space::Sbuf) => Some((
                floats(self.psum.as_deref()?)?,
                floats_mut(self.sbuf.as_deref_mut()?)?,
            )),
            _ => None,
        }
    }
}

/// A matmul operand: `Ok(true)` when it is an fp32 SBUF tile, read where it lies; `Ok(false)`
/// once gathered into `into` as `len` values; the gather's error; `None` (not covered) when
/// the gather gave another number of values.
fn in_place_or_gathered(
    state: &mut ComputeState,
    t: &Tile,
    into: &mut Vec<f32>,
    len: usize,
) -> Option<Result<bool, ExecError>> {
    if t.space == Space::Sbuf && place(t, usize::MAX).is_some() {
        return Some(Ok(true));
    }
    if let Err(e) = state.gather_into(t, into) {
        return Some(Err(e));
    }
    (into.len() == len).then_some(Ok(false))
}

/// `Matmul` of operands read where they lie (fp32 SBUF tiles) or gathered (into `s.a` the
/// stationary, `s.b` the moving) straight into its fp32 PSUM `dst`, without a result buffer or
/// a scatter; whether a value stored is not finite. `None`: not covered (see the module doc).
pub(super) fn matmul(
    state: &mut ComputeState,
    s: &mut Scratch,
    dst: &Tile,
    (stationary, moving): (&Tile, &Tile),
    accumulate: bool,
) -> Option<Result<bool, ExecError>> {
    if dst.space != Space::Psum || place(dst, usize::MAX).is_none() {
        return None;
    }
    let (k, m, n) = (
        idx(stationary.partitions),
        idx(stationary.elems),
        idx(moving.elems),
    );
    // Each operand where it lies when it is an fp32 SBUF tile, else gathered. The stationary
    // operand's K-loop steps from partition to partition (on huge pages, see `pages`, that
    // costs no TLB misses); the kernel reads the moving operand's rows in place, or packs its
    // columns group by group below AVX-512.
    let stat_direct = match in_place_or_gathered(state, stationary, &mut s.a, k * m)? {
        Ok(direct) => direct,
        Err(e) => return Some(Err(e)),
    };
    let direct = match in_place_or_gathered(state, moving, &mut s.b, k * n)? {
        Ok(direct) => direct,
        Err(e) => return Some(Err(e)),
    };
    let (sbuf, psum) = state.split(Space::Sbuf, Space::Psum)?;
    let out = place(dst, psum.len())?;
    let (mov, at_mov) = if direct {
        (sbuf, place(moving, sbuf.len())?)
    } else {
        (&s.b[..], (0, n))
    };
    let (stat, at_stat) = if stat_direct {
        (sbuf, place(stationary, sbuf.len())?)
    } else {
        (&s.a[..], (0, m))
    };
    let layout = gemm::Layout {
        stat: at_stat,
        mov: at_mov,
        out,
    };
    Some(Ok(gemm::gemm(
        stat,
        mov,
        (k, m, n),
        layout,
        psum,
        accumulate,
        &mut s.pack,
    )))
}

/// The two matrices of a transpose: the source read, the destination written, in one buffer
/// (tiles of one space that do not overlap) or in two.
pub(super) trait Planes {
    /// The buffer the source lies in.
    fn src(&self) -> &[f32];
    /// The buffer the destination lies in.
    fn dst(&mut self) -> &mut [f32];
    /// Both buffers as raw parts for a vector loop, `(source, its length, destination, its
    /// length)`, derived from the one borrow of `self` this call takes (in one buffer, both
    /// pointers are the same pointer): valid for reads of the source and writes of the
    /// destination until `self` is used again.
    fn raw(&mut self) -> (*const f32, usize, *mut f32, usize);
}

/// Source and destination in the same buffer (their ranges do not overlap).
struct Same<'a>(&'a mut [f32]);

impl Planes for Same<'_> {
    fn src(&self) -> &[f32] {
        self.0
    }
    fn dst(&mut self) -> &mut [f32] {
        self.0
    }
    fn raw(&mut self) -> (*const f32, usize, *mut f32, usize) {
        let p = self.0.as_mut_ptr();
        (p.cast_const(), self.0.len(), p, self.0.len())
    }
}

/// Source and destination in different buffers.
struct Apart<'a>(&'a [f32], &'a mut [f32]);

impl Planes for Apart<'_> {
    fn src(&self) -> &[f32] {
        self.0
    }
    fn dst(&mut self) -> &mut [f32] {
        self.1
    }
    fn raw(&mut self) -> (*const f32, usize, *mut f32, usize) {
        (
            self.0.as_ptr(),
            self.0.len(),
            self.1.as_mut_ptr(),
            self.1.len(),
        )
    }
}

/// Whether two tiles share a byte (same space, a common partition and overlapping byte
/// ranges in it).
fn overlap(a: &Tile, b: &Tile) -> bool {
    let bytes = |t: &Tile| {
        let start = u64::from(t.offset);
        start..start + u64::from(t.elems) * u64::from(t.dtype.size())
    };
    let parts = |t: &Tile| {
        let start = u64::from(t.partition_start);
        start..start + u64::from(t.partitions)
    };
    let meet =
        |x: std::ops::Range<u64>, y: std::ops::Range<u64>| x.start < y.end && y.start < x.end;
    a.space == b.space && meet(parts(a), parts(b)) && meet(bytes(a), bytes(b))
}

/// The edges of a transpose, one value at a time: `dst[j][i] = src[i][j]` for `i` in `rows`
/// and `j` in `cols` (layouts as for [`transpose_planes`]); whether a value stored is a NaN
/// or an infinity. `None` when a row does not lie in its buffer.
pub(super) fn transpose_cells(
    planes: &mut impl Planes,
    (src_start, src_stride): (usize, usize),
    (dst_start, dst_stride): (usize, usize),
    rows: std::ops::Range<usize>,
    cols: std::ops::Range<usize>,
) -> Option<bool> {
    let mut non_finite = false;
    for j in cols {
        for i in rows.clone() {
            let x = *planes.src().get(src_start + i * src_stride + j)?;
            non_finite |= !x.is_finite();
            *planes.dst().get_mut(dst_start + j * dst_stride + i)? = x;
        }
    }
    Some(non_finite)
}

/// `dst[j][i] = src[i][j]` for the `p` × `f` source at `at_src` and the `f` × `p` destination
/// at `at_dst` of `planes` (each `(start, row stride)`), at the widest level this CPU runs;
/// whether a value stored is a NaN or an infinity. `None` (nothing promised about the
/// destination) when a row does not lie in its buffer.
fn transpose_planes(
    planes: &mut impl Planes,
    (p, f): (usize, usize),
    at_src: (usize, usize),
    at_dst: (usize, usize),
) -> Option<bool> {
    #[cfg(target_arch = "x86_64")]
    if simd::level() >= Level::Avx2Fma {
        // SAFETY: AVX2 and FMA were detected on this CPU (`simd::level` never answers a level
        // the CPU lacks); `avx2::transpose` has no other requirement.
        return unsafe { avx2::transpose(planes, (p, f), at_src, at_dst) };
    }
    // Blocks of `TB` × `TB`: `TB` values of each of `TB` source rows go to the next slots of
    // `TB` destination rows; the edges one value at a time.
    const TB: usize = 8;
    let src_at = |i: usize, j: usize| at_src.0 + i * at_src.1 + j;
    let dst_at = |j: usize, i: usize| at_dst.0 + j * at_dst.1 + i;
    let mut non_finite = false;
    let mut block = [[0.0f32; TB]; TB];
    let mut j = 0;
    while j + TB <= f {
        let mut i = 0;
        while i + TB <= p {
            for (ii, row) in block.iter_mut().enumerate() {
                *row = *planes.src().get(src_at(i + ii, j)..)?.first_chunk::<TB>()?;
                non_finite |= any_non_finite(row);
            }
            for jj in 0..TB {
                let y = planes
                    .dst()
                    .get_mut(dst_at(j + jj, i)..)?
                    .first_chunk_mut::<TB>()?;
                for (y, row) in y.iter_mut().zip(&block) {
                    *y = row[jj];
                }
            }
            i += TB;
        }
        non_finite |= transpose_cells(planes, at_src, at_dst, i..p, j..j + TB)?;
        j += TB;
    }
    Some(non_finite | transpose_cells(planes, at_src, at_dst, 0..p, j..f)?)
}

/// `Transpose` into an fp32 tile; whether a value stored is not finite. An fp32 source that
/// does not overlap the destination is read where it lies; any other source is first read
/// (widened to f32) into `s.a`, so a destination may overlap it. Every destination row is
/// written in place. `None`: not covered (see the module doc).
pub(super) fn transpose(
    state: &mut ComputeState,
    s: &mut Scratch,
    (dst, src): (&Tile, &Tile),
) -> Option<Result<bool, ExecError>> {
    place(dst, usize::MAX)?;
    let (p, f) = (idx(src.partitions), idx(src.elems));
    if f == 0 {
        return None;
    }
    if place(src, usize::MAX).is_some() && !overlap(src, dst) {
        let non_finite = if src.space == dst.space {
            let buf = floats_mut(state.buffer(dst.space))?;
            let (at_src, at_dst) = (place(src, buf.len())?, place(dst, buf.len())?);
            transpose_planes(&mut Same(buf), (p, f), at_src, at_dst)
        } else {
            let (from, to) = state.split(src.space, dst.space)?;
            let (at_src, at_dst) = (place(src, from.len())?, place(dst, to.len())?);
            transpose_planes(&mut Apart(from, to), (p, f), at_src, at_dst)
        };
        return non_finite.map(Ok);
    }
    if let Err(e) = state.gather_into(src, &mut s.a) {
        return Some(Err(e));
    }
    if s.a.len() != p * f {
        return None;
    }
    let to = floats_mut(state.buffer(dst.space))?;
    let at_dst = place(dst, to.len())?;
    transpose_planes(&mut Apart(&s.a, to), (p, f), (0, f), at_dst).map(Ok)
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

/// Rows shorter than this are activated by [`activate_narrow`].
const NARROW: usize = 8;

/// [`activate_row`] over rows `p` < `biases.len()` of a narrow tile (fewer than [`NARROW`]
/// values per row: the digits MLP's at batch 1 hold one), from the `elems`-value source at
/// `at_src` of `from` into the destination at `at_dst` of `to`, with bias `biases[p]`: the
/// same operations in the same order, one loop per function over the rows. The vector path's
/// set-up per row (broadcasts, chunking, its non-finite test) cost about 45 instructions for a
/// row of one value (callgrind). A row that does not lie in its buffer is skipped, as in the
/// other paths. Whether a value stored is a NaN or an infinity.
fn activate_narrow(
    src: (&[f32], (usize, usize)),
    dst: (&mut [f32], (usize, usize)),
    elems: usize,
    biases: &[f32],
    (func, scale): (ActFunc, f32),
) -> bool {
    match func {
        ActFunc::Identity => narrow_rows(src, dst, elems, biases, |x, b| x * scale + b),
        ActFunc::Relu => narrow_rows(src, dst, elems, biases, |x, b| max_nan(x * scale + b, 0.0)),
        f => narrow_rows(src, dst, elems, biases, |x, b| activate(f, x * scale + b)),
    }
}

/// `dst[p][i] = f(src[p][i], biases[p])` over the rows of [`activate_narrow`]; whether a value
/// stored is not finite.
#[inline(always)]
fn narrow_rows(
    (from, at_src): (&[f32], (usize, usize)),
    (to, at_dst): (&mut [f32], (usize, usize)),
    elems: usize,
    biases: &[f32],
    f: impl Fn(f32, f32) -> f32,
) -> bool {
    let mut non_finite = false;
    for (p, &bias) in biases.iter().enumerate() {
        let (x, y) = (row(from, at_src, p, elems), row_mut(to, at_dst, p, elems));
        for (y, &x) in y.iter_mut().zip(x) {
            *y = f(x, bias);
            non_finite |= !y.is_finite();
        }
    }
    non_finite
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
    let biases = s.c.get(..idx(dst.partitions)).unwrap_or(&s.c);
    if elems < NARROW {
        return Some(Ok(activate_narrow(
            (from, at_src),
            (to, at_dst),
            elems,
            biases,
            (func, scale),
        )));
    }
    #[cfg(target_arch = "x86_64")]
    if simd::level() >= Level::Avx2Fma {
        let (src, dst) = ((from, at_src), (&mut *to, at_dst));
        // SAFETY: AVX2 was detected on this CPU (as for the transpose);
        // `avx2::activate_rows` has no other requirement.
        if let Some(nf) = unsafe { avx2::activate_rows(src, dst, elems, biases, (func, scale)) } {
            return Some(Ok(nf));
        }
    }
    let mut non_finite = false;
    for (p, &b) in biases.iter().enumerate() {
        let (x, y) = (row(from, at_src, p, elems), row_mut(to, at_dst, p, elems));
        activate_row(x, y, b, func, scale);
        non_finite |= any_non_finite(y);
    }
    Some(Ok(non_finite))
}
