//! Test harness: start the real simdev binary on a private socket, connect the runtime's sim
//! backend to it, and a raw protocol client for feeding simdev hostile bytes.
//!
//! The simdev program is `NEURON_SIMDEV_BIN` when set, else the `simdev` binary of this
//! workspace's target directory (built by `cargo test --workspace`, since the simdev package
//! has integration tests of its own). Every simdev gets its own temporary socket and is stopped
//! (SIGTERM, then SIGKILL) when its guard drops.

pub mod bench;
pub mod counted_simdev;
pub mod ipc_floor;
pub mod matmul_neff;
pub mod timeline;

use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use nix::sys::socket::{self, AddressFamily, MsgFlags, SockFlag, SockType, UnixAddr};
use runtime::backend::sim::{PrivateSimdev, SimDevice, SimdevCommand};
use shared::fd_passing;
use shared::notification::{NotificationEntry, NqCursor};
use shared::protocol::{self, MAX_MSG_SIZE, PROTOCOL_VERSION, Reply, Request};
use std::sync::atomic::Ordering;

/// The simdev program under test.
///
/// # Panics
/// If no simdev binary can be found (build the workspace first).
pub fn simdev_command(extra_args: &[&str]) -> SimdevCommand {
    let program = std::env::var_os("NEURON_SIMDEV_BIN")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            let exe = std::env::current_exe().expect("current_exe");
            // target/<profile>/deps/<test-binary> -> target/<profile>/simdev
            let profile_dir = exe
                .parent()
                .and_then(Path::parent)
                .expect("target/<profile>");
            profile_dir.join("simdev")
        });
    assert!(
        program.is_file(),
        "simdev binary not found at {} (run `cargo test --workspace` or set NEURON_SIMDEV_BIN)",
        program.display()
    );
    SimdevCommand {
        program,
        args_prefix: Vec::new(),
        extra_args: extra_args.iter().map(Into::into).collect(),
    }
}

/// Starts a simdev with `extra_args` (e.g. `["--ncs", "2", "--hbm", "16M"]`).
///
/// # Panics
/// If simdev does not start.
pub fn start_simdev(extra_args: &[&str]) -> PrivateSimdev {
    PrivateSimdev::spawn(&simdev_command(extra_args)).expect("simdev starts")
}

/// Connects the runtime's sim backend to `simdev`.
///
/// # Panics
/// If the connection or handshake fails.
pub fn connect(simdev: &PrivateSimdev) -> SimDevice {
    SimDevice::connect(simdev.socket()).expect("connect to simdev")
}

