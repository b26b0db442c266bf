//! The AVX-512F kernel, for `k` ≤ [`KC`] (every `Matmul`): the same chains as the portable
//! kernel (each output one fused multiply-add chain over `k` in order from +0, then the
//! finish of [`super::finish`]), 16 lanes at a time.
//!
//! Each group of [`W`] columns of the moving matrix (the last group one vector of [`LANES`]
//! when no more than that is left: a batch of 360 computes 368 columns, not 384) is swept by
//! blocks of [`MB`] output rows (the last block narrower): `2 · MB` accumulators (`MB` in a
//! one-vector group), the stationary values broadcast, the moving rows loaded where they lie
//! (the lanes past the matrix's last column masked off: they load zeros, are computed and never
//! stored), the results stored through a mask. The moving matrix is not packed first: SBUF
//! partitions are one cache line more than 64 KiB apart ([`super::super::partition_stride`]),
//! so a group's rows fall in different cache sets and stay in L1 from one block of rows to the
//! next, and the copy cost more than it saved (measured: the digits network's three matmuls
//! about 5 % faster without it).

use std::arch::x86_64::{
    __m512, __mmask16, _CMP_UNORD_Q, _mm512_add_ps, _mm512_fmadd_ps, _mm512_mask_cmp_ps_mask,
    _mm512_mask_storeu_ps, _mm512_maskz_loadu_ps, _mm512_mul_ps, _mm512_set1_ps, _mm512_setzero_ps,
};

use super::{KC, Layout, at};

/// Lanes of a vector.
const LANES: usize = 16;
/// Columns of a panel: two 16-lane vectors.
const W: usize = 2 * LANES;
/// Output rows computed together (`2 · MB` = 16 of the 32 vector registers accumulate).
const MB: usize = 8;

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

/// The `R` rows from `m0` of one group of `V` vectors of the panel's columns.
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

/// Every block of rows of the group of `V` vectors of columns from `n0` (`width` of them
/// stored): by [`MB`], then the rest at once.
#[inline]
#[target_feature(enable = "avx512f")]
fn group<const V: usize>(
    stat: &[f32],
    (m, l): (usize, Layout),
    (n0, width): (usize, usize),
    panel: (&[f32], usize),
    out: &mut [f32],
    accumulate: bool,
) -> __mmask16 {
    let mut non_finite: __mmask16 = 0;
    let mut m0 = 0;
    while m0 + MB <= m {
        non_finite |= rows::<MB, V>(stat, l, (m0, n0, width), panel, out, accumulate);
        m0 += MB;
    }
    let place = (m0, n0, width);
    non_finite
        | match m - m0 {
            0 => 0,
            1 => rows::<1, V>(stat, l, place, panel, out, accumulate),
            2 => rows::<2, V>(stat, l, place, panel, out, accumulate),
            3 => rows::<3, V>(stat, l, place, panel, out, accumulate),
            4 => rows::<4, V>(stat, l, place, panel, out, accumulate),
            5 => rows::<5, V>(stat, l, place, panel, out, accumulate),
            6 => rows::<6, V>(stat, l, place, panel, out, accumulate),
            _ => rows::<7, V>(stat, l, place, panel, out, accumulate),
        }
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
    let panel = (mov, k);
    let mut non_finite: __mmask16 = 0;
    for n0 in (0..n).step_by(W) {
        let width = (n - n0).min(W);
        non_finite |= if width > LANES {
            group::<2>(stat, (m, l), (n0, width), panel, out, accumulate)
        } else {
            group::<1>(stat, (m, l), (n0, width), panel, out, accumulate)
        };
    }
    non_finite != 0
}
