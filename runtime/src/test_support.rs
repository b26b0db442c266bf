//! Test support for the runtime's own unit tests: the emulated device in this process.
//!
//! [`Rig`] is a `simdev::Device` reached through [`SimDevice::in_process`] (the same protocol
//! messages and session rules as the socket, no process started), wrapped in a [`Recorder`]
//! that keeps the INFERENCE_START doorbells in order and can fail the next ones. The tests
//! read the device's own view (counters, stats) straight from the `simdev::Device`.

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use shared::memory::SharedChunk;
use shared::model::{Model, Target};
use shared::protocol::{DeviceInfo, MemLocation, NcCounters};
use shared::sequencer::SEM_INFERENCE_START;

use crate::backend::sim::SimDevice;
use crate::backend::{
    Allocation, ClaimedNc, Device, DeviceError, DmaQueueId, DmaRings, MemHandle, NotificationQueue,
};
use crate::config::RuntimeConfig;
use crate::{ModelHandle, Placement, Runtime, Tensor, TensorSet};

/// A `simdev::Device` of `ncs` NCs of `arch` with 64 MiB of HBM each.
pub(crate) fn emulated_device(arch: shared::Arch, ncs: u32) -> Arc<simdev::Device> {
    let config = simdev::config::Config {
        arch,
        ncs,
        hbm_bytes_per_nc: 64 << 20,
        ..simdev::config::Config::default()
    };
    Arc::new(simdev::Device::new(&config).expect("a valid simdev configuration"))
}

/// The emulated device and the runtime's backend connected to it in-process.
pub(crate) struct Rig {
    /// The device itself (its counters and stats are the device's view).
    pub device: Arc<simdev::Device>,
    /// The runtime's backend: a [`Recorder`] over the in-process [`SimDevice`].
    pub backend: Arc<Recorder>,
}

impl Rig {
    /// A trn1 device with two NCs.
    pub fn new() -> Self {
        Self::with(shared::Arch::Trn1, 2)
    }

    /// A device of `ncs` NCs of `arch`.
    pub fn with(arch: shared::Arch, ncs: u32) -> Self {
        let device = emulated_device(arch, ncs);
        let sim = SimDevice::in_process(device.clone()).expect("the in-process handshake");
        Self {
            device,
            backend: Arc::new(Recorder::new(Box::new(sim))),
        }
    }

    /// `nrt_init` on this device with `config`.
    pub fn runtime(&self, config: RuntimeConfig) -> Runtime {
        Runtime::init(self.backend.clone(), config).expect("nrt_init")
    }

    /// `nrt_init` with a 10 s exec timeout and otherwise default configuration.
    pub fn sync_runtime(&self) -> Runtime {
        self.runtime(RuntimeConfig {
            exec_timeout: Duration::from_secs(10),
            ..RuntimeConfig::default()
        })
    }

    /// NC `nc`'s counters as the device keeps them.
    pub fn counters(&self, nc: u32) -> NcCounters {
        self.device.counters(nc).expect("an existing NC")
    }
}

/// Loads `model` on logical core `vnc`.
pub(crate) fn load(rt: &Runtime, model: &Model, vnc: i32) -> ModelHandle {
    rt.load(
        &model.to_container(Target::Simdev).expect("a container"),
        vnc,
    )
    .expect("load")
}

/// Device tensors `input` and `output` of `bytes` bytes on core 0, and their sets.
pub(crate) fn io(rt: &Runtime, bytes: u64) -> (Tensor, Tensor, TensorSet, TensorSet) {
    let i = rt
        .tensor_allocate(Placement::Device { vnc: 0 }, bytes, "in")
        .expect("input tensor");
    let o = rt
        .tensor_allocate(Placement::Device { vnc: 0 }, bytes, "out")
        .expect("output tensor");
    let (mut ins, mut outs) = (TensorSet::new(), TensorSet::new());
    ins.add("input", &i);
    outs.add("output", &o);
    (i, o, ins, outs)
}

/// `len` bytes that differ with `seed`.
pub(crate) fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i.to_le_bytes()[0] ^ i.to_le_bytes()[1]).wrapping_mul(31) ^ seed)
        .collect()
}

/// An identity model of `bytes` bytes named `name` whose SP program first waits for event
/// `event` of its NC: it holds its NC until the test sets the event.
pub(crate) fn gated_identity(bytes: u32, name: &str, event: u32) -> Model {
    use shared::isa::{Instruction, Opcode, encode_program};
    let mut m = crate::builder::identity_with(bytes, name, [0; 13], [0; 32]);
    let mut sp = encode_program(&[Instruction::new(Opcode::WaitEvent, &[event])]);
    sp.extend_from_slice(&m.tpbs[0].blocks[4]);
    m.tpbs[0].blocks[4] = sp;
    m
}

/// A [`Device`] that forwards to another, keeping the INFERENCE_START doorbells in the order
/// they were rung and failing the next ones on request (the doorbell then reaches nothing).
#[derive(Debug)]
pub(crate) struct Recorder {
    inner: Box<dyn Device>,
    doorbells: Mutex<Vec<u32>>,
    fail_doorbells: AtomicU32,
    /// The injected failures say the device is gone (else: a generic I/O error).
    fail_as_lost: std::sync::atomic::AtomicBool,
}

impl Recorder {
    pub fn new(inner: Box<dyn Device>) -> Self {
        Self {
            inner,
            doorbells: Mutex::new(Vec::new()),
            fail_doorbells: AtomicU32::new(0),
            fail_as_lost: std::sync::atomic::AtomicBool::new(false),
        }
    }

    /// The NCs whose INFERENCE_START doorbell rang (failed ones included), in order.
    pub fn doorbells(&self) -> Vec<u32> {
        self.doorbells.lock().expect("doorbell log").clone()
    }

