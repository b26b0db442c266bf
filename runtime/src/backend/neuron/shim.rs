//! [`SimIoctlPort`]: a kernel-ABI shim that lets the hardware backend run against simdev.
//!
//! **What this is.** A test double for the hardware backend ([`NeuronDevice`]) that speaks the
//! aws-neuronx-dkms ABI *bytes*. It implements [`IoctlPort`] — the seam where [`DeviceFile`]
//! would call `ioctl(2)` and `mmap(2)` on `/dev/neuronN` — by decoding each request value and
//! the exact argument struct bytes the backend sends (`shared::ioctl`, read with zerocopy after
//! a length check), forwarding the operation to a connected simdev ([`SimDevice`]), and writing
//! the outputs back into the argument bytes where the driver writes them. Everything above the
//! port is the unchanged backend: request values, struct layouts, device-wide DMA engine
//! numbering, the handle and mmap-offset bookkeeping, the semaphore window and the polling
//! completion path (no notification eventfd). That is how DESIGN §4 tests the neuron backend.
//!
//! **What this is not.** It does not emulate the kernel driver. There are no BARs, no gen-pools,
//! no per-process file state beyond a table of chunks and NC locks, and no reset state machine;
//! where the driver does something simdev cannot express, the shim says so below rather than
//! pretend. Passing through the shim shows that the backend and simdev agree on the ABI as
//! `reference/driver-abi.md` writes it down. It says nothing about a real device: **the neuron
//! backend has still not been run on silicon.**
//!
//! # Requests
//!
//! | request | forwarded to | written back |
//! |---|---|---|
//! | DEVICE_BASIC_INFO | `info()` | `architecture` = simdev's arch number (2 or 3), `revision` 0 |
//! | CRWL_WRITER_ENTER | `claim_nc` | — (the claim's semaphore window is kept for `map`) |
//! | CRWL_WRITER_DOWNGRADE | nothing (shim lock state) | — |
//! | CRWL_READER_EXIT | `release_nc` | — |
//! | RESOURCE_MMAP_INFO (TPB, n, SEMAPHORE) | nothing | `offset` = the window's device address, `size` 0x2000 |
//! | MEM_ALLOC_V2 (out-pointer) | `mem_alloc` | the handle, through the out-pointer |
//! | MEM_GET_EXTENDED_INFO | nothing (shim table) | `pa`, `mmap_offset` (= PA), `size`, `host_memory`, `pid`; `mem_handle` clobbered |
//! | MEM_FREE | `mem_free` | — |
//! | DMA_QUEUE_INIT / RELEASE / COPY_START | `dma_queue_*`, `eng_id` decoded to (NC, engine) | — |
//! | SEMAPHORE_INCREMENT / DECREMENT / READ / WRITE | `semaphore_*` | READ: `value` |
//! | EVENT_SET / GET | `event_*` | GET: `value` |
//! | NOTIFICATIONS_INIT_V2 | `notification_queue_init` | `mmap_offset` (= ring PA), `mem_handle` |
//! | NC_RESET | `nc_reset` per bit of `nc_map` | `request_id` (this process's tgid) |
//! | NC_RESET_READY | nothing (the reset already ran) | `result` 0 done, 1 failed or unknown id |
//!
//! Errors: a request the shim does not decode is `ENOTTY`; an argument of the wrong length (or
//! MEM_ALLOC_V2 without its out-pointer) is `EINVAL`; a simdev refusal maps to `EBUSY` (NC
//! busy), `ENOMEM` (out of memory) or `EINVAL` (anything else); a lost connection is `EIO`.
//! MEM_GET_EXTENDED_INFO of an unknown handle is `EIO`, which is what [`DeviceFile`] reports
//! for the driver's positive return (+EINVAL) there (driver-abi §1.1).
//!
//! # Where the shim differs from the driver
//!
//! - **Notification rings.** NOTIFICATIONS_INIT_V2 carries the ring size in bytes (a power of
//!   two); simdev's ring is sized in entries. The shim asks simdev for the largest power of two
//!   of entries whose ring ([`nq_bytes`]) fits the bytes, records the chunk with the
//!   driver-visible size (the bytes asked for, at least 4 KiB) and accepts a whole-chunk map of
//!   that size — but the mapping it returns is simdev's chunk, which is shorter (1024 entries:
//!   a 65 536-byte ring, a 36 864-byte simdev chunk). The header and every entry slot are
//!   inside it; the rest of the driver's ring does not exist here. The ABI does not say how many
//!   entries a device keeps in a ring of a given size; the backend's `NotificationQueue::entries`
//!   is what it asked for, and the shim's decoding agrees with it only from 64 entries up:
//!   below that the backend still asks for 4 KiB, which holds 64 simdev entries, and a reader
//!   wrapping at the backend's count misses simdev's entries
//!   ([`SimIoctlPort::notification_entries`] reports what simdev uses).
//! - **Ring lifetime.** As the driver does, a second init of an NC's ring returns the existing
//!   one. simdev frees an NC's ring at NC reset and release; the shim forgets it then too (the
//!   driver keeps it for the life of the device).
//! - **Semaphore window.** The window is the one simdev handed over with the claim (re-fetched
//!   with an idempotent `claim_nc` when mapped again). It is read-only — a writable map is
//!   refused, where the driver allows one — and it is placed at PA 0, as [`SimDevice`] maps it,
//!   not at its mmap offset: [`SimDevice::claim_nc`] closes the window's fd, so the shim cannot
//!   map it anywhere else.
//! - **Memory maps** must be placed at the chunk's own PA and be writable (simdev's `mem_map`
//!   makes writable mappings only); a partial map is refused, as the driver refuses it.
//! - **Checks the shim or simdev makes and the driver does not**: EVENT_SET/GET with `nc_id`
//!   out of range or `event_index == events_per_nc`, a `dram_channel` other than the NC's own
//!   HBM stack, NOTIFICATIONS_INIT_V2 for a device-memory ring, another NQ type or engine, or a
//!   TOP_SP owner: all `EINVAL`. `rx_desc_count == 0` on DMA_QUEUE_COPY_START is a kernel
//!   `BUG_ON`; the shim refuses it with `EINVAL`.
//! - **NC lock**: one holder (uuid) per NC, taken by WRITER_ENTER (a different uuid gets
//!   `EBUSY`), downgraded by WRITER_DOWNGRADE, given back by READER_EXIT; reader entry and other
//!   CRWL requests are not decoded.
//! - **Device facts** come from the arch number alone (`NeuronDevice::with_port`): start simdev
//!   with its arch's default NC count (trn1/inf2 2, trn2 8) or the backend's view of the device
//!   will not be simdev's.
//!
//! [`NeuronDevice`]: super::NeuronDevice
//! [`DeviceFile`]: super::DeviceFile

