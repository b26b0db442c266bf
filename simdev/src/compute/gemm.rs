//! The matmul kernel of the `Matmul` instruction: `out[m][n] (+)= Σ_k stat[k][m] · mov[k][n]`
//! over row-major f32 matrices with any row stride ([`Layout`]: gathered buffers, or the tiles
//! in SBUF and PSUM themselves), register-blocked and allocation-free once the caller's
//! packing buffer has grown (the GEMM crate allocates its packing buffers on every call, which
//! an execution's steady state may not).
//!
//! # Rounding (the same as `matrixmultiply::sgemm`)
//! Every output element is one chain over `k` in order, starting from +0: `acc = fma(stat,
//! mov, acc)` — a fused multiply-add, one rounding — on a CPU with FMA (x86-64 with AVX2 and
//! FMA, detected at run time, and aarch64), otherwise `acc = acc + stat · mov` (two roundings).
//! The chain is then added to the old output when accumulating, and to +0 otherwise (so a
//! `-0` chain stores `+0`). The blocking only decides which elements are computed together,
//! never the order of one element's sum, so every shape gives the same bits.

#[cfg(target_arch = "x86_64")]
use super::simd::{self, Level};

/// Output rows computed together (12 vector accumulators; the last rows of `m` by 4, 2 and
/// 1).
const MB: usize = 6;
/// Output columns computed together: two 8-lane vectors, then one, then one at a time.
const NB: usize = 16;
/// Rows of `k` a packed panel of the moving matrix holds: every `Matmul` of the ISA (`K` is a
/// partition count, at most 128). A longer `k` (only [`super::matmul_f32`] can ask for one)
/// takes [`body_unpacked`].
const KC: usize = 128;

/// The heights of the blocks of output rows, widest first: [`MB`], then 4, 2 and 1.
const ROW_TILES: [usize; 4] = [MB, 4, 2, 1];
/// The widths of the groups of output columns, widest first: [`NB`], then 8 and 1.
const COLUMN_TILES: [usize; 3] = [NB, 8, 1];

/// Splits `0..n` into tiles of the `sizes` (widest first), each size as often as it still
/// fits, and calls `f(start, size)` for each tile in order. The blocking is only which outputs
/// are computed together: it never changes one output's chain.
#[inline(always)]
fn tiles(n: usize, sizes: &[usize], mut f: impl FnMut(usize, usize)) {
    let mut start = 0;
    for &size in sizes {
        while start + size <= n {
            f(start, size);
            start += size;
        }
    }
}

/// `acc + a · b`, fused or not.
#[inline(always)]
fn madd<const FUSED: bool>(a: f32, b: f32, acc: f32) -> f32 {
    if FUSED {
        a.mul_add(b, acc)
    } else {
        acc + a * b
    }
}

/// The result stored for chain `acc` over old value `old`.
#[inline(always)]
fn finish(acc: f32, old: f32, accumulate: bool) -> f32 {
    if accumulate { old + acc } else { acc + 0.0 }
}

/// Where each matrix starts in its slice and how far apart its rows are, in f32 elements:
/// row `r`, column `c` of `stat` is `stat[stat.0 + r · stat.1 + c]` (likewise `mov` and
/// `out`). Contiguous row-major buffers are [`Layout::contiguous`]; SBUF and PSUM tiles have
/// one row per partition.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Layout {
    /// `(start, row stride)` of the K × M stationary matrix.
    pub stat: (usize, usize),
    /// `(start, row stride)` of the K × N moving matrix.
    pub mov: (usize, usize),
    /// `(start, row stride)` of the M × N output.
    pub out: (usize, usize),
}

impl Layout {
    /// Row-major matrices from the start of their slices, rows `m`, `n` and `n` apart.
    pub(crate) const fn contiguous(m: usize, n: usize) -> Self {
        Self {
            stat: (0, m),
            mov: (0, n),
            out: (0, n),
        }
    }
}

