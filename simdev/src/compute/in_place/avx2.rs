//! AVX2 versions of the in-place `Transpose` and of `Activation`'s identity and ReLU rows: the
//! same values as the portable loops of [`super`] (a transpose only moves values; an
//! activation computes `x · scale + bias` as two f32 roundings and ReLU as [`max_nan`]),
//! eight at a time, with the non-finite test of the values stored folded into the pass.
//!
//! [`max_nan`]: super::max_nan

use std::arch::x86_64::{
    __m256, _CMP_UNORD_Q, _mm256_add_ps, _mm256_blendv_ps, _mm256_cmp_ps, _mm256_fmadd_ps,
    _mm256_loadu_ps, _mm256_max_ps, _mm256_movemask_ps, _mm256_mul_ps, _mm256_or_ps,
    _mm256_permute2f128_ps, _mm256_set1_ps, _mm256_setzero_ps, _mm256_shuffle_ps, _mm256_storeu_ps,
    _mm256_unpackhi_ps, _mm256_unpacklo_ps,
};

use shared::isa::ActFunc;

use super::{Planes, row, row_mut, transpose_cells};

/// Values per vector.
const L: usize = 8;

/// Whether a lane of `acc` (a sum of `y · 0` over the values `y` checked) is a NaN: whether
/// any value checked was a NaN or an infinity.
#[inline]
#[target_feature(enable = "avx2")]
fn any_nan(acc: __m256) -> bool {
    _mm256_movemask_ps(_mm256_cmp_ps::<_CMP_UNORD_Q>(acc, acc)) != 0
}

/// The bits of `acc` or those of `y · 0`: `y · 0` is ±0 for a finite `y` and a NaN for a NaN
/// or an infinity, so `acc` stays ±0 while every `y` is finite and becomes a NaN (all exponent
/// bits and a mantissa bit set) for good at the first NaN or infinity. A bitwise or, not an
/// addition: a pass checks every vector into one `acc`, and the chain then waits one cycle per
/// vector, not an addition's latency.
#[inline]
#[target_feature(enable = "avx2")]
fn check(acc: __m256, y: __m256) -> __m256 {
    _mm256_or_ps(acc, _mm256_mul_ps(y, _mm256_setzero_ps()))
}

/// The 8 × 8 transpose of `r` (row `i` of the result is column `i` of `r`).
#[inline]
#[target_feature(enable = "avx2")]
fn transpose8(r: [__m256; L]) -> [__m256; L] {
    let t0 = _mm256_unpacklo_ps(r[0], r[1]);
    let t1 = _mm256_unpackhi_ps(r[0], r[1]);
    let t2 = _mm256_unpacklo_ps(r[2], r[3]);
    let t3 = _mm256_unpackhi_ps(r[2], r[3]);
    let t4 = _mm256_unpacklo_ps(r[4], r[5]);
    let t5 = _mm256_unpackhi_ps(r[4], r[5]);
    let t6 = _mm256_unpacklo_ps(r[6], r[7]);
    let t7 = _mm256_unpackhi_ps(r[6], r[7]);
    // Columns 0|4, 1|5, 2|6, 3|7 of rows 0..4, then of rows 4..8.
    let u0 = _mm256_shuffle_ps::<0x44>(t0, t2);
    let u1 = _mm256_shuffle_ps::<0xEE>(t0, t2);
    let u2 = _mm256_shuffle_ps::<0x44>(t1, t3);
    let u3 = _mm256_shuffle_ps::<0xEE>(t1, t3);
    let u4 = _mm256_shuffle_ps::<0x44>(t4, t6);
    let u5 = _mm256_shuffle_ps::<0xEE>(t4, t6);
    let u6 = _mm256_shuffle_ps::<0x44>(t5, t7);
    let u7 = _mm256_shuffle_ps::<0xEE>(t5, t7);
    [
        _mm256_permute2f128_ps::<0x20>(u0, u4),
        _mm256_permute2f128_ps::<0x20>(u1, u5),
        _mm256_permute2f128_ps::<0x20>(u2, u6),
        _mm256_permute2f128_ps::<0x20>(u3, u7),
        _mm256_permute2f128_ps::<0x31>(u0, u4),
        _mm256_permute2f128_ps::<0x31>(u1, u5),
        _mm256_permute2f128_ps::<0x31>(u2, u6),
        _mm256_permute2f128_ps::<0x31>(u3, u7),
    ]
}

/// Where the `cols` elements from column `col` of row `row` of the matrix at `(start,
/// stride)` end, `None` on overflow.
fn end_of((start, stride): (usize, usize), row: usize, col: usize, cols: usize) -> Option<usize> {
    row.checked_mul(stride)?
        .checked_add(start)?
        .checked_add(col)?
        .checked_add(cols)
}

