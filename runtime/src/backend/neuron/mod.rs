//! The hardware backend: [`NeuronDevice`] drives `/dev/neuronN` through the aws-neuronx-dkms
//! ioctl ABI, driver 2.24.7.0 (`reference/driver-abi.md`; request values and argument structs
//! from [`shared::ioctl`]).
//!
//! **Status: compiled and unit-tested against the driver ABI, not yet run on silicon.** The
//! tests drive every method through a recording fake port and pin the exact request value and
//! argument bytes the driver would receive; nothing here has talked to a real device.
//!
//! Layers:
//! - `sys` (the only `unsafe` code): [`DeviceFile`], the opened node, with a size-checked
//!   `ioctl` and the driver's `mmap`.
//! - [`IoctlPort`]: the three calls the device makes on the file, so [`NeuronDevice`] can run
//!   against a fake in tests.
//! - [`NeuronDevice`]: the [`Device`] methods, one ioctl (or two) each. Ids are range-checked
//!   against [`DeviceInfo`] before anything reaches the port, and the kernel-crashing or
//!   driver-unchecked inputs (`rx_desc_count == 0`, event ids) are refused here.
//! - `shim` (test-only, feature `test-support`): `SimIoctlPort`, a port that decodes the
//!   driver's request values and argument bytes and forwards them to simdev, so the test crate
//!   can run the whole runtime through this backend.
//!
//! Silicon has no completion interrupt (driver-abi §3, §7.5): [`ClaimedNc::notification_fd`] is
//! always `None` and the runtime polls the notification queue or semaphores.

#[cfg(any(test, feature = "test-support"))]
pub mod shim;
mod sys;
#[cfg(test)]
mod tests;

use std::collections::HashMap;
use std::fmt;
use std::hash::{BuildHasher, RandomState};
use std::mem::offset_of;
use std::path::Path;
use std::sync::{Mutex, OnceLock, PoisonError};
use std::time::{SystemTime, UNIX_EPOCH};

use nix::errno::Errno;
use shared::address_map::{Arch, CHUNK_GRANULE};
use shared::ioctl;
use shared::memory::{MemError, SharedChunk};
use shared::notification::nq_bytes;
use shared::protocol::{DeviceInfo, MemLocation, NcCounters};
use shared::udma::{MAX_RING_DESCS, is_valid_ring_size};
use zerocopy::{FromBytes, IntoBytes};

use super::{
    Allocation, ClaimedNc, Device, DeviceError, DmaQueueId, DmaRings, MemHandle, NotificationQueue,
    check_queue, check_range,
};
#[cfg(any(test, feature = "test-support"))]
pub use shim::SimIoctlPort;
pub use sys::DeviceFile;

/// Bytes per UDMA descriptor.
const DESCRIPTOR_BYTES: u64 = 16;
/// Largest notification queue, in entries: the largest power of two whose ring (header plus
/// entries, rounded up to a power of two) fits NOTIFICATIONS_INIT_V2's `u32` byte size.
pub const MAX_NQ_ENTRIES: u32 = {
    let mut entries: u32 = 1 << 31;
    while nq_bytes(entries) > 1 << 31 {
        entries >>= 1;
    }
    entries
};

/// The entries a notification ring of `size` bytes holds: the largest power of two `e ≥
/// entries` (at most [`MAX_NQ_ENTRIES`]) with `nq_bytes(e) ≤ size`. The device wraps at the end
/// of the ring it was given, not at the entries the runtime asked for, so a ring rounded up
/// to the 4 KiB granule must be read with the entries it really holds.
fn entries_held(entries: u32, size: u32) -> u32 {
    let mut held = entries;
    while held < MAX_NQ_ENTRIES && nq_bytes(held * 2) as u64 <= u64::from(size) {
        held *= 2;
    }
    held
}

/// What `/dev/neuronN` needs from its file: the driver's `ioctl` and `mmap`.
///
/// [`DeviceFile`] is the real one; tests use a fake that records each request with its argument
/// bytes and writes canned replies into the argument.
///
/// Out-pointers get their own method. MEM_ALLOC_V2 does not return the new handle in its
/// argument: the driver writes it through the `mem_handle` *user pointer* field. A fake cannot
/// safely write through a pointer it was handed as bytes, and a safe `ioctl` that let callers
/// choose that pointer would let the kernel write anywhere. So the backend sends the argument
/// with the pointer field zeroed and names the field's offset; the port points it at its own
/// `u64` and returns the value. The fake records the zeroed field (stable golden bytes) and
/// returns a scripted handle.
pub trait IoctlPort: Send + Sync + fmt::Debug {
    /// The device node, for messages.
    fn path(&self) -> &Path;

    /// Issues `request` with `arg` (exactly the driver struct's bytes) as its in-place argument.
    ///
    /// # Errors
    /// The errno; a positive driver return is `EIO` (driver-abi §1.1).
    fn ioctl(&self, request: u32, arg: &mut [u8]) -> Result<(), Errno>;

