//! `nrt_close` tears the device state down (nrt-api.md §2.3) even while tensors the caller never
//! freed live on: with a shared simdev the runtime's connection closes, so simdev frees what it
//! held, as the driver does when the device file is closed. One test in its own process, since
//! the runtime's state is process-wide.

use runtime::backend::OpenOptions;
use runtime::backend::select::BackendKind;
use runtime::{Placement, nrt};

#[test]
fn nrt_close_releases_the_device_memory_of_tensors_never_freed() {
    let sim = tests::start_simdev(&["--hbm", "16M"]);
    let opts = OpenOptions {
        kind: BackendKind::Sim,
        simdev_socket: Some(sim.socket().to_owned()),
        ..OpenOptions::default()
    };
    let mut kept = Vec::new();
    for cycle in 0..4 {
        nrt::init_with(&opts).unwrap();
        // 12 MiB of the NC's 16: a second one fits only if the first was released.
        let t = nrt::tensor_allocate(Placement::Device { vnc: 0 }, 12 << 20, "kept")
            .unwrap_or_else(|e| panic!("cycle {cycle}: {e}"));
        t.write(&[cycle; 64], 0).unwrap();
        kept.push(t);
        nrt::close();
        // simdev has let the closed runtime's connection go: it lists no other client.
        let observer = runtime::backend::sim::SimDevice::connect(sim.socket()).unwrap();
        let clients = tests::wait_for(std::time::Duration::from_secs(10), || {
            let c = observer.clients().unwrap();
            c.is_empty().then_some(c)
        });
        assert!(clients.is_some(), "cycle {cycle}: {:?}", observer.clients());
    }
    // Freeing them now is harmless (their device is gone: the frees fail quietly).
    drop(kept);
}