/// `start + row · stride + col`, `None` on overflow.
fn at((start, stride): (usize, usize), row: usize, col: usize) -> Option<usize> {
    row.checked_mul(stride)?
        .checked_add(start)?
        .checked_add(col)
}

/// Whether all `rows` rows of `cols` elements at `place` lie in a slice of `len` elements.
fn fits(len: usize, place: (usize, usize), rows: usize, cols: usize) -> bool {
    rows == 0 || at(place, rows - 1, cols).is_some_and(|end| end <= len)
}

/// Stores the `R` × `C` chains `acc` at rows `m0..`, columns `n0..` of `out`; whether a value
/// stored is a NaN or an infinity.
#[inline(always)]
fn store<const R: usize, const C: usize>(
    acc: &[[f32; C]; R],
    l: Layout,
    (m0, n0): (usize, usize),
    out: &mut [f32],
    accumulate: bool,
) -> bool {
    let mut non_finite = false;
    for (i, row) in acc.iter().enumerate() {
        let Some(at) = at(l.out, m0 + i, n0) else {
            return non_finite;
        };
        if let Some(dst) = out.get_mut(at..).and_then(|d| d.first_chunk_mut::<C>()) {
            for (d, &c) in dst.iter_mut().zip(row) {
                *d = finish(c, *d, accumulate);
                non_finite |= !d.is_finite();
            }
        }
    }
    non_finite
}

/// The `R` × `C` chains at rows `m0..` of `stat` over the packed columns `panel` (row `kk` of
/// the panel is row `kk` of the moving matrix's `C` columns): each its own chain over `k` in
/// order, from +0.
#[inline(always)]
fn packed_block<const FUSED: bool, const R: usize, const C: usize>(
    stat: &[f32],
    (start, stride): (usize, usize),
    m0: usize,
    panel: &[[f32; C]],
) -> [[f32; C]; R] {
    let mut acc = [[0.0f32; C]; R];
    let mut at = start.saturating_add(m0);
    for b in panel {
        // Every row was checked by `gemm`: the `else` is never taken.
        let Some(a) = stat.get(at..).and_then(|a| a.first_chunk::<R>()) else {
            break;
        };
        for (row, &a) in acc.iter_mut().zip(a) {
            for (c, &b) in row.iter_mut().zip(b) {
                *c = madd::<FUSED>(a, b, *c);
            }
        }
        at = at.saturating_add(stride);
    }
    acc
}

/// The `C` columns from `n0` of every output row: the moving matrix's columns are packed
/// into a panel of the packing buffer (read once, then reused from L1 by every block of rows), then
/// the rows by [`MB`], 4, 2 and 1.
#[inline(always)]
fn packed_columns<const FUSED: bool, const C: usize>(
    stat: &[f32],
    mov: &[f32],
    (k, m, _): (usize, usize, usize),
    l: Layout,
    (n0, panel): (usize, &mut [[f32; C]]),
    out: &mut [f32],
    accumulate: bool,
) -> bool {
    let Some(panel) = panel.get_mut(..k) else {
        return false;
    };
    for (kk, dst) in panel.iter_mut().enumerate() {
        let src = at(l.mov, kk, n0).and_then(|at| mov.get(at..)?.first_chunk::<C>());
        match src {
            Some(src) => *dst = *src,
            None => return false,
        }
    }
    let panel = &*panel;
    let mut non_finite = false;
    tiles(m, &ROW_TILES, |m0, r| {
        non_finite |= match r {
            MB => {
                let acc = packed_block::<FUSED, MB, C>(stat, l.stat, m0, panel);
                store(&acc, l, (m0, n0), out, accumulate)
            }
            4 => {
                let acc = packed_block::<FUSED, 4, C>(stat, l.stat, m0, panel);
                store(&acc, l, (m0, n0), out, accumulate)
            }
            2 => {
                let acc = packed_block::<FUSED, 2, C>(stat, l.stat, m0, panel);
                store(&acc, l, (m0, n0), out, accumulate)
            }
            _ => {
                let acc = packed_block::<FUSED, 1, C>(stat, l.stat, m0, panel);
                store(&acc, l, (m0, n0), out, accumulate)
            }
        };
    });
    non_finite
}

