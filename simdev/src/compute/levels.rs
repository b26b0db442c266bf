//! Every vector level this CPU has ([`simd::supported`]) against the others, forced on the
//! test's thread ([`simd::force`]): the GEMM kernels (AVX-512F and AVX2+FMA compute the same
//! fused chains), the in-place transposes and the identity and ReLU activations (every level
//! the same values as the portable loops), bit for bit, with the same non-finite effect; and
//! the shape-only NEFF output function, byte for byte.

use shared::isa::{ActFunc, Instruction, Opcode, ScalarMode};

use super::fuzz::Rng;
use super::simd::{self, Level};
use super::*;

/// Forces `level` on this thread until dropped.
struct Forced;

impl Forced {
    fn new(level: Level) -> Self {
        simd::force(Some(level));
        Self
    }
}

impl Drop for Forced {
    fn drop(&mut self) {
        simd::force(None);
    }
}

fn below(rng: &mut Rng, n: usize) -> usize {
    usize::try_from(rng.below(u64::try_from(n).unwrap())).unwrap()
}

/// A random value with a random sign and an exponent near 0, sometimes ±0, a NaN or ±∞.
fn value(rng: &mut Rng) -> f32 {
    match rng.below(40) {
        0 => 0.0,
        1 => -0.0,
        2 => f32::NAN,
        3 => f32::INFINITY,
        4 => f32::NEG_INFINITY,
        _ => {
            let sign = u32::try_from(rng.below(2)).unwrap() << 31;
            let exponent = (118 + u32::try_from(rng.below(18)).unwrap()) << 23;
            f32::from_bits(sign | exponent | (rng.word() & 0x007F_FFFF))
        }
    }
}

/// The same bits, or both NaN (two NaN operands of one FMA may give either payload, as the
/// instruction form the compiler picks decides).
fn same_bits(a: f32, b: f32) -> bool {
    a.to_bits() == b.to_bits() || (a.is_nan() && b.is_nan())
}

/// `rows` × `cols` of `v` at `(start, stride)` in a slice of fillers.
fn placed(v: &[f32], (rows, cols): (usize, usize), (start, stride): (usize, usize)) -> Vec<f32> {
    let mut out = vec![-7.5f32; start + rows * stride + 3];
    for (r, row) in v.chunks(cols).enumerate() {
        out[start + r * stride..][..cols].copy_from_slice(row);
    }
    out
}