/// Polls `f` every millisecond until it returns `Some`, for at most `timeout`.
pub fn wait_for<T>(timeout: Duration, mut f: impl FnMut() -> Option<T>) -> Option<T> {
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(v) = f() {
            return Some(v);
        }
        if Instant::now() >= deadline {
            return None;
        }
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// A reader of one notification queue, as the runtime's completion engine will read it:
/// acquire-load the phase of the slot at `head`, then the body, then publish the new head.
#[derive(Debug)]
pub struct NqReader {
    /// The mapped queue.
    pub nq: runtime::backend::NotificationQueue,
    cursor: NqCursor,
}

impl NqReader {
    /// A reader at entry 0.
    pub fn new(nq: runtime::backend::NotificationQueue) -> Self {
        Self {
            cursor: NqCursor::new(nq.allocation.pa, nq.entries),
            nq,
        }
    }

    /// The next entry, if the device has written it.
    ///
    /// # Panics
    /// On an accessor error (a test bug).
    pub fn try_next(&mut self) -> Option<NotificationEntry> {
        self.cursor.try_next(&self.nq.memory).unwrap()
    }

    /// Waits up to `timeout` for the next entry.
    pub fn next_within(&mut self, timeout: Duration) -> Option<NotificationEntry> {
        wait_for(timeout, || self.try_next())
    }
}

/// A protocol client without the backend's checks, for sending simdev what a buggy or hostile
/// client would.
#[derive(Debug)]
pub struct RawClient {
    fd: OwnedFd,
}

impl RawClient {
    /// Connects without a handshake.
    ///
    /// # Panics
    /// If the connection fails.
    pub fn connect(socket: &Path) -> Self {
        let fd = socket::socket(
            AddressFamily::Unix,
            SockType::SeqPacket,
            SockFlag::SOCK_CLOEXEC,
            None,
        )
        .unwrap();
        socket::connect(fd.as_raw_fd(), &UnixAddr::new(socket).unwrap()).unwrap();
        Self { fd }
    }

    /// Connects and performs the handshake.
    ///
    /// # Panics
    /// If the handshake fails.
    pub fn connect_hello(socket: &Path) -> Self {
        let c = Self::connect(socket);
        let reply = c.call(&Request::Hello {
            version: PROTOCOL_VERSION,
        });
        assert!(matches!(reply, Some(Reply::Hello { .. })), "{reply:?}");
        c
    }

    /// Sends raw bytes as one message.
    ///
    /// # Panics
    /// If the send fails.
    pub fn send_bytes(&self, bytes: &[u8]) {
        fd_passing::send_with_fds(self.fd.as_fd(), bytes, &[]).unwrap();
    }

    /// Receives one reply; `None` when simdev closed the connection.
    ///
    /// # Panics
    /// If the reply does not decode.
    pub fn recv(&self) -> Option<Reply> {
        let mut buf = [0u8; MAX_MSG_SIZE];
        // Any fds that came with the reply are closed when `received` drops.
        let received =
            fd_passing::recv_with_fds(self.fd.as_fd(), &mut buf, MsgFlags::empty()).ok()?;
        let n = received.len;
        if n == 0 {
            return None;
        }
        Some(protocol::decode(&buf[..n]).expect("simdev reply decodes"))
    }

    /// Sends `req` and receives its reply.
    pub fn call(&self, req: &Request) -> Option<Reply> {
        let mut buf = [0u8; MAX_MSG_SIZE];
        let n = protocol::encode(req, &mut buf).unwrap();
        self.send_bytes(&buf[..n]);
        self.recv()
    }
}

/// A `Device` wrapper that counts every call by operation, can fail the next doorbells, and
/// records each INFERENCE_START doorbell with what every NC's hardware exec queue held at that
/// moment: the counting backend of the hot-path test, the fault injector of the poisoning tests
/// and the order recorder of the lockstep test (recorded in the backend, so no global tracing
/// state is involved).
#[derive(Debug)]
pub struct InterposedDevice {
    inner: Box<dyn runtime::Device>,
    calls: std::sync::Mutex<std::collections::BTreeMap<&'static str, u64>>,
    fail_doorbells: std::sync::atomic::AtomicU32,
    allocations: std::sync::Mutex<std::collections::HashMap<MemHandle, Allocation>>,
    exec_tx_rings: std::sync::Mutex<std::collections::BTreeMap<u32, (shared::SharedChunk, u32)>>,
    doorbells: std::sync::Mutex<Vec<Doorbell>>,
}

/// One INFERENCE_START doorbell as [`InterposedDevice`] saw it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Doorbell {
    /// The NC rung.
    pub nc: u32,
    /// Per NC with a hardware exec queue: descriptors written in its TX ring so far.
    pub armed: std::collections::BTreeMap<u32, u32>,
}

impl InterposedDevice {
    /// Wraps `inner`.
    pub fn new(inner: Box<dyn runtime::Device>) -> Self {
        Self {
            inner,
            calls: std::sync::Mutex::new(Default::default()),
            fail_doorbells: std::sync::atomic::AtomicU32::new(0),
            allocations: Default::default(),
            exec_tx_rings: Default::default(),
            doorbells: Default::default(),
        }
    }

    /// The INFERENCE_START doorbells so far, in order.
    pub fn doorbells(&self) -> Vec<Doorbell> {
        self.doorbells.lock().unwrap().clone()
    }

    fn armed(&self) -> std::collections::BTreeMap<u32, u32> {
        self.exec_tx_rings
            .lock()
            .unwrap()
            .iter()
            .map(|(&nc, (ring, count))| {
                let written = (0..u64::from(*count))
                    .filter(|i| {
                        let mut d = [0u8; shared::udma::UDMA_DESC_SIZE];
                        ring.read(ring.pa() + i * d.len() as u64, &mut d).unwrap();
                        d != [0; shared::udma::UDMA_DESC_SIZE]
                    })
                    .count();
                (nc, u32::try_from(written).unwrap())
            })
            .collect()
    }