use std::collections::HashMap;
use std::fmt;
use std::io;
use std::mem::offset_of;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard, PoisonError};

use nix::errno::Errno;
use shared::address_map::{
    Arch, CHUNK_GRANULE, REG_EVENTS, REG_NC_STRIDE, REG_WINDOW_BASE, SEM_WINDOW_SIZE,
};
use shared::ioctl;
use shared::memory::{MemError, SharedChunk};
use shared::notification::{NQ_MAX_ENTRIES, nq_bytes};
use shared::protocol::{ErrorKind, MemLocation};
use zerocopy::{FromBytes, Immutable, IntoBytes};

use super::IoctlPort;
use crate::backend::sim::SimDevice;
use crate::backend::{Allocation, Device, DeviceError, DmaQueueId, DmaRings, MemHandle};

/// Every request the shim decodes, in the order of [`SimIoctlPort::ioctl_count`]'s counters.
const HANDLED: [u32; 20] = [
    ioctl::DEVICE_BASIC_INFO,
    ioctl::CRWL_WRITER_ENTER,
    ioctl::CRWL_WRITER_DOWNGRADE,
    ioctl::CRWL_READER_EXIT,
    ioctl::RESOURCE_MMAP_INFO,
    ioctl::MEM_ALLOC_V2,
    ioctl::MEM_GET_EXTENDED_INFO,
    ioctl::MEM_FREE,
    ioctl::DMA_QUEUE_INIT,
    ioctl::DMA_QUEUE_RELEASE,
    ioctl::DMA_QUEUE_COPY_START,
    ioctl::SEMAPHORE_INCREMENT,
    ioctl::SEMAPHORE_DECREMENT,
    ioctl::SEMAPHORE_READ,
    ioctl::SEMAPHORE_WRITE,
    ioctl::EVENT_SET,
    ioctl::EVENT_GET,
    ioctl::NOTIFICATIONS_INIT_V2,
    ioctl::NC_RESET,
    ioctl::NC_RESET_READY,
];

/// What MEM_GET_EXTENDED_INFO leaves in `mem_handle`: a kernel-address-looking value (the
/// driver writes the chunk's kernel address there; driver-abi §1.5).
const KERNEL_POINTER_BASE: u64 = 0xFFFF_8880_0000_0000;

