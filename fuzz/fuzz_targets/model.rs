//! The model container parser (`shared::model::Model::from_container`): a model file from disk,
//! as `nrt_load` reads it, for both targets.
//! Properties: parsing never panics nor allocates far beyond the input; a parsed model is
//! valid, re-serialises, and parses back to the same model.
#![no_main]

use libfuzzer_sys::fuzz_target;
use shared::model::{Model, Target, looks_like_neff};

fuzz_target!(|data: &[u8]| {
    let _ = looks_like_neff(data);
    for target in [Target::Simdev, Target::Silicon] {
        if let Ok(model) = Model::from_container(data, target) {
            model.validate().expect("a parsed model is valid");
            let bytes = model.to_container(target).expect("a parsed model re-serialises");
            let again = Model::from_container(&bytes, target).expect("round trip");
            assert_eq!(again, model);
        }
    }
});
