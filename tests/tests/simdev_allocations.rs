//! simdev's own execution path in steady state (issue 17, target 2): no heap allocation per
//! execution, and no thread hand-off between a doorbell's arrival and its notification (every
//! sync execution inline on the connection's thread, none handed to the NC's sequencer).
//!
//! The allocations are counted inside the simdev process (`tests::counted_simdev`: the
//! `counted-simdev` binary, simdev with a counting global allocator, queried on its stdin);
//! the hand-offs are simdev's per-NC counters `inline_executions` and `sequencer_handoffs`.
//! Both are deterministic: no timing is asserted.

use std::path::Path;
use std::sync::Arc;

use runtime::Runtime;
use runtime::builder::digits::{self, CLASSES, Digits, FEATURES};
use runtime::config::RuntimeConfig;
use runtime::{Placement, TensorSet};
use shared::model::Target;
use tests::bench::IdentityIo;
use tests::counted_simdev::{CountedSimdev, SimdevCost};

const WARM_UP: u64 = 300;
const N: u64 = 1_000;

fn counted_simdev() -> CountedSimdev {
    CountedSimdev::spawn(
        Path::new(env!("CARGO_BIN_EXE_counted-simdev")),
        &["--hbm", "64M"],
    )
    .unwrap()
}

#[test]
fn the_allocation_count_is_simdevs_and_queries_cost_nothing() {
    let mut sim = counted_simdev();
    sim.wait_quiescent().unwrap();
    // Starting simdev allocated (so the count is simdev's, not a constant).
    let first = sim.allocations().unwrap();
    assert!(first > 0, "simdev started without one allocation?");
    // Asking costs nothing: idle simdev, consecutive queries, the same count.
    assert_eq!(sim.allocations().unwrap(), first, "a query allocated");
    assert_eq!(sim.allocations().unwrap(), first, "a query allocated");
    // A client's handshake and claim make simdev allocate (the count sees simdev's threads).
    let dev = sim.connect().unwrap();
    runtime::Device::claim_nc(&dev, 0).unwrap();
    sim.wait_quiescent().unwrap();
    assert!(
        sim.allocations().unwrap() > first,
        "simdev's work is counted"
    );
}

#[test]
fn steady_state_executions_cost_simdev_no_allocation_and_no_hand_off() {
    let mut sim = counted_simdev();
    let dev = Arc::new(sim.connect().unwrap());
    let rt = Runtime::init(
        dev.clone(),
        RuntimeConfig {
            num_cores: 1,
            datastore: false,
            ..RuntimeConfig::default()
        },
    )
    .unwrap();

    let id = IdentityIo::load(&rt, 64);
    id.input.write(&[0x5A; 64], 0).unwrap();
    let identity = |n: u64| {
        for _ in 0..n {
            rt.execute(id.model, &id.inputs, &id.outputs).unwrap();
        }
    };

    let data = Digits::load(&digits::default_path()).unwrap();
    let digits_model = rt
        .load(
            &data
                .mlp()
                .build(1)
                .unwrap()
                .to_container(Target::Simdev)
                .unwrap(),
            0,
        )
        .unwrap();
    let on = Placement::Device { vnc: 0 };
    let x = rt.tensor_allocate(on, (FEATURES * 4) as u64, "x").unwrap();
    let y = rt.tensor_allocate(on, (CLASSES * 4) as u64, "y").unwrap();
    let row: Vec<u8> = data.inputs[..FEATURES]
        .iter()
        .flat_map(|v| v.to_le_bytes())
        .collect();
    x.write(&row, 0).unwrap();
    let (mut ins, mut outs) = (TensorSet::new(), TensorSet::new());
    ins.add("input", &x);
    outs.add("output", &y);
    let digits = |n: u64| {
        for _ in 0..n {
            rt.execute(digits_model, &ins, &outs).unwrap();
        }
    };

    identity(WARM_UP);
    digits(WARM_UP);
    // Each measured run follows a warm-up of its own model (so no model switch falls inside).
    let identity_cost = SimdevCost::measure(&mut sim, &dev, 0, N, || identity(N)).unwrap();
    digits(WARM_UP);
    let digits_cost = SimdevCost::measure(&mut sim, &dev, 0, N, || digits(N)).unwrap();

    // The executions really ran, and computed.
    let mut out = [0u8; 64];
    id.output.read(&mut out, 0).unwrap();
    assert_eq!(out, [0x5A; 64]);
    let mut logits = [0u8; CLASSES * 4];
    y.read(&mut logits, 0).unwrap();
    for (i, c) in logits.chunks_exact(4).enumerate() {
        let v = f32::from_le_bytes([c[0], c[1], c[2], c[3]]);
        assert!((v - data.logits[i]).abs() <= 1e-4, "logit {i}: {v}");
    }

    let costs = [
        ("identity 64 B", identity_cost),
        ("digits batch 1", digits_cost),
    ];
    for (name, cost) in &costs {
        eprintln!("{name}: {cost:?}");
    }
    for (name, cost) in costs {
        assert_eq!(
            cost.executions, N,
            "{name}: simdev ran one execution per call"
        );
        assert_eq!(
            cost.allocations,
            0,
            "{name}: simdev allocated {} times in {N} executions ({:.2} per execution)",
            cost.allocations,
            cost.per_call(cost.allocations)
        );
        assert_eq!(
            (cost.inline_executions, cost.sequencer_handoffs),
            (N, 0),
            "{name}: every execution runs inline on the doorbell's thread, none is handed to \
             the sequencer"
        );
    }
    drop((id, x, y, ins, outs));
    rt.close();
}
