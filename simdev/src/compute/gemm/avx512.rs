//! The AVX-512F kernel, for `k` ≤ [`KC`] (every `Matmul`): the same chains as the portable
//! kernel (each output one fused multiply-add chain over `k` in order from +0, then the
//! finish of [`super::finish`]), 16 lanes at a time.
//!
//! The moving matrix is swept by panels of [`PANEL_VECTORS`] vectors (64 columns; the last
//! panel as many vectors as its columns need: a batch of 360 computes 5 panels of 64 and one of
//! 48, not 384 columns), each panel by blocks of output rows sized so that a block keeps
//! [`ACCUMULATORS`] vector registers accumulating (6 rows of 4 vectors, 8 of 3, 12 of 2, 24 of
//! 1; the last rows of a panel by 8, 4, 2 and 1). Per step of `k` a block loads its vectors of
//! the moving row and broadcasts one stationary value per row, each broadcast feeding every
//! vector of its row: the wider the panel, the fewer broadcasts per fused multiply-add. On
//! Zen 4 (whose 512-bit operations occupy both vector pipes) 8 rows of 2 vectors — one
//! broadcast per two FMAs — ran the digits MLP's 64 × 64 × 360 layer at 0.87x the GEMM
//! crate's AVX2 kernel, 6 rows of 4 at 0.90x (`cargo bench -p tests --bench matmul`, medians
//! of six interleaved runs; the other shapes there within the noise).
//!
//! The lanes past the matrix's last column are masked off: they load zeros, are computed and
//! never stored; the results are stored through a mask. The moving matrix is not packed first:
//! SBUF partitions are 15 cache lines more than 64 KiB apart
//! ([`super::super::partition_stride`]), so a panel's rows fall in different cache sets and
//! stay in L1 from one block of rows to the next, and the copy cost more than it saved
//! (measured: the digits network's three matmuls about 5 % faster without it).

use std::arch::x86_64::{
    __m512, __mmask16, _CMP_UNORD_Q, _mm512_add_ps, _mm512_fmadd_ps, _mm512_mask_cmp_ps_mask,
    _mm512_mask_storeu_ps, _mm512_maskz_loadu_ps, _mm512_mul_ps, _mm512_set1_ps, _mm512_setzero_ps,
};

use super::{KC, Layout, at};

/// Lanes of a vector.
const LANES: usize = 16;
/// Vectors of columns of a full panel.
const PANEL_VECTORS: usize = 4;
/// Columns of a full panel.
const PANEL: usize = PANEL_VECTORS * LANES;
/// Vector registers a block of rows accumulates in: `rows · vectors` of the 32 (the others
/// hold the moving row's vectors and the broadcast stationary value).
const ACCUMULATORS: usize = 24;

/// Lanes `0..lanes` (at most 16) of a vector.
const fn lane_mask(lanes: usize) -> __mmask16 {
    if lanes >= 16 {
        0xFFFF
    } else {
        (1u16 << lanes) - 1
    }
}

/// The `R` × `V · LANES` chains at rows `m0..` of `stat` over the `V` vectors of columns
/// from `n0` of the `k` × `n` moving matrix at `(start, stride)` of `mov`, read where it lies
/// (`width` ≤ `V · LANES` of those columns; the lanes past them load zeros and are never
/// stored): each its own chain over `k` in order, from +0.
#[inline]
#[target_feature(enable = "avx512f")]
fn block<const R: usize, const V: usize>(
    stat: &[f32],
    (start, stride): (usize, usize),
    m0: usize,
    (mov, place, k): (&[f32], (usize, usize), usize),
    (n0, width): (usize, usize),
) -> [[__m512; V]; R] {
    let mut acc = [[_mm512_setzero_ps(); V]; R];
    // Vector `h` loads the lanes of columns `16 · h ..` below `width` (none when there are
    // none): computed once, outside the loop.
    let mut masks = [0; V];
    for (h, mask) in masks.iter_mut().enumerate() {
        *mask = lane_mask(width.saturating_sub(h * LANES));
    }
    let mut at_stat = start.saturating_add(m0);
    let mut at_mov = place.0.saturating_add(n0);
    for _ in 0..k {
        // Every row was checked by `gemm`: the `else` is never taken. (No closure here: a
        // call in this loop would spill the accumulators.)
        let (Some(a), Some(b)) = (
            stat.get(at_stat..).and_then(<[f32]>::first_chunk::<R>),
            mov.get(at_mov..at_mov.saturating_add(width)),
        ) else {
            break;
        };
        let mut bv = [_mm512_setzero_ps(); V];
        for ((v, &mask), h) in bv.iter_mut().zip(&masks).zip(0..) {
            // SAFETY: the mask enables the lanes `i` with `16 · h + i < width = b.len()`,
            // all inside `b` (the others are not read and load as zeros; the pointer is
            // only formed, with `wrapping_add`, never read outside `b`).
            *v = unsafe { _mm512_maskz_loadu_ps(mask, b.as_ptr().wrapping_add(h * LANES)) };
        }
        for (acc, &a) in acc.iter_mut().zip(a) {
            let a = _mm512_set1_ps(a);
            for (acc, &b) in acc.iter_mut().zip(&bv) {
                *acc = _mm512_fmadd_ps(a, b, *acc);
            }
        }
        at_stat = at_stat.saturating_add(stride);
        at_mov = at_mov.saturating_add(place.1);
    }
    acc
}

