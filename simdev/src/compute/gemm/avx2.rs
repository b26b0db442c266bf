//! The AVX2 + FMA kernel, for `k` ≤ [`KC`] (every `Matmul`): the same chains as the portable
//! kernel (each output one fused multiply-add chain over `k` in order from +0, then the
//! finish of [`super::finish`]), 8 lanes at a time, with the shape of [`super::avx512`] cut to
//! AVX2's 16 vector registers; and [`narrow`], for fewer than 8 columns (a batch-1 layer has
//! one) and any `k`, vectorised down the output rows instead.
//!
//! The moving matrix is swept by panels of [`PANEL_VECTORS`] vectors (24 columns; a last,
//! narrower panel of one or two vectors), each first packed into the caller's buffer (row
//! after row, the lanes past the matrix's last column zero), then swept by blocks of output
//! rows sized so that a block keeps [`ACCUMULATORS`] registers accumulating (4 rows of 3
//! vectors, 6 of 2, 12 of 1; the last rows by 8, 4, 2 and 1), which leaves one register per
//! vector of the moving row and one for the broadcast stationary value: all 16 for 4 × 3. The
//! compiler spills an accumulator of a 4 × 3 block (a store and a load in every step, a third
//! of the speed), so that loop is written out in assembly ([`block_4x3`]); the others are
//! intrinsics. The loops walk pointers through operands whose last row was checked once per
//! block: a bounds check, a closure or an `Option` combinator left in them spilled too.
//!
//! Measured (AMD EPYC with AVX2 and FMA, no AVX-512; `cargo bench -p tests --bench matmul`,
//! interleaved runs, ratio to the GEMM crate's AVX2 kernel on the digits MLP's 64 × 64 × 360
//! and 64 × 32 × 360 layers): the portable kernel 0.9x; reading the moving matrix where it
//! lies (SBUF partitions 64 KiB apart), 6 × 2 blocks, 0.9x; packed, 6 × 2, 1.0x to 1.1x;
//! packed, 4 × 3 in assembly, 1.1x to 1.2x. Only a partial panel's stores go through masks (on
//! AMD a masked store is slow); its lanes past the last column are computed from the packed
//! zeros and never stored.

use std::arch::x86_64::{
    __m256, __m256i, _CMP_UNORD_Q, _mm256_add_ps, _mm256_and_ps, _mm256_castsi256_ps,
    _mm256_cmp_ps, _mm256_cmpgt_epi32, _mm256_fmadd_ps, _mm256_loadu_ps, _mm256_maskload_ps,
    _mm256_maskstore_ps, _mm256_movemask_ps, _mm256_mul_ps, _mm256_or_ps, _mm256_set1_epi32,
    _mm256_set1_ps, _mm256_setr_epi32, _mm256_setzero_ps, _mm256_storeu_ps,
};

use super::{KC, Layout};

/// Lanes of a vector.
const LANES: usize = 8;
/// Vectors of columns of a full panel.
const PANEL_VECTORS: usize = 3;
/// Columns of a full panel.
const PANEL: usize = PANEL_VECTORS * LANES;
/// Vector registers a block of rows accumulates in: `rows · vectors` of the 16 (the others
/// hold the moving row's vectors and the broadcast stationary value).
const ACCUMULATORS: usize = 12;

/// Lanes `0..lanes` (all when `lanes` ≥ 8) of a vector: all bits set in those, none in the
/// others (the mask form of `_mm256_maskload_ps` and `_mm256_maskstore_ps`).
#[inline]
#[target_feature(enable = "avx2")]
fn lane_mask(lanes: usize) -> __m256i {
    let lanes = i32::try_from(lanes.min(LANES)).unwrap_or(0);
    _mm256_cmpgt_epi32(
        _mm256_set1_epi32(lanes),
        _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7),
    )
}

/// Where the `cols` elements from column `col` of row `row` of the matrix at `place` end:
/// `start + row · stride + col + cols`, `usize::MAX` (past any slice) on overflow. No
/// closures and no `Option` combinators: a call left in these kernels spills their
/// accumulators.
#[inline(always)]
fn end_of((start, stride): (usize, usize), row: usize, col: usize, cols: usize) -> usize {
    match row.checked_mul(stride) {
        Some(r) => r
            .saturating_add(start)
            .saturating_add(col)
            .saturating_add(cols),
        None => usize::MAX,
    }
}