/// One chunk the backend can see: simdev's allocation and the size the driver would report.
#[derive(Clone, Copy, Debug)]
struct Chunk {
    /// simdev's allocation (handle, PA, simdev's size, location).
    allocation: Allocation,
    /// The size MEM_GET_EXTENDED_INFO reports and a map must ask for. Equal to
    /// `allocation.size` except for notification rings (see the module docs).
    size: u64,
}

/// One NC's lock holder.
#[derive(Clone, Copy, Debug)]
struct NcLock {
    /// The CRWL uuid that took it.
    uuid: [u8; 32],
    /// Held as writer (not yet downgraded).
    writer: bool,
}

/// One NC's notification ring.
#[derive(Clone, Copy, Debug)]
struct Ring {
    /// Its memory handle (also a key of [`State::chunks`]).
    handle: u64,
    /// The entries simdev uses.
    entries: u32,
}

/// The shim's bookkeeping, behind one mutex (never taken by the doorbell requests).
#[derive(Debug, Default)]
struct State {
    /// Chunks by handle: allocations and notification rings.
    chunks: HashMap<u64, Chunk>,
    /// NC locks by NC.
    locks: HashMap<u32, NcLock>,
    /// Semaphore windows from the claims, by NC, until mapped.
    windows: HashMap<u32, SharedChunk>,
    /// Notification rings by NC.
    rings: HashMap<u32, Ring>,
    /// NC_RESET outcomes by request id, until NC_RESET_READY collects them.
    resets: HashMap<u32, i32>,
}

impl State {
    /// Forgets NC `nc`'s notification ring (simdev freed it).
    fn forget_ring(&mut self, nc: u32) {
        if let Some(ring) = self.rings.remove(&nc) {
            self.chunks.remove(&ring.handle);
        }
    }
}

/// A test double for the hardware backend's [`IoctlPort`]: decodes the aws-neuronx-dkms ioctl
/// bytes the backend sends and forwards them to simdev. It does not emulate the kernel, and the
/// neuron backend driven through it has still not been run on silicon. See the
/// [module docs](self) for what is decoded and where it differs from the driver.
///
/// ```no_run
/// # use runtime::backend::neuron::{NeuronDevice, SimIoctlPort};
/// # use runtime::backend::sim::SimDevice;
/// let sim = SimDevice::connect(std::path::Path::new("/tmp/simdev.sock"))?;
/// let device = NeuronDevice::with_port(SimIoctlPort::new(sim))?;
/// # Ok::<(), runtime::DeviceError>(())
/// ```
pub struct SimIoctlPort {
    sim: SimDevice,
    path: PathBuf,
    state: Mutex<State>,
    /// Calls of each [`HANDLED`] request.
    calls: [AtomicU64; HANDLED.len()],
    /// Every `ioctl` and `ioctl_out_u64` call, known or not.
    ioctls: AtomicU64,
    /// Every `map` call.
    maps: AtomicU64,
}

impl fmt::Debug for SimIoctlPort {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SimIoctlPort")
            .field("path", &self.path)
            .field("sim", &self.sim.socket())
            .field("ioctls", &self.ioctls.load(Ordering::Relaxed))
            .field("maps", &self.maps.load(Ordering::Relaxed))
            .finish_non_exhaustive()
    }
}

/// The errno the driver would give for simdev's refusal `e` of `op` (logged, since the errno
/// is all the backend sees).
fn errno_of(op: &'static str) -> impl Fn(DeviceError) -> Errno {
    move |e| {
        let errno = match &e {
            DeviceError::Remote { source, .. } => match source.kind {
                ErrorKind::NcBusy => Errno::EBUSY,
                ErrorKind::OutOfMemory => Errno::ENOMEM,
                _ => Errno::EINVAL,
            },
            DeviceError::OutOfRange { .. } => Errno::EINVAL,
            _ => Errno::EIO,
        };
        tracing::debug!(op, error = %e, %errno, "shim: simdev refused");
        errno
    }
}

/// Reads the argument struct `T` from `arg`, which must be exactly its size.
fn decode<T: FromBytes>(arg: &[u8]) -> Result<T, Errno> {
    T::read_from_bytes(arg).map_err(|_| Errno::EINVAL)
}

/// Writes `value` back over the argument (the driver's `copy_to_user`).
fn write_back<T: IntoBytes + Immutable>(arg: &mut [u8], value: &T) -> Result<(), Errno> {
    value.write_to(arg).map_err(|_| Errno::EINVAL)
}

