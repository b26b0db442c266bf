//! The hardware backend ([`NeuronDevice`]) end to end against the real simdev binary, through
//! the kernel-ABI shim ([`SimIoctlPort`], DESIGN §4): every driver call goes out as the exact
//! aws-neuronx-dkms request value and argument bytes, the shim decodes them and forwards to
//! simdev. This exercises the backend's ABI bookkeeping (handles, mmap offsets, engine
//! numbering, the semaphore window, polling completion); it is not a run on silicon — the neuron
//! backend has still not been run on silicon.
//!
//! Model containers are built for `Target::Silicon`, because the runtime loads silicon
//! containers on any backend other than "sim"; their program bytes are simdev's ISA, since the
//! "silicon" behind the shim is simdev.

use std::sync::Arc;
use std::time::Duration;

use nix::errno::Errno;
use runtime::backend::neuron::{IoctlPort, NeuronDevice, SimIoctlPort};
use runtime::backend::sim::PrivateSimdev;
use runtime::backend::{DeviceError, DmaQueueId};
use runtime::builder::digits::{self, CLASSES, Digits, FEATURES};
use runtime::builder::identity;
use runtime::config::RuntimeConfig;
use runtime::dma::DmaQueue;
use runtime::{Device, ModelHandle, Placement, Runtime, TensorSet};
use shared::NrtStatus;
use shared::ioctl;
use shared::model::{Model, Target};
use shared::protocol::MemLocation;
use tests::{connect, start_simdev};

type Neuron = NeuronDevice<SimIoctlPort>;

/// The hardware backend over a fresh connection to `sim`.
fn neuron(sim: &PrivateSimdev) -> Neuron {
    NeuronDevice::with_port(SimIoctlPort::new(connect(sim))).expect("DEVICE_BASIC_INFO")
}

fn runtime_on(dev: &Arc<Neuron>) -> Runtime {
    runtime_with(dev, None)
}

/// A runtime on `dev` at `NEURON_LOGICAL_NC_CONFIG` `lnc` (`None`: unset, the device's default).
fn runtime_with(dev: &Arc<Neuron>, lnc: Option<u32>) -> Runtime {
    Runtime::init(
        dev.clone(),
        RuntimeConfig {
            exec_timeout: Duration::from_secs(20),
            lnc,
            ..RuntimeConfig::default()
        },
    )
    .expect("nrt_init through the neuron backend")
}

/// A silicon container (the target the runtime expects of a non-sim backend) holding simdev's
/// program bytes.
fn load(rt: &Runtime, model: &Model) -> ModelHandle {
    rt.load(&model.to_container(Target::Silicon).unwrap(), 0)
        .expect("load")
}

fn pattern(len: usize, seed: u32) -> Vec<u8> {
    (0..len)
        .map(|i| {
            let word = u32::try_from(i).unwrap().wrapping_add(seed);
            word.wrapping_mul(2_654_435_761).to_le_bytes()[3]
        })
        .collect()
}

fn queue(nc: u32, engine: u32, queue: u32) -> DmaQueueId {
    DmaQueueId { nc, engine, queue }
}

#[test]
fn the_device_reports_simdevs_arch_and_the_driver_facts() {
    let sim = start_simdev(&["--hbm", "64M"]);
    let dev = neuron(&sim);
    assert_eq!(dev.backend_name(), "neuron");
    assert_eq!(dev.info().arch, dev.port().sim().info().arch);
    assert_eq!(dev.info().nc_count, dev.port().sim().info().nc_count);
    assert!(
        dev.info().description.contains("not yet run on silicon"),
        "{}",
        dev.info().description
    );
    assert_eq!(dev.port().ioctl_count(ioctl::DEVICE_BASIC_INFO), 1);
}

