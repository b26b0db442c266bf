//! What the runtime gives libnrt's C ABI, on the real simdev binary: device tensor slices bound
//! to an execution, the device allocation info and host address of a slice, the dma-buf-like
//! descriptor that maps a tensor's device memory, per-core memory statistics, instance info and
//! `nrt_load_collectives` with a group of one.

use std::time::Duration;

use runtime::builder::identity;
use runtime::config::RuntimeConfig;
use runtime::{Placement, Runtime, TensorSet};
use shared::NrtStatus;
use shared::model::Target;
use tests::{connect, start_simdev};

fn rig() -> (Runtime, runtime::backend::sim::PrivateSimdev) {
    let sim = start_simdev(&["--hbm", "64M"]);
    let rt = Runtime::init(
        std::sync::Arc::new(connect(&sim)),
        RuntimeConfig {
            exec_timeout: Duration::from_secs(10),
            ..RuntimeConfig::default()
        },
    )
    .expect("nrt_init");
    (rt, sim)
}

#[test]
fn device_slices_bind_at_their_offset_and_alias_the_source() {
    let (rt, _sim) = rig();
    let m = rt
        .load(&identity(64).to_container(Target::Simdev).unwrap(), 0)
        .unwrap();
    let dev = Placement::Device { vnc: 0 };
    let big_in = rt.tensor_allocate(dev, 256, "big_in").unwrap();
    let big_out = rt.tensor_allocate(dev, 256, "big_out").unwrap();
    let input: Vec<u8> = (0..=255).collect();
    big_in.write(&input, 0).unwrap();
    let i = big_in.slice(100, 64, "in").unwrap();
    let o = big_out.slice(32, 64, "out").unwrap();
    assert_eq!(i.device_pa(), big_in.device_pa().map(|pa| pa + 100));
    let info = o.device_allocation().unwrap();
    assert_eq!(info.physical_address, big_out.device_pa().unwrap() + 32);
    assert!(info.size >= 256);
    let (mut ins, mut outs) = (TensorSet::new(), TensorSet::new());
    ins.add("input", &i);
    outs.add("output", &o);
    drop(big_in); // the slice keeps the storage
    rt.execute(m, &ins, &outs).unwrap();
    let mut all = vec![0u8; 256];
    big_out.read(&mut all, 0).unwrap();
    assert!(all[..32].iter().all(|&b| b == 0));
    assert_eq!(&all[32..96], &input[100..164]);
    assert!(all[96..].iter().all(|&b| b == 0));
    // The host address of the slice is inside the source's mapping.
    assert_eq!(
        o.host_address().unwrap() as usize,
        big_out.host_address().unwrap() as usize + 32
    );
}

#[test]
fn the_dmabuf_descriptor_maps_the_tensors_device_memory() {
    let (rt, _sim) = rig();
    let t = rt
        .tensor_allocate(Placement::Device { vnc: 0 }, 8192, "t")
        .unwrap();
    t.write(b"device bytes", 4096).unwrap();
    let (fd, offset) = t.dmabuf_fd().unwrap();
    assert_eq!(offset, 0);
    let chunk = shared::SharedChunk::map_fd(&fd, 0, 8192, true).unwrap();
    let mut b = [0u8; 12];
    chunk.read(4096, &mut b).unwrap();
    assert_eq!(&b, b"device bytes");
    chunk.write(0, b"back").unwrap();
    let mut c = [0u8; 4];
    t.read(&mut c, 0).unwrap();
    assert_eq!(&c, b"back", "the descriptor maps the same memory");
    let h = rt.tensor_allocate(Placement::Host, 8, "h").unwrap();
    assert_eq!(h.dmabuf_fd().unwrap_err().status, NrtStatus::Invalid);
}

#[test]
fn memory_stats_count_tensors_and_models_until_they_are_freed() {
    let (rt, _sim) = rig();
    let before = rt.vnc_memory_stats(0).unwrap();
    assert_eq!(before.bytes_limit, 64 << 20);
    let t = rt
        .tensor_allocate(Placement::Device { vnc: 0 }, 10_000, "t")
        .unwrap();
    let with_tensor = rt.vnc_memory_stats(0).unwrap().bytes_used;
    assert!(with_tensor >= before.bytes_used + 10_000, "{with_tensor}");
    let m = rt
        .load(&identity(64).to_container(Target::Simdev).unwrap(), 0)
        .unwrap();
    let with_model = rt.vnc_memory_stats(0).unwrap().bytes_used;
    assert!(with_model > with_tensor);
    rt.unload(m).unwrap();
    assert_eq!(rt.vnc_memory_stats(0).unwrap().bytes_used, with_tensor);
    drop(t);
    assert_eq!(
        rt.vnc_memory_stats(0).unwrap().bytes_used,
        before.bytes_used
    );
    let e = rt.vnc_memory_stats(7).unwrap_err();
    assert_eq!(e.status, NrtStatus::Invalid);
}

#[test]
fn load_collectives_loads_a_group_of_one_and_refuses_larger_groups() {
    let (rt, _sim) = rig();
    let bytes = identity(64).to_container(Target::Simdev).unwrap();
    let m = rt.load_collectives(&bytes, 0, 0, 1).unwrap();
    rt.unload(m).unwrap();
    let e = rt.load_collectives(&bytes, 0, 1, 4).unwrap_err();
    assert_eq!(e.status, NrtStatus::Invalid);
    assert!(e.message.contains("not simulated yet"), "{e}");
    let info = rt.instance_info();
    assert_eq!((info.family, info.arch_name.as_str()), (2, "trn1"));
}