/// `dst[j][i] = src[i][j]` for the `p` × `f` source at `(start, stride)` `at_src` and the
/// `f` × `p` destination at `at_dst` of `planes`: blocks of 8 × 8 in registers (each block
/// loaded completely before it is stored), then the edges one value at a time; whether a value
/// stored is a NaN or an infinity. `None` (nothing written) when a row does not lie in its
/// buffer.
///
/// The tile's last rows are checked once, and the blocks are read and written through
/// pointers: a check per row (16 per block) and the spills it caused cost four times the
/// shuffles (measured with callgrind on the digits MLP's input transposes: about 270
/// instructions per block).
///
/// Each loaded row is checked with one fused multiply-add, `acc = r · 0 + acc` (the
/// [`check`] of `r` in one instruction), into its own accumulator: the eight chains are
/// independent, so none waits on the latency of another.
///
/// # Safety
/// The CPU must support AVX2 and FMA.
#[target_feature(enable = "avx2,fma")]
pub(super) unsafe fn transpose(
    planes: &mut impl Planes,
    (p, f): (usize, usize),
    at_src: (usize, usize),
    at_dst: (usize, usize),
) -> Option<bool> {
    if p == 0 || f == 0 {
        return Some(false);
    }
    let (src, src_len, dst, dst_len) = planes.raw();
    // Every source row `i` < `p` holds its `f` values inside the source buffer when the last
    // does (rows `stride` apart, upwards), and every destination row `j` < `f` its `p`.
    if end_of(at_src, p - 1, 0, f)? > src_len || end_of(at_dst, f - 1, 0, p)? > dst_len {
        return None;
    }
    let (p8, f8) = (p - p % L, f - f % L);
    let zero = _mm256_setzero_ps();
    let mut accs = [zero; L];
    for j in (0..f8).step_by(L) {
        for i in (0..p8).step_by(L) {
            let mut r = [zero; L];
            for (ii, (r, acc)) in r.iter_mut().zip(accs.iter_mut()).enumerate() {
                // SAFETY: row `i + ii` < `p` of the source holds columns `j..j + 8` ⊂ `0..f`
                // inside the source buffer (checked above); `raw`'s pointers are valid until
                // `planes` is used again, after these loops.
                *r = unsafe { _mm256_loadu_ps(src.add(at_src.0 + (i + ii) * at_src.1 + j)) };
                *acc = _mm256_fmadd_ps(*r, zero, *acc);
            }
            for (jj, c) in transpose8(r).into_iter().enumerate() {
                // SAFETY: row `j + jj` < `f` of the destination holds columns `i..i + 8` ⊂
                // `0..p` inside the destination buffer (checked above), and the source and
                // destination tiles do not overlap (the caller's `Same` or `Apart`).
                unsafe { _mm256_storeu_ps(dst.add(at_dst.0 + (j + jj) * at_dst.1 + i), c) };
            }
        }
    }
    // The edges: the last `p % 8` source rows of the blocks' columns, then the last `f % 8`
    // columns of every row.
    let mut non_finite = transpose_cells(planes, at_src, at_dst, p8..p, 0..f8)?;
    non_finite |= transpose_cells(planes, at_src, at_dst, 0..p, f8..f)?;
    let mut acc = zero;
    for a in accs {
        acc = _mm256_or_ps(acc, a);
    }
    Some(non_finite || any_nan(acc))
}

/// `dst[i] = func(src[i] · scale + bias)` for the identity and ReLU (`None` for another
/// function, nothing written), eight values at a time: `x · scale` and `+ bias` rounded
/// apart (never fused), ReLU a NaN for a NaN (the default NaN, as [`super::max_nan`]) and
/// otherwise `max(y, +0)` as `maxps` computes it (the second operand, `+0`, for either zero);
/// whether a value stored is a NaN or an infinity.
///
/// The row is done by [`fast_pass`], which leaves out what only a NaN or an infinity needs;
/// a ReLU row in which that pass met one is done again by [`exact_pass`].
#[inline]
#[target_feature(enable = "avx2")]
fn activate_row(
    src: &[f32],
    dst: &mut [f32],
    bias: f32,
    func: ActFunc,
    scale: f32,
) -> Option<bool> {
    if src.len() != dst.len() {
        return None;
    }
    let relu = match func {
        ActFunc::Identity => false,
        ActFunc::Relu => true,
        _ => return None,
    };
    let (vs, vb) = (_mm256_set1_ps(scale), _mm256_set1_ps(bias));
    let (xs, x_tail) = src.as_chunks::<L>();
    let (ys, y_tail) = dst.as_chunks_mut::<L>();
    let met = match (relu, scale == 1.0) {
        (false, false) => fast_pass::<false, false>(xs, ys, vs, vb),
        (false, true) => fast_pass::<false, true>(xs, ys, vs, vb),
        (true, false) => fast_pass::<true, false>(xs, ys, vs, vb),
        (true, true) => fast_pass::<true, true>(xs, ys, vs, vb),
    };
    let mut non_finite = any_nan(met);
    if non_finite && relu {
        non_finite = any_nan(exact_pass(xs, ys, vs, vb));
    }
    for (y, &x) in y_tail.iter_mut().zip(x_tail) {
        let v = x * scale + bias;
        *y = if relu { super::max_nan(v, 0.0) } else { v };
        non_finite |= !y.is_finite();
    }
    Some(non_finite)
}