#[test]
fn identity_runs_100_times_end_to_end_through_the_kernel_abi() {
    let sim = start_simdev(&["--hbm", "64M"]);
    let dev = Arc::new(neuron(&sim));
    let rt = runtime_on(&dev);
    let port = dev.port();
    assert_eq!(
        port.ioctl_count(ioctl::CRWL_WRITER_ENTER),
        2,
        "both NCs claimed"
    );
    assert_eq!(
        port.notification_entries(0),
        Some(runtime::api::NQ_ENTRIES),
        "simdev's ring holds the entries the backend reports"
    );
    let m = load(&rt, &identity(4096));
    let i = rt
        .tensor_allocate(Placement::Device { vnc: 0 }, 4096, "in")
        .unwrap();
    let o = rt
        .tensor_allocate(Placement::Device { vnc: 0 }, 4096, "out")
        .unwrap();
    let (mut ins, mut outs) = (TensorSet::new(), TensorSet::new());
    ins.add("input", &i);
    outs.add("output", &o);
    let doorbells = port.ioctl_count(ioctl::SEMAPHORE_INCREMENT);
    // The backend hands the completion engine no notification eventfd (silicon has no
    // completion interrupt), so every completion below is found by polling the ring.
    for k in 0..100 {
        let data = pattern(4096, k);
        i.write(&data, 0).unwrap();
        rt.execute(m, &ins, &outs)
            .unwrap_or_else(|e| panic!("run {k}: {e}"));
        let mut out = vec![0u8; 4096];
        o.read(&mut out, 0).unwrap();
        assert!(out == data, "run {k}: output differs");
    }
    assert_eq!(
        port.ioctl_count(ioctl::SEMAPHORE_INCREMENT) - doorbells,
        100,
        "one SEMAPHORE_INCREMENT doorbell per execution"
    );
    let counters = port.sim().nc_counters(0).unwrap();
    assert_eq!(counters.executions, 100);
    assert_eq!(counters.doorbells, 100);
    assert_eq!(
        rt.metrics()
            .snapshot(0)
            .unwrap()
            .executions_with(NrtStatus::Success),
        100
    );
    assert_eq!(rt.stale_notifications(), 0);
    drop((i, o, ins, outs));
    rt.unload(m).unwrap();
    rt.close();
    assert_eq!(port.ioctl_count(ioctl::CRWL_WRITER_DOWNGRADE), 2);
    assert_eq!(
        port.ioctl_count(ioctl::CRWL_READER_EXIT),
        2,
        "close gives both NCs back"
    );
    let stats = port.sim().device_stats().unwrap();
    assert_eq!(stats.claimed_ncs, 0, "{stats:?}");
    assert_eq!(stats.dma_queues, 0, "{stats:?}");
}

#[test]
fn the_digits_mlp_at_batch_360_classifies_355_of_360_through_the_neuron_backend() {
    let data = Digits::load(&digits::default_path()).unwrap();
    let sim = start_simdev(&["--hbm", "64M"]);
    let dev = Arc::new(neuron(&sim));
    let rt = runtime_on(&dev);
    let model = data.mlp().build(360).unwrap();
    let logits = tests::run_rows(
        &rt,
        Target::Silicon,
        &model,
        360,
        &data.inputs,
        FEATURES,
        CLASSES,
    );
    let max_diff = logits
        .iter()
        .zip(&data.logits)
        .map(|(a, b)| (a - b).abs())
        .fold(0f32, f32::max);
    assert!(max_diff <= 1e-4, "max |logit - reference| = {max_diff}");
    let correct = digits::argmax_rows(&logits)
        .iter()
        .zip(&data.labels)
        .filter(|(p, l)| i32::try_from(**p).ok() == Some(**l))
        .count();
    assert_eq!(correct, 355, "accuracy 0.986111 = 355/360");
    rt.close();
}

#[test]
fn a_dma_queue_moves_bytes_through_the_neuron_backend() {
    let sim = start_simdev(&["--hbm", "64M"]);
    let dev = neuron(&sim);
    // NC 1, engine 5, queue 7: eng_id 1·16+5 = 21 must decode back to NC 1, engine 5.
    dev.claim_nc(1).unwrap();
    let a = dev
        .mem_alloc(MemLocation::Hbm { nc: 1 }, 20_000, 0)
        .unwrap();
    let b = dev
        .mem_alloc(MemLocation::Hbm { nc: 1 }, 20_000, 0)
        .unwrap();
    let h = dev.mem_alloc(MemLocation::Host, 8192, 0).unwrap();
    assert_eq!(
        (a.size, h.size),
        (20_480, 8192),
        "sizes rounded to 4 KiB, as MEM_GET_EXTENDED_INFO reports them"
    );
    let (ma, mb, mh) = (
        dev.mem_map(&a).unwrap(),
        dev.mem_map(&b).unwrap(),
        dev.mem_map(&h).unwrap(),
    );
    let data = pattern(100_000 / 5, 3);
    ma.write(a.pa + 100, &data).unwrap();
    let mut q = DmaQueue::create(&dev, queue(1, 5, 7), 64, MemLocation::Hbm { nc: 1 }).unwrap();
    q.push_copy(a.pa + 100, b.pa + 3, data.len() as u64)
        .unwrap();
    q.push_copy(b.pa + 3, h.pa + 64, 4000).unwrap();
    q.kick(&dev).unwrap();
    let mut out = vec![0u8; data.len()];
    mb.read(b.pa + 3, &mut out).unwrap();
    assert!(out == data, "HBM to HBM");
    let mut host = vec![0u8; 4000];
    mh.read(h.pa + 64, &mut host).unwrap();
    assert_eq!(host, data[..4000], "HBM to host memory");
    let counters = dev.port().sim().nc_counters(1).unwrap();
    assert_eq!(counters.dma_bytes, data.len() as u64 + 4000);
    assert_eq!(dev.port().sim().nc_counters(0).unwrap().dma_bytes, 0);
    assert_eq!(dev.port().ioctl_count(ioctl::DMA_QUEUE_COPY_START), 1);
    q.release(&dev).unwrap();
    drop((ma, mb, mh));
    for handle in [a.handle, b.handle, h.handle] {
        dev.mem_free(handle).unwrap();
    }
    dev.release_nc(1).unwrap();
}