/// Every kernel with FMA — through [`gemm::gemm`] at every level that has FMA, and each vector
/// kernel called directly whatever the shape — against the portable kernel's fused chains,
/// over random shapes (the edges of every block size: `m` and `n` not multiples of the
/// blocks' rows and columns, `k` up to 128), then every height of rows (1 to 50: each block
/// height and every leftover below it) on panels of each width (1 to 4 vectors of either
/// kernel, full and partial, and several panels), strided layouts, NaN, ±∞ and −0 operands,
/// accumulating and overwriting; the fillers between and after the output's rows are
/// untouched, and the non-finite answer is a scan of the output.
#[test]
fn gemm_kernels_compute_the_same_bits_at_every_level() {
    let levels: Vec<Level> = simd::supported()
        .into_iter()
        .filter(|&l| l >= Level::Avx2Fma)
        .collect();
    if levels.is_empty() && cfg!(target_arch = "x86_64") {
        eprintln!("no FMA on this CPU: nothing to compare");
        return;
    }
    let mut rng = Rng(41);
    let widths = [
        1, 7, 8, 9, 15, 16, 17, 24, 25, 32, 33, 48, 49, 63, 64, 65, 136,
    ];
    let swept: Vec<(usize, usize)> = (1..=50).flat_map(|m| widths.map(|n| (m, n))).collect();
    for case in 0..200 + swept.len() {
        let (k, m, n) = match case.checked_sub(200) {
            None => (
                1 + below(&mut rng, 128),
                1 + below(&mut rng, if case % 5 == 0 { 128 } else { 20 }),
                1 + below(&mut rng, if case % 7 == 0 { 400 } else { 70 }),
            ),
            Some(i) => (1 + below(&mut rng, 24), swept[i].0, swept[i].1),
        };
        let gap = |rng: &mut Rng| if case % 2 == 0 { 0 } else { below(rng, 9) };
        let l = gemm::Layout {
            stat: (gap(&mut rng), m + gap(&mut rng)),
            mov: (gap(&mut rng), n + gap(&mut rng)),
            out: (gap(&mut rng), n + gap(&mut rng)),
        };
        let finite = case % 3 != 0;
        let draw = |rng: &mut Rng| loop {
            let v = value(rng);
            if v.is_finite() || !finite {
                return v;
            }
        };
        let stat = placed(
            &(0..k * m).map(|_| draw(&mut rng)).collect::<Vec<_>>(),
            (k, m),
            l.stat,
        );
        let mov = placed(
            &(0..k * n).map(|_| draw(&mut rng)).collect::<Vec<_>>(),
            (k, n),
            l.mov,
        );
        let old = placed(
            &(0..m * n).map(|_| draw(&mut rng)).collect::<Vec<_>>(),
            (m, n),
            l.out,
        );
        for accumulate in [false, true] {
            let run = |level| {
                let _forced = Forced::new(level);
                let mut out = old.clone();
                let nf = gemm::gemm(
                    &stat,
                    &mov,
                    (k, m, n),
                    l,
                    &mut out,
                    accumulate,
                    &mut Vec::new(),
                );
                (out, nf)
            };
            let direct = |kernel| {
                let mut out = old.clone();
                gemm::gemm_with(kernel, &stat, &mov, (k, m, n), l, &mut out, accumulate)
                    .map(|nf| (out, nf))
            };
            let (want, want_nf) =
                direct(gemm::Kernel::PortableFused).expect("FMA: the reference runs");
            let scanned = (0..m).any(|r| {
                want[l.out.0 + r * l.out.1..][..n]
                    .iter()
                    .any(|v| !v.is_finite())
            });
            assert_eq!(want_nf, scanned, "K {k} M {m} N {n} {l:?}");
            for (level, (got, nf)) in levels
                .iter()
                .map(|&level| (format!("{level:?}"), run(level)))
                .chain(
                    [
                        gemm::Kernel::Avx2,
                        gemm::Kernel::Avx2Narrow,
                        gemm::Kernel::Avx512,
                    ]
                    .into_iter()
                    .filter_map(|kernel| {
                        Some((format!("{kernel:?} kernel direct"), direct(kernel)?))
                    }),
                )
            {
                let what = format!("{level} K {k} M {m} N {n} {l:?} accumulate {accumulate}");
                assert_eq!(nf, want_nf, "{what}: non-finite");
                for (i, (&g, &w)) in got.iter().zip(&want).enumerate() {
                    assert!(
                        same_bits(g, w),
                        "{what}[{i}]: got {g:e} ({:#x}), want {w:e} ({:#x})",
                        g.to_bits(),
                        w.to_bits()
                    );
                }
            }
        }
    }
}

/// Runs `inst` on `engine` over a copy of `state` at every level; the states and effects must
/// be identical, word for word (a transpose moves values, an activation's NaN is either the
/// input's or ReLU's default NaN).
fn same_at_every_level(state: &ComputeState, engine: Engine, inst: &Instruction, what: &str) {
    let op = decode(engine, inst.op().unwrap(), inst).unwrap().unwrap();
    let mut results = Vec::new();
    for level in simd::supported() {
        let _forced = Forced::new(level);
        let mut s = ComputeState::new();
        s.sbuf.clone_from(&state.sbuf);
        s.psum.clone_from(&state.psum);
        s.tables_loaded = state.tables_loaded;
        let effect = execute(&mut s, &op).unwrap();
        results.push((level, effect, s.sbuf, s.psum));
    }
    let (l0, e0, sbuf0, psum0) = &results[0];
    for (level, effect, sbuf, psum) in &results[1..] {
        assert_eq!(effect, e0, "{what}: {level:?} vs {l0:?}");
        for (space, got, want) in [("SBUF", sbuf, sbuf0), ("PSUM", psum, psum0)] {
            let (got, want) = (got.as_deref(), want.as_deref());
            // Whole buffers first (a memcmp), the first difference only when there is one.
            if got != want {
                let at = got
                    .unwrap_or_default()
                    .iter()
                    .zip(want.unwrap_or_default())
                    .position(|(g, w)| g != w);
                panic!("{what}: {level:?} vs {l0:?}: {space} byte {at:?} differs");
            }
        }
    }
}

/// A state with random values (NaN, ±∞ and −0 among them unless `finite`) in the first
/// `bytes` of every SBUF and PSUM partition.
fn random_state(rng: &mut Rng, bytes: u32, finite: bool) -> ComputeState {
    let mut state = ComputeState::new();
    state.set_tables_loaded(true);
    for tile in [
        Tile::sbuf(0, 128, 0, bytes / 4),
        Tile::psum(0, 128, 0, bytes / 4),
    ] {
        let values: Vec<f32> = (0..128 * bytes / 4)
            .map(|_| {
                loop {
                    let v = value(rng);
                    if v.is_finite() || !finite {
                        return v;
                    }
                }
            })
            .collect();
        state.scatter(&tile, &values).unwrap();
    }
    state
}

