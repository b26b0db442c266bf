//! The matmul kernel of the `Matmul` instruction: `out[m][n] (+)= Σ_k stat[k][m] · mov[k][n]`
//! over contiguous row-major f32 buffers, register-blocked and allocation-free (the GEMM crate
//! allocates its packing buffers on every call, which an execution's steady state may not).
//!
//! # Rounding (the same as `matrixmultiply::sgemm`)
//! Every output element is one chain over `k` in order, starting from +0: `acc = fma(stat,
//! mov, acc)` — a fused multiply-add, one rounding — on a CPU with FMA (x86-64 with AVX2 and
//! FMA, detected at run time, and aarch64), otherwise `acc = acc + stat · mov` (two roundings).
//! The chain is then added to the old output when accumulating, and to +0 otherwise (so a
//! `-0` chain stores `+0`). The blocking only decides which elements are computed together,
//! never the order of one element's sum, so every shape gives the same bits.

/// Output rows computed together.
const MB: usize = 4;
/// Output columns computed together (two 8-lane vectors).
const NB: usize = 16;

/// `acc + a · b`, fused or not.
#[inline(always)]
fn madd<const FUSED: bool>(a: f32, b: f32, acc: f32) -> f32 {
    if FUSED { a.mul_add(b, acc) } else { acc + a * b }
}

/// The result stored for chain `acc` over old value `old`.
#[inline(always)]
fn finish(acc: f32, old: f32, accumulate: bool) -> f32 {
    if accumulate { old + acc } else { acc + 0.0 }
}

/// The kernel body; the caller checked `stat.len() == k·m`, `mov.len() == k·n`, `out.len() ==
/// m·n`.
#[inline(always)]
fn body<const FUSED: bool>(
    stat: &[f32],
    mov: &[f32],
    (k, m, n): (usize, usize, usize),
    out: &mut [f32],
    accumulate: bool,
) {
    let full_m = m - m % MB;
    let full_n = n - n % NB;
    for m0 in (0..full_m).step_by(MB) {
        for n0 in (0..full_n).step_by(NB) {
            let mut acc = [[0.0f32; NB]; MB];
            for kk in 0..k {
                let (Some(a), Some(b)) = (
                    stat.get(kk * m + m0..kk * m + m0 + MB),
                    mov.get(kk * n + n0..kk * n + n0 + NB),
                ) else {
                    return;
                };
                let (Ok(a), Ok(b)) = (<&[f32; MB]>::try_from(a), <&[f32; NB]>::try_from(b))
                else {
                    return;
                };
                for (row, &a) in acc.iter_mut().zip(a) {
                    for (c, &b) in row.iter_mut().zip(b) {
                        *c = madd::<FUSED>(a, b, *c);
                    }
                }
            }
            for (i, row) in acc.iter().enumerate() {
                let at = (m0 + i) * n + n0;
                if let Some(dst) = out.get_mut(at..at + NB) {
                    for (d, &c) in dst.iter_mut().zip(row) {
                        *d = finish(c, *d, accumulate);
                    }
                }
            }
        }
    }
    // The edges: rows below full_m with columns past full_n, and every column of the last
    // rows, one element at a time in the same order.
    let edge = |mi: usize, ni: usize, out: &mut [f32]| {
        let mut acc = 0.0f32;
        for kk in 0..k {
            if let (Some(&a), Some(&b)) = (stat.get(kk * m + mi), mov.get(kk * n + ni)) {
                acc = madd::<FUSED>(a, b, acc);
            }
        }
        if let Some(d) = out.get_mut(mi * n + ni) {
            *d = finish(acc, *d, accumulate);
        }
    };
    for mi in 0..full_m {
        for ni in full_n..n {
            edge(mi, ni, out);
        }
    }
    for mi in full_m..m {
        for ni in 0..n {
            edge(mi, ni, out);
        }
    }
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
    out: &mut [f32],
    accumulate: bool,
) {
    body::<true>(stat, mov, shape, out, accumulate);
}

/// `out (+)= statᵀ · mov` for `stat` K × M, `mov` K × N and `out` M × N, row-major, with
/// the rounding of the module doc. The caller checked the lengths (elements past them are
/// not touched either way).
pub(super) fn gemm(
    stat: &[f32],
    mov: &[f32],
    shape: (usize, usize, usize),
    out: &mut [f32],
    accumulate: bool,
) {
    #[cfg(target_arch = "x86_64")]
    {
        if std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("fma")
        {
            // SAFETY: AVX2 and FMA were just detected on this CPU; `body_fma` has no other
            // requirement (it is safe code compiled with those features).
            unsafe { body_fma(stat, mov, shape, out, accumulate) };
            return;
        }
        body::<false>(stat, mov, shape, out, accumulate);
    }
    #[cfg(target_arch = "aarch64")]
    body::<true>(stat, mov, shape, out, accumulate);
    #[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
    body::<false>(stat, mov, shape, out, accumulate);
}