/// The `R` × `V · LANES` chains at rows `m0..` of `stat` over `panel`, the packed `k` × `V ·
/// LANES` columns of the moving matrix (row `kk` at `panel[V · LANES · kk ..]`, the lanes past
/// the matrix's last column zero): each its own chain over `k` in order, from +0.
#[inline]
#[target_feature(enable = "avx2,fma")]
fn block<const R: usize, const V: usize>(
    stat: &[f32],
    (start, stride): (usize, usize),
    m0: usize,
    (panel, k): (&[f32], usize),
) -> [[__m256; V]; R] {
    let mut acc = [[_mm256_setzero_ps(); V]; R];
    // The last of the `k` rows of both operands must lie in their slices; then every row
    // does (rows are `stride` and `V · LANES` apart, from the first upwards), and the loop
    // reads through pointers without a check per row. A shape that does not fit reads
    // nothing (the callers never ask for one).
    let stat_fits = k == 0 || end_of((start, stride), k - 1, m0, R) <= stat.len();
    if !stat_fits || panel.len() < k.saturating_mul(V * LANES) {
        return acc;
    }
    let mut a = stat.as_ptr().wrapping_add(start.saturating_add(m0));
    let mut b = panel.as_ptr();
    for _ in 0..k {
        let mut bv = [_mm256_setzero_ps(); V];
        for (h, v) in bv.iter_mut().enumerate() {
            // SAFETY: the panel's row at `b` holds `V · LANES` values inside `panel`
            // (checked above), so the 8 from `8 · h` (`h` < `V`) are inside it.
            *v = unsafe { _mm256_loadu_ps(b.add(h * LANES)) };
        }
        for (i, acc) in acc.iter_mut().enumerate() {
            // SAFETY: the row at `a` holds the `R` stationary values from `m0` inside `stat`
            // (checked above), and `i` < `R`.
            let a = _mm256_set1_ps(unsafe { *a.add(i) });
            for (acc, &b) in acc.iter_mut().zip(&bv) {
                *acc = _mm256_fmadd_ps(a, b, *acc);
            }
        }
        // The next rows: formed with `wrapping_add` (the pointers past the last rows are
        // never read).
        a = a.wrapping_add(stride);
        b = b.wrapping_add(V * LANES);
    }
    acc
}

/// [`block`] for 4 rows of 3 vectors: all 16 vector registers (12 accumulators, the 3 vectors
/// of the moving row, the broadcast stationary value), which the compiler's register
/// allocation does not manage without spilling an accumulator, so the loop is written out.
#[inline]
#[target_feature(enable = "avx2,fma")]
fn block_4x3(
    stat: &[f32],
    (start, stride): (usize, usize),
    m0: usize,
    (panel, k): (&[f32], usize),
) -> [[__m256; 3]; 4] {
    let z = _mm256_setzero_ps();
    let mut c = [[z; 3]; 4];
    let stat_fits = end_of((start, stride), k.saturating_sub(1), m0, 4) <= stat.len();
    let Some(stride_bytes) = stride.checked_mul(4) else {
        return c;
    };
    if k == 0 || !stat_fits || panel.len() < k.saturating_mul(3 * LANES) {
        return c;
    }
    let a = stat.as_ptr().wrapping_add(start.saturating_add(m0));
    let b = panel.as_ptr();
    let [
        [c00, c01, c02],
        [c10, c11, c12],
        [c20, c21, c22],
        [c30, c31, c32],
    ] = &mut c;
    // SAFETY: the loop reads, for each of the `k` ≥ 1 steps, the 4 stationary values at `a`
    // (row `kk` of `stat` from `m0`, inside `stat`: its last row was checked above) and the 24
    // values at `b` (row `kk` of the packed panel, inside `panel`: `k · 24` values checked
    // above), then steps `a` by `stride` values and `b` by 24; it writes no memory and no
    // register but its operands (the flags are not preserved: no `preserves_flags`).
    unsafe {
        std::arch::asm!(
            "2:",
            "vmovups {b0}, ymmword ptr [{b}]",
            "vmovups {b1}, ymmword ptr [{b} + 32]",
            "vmovups {b2}, ymmword ptr [{b} + 64]",
            "vbroadcastss {x}, dword ptr [{a}]",
            "vfmadd231ps {c00}, {x}, {b0}",
            "vfmadd231ps {c01}, {x}, {b1}",
            "vfmadd231ps {c02}, {x}, {b2}",
            "vbroadcastss {x}, dword ptr [{a} + 4]",
            "vfmadd231ps {c10}, {x}, {b0}",
            "vfmadd231ps {c11}, {x}, {b1}",
            "vfmadd231ps {c12}, {x}, {b2}",
            "vbroadcastss {x}, dword ptr [{a} + 8]",
            "vfmadd231ps {c20}, {x}, {b0}",
            "vfmadd231ps {c21}, {x}, {b1}",
            "vfmadd231ps {c22}, {x}, {b2}",
            "vbroadcastss {x}, dword ptr [{a} + 12]",
            "vfmadd231ps {c30}, {x}, {b0}",
            "vfmadd231ps {c31}, {x}, {b1}",
            "vfmadd231ps {c32}, {x}, {b2}",
            "add {a}, {sa}",
            "add {b}, 96",
            "dec {k}",
            "jnz 2b",
            a = inout(reg) a => _,
            b = inout(reg) b => _,
            k = inout(reg) k => _,
            sa = in(reg) stride_bytes,
            x = out(ymm_reg) _,
            b0 = out(ymm_reg) _,
            b1 = out(ymm_reg) _,
            b2 = out(ymm_reg) _,
            c00 = inout(ymm_reg) *c00,
            c01 = inout(ymm_reg) *c01,
            c02 = inout(ymm_reg) *c02,
            c10 = inout(ymm_reg) *c10,
            c11 = inout(ymm_reg) *c11,
            c12 = inout(ymm_reg) *c12,
            c20 = inout(ymm_reg) *c20,
            c21 = inout(ymm_reg) *c21,
            c22 = inout(ymm_reg) *c22,
            c30 = inout(ymm_reg) *c30,
            c31 = inout(ymm_reg) *c31,
            c32 = inout(ymm_reg) *c32,
            options(nostack, readonly),
        );
    }
    c
}