#[test]
fn semaphores_events_the_window_and_reset_round_trip() {
    let sim = start_simdev(&["--hbm", "64M"]);
    let dev = neuron(&sim);
    let claimed = dev.claim_nc(0).unwrap();
    assert!(
        claimed.notification_fd.is_none(),
        "silicon has no completion interrupt"
    );
    let window = claimed
        .semaphore_window
        .expect("RESOURCE_MMAP_INFO and the window map");
    dev.semaphore_write(0, 5, 7).unwrap();
    dev.semaphore_increment(0, 5, 3).unwrap();
    dev.semaphore_decrement(0, 5, 1).unwrap();
    assert_eq!(dev.semaphore_read(0, 5).unwrap(), 9);
    let sem = |index: u64| {
        window
            .load_u32(
                window.pa() + 0x1000 + 4 * index,
                std::sync::atomic::Ordering::Acquire,
            )
            .unwrap()
    };
    assert_eq!(sem(5), 9, "the window shows the semaphore");
    dev.event_set(0, 17, 1).unwrap();
    assert_eq!(dev.event_get(0, 17).unwrap(), 1);
    dev.nc_reset(0).unwrap();
    assert_eq!(
        dev.semaphore_read(0, 5).unwrap(),
        0,
        "reset zeroes semaphores"
    );
    assert_eq!(dev.event_get(0, 17).unwrap(), 0, "and events");
    assert_eq!(sem(5), 0);
    assert_eq!(dev.port().ioctl_count(ioctl::NC_RESET_READY), 1);
    dev.release_nc(0).unwrap();
}

#[test]
fn a_busy_nc_is_an_ioctl_error_with_status_nc_busy() {
    let sim = start_simdev(&["--hbm", "64M"]);
    let first = neuron(&sim);
    let second = neuron(&sim);
    first.claim_nc(0).unwrap();
    let err = second.claim_nc(0).unwrap_err();
    assert!(
        matches!(
            err,
            DeviceError::Ioctl {
                op: "CRWL_WRITER_ENTER",
                request: ioctl::CRWL_WRITER_ENTER,
                source: Errno::EBUSY,
            }
        ),
        "{err:?}"
    );
    assert_eq!(err.status(), NrtStatus::ExecNcBusy);
    // nrt_init on the second connection names the busy NC.
    let e = Runtime::init(Arc::new(second), RuntimeConfig::default()).unwrap_err();
    assert_eq!(e.status, NrtStatus::ExecNcBusy, "{e}");
    assert!(e.message.contains("NC 0"), "{e}");
}

#[test]
fn out_of_range_ids_never_reach_the_port_and_refusals_become_errnos() {
    let sim = start_simdev(&["--hbm", "64M"]);
    let dev = neuron(&sim);
    dev.claim_nc(0).unwrap();
    let before = dev.port().ioctl_total();
    for result in [
        dev.semaphore_increment(0, 256, 1),
        dev.semaphore_write(2, 0, 1),
        dev.event_set(0, 256, 1),
    ] {
        assert!(
            matches!(result, Err(DeviceError::OutOfRange { .. })),
            "{result:?}"
        );
    }
    assert_eq!(dev.port().ioctl_total(), before, "refused before the port");
    // Out of memory in simdev is ENOMEM, NRT_RESOURCE.
    let err = dev
        .mem_alloc(MemLocation::Hbm { nc: 0 }, 1 << 30, 0)
        .unwrap_err();
    assert!(
        matches!(
            err,
            DeviceError::Ioctl {
                source: Errno::ENOMEM,
                ..
            }
        ),
        "{err:?}"
    );
    assert_eq!(err.status(), NrtStatus::Resource);
}

