//! Core reservation at init against the real simdev binary: `NEURON_RT_NUM_CORES` takes free
//! cores, `NEURON_RT_VISIBLE_CORES` exact ones, and every reserved NC is reset at init
//! (`runtime::reserve`).

use std::sync::Arc;
use std::time::Duration;

use runtime::backend::sim::{PrivateSimdev, SimDevice};
use runtime::config::RuntimeConfig;
use runtime::{Device, Runtime};
use shared::NrtStatus;
use tests::{connect, start_simdev};

fn config(num_cores: u32, visible_cores: Option<(u32, u32)>) -> RuntimeConfig {
    RuntimeConfig {
        num_cores,
        visible_cores,
        exec_timeout: Duration::from_secs(5),
        ..RuntimeConfig::default()
    }
}

fn init(sim: &PrivateSimdev, cfg: RuntimeConfig) -> runtime::NrtResult<Runtime> {
    Runtime::init(Arc::new(connect(sim)) as Arc<dyn Device>, cfg)
}

fn claimed_ncs(dev: &SimDevice) -> u32 {
    dev.device_stats().unwrap().claimed_ncs
}

#[test]
fn num_cores_takes_free_cores_and_refuses_only_when_too_few_are_free() {
    let sim = start_simdev(&["--ncs", "2", "--hbm", "16M"]);
    let a = init(&sim, config(1, None)).unwrap();
    assert_eq!(a.vnc_ncs(0), Some(&[0][..]));
    let b = init(&sim, config(1, None)).expect("NC 1 is free");
    assert_eq!(b.vnc_ncs(0), Some(&[1][..]));
    let e = init(&sim, config(1, None)).unwrap_err();
    assert_eq!(e.status, NrtStatus::LoadNotEnoughNc, "{}", e.message);
    assert!(
        e.message
            .contains("only 0 of the device's 2 logical cores are free"),
        "{}",
        e.message
    );
    // A visible core is exact: busy is an error, as in libnrt.
    let e = init(&sim, config(0, Some((1, 1)))).unwrap_err();
    assert_eq!(e.status, NrtStatus::ExecNcBusy, "{}", e.message);
    assert!(e.message.contains("NC 1"), "{}", e.message);
    assert!(
        e.message
            .starts_with("logical core 1 is in use by another process (claiming NC 1: ")
            && e.message.contains("NEURON_RT_VISIBLE_CORES")
            && e.message.contains("NEURON_RT_NUM_CORES"),
        "{}",
        e.message
    );
    // Two asked, one free: refused, and the free one is not kept.
    b.close();
    let e = init(&sim, config(2, None)).unwrap_err();
    assert_eq!(e.status, NrtStatus::LoadNotEnoughNc, "{}", e.message);
    assert!(e.message.contains("only 1 of"), "{}", e.message);
    let probe = connect(&sim);
    assert_eq!(
        claimed_ncs(&probe),
        1,
        "the NC claimed on the way was given back"
    );
    let c = init(&sim, config(1, None)).unwrap();
    assert_eq!(c.vnc_ncs(0), Some(&[1][..]));
    c.close();
    a.close();
}

#[test]
fn with_lnc2_a_half_busy_logical_core_is_skipped_and_given_back() {
    let sim = start_simdev(&["--arch", "trn2", "--ncs", "4", "--hbm", "16M"]);
    let squatter = connect(&sim);
    squatter.claim_nc(1).unwrap();
    let rt = init(
        &sim,
        RuntimeConfig {
            lnc: Some(2),
            ..config(1, None)
        },
    )
    .unwrap();
    assert_eq!(rt.vnc_ncs(0), Some(&[2, 3][..]));
    assert_eq!(
        claimed_ncs(&squatter),
        3,
        "NC 0 was claimed, then given back"
    );
    rt.close();
}

#[test]
fn init_resets_every_reserved_nc_and_release_counts_too() {
    let sim = start_simdev(&["--ncs", "2", "--hbm", "16M"]);
    let rt = init(&sim, config(0, None)).unwrap();
    let probe = connect(&sim);
    for nc in 0..2 {
        assert_eq!(
            probe.nc_counters(nc).unwrap().resets,
            1,
            "NC {nc} after init"
        );
    }
    rt.close();
    for nc in 0..2 {
        assert_eq!(
            probe.nc_counters(nc).unwrap().resets,
            2,
            "NC {nc}: the release reset counts"
        );
    }
}

#[test]
fn a_semaphore_left_behind_is_zero_after_init_unless_reset_is_off() {
    let sim = start_simdev(&["--ncs", "2", "--hbm", "16M"]);
    for (reset, expected) in [(true, 0), (false, 5)] {
        let dev = Arc::new(connect(&sim));
        // A previous user of this connection left semaphore 3 of NC 0 at 5.
        dev.claim_nc(0).unwrap();
        dev.semaphore_write(0, 3, 5).unwrap();
        let rt = Runtime::init(
            dev.clone() as Arc<dyn Device>,
            RuntimeConfig {
                reset_cores: reset,
                ..config(0, Some((0, 1)))
            },
        )
        .unwrap();
        assert_eq!(
            dev.semaphore_read(0, 3).unwrap(),
            expected,
            "NEURON_RT_RESET_CORES={}",
            u8::from(reset)
        );
        rt.close();
    }
}