/// Packs the `width` (≤ `V · LANES`) columns from `n0` of the `k` rows of the moving matrix
/// at `place` in `mov` into the first `k · V · LANES` values of `panel`, row after row, each
/// row's lanes past `width` zero; `None` (nothing computed from it) when a row is not in
/// `mov` or `panel` is too short.
#[inline]
#[target_feature(enable = "avx2,fma")]
fn pack<'p, const V: usize>(
    mov: &[f32],
    (start, stride): (usize, usize),
    k: usize,
    (n0, width): (usize, usize),
    panel: &'p mut [f32],
) -> Option<&'p [f32]> {
    let panel = panel.get_mut(..k.checked_mul(V * LANES)?)?;
    let width = width.min(V * LANES);
    // Every row is in `mov` when the last is (as in `block`).
    if k > 0 && end_of((start, stride), k - 1, n0, width) > mov.len() {
        return None;
    }
    let mut masks = [lane_mask(LANES); V];
    for (h, mask) in masks.iter_mut().enumerate() {
        *mask = lane_mask(width.saturating_sub(h * LANES));
    }
    let full = width == V * LANES;
    let mut src = mov.as_ptr().wrapping_add(start.saturating_add(n0));
    let mut dst = panel.as_mut_ptr();
    for _ in 0..k {
        for (h, &mask) in masks.iter().enumerate() {
            let v = if full {
                // SAFETY: the row at `src` holds `width` = `V · LANES` values inside `mov`
                // (checked above): the 8 from `8 · h`, `h` < `V`.
                unsafe { _mm256_loadu_ps(src.add(h * LANES)) }
            } else {
                // SAFETY: the mask enables the lanes `i` with `8 · h + i < width`, all inside
                // the row at `src` (checked above); the others are not read and load as
                // zeros (the pointer is only formed, with `wrapping_add`).
                unsafe { _mm256_maskload_ps(src.wrapping_add(h * LANES), mask) }
            };
            // SAFETY: the panel's row at `dst` holds `V · LANES` values inside `panel` (its
            // length is `k · V · LANES`, checked above).
            unsafe { _mm256_storeu_ps(dst.add(h * LANES), v) };
        }
        // The next rows (formed with `wrapping_add`: those past the last are never used).
        src = src.wrapping_add(stride);
        dst = dst.wrapping_add(V * LANES);
    }
    Some(panel)
}