#[test]
fn the_port_checks_request_values_and_argument_lengths() {
    let sim = start_simdev(&["--hbm", "64M"]);
    let port = SimIoctlPort::new(connect(&sim));
    assert_eq!(port.ioctl(0x8008_4E99, &mut [0; 8]), Err(Errno::ENOTTY));
    assert_eq!(
        port.ioctl(ioctl::DEVICE_INFO, &mut [0; 80]),
        Err(Errno::ENOTTY),
        "not decoded by the shim"
    );
    assert_eq!(
        port.ioctl(ioctl::SEMAPHORE_INCREMENT, &mut [0; 8]),
        Err(Errno::EINVAL),
        "the _IOC size says 8, the driver copies 12"
    );
    assert_eq!(
        port.ioctl(ioctl::MEM_ALLOC_V2, &mut [0; 40]),
        Err(Errno::EINVAL),
        "a pointer argument only through ioctl_out_u64"
    );
    assert_eq!(
        port.ioctl_out_u64(ioctl::MEM_ALLOC_V2, &mut [0; 40], 24),
        Err(Errno::EINVAL)
    );
    assert_eq!(
        port.ioctl_out_u64(ioctl::MEM_FREE, &mut [0; 8], 0),
        Err(Errno::EINVAL)
    );
    // MEM_GET_EXTENDED_INFO of an unknown handle: the driver's positive return, hence EIO.
    let mut info = [0u8; 48];
    info[..8].copy_from_slice(&77u64.to_le_bytes());
    assert_eq!(
        port.ioctl(ioctl::MEM_GET_EXTENDED_INFO, &mut info),
        Err(Errno::EIO)
    );
}

#[test]
fn mem_get_extended_info_answers_in_place_and_maps_are_whole_chunks() {
    let sim = start_simdev(&["--hbm", "64M"]);
    let dev = neuron(&sim);
    dev.claim_nc(0).unwrap();
    let a = dev.mem_alloc(MemLocation::Hbm { nc: 0 }, 5000, 0).unwrap();
    let port = dev.port();
    // neuron_ioctl_mem_get_extended_info: mem_handle u64 @0, version u32 @8, host_memory u32
    // @12, mmap_offset u64 @16, pa u64 @24, pid u64 @32, size u64 @40.
    let mut info = [0u8; 48];
    info[..8].copy_from_slice(&a.handle.0.to_le_bytes());
    info[8..12].copy_from_slice(&0xDEAD_BEEFu32.to_le_bytes());
    port.ioctl(ioctl::MEM_GET_EXTENDED_INFO, &mut info).unwrap();
    let u64_at = |at: usize| u64::from_le_bytes(info[at..at + 8].try_into().unwrap());
    let u32_at = |at: usize| u32::from_le_bytes(info[at..at + 4].try_into().unwrap());
    assert_ne!(
        u64_at(0),
        a.handle.0,
        "mem_handle clobbered, as the driver does"
    );
    assert_eq!(u32_at(8), 0xDEAD_BEEF, "version left alone");
    assert_eq!(u32_at(12), 0, "host_memory");
    assert_eq!((u64_at(16), u64_at(24)), (a.pa, a.pa), "mmap_offset = pa");
    assert_eq!(u64_at(32), u64::from(std::process::id()), "pid");
    assert_eq!(u64_at(40), 8192, "size rounded to 4 KiB");
    let partial = port.map(a.pa, a.pa, 4096, true);
    assert!(
        matches!(partial, Err(shared::memory::MemError::Map { .. })),
        "{partial:?}"
    );
    assert!(port.map(a.pa + 4096, a.pa + 4096, 4096, true).is_err());
    assert!(port.map(a.pa, a.pa, 8192, true).is_ok());
}