/// The kernel for `k` ≤ [`KC`]: the columns by [`NB`], then 8, then one at a time, each
/// group packed once and swept by every block of rows. The caller checked that every row of
/// the three matrices of `l` lies in its slice.
#[inline(always)]
fn body<const FUSED: bool>(
    stat: &[f32],
    mov: &[f32],
    shape: (usize, usize, usize),
    l: Layout,
    out: &mut [f32],
    accumulate: bool,
    pack: &mut Vec<f32>,
) -> bool {
    if shape.0 > KC {
        return body_unpacked::<FUSED>(stat, mov, shape, l, out, accumulate);
    }
    // The panels, in `pack` (grown once, never zeroed again: every row a group uses is
    // packed before it is read).
    if pack.len() < KC * (NB + 8 + 1) {
        pack.resize(KC * (NB + 8 + 1), 0.0);
    }
    let (wide, rest) = pack.split_at_mut(KC * NB);
    let (eight, one) = rest.split_at_mut(KC * 8);
    let (wide, eight, one) = (
        wide.as_chunks_mut::<NB>().0,
        eight.as_chunks_mut::<8>().0,
        one.as_chunks_mut::<1>().0,
    );
    let mut non_finite = false;
    tiles(shape.2, &COLUMN_TILES, |n0, c| {
        non_finite |= match c {
            NB => {
                packed_columns::<FUSED, NB>(stat, mov, shape, l, (n0, &mut *wide), out, accumulate)
            }
            8 => {
                packed_columns::<FUSED, 8>(stat, mov, shape, l, (n0, &mut *eight), out, accumulate)
            }
            _ => packed_columns::<FUSED, 1>(stat, mov, shape, l, (n0, &mut *one), out, accumulate),
        };
    });
    non_finite
}

/// The `R` × `C` outputs at rows `m0..`, columns `n0..`, each its own chain over `k`, reading
/// the moving matrix in place ([`body_unpacked`]); the caller keeps them inside the shape
/// (nothing outside `out` is touched either way).
#[inline(always)]
fn block<const FUSED: bool, const R: usize, const C: usize>(
    stat: &[f32],
    mov: &[f32],
    (k, _, _): (usize, usize, usize),
    l: Layout,
    (m0, n0): (usize, usize),
    out: &mut [f32],
    accumulate: bool,
) -> bool {
    let mut acc = [[0.0f32; C]; R];
    for kk in 0..k {
        let (Some(sa), Some(sb)) = (at(l.stat, kk, m0), at(l.mov, kk, n0)) else {
            return false;
        };
        let (Some(a), Some(b)) = (
            stat.get(sa..).and_then(|a| a.first_chunk::<R>()),
            mov.get(sb..).and_then(|b| b.first_chunk::<C>()),
        ) else {
            return false;
        };
        for (row, &a) in acc.iter_mut().zip(a) {
            for (c, &b) in row.iter_mut().zip(b) {
                *c = madd::<FUSED>(a, b, *c);
            }
        }
    }
    store(&acc, l, (m0, n0), out, accumulate)
}

/// The columns of `R` rows from `m0`: blocks of [`NB`], then 8, then single columns.
#[inline(always)]
fn rows<const FUSED: bool, const R: usize>(
    stat: &[f32],
    mov: &[f32],
    shape: (usize, usize, usize),
    l: Layout,
    m0: usize,
    out: &mut [f32],
    accumulate: bool,
) -> bool {
    let mut non_finite = false;
    tiles(shape.2, &COLUMN_TILES, |n0, c| {
        non_finite |= match c {
            NB => block::<FUSED, R, NB>(stat, mov, shape, l, (m0, n0), out, accumulate),
            8 => block::<FUSED, R, 8>(stat, mov, shape, l, (m0, n0), out, accumulate),
            _ => block::<FUSED, R, 1>(stat, mov, shape, l, (m0, n0), out, accumulate),
        };
    });
    non_finite
}