/// Stores the first `width` (≤ `V · LANES`) columns of the `R` rows of chains `acc` at rows
/// `m0..`, columns `n0..` of `out` (finished as [`super::finish`]); the lanes that stored a
/// NaN or an infinity.
#[inline]
#[target_feature(enable = "avx512f")]
fn store<const R: usize, const V: usize>(
    acc: &[[__m512; V]; R],
    out_place: (usize, usize),
    (m0, n0, width): (usize, usize, usize),
    out: &mut [f32],
    accumulate: bool,
) -> __mmask16 {
    let zero = _mm512_setzero_ps();
    let mut non_finite = 0;
    for (i, row) in acc.iter().enumerate() {
        let Some(dst) =
            at(out_place, m0 + i, n0).and_then(|at| out.get_mut(at..at.checked_add(width)?))
        else {
            return non_finite;
        };
        for (h, &chain) in row.iter().enumerate() {
            let Some(part) = dst.get_mut(LANES * h..) else {
                break;
            };
            let mask = lane_mask(part.len());
            let p = part.as_mut_ptr();
            let y = if accumulate {
                // SAFETY: the mask enables lanes `0..min(16, part.len())`, all inside `part`
                // (the masked-off lanes are not read).
                let old = unsafe { _mm512_maskz_loadu_ps(mask, p) };
                _mm512_add_ps(old, chain)
            } else {
                _mm512_add_ps(chain, zero)
            };
            // SAFETY: as for the load: only lanes inside `part` are written.
            unsafe { _mm512_mask_storeu_ps(p, mask, y) };
            // `y · 0` is a NaN exactly when `y` is a NaN or an infinity.
            let t = _mm512_mul_ps(y, zero);
            non_finite |= _mm512_mask_cmp_ps_mask::<_CMP_UNORD_Q>(mask, t, t);
        }
    }
    non_finite
}

/// The `R` rows from `m0` of the `V` vectors of a panel's columns.
#[inline]
#[target_feature(enable = "avx512f")]
fn rows<const R: usize, const V: usize>(
    stat: &[f32],
    l: Layout,
    (m0, n0, width): (usize, usize, usize),
    (mov, k): (&[f32], usize),
    out: &mut [f32],
    accumulate: bool,
) -> __mmask16 {
    let acc = block::<R, V>(stat, l.stat, m0, (mov, l.mov, k), (n0, width));
    store::<R, V>(&acc, l.out, (m0, n0, width), out, accumulate)
}

/// Every block of rows of the panel of `V` vectors of columns from `n0` (`width` of them
/// stored): by `M` (`M · V` = [`ACCUMULATORS`]), then the last rows by 8, 4, 2 and 1.
#[inline]
#[target_feature(enable = "avx512f")]
fn panel<const V: usize, const M: usize>(
    stat: &[f32],
    (m, l): (usize, Layout),
    (n0, width): (usize, usize),
    mov: (&[f32], usize),
    out: &mut [f32],
    accumulate: bool,
) -> __mmask16 {
    const { assert!(M * V == ACCUMULATORS) };
    let mut non_finite: __mmask16 = 0;
    let mut m0 = 0;
    while m0 + M <= m {
        non_finite |= rows::<M, V>(stat, l, (m0, n0, width), mov, out, accumulate);
        m0 += M;
    }
    // The last rows (fewer than `M`) by 8, 4, 2 and 1.
    while M > 8 && m0 + 8 <= m {
        non_finite |= rows::<8, V>(stat, l, (m0, n0, width), mov, out, accumulate);
        m0 += 8;
    }
    if m0 + 4 <= m {
        non_finite |= rows::<4, V>(stat, l, (m0, n0, width), mov, out, accumulate);
        m0 += 4;
    }
    if m0 + 2 <= m {
        non_finite |= rows::<2, V>(stat, l, (m0, n0, width), mov, out, accumulate);
        m0 += 2;
    }
    if m0 < m {
        non_finite |= rows::<1, V>(stat, l, (m0, n0, width), mov, out, accumulate);
    }
    non_finite
}

/// [`super::gemm`] for `k` ≤ [`KC`] on AVX-512F (it allocates nothing). The caller checked
/// that every row of `stat` and `mov` lies in its slice.
///
/// # Safety
/// The CPU must support AVX-512F.
#[target_feature(enable = "avx512f")]
pub(super) unsafe fn body(
    stat: &[f32],
    mov: &[f32],
    (k, m, n): (usize, usize, usize),
    l: Layout,
    out: &mut [f32],
    accumulate: bool,
) -> bool {
    if k > KC {
        // Not a shape of this kernel (the caller never asks): nothing is stored.
        return false;
    }
    let mov = (mov, k);
    let mut non_finite: __mmask16 = 0;
    for n0 in (0..n).step_by(PANEL) {
        let width = (n - n0).min(PANEL);
        let shape = (m, l);
        non_finite |= match width.div_ceil(LANES) {
            4 => panel::<4, 6>(stat, shape, (n0, width), mov, out, accumulate),
            3 => panel::<3, 8>(stat, shape, (n0, width), mov, out, accumulate),
            2 => panel::<2, 12>(stat, shape, (n0, width), mov, out, accumulate),
            _ => panel::<1, 24>(stat, shape, (n0, width), mov, out, accumulate),
        };
    }
    non_finite != 0
}