/// A map refusal, as the driver's `mmap` would fail.
fn map_error(pa: u64, len: usize, why: impl Into<String>) -> MemError {
    MemError::Map {
        pa,
        len,
        source: io::Error::new(io::ErrorKind::InvalidInput, why.into()),
    }
}

/// The mmap offset RESOURCE_MMAP_INFO gives NC `nc`'s semaphore window: its device address
/// (driver-abi §1.6: V2 TPB `n` at 0x0FFF_C000_0000 + n·0x400_0000 + 0x270_0000).
pub fn semaphore_window_offset(nc: u32) -> u64 {
    REG_WINDOW_BASE + u64::from(nc) * REG_NC_STRIDE + REG_EVENTS
}

/// The entries of the notification ring simdev makes for a `size`-byte NOTIFICATIONS_INIT_V2:
/// the largest power of two in `2..=NQ_MAX_ENTRIES` whose ring fits `size` bytes.
pub fn notification_entries_for_bytes(size: u32) -> Option<u32> {
    let size = usize::try_from(size).ok()?;
    let mut entries = NQ_MAX_ENTRIES;
    while entries >= 2 {
        if nq_bytes(entries) <= size {
            return Some(entries);
        }
        entries >>= 1;
    }
    None
}

impl SimIoctlPort {
    /// A port over the connected simdev `sim`. The backend's [`IoctlPort::path`] is
    /// `simdev-shim:<socket>`.
    pub fn new(sim: SimDevice) -> Self {
        let path = PathBuf::from(format!("simdev-shim:{}", sim.socket().display()));
        Self {
            sim,
            path,
            state: Mutex::new(State::default()),
            calls: [const { AtomicU64::new(0) }; HANDLED.len()],
            ioctls: AtomicU64::new(0),
            maps: AtomicU64::new(0),
        }
    }

    /// The simdev connection behind the port (for counters, faults and other scenario control
    /// that is no driver operation).
    pub fn sim(&self) -> &SimDevice {
        &self.sim
    }

    /// Calls of `request` that reached the port (successful or not); 0 for a request the shim
    /// does not decode.
    pub fn ioctl_count(&self, request: u32) -> u64 {
        HANDLED
            .iter()
            .position(|&r| r == request)
            .map_or(0, |i| self.calls[i].load(Ordering::Relaxed))
    }

    /// Every `ioctl` and `ioctl_out_u64` call that reached the port, known or not.
    pub fn ioctl_total(&self) -> u64 {
        self.ioctls.load(Ordering::Relaxed)
    }

    /// Every `map` call that reached the port.
    pub fn map_count(&self) -> u64 {
        self.maps.load(Ordering::Relaxed)
    }

    /// The entries simdev uses in NC `nc`'s notification ring, if the shim made one.
    pub fn notification_entries(&self, nc: u32) -> Option<u32> {
        self.state().rings.get(&nc).map(|r| r.entries)
    }