    /// Calls so far, by operation name.
    pub fn calls(&self) -> std::collections::BTreeMap<&'static str, u64> {
        self.calls.lock().unwrap().clone()
    }

    /// Forgets the counts.
    pub fn reset_calls(&self) {
        self.calls.lock().unwrap().clear();
    }

    /// Makes the next `n` semaphore increments fail (an injected doorbell failure).
    pub fn fail_next_doorbells(&self, n: u32) {
        self.fail_doorbells.store(n, Ordering::SeqCst);
    }

    fn count(&self, op: &'static str) {
        *self.calls.lock().unwrap().entry(op).or_default() += 1;
    }
}

use runtime::backend::{
    Allocation, ClaimedNc, DeviceError, DmaQueueId, DmaRings, MemHandle, NotificationQueue,
};
use shared::protocol::{DeviceInfo, MemLocation, NcCounters};

impl runtime::Device for InterposedDevice {
    fn backend_name(&self) -> &'static str {
        self.inner.backend_name()
    }
    fn info(&self) -> &DeviceInfo {
        self.inner.info()
    }
    fn claim_nc(&self, nc: u32) -> Result<ClaimedNc, DeviceError> {
        self.count("claim_nc");
        self.inner.claim_nc(nc)
    }
    fn release_nc(&self, nc: u32) -> Result<(), DeviceError> {
        self.count("release_nc");
        self.inner.release_nc(nc)
    }
    fn mem_alloc(
        &self,
        location: MemLocation,
        size: u64,
        align: u64,
    ) -> Result<Allocation, DeviceError> {
        self.count("mem_alloc");
        let a = self.inner.mem_alloc(location, size, align)?;
        self.allocations.lock().unwrap().insert(a.handle, a);
        Ok(a)
    }
    fn mem_free(&self, handle: MemHandle) -> Result<(), DeviceError> {
        self.count("mem_free");
        self.inner.mem_free(handle)
    }
    fn mem_map(&self, allocation: &Allocation) -> Result<shared::SharedChunk, DeviceError> {
        self.count("mem_map");
        self.inner.mem_map(allocation)
    }
    fn mem_alloc_by(
        &self,
        location: MemLocation,
        size: u64,
        align: u64,
        deadline: std::time::Instant,
    ) -> Result<Allocation, DeviceError> {
        self.count("mem_alloc");
        let a = self.inner.mem_alloc_by(location, size, align, deadline)?;
        self.allocations.lock().unwrap().insert(a.handle, a);
        Ok(a)
    }
    fn mem_map_by(
        &self,
        allocation: &Allocation,
        deadline: std::time::Instant,
    ) -> Result<shared::SharedChunk, DeviceError> {
        self.count("mem_map");
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
        self.count("dma_queue_init");
        self.inner.dma_queue_init(queue, rings)?;
        if (queue.engine, queue.queue)
            == (
                shared::sequencer::EXEC_QUEUE_ENGINE,
                shared::sequencer::EXEC_QUEUE,
            )
        {
            let alloc = self
                .allocations
                .lock()
                .unwrap()
                .get(&rings.tx_ring)
                .copied();
            if let Some(a) = alloc {
                let chunk = self.inner.mem_map(&a)?;
                self.exec_tx_rings
                    .lock()
                    .unwrap()
                    .insert(queue.nc, (chunk, rings.tx_desc_count));
            }
        }
        Ok(())
    }
    fn dma_queue_release(&self, queue: DmaQueueId) -> Result<(), DeviceError> {
        self.count("dma_queue_release");
        self.inner.dma_queue_release(queue)
    }
    fn dma_queue_copy_start(&self, queue: DmaQueueId, tx: u32, rx: u32) -> Result<(), DeviceError> {
        self.count("dma_queue_copy_start");
        self.inner.dma_queue_copy_start(queue, tx, rx)
    }

    fn dma_queue_copy_start_by(
        &self,
        queue: DmaQueueId,
        tx: u32,
        rx: u32,
        deadline: std::time::Instant,
    ) -> Result<(), DeviceError> {
        self.count("dma_queue_copy_start");
        self.inner.dma_queue_copy_start_by(queue, tx, rx, deadline)
    }
    fn semaphore_increment(&self, nc: u32, index: u32, value: u32) -> Result<(), DeviceError> {
        self.count("semaphore_increment");
        if index == shared::sequencer::SEM_INFERENCE_START {
            let armed = self.armed();
            self.doorbells.lock().unwrap().push(Doorbell { nc, armed });
        }
        let fail = self.fail_doorbells.load(Ordering::SeqCst);
        if fail > 0 {
            self.fail_doorbells.store(fail - 1, Ordering::SeqCst);
            // A driver ioctl that failed (EIO, NRT_HW_ERROR on its own), the device still
            // there: the doorbell reports it as NRT_FAILURE (seed 000 §5).
            return Err(DeviceError::Ioctl {
                op: "SemaphoreIncrement (injected)",
                request: 0x8008_4E29,
                source: nix::errno::Errno::EIO,
            });
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
        self.count("semaphore_decrement");
        self.inner.semaphore_decrement(nc, index, value)
    }
    fn semaphore_read(&self, nc: u32, index: u32) -> Result<u32, DeviceError> {
        self.count("semaphore_read");
        self.inner.semaphore_read(nc, index)
    }
    fn semaphore_write(&self, nc: u32, index: u32, value: u32) -> Result<(), DeviceError> {
        self.count("semaphore_write");
        self.inner.semaphore_write(nc, index, value)
    }
    fn event_set(&self, nc: u32, index: u32, value: u32) -> Result<(), DeviceError> {
        self.count("event_set");
        self.inner.event_set(nc, index, value)
    }
    fn event_get(&self, nc: u32, index: u32) -> Result<u32, DeviceError> {
        self.count("event_get");
        self.inner.event_get(nc, index)
    }
    fn notification_queue_init(
        &self,
        nc: u32,
        entries: u32,
    ) -> Result<NotificationQueue, DeviceError> {
        self.count("notification_queue_init");
        self.inner.notification_queue_init(nc, entries)
    }
    fn nc_reset(&self, nc: u32) -> Result<(), DeviceError> {
        self.count("nc_reset");
        self.inner.nc_reset(nc)
    }
    fn nc_counters(&self, nc: u32) -> Result<NcCounters, DeviceError> {
        self.count("nc_counters");
        self.inner.nc_counters(nc)
    }
}

