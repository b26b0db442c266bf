//! The doorbell against the emulated device in-process: fan-out order, the first failure
//! stops the loop, and every failure is NRT_FAILURE but a lost device's (NRT_HW_ERROR).

use shared::NrtStatus;

use super::kickoff_exec;
use crate::backend::Device;
use crate::test_support::Rig;

#[test]
fn kickoff_rings_each_nc_once_in_the_order_given() {
    let rig = Rig::with(shared::Arch::Trn2, 4);
    for nc in 0..4 {
        rig.backend.claim_nc(nc).unwrap();
    }
    kickoff_exec(&*rig.backend, &[3, 1, 2]).unwrap();
    assert_eq!(rig.backend.doorbells(), [3, 1, 2]);
    let rung: Vec<u64> = (0..4).map(|nc| rig.counters(nc).doorbells).collect();
    assert_eq!(
        rung,
        [0, 1, 1, 1],
        "the device saw one doorbell per NC given"
    );
    assert!((0..4).all(|nc| rig.counters(nc).posted_errors == 0));
}

#[test]
fn the_first_failing_doorbell_stops_the_loop_with_nrt_failure() {
    let rig = Rig::new();
    rig.backend.claim_nc(0).unwrap();
    rig.backend.claim_nc(1).unwrap();
    rig.backend.fail_next_doorbells(1);
    let e = kickoff_exec(&*rig.backend, &[0, 1]).unwrap_err();
    assert_eq!(e.status, NrtStatus::Failure, "{e}");
    assert!(
        e.message
            .contains("Failed to post inference request on NC 0"),
        "{e}"
    );
    assert_eq!(rig.backend.doorbells(), [0], "NC 1 is never rung");
    assert_eq!(
        (rig.counters(0).doorbells, rig.counters(1).doorbells),
        (0, 0)
    );
}

#[test]
fn a_doorbell_to_a_device_that_is_gone_is_nrt_hw_error() {
    let rig = Rig::new();
    rig.backend.claim_nc(0).unwrap();
    rig.backend.lose_device_at_next_doorbells(1);
    let e = kickoff_exec(&*rig.backend, &[0]).unwrap_err();
    assert_eq!(e.status, NrtStatus::HwError, "{e}");
    assert!(
        e.message
            .contains("Failed to post inference request on NC 0"),
        "{e}"
    );
}

#[test]
fn an_out_of_range_nc_is_nrt_failure_not_the_backends_status() {
    // The backend's range check (DeviceError::OutOfRange, NRT_INVALID when mapped) fails the
    // second doorbell: the loop reports NRT_FAILURE and the third NC is not rung.
    let rig = Rig::new();
    rig.backend.claim_nc(0).unwrap();
    rig.backend.claim_nc(1).unwrap();
    let e = kickoff_exec(&*rig.backend, &[0, 9, 1]).unwrap_err();
    assert_eq!(e.status, NrtStatus::Failure, "{e}");
    assert!(e.message.contains("NC 9"), "{e}");
    assert_eq!(rig.backend.doorbells(), [0, 9]);
    assert_eq!(
        (rig.counters(0).doorbells, rig.counters(1).doorbells),
        (1, 0)
    );
}