fn u32_of(v: usize) -> u32 {
    u32::try_from(v).unwrap()
}

/// Transposes of random shapes (the edges of the 8 × 8 blocks), places and spaces.
#[test]
fn transposes_move_the_same_values_at_every_level() {
    let mut rng = Rng(43);
    for case in 0..80 {
        let state = random_state(&mut rng, 2048, case % 4 != 0);
        let (p, f) = (1 + below(&mut rng, 128), 1 + below(&mut rng, 128));
        let (p0, f0) = (below(&mut rng, 129 - p), below(&mut rng, 129 - f));
        let src = Tile::sbuf(
            u32_of(p0),
            u32_of(p),
            u32_of(4 * below(&mut rng, 200)),
            u32_of(f),
        );
        let dst = if case % 7 == 3 {
            // Over its own source (partitions and bytes shared): gathered first at every
            // level; the levels must still agree.
            Tile::sbuf(
                u32_of(f0),
                u32_of(f),
                src.offset + 4 * u32_of(below(&mut rng, 8)),
                u32_of(p),
            )
        } else if case % 5 == 0 {
            Tile::psum(
                u32_of(f0),
                u32_of(f),
                u32_of(4 * below(&mut rng, 100)),
                u32_of(p),
            )
        } else {
            Tile::sbuf(
                u32_of(f0),
                u32_of(f),
                u32_of(4 * (600 + below(&mut rng, 200))),
                u32_of(p),
            )
        };
        let inst = Instruction::with_tiles(Opcode::Transpose, &[dst, src], &[]);
        same_at_every_level(
            &state,
            Engine::Dve,
            &inst,
            &format!("transpose {src:?} -> {dst:?}"),
        );
    }
}

/// The shape-only output function at every level: random streams, offsets (word-aligned or
/// not) and lengths (short, and long enough for many vector iterations with edges), each
/// byte as the portable `shared` function writes it, and nothing outside `buf` touched.
#[test]
fn shape_only_outputs_are_the_same_bytes_at_every_level() {
    let mut rng = Rng(53);
    for case in 0..200 {
        let stream = rng.next();
        let offset = rng.below(1 << 40);
        let len = if case % 2 == 0 {
            below(&mut rng, 40)
        } else {
            below(&mut rng, 5000)
        };
        let mut expected = vec![0xA5u8; len + 16];
        shared::neff_program::shape_only::fill(stream, offset, &mut expected[8..8 + len]);
        for level in simd::supported() {
            let _forced = Forced::new(level);
            let mut got = vec![0xA5u8; len + 16];
            shape_only_fill(stream, offset, &mut got[8..8 + len]);
            assert!(
                got == expected,
                "{level:?}: stream {stream:#x}, offset {offset}, {len} bytes"
            );
        }
    }
}

/// Identity and ReLU activations of random rows (lengths not multiples of 8) from PSUM to SBUF
/// and back, with random scales and per-partition or immediate biases; among the inputs NaN,
/// ±∞ and −0 (and a −0 input with a −0 bias, whose ReLU is decided by `max_nan`), for both
/// functions (a ReLU row with a NaN is the one the AVX2 loop does twice).
#[test]
fn identity_and_relu_activations_compute_the_same_bits_at_every_level() {
    let mut rng = Rng(47);
    for case in 0..80 {
        let mut state = random_state(&mut rng, 4096, case % 5 < 2);
        let (p, f) = (1 + below(&mut rng, 128), 1 + below(&mut rng, 300));
        let p0 = below(&mut rng, 129 - p);
        let psum = Tile::psum(u32_of(p0), u32_of(p), 0, u32_of(f));
        let sbuf = Tile::sbuf(u32_of(p0), u32_of(p), 2048, u32_of(f));
        let (dst, src) = if case % 2 == 0 {
            (sbuf, psum)
        } else {
            (psum, sbuf)
        };
        // Finite biases (one NaN source per element: the payload is then defined), −0 among
        // them; the bias vector at SBUF offset 4096 of the destination's partitions.
        let biases: Vec<f32> = (0..128)
            .map(|i| if i % 7 == 0 { -0.0 } else { value(&mut rng) })
            .map(|v| if v.is_finite() { v } else { 0.5 })
            .collect();
        state
            .scatter(&Tile::sbuf(0, 128, 4096, 1), &biases)
            .unwrap();
        if case % 6 == 0 {
            let negative_zeros = vec![-0.0; p * f];
            state.scatter(&src, &negative_zeros).unwrap();
        }
        let scale = [1.0f32, -0.75, 0.0, 3.5][case % 4];
        let func = if case % 3 == 0 {
            ActFunc::Identity
        } else {
            ActFunc::Relu
        };
        let (mode, arg) = if case % 4 == 3 {
            (ScalarMode::Immediate, (-0.0f32).to_bits())
        } else {
            (ScalarMode::PerPartition, 4096)
        };
        let inst = Instruction::with_tiles(
            Opcode::Activation,
            &[dst, src],
            &[func as u32, scale.to_bits(), mode as u32, arg],
        );
        same_at_every_level(
            &state,
            Engine::Act,
            &inst,
            &format!("{func:?} {src:?} -> {dst:?}"),
        );
    }
}