/// Runs a model whose I/O tensors are `input` `[batch, features]` and `output`
/// `[batch, outputs]` (fp32) over every row of `inputs`, `batch` rows per execution on logical
/// core 0 (the last batch zero-padded), and returns the outputs of the real rows. The model is
/// built for `target` (the container kind the runtime's backend accepts: `Simdev` on a
/// simdev backend, `Silicon` on the neuron backend), loaded for the run and unloaded after.
///
/// # Panics
/// On any runtime error (a test failure).
pub fn run_rows(
    rt: &runtime::Runtime,
    target: shared::model::Target,
    model: &shared::model::Model,
    batch: usize,
    inputs: &[f32],
    features: usize,
    outputs: usize,
) -> Vec<f32> {
    use runtime::{Placement, TensorSet};
    let m = rt.load(&model.to_container(target).unwrap(), 0).unwrap();
    let bytes = |n: usize| u64::try_from(n * 4).unwrap();
    let i = rt
        .tensor_allocate(Placement::Device { vnc: 0 }, bytes(batch * features), "x")
        .unwrap();
    let o = rt
        .tensor_allocate(Placement::Device { vnc: 0 }, bytes(batch * outputs), "y")
        .unwrap();
    let (mut ins, mut outs) = (TensorSet::new(), TensorSet::new());
    ins.add("input", &i);
    outs.add("output", &o);
    let rows = inputs.len() / features;
    let mut result = Vec::with_capacity(rows * outputs);
    for first in (0..rows).step_by(batch) {
        let n = batch.min(rows - first);
        let mut x = vec![0f32; batch * features];
        x[..n * features].copy_from_slice(&inputs[first * features..(first + n) * features]);
        let x: Vec<u8> = x.iter().flat_map(|v| v.to_le_bytes()).collect();
        i.write(&x, 0).unwrap();
        rt.execute(m, &ins, &outs)
            .unwrap_or_else(|e| panic!("rows {first}..{}: {e}", first + n));
        let mut out = vec![0u8; batch * outputs * 4];
        o.read(&mut out, 0).unwrap();
        result.extend(
            out.chunks_exact(4)
                .take(n * outputs)
                .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])),
        );
    }
    drop((i, o, ins, outs));
    rt.unload(m).unwrap();
    result
}