    /// Issues `request` whose argument has a `u64 *` out-pointer at byte `ptr_offset`, and
    /// returns what the driver wrote through it.
    ///
    /// # Errors
    /// As [`IoctlPort::ioctl`].
    fn ioctl_out_u64(&self, request: u32, arg: &mut [u8], ptr_offset: usize) -> Result<u64, Errno>;

    /// Maps `len` bytes at the driver's mmap offset `offset`, placed at device PA `pa`.
    ///
    /// # Errors
    /// [`MemError::Map`].
    fn map(
        &self,
        offset: u64,
        pa: u64,
        len: usize,
        writable: bool,
    ) -> Result<SharedChunk, MemError>;
}

impl IoctlPort for DeviceFile {
    fn path(&self) -> &Path {
        DeviceFile::path(self)
    }

    fn ioctl(&self, request: u32, arg: &mut [u8]) -> Result<(), Errno> {
        DeviceFile::ioctl(self, request, arg)
    }

    fn ioctl_out_u64(&self, request: u32, arg: &mut [u8], ptr_offset: usize) -> Result<u64, Errno> {
        DeviceFile::ioctl_out_u64(self, request, arg, ptr_offset)
    }

    fn map(
        &self,
        offset: u64,
        pa: u64,
        len: usize,
        writable: bool,
    ) -> Result<SharedChunk, MemError> {
        DeviceFile::map(self, offset, pa, len, writable)
    }
}

/// Where a chunk is, as MEM_GET_EXTENDED_INFO reported it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Chunk {
    /// First device PA (host memory: DMA address | PCIe host base).
    pa: u64,
    /// The driver's mmap offset.
    mmap_offset: u64,
    /// Size in bytes (rounded up to 4 KiB by the driver).
    size: u64,
}

/// Per-generation driver facts (driver-abi §5).
struct ArchFacts {
    /// First device PA of each HBM stack.
    hbm_stack_bases: &'static [u64],
    /// HBM bytes each NC gets.
    hbm_bytes_per_nc: u64,
}

/// V2 (trn1/inf2): 2 HBM × 16 GiB, NC i uses HBM i.
const V2_FACTS: ArchFacts = ArchFacts {
    hbm_stack_bases: &[0x0, 0x10_0000_0000],
    hbm_bytes_per_nc: 16 << 30,
};

/// V3 (trn2): 4 HBM × 24 GiB active = 96 GiB for 8 NCs, two NCs per HBM.
const V3_FACTS: ArchFacts = ArchFacts {
    hbm_stack_bases: &[0x0, 0x40_0000_0000, 0x8000_0000_0000, 0x8040_0000_0000],
    hbm_bytes_per_nc: 12 << 30,
};

const fn arch_facts(arch: Arch) -> &'static ArchFacts {
    match arch {
        Arch::Trn1 | Arch::Inf2 => &V2_FACTS,
        Arch::Trn2 => &V3_FACTS,
    }
}

/// The [`DeviceInfo`] of a device of generation `arch` at `path`, from the driver's facts.
fn device_info(arch: Arch, path: &Path) -> DeviceInfo {
    let facts = arch_facts(arch);
    let nc_count = arch.default_nc_count();
    let hbm_bases = (0..nc_count)
        .map(|nc| facts.hbm_stack_bases[(nc / arch.ncs_per_hbm()) as usize])
        .collect();
    DeviceInfo {
        arch,
        nc_count,
        hbm_bytes_per_nc: facts.hbm_bytes_per_nc,
        hbm_bases,
        host_base: arch.host_base(),
        reg_base: 0,
        semaphores_per_nc: arch.semaphores_per_nc(),
        events_per_nc: arch.events_per_nc(),
        dma_engines_per_nc: arch.dma_engines_per_nc(),
        dma_queues_per_engine: arch.dma_queues_per_engine(),
        description: format!(
            "{} (aws-neuronx-dkms), not yet run on silicon",
            path.display()
        ),
    }
}

/// This process's NC-lock holder id (the 32-byte `uuid` of CRWL requests): the pid (4 bytes,
/// little-endian), the start time in nanoseconds since the Unix epoch (16 bytes), 8 random
/// bytes, and the tag `b"nrrs"`. Computed once per process.
fn process_uuid() -> [u8; 32] {
    static UUID: OnceLock<[u8; 32]> = OnceLock::new();
    *UUID.get_or_init(|| {
        let pid = crate::process::id();
        let nanos = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos());
        let random = RandomState::new().hash_one((pid, nanos));
        let mut uuid = [0u8; 32];
        uuid[0..4].copy_from_slice(&pid.to_le_bytes());
        uuid[4..20].copy_from_slice(&nanos.to_le_bytes());
        uuid[20..28].copy_from_slice(&random.to_le_bytes());
        uuid[28..32].copy_from_slice(b"nrrs");
        uuid
    })
}

