//! The in-process link: the handshake, fds handed over, posted requests, reclaim at drop.

use std::sync::Arc;

use shared::protocol::{ErrorKind, MemLocation, PROTOCOL_VERSION};

use super::SimDevice;
use crate::backend::{Device, DeviceError};
use crate::test_support::emulated_device;

#[test]
fn the_in_process_link_says_hello_hands_over_fds_and_the_device_reclaims_at_drop() {
    let device = emulated_device(shared::Arch::Trn1, 2);
    let sim = SimDevice::in_process(device.clone()).unwrap();
    assert_eq!(sim.info(), device.info(), "the Hello reply's device info");
    assert_eq!(sim.socket().to_str(), Some("in-process"));
    assert!(!sim.is_private());
    assert_eq!(device.stats().clients, 1);
    let claimed = sim.claim_nc(0).unwrap();
    assert!(claimed.semaphore_window.is_some(), "the window's memfd");
    assert!(claimed.notification_fd.is_some(), "the NC's eventfd");
    let a = sim.mem_alloc(MemLocation::Host, 4096, 0).unwrap();
    let chunk = sim.mem_map(&a).unwrap();
    chunk.write(a.pa, b"abcd").unwrap();
    let again = sim.mem_map(&a).unwrap();
    let mut back = [0u8; 4];
    again.read(a.pa, &mut back).unwrap();
    assert_eq!(&back, b"abcd", "both mappings are the device's chunk");
    let stats = device.stats();
    assert_eq!((stats.claimed_ncs, stats.chunks), (1, 1));
    drop(sim);
    let stats = device.stats();
    assert_eq!(
        (stats.clients, stats.claimed_ncs, stats.chunks),
        (0, 0, 0),
        "dropping the link ends the connection: the device reclaims the client"
    );
}

#[test]
fn the_in_process_link_refuses_another_protocol_version() {
    let device = emulated_device(shared::Arch::Trn1, 2);
    let e = SimDevice::in_process_with_version(device.clone(), PROTOCOL_VERSION + 1).unwrap_err();
    match e {
        DeviceError::Remote { op, source } => {
            assert_eq!(op, "Hello");
            assert_eq!(source.kind, ErrorKind::Handshake, "{source}");
        }
        other => panic!("expected a handshake refusal, got {other:?}"),
    }
    assert_eq!(device.stats().clients, 0, "the refused connection is gone");
}

#[test]
fn a_posted_semaphore_increment_reaches_the_device_before_the_next_request() {
    let device = emulated_device(shared::Arch::Trn1, 2);
    let sim = SimDevice::in_process(device.clone()).unwrap();
    sim.claim_nc(1).unwrap();
    sim.semaphore_increment(1, 5, 3).unwrap();
    sim.semaphore_increment(1, 5, 4).unwrap();
    assert_eq!(sim.semaphore_read(1, 5).unwrap(), 7);
    let counters = device.counters(1).unwrap();
    assert_eq!((counters.doorbells, counters.posted_errors), (2, 0));
    // A posted request the device refuses (NC 0 is not this client's) gets no reply: it is
    // counted, and the next request is answered normally.
    sim.semaphore_increment(0, 5, 1).unwrap();
    assert_eq!(device.counters(0).unwrap().posted_errors, 1);
    assert_eq!(sim.semaphore_read(1, 5).unwrap(), 7);
}

#[test]
fn two_in_process_clients_are_separate_connections() {
    let device = emulated_device(shared::Arch::Trn1, 2);
    let a = SimDevice::in_process(device.clone()).unwrap();
    let b =
        SimDevice::in_process(Arc::clone(&device) as Arc<dyn shared::protocol::Handler>).unwrap();
    a.claim_nc(0).unwrap();
    let e = b.claim_nc(0).unwrap_err();
    assert!(
        matches!(e, DeviceError::Remote { .. }),
        "an NC owned by another client: {e:?}"
    );
    drop(a);
    b.claim_nc(0).unwrap();
}

/// Posted requests are encoded into a `POSTED_MSG_SIZE` buffer: the largest doorbell fits.
#[test]
fn the_largest_posted_request_fits_the_posted_message_buffer() {
    let doorbell = shared::protocol::Request::SemaphoreIncrement {
        nc: u32::MAX,
        index: u32::MAX,
        value: u32::MAX,
    };
    assert!(doorbell.is_posted());
    let mut buf = [0u8; super::POSTED_MSG_SIZE];
    let n = shared::protocol::encode(&doorbell, &mut buf).unwrap();
    assert!(n <= super::POSTED_MSG_SIZE);
}