/// Stores the first `width` (≤ `V · LANES`; all of them when `FULL`) columns of the `R` rows
/// of chains `acc` at rows `m0..`, columns `n0..` of `out` (finished as [`super::finish`]);
/// the OR of `y · 0` over every value `y` stored, whose lanes are NaN exactly where a NaN or
/// an infinity was stored (±0 otherwise).
#[inline]
#[target_feature(enable = "avx2,fma")]
fn store<const R: usize, const V: usize, const FULL: bool>(
    acc: &[[__m256; V]; R],
    out_place: (usize, usize),
    (m0, n0, width): (usize, usize, usize),
    out: &mut [f32],
    accumulate: bool,
) -> __m256 {
    let zero = _mm256_setzero_ps();
    let mut check = zero;
    for (i, row) in acc.iter().enumerate() {
        let end = end_of(out_place, m0 + i, n0, width);
        let Some(dst) = out.get_mut(end.saturating_sub(width)..end) else {
            return check;
        };
        for (h, &chain) in row.iter().enumerate() {
            let Some(part) = dst.get_mut(LANES * h..) else {
                break;
            };
            let p = part.as_mut_ptr();
            let y = if FULL && part.len() >= LANES {
                let old = if accumulate {
                    // SAFETY: `part` holds at least the 8 values loaded.
                    unsafe { _mm256_loadu_ps(p) }
                } else {
                    zero
                };
                // `chain + 0` when overwriting: a `-0` chain stores `+0`, as `finish`.
                let y = _mm256_add_ps(old, chain);
                // SAFETY: as for the load.
                unsafe { _mm256_storeu_ps(p, y) };
                y
            } else {
                let mask = lane_mask(part.len());
                let old = if accumulate {
                    // SAFETY: the mask enables lanes `0..min(8, part.len())`, all inside
                    // `part` (the masked-off lanes are not read).
                    unsafe { _mm256_maskload_ps(p, mask) }
                } else {
                    zero
                };
                let y = _mm256_add_ps(old, chain);
                // SAFETY: as for the load: only lanes inside `part` are written.
                unsafe { _mm256_maskstore_ps(p, mask, y) };
                // Only the lanes stored count.
                _mm256_and_ps(y, _mm256_castsi256_ps(mask))
            };
            check = _mm256_or_ps(check, _mm256_mul_ps(y, zero));
        }
    }
    check
}

/// The `R` rows from `m0` of the `V` vectors of a panel's columns.
#[inline]
#[target_feature(enable = "avx2,fma")]
fn rows<const R: usize, const V: usize, const FULL: bool>(
    stat: &[f32],
    l: Layout,
    (m0, n0, width): (usize, usize, usize),
    panel: (&[f32], usize),
    out: &mut [f32],
    accumulate: bool,
) -> __m256 {
    let acc = if R == 4 && V == 3 {
        let c = block_4x3(stat, l.stat, m0, panel);
        // `R` × `V` is 4 × 3 on this branch: the same array, element for element (the
        // compiler sees the identity and copies nothing).
        std::array::from_fn(|i| std::array::from_fn(|h| c[i % 4][h % 3]))
    } else {
        block::<R, V>(stat, l.stat, m0, panel)
    };
    store::<R, V, FULL>(&acc, l.out, (m0, n0, width), out, accumulate)
}

/// Every block of rows of the packed panel of `V` vectors of columns from `n0` (`width` of
/// them stored; all `V · LANES` when `FULL`): by `M` (`M · V` = [`ACCUMULATORS`]), then the
/// last rows by 8, 4, 2 and 1.
#[inline]
#[target_feature(enable = "avx2,fma")]
fn panel<const V: usize, const M: usize, const FULL: bool>(
    stat: &[f32],
    (m, l): (usize, Layout),
    (n0, width): (usize, usize),
    panel: (&[f32], usize),
    out: &mut [f32],
    accumulate: bool,
) -> __m256 {
    const { assert!(M * V == ACCUMULATORS) };
    let mut check = _mm256_setzero_ps();
    let mut m0 = 0;
    while m0 + M <= m {
        let c = rows::<M, V, FULL>(stat, l, (m0, n0, width), panel, out, accumulate);
        check = _mm256_or_ps(check, c);
        m0 += M;
    }
    // The last rows (fewer than `M`) by 8, 4, 2 and 1.
    while M > 8 && m0 + 8 <= m {
        let c = rows::<8, V, FULL>(stat, l, (m0, n0, width), panel, out, accumulate);
        check = _mm256_or_ps(check, c);
        m0 += 8;
    }
    if M > 4 && m0 + 4 <= m {
        let c = rows::<4, V, FULL>(stat, l, (m0, n0, width), panel, out, accumulate);
        check = _mm256_or_ps(check, c);
        m0 += 4;
    }
    if M > 2 && m0 + 2 <= m {
        let c = rows::<2, V, FULL>(stat, l, (m0, n0, width), panel, out, accumulate);
        check = _mm256_or_ps(check, c);
        m0 += 2;
    }
    if m0 < m {
        let c = rows::<1, V, FULL>(stat, l, (m0, n0, width), panel, out, accumulate);
        check = _mm256_or_ps(check, c);
    }
    check
}

