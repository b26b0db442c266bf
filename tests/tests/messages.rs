//! Error messages that name the right thing: an LNC=2 timeout names the physical NC whose
//! notification is missing; an identity model too large for its I/O ring says the largest size
//! that fits, in bytes.

use std::sync::Arc;
use std::time::Duration;

use runtime::builder::{identity, identity_split};
use runtime::config::RuntimeConfig;
use runtime::{Placement, Runtime, TensorSet};
use shared::NrtStatus;
use shared::model::Target;
use shared::protocol::{FaultKind, FaultSpec, FaultWhen};
use tests::{connect, start_simdev};

#[test]
fn an_lnc2_timeout_names_the_physical_nc_whose_notification_is_missing() {
    let sim = start_simdev(&["--arch", "trn2", "--hbm", "64M"]);
    let dev = Arc::new(connect(&sim));
    let cfg = RuntimeConfig {
        lnc: Some(2),
        exec_timeout: Duration::from_millis(300),
        ..RuntimeConfig::default()
    };
    let rt = Runtime::init(dev.clone(), cfg).unwrap();
    let container = identity_split(4096).to_container(Target::Simdev).unwrap();
    // Logical core 1 is physical NCs 2 and 3; NC 3 withholds its notification.
    let m = rt.load(&container, 1).unwrap();
    let input = rt
        .tensor_allocate(Placement::Device { vnc: 1 }, 4096, "input")
        .unwrap();
    let output = rt
        .tensor_allocate(Placement::Device { vnc: 1 }, 4096, "output")
        .unwrap();
    let (mut ins, mut outs) = (TensorSet::new(), TensorSet::new());
    ins.add("input", &input);
    outs.add("output", &output);
    rt.execute(m, &ins, &outs).unwrap();
    dev.inject_fault(FaultSpec {
        kind: FaultKind::MissingCompletion,
        nc: Some(3),
        when: FaultWhen::NthExecution(1),
    })
    .unwrap();
    let e = rt.execute(m, &ins, &outs).unwrap_err();
    assert_eq!(e.status, NrtStatus::Timeout, "{e}");
    assert!(e.message.contains("logical core 1"), "{e}");
    assert!(e.message.contains("physical NC 3 "), "{e}");
    assert!(
        !e.message.contains("physical NC 2 "),
        "NC 2 did report: {e}"
    );
    rt.close();
}

#[test]
fn an_identity_model_too_large_for_its_ring_says_the_largest_size_in_bytes() {
    let sim = start_simdev(&["--hbm", "16M"]);
    let dev = Arc::new(connect(&sim));
    let rt = Runtime::init(dev, RuntimeConfig::default()).unwrap();
    // 16 in flight (+1 staged) share the 16384-descriptor ring: 963 descriptors of 64 KiB each
    // per execution at most.
    let most = 16384 / 17 * 65536u32;
    rt.load(&identity(most).to_container(Target::Simdev).unwrap(), 0)
        .unwrap();
    let e = rt
        .load(&identity(most + 1).to_container(Target::Simdev).unwrap(), 0)
        .unwrap_err();
    assert_eq!(e.status, NrtStatus::Resource, "{e}");
    assert!(e.message.contains(&format!("at most {most} bytes")), "{e}");
    assert!(e.message.contains("964 descriptors"), "{e}");
    rt.close();
}