/// `/dev/neuronN` through the aws-neuronx-dkms ioctls (driver 2.24.7.0). **Compiled and
/// unit-tested against the driver ABI, not yet run on silicon.**
///
/// Generic over its [`IoctlPort`] so tests can substitute a fake; [`NeuronDevice::open`] gives
/// the real one. All methods take `&self` and may be called from several threads: the driver
/// serialises what needs it, and the only local state (the chunk table) is behind a mutex that
/// the doorbell paths (SEMAPHORE_INCREMENT, DMA_QUEUE_COPY_START) never take.
pub struct NeuronDevice<P: IoctlPort = DeviceFile> {
    port: P,
    info: DeviceInfo,
    /// The CRWL holder id this device claims NCs with ([`process_uuid`]).
    uuid: [u8; 32],
    /// Chunks allocated through this device, by handle: MEM_GET_EXTENDED_INFO's answer, kept
    /// because mmap needs the offset and the driver clobbers the handle field when asked.
    chunks: Mutex<HashMap<u64, Chunk>>,
    /// The process that opened the device: a child forked after that inherits the fd, but
    /// every ioctl and mmap from it is refused ([`DeviceError::Forked`]) before it reaches the
    /// driver, so it cannot free, map or ring the parent's resources.
    owner: u32,
}

impl<P: IoctlPort> fmt::Debug for NeuronDevice<P> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("NeuronDevice")
            .field("port", &self.port)
            .field("arch", &self.info.arch)
            .field("nc_count", &self.info.nc_count)
            .finish_non_exhaustive()
    }
}

impl NeuronDevice<DeviceFile> {
    /// Opens the device node `path` (e.g. `/dev/neuron0`) read-write, which attaches this
    /// process to the device, and reads its generation (DEVICE_BASIC_INFO).
    ///
    /// # Errors
    /// [`DeviceError::NoDevice`] when the node cannot be opened (the hint names the path, the OS
    /// error and what to check) or reports an unsupported generation (V1/inf1 or unknown);
    /// [`DeviceError::Ioctl`] when DEVICE_BASIC_INFO fails.
    pub fn open(path: &Path) -> Result<Self, DeviceError> {
        let file = DeviceFile::open(path).map_err(|e| {
            let advice = match e.kind() {
                std::io::ErrorKind::NotFound => {
                    "is the aws-neuronx-dkms driver installed and loaded (`lsmod | grep neuron`)? \
                     NEURON_RT_BACKEND=sim selects the simulator instead"
                }
                std::io::ErrorKind::PermissionDenied => {
                    "the node must be readable and writable by this user"
                }
                _ => "the driver refused the open (16 processes at most per device; none during a reset)",
            };
            DeviceError::NoDevice {
                hint: format!("cannot open {} read-write: {e}; {advice}", path.display()),
            }
        })?;
        Self::with_port(file)
    }
}

impl<P: IoctlPort> NeuronDevice<P> {
    /// A device over `port`: reads the generation (DEVICE_BASIC_INFO) and builds
    /// [`DeviceInfo`] from the driver's facts (driver-abi §5):
    ///
    /// - V2 (trn1/inf2): 2 NCs, 16 GiB HBM per NC, NC `i` on HBM `i` at 0x0 and
    ///   0x10_0000_0000; host base 0x1000_0000_0000. The driver's architecture number does not
    ///   tell trn1 from inf2 (the PCI id would), so V2 is reported as [`Arch::Trn1`].
    /// - V3 (trn2): 8 NCs, 12 GiB per NC (4 HBM × 24 GiB), NCs `2k` and `2k+1` on HBM `k` at
    ///   0x0, 0x40_0000_0000, 0x8000_0000_0000, 0x8040_0000_0000; host base 0x4000_0000_0000.
    ///
    /// `hbm_bases[nc]` is the base of the NC's HBM *stack*: on V3 both NCs of a pair report the
    /// same base, because the driver allocates both from one per-HBM pool and reserves no
    /// per-NC range. The first 16 MiB of each stack are the firmware's, so no chunk starts
    /// there. `reg_base` is 0: on hardware registers are reached through ioctls and the
    /// RESOURCE_MMAP_INFO window, never by a PA the runtime writes.
    ///
    /// # Errors
    /// [`DeviceError::Ioctl`] when DEVICE_BASIC_INFO fails; [`DeviceError::NoDevice`] for an
    /// architecture other than 2 or 3.
    pub fn with_port(port: P) -> Result<Self, DeviceError> {
        let op = "DEVICE_BASIC_INFO";
        let mut basic = ioctl::DeviceBasicInfo::default();
        port.ioctl(ioctl::DEVICE_BASIC_INFO, basic.as_mut_bytes())
            .map_err(|source| DeviceError::Ioctl {
                op,
                request: ioctl::DEVICE_BASIC_INFO,
                source,
            })?;
        let arch = Arch::from_version(basic.architecture).ok_or_else(|| {
            let generation = match basic.architecture {
                1 => " (V1, inf1)",
                _ => "",
            };
            DeviceError::NoDevice {
                hint: format!(
                    "{} reports architecture {}{generation}, revision {}; this runtime supports \
                     2 (V2: trn1/inf2) and 3 (V3: trn2)",
                    port.path().display(),
                    basic.architecture,
                    basic.revision,
                ),
            }
        })?;
        let info = device_info(arch, port.path());
        Ok(Self {
            port,
            info,
            uuid: process_uuid(),
            chunks: Mutex::new(HashMap::new()),
            owner: crate::process::id(),
        })
    }