/// The kernel for `k` > [`KC`] (longer than any `Matmul`: only [`super::matmul_f32`] can ask
/// for it), reading the moving matrix where it lies, a block of rows at a time.
#[inline(always)]
fn body_unpacked<const FUSED: bool>(
    stat: &[f32],
    mov: &[f32],
    shape: (usize, usize, usize),
    l: Layout,
    out: &mut [f32],
    accumulate: bool,
) -> bool {
    let mut non_finite = false;
    tiles(shape.1, &ROW_TILES, |m0, r| {
        non_finite |= match r {
            MB => rows::<FUSED, MB>(stat, mov, shape, l, m0, out, accumulate),
            4 => rows::<FUSED, 4>(stat, mov, shape, l, m0, out, accumulate),
            2 => rows::<FUSED, 2>(stat, mov, shape, l, m0, out, accumulate),
            _ => rows::<FUSED, 1>(stat, mov, shape, l, m0, out, accumulate),
        };
    });
    non_finite
}

/// [`body`] compiled for AVX2 and FMA.
///
/// # Safety
/// The CPU must support AVX2 and FMA.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn body_fma(
    stat: &[f32],
    mov: &[f32],
    shape: (usize, usize, usize),
    l: Layout,
    out: &mut [f32],
    accumulate: bool,
    pack: &mut Vec<f32>,
) -> bool {
    body::<true>(stat, mov, shape, l, out, accumulate, pack)
}

/// `out (+)= statᵀ · mov` for `stat` K × M, `mov` K × N and `out` M × N, placed in their
/// slices as `l` says, with the rounding of the module doc; whether a value stored is a NaN or
/// an infinity. The caller checked that every row lies in its slice (nothing is computed when
/// a row of `stat` or `mov` does not, and an element outside `out` is never touched).
///
/// The kernel is the widest this CPU runs ([`simd::level`]): for `k` ≤ [`KC`] (every
/// `Matmul`), AVX-512F ([`avx512`], `n` ≥ 16, reading the moving matrix where it lies) or AVX2
/// and FMA ([`avx2`], `n` ≥ 8, packing it into `pack`, grown once, never shrunk); for `n` < 8
/// and any `k`, AVX2 and FMA down the output rows ([`avx2::narrow`]); otherwise the portable
/// kernel (compiled with AVX2 and FMA where the CPU has them; it packs into `pack` too). All
/// compute the same chains.
pub(super) fn gemm(
    stat: &[f32],
    mov: &[f32],
    shape: (usize, usize, usize),
    l: Layout,
    out: &mut [f32],
    accumulate: bool,
    pack: &mut Vec<f32>,
) -> bool {
    let (k, m, n) = shape;
    if !fits(stat.len(), l.stat, k, m) || !fits(mov.len(), l.mov, k, n) {
        return false;
    }
    #[cfg(target_arch = "x86_64")]
    {
        let level = simd::level();
        // Narrower than one vector (a batch-1 layer has n = 1), a kernel vectorised along the
        // columns would compute a whole vector of them per row for the few stored: the
        // narrow kernel is vectorised down the rows instead. Same chains either way.
        if level >= Level::Avx512 && k <= KC && n >= AVX512_MIN_N {
            // SAFETY: AVX-512F was detected on this CPU (`simd::level` never answers a level
            // the CPU lacks); `avx512::body` has no other requirement.
            return unsafe { avx512::body(stat, mov, shape, l, out, accumulate) };
        }
        if level >= Level::Avx2Fma && k <= KC && n >= AVX2_MIN_N {
            // SAFETY: AVX2 and FMA were detected on this CPU (as above); `avx2::body` has no
            // other requirement.
            return unsafe { avx2::body(stat, mov, shape, l, out, accumulate, pack) };
        }
        if level >= Level::Avx2Fma && n < AVX2_MIN_N {
            // SAFETY: AVX2 and FMA were detected on this CPU (as above); `avx2::narrow` has no
            // other requirement.
            return unsafe { avx2::narrow(stat, mov, shape, l, out, accumulate) };
        }
        if level >= Level::Avx2Fma {
            // SAFETY: AVX2 and FMA were detected on this CPU (as above); `body_fma` has no
            // other requirement (it is safe code compiled with those features).
            return unsafe { body_fma(stat, mov, shape, l, out, accumulate, pack) };
        }
        body::<false>(stat, mov, shape, l, out, accumulate, pack)
    }
    #[cfg(target_arch = "aarch64")]
    return body::<true>(stat, mov, shape, l, out, accumulate, pack);
    #[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
    return body::<false>(stat, mov, shape, l, out, accumulate, pack);
}