    fn state(&self) -> MutexGuard<'_, State> {
        // Every update is a single insert or remove, so a panic elsewhere leaves no half-written
        // entry.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn count(&self, request: u32) {
        self.ioctls.fetch_add(1, Ordering::Relaxed);
        if let Some(i) = HANDLED.iter().position(|&r| r == request) {
            self.calls[i].fetch_add(1, Ordering::Relaxed);
        }
    }

    fn arch(&self) -> Arch {
        self.sim.info().arch
    }

    fn nc_count(&self) -> u32 {
        self.sim.info().nc_count
    }

    fn check_nc(&self, nc: u32) -> Result<(), Errno> {
        if nc < self.nc_count() {
            Ok(())
        } else {
            Err(Errno::EINVAL)
        }
    }

    /// The HBM stack (`dram_channel`) of NC `nc` (driver-abi §5: V2 NC `i` on HBM `i`, V3 NCs
    /// `2k`, `2k+1` on HBM `k`).
    fn hbm_channel(&self, nc: u32) -> u32 {
        match self.arch() {
            Arch::Trn1 | Arch::Inf2 => nc,
            Arch::Trn2 => nc / 2,
        }
    }

    /// The queue a device-wide `eng_id` (`nc · dma_engines_per_nc + engine`) and `qid` name.
    fn queue(&self, eng_id: u32, qid: u32) -> Result<DmaQueueId, Errno> {
        let info = self.sim.info();
        let per_nc = info.dma_engines_per_nc;
        if per_nc == 0 || qid >= info.dma_queues_per_engine {
            return Err(Errno::EINVAL);
        }
        let nc = eng_id / per_nc;
        self.check_nc(nc)?;
        Ok(DmaQueueId {
            nc,
            engine: eng_id % per_nc,
            queue: qid,
        })
    }

    fn device_basic_info(&self, arg: &mut [u8]) -> Result<(), Errno> {
        let mut a: ioctl::DeviceBasicInfo = decode(arg)?;
        a.architecture = self.arch().version();
        a.revision = 0;
        write_back(arg, &a)
    }

    fn crwl(&self, request: u32, arg: &[u8]) -> Result<(), Errno> {
        let a: ioctl::Crwl = decode(arg)?;
        let nc = a.nc_id;
        self.check_nc(nc)?;
        let mut st = self.state();
        let held = st.locks.get(&nc).copied();
        match request {
            ioctl::CRWL_WRITER_ENTER => {
                if held.is_some_and(|l| l.uuid != a.uuid) {
                    return Err(Errno::EBUSY);
                }
                let claimed = self
                    .sim
                    .claim_nc(nc)
                    .map_err(errno_of("CRWL_WRITER_ENTER"))?;
                st.locks.insert(
                    nc,
                    NcLock {
                        uuid: a.uuid,
                        writer: true,
                    },
                );
                if let Some(window) = claimed.semaphore_window {
                    st.windows.insert(nc, window);
                }
                // `claimed.notification_fd` is dropped: silicon has no completion interrupt.
                Ok(())
            }
            ioctl::CRWL_WRITER_DOWNGRADE => match held {
                Some(l) if l.uuid == a.uuid && l.writer => {
                    st.locks.insert(
                        nc,
                        NcLock {
                            uuid: a.uuid,
                            writer: false,
                        },
                    );
                    Ok(())
                }
                _ => Err(Errno::EINVAL),
            },
            _ => match held {
                Some(l) if l.uuid == a.uuid && !l.writer => {
                    self.sim
                        .release_nc(nc)
                        .map_err(errno_of("CRWL_READER_EXIT"))?;
                    st.locks.remove(&nc);
                    st.windows.remove(&nc);
                    st.forget_ring(nc);
                    Ok(())
                }
                _ => Err(Errno::EINVAL),
            },
        }
    }

    fn resource_mmap_info(&self, arg: &mut [u8]) -> Result<(), Errno> {
        let mut a: ioctl::ResourceMmapInfo = decode(arg)?;
        if a.block != ioctl::MMAP_BLOCK_TPB || a.resource != ioctl::MMAP_RESOURCE_SEMAPHORE {
            return Err(Errno::EINVAL);
        }
        self.check_nc(a.block_id)?;
        a.offset = semaphore_window_offset(a.block_id);
        a.size = SEM_WINDOW_SIZE as u64;
        write_back(arg, &a)
    }

    fn mem_alloc_v2(&self, arg: &[u8]) -> Result<u64, Errno> {
        let a: ioctl::MemAllocV2 = decode(arg)?;
        let location = if a.host_memory != 0 {
            // Host chunks are coherent DMA memory: the driver refuses an alignment.
            if a.align != 0 {
                return Err(Errno::EINVAL);
            }
            MemLocation::Host
        } else {
            self.check_nc(a.nc_id)?;
            if a.dram_channel != self.hbm_channel(a.nc_id) {
                return Err(Errno::EINVAL);
            }
            MemLocation::Hbm { nc: a.nc_id }
        };
        let allocation = self
            .sim
            .mem_alloc(location, a.size, a.align)
            .map_err(errno_of("MEM_ALLOC_V2"))?;
        let chunk = Chunk {
            allocation,
            size: allocation.size,
        };
        self.state().chunks.insert(allocation.handle.0, chunk);
        Ok(allocation.handle.0)
    }

    fn mem_get_extended_info(&self, arg: &mut [u8]) -> Result<(), Errno> {
        let mut a: ioctl::MemGetExtendedInfo = decode(arg)?;
        let handle = a.mem_handle;
        let chunk = self
            .state()
            .chunks
            .get(&handle)
            .copied()
            .ok_or(Errno::EIO)?;
        let pa = chunk.allocation.pa;
        a.mem_handle = KERNEL_POINTER_BASE.wrapping_add(handle.wrapping_mul(0x40));
        a.host_memory = u32::from(chunk.allocation.location == MemLocation::Host);
        a.mmap_offset = pa;
        a.pa = pa;
        a.pid = u64::from(std::process::id());
        a.size = chunk.size;
        write_back(arg, &a)
    }

    fn mem_free(&self, arg: &[u8]) -> Result<(), Errno> {
        let a: ioctl::MemFree = decode(arg)?;
        self.sim
            .mem_free_confirmed(MemHandle(a.mem_handle))
            .map_err(errno_of("MEM_FREE"))?;
        let mut st = self.state();
        st.chunks.remove(&a.mem_handle);
        st.rings.retain(|_, r| r.handle != a.mem_handle);
        Ok(())
    }

    fn dma_queue_init(&self, arg: &[u8]) -> Result<(), Errno> {
        let a: ioctl::DmaQueueInit = decode(arg)?;
        let queue = self.queue(a.eng_id, a.qid)?;
        if a.rxc_handle != 0 {
            // Completion rings are "not supported": the driver fails the init.
            return Err(Errno::EINVAL);
        }
        let rings = DmaRings {
            tx_ring: MemHandle(a.tx_handle),
            tx_desc_count: a.tx_desc_count,
            rx_ring: MemHandle(a.rx_handle),
            rx_desc_count: a.rx_desc_count,
        };
        self.sim
            .dma_queue_init(queue, &rings)
            .map_err(errno_of("DMA_QUEUE_INIT"))
    }

    fn dma_queue_release(&self, arg: &[u8]) -> Result<(), Errno> {
        let a: ioctl::DmaQueueRelease = decode(arg)?;
        let queue = self.queue(a.eng_id, a.qid)?;
        self.sim
            .dma_queue_release(queue)
            .map_err(errno_of("DMA_QUEUE_RELEASE"))
    }

    fn dma_queue_copy_start(&self, arg: &[u8]) -> Result<(), Errno> {
        let a: ioctl::DmaQueueCopyStart = decode(arg)?;
        let queue = self.queue(a.eng_id, a.qid)?;
        if a.rx_desc_count == 0 {
            tracing::error!(
                ?queue,
                "shim: DMA_QUEUE_COPY_START with rx_desc_count 0 (a kernel BUG_ON)"
            );
            return Err(Errno::EINVAL);
        }
        self.sim
            .dma_queue_copy_start(queue, a.tx_desc_count, a.rx_desc_count)
            .map_err(errno_of("DMA_QUEUE_COPY_START"))
    }

    fn semaphore(&self, request: u32, arg: &mut [u8]) -> Result<(), Errno> {
        let mut a: ioctl::Semaphore = decode(arg)?;
        let (nc, index, value) = (a.nc_id, a.semaphore_index, a.value);
        match request {
            ioctl::SEMAPHORE_INCREMENT => self
                .sim
                .semaphore_increment(nc, index, value)
                .map_err(errno_of("SEMAPHORE_INCREMENT")),
            ioctl::SEMAPHORE_DECREMENT => self
                .sim
                .semaphore_decrement(nc, index, value)
                .map_err(errno_of("SEMAPHORE_DECREMENT")),
            ioctl::SEMAPHORE_WRITE => self
                .sim
                .semaphore_write(nc, index, value)
                .map_err(errno_of("SEMAPHORE_WRITE")),
            _ => {
                a.value = self
                    .sim
                    .semaphore_read(nc, index)
                    .map_err(errno_of("SEMAPHORE_READ"))?;
                write_back(arg, &a)
            }
        }
    }

    fn event(&self, request: u32, arg: &mut [u8]) -> Result<(), Errno> {
        let mut a: ioctl::Event = decode(arg)?;
        if request == ioctl::EVENT_SET {
            return self
                .sim
                .event_set(a.nc_id, a.event_index, a.value)
                .map_err(errno_of("EVENT_SET"));
        }
        a.value = self
            .sim
            .event_get(a.nc_id, a.event_index)
            .map_err(errno_of("EVENT_GET"))?;
        write_back(arg, &a)
    }

    fn notifications_init_v2(&self, arg: &mut [u8]) -> Result<(), Errno> {
        let mut a: ioctl::NotificationsInitV2 = decode(arg)?;
        let nc = a.nq_dev_id;
        if a.nq_dev_type != ioctl::NQ_DEVICE_TYPE_NEURON_CORE
            || a.nq_type != ioctl::NQ_TYPE_NOTIFY
            || a.engine_index != 0
            || a.on_host_memory == 0
            || !a.size.is_power_of_two()
        {
            return Err(Errno::EINVAL);
        }
        self.check_nc(nc)?;
        let mut st = self.state();
        let existing = st
            .rings
            .get(&nc)
            .and_then(|r| st.chunks.get(&r.handle))
            .map(|c| c.allocation);
        let allocation = match existing {
            // The ring lives as long as the device: a later init returns it.
            Some(allocation) => allocation,
            None => {
                let entries = notification_entries_for_bytes(a.size).ok_or(Errno::EINVAL)?;
                let nq = self
                    .sim
                    .notification_queue_init(nc, entries)
                    .map_err(errno_of("NOTIFICATIONS_INIT_V2"))?;
                // The backend maps the ring itself, through `map`.
                drop(nq.memory);
                let handle = nq.allocation.handle.0;
                st.chunks.insert(
                    handle,
                    Chunk {
                        allocation: nq.allocation,
                        size: u64::from(a.size).next_multiple_of(CHUNK_GRANULE),
                    },
                );
                st.rings.insert(
                    nc,
                    Ring {
                        handle,
                        entries: nq.entries,
                    },
                );
                nq.allocation
            }
        };
        // A host ring's mmap offset is its PA.
        a.mmap_offset = allocation.pa;
        a.mem_handle = allocation.handle.0;
        write_back(arg, &a)
    }

    fn nc_reset(&self, arg: &mut [u8]) -> Result<(), Errno> {
        let mut a: ioctl::DeviceReset = decode(arg)?;
        let nc_count = self.nc_count();
        let ncs: Vec<u32> = if a.nc_map == u32::MAX {
            (0..nc_count).collect()
        } else {
            if a.nc_map == 0 || (nc_count < 32 && a.nc_map >> nc_count != 0) {
                return Err(Errno::EINVAL);
            }
            (0..nc_count.min(32))
                .filter(|nc| a.nc_map & (1 << nc) != 0)
                .collect()
        };
        let mut st = self.state();
        let mut result = 0;
        for nc in ncs {
            match self.sim.nc_reset(nc) {
                Ok(()) => st.forget_ring(nc),
                Err(e) => {
                    tracing::debug!(nc, error = %e, "shim: NC reset failed");
                    result = 1;
                }
            }
        }
        // The driver tags the reset with the caller's tgid.
        let request_id = std::process::id();
        st.resets.insert(request_id, result);
        a.request_id = request_id;
        write_back(arg, &a)
    }

    fn nc_reset_ready(&self, arg: &mut [u8]) -> Result<(), Errno> {
        let mut a: ioctl::DeviceReady = decode(arg)?;
        a.result = self.state().resets.remove(&a.request_id).unwrap_or(1);
        write_back(arg, &a)
    }

    /// The semaphore window of NC `nc`: the claim's, or a fresh one from an idempotent
    /// `claim_nc` when it was already handed out.
    fn map_window(
        &self,
        nc: u32,
        pa: u64,
        len: usize,
        writable: bool,
    ) -> Result<SharedChunk, MemError> {
        if writable {
            return Err(map_error(
                pa,
                len,
                "simdev's semaphore window can only be mapped read-only",
            ));
        }
        if len != SEM_WINDOW_SIZE {
            return Err(map_error(
                pa,
                len,
                format!("the semaphore window is {SEM_WINDOW_SIZE:#x} bytes (no partial maps)"),
            ));
        }
        let mut st = self.state();
        if !st.locks.contains_key(&nc) {
            return Err(map_error(pa, len, format!("NC {nc} is not claimed")));
        }
        if let Some(window) = st.windows.remove(&nc) {
            return Ok(window);
        }
        let claimed = self.sim.claim_nc(nc).map_err(|e| MemError::Map {
            pa,
            len,
            source: io::Error::other(e.to_string()),
        })?;
        claimed
            .semaphore_window
            .ok_or_else(|| map_error(pa, len, "simdev sent no semaphore window"))
    }
}