/// `v = x · scale + bias` of the vectors `xs` into `ys`, then `max(v, +0)` for ReLU (`RELU`);
/// the [`check`] of every `v`: whether a `v` was a NaN or an infinity.
///
/// It leaves out what only those need. With `UNIT` (`scale` is 1) there is no
/// multiplication: `x · 1` is `x`, and the addition quiets a NaN `x` as the multiplication
/// would have. The ReLU is `maxps` alone, which stores `+0` for a NaN `v` where
/// [`super::max_nan`] gives a NaN; such a row's check is set, and [`activate_row`] does it
/// again with [`exact_pass`]. Without ReLU every `v` is stored as it is, so the check is the
/// exact one.
#[inline]
#[target_feature(enable = "avx2")]
fn fast_pass<const RELU: bool, const UNIT: bool>(
    xs: &[[f32; L]],
    ys: &mut [[f32; L]],
    vs: __m256,
    vb: __m256,
) -> __m256 {
    let zero = _mm256_setzero_ps();
    let mut acc = zero;
    for (x, y) in xs.iter().zip(ys.iter_mut()) {
        // SAFETY: `x` holds the 8 values loaded.
        let x = unsafe { _mm256_loadu_ps(x.as_ptr()) };
        let v = if UNIT {
            _mm256_add_ps(x, vb)
        } else {
            _mm256_add_ps(_mm256_mul_ps(x, vs), vb)
        };
        acc = check(acc, v);
        let v = if RELU { _mm256_max_ps(v, zero) } else { v };
        // SAFETY: `y` holds the 8 values stored.
        unsafe { _mm256_storeu_ps(y.as_mut_ptr(), v) };
    }
    acc
}

/// The ReLU of `x · scale + bias` of the vectors `xs` into `ys`, a NaN for a NaN (see
/// [`activate_row`]); the [`check`] of every value stored.
#[inline]
#[target_feature(enable = "avx2")]
fn exact_pass(xs: &[[f32; L]], ys: &mut [[f32; L]], vs: __m256, vb: __m256) -> __m256 {
    let (zero, nan) = (_mm256_setzero_ps(), _mm256_set1_ps(f32::NAN));
    let mut acc = zero;
    for (x, y) in xs.iter().zip(ys.iter_mut()) {
        // SAFETY: `x` holds the 8 values loaded.
        let x = unsafe { _mm256_loadu_ps(x.as_ptr()) };
        let v = _mm256_add_ps(_mm256_mul_ps(x, vs), vb);
        let is_nan = _mm256_cmp_ps::<_CMP_UNORD_Q>(v, v);
        let v = _mm256_blendv_ps(_mm256_max_ps(v, zero), nan, is_nan);
        acc = check(acc, v);
        // SAFETY: `y` holds the 8 values stored.
        unsafe { _mm256_storeu_ps(y.as_mut_ptr(), v) };
    }
    acc
}

/// [`activate_row`] for rows `p` of the `elems`-value source at `at_src` of `from` and the
/// destination at `at_dst` of `to`, with bias `biases[p]`, for every `p` < `biases.len()`
/// (a row that does not lie in its buffer is skipped, as the portable loop skips it): one call
/// per tile, so the rows' loop is inlined with them (a call per row cost as much as a row
/// of 64 values). `None`, nothing written, for a function other than the identity and ReLU.
///
/// # Safety
/// The CPU must support AVX2.
#[target_feature(enable = "avx2")]
pub(super) unsafe fn activate_rows(
    (from, at_src): (&[f32], (usize, usize)),
    (to, at_dst): (&mut [f32], (usize, usize)),
    elems: usize,
    biases: &[f32],
    (func, scale): (ActFunc, f32),
) -> Option<bool> {
    if !matches!(func, ActFunc::Identity | ActFunc::Relu) {
        return None;
    }
    let mut non_finite = false;
    for (p, &bias) in biases.iter().enumerate() {
        let (x, y) = (row(from, at_src, p, elems), row_mut(to, at_dst, p, elems));
        non_finite |= activate_row(x, y, bias, func, scale).unwrap_or(false);
    }
    Some(non_finite)
}
