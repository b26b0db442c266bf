//! Compute on simdev through nrt_execute: the trained digits MLP on the real UCI test set at
//! batch 1 and 360, and random dense stacks from the builder against a plain Rust forward pass.

use std::sync::Arc;
use std::time::Duration;

use proptest::prelude::*;
use runtime::Runtime;
use runtime::builder::MlpBuilder;
use runtime::builder::digits::{self, CLASSES, Digits, FEATURES};
use runtime::config::RuntimeConfig;
use shared::isa::ActFunc;
use tests::{connect, start_simdev};

fn runtime_on_simdev() -> (Runtime, runtime::backend::sim::PrivateSimdev) {
    let sim = start_simdev(&["--hbm", "64M"]);
    let dev = Arc::new(connect(&sim));
    let rt = Runtime::init(
        dev,
        RuntimeConfig {
            exec_timeout: Duration::from_secs(20),
            ..RuntimeConfig::default()
        },
    )
    .unwrap();
    (rt, sim)
}

/// Runs `builder` at `batch` over all rows of `inputs` (zero-padding the last batch).
fn run_model(
    rt: &Runtime,
    builder: &MlpBuilder,
    batch: usize,
    inputs: &[f32],
    features: usize,
    outputs: usize,
) -> Vec<f32> {
    tests::run_rows(
        rt,
        shared::model::Target::Simdev,
        &builder.build(u32::try_from(batch).unwrap()).unwrap(),
        batch,
        inputs,
        features,
        outputs,
    )
}

fn check_digits(batch: usize) {
    let data = Digits::load(&digits::default_path()).unwrap();
    let (rt, _sim) = runtime_on_simdev();
    let logits = run_model(&rt, &data.mlp(), batch, &data.inputs, FEATURES, CLASSES);
    let max_diff = logits
        .iter()
        .zip(&data.logits)
        .map(|(a, b)| (a - b).abs())
        .fold(0f32, f32::max);
    assert!(
        max_diff <= 1e-4,
        "batch {batch}: max |logit - reference| = {max_diff}"
    );
    let correct = digits::argmax_rows(&logits)
        .iter()
        .zip(&data.labels)
        .filter(|(p, l)| i32::try_from(**p).ok() == Some(**l))
        .count();
    assert_eq!(correct, 355, "batch {batch}: accuracy 0.986111 = 355/360");
    let m = rt.metrics().snapshot(0).unwrap();
    assert_eq!(
        m.executions_with(shared::NrtStatus::Success),
        360u64.div_ceil(batch as u64)
    );
    rt.close();
}

#[test]
fn the_digits_mlp_classifies_the_test_set_at_batch_1() {
    check_digits(1);
}

#[test]
fn the_digits_mlp_classifies_the_test_set_at_batch_360() {
    check_digits(360);
}

#[test]
fn a_softmax_head_gives_probabilities() {
    let data = Digits::load(&digits::default_path()).unwrap();
    let (rt, _sim) = runtime_on_simdev();
    let inputs = &data.inputs[..20 * FEATURES];
    let probs = run_model(&rt, &data.mlp().softmax(), 20, inputs, FEATURES, CLASSES);
    let reference = data.mlp().softmax().reference_forward(inputs).unwrap();
    for (row, (p, r)) in probs
        .chunks(CLASSES)
        .zip(reference.chunks(CLASSES))
        .enumerate()
    {
        assert!(
            (p.iter().sum::<f32>() - 1.0).abs() < 1e-5,
            "row {row} sums to 1"
        );
        for (a, b) in p.iter().zip(r) {
            assert!((a - b).abs() < 1e-5, "row {row}: {a} vs {b}");
        }
    }
    rt.close();
}

fn act() -> impl Strategy<Value = Option<ActFunc>> {
    prop_oneof![
        Just(None),
        Just(Some(ActFunc::Relu)),
        Just(Some(ActFunc::Sigmoid)),
        Just(Some(ActFunc::Tanh)),
        Just(Some(ActFunc::Gelu)),
        Just(Some(ActFunc::Silu)),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 12, .. ProptestConfig::default() })]

    #[test]
    fn random_dense_stacks_match_a_plain_forward_pass(
        dims in proptest::collection::vec(1u32..=40, 2..=4),
        acts in proptest::collection::vec(act(), 3),
        batch in 1usize..=150,
        seed in any::<u64>(),
    ) {
        let mut rng = seed;
        let mut next = move || {
            rng = rng.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1_442_695_040_888_963_407);
            ((rng >> 40) as f32 / (1u64 << 24) as f32) - 0.5
        };
        let mut b = MlpBuilder::new("random", dims[0]);
        for (l, pair) in dims.windows(2).enumerate() {
            let (k, n) = (pair[0] as usize, pair[1] as usize);
            b = b.dense((0..k * n).map(|_| next()).collect(), (0..n).map(|_| next()).collect());
            if let Some(f) = acts[l % acts.len()] {
                b = b.activation(f);
            }
        }
        let features = dims[0] as usize;
        let outputs = *dims.last().unwrap() as usize;
        let inputs: Vec<f32> = (0..batch * features).map(|_| next() * 4.0).collect();
        let (rt, _sim) = runtime_on_simdev();
        let got = run_model(&rt, &b, batch, &inputs, features, outputs);
        let want = b.reference_forward(&inputs).unwrap();
        rt.close();
        for (i, (g, w)) in got.iter().zip(&want).enumerate() {
            prop_assert!((g - w).abs() <= 1e-4 * (1.0 + w.abs()), "output {i}: device {g}, reference {w}");
        }
    }
}
