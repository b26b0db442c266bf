//! Issue 11 item 5: a corrupted model container is refused at `nrt_load` (NRT_INVALID naming
//! the checksum mismatch), never loaded and run with wrong outputs.
//!
//! The digits MLP container (weights, biases, five engines' programs, ring templates) is built,
//! then every bit of its header and a dense stride of the bits of its body are flipped one at a
//! time and loaded through the runtime on a real simdev. Before the container had a checksum,
//! about 40% of such flips loaded and ran with wrong logits.

use std::sync::Arc;
use std::time::Duration;

use runtime::Runtime;
use runtime::builder::digits::{self, CLASSES, Digits, FEATURES};
use runtime::config::RuntimeConfig;
use shared::NrtStatus;
use shared::model::{Model, Target};
use tests::{connect, start_simdev};

/// Every `BODY_STRIDE`-th bit of the body is flipped (a prime, so every bit position within a
/// byte and every field alignment is hit).
const BODY_STRIDE: usize = 61;

#[test]
fn every_sampled_bit_flip_of_the_digits_container_is_refused_at_load() {
    let data = Digits::load(&digits::default_path()).unwrap();
    let model = data.mlp().build(1).unwrap();
    let good = model.to_container(Target::Simdev).unwrap();
    let header_bits = std::mem::size_of::<shared::model::ContainerHeader>() * 8;

    let sim = start_simdev(&["--hbm", "64M"]);
    let rt = Runtime::init(
        Arc::new(connect(&sim)),
        RuntimeConfig {
            exec_timeout: Duration::from_secs(20),
            ..RuntimeConfig::default()
        },
    )
    .unwrap();

    let bits = (0..header_bits).chain((header_bits..good.len() * 8).step_by(BODY_STRIDE));
    let mut tried = 0usize;
    let mut loaded = Vec::new();
    let mut checksum_refusals = 0usize;
    for bit in bits {
        let mut bad = good.clone();
        bad[bit / 8] ^= 1 << (bit % 8);
        tried += 1;
        match rt.load(&bad, 0) {
            Ok(h) => {
                loaded.push(bit);
                rt.unload(h).unwrap();
            }
            Err(e) => {
                assert_eq!(e.status, NrtStatus::Invalid, "bit {bit}: {e}");
                if e.message.contains("checksum mismatch") {
                    checksum_refusals += 1;
                }
            }
        }
    }
    assert!(
        loaded.is_empty(),
        "{} of {tried} single-bit flips loaded (bits {:?}…)",
        loaded.len(),
        &loaded[..loaded.len().min(10)]
    );
    // Only flips of the magic, version and body length are caught before the checksum.
    assert!(
        checksum_refusals >= tried - 24 * 8,
        "{checksum_refusals} of {tried} refusals name the checksum"
    );
    assert!(tried > 2000, "{tried} flips");

    // The intact container still loads and classifies the test set as before.
    assert_eq!(Model::from_container(&good, Target::Simdev).unwrap(), model);
    let rows = 36;
    let inputs = &data.inputs[..rows * FEATURES];
    let logits = tests::run_rows(&rt, Target::Simdev, &model, 1, inputs, FEATURES, CLASSES);
    assert_eq!(logits.len(), rows * CLASSES);
    let max_diff = logits
        .iter()
        .zip(&data.logits[..rows * CLASSES])
        .map(|(a, b)| (a - b).abs())
        .fold(0f32, f32::max);
    assert!(max_diff <= 1e-4, "max |logit - reference| = {max_diff}");
    rt.close();
}
