//! Which vector instructions the compute kernels use: detected once per process, never
//! changing a bit of a result (every variant computes each element with the same f32
//! operations in the same order; only how many elements are computed at once differs).
//!
//! Tests force a lower level on their own thread ([`force`]) so that every variant is
//! exercised and compared on a CPU that has the highest.

use std::sync::OnceLock;

/// A set of vector instructions, lowest first.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum Level {
    /// No vector intrinsics: plain Rust (what the compiler makes of it for the baseline CPU).
    Scalar,
    /// x86-64 AVX2 and FMA: 8 lanes (the GEMM kernel of `gemm::avx2`, fused chains).
    Avx2Fma,
    /// x86-64 AVX-512F: 16 lanes, masked edges.
    Avx512,
}

/// The highest level this CPU supports, detected on first use.
fn detected() -> Level {
    static LEVEL: OnceLock<Level> = OnceLock::new();
    *LEVEL.get_or_init(|| {
        #[cfg(target_arch = "x86_64")]
        {
            // Each level includes the ones below it (the kernels of a level call those of
            // the levels below for the shapes they leave), so AVX-512F counts only with AVX2
            // and FMA (every CPU with it has them; a hypervisor might mask them apart).
            let avx2_fma = std::arch::is_x86_feature_detected!("avx2")
                && std::arch::is_x86_feature_detected!("fma");
            if avx2_fma && std::arch::is_x86_feature_detected!("avx512f") {
                return Level::Avx512;
            }
            if avx2_fma {
                return Level::Avx2Fma;
            }
        }
        Level::Scalar
    })
}

#[cfg(test)]
thread_local! {
    static FORCED: std::cell::Cell<Option<Level>> = const { std::cell::Cell::new(None) };
}

/// The level the kernels use on this thread: the detected one (tests may cap it with
/// [`force`]).
pub(crate) fn level() -> Level {
    #[cfg(test)]
    if let Some(forced) = FORCED.with(std::cell::Cell::get) {
        return forced.min(detected());
    }
    detected()
}

/// Caps this thread's level at `level` (`None`: the detected one again). Tests only.
#[cfg(test)]
pub(crate) fn force(level: Option<Level>) {
    FORCED.with(|f| f.set(level));
}

/// The levels this CPU supports, lowest first (tests run every one of them).
#[cfg(test)]
pub(crate) fn supported() -> Vec<Level> {
    [Level::Scalar, Level::Avx2Fma, Level::Avx512]
        .into_iter()
        .filter(|&l| l <= detected())
        .collect()
}