impl IoctlPort for SimIoctlPort {
    fn path(&self) -> &Path {
        &self.path
    }

    fn ioctl(&self, request: u32, arg: &mut [u8]) -> Result<(), Errno> {
        self.count(request);
        match request {
            ioctl::DEVICE_BASIC_INFO => self.device_basic_info(arg),
            ioctl::CRWL_WRITER_ENTER | ioctl::CRWL_WRITER_DOWNGRADE | ioctl::CRWL_READER_EXIT => {
                self.crwl(request, arg)
            }
            ioctl::RESOURCE_MMAP_INFO => self.resource_mmap_info(arg),
            // A pointer argument: only through `ioctl_out_u64`, as `DeviceFile` requires.
            ioctl::MEM_ALLOC_V2 => Err(Errno::EINVAL),
            ioctl::MEM_GET_EXTENDED_INFO => self.mem_get_extended_info(arg),
            ioctl::MEM_FREE => self.mem_free(arg),
            ioctl::DMA_QUEUE_INIT => self.dma_queue_init(arg),
            ioctl::DMA_QUEUE_RELEASE => self.dma_queue_release(arg),
            ioctl::DMA_QUEUE_COPY_START => self.dma_queue_copy_start(arg),
            ioctl::SEMAPHORE_INCREMENT
            | ioctl::SEMAPHORE_DECREMENT
            | ioctl::SEMAPHORE_READ
            | ioctl::SEMAPHORE_WRITE => self.semaphore(request, arg),
            ioctl::EVENT_SET | ioctl::EVENT_GET => self.event(request, arg),
            ioctl::NOTIFICATIONS_INIT_V2 => self.notifications_init_v2(arg),
            ioctl::NC_RESET => self.nc_reset(arg),
            ioctl::NC_RESET_READY => self.nc_reset_ready(arg),
            _ => Err(Errno::ENOTTY),
        }
    }