    /// The port this device talks through.
    pub fn port(&self) -> &P {
        &self.port
    }

    /// Refuses use from a process forked after the device was opened.
    fn check_owner(&self, op: &'static str) -> Result<(), DeviceError> {
        let current = crate::process::id();
        if current == self.owner {
            Ok(())
        } else {
            Err(DeviceError::Forked {
                op,
                owner: self.owner,
                current,
            })
        }
    }

    /// Issues `request` with the in-place argument `arg`.
    fn call<T: IntoBytes + FromBytes>(
        &self,
        op: &'static str,
        request: u32,
        arg: &mut T,
    ) -> Result<(), DeviceError> {
        self.check_owner(op)?;
        self.port
            .ioctl(request, arg.as_mut_bytes())
            .map_err(|source| DeviceError::Ioctl {
                op,
                request,
                source,
            })
    }

    fn chunks(&self) -> std::sync::MutexGuard<'_, HashMap<u64, Chunk>> {
        // The table holds plain values updated in single inserts/removes, so a panic elsewhere
        // cannot leave it half-written.
        self.chunks.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The HBM stack (MEM_ALLOC_V2 `dram_channel`) NC `nc` allocates from.
    fn hbm_index(&self, nc: u32) -> u32 {
        nc / self.info.arch.ncs_per_hbm()
    }

    /// The device-wide DMA engine id of `queue` (`nc · dma_engines_per_nc + engine`, < 132).
    /// `queue` must have passed [`check_queue`].
    fn eng_id(&self, queue: DmaQueueId) -> u32 {
        queue.nc * self.info.dma_engines_per_nc + queue.engine
    }

    /// MEM_GET_EXTENDED_INFO for `handle`. The driver overwrites the argument's `mem_handle`
    /// with a kernel pointer (driver-abi §1.5, §7.6), so the answer keeps no handle: callers
    /// use the one they asked about.
    fn extended_info(&self, handle: u64) -> Result<Chunk, DeviceError> {
        let mut arg = ioctl::MemGetExtendedInfo {
            mem_handle: handle,
            ..Default::default()
        };
        self.call(
            "MEM_GET_EXTENDED_INFO",
            ioctl::MEM_GET_EXTENDED_INFO,
            &mut arg,
        )?;
        Ok(Chunk {
            pa: arg.pa,
            mmap_offset: arg.mmap_offset,
            size: arg.size,
        })
    }

    /// The chunk behind `handle`: from the table, else asked of the driver (chunks this device
    /// did not allocate, e.g. a notification queue's ring).
    fn chunk(&self, handle: MemHandle) -> Result<Chunk, DeviceError> {
        let known = self.chunks().get(&handle.0).copied();
        match known {
            Some(chunk) => Ok(chunk),
            None => self.extended_info(handle.0),
        }
    }

    /// Maps `len` bytes at `offset`, placed at `pa`.
    fn map(
        &self,
        offset: u64,
        pa: u64,
        size: u64,
        writable: bool,
    ) -> Result<SharedChunk, DeviceError> {
        let op = "mmap";
        let len = usize::try_from(size).map_err(|_| DeviceError::OutOfRange {
            op,
            what: "chunk size",
            value: size,
            limit: usize::MAX as u64,
        })?;
        self.check_owner(op)?;
        self.port
            .map(offset, pa, len, writable)
            .map_err(|source| DeviceError::Map { op, source })
    }

    /// Checks one ring of DMA_QUEUE_INIT: `count` descriptors in 32..=2^24−16, a multiple of 16
    /// (driver-abi §2.5), and, for a chunk allocated here, no more than fit in it.
    fn check_ring(
        &self,
        what: &'static str,
        fits_what: &'static str,
        count: u32,
        ring: MemHandle,
    ) -> Result<(), DeviceError> {
        let op = "DMA_QUEUE_INIT";
        if !is_valid_ring_size(count) {
            return Err(DeviceError::OutOfRange {
                op,
                what,
                value: count.into(),
                limit: u64::from(MAX_RING_DESCS) + 1,
            });
        }
        let size = self.chunks().get(&ring.0).map(|c| c.size);
        if let Some(size) = size {
            let capacity = size / DESCRIPTOR_BYTES;
            if u64::from(count) > capacity {
                return Err(DeviceError::OutOfRange {
                    op,
                    what: fits_what,
                    value: count.into(),
                    limit: capacity + 1,
                });
            }
        }
        Ok(())
    }