/// The panel of `width` (≤ `V · LANES`) columns from `n0`: packed into `buffer`, then swept;
/// stored through masks only when its columns do not fill its vectors.
#[inline]
#[target_feature(enable = "avx2,fma")]
fn any_panel<const V: usize, const M: usize>(
    (stat, mov): (&[f32], &[f32]),
    (k, m, l): (usize, usize, Layout),
    (n0, width): (usize, usize),
    buffer: &mut [f32],
    out: &mut [f32],
    accumulate: bool,
) -> __m256 {
    let Some(packed) = pack::<V>(mov, l.mov, k, (n0, width), buffer) else {
        // A row outside `mov` (the caller checked they are not): nothing computed.
        return _mm256_setzero_ps();
    };
    let shape = (m, l);
    if width == V * LANES {
        panel::<V, M, true>(stat, shape, (n0, width), (packed, k), out, accumulate)
    } else {
        panel::<V, M, false>(stat, shape, (n0, width), (packed, k), out, accumulate)
    }
}

/// [`super::gemm`] for `k` ≤ [`KC`] on AVX2 and FMA; `pack` holds the packed panel (grown to
/// [`KC`] · [`PANEL`] values once, never shrunk: nothing is allocated after that). The caller
/// checked that every row of `stat` and `mov` lies in its slice.
///
/// # Safety
/// The CPU must support AVX2 and FMA.
#[target_feature(enable = "avx2,fma")]
pub(super) unsafe fn body(
    stat: &[f32],
    mov: &[f32],
    (k, m, n): (usize, usize, usize),
    l: Layout,
    out: &mut [f32],
    accumulate: bool,
    pack: &mut Vec<f32>,
) -> bool {
    if k > KC {
        // Not a shape of this kernel (the caller never asks): nothing is stored.
        return false;
    }
    if pack.len() < KC * PANEL {
        pack.resize(KC * PANEL, 0.0);
    }
    let mut check = _mm256_setzero_ps();
    for n0 in (0..n).step_by(PANEL) {
        let width = (n - n0).min(PANEL);
        let (ops, shape, cols) = ((stat, mov), (k, m, l), (n0, width));
        let c = match width.div_ceil(LANES) {
            3 => any_panel::<3, 4>(ops, shape, cols, pack, out, accumulate),
            2 => any_panel::<2, 6>(ops, shape, cols, pack, out, accumulate),
            _ => any_panel::<1, 12>(ops, shape, cols, pack, out, accumulate),
        };
        check = _mm256_or_ps(check, c);
    }
    _mm256_movemask_ps(_mm256_cmp_ps::<_CMP_UNORD_Q>(check, check)) != 0
}

/// The `8 · V` output rows from `m0` of column `c`, each its own chain over `k` in order from
/// +0 (`fma(stat, mov, acc)`: the portable kernel's operands, the same bits), vectorised
/// down the rows: per step of `k`, `V` vectors of the stationary row and one broadcast moving
/// value. When `TAIL`, `V` is 1 and only the first `rows` (< 8) lanes are read (the others
/// load zeros). The caller checked the last rows of both operands.
#[inline]
#[target_feature(enable = "avx2,fma")]
fn narrow_block<const V: usize, const TAIL: bool>(
    (stat, l): (&[f32], Layout),
    (mov, k): (&[f32], usize),
    (m0, rows, c): (usize, usize, usize),
) -> [__m256; V] {
    let mut acc = [_mm256_setzero_ps(); V];
    // Rows `m0 .. m0 + 8 · V` (or `+ rows`) and column `c` of the last row of `k`: inside
    // their slices (checked by `narrow`), and so is every row before it.
    let stat_end = end_of(
        l.stat,
        k.saturating_sub(1),
        m0,
        if TAIL { rows } else { V * LANES },
    );
    let mov_end = end_of(l.mov, k.saturating_sub(1), c, 1);
    if k == 0 || stat_end > stat.len() || mov_end > mov.len() {
        return acc;
    }
    let mask = lane_mask(rows);
    let mut a = stat.as_ptr().wrapping_add(l.stat.0.saturating_add(m0));
    let mut b = mov.as_ptr().wrapping_add(l.mov.0.saturating_add(c));
    for _ in 0..k {
        // SAFETY: `b` is column `c` of a row of `k`, inside `mov` (checked above).
        let x = _mm256_set1_ps(unsafe { *b });
        for (h, acc) in acc.iter_mut().enumerate() {
            let s = if TAIL {
                // SAFETY: the mask enables lanes `0..rows`, inside the row at `a` (checked
                // above); the others are not read and load as zeros (the pointer is only
                // formed, with `wrapping_add`).
                unsafe { _mm256_maskload_ps(a, mask) }
            } else {
                // SAFETY: the row at `a` holds `8 · V` values inside `stat` (checked above):
                // the 8 from `8 · h`, `h` < `V`.
                unsafe { _mm256_loadu_ps(a.add(h * LANES)) }
            };
            *acc = _mm256_fmadd_ps(s, x, *acc);
        }
        a = a.wrapping_add(l.stat.1);
        b = b.wrapping_add(l.mov.1);
    }
    acc
}