/// The backend asks NOTIFICATIONS_INIT_V2 for `nq_bytes(entries)` rounded up to a power of two
/// and to at least 4 KiB, and reports `entries` as the ring's size; the ABI carries only the
/// bytes. A 4 KiB ring holds 64 simdev entries, so below 64 entries the backend's count and the
/// ring's disagree: a reader wrapping at the backend's 16 waits in slot 0 for entry 16, which
/// simdev writes in slot 16.
#[test]
fn small_notification_queues_hold_the_entries_the_backend_reports() {
    let sim = start_simdev(&["--hbm", "64M"]);
    let dev = neuron(&sim);
    dev.claim_nc(0).unwrap();
    let mut nq = tests::NqReader::new(dev.notification_queue_init(0, 16).unwrap());
    let dst = dev.mem_alloc(MemLocation::Hbm { nc: 0 }, 4096, 0).unwrap();
    // 17 DMA aborts (a source PA in no chunk), one per queue since an abort stops its queue:
    // 17 notifications.
    for n in 0..17u32 {
        let mut q = DmaQueue::create(
            &dev,
            queue(0, n / 16, n % 16),
            32,
            MemLocation::Hbm { nc: 0 },
        )
        .unwrap();
        q.push_copy(0x1000, dst.pa, 64).unwrap();
        q.kick(&dev).unwrap();
        assert!(
            nq.next_within(Duration::from_secs(2)).is_some(),
            "notification {n} (backend entries {}, simdev entries {:?})",
            nq.nq.entries,
            dev.port().notification_entries(0)
        );
    }
}

#[test]
fn trn2_eight_ncs_two_per_hbm_stack_run_identity() {
    let sim = start_simdev(&["--arch", "trn2", "--hbm", "64M"]);
    let dev = Arc::new(neuron(&sim));
    assert_eq!(dev.info().nc_count, 8);
    // Unset, the logical core of a trn2 is two NCs (libnrt's default): 4 logical cores.
    let rt = runtime_on(&dev);
    assert_eq!((rt.lnc(), rt.visible_vnc_count()), (2, 4));
    rt.close();
    // nrt_init allocates on every NC: MEM_ALLOC_V2 carries dram_channel nc / 2, which the shim
    // checks against the NC. At LNC=1 logical core 5 is NC 5.
    let rt = runtime_with(&dev, Some(1));
    let m = load(&rt, &identity(4096));
    let far = rt
        .tensor_allocate(Placement::Device { vnc: 5 }, 4096, "on NC 5, HBM stack 2")
        .unwrap();
    let sim_info = dev.port().sim().info();
    let nc5 = sim_info.hbm_bases[5]..sim_info.hbm_bases[5] + sim_info.hbm_bytes_per_nc;
    assert!(
        nc5.contains(&far.device_pa().unwrap()),
        "in simdev's NC 5 HBM"
    );
    let i = rt
        .tensor_allocate(Placement::Device { vnc: 0 }, 4096, "in")
        .unwrap();
    let o = rt
        .tensor_allocate(Placement::Device { vnc: 0 }, 4096, "out")
        .unwrap();
    let (mut ins, mut outs) = (TensorSet::new(), TensorSet::new());
    ins.add("input", &i);
    outs.add("output", &o);
    for k in 0..10 {
        let data = pattern(4096, k);
        i.write(&data, 0).unwrap();
        rt.execute(m, &ins, &outs).unwrap();
        let mut out = vec![0u8; 4096];
        o.read(&mut out, 0).unwrap();
        assert!(out == data, "run {k}");
    }
    assert_eq!(dev.port().sim().nc_counters(0).unwrap().executions, 10);
    rt.close();
}

#[test]
fn notification_rings_are_the_drivers_size_and_live_as_long_as_the_nc() {
    let sim = start_simdev(&["--hbm", "64M"]);
    let dev = neuron(&sim);
    dev.claim_nc(0).unwrap();
    let nq = dev.notification_queue_init(0, 1024).unwrap();
    assert_eq!(dev.port().notification_entries(0), Some(1024));
    assert_eq!(
        nq.allocation.size, 65_536,
        "the power of two the driver needs"
    );
    // The shim's documented deviation: simdev's ring chunk is only as long as its 1024
    // entries need (rounded to 4 KiB), and that is what the map returns.
    assert_eq!(nq.memory.len(), 36_864);
    assert_eq!(nq.memory.pa(), nq.allocation.pa);
    let again = dev.notification_queue_init(0, 1024).unwrap();
    assert_eq!(
        again.allocation.handle, nq.allocation.handle,
        "a second init returns the existing ring"
    );
    assert_eq!(dev.port().sim().device_stats().unwrap().chunks, 1);
}