    /// One of the four semaphore requests; returns the argument's `value` afterwards (the
    /// semaphore for SEMAPHORE_READ).
    fn semaphore(
        &self,
        op: &'static str,
        request: u32,
        nc: u32,
        index: u32,
        value: u32,
    ) -> Result<u32, DeviceError> {
        check_range(op, "nc", nc, self.info.nc_count)?;
        check_range(op, "semaphore index", index, self.info.semaphores_per_nc)?;
        let mut arg = ioctl::Semaphore {
            nc_id: nc,
            semaphore_index: index,
            value,
        };
        self.call(op, request, &mut arg)?;
        Ok(arg.value)
    }

    /// EVENT_SET or EVENT_GET. The driver checks neither `nc_id` nor `event_index ==
    /// events_per_nc` (off by one; driver-abi §4, §7.8), so both are checked here.
    fn event(
        &self,
        op: &'static str,
        request: u32,
        nc: u32,
        index: u32,
        value: u32,
    ) -> Result<u32, DeviceError> {
        check_range(op, "nc", nc, self.info.nc_count)?;
        check_range(op, "event index", index, self.info.events_per_nc)?;
        let mut arg = ioctl::Event {
            nc_id: nc,
            event_index: index,
            value,
        };
        self.call(op, request, &mut arg)?;
        Ok(arg.value)
    }

    /// RESOURCE_MMAP_INFO {TPB, nc, SEMAPHORE} and a read-only map of the window it names, at
    /// PA = its mmap offset (on V2 the device-side TPB address of NC `nc`'s events,
    /// 0x0FFF_C000_0000 + nc·0x400_0000 + 0x270_0000). `None`, logged, when either step fails:
    /// the window only saves syscalls, the semaphore ioctls still work.
    fn semaphore_window(&self, nc: u32) -> Option<SharedChunk> {
        let mut arg = ioctl::ResourceMmapInfo {
            block: ioctl::MMAP_BLOCK_TPB,
            block_id: nc,
            resource: ioctl::MMAP_RESOURCE_SEMAPHORE,
            ..Default::default()
        };
        if let Err(e) = self.call("RESOURCE_MMAP_INFO", ioctl::RESOURCE_MMAP_INFO, &mut arg) {
            tracing::debug!(nc, error = %e, "no semaphore window: RESOURCE_MMAP_INFO failed");
            return None;
        }
        match self.map(arg.offset, arg.offset, arg.size, false) {
            Ok(window) => Some(window),
            Err(e) => {
                tracing::warn!(nc, offset = arg.offset, size = arg.size, error = %e,
                    "no semaphore window: mapping it failed");
                None
            }
        }
    }
}