/// Stores lanes `0..rows` of the chains `acc` (rows `m0 ..` of column `c`, a vector per 8
/// rows) into `out`, one value per output row (finished as [`super::finish`]); whether one
/// stored is a NaN or an infinity.
#[inline]
#[target_feature(enable = "avx2,fma")]
fn narrow_store<const V: usize>(
    acc: &[__m256; V],
    (out, place): (&mut [f32], (usize, usize)),
    (m0, rows, c): (usize, usize, usize),
    accumulate: bool,
) -> bool {
    let mut non_finite = false;
    for (h, &v) in acc.iter().enumerate() {
        let mut lanes = [0.0f32; LANES];
        // SAFETY: `lanes` holds the 8 values stored.
        unsafe { _mm256_storeu_ps(lanes.as_mut_ptr(), v) };
        for (i, &chain) in lanes
            .iter()
            .enumerate()
            .take(rows.saturating_sub(h * LANES))
        {
            let at = end_of(place, m0 + h * LANES + i, c, 1).wrapping_sub(1);
            if let Some(d) = out.get_mut(at) {
                *d = super::finish(chain, *d, accumulate);
                non_finite |= !d.is_finite();
            }
        }
    }
    non_finite
}

/// [`super::gemm`] for `n` < 8 on AVX2 and FMA (a batch-1 layer has `n` = 1): each column on
/// its own, vectorised down the output rows (`8 ·` 8, 4, 2 and 1 rows at a time, then the last
/// `m % 8` through a mask), where [`body`] would compute a whole vector of columns per row for
/// the few stored. Any `k`; it allocates nothing. The caller checked that every row of `stat`
/// and `mov` lies in its slice.
///
/// # Safety
/// The CPU must support AVX2 and FMA.
#[target_feature(enable = "avx2,fma")]
pub(super) unsafe fn narrow(
    stat: &[f32],
    mov: &[f32],
    (k, m, n): (usize, usize, usize),
    l: Layout,
    out: &mut [f32],
    accumulate: bool,
) -> bool {
    let mut non_finite = false;
    let (a, b, o) = ((stat, l), (mov, k), (&mut *out, l.out));
    for c in 0..n {
        let mut m0 = 0;
        while m0 + 8 * LANES <= m {
            let acc = narrow_block::<8, false>(a, b, (m0, 8 * LANES, c));
            non_finite |= narrow_store(&acc, (&mut *o.0, o.1), (m0, 8 * LANES, c), accumulate);
            m0 += 8 * LANES;
        }
        if m0 + 4 * LANES <= m {
            let acc = narrow_block::<4, false>(a, b, (m0, 4 * LANES, c));
            non_finite |= narrow_store(&acc, (&mut *o.0, o.1), (m0, 4 * LANES, c), accumulate);
            m0 += 4 * LANES;
        }
        if m0 + 2 * LANES <= m {
            let acc = narrow_block::<2, false>(a, b, (m0, 2 * LANES, c));
            non_finite |= narrow_store(&acc, (&mut *o.0, o.1), (m0, 2 * LANES, c), accumulate);
            m0 += 2 * LANES;
        }
        if m0 + LANES <= m {
            let acc = narrow_block::<1, false>(a, b, (m0, LANES, c));
            non_finite |= narrow_store(&acc, (&mut *o.0, o.1), (m0, LANES, c), accumulate);
            m0 += LANES;
        }
        if m0 < m {
            let rows = m - m0;
            let acc = narrow_block::<1, true>(a, b, (m0, rows, c));
            non_finite |= narrow_store(&acc, (&mut *o.0, o.1), (m0, rows, c), accumulate);
        }
    }
    non_finite
}
