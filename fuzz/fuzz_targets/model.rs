//! The model container parser (`shared::model::Model::from_container`): a model file from disk,
//! as `nrt_load` reads it, for both targets.
//! Properties: parsing never panics nor allocates far beyond the input; a parsed model is
//! valid, re-serialises, and parses back to the same model. Each input is tried as it is and
//! with its checksum made right, so the body decoder behind the CRC is fuzzed too.
#![no_main]

use libfuzzer_sys::fuzz_target;
use shared::model::{CHECKSUM_OFFSET, Model, Target, container_checksum, looks_like_neff};

fuzz_target!(|data: &[u8]| {
    let _ = looks_like_neff(data);
    let mut fixed = data.to_vec();
    if fixed.len() >= CHECKSUM_OFFSET + 4 {
        let crc = container_checksum(&fixed);
        fixed[CHECKSUM_OFFSET..CHECKSUM_OFFSET + 4].copy_from_slice(&crc.to_le_bytes());
    }
    for (input, target) in [data, &fixed[..]]
        .into_iter()
        .flat_map(|d| [(d, Target::Simdev), (d, Target::Silicon)])
    {
        if let Ok(model) = Model::from_container(input, target) {
            model.validate().expect("a parsed model is valid");
            let bytes = model.to_container(target).expect("a parsed model re-serialises");
            let again = Model::from_container(&bytes, target).expect("round trip");
            assert_eq!(again, model);
        }
    }
});