    /// Fails the next `n` INFERENCE_START doorbells (an I/O error of a device still there).
    pub fn fail_next_doorbells(&self, n: u32) {
        self.fail_as_lost.store(false, Ordering::SeqCst);
        self.fail_doorbells.store(n, Ordering::SeqCst);
    }

    /// Fails the next `n` INFERENCE_START doorbells as a device that is gone.
    pub fn lose_device_at_next_doorbells(&self, n: u32) {
        self.fail_as_lost.store(true, Ordering::SeqCst);
        self.fail_doorbells.store(n, Ordering::SeqCst);
    }
}

impl Device for Recorder {
    fn backend_name(&self) -> &'static str {
        self.inner.backend_name()
    }
    fn info(&self) -> &DeviceInfo {
        self.inner.info()
    }
    fn claim_nc(&self, nc: u32) -> Result<ClaimedNc, DeviceError> {
        self.inner.claim_nc(nc)
    }
    fn release_nc(&self, nc: u32) -> Result<(), DeviceError> {
        self.inner.release_nc(nc)
    }
    fn mem_alloc(
        &self,
        location: MemLocation,
        size: u64,
        align: u64,
    ) -> Result<Allocation, DeviceError> {
        self.inner.mem_alloc(location, size, align)
    }
    fn mem_free(&self, handle: MemHandle) -> Result<(), DeviceError> {
        self.inner.mem_free(handle)
    }
    fn mem_map(&self, allocation: &Allocation) -> Result<SharedChunk, DeviceError> {
        self.inner.mem_map(allocation)
    }
    fn mem_alloc_by(
        &self,
        location: MemLocation,
        size: u64,
        align: u64,
        deadline: std::time::Instant,
    ) -> Result<Allocation, DeviceError> {
        self.inner.mem_alloc_by(location, size, align, deadline)
    }
    fn mem_map_by(
        &self,
        allocation: &Allocation,
        deadline: std::time::Instant,
    ) -> Result<SharedChunk, DeviceError> {
        self.inner.mem_map_by(allocation, deadline)
    }
    fn flush(&self) -> Result<(), DeviceError> {
        self.inner.flush()
    }
    fn closing_by(&self, deadline: std::time::Instant) {
        self.inner.closing_by(deadline);
    }
    fn release(&self) {
        self.inner.release();
    }
    fn mem_export_fd(&self, allocation: &Allocation) -> Result<std::os::fd::OwnedFd, DeviceError> {
        self.inner.mem_export_fd(allocation)
    }
    fn dma_queue_init(&self, queue: DmaQueueId, rings: &DmaRings) -> Result<(), DeviceError> {
        self.inner.dma_queue_init(queue, rings)
    }
    fn dma_queue_release(&self, queue: DmaQueueId) -> Result<(), DeviceError> {
        self.inner.dma_queue_release(queue)
    }
    fn dma_queue_copy_start(&self, queue: DmaQueueId, tx: u32, rx: u32) -> Result<(), DeviceError> {
        self.inner.dma_queue_copy_start(queue, tx, rx)
    }

    fn dma_queue_copy_start_by(
        &self,
        queue: DmaQueueId,
        tx: u32,
        rx: u32,
        deadline: std::time::Instant,
    ) -> Result<(), DeviceError> {
        self.inner.dma_queue_copy_start_by(queue, tx, rx, deadline)
    }
    fn semaphore_increment(&self, nc: u32, index: u32, value: u32) -> Result<(), DeviceError> {
        if index == SEM_INFERENCE_START {
            self.doorbells.lock().expect("doorbell log").push(nc);
            let fail = self.fail_doorbells.load(Ordering::SeqCst);
            if fail > 0 {
                self.fail_doorbells.store(fail - 1, Ordering::SeqCst);
                return Err(if self.fail_as_lost.load(Ordering::SeqCst) {
                    DeviceError::Disconnected {
                        op: "SemaphoreIncrement (injected)",
                    }
                } else {
                    DeviceError::Ioctl {
                        op: "SemaphoreIncrement (injected)",
                        request: 0x8008_4E29,
                        source: nix::errno::Errno::EIO,
                    }
                });
            }
        }
        self.inner.semaphore_increment(nc, index, value)
    }
    fn hung_up(&self) -> bool {
        self.inner.hung_up()
    }
    fn take_device_log(&self) -> Vec<String> {
        self.inner.take_device_log()
    }
    fn semaphore_decrement(&self, nc: u32, index: u32, value: u32) -> Result<(), DeviceError> {
        self.inner.semaphore_decrement(nc, index, value)
    }
    fn semaphore_read(&self, nc: u32, index: u32) -> Result<u32, DeviceError> {
        self.inner.semaphore_read(nc, index)
    }
    fn semaphore_write(&self, nc: u32, index: u32, value: u32) -> Result<(), DeviceError> {
        self.inner.semaphore_write(nc, index, value)
    }
    fn event_set(&self, nc: u32, index: u32, value: u32) -> Result<(), DeviceError> {
        self.inner.event_set(nc, index, value)
    }
    fn event_get(&self, nc: u32, index: u32) -> Result<u32, DeviceError> {
        self.inner.event_get(nc, index)
    }
    fn notification_queue_init(
        &self,
        nc: u32,
        entries: u32,
    ) -> Result<NotificationQueue, DeviceError> {
        self.inner.notification_queue_init(nc, entries)
    }
    fn nc_reset(&self, nc: u32) -> Result<(), DeviceError> {
        self.inner.nc_reset(nc)
    }
    fn nc_counters(&self, nc: u32) -> Result<NcCounters, DeviceError> {
        self.inner.nc_counters(nc)
    }
}