/// The kernels the tests compare, each run directly whatever the shape (the narrow shapes
/// [`gemm`] sends elsewhere included); `None` when this CPU lacks the kernel's instructions
/// or `k` > [`KC`] (the vector kernels).
#[cfg(test)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Kernel {
    /// The portable kernel with fused chains: the reference the vector kernels must match.
    PortableFused,
    /// [`avx2`]'s kernel for `n` ≥ 8.
    Avx2,
    /// [`avx2`]'s kernel for `n` < 8.
    Avx2Narrow,
    /// [`avx512`].
    Avx512,
}

#[cfg(test)]
pub(super) fn gemm_with(
    kernel: Kernel,
    stat: &[f32],
    mov: &[f32],
    shape: (usize, usize, usize),
    l: Layout,
    out: &mut [f32],
    accumulate: bool,
) -> Option<bool> {
    let (k, m, n) = shape;
    #[cfg(target_arch = "x86_64")]
    {
        let supported = simd::supported();
        let needs = match kernel {
            Kernel::PortableFused => Level::Avx2Fma,
            Kernel::Avx2 | Kernel::Avx2Narrow => Level::Avx2Fma,
            Kernel::Avx512 => Level::Avx512,
        };
        let any_k = matches!(kernel, Kernel::PortableFused | Kernel::Avx2Narrow);
        if !supported.contains(&needs) || (!any_k && k > KC) {
            return None;
        }
        if !fits(stat.len(), l.stat, k, m) || !fits(mov.len(), l.mov, k, n) {
            return Some(false);
        }
        Some(match kernel {
            // SAFETY: AVX2 and FMA are supported (checked above); no other requirement.
            Kernel::PortableFused => unsafe {
                body_fma(stat, mov, shape, l, out, accumulate, &mut Vec::new())
            },
            // SAFETY: as above.
            Kernel::Avx2 => unsafe {
                avx2::body(stat, mov, shape, l, out, accumulate, &mut Vec::new())
            },
            // SAFETY: as above.
            Kernel::Avx2Narrow => unsafe { avx2::narrow(stat, mov, shape, l, out, accumulate) },
            // SAFETY: AVX-512F is supported (checked above); no other requirement.
            Kernel::Avx512 => unsafe { avx512::body(stat, mov, shape, l, out, accumulate) },
        })
    }
    #[cfg(target_arch = "aarch64")]
    {
        if kernel != Kernel::PortableFused {
            return None;
        }
        if !fits(stat.len(), l.stat, k, m) || !fits(mov.len(), l.mov, k, n) {
            return Some(false);
        }
        Some(body::<true>(
            stat,
            mov,
            shape,
            l,
            out,
            accumulate,
            &mut Vec::new(),
        ))
    }
    #[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
    {
        let _ = (kernel, stat, mov, shape, l, out, accumulate, k, m, n);
        None
    }
}

/// Fewest output columns the AVX-512 kernel is used for (one full 16-lane vector).
#[cfg(target_arch = "x86_64")]
const AVX512_MIN_N: usize = 16;
/// Fewest output columns the AVX2 kernel is used for (one full 8-lane vector).
#[cfg(target_arch = "x86_64")]
const AVX2_MIN_N: usize = 8;

#[cfg(target_arch = "x86_64")]
mod avx2;
#[cfg(target_arch = "x86_64")]
mod avx512;