/// Max and min of two zeros are IEEE 754's `maximum` and `minimum` in every build (`+0` above
/// `−0`; `f32::max` leaves the sign unspecified, and a debug build answered `−0` for the
/// ReLU of `−0`, where an optimised build and `maxps` answer `+0`), and a NaN stays the default
/// NaN.
#[test]
fn max_and_min_of_zeros_are_ieee_maximum_and_minimum() {
    let bits = |v: f32| v.to_bits();
    for (a, b) in [(-0.0f32, 0.0f32), (0.0, -0.0), (0.0, 0.0)] {
        assert_eq!(bits(max_nan(a, b)), bits(0.0), "max({a}, {b})");
    }
    assert_eq!(bits(max_nan(-0.0, -0.0)), bits(-0.0));
    for (a, b) in [(-0.0f32, 0.0f32), (0.0, -0.0), (-0.0, -0.0)] {
        assert_eq!(bits(min_nan(a, b)), bits(-0.0), "min({a}, {b})");
    }
    assert_eq!(bits(min_nan(0.0, 0.0)), bits(0.0));
    assert_eq!(bits(max_nan(f32::NAN, 0.0)), bits(f32::NAN));
    assert_eq!(bits(max_nan(-f32::NAN, 1.0)), bits(f32::NAN));
    assert_eq!(bits(min_nan(2.0, -f32::NAN)), bits(f32::NAN));
    assert_eq!(bits(max_nan(-3.0, 2.5)), bits(2.5));
    assert_eq!(bits(min_nan(-3.0, 2.5)), bits(-3.0));
}

/// Random `stat` (K × M) and `mov` (K × N, rows `stride` apart, the last row ending exactly at
/// the end of its slice), their layout (the output contiguous), and the portable kernel's
/// fused chains over them: the output and whether a value in it is not finite.
struct EndingAtSliceEnd {
    stat: Vec<f32>,
    mov: Vec<f32>,
    layout: gemm::Layout,
    want: Vec<f32>,
    want_nf: bool,
}

impl EndingAtSliceEnd {
    fn new(rng: &mut Rng, (k, m, n): (usize, usize, usize), stride: usize) -> Self {
        let stat: Vec<f32> = (0..k * m).map(|_| value(rng)).collect();
        let rows: Vec<f32> = (0..k * n).map(|_| value(rng)).collect();
        let mut mov = placed(&rows, (k, n), (0, stride));
        mov.truncate((k - 1) * stride + n);
        let layout = gemm::Layout {
            mov: (0, stride),
            ..gemm::Layout::contiguous(m, n)
        };
        let mut want = vec![0.0; m * n];
        let kernel = gemm::Kernel::PortableFused;
        let want_nf = gemm::gemm_with(kernel, &stat, &mov, (k, m, n), layout, &mut want, false)
            .expect("FMA: the reference runs");
        Self {
            stat,
            mov,
            layout,
            want,
            want_nf,
        }
    }
}

