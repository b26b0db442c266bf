//! The numerical-errors policy (libnrt since 2.25, `reference/nrt-api.md` §3): an execution
//! whose results hold NaN/Inf returns success unless `NEURON_RT_NUMERICAL_ERRORS_VERBOSITY=critical`
//! or `NEURON_FAIL_ON_NAN=1` asks for NRT_EXEC_COMPLETED_WITH_NUM_ERR (1003); its outputs are
//! delivered either way, to device and host tensors alike.

use std::collections::HashMap;
use std::sync::Arc;

use runtime::builder::identity;
use runtime::config::RuntimeConfig;
use runtime::{Placement, Runtime, TensorSet};
use shared::NrtStatus;
use shared::model::Target;
use shared::protocol::{FaultKind, FaultSpec, FaultWhen};
use tests::bench::IdentityIo;
use tests::{connect, start_simdev};

const BYTES: usize = 4096;
const BYTES_U32: u32 = 4096;

/// Runs two executions, the second with a numerical error injected, on device tensors and
/// then on host tensors under the configuration read from `env`; returns the second
/// execution's status of each and checks that every execution delivered its output.
fn numerical_statuses(env: &[(&str, &str)]) -> Vec<NrtStatus> {
    let vars: HashMap<String, String> = env
        .iter()
        .map(|(k, v)| ((*k).to_string(), (*v).to_string()))
        .collect();
    let config = RuntimeConfig::from_lookup(|k| vars.get(k).cloned()).unwrap();
    let sim = start_simdev(&["--hbm", "16M"]);
    let dev = Arc::new(connect(&sim));
    let rt = Runtime::init(dev.clone(), config).unwrap();
    let container = identity(BYTES_U32).to_container(Target::Simdev).unwrap();
    let m = rt.load(&container, 0).unwrap();
    let mut statuses = Vec::new();
    for placement in [Placement::Device { vnc: 0 }, Placement::Host] {
        let input = rt
            .tensor_allocate(placement, BYTES as u64, "input")
            .unwrap();
        let output = rt
            .tensor_allocate(placement, BYTES as u64, "output")
            .unwrap();
        let (mut ins, mut outs) = (TensorSet::new(), TensorSet::new());
        ins.add("input", &input);
        outs.add("output", &output);
        dev.inject_fault(FaultSpec {
            kind: FaultKind::Numerical,
            nc: Some(0),
            when: FaultWhen::NthExecution(2),
        })
        .unwrap();
        let mut last = NrtStatus::Success;
        for e in 0..2u8 {
            let pattern: Vec<u8> = (0..BYTES).map(|i| i.to_le_bytes()[0] ^ e ^ 0x5A).collect();
            input.write(&pattern, 0).unwrap();
            output.write(&[0; BYTES], 0).unwrap();
            last = match rt.execute(m, &ins, &outs) {
                Ok(()) => NrtStatus::Success,
                Err(err) => err.status,
            };
            let mut got = vec![0u8; BYTES];
            output.read(&mut got, 0).unwrap();
            assert!(
                got == pattern,
                "{placement:?} execution {e} ({last}): outputs delivered"
            );
        }
        // Both executions wrote the output, the 1003 one included: both count
        // (`nrt_tensor_check_output_completion`).
        assert_eq!(output.output_completions(), 2, "{placement:?}");
        output
            .wait_output_completion(2, Some(std::time::Duration::ZERO))
            .unwrap();
        statuses.push(last);
    }
    rt.close();
    statuses
}

#[test]
fn a_failed_execution_does_not_count_as_written_output() {
    let sim = start_simdev(&["--hbm", "16M"]);
    let dev = Arc::new(connect(&sim));
    let rt = Runtime::init(dev.clone(), RuntimeConfig::default()).unwrap();
    let io = IdentityIo::load(&rt, 64);
    let (m, ins, outs, output) = (io.model, &io.inputs, &io.outputs, &io.output);
    dev.inject_fault(FaultSpec {
        kind: FaultKind::GenericError,
        nc: Some(0),
        when: FaultWhen::NthExecution(2),
    })
    .unwrap();
    rt.execute(m, ins, outs).unwrap();
    let e = rt.execute(m, ins, outs).unwrap_err();
    assert_eq!(e.status, NrtStatus::ExecCompletedWithErr);
    rt.execute(m, ins, outs).unwrap();
    assert_eq!(output.output_completions(), 2);
    let e = output
        .wait_output_completion(3, Some(std::time::Duration::from_millis(1)))
        .unwrap_err();
    assert_eq!(e.status, NrtStatus::Timeout);
    assert!(e.message.contains("written 2 of the 3 times"), "{e}");
    rt.close();
}

#[test]
fn a_numerical_error_is_a_success_by_default_with_the_outputs_delivered() {
    assert_eq!(numerical_statuses(&[]), [NrtStatus::Success; 2]);
    assert_eq!(
        numerical_statuses(&[("NEURON_RT_NUMERICAL_ERRORS_VERBOSITY", "none")]),
        [NrtStatus::Success; 2]
    );
}

#[test]
fn verbosity_critical_reports_1003_with_the_outputs_delivered() {
    assert_eq!(
        numerical_statuses(&[("NEURON_RT_NUMERICAL_ERRORS_VERBOSITY", "critical")]),
        [NrtStatus::ExecCompletedWithNumErr; 2]
    );
}

#[test]
fn fail_on_nan_reports_1003_with_the_outputs_delivered() {
    assert_eq!(
        numerical_statuses(&[("NEURON_FAIL_ON_NAN", "1")]),
        [NrtStatus::ExecCompletedWithNumErr; 2]
    );
}

#[test]
fn funtime_executions_count_their_outputs_as_written() {
    let sim = start_simdev(&["--hbm", "16M"]);
    let dev = Arc::new(connect(&sim));
    let rt = Runtime::init(
        dev,
        RuntimeConfig {
            funtime: true,
            ..RuntimeConfig::default()
        },
    )
    .unwrap();
    let io = IdentityIo::load(&rt, 64);
    rt.execute(io.model, &io.inputs, &io.outputs).unwrap();
    rt.execute(io.model, &io.inputs, &io.outputs).unwrap();
    assert_eq!(io.output.output_completions(), 2);
    assert_eq!(io.input.output_completions(), 0);
    rt.close();
}