    fn ioctl_out_u64(&self, request: u32, arg: &mut [u8], ptr_offset: usize) -> Result<u64, Errno> {
        self.count(request);
        if request != ioctl::MEM_ALLOC_V2 {
            return Err(if HANDLED.contains(&request) {
                Errno::EINVAL
            } else {
                Errno::ENOTTY
            });
        }
        if ptr_offset != offset_of!(ioctl::MemAllocV2, mem_handle) {
            return Err(Errno::EINVAL);
        }
        self.mem_alloc_v2(arg)
    }

    /// The driver's `mmap`: `offset` names a chunk by its PA (memory chunks and notification
    /// rings) or a semaphore window by its RESOURCE_MMAP_INFO offset; `len` must be the whole
    /// chunk and `pa` its own PA.
    fn map(
        &self,
        offset: u64,
        pa: u64,
        len: usize,
        writable: bool,
    ) -> Result<SharedChunk, MemError> {
        self.maps.fetch_add(1, Ordering::Relaxed);
        if pa != offset {
            return Err(map_error(
                pa,
                len,
                format!("the shim places a mapping at its mmap offset {offset:#x}, not {pa:#x}"),
            ));
        }
        let window_nc = (0..self.nc_count()).find(|&nc| semaphore_window_offset(nc) == offset);
        if let Some(nc) = window_nc {
            return self.map_window(nc, pa, len, writable);
        }
        let chunk = self
            .state()
            .chunks
            .values()
            .find(|c| c.allocation.pa == offset)
            .copied()
            .ok_or_else(|| map_error(pa, len, format!("no chunk at mmap offset {offset:#x}")))?;
        if u64::try_from(len).ok() != Some(chunk.size) {
            return Err(map_error(
                pa,
                len,
                format!(
                    "the chunk at {offset:#x} is {:#x} bytes: the driver maps whole chunks only",
                    chunk.size
                ),
            ));
        }
        if !writable {
            return Err(map_error(
                pa,
                len,
                "simdev maps memory chunks read-write only",
            ));
        }
        self.sim
            .mem_map(&chunk.allocation)
            .map_err(|e| MemError::Map {
                pa,
                len,
                source: io::Error::other(e.to_string()),
            })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ring_bytes_decode_to_the_entries_the_backend_asked_for_from_64_up() {
        for entries in [64u32, 128, 1024, 4096, NQ_MAX_ENTRIES] {
            let bytes = u32::try_from(nq_bytes(entries).next_power_of_two())
                .unwrap()
                .max(4096);
            assert_eq!(
                notification_entries_for_bytes(bytes),
                Some(entries),
                "{entries}"
            );
        }
        // Below 64 entries the backend still asks for 4 KiB, which holds 64 (module docs).
        assert_eq!(notification_entries_for_bytes(4096), Some(64));
        assert_eq!(notification_entries_for_bytes(191), None);
        assert_eq!(notification_entries_for_bytes(192), Some(2));
    }

    #[test]
    fn semaphore_windows_sit_at_the_v2_device_addresses() {
        assert_eq!(semaphore_window_offset(0), 0x0FFF_C270_0000);
        assert_eq!(semaphore_window_offset(1), 0x0FFF_C670_0000);
    }
}