/// The AVX-512 kernel reads the moving matrix where it lies: the packing buffer stays empty
/// (the kernel used to copy the moving matrix into it), and a moving matrix that ends exactly
/// at the end of its slice, `n` not a multiple of 16, computes the same bits as the AVX2
/// kernel (its last vector's lanes past `n` are masked off, never read).
#[test]
fn the_avx512_gemm_reads_the_moving_matrix_in_place_up_to_the_end_of_its_slice() {
    if !simd::supported().contains(&Level::Avx512) {
        eprintln!("no AVX-512F on this CPU: nothing to check");
        return;
    }
    let mut rng = Rng(53);
    for (k, m, n) in [
        (64, 64, 360),
        (32, 10, 17),
        (1, 1, 16),
        (128, 9, 47),
        (7, 13, 33),
    ] {
        let EndingAtSliceEnd {
            stat,
            mov,
            layout: l,
            want,
            want_nf,
        } = EndingAtSliceEnd::new(&mut rng, (k, m, n), n + 5);
        let run = |level| {
            let _forced = Forced::new(level);
            let (mut out, mut pack) = (vec![0.0; m * n], Vec::new());
            let nf = gemm::gemm(&stat, &mov, (k, m, n), l, &mut out, false, &mut pack);
            (out, nf, pack.len())
        };
        let (got, nf, packed) = run(Level::Avx512);
        assert_eq!(packed, 0, "K {k} M {m} N {n}: the AVX-512 kernel packed");
        assert_eq!(nf, want_nf, "K {k} M {m} N {n}: non-finite");
        for (i, (&g, &w)) in got.iter().zip(&want).enumerate() {
            assert!(same_bits(g, w), "K {k} M {m} N {n} [{i}]: {g:e} vs {w:e}");
        }
    }
}

/// The AVX2 kernel packs each panel of the moving matrix into the caller's buffer, which
/// grows once to its full size and is reused (no allocation after the first `Matmul`), and
/// reads a moving matrix that ends exactly at the end of its slice, `n` not a multiple of 8
/// (the partial panel's lanes past `n` are masked off, never read): the same bits as the
/// portable kernel.
#[test]
fn the_avx2_gemm_packs_into_a_buffer_grown_once_and_reads_up_to_the_end_of_the_slice() {
    if !simd::supported().contains(&Level::Avx2Fma) {
        eprintln!("no AVX2 and FMA on this CPU: nothing to check");
        return;
    }
    let _forced = Forced::new(Level::Avx2Fma);
    let mut rng = Rng(61);
    let mut pack = Vec::new();
    let mut grown_to = None;
    for (k, m, n) in [
        (64, 64, 360),
        (32, 10, 17),
        (1, 1, 8),
        (128, 9, 47),
        (7, 13, 33),
        (128, 128, 9),
    ] {
        let EndingAtSliceEnd {
            stat,
            mov,
            layout: l,
            want,
            want_nf,
        } = EndingAtSliceEnd::new(&mut rng, (k, m, n), n + 3);
        let mut got = vec![0.0; m * n];
        let nf = gemm::gemm(&stat, &mov, (k, m, n), l, &mut got, false, &mut pack);
        let (len, capacity) = (pack.len(), pack.capacity());
        assert!(len > 0, "K {k} M {m} N {n}: nothing packed");
        assert_eq!(*grown_to.get_or_insert((len, capacity)), (len, capacity));
        assert_eq!(nf, want_nf, "K {k} M {m} N {n}: non-finite");
        for (i, (&g, &w)) in got.iter().zip(&want).enumerate() {
            assert!(same_bits(g, w), "K {k} M {m} N {n} [{i}]: {g:e} vs {w:e}");
        }
    }
}

/// One NaN or infinity, anywhere in an otherwise finite source (every row and column of the
/// transposes' 8 × 8 blocks and edges, every lane of an activation row's vectors and its
/// tail), is reported by every level; none, by none.
#[test]
fn a_single_non_finite_value_is_reported_at_every_level() {
    let mut rng = Rng(59);
    for case in 0..60 {
        let mut state = random_state(&mut rng, 4096, true);
        let (p, f) = (1 + below(&mut rng, 40), 1 + below(&mut rng, 90));
        let src = Tile::sbuf(0, u32_of(p), 0, u32_of(f));
        let bad = [f32::NAN, f32::INFINITY, f32::NEG_INFINITY][case % 3];
        if case % 5 != 4 {
            let (i, j) = (below(&mut rng, p), below(&mut rng, f));
            let one = Tile::sbuf(u32_of(i), 1, u32_of(4 * j), 1);
            state.scatter(&one, &[bad]).unwrap();
        }
        let transpose = Instruction::with_tiles(
            Opcode::Transpose,
            &[Tile::sbuf(0, u32_of(f), 8192, u32_of(p)), src],
            &[],
        );
        same_at_every_level(
            &state,
            Engine::Dve,
            &transpose,
            &format!("transpose {src:?}"),
        );
        let func = if case % 2 == 0 {
            ActFunc::Identity
        } else {
            ActFunc::Relu
        };
        let activation = Instruction::with_tiles(
            Opcode::Activation,
            &[Tile::psum(0, u32_of(p), 0, u32_of(f)), src],
            &[func as u32, 1.0f32.to_bits(), ScalarMode::None as u32, 0],
        );
        same_at_every_level(
            &state,
            Engine::Act,
            &activation,
            &format!("{func:?} {src:?}"),
        );
    }
}