impl<P: IoctlPort> Device for NeuronDevice<P> {
    fn backend_name(&self) -> &'static str {
        "neuron"
    }

    /// Built at open from DEVICE_BASIC_INFO and the driver's per-arch facts (see
    /// [`NeuronDevice::with_port`]).
    fn info(&self) -> &DeviceInfo {
        &self.info
    }

    /// CRWL_WRITER_ENTER {nc, this process's uuid} takes the NC's exclusive lock; then
    /// RESOURCE_MMAP_INFO {TPB, nc, SEMAPHORE} and a read-only map of the 8 KiB events +
    /// semaphores window (`semaphore_window: None` if that fails). `notification_fd` is always
    /// `None`: silicon has no completion interrupt.
    fn claim_nc(&self, nc: u32) -> Result<ClaimedNc, DeviceError> {
        let op = "CRWL_WRITER_ENTER";
        check_range(op, "nc", nc, self.info.nc_count)?;
        let mut lock = ioctl::Crwl {
            nc_id: nc,
            uuid: self.uuid,
        };
        self.call(op, ioctl::CRWL_WRITER_ENTER, &mut lock)?;
        Ok(ClaimedNc {
            nc,
            semaphore_window: self.semaphore_window(nc),
            notification_fd: None,
        })
    }

    /// CRWL_WRITER_DOWNGRADE then CRWL_READER_EXIT, with the claim's uuid. The driver documents
    /// no writer-exit: it releases NC locks when the process closes the device. Downgrading to
    /// a reader and leaving as one is our reading of how a writer gives the lock back before
    /// that.
    fn release_nc(&self, nc: u32) -> Result<(), DeviceError> {
        check_range("CRWL_WRITER_DOWNGRADE", "nc", nc, self.info.nc_count)?;
        let mut lock = ioctl::Crwl {
            nc_id: nc,
            uuid: self.uuid,
        };
        self.call(
            "CRWL_WRITER_DOWNGRADE",
            ioctl::CRWL_WRITER_DOWNGRADE,
            &mut lock,
        )?;
        let mut lock = ioctl::Crwl {
            nc_id: nc,
            uuid: self.uuid,
        };
        self.call("CRWL_READER_EXIT", ioctl::CRWL_READER_EXIT, &mut lock)
    }

    /// MEM_ALLOC_V2 {size, align, host_memory, dram_channel = the NC's HBM stack, dram_region
    /// 0, nc_id} (host memory: nc_id 0, channel 0), the handle coming back through the
    /// `mem_handle` out-pointer; then MEM_GET_EXTENDED_INFO for the PA, mmap offset and rounded
    /// size. If that second call fails the chunk is freed again.
    ///
    /// # Errors
    /// `OutOfRange` for a bad NC, or a non-zero `align` for host memory (the driver rejects it:
    /// host chunks are coherent DMA memory; driver-abi §1.5); `Ioctl` (ENOMEM = out of memory);
    /// `Protocol` if the driver returns handle 0.
    fn mem_alloc(
        &self,
        location: MemLocation,
        size: u64,
        align: u64,
    ) -> Result<Allocation, DeviceError> {
        let op = "MEM_ALLOC_V2";
        let (host_memory, dram_channel, nc_id) = match location {
            MemLocation::Hbm { nc } => {
                check_range(op, "nc", nc, self.info.nc_count)?;
                (0, self.hbm_index(nc), nc)
            }
            MemLocation::Host if align != 0 => {
                return Err(DeviceError::OutOfRange {
                    op,
                    what: "align of host memory (must be 0)",
                    value: align,
                    limit: 1,
                });
            }
            MemLocation::Host => (1, 0, 0),
        };
        let mut arg = ioctl::MemAllocV2 {
            size,
            align,
            host_memory,
            dram_channel,
            dram_region: 0,
            nc_id,
            mem_handle: 0,
        };
        self.check_owner(op)?;
        let handle = self
            .port
            .ioctl_out_u64(
                ioctl::MEM_ALLOC_V2,
                arg.as_mut_bytes(),
                offset_of!(ioctl::MemAllocV2, mem_handle),
            )
            .map_err(|source| DeviceError::Ioctl {
                op,
                request: ioctl::MEM_ALLOC_V2,
                source,
            })?;
        if handle == 0 {
            return Err(DeviceError::Protocol {
                op,
                detail: "the driver returned memory handle 0 (invalid)".into(),
            });
        }
        let chunk = match self.extended_info(handle) {
            Ok(chunk) => chunk,
            Err(e) => {
                let mut free = ioctl::MemFree { mem_handle: handle };
                if let Err(free_error) = self.call("MEM_FREE", ioctl::MEM_FREE, &mut free) {
                    tracing::warn!(handle, error = %free_error, "leaking a chunk whose info failed");
                }
                return Err(e);
            }
        };
        self.chunks().insert(handle, chunk);
        Ok(Allocation {
            handle: MemHandle(handle),
            pa: chunk.pa,
            size: chunk.size,
            location,
        })
    }

    /// MEM_FREE {handle}; the chunk is forgotten once the driver accepts.
    fn mem_free(&self, handle: MemHandle) -> Result<(), DeviceError> {
        let mut arg = ioctl::MemFree {
            mem_handle: handle.0,
        };
        self.call("MEM_FREE", ioctl::MEM_FREE, &mut arg)?;
        self.chunks().remove(&handle.0);
        Ok(())
    }

    /// `mmap` of the whole chunk at its mmap offset, read-write, placed at its PA (the
    /// driver's answer, not `allocation`'s copy). Chunks not allocated through this device are
    /// looked up with MEM_GET_EXTENDED_INFO, so a bad handle gets the driver's error (a positive
    /// return, hence `EIO`).
    fn mem_map(&self, allocation: &Allocation) -> Result<SharedChunk, DeviceError> {
        let chunk = self.chunk(allocation.handle)?;
        self.map(chunk.mmap_offset, chunk.pa, chunk.size, true)
    }

    /// DMA_QUEUE_INIT {eng_id = nc · dma_engines_per_nc + engine, qid, ring sizes, ring
    /// handles, rxc_handle 0 (completion rings are unsupported), axi_port 0 (V1 only)}.
    fn dma_queue_init(&self, queue: DmaQueueId, rings: &DmaRings) -> Result<(), DeviceError> {
        let op = "DMA_QUEUE_INIT";
        check_queue(op, &self.info, queue)?;
        self.check_ring(
            "tx_desc_count (32..=2^24-16, a multiple of 16)",
            "tx_desc_count (descriptors that fit the TX ring chunk)",
            rings.tx_desc_count,
            rings.tx_ring,
        )?;
        self.check_ring(
            "rx_desc_count (32..=2^24-16, a multiple of 16)",
            "rx_desc_count (descriptors that fit the RX ring chunk)",
            rings.rx_desc_count,
            rings.rx_ring,
        )?;
        let mut arg = ioctl::DmaQueueInit {
            eng_id: self.eng_id(queue),
            qid: queue.queue,
            tx_desc_count: rings.tx_desc_count,
            rx_desc_count: rings.rx_desc_count,
            tx_handle: rings.tx_ring.0,
            rx_handle: rings.rx_ring.0,
            rxc_handle: 0,
            axi_port: 0,
            _pad: 0,
        };
        self.call(op, ioctl::DMA_QUEUE_INIT, &mut arg)
    }

    /// DMA_QUEUE_RELEASE {eng_id, qid}. The driver's handler is a no-op (driver-abi §7.2); the
    /// queue is really reset when the process closes the device. Sent anyway so a later driver
    /// that implements it sees it.
    fn dma_queue_release(&self, queue: DmaQueueId) -> Result<(), DeviceError> {
        let op = "DMA_QUEUE_RELEASE";
        check_queue(op, &self.info, queue)?;
        let mut arg = ioctl::DmaQueueRelease {
            eng_id: self.eng_id(queue),
            qid: queue.queue,
        };
        self.call(op, ioctl::DMA_QUEUE_RELEASE, &mut arg)
    }

    /// DMA_QUEUE_COPY_START {eng_id, qid, tx, rx}: the driver adds `rx` to the RX tail, then
    /// `tx` (if non-zero) to the TX tail (driver-abi §2.6).
    ///
    /// # Errors
    /// `OutOfRange` for bad ids, `rx_desc_count == 0` (a kernel `BUG_ON`, so it never reaches
    /// the driver), or a count above 2^24−16.
    fn dma_queue_copy_start(
        &self,
        queue: DmaQueueId,
        tx_desc_count: u32,
        rx_desc_count: u32,
    ) -> Result<(), DeviceError> {
        let op = "DMA_QUEUE_COPY_START";
        check_queue(op, &self.info, queue)?;
        if rx_desc_count == 0 || rx_desc_count > MAX_RING_DESCS {
            return Err(DeviceError::OutOfRange {
                op,
                what: "rx_desc_count (1..=2^24-16; 0 is a kernel BUG_ON)",
                value: rx_desc_count.into(),
                limit: u64::from(MAX_RING_DESCS) + 1,
            });
        }
        check_range(op, "tx_desc_count", tx_desc_count, MAX_RING_DESCS + 1)?;
        let mut arg = ioctl::DmaQueueCopyStart {
            eng_id: self.eng_id(queue),
            qid: queue.queue,
            tx_desc_count,
            rx_desc_count,
        };
        self.call(op, ioctl::DMA_QUEUE_COPY_START, &mut arg)
    }

    /// SEMAPHORE_INCREMENT (0x80084E29) {nc_id, semaphore_index, value}: one MMIO write of
    /// `value` to the INCR window; the hardware adds.
    fn semaphore_increment(&self, nc: u32, index: u32, value: u32) -> Result<(), DeviceError> {
        self.semaphore(
            "SEMAPHORE_INCREMENT",
            ioctl::SEMAPHORE_INCREMENT,
            nc,
            index,
            value,
        )
        .map(drop)
    }

    /// SEMAPHORE_DECREMENT {nc_id, semaphore_index, value}.
    fn semaphore_decrement(&self, nc: u32, index: u32, value: u32) -> Result<(), DeviceError> {
        self.semaphore(
            "SEMAPHORE_DECREMENT",
            ioctl::SEMAPHORE_DECREMENT,
            nc,
            index,
            value,
        )
        .map(drop)
    }

    /// SEMAPHORE_READ {nc_id, semaphore_index, 0}: the driver writes the value back.
    fn semaphore_read(&self, nc: u32, index: u32) -> Result<u32, DeviceError> {
        self.semaphore("SEMAPHORE_READ", ioctl::SEMAPHORE_READ, nc, index, 0)
    }

    /// SEMAPHORE_WRITE {nc_id, semaphore_index, value}.
    fn semaphore_write(&self, nc: u32, index: u32, value: u32) -> Result<(), DeviceError> {
        self.semaphore("SEMAPHORE_WRITE", ioctl::SEMAPHORE_WRITE, nc, index, value)
            .map(drop)
    }

    /// EVENT_SET {nc_id, event_index, value}; `nc` and `index` are checked here because the
    /// driver does not check `nc_id` and accepts `index == events_per_nc`.
    fn event_set(&self, nc: u32, index: u32, value: u32) -> Result<(), DeviceError> {
        self.event("EVENT_SET", ioctl::EVENT_SET, nc, index, value)
            .map(drop)
    }

    /// EVENT_GET {nc_id, event_index, 0}: the driver writes the value back. Checked as
    /// [`Device::event_set`].
    fn event_get(&self, nc: u32, index: u32) -> Result<u32, DeviceError> {
        self.event("EVENT_GET", ioctl::EVENT_GET, nc, index, 0)
    }

    /// NOTIFICATIONS_INIT_V2 {nq_dev_id nc, NEURON_CORE, NOTIFY, engine_index 0, size,
    /// on_host_memory 1}, then a read-write map of the ring (the consumer writes its head).
    /// `size` is `nq_bytes(entries)` rounded up to a power of two (the driver requires one) and
    /// to at least 4 KiB (the chunk granule, so the mapping is the whole chunk); the returned
    /// queue reports the entries that ring holds, which may exceed `entries`. The ring is
    /// host memory, so its mmap offset is also its PA. The queue lives as long as the device:
    /// a second init returns the existing ring.
    ///
    /// # Errors
    /// `OutOfRange` for a bad NC or `entries` not a power of two in `1..=MAX_NQ_ENTRIES`;
    /// `Ioctl`; `Protocol` if the driver placed the ring in device memory (all-ones offset);
    /// `Map`.
    fn notification_queue_init(
        &self,
        nc: u32,
        entries: u32,
    ) -> Result<NotificationQueue, DeviceError> {
        let op = "NOTIFICATIONS_INIT_V2";
        check_range(op, "nc", nc, self.info.nc_count)?;
        if !entries.is_power_of_two() || entries > MAX_NQ_ENTRIES {
            return Err(DeviceError::OutOfRange {
                op,
                what: "notification queue entries (a power of two)",
                value: entries.into(),
                limit: u64::from(MAX_NQ_ENTRIES) + 1,
            });
        }
        let ring_bytes = (nq_bytes(entries) as u64)
            .next_power_of_two()
            .max(CHUNK_GRANULE);
        let size = u32::try_from(ring_bytes).map_err(|_| DeviceError::OutOfRange {
            op,
            what: "notification queue bytes",
            value: ring_bytes,
            limit: u64::from(u32::MAX) + 1,
        })?;
        let mut arg = ioctl::NotificationsInitV2 {
            nq_dev_id: nc,
            nq_dev_type: ioctl::NQ_DEVICE_TYPE_NEURON_CORE,
            nq_type: ioctl::NQ_TYPE_NOTIFY,
            engine_index: 0,
            size,
            on_host_memory: 1,
            dram_channel: 0,
            dram_region: 0,
            mmap_offset: 0,
            mem_handle: 0,
        };
        self.call(op, ioctl::NOTIFICATIONS_INIT_V2, &mut arg)?;
        if arg.mmap_offset == u64::MAX {
            return Err(DeviceError::Protocol {
                op,
                detail: "the driver placed a host-memory ring in device memory".into(),
            });
        }
        let allocation = Allocation {
            handle: MemHandle(arg.mem_handle),
            pa: arg.mmap_offset,
            size: size.into(),
            location: MemLocation::Host,
        };
        let memory = self.map(arg.mmap_offset, arg.mmap_offset, size.into(), true)?;
        Ok(NotificationQueue {
            allocation,
            entries: entries_held(entries, size),
            memory,
        })
    }

    /// NC_RESET {nc_map = 1 << nc} → request_id, then NC_RESET_READY {request_id}, which blocks
    /// until the reset is done.
    ///
    /// # Errors
    /// `OutOfRange`; `Ioctl` (EINTR if a signal ends the wait); `Ioctl` with `EIO` on
    /// NC_RESET_READY when the driver reports `result` ≠ 0 (reset failed or unknown id: the
    /// driver gives no errno for it).
    fn nc_reset(&self, nc: u32) -> Result<(), DeviceError> {
        check_range("NC_RESET", "nc", nc, self.info.nc_count)?;
        let mut reset = ioctl::DeviceReset {
            nc_map: 1 << nc,
            request_id: 0,
        };
        self.call("NC_RESET", ioctl::NC_RESET, &mut reset)?;
        let mut ready = ioctl::DeviceReady {
            request_id: reset.request_id,
            result: 0,
        };
        self.call("NC_RESET_READY", ioctl::NC_RESET_READY, &mut ready)?;
        if ready.result != 0 {
            tracing::warn!(nc, result = ready.result, "NC reset failed");
            return Err(DeviceError::Ioctl {
                op: "NC_RESET_READY",
                request: ioctl::NC_RESET_READY,
                source: Errno::EIO,
            });
        }
        Ok(())
    }

    /// Always `Unsupported` after the NC check: the driver's READ_HW_COUNTERS reads raw
    /// registers by address, and the counter addresses are not public.
    fn nc_counters(&self, nc: u32) -> Result<NcCounters, DeviceError> {
        check_range("nc_counters", "nc", nc, self.info.nc_count)?;
        Err(DeviceError::Unsupported {
            op: "nc_counters",
            backend: "neuron",
        })
    }
}
