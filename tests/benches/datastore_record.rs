//! The datastore's cost on the execute path, measured directly: one
//! `Metrics::record_completion` (per-TPB, per-core and per-model counters of one execution) on
//! the shared datastore file and on the private mapping, beside the execute round trip it is
//! part of (`nrt bench --datastore both` measures that round trip on and off).
//!
//! Run: `cargo bench -p tests --bench datastore_record`. Figures are printed, not asserted.

use std::sync::Arc;
use std::time::{Duration, Instant};

use runtime::datastore::Datastore;
use runtime::metrics::{Metrics, TpbResponse};
use shared::NrtStatus;

const CALLS: u32 = 2_000_000;

fn per_call(metrics: &Metrics, slot: Option<runtime::datastore::ModelSlot>) -> f64 {
    let resp = [TpbResponse {
        device_ts_ns: 30_000,
        nc_ns: 25_000,
        error_flags: 0,
    }; 2];
    let mut best = f64::MAX;
    for _ in 0..5 {
        let start = Instant::now();
        for i in 0..CALLS {
            metrics.record_completion(
                0,
                &[0],
                slot,
                NrtStatus::Success,
                Duration::from_nanos(50_000 + u64::from(i % 1000) * 97),
                std::hint::black_box(&resp),
            );
        }
        best = best.min(start.elapsed().as_secs_f64() * 1e9 / f64::from(CALLS));
    }
    best
}

fn main() {
    let dir = tempfile::tempdir().unwrap();
    let file = Arc::new(Datastore::create(dir.path(), &[vec![0]], 1).unwrap());
    let slot = file.model_loaded(1, 0, "bench", [0; 16], 0);
    let private = Arc::new(Datastore::private(&[vec![0]], 1).unwrap());
    let pslot = private.model_loaded(1, 0, "bench", [0; 16], 0);
    let on = per_call(&Metrics::with_datastore(file, 1), slot);
    let off = per_call(&Metrics::with_datastore(private, 1), pslot);
    println!(
        "record_completion (1 TPB, core and model): file {on:.1} ns/call, private {off:.1} ns/call (best of 5 × {CALLS})"
    );
}
