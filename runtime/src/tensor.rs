//! Tensors and tensor sets (`nrt_tensor_*`, `nrt_*_tensor_set`, `reference/nrt-api.md` §2.5–2.6).
//!
//! A device tensor is one chunk in the HBM of its vNC's first NC, mapped whole; reads and
//! writes go through the bounds-checked mapping. A host tensor is plain process memory: the sync
//! execute path clones it to device memory and copies results back (seed 000 §1 GOTCHA), the
//! implicit-async path refuses it.
//!
//! A tensor is a view (`offset`, `size`, optional own name) of refcounted storage: a slice
//! (`nrt_tensor_allocate_slice`) aliases a byte range of its source without copying, and the
//! storage lives until the last view of it is dropped. Storage is device memory, host memory,
//! a caller-owned [`HostBuffer`] (`nrt_tensor_attach_buffer`), or none at all
//! (`nrt_tensor_allocate_empty`, until a buffer is attached).
//!
//! A device tensor's mapping is shared with the device (`MAP_SHARED`), so a process forked from
//! the one that allocated it would read and write the parent's tensor through it: reads and
//! writes from another process are refused (NRT_UNINITIALIZED naming the allocating process),
//! and a drop there frees nothing (the sim backend refuses the inherited connection).

use crate::datastore::Datastore;
use crate::datastore::snapshot::MemKind;
use std::os::fd::OwnedFd;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use shared::NrtStatus;
use shared::memory::SharedChunk;

use crate::backend::{Allocation, Device};
use crate::error::NrtError;
use crate::output_completion::{OutputCompletion, Waited};

/// Where a tensor lives (`nrt_tensor_placement_t`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Placement {
    /// HBM of logical core `vnc` (`NRT_TENSOR_PLACEMENT_DEVICE`).
    Device {
        /// The logical core (process-relative).
        vnc: u32,
    },
    /// Host memory (`NRT_TENSOR_PLACEMENT_HOST`).
    Host,
}

/// The identity of one runtime instance ([`crate::api::Runtime`]), unique in the process: a
/// device tensor records the runtime that allocated it, a loaded model the runtime that loaded
/// it, and bind refuses a tensor of another runtime (`dlr_check_valid_io_sets`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct RuntimeId(u64);

impl RuntimeId {
    /// A new identity, never given before in this process.
    pub(crate) fn next() -> Self {
        static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);
        Self(NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed))
    }
}

impl std::fmt::Display for RuntimeId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "runtime #{}", self.0)
    }
}

#[derive(Debug)]
pub(crate) enum Storage {
    Device {
        allocation: Allocation,
        memory: SharedChunk,
        device: Arc<dyn Device>,
        /// The process that allocated it: the only one that may read or write it.
        owner: u32,
        /// The runtime instance that allocated it: the only one whose executions may bind it
        /// (another runtime is another connection, whose NCs cannot reach this memory).
        runtime: RuntimeId,
    },
    Host(Mutex<Vec<u8>>),
    /// Memory the caller owns (`nrt_tensor_attach_buffer`); never freed here.
    Attached(Arc<dyn HostBuffer>),
    /// No storage yet (`nrt_tensor_allocate_empty`).
    Empty,
}

/// [`UseHold`]'s state before the request has its sequence id.
const HOLD_SCHEDULING: u64 = 0;
/// [`UseHold`]'s state once the request's work item is freed.
const HOLD_DONE: u64 = u64::MAX;

/// A scheduled request's mark on the tensors it uses (a tensor operation's, an explicit-async
/// execution's), from before it is scheduled until its work item is freed at completion (or
/// the funnel refuses it): [`crate::api::Runtime::tensor_free`] refuses a tensor with a live
/// mark, naming the request's sequence id. The request also holds the tensors themselves, so
/// their storage outlives it whatever the caller drops.
///
/// The mark is one word shared with each tensor: 0 while the request is being scheduled, its
/// raw sequence id once known (never 0: sequence numbers start at 1), `u64::MAX` once done.
#[derive(Debug)]
pub struct UseHold(Arc<AtomicU64>);

impl UseHold {
    /// A mark on every tensor of `tensors`, in the "being scheduled" state.
    pub(crate) fn on<'a>(tensors: impl IntoIterator<Item = &'a Tensor>) -> Self {
        let word = Arc::new(AtomicU64::new(HOLD_SCHEDULING));
        for t in tensors {
            let mut h = t
                .inner
                .holders
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            h.retain(|w| w.load(Ordering::Acquire) != HOLD_DONE);
            h.push(word.clone());
        }
        Self(word)
    }

    /// The scheduler's handle for naming the request once its sequence id is known.
    pub(crate) fn namer(&self) -> HoldNamer {
        HoldNamer(self.0.clone())
    }

    /// The sequence id of the request holding the tensors, once named.
    pub(crate) fn seq_id(&self) -> Option<shared::ids::SeqId> {
        match self.0.load(Ordering::Acquire) {
            HOLD_SCHEDULING | HOLD_DONE => None,
            raw => Some(shared::ids::SeqId::from_raw(raw)),
        }
    }
}

impl Drop for UseHold {
    fn drop(&mut self) {
        self.0.store(HOLD_DONE, Ordering::Release);
    }
}

/// Names a [`UseHold`]'s request after the funnel gave it its sequence id.
#[derive(Debug)]
pub(crate) struct HoldNamer(Arc<AtomicU64>);

impl HoldNamer {
    /// Records `seq_id` unless the request is already done.
    pub(crate) fn name(self, seq_id: shared::ids::SeqId) {
        let _ = self.0.compare_exchange(
            HOLD_SCHEDULING,
            seq_id.raw(),
            Ordering::AcqRel,
            Ordering::Acquire,
        );
    }
}

/// Who holds a tensor ([`Tensor::scheduled_user`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ScheduledUser {
    /// A request being scheduled right now (its sequence id is not known yet).
    Scheduling,
    /// The scheduled request with this sequence id.
    Request(shared::ids::SeqId),
}

/// Caller-owned host memory a tensor can be attached to (`nrt_tensor_attach_buffer`).
///
/// The runtime checks every range against [`HostBuffer::len`] before calling `read` or `write`,
/// so an implementation only ever sees in-bounds ranges.
pub trait HostBuffer: Send + Sync + std::fmt::Debug {
    /// Size in bytes.
    fn len(&self) -> u64;
    /// Whether the buffer has no bytes.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// Copies `buf.len()` bytes from byte `offset` (in bounds) into `buf`.
    fn read(&self, offset: u64, buf: &mut [u8]);
    /// Copies `data` to byte `offset` (in bounds).
    fn write(&self, offset: u64, data: &[u8]);
    /// The address of byte 0, as the caller gave it.
    fn address(&self) -> *mut u8;
}

/// Device bytes charged to one logical core while a tensor or model holds them
/// (`nrt_get_vnc_memory_stats`), and by kind in the runtime's datastore; released on drop.
#[derive(Debug)]
pub struct MemCharge {
    used: Arc<AtomicU64>,
    bytes: u64,
    /// The datastore, logical core and bytes by kind ([`MemKind::ALL`] order) charged there.
    by_kind: Option<(Arc<Datastore>, u32, [u64; 5])>,
}

impl MemCharge {
    /// Adds `bytes` to `used` until the charge is dropped.
    pub fn new(used: &Arc<AtomicU64>, bytes: u64) -> Self {
        used.fetch_add(bytes, Ordering::Relaxed);
        Self {
            used: used.clone(),
            bytes,
            by_kind: None,
        }
    }

    /// Adds the sum of `kinds` to `used`, and each kind to logical core `vnc` of `store`,
    /// until the charge is dropped.
    pub fn by_kind(
        used: &Arc<AtomicU64>,
        store: Option<&Arc<Datastore>>,
        vnc: u32,
        kinds: [u64; 5],
    ) -> Self {
        let mut charge = Self::new(used, kinds.iter().sum());
        if let Some(s) = store {
            for (k, b) in MemKind::ALL.iter().zip(kinds) {
                s.charge_memory(vnc, *k, b);
            }
            charge.by_kind = Some((s.clone(), vnc, kinds));
        }
        charge
    }

    /// A charge of `bytes` of one `kind`.
    pub fn of_kind(
        used: &Arc<AtomicU64>,
        store: Option<&Arc<Datastore>>,
        vnc: u32,
        kind: MemKind,
        bytes: u64,
    ) -> Self {
        let mut kinds = [0; 5];
        kinds[kind as usize] = bytes;
        Self::by_kind(used, store, vnc, kinds)
    }
}

impl Drop for MemCharge {
    fn drop(&mut self) {
        self.used.fetch_sub(self.bytes, Ordering::Relaxed);
        if let Some((s, vnc, kinds)) = &self.by_kind {
            for (k, b) in MemKind::ALL.iter().zip(kinds) {
                s.release_memory(*vnc, *k, *b);
            }
        }
    }
}

/// Where a device tensor's bytes are, as `nrt_tensor_get_device_allocation_info` reports them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DeviceAllocationInfo {
    /// Device PA of the tensor's first byte.
    pub physical_address: u64,
    /// Size of the allocation holding it (at least the tensor's size).
    pub size: u64,
    /// The HBM (one per NC on simdev: the NC's index).
    pub hbm_index: u32,
}

/// A tensor: a named view of a byte buffer on the device or the host. Cloning shares the
/// storage; so does [`Tensor::slice`].
///
/// # Invariants
/// `offset + size` never exceeds the storage's size.
#[derive(Clone, Debug)]
pub struct Tensor {
    pub(crate) inner: Arc<TensorInner>,
    /// First byte of the storage this view starts at.
    offset: u64,
    /// Bytes in the view.
    size: u64,
    /// The view's own name (a slice's), else the storage's.
    name: Option<Arc<str>>,
    /// How many executions wrote this handle as an output (shared by its clones, not by
    /// slices: libnrt counts per `nrt_tensor_t`).
    completion: Arc<OutputCompletion>,
}

/// What an execution keeps of a tensor bound to it until the execution's work item is
/// freed: its storage (kept alive, and its implicit-async uses) and, for an output, its
/// output completion count. A clone of the [`Tensor`] would take a reference to both for an
/// input too (and to a slice's name): each reference is a locked increment at bind and a
/// locked decrement at the free.
#[derive(Debug)]
pub(crate) struct BoundTensor {
    inner: Arc<TensorInner>,
    /// `Some` for an output.
    completion: Option<Arc<OutputCompletion>>,
}

impl BoundTensor {
    /// An input's hold.
    pub(crate) fn input(t: &Tensor) -> Self {
        Self {
            inner: Arc::clone(&t.inner),
            completion: None,
        }
    }

    /// An output's hold.
    pub(crate) fn output(t: &Tensor) -> Self {
        Self {
            inner: Arc::clone(&t.inner),
            completion: Some(Arc::clone(&t.completion)),
        }
    }

    /// [`Tensor::begin_use`].
    pub(crate) fn begin_use(&self) {
        self.inner.begin_use();
    }

    /// [`Tensor::end_use`].
    pub(crate) fn end_use(&self) {
        self.inner.end_use();
    }

    /// Counts one execution that wrote the output ([`Tensor::output_completed`]); nothing for
    /// an input.
    pub(crate) fn output_completed(&self) {
        if let Some(c) = &self.completion {
            c.completed();
        }
    }
}

#[derive(Debug)]
pub(crate) struct TensorInner {
    pub(crate) name: String,
    pub(crate) size: u64,
    pub(crate) placement: Placement,
    pub(crate) storage: Storage,
    /// Implicit-async executions bound to this tensor, begun and ended; reads and writes wait
    /// for those begun before them (libnrt: "tensor read/write implicitly wait for executions
    /// using the tensor"), not for later ones.
    uses: Mutex<Uses>,
    idle: std::sync::Condvar,
    /// The device bytes charged to the tensor's logical core while it lives.
    charge: Option<MemCharge>,
    /// The marks of scheduled requests that use the tensor ([`UseHold`]).
    holders: Mutex<Vec<Arc<AtomicU64>>>,
}

impl TensorInner {
    fn begin_use(&self) {
        self.uses().begun += 1;
    }

    fn end_use(&self) {
        let mut u = self.uses();
        u.ended += 1;
        if u.waiters > 0 {
            self.idle.notify_all();
        }
    }

    fn uses(&self) -> std::sync::MutexGuard<'_, Uses> {
        self.uses
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

/// A tensor's implicit-async uses ([`Tensor::begin_use`]).
#[derive(Debug, Default)]
struct Uses {
    begun: u64,
    ended: u64,
    /// Threads in [`Tensor::wait_idle`] (an ending use wakes them only if there are some).
    waiters: u32,
}

/// Bytes `nrt_tensor_copy` moves at a time ([`Tensor::copy_in_pieces`]).
const COPY_PIECE: u64 = 1 << 20;

/// `len` zero bytes of host memory for `what`, allocated fallibly: a size the allocator refuses
/// (or that does not fit the address space) is NRT_RESOURCE naming it, never an abort.
pub(crate) fn zeroed_host_bytes(what: &str, len: u64) -> Result<Vec<u8>, NrtError> {
    let refused = || {
        NrtError::new(
            NrtStatus::Resource,
            format!("{what}: cannot allocate {len} bytes of host memory"),
        )
    };
    let n = usize::try_from(len).map_err(|_| refused())?;
    let mut bytes = Vec::new();
    bytes.try_reserve_exact(n).map_err(|_| refused())?;
    bytes.resize(n, 0);
    Ok(bytes)
}

impl Drop for TensorInner {
    fn drop(&mut self) {
        if let Storage::Device {
            allocation, device, ..
        } = &self.storage
            && let Err(e) = device.mem_free(allocation.handle)
        {
            tracing::warn!(tensor = %self.name, error = %e, "freeing a tensor's device memory");
        }
    }
}

impl Tensor {
    pub(crate) fn device(
        name: &str,
        (runtime, vnc): (RuntimeId, u32),
        allocation: Allocation,
        memory: SharedChunk,
        device: Arc<dyn Device>,
        size: u64,
    ) -> Self {
        Self::view_of(TensorInner {
            name: name.into(),
            size,
            placement: Placement::Device { vnc },
            uses: Mutex::new(Uses::default()),
            idle: std::sync::Condvar::new(),
            charge: None,
            holders: Mutex::new(Vec::new()),
            storage: Storage::Device {
                allocation,
                memory,
                device,
                owner: crate::process::id(),
                runtime,
            },
        })
    }

    /// The whole of `inner`.
    fn view_of(inner: TensorInner) -> Self {
        Self {
            offset: 0,
            size: inner.size,
            name: None,
            inner: Arc::new(inner),
            completion: Arc::default(),
        }
    }

    /// Charges the tensor's device bytes to a logical core's usage while its storage lives.
    /// Only a freshly allocated tensor (no other view of its storage) takes a charge.
    pub(crate) fn with_charge(mut self, charge: MemCharge) -> Self {
        if let Some(inner) = Arc::get_mut(&mut self.inner) {
            inner.charge = Some(charge);
        }
        self
    }

    /// A host tensor of `size` zero bytes.
    ///
    /// # Errors
    /// NRT_RESOURCE naming the size when host memory cannot hold it (the process never aborts
    /// on a caller's size).
    pub fn host(name: &str, size: u64) -> Result<Self, NrtError> {
        let bytes = zeroed_host_bytes(&format!("host tensor {name:?}"), size)?;
        Ok(Self::view_of(TensorInner {
            name: name.into(),
            size,
            placement: Placement::Host,
            uses: Mutex::new(Uses::default()),
            idle: std::sync::Condvar::new(),
            charge: None,
            holders: Mutex::new(Vec::new()),
            storage: Storage::Host(Mutex::new(bytes)),
        }))
    }

    /// A tensor with no storage (`nrt_tensor_allocate_empty`): size 0, every access refused
    /// until a buffer is attached ([`Tensor::attached`]).
    pub fn empty(name: &str) -> Self {
        Self::view_of(TensorInner {
            name: name.into(),
            size: 0,
            placement: Placement::Host,
            uses: Mutex::new(Uses::default()),
            idle: std::sync::Condvar::new(),
            charge: None,
            holders: Mutex::new(Vec::new()),
            storage: Storage::Empty,
        })
    }

    /// A host tensor over caller-owned memory (`nrt_tensor_attach_buffer`): reads and writes go
    /// to `buffer`, which is never freed here.
    pub fn attached(name: &str, buffer: Arc<dyn HostBuffer>) -> Self {
        Self::view_of(TensorInner {
            name: name.into(),
            size: buffer.len(),
            placement: Placement::Host,
            uses: Mutex::new(Uses::default()),
            idle: std::sync::Condvar::new(),
            charge: None,
            holders: Mutex::new(Vec::new()),
            storage: Storage::Attached(buffer),
        })
    }

    /// A tensor aliasing `size` bytes of this one from byte `offset` (`nrt_tensor_allocate_slice`):
    /// no copy; the storage lives as long as any view of it.
    ///
    /// # Errors
    /// NRT_INVALID for a range outside this tensor or of size 0.
    pub fn slice(&self, offset: u64, size: u64, name: &str) -> Result<Self, NrtError> {
        let end = offset.checked_add(size);
        if size == 0 {
            return Err(NrtError::new(
                NrtStatus::Invalid,
                format!(
                    "slice {name:?} of tensor {:?}: a slice of 0 bytes (the size must be at least 1)",
                    self.name()
                ),
            ));
        }
        if end.is_none_or(|e| e > self.size) {
            return Err(NrtError::new(
                NrtStatus::Invalid,
                format!(
                    "slice {name:?} of tensor {:?}: bytes {offset}+{size} are not inside its {} bytes",
                    self.name(),
                    self.size
                ),
            ));
        }
        Ok(Self {
            inner: self.inner.clone(),
            offset: self.offset + offset,
            size,
            name: Some(Arc::from(name)),
            completion: Arc::default(),
        })
    }

    /// The tensor's own name (for logs).
    pub fn name(&self) -> &str {
        self.name.as_deref().unwrap_or(&self.inner.name)
    }

    /// Size in bytes (`nrt_tensor_get_size`).
    pub fn size(&self) -> u64 {
        self.size
    }

    /// Byte offset of this view in its storage (0 unless a slice).
    pub fn offset(&self) -> u64 {
        self.offset
    }

    /// Whether the tensor has storage (an empty tensor has none until a buffer is attached).
    pub fn has_storage(&self) -> bool {
        !matches!(self.inner.storage, Storage::Empty)
    }

    /// The logical core of a device tensor.
    pub fn vnc(&self) -> Option<u32> {
        match self.inner.placement {
            Placement::Device { vnc } => Some(vnc),
            Placement::Host => None,
        }
    }

    /// The host address of the tensor's first byte (`nrt_tensor_get_va`): inside the mapping
    /// of a device tensor, the host buffer, or the attached buffer; `None` without storage.
    pub fn host_address(&self) -> Option<*mut u8> {
        match &self.inner.storage {
            Storage::Device {
                allocation, memory, ..
            } => memory.host_address(allocation.pa + self.offset).ok(),
            Storage::Host(v) => {
                let mut v = v.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
                let start = usize::try_from(self.offset).ok()?;
                Some(v.as_mut_ptr().wrapping_add(start))
            }
            Storage::Attached(b) => {
                Some(b.address().wrapping_add(usize::try_from(self.offset).ok()?))
            }
            Storage::Empty => None,
        }
    }

    /// Where a device tensor's bytes are (`nrt_tensor_get_device_allocation_info`).
    pub fn device_allocation(&self) -> Option<DeviceAllocationInfo> {
        match &self.inner.storage {
            Storage::Device {
                allocation, device, ..
            } => Some(DeviceAllocationInfo {
                physical_address: allocation.pa + self.offset,
                size: allocation.size,
                // The HBM stack, as on the silicon: two NCs share one on trn2.
                hbm_index: match allocation.location {
                    shared::protocol::MemLocation::Hbm { nc } => {
                        nc / device.info().arch.ncs_per_hbm()
                    }
                    _ => 0,
                },
            }),
            _ => None,
        }
    }

    /// A descriptor that maps the device memory holding this tensor (`nrt_get_dmabuf_fd`;
    /// simdev: the chunk's memfd), and the tensor's offset in that mapping.
    ///
    /// # Errors
    /// NRT_INVALID for a host tensor; the device's error when it cannot export memory.
    pub fn dmabuf_fd(&self) -> Result<(OwnedFd, u64), NrtError> {
        match &self.inner.storage {
            Storage::Device {
                allocation, device, ..
            } => Ok((device.mem_export_fd(allocation)?, self.offset)),
            _ => Err(NrtError::new(
                NrtStatus::Invalid,
                format!(
                    "tensor {:?} is not in device memory: it has no dma-buf",
                    self.name()
                ),
            )),
        }
    }

    /// Where it lives.
    pub fn placement(&self) -> Placement {
        self.inner.placement
    }

    /// The runtime that allocated it (device tensors only).
    pub fn runtime(&self) -> Option<RuntimeId> {
        match &self.inner.storage {
            Storage::Device { runtime, .. } => Some(*runtime),
            _ => None,
        }
    }

    /// Gives the pages of a device tensor's memory back to the system, the mapping staying
    /// ([`SharedChunk::discard`]): for `nrt_close`, after which the device has freed what the
    /// runtime held while the caller may still hold (and later free) the tensor. Its bytes
    /// read as zero afterwards. Only in the process that allocated it (a forked child shares
    /// the parent's memory). Whether it was a device tensor whose pages were given back.
    pub fn discard_device_memory(&self) -> bool {
        match &self.inner.storage {
            Storage::Device { memory, owner, .. } if *owner == crate::process::id() => {
                match memory.discard() {
                    Ok(()) => true,
                    Err(e) => {
                        tracing::warn!(tensor = %self.inner.name, error = %e, "giving back a closed runtime's tensor memory");
                        false
                    }
                }
            }
            _ => false,
        }
    }

    /// The device PA of byte 0 (device tensors only).
    pub fn device_pa(&self) -> Option<u64> {
        match &self.inner.storage {
            Storage::Device { allocation, .. } => Some(allocation.pa + self.offset),
            _ => None,
        }
    }

    fn check(&self, offset: u64, len: usize) -> Result<(), NrtError> {
        if let Storage::Device { owner, .. } = &self.inner.storage {
            let current = crate::process::id();
            if *owner != current {
                return Err(NrtError::new(
                    NrtStatus::Uninitialized,
                    format!(
                        "tensor {:?}: the runtime was initialised in process {owner}, which allocated this device tensor; this is process {current}, forked from it: call nrt_init in this process and allocate its own tensors",
                        self.inner.name
                    ),
                ));
            }
        }
        if let Storage::Empty = &self.inner.storage {
            return Err(NrtError::new(
                NrtStatus::Invalid,
                format!(
                    "tensor {:?} has no storage (allocated empty): attach a buffer first",
                    self.name()
                ),
            ));
        }
        self.check_range(offset, len as u64)
    }

    /// Whether `offset..offset+len` lies inside the tensor (NRT_INVALID naming it otherwise).
    ///
    /// # Errors
    /// NRT_INVALID for a range outside the tensor.
    pub fn check_range(&self, offset: u64, len: u64) -> Result<(), NrtError> {
        let end = offset.checked_add(len);
        if end.is_none_or(|e| e > self.size) {
            return Err(NrtError::new(
                NrtStatus::Invalid,
                format!(
                    "tensor {:?}: access {offset}+{len} beyond its {} bytes",
                    self.name(),
                    self.size
                ),
            ));
        }
        Ok(())
    }

    /// Copies `buf.len()` bytes from byte `offset` of the tensor (`nrt_tensor_read`).
    ///
    /// # Errors
    /// NRT_INVALID for a range outside the tensor; NRT_UNINITIALIZED for a device tensor in a
    /// process forked from the one that allocated it.
    pub fn read(&self, buf: &mut [u8], offset: u64) -> Result<(), NrtError> {
        self.check(offset, buf.len())?;
        self.wait_idle()?;
        let offset = self.offset + offset;
        match &self.inner.storage {
            Storage::Device {
                allocation, memory, ..
            } => memory.read(allocation.pa + offset, buf).map_err(|e| {
                NrtError::new(NrtStatus::Failure, format!("tensor {:?}: {e}", self.name()))
            }),
            Storage::Host(v) => {
                let v = v.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
                let start = usize::try_from(offset).unwrap_or(usize::MAX);
                buf.copy_from_slice(&v[start..start + buf.len()]);
                Ok(())
            }
            Storage::Attached(b) => {
                b.read(offset, buf);
                Ok(())
            }
            Storage::Empty => Ok(()), // refused by `check`
        }
    }

    /// Copies `data` to byte `offset` of the tensor (`nrt_tensor_write`).
    ///
    /// # Errors
    /// NRT_INVALID for a range outside the tensor; NRT_UNINITIALIZED for a device tensor in a
    /// process forked from the one that allocated it.
    pub fn write(&self, data: &[u8], offset: u64) -> Result<(), NrtError> {
        self.check(offset, data.len())?;
        self.wait_idle()?;
        let offset = self.offset + offset;
        match &self.inner.storage {
            Storage::Device {
                allocation, memory, ..
            } => memory.write(allocation.pa + offset, data).map_err(|e| {
                NrtError::new(NrtStatus::Failure, format!("tensor {:?}: {e}", self.name()))
            }),
            Storage::Host(v) => {
                let mut v = v.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
                let start = usize::try_from(offset).unwrap_or(usize::MAX);
                v[start..start + data.len()].copy_from_slice(data);
                Ok(())
            }
            Storage::Attached(b) => {
                b.write(offset, data);
                Ok(())
            }
            Storage::Empty => Ok(()), // refused by `check`
        }
    }

    /// Sets `size` bytes from byte `offset` to `value` (`nrt_tensor_memset`).
    ///
    /// # Errors
    /// As [`Tensor::write`].
    pub fn memset(&self, offset: u64, value: u8, size: u64) -> Result<(), NrtError> {
        const PIECE: u64 = 64 << 10;
        self.check_range(offset, size)?;
        let mut piece = zeroed_host_bytes("a memset buffer", size.min(PIECE))?;
        piece.fill(value);
        let mut done = 0;
        while done < size {
            let n = (size - done).min(PIECE);
            self.write(&piece[..usize::try_from(n).unwrap_or(0)], offset + done)?;
            done += n;
        }
        Ok(())
    }

    /// Copies `size` bytes from byte `src_offset` of `src` to byte `dst_offset` of this tensor
    /// (`nrt_tensor_copy`); device tensors must be on the same logical core.
    ///
    /// # Errors
    /// NRT_INVALID for ranges outside either tensor or device tensors on different cores.
    pub fn copy_range(
        &self,
        dst_offset: u64,
        src: &Tensor,
        src_offset: u64,
        size: u64,
    ) -> Result<(), NrtError> {
        src.check_range(src_offset, size)?;
        self.check_range(dst_offset, size)?;
        if let (Some(a), Some(b)) = (src.vnc(), self.vnc())
            && a != b
        {
            return Err(NrtError::new(
                NrtStatus::Invalid,
                format!(
                    "copying tensor {:?} (logical core {a}) to {:?} (logical core {b}): device tensors must be on the same core",
                    src.name(),
                    self.name()
                ),
            ));
        }
        self.copy_in_pieces(dst_offset, src, src_offset, size, COPY_PIECE)
    }

    /// Copies all of `src` into this tensor (same size).
    pub(crate) fn copy_from(&self, src: &Tensor) -> Result<(), NrtError> {
        self.copy_in_pieces(0, src, 0, src.size(), COPY_PIECE)
    }

    /// Copies through one buffer of at most `piece` bytes, reused for every piece: a large copy
    /// neither allocates (and faults in) a host buffer of its whole size nor leaves the cache.
    /// Two views of one storage whose ranges overlap copy as `memmove` does: the pieces go from
    /// the end when the destination starts after the source, so no piece is overwritten before
    /// it is read.
    fn copy_in_pieces(
        &self,
        dst_offset: u64,
        src: &Tensor,
        src_offset: u64,
        size: u64,
        piece: u64,
    ) -> Result<(), NrtError> {
        let piece = piece.max(1);
        let mut buf = zeroed_host_bytes(
            &format!("a copy of tensor {:?}", src.name()),
            size.min(piece),
        )?;
        let backward = Arc::ptr_eq(&self.inner, &src.inner)
            && self.offset + dst_offset > src.offset + src_offset;
        let pieces = size.div_ceil(piece);
        for i in 0..pieces {
            let at = if backward { pieces - 1 - i } else { i } * piece;
            let n = usize::try_from((size - at).min(piece)).unwrap_or(buf.len());
            let buf = &mut buf[..n];
            src.read(buf, src_offset + at)?;
            self.write(buf, dst_offset + at)?;
        }
        Ok(())
    }

    /// Marks one implicit-async execution as using the tensor until [`Tensor::end_use`] (an
    /// execution marks its [`BoundTensor`]s).
    #[cfg(test)]
    pub(crate) fn begin_use(&self) {
        self.inner.begin_use();
    }

    /// Ends one use begun by [`Tensor::begin_use`]. A tensor's executions all run on its
    /// logical core, whose worker ends them in the order they began.
    #[cfg(test)]
    pub(crate) fn end_use(&self) {
        self.inner.end_use();
    }

    fn uses(&self) -> std::sync::MutexGuard<'_, Uses> {
        self.inner.uses()
    }

    /// Blocks until the implicit-async executions that began using the tensor before this call
    /// have ended (later ones do not keep it waiting).
    ///
    /// # Errors
    /// NRT_INVALID when one has not ended and the caller is the completion callback of the
    /// tensor's logical core: that thread delivers the core's completions, so it would wait for
    /// itself (hang).
    fn wait_idle(&self) -> Result<(), NrtError> {
        let mut u = self.uses();
        let target = u.begun;
        if u.ended >= target {
            return Ok(());
        }
        if let Placement::Device { vnc } = self.inner.placement
            && crate::async_pool::exec_callback_vnc() == Some(vnc)
        {
            return Err(NrtError::new(
                NrtStatus::Invalid,
                format!(
                    "tensor {:?}: {} execution(s) queued on logical core {vnc} still use it, and this is that core's completion callback, the thread that completes them: waiting here would never end (read or write it after the callback returns)",
                    self.name(),
                    target - u.ended
                ),
            ));
        }
        u.waiters += 1;
        while u.ended < target {
            u = self
                .inner
                .idle
                .wait(u)
                .unwrap_or_else(std::sync::PoisonError::into_inner);
        }
        u.waiters -= 1;
        Ok(())
    }

    /// A scheduled request that uses the tensor and has not completed, if any (the oldest).
    pub fn scheduled_user(&self) -> Option<ScheduledUser> {
        let mut h = self
            .inner
            .holders
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        h.retain(|w| w.load(Ordering::Acquire) != HOLD_DONE);
        h.first().map(|w| match w.load(Ordering::Acquire) {
            HOLD_SCHEDULING => ScheduledUser::Scheduling,
            raw => ScheduledUser::Request(shared::ids::SeqId::from_raw(raw)),
        })
    }

    /// Whether two handles share storage.
    pub fn same_storage(&self, other: &Tensor) -> bool {
        Arc::ptr_eq(&self.inner, &other.inner)
    }

    /// One more execution wrote this handle as an output (see [`crate::output_completion`]).
    pub(crate) fn output_completed(&self) {
        self.completion.completed();
    }

    /// This tensor with `other`'s output completion count (the same C handle given new
    /// storage: `nrt_tensor_attach_buffer`).
    #[must_use]
    pub fn with_output_completion_of(mut self, other: &Tensor) -> Self {
        self.completion = other.completion.clone();
        self
    }

    /// How many executions wrote this handle as an output since the count was last reset.
    pub fn output_completions(&self) -> u64 {
        self.completion.count()
    }

    /// `nrt_tensor_reset_output_completion`: the count back to 0.
    pub fn reset_output_completion(&self) {
        self.completion.reset();
    }

    /// The handle is freed: waits on its output completion end
    /// ([`Tensor::wait_output_completion_or`]), now and later.
    pub fn abandon_output_completion(&self) {
        self.completion.abandon();
    }

    /// `nrt_tensor_check_output_completion`: waits until `expected` executions have written
    /// this handle as an output, for at most `timeout` (`None`: unbounded, with a warning
    /// after 30 s).
    ///
    /// # Errors
    /// As [`Tensor::wait_output_completion_or`].
    pub fn wait_output_completion(
        &self,
        expected: u64,
        timeout: Option<std::time::Duration>,
    ) -> Result<(), NrtError> {
        self.wait_output_completion_or(expected, timeout, || None)
    }

    /// [`Tensor::wait_output_completion`], ending early with the error `interrupted` returns
    /// (asked every [`crate::output_completion::INTERRUPT_POLL`]: `nrt_close`).
    ///
    /// # Errors
    /// NRT_TIMEOUT naming the count reached, when the timeout passes first; NRT_INVALID when
    /// the handle is freed meanwhile ([`Tensor::abandon_output_completion`]); `interrupted`'s
    /// error.
    pub fn wait_output_completion_or(
        &self,
        expected: u64,
        timeout: Option<std::time::Duration>,
        interrupted: impl Fn() -> Option<NrtError>,
    ) -> Result<(), NrtError> {
        // A timeout past what an `Instant` holds waits as an unbounded one.
        let deadline = timeout.and_then(|t| std::time::Instant::now().checked_add(t));
        let name = self.name();
        let stop = std::cell::RefCell::new(None);
        let waited = self.completion.wait(
            expected,
            deadline,
            |count| {
                tracing::warn!(
                    "waiting for output tensor {name:?} to be written {expected} times: {count} so far after {} s (unbounded wait)",
                    crate::output_completion::UNBOUNDED_WARNING.as_secs()
                );
            },
            || {
                let e = interrupted();
                let hit = e.is_some();
                *stop.borrow_mut() = e;
                hit
            },
        );
        match waited {
            Waited::Reached => Ok(()),
            Waited::TimedOut { count } => Err(NrtError::new(
                NrtStatus::Timeout,
                format!(
                    "output tensor {name:?} was written {count} of the {expected} times waited for \
                     within {timeout:?} (an execution counts once it wrote its outputs: \
                     NRT_SUCCESS or NRT_EXEC_COMPLETED_WITH_NUM_ERR)"
                ),
            )),
            Waited::Abandoned => Err(NrtError::new(
                NrtStatus::Invalid,
                format!(
                    "output tensor {name:?} was freed while waited for: nothing can write it any more"
                ),
            )),
            Waited::Interrupted => Err(stop
                .into_inner()
                .unwrap_or_else(|| NrtError::new(NrtStatus::Failure, "the wait was interrupted"))),
        }
    }
}

/// A name → tensor map (`nrt_tensor_set_t`). Names are the model's I/O names and need not
/// equal the tensors' own names.
#[derive(Clone, Debug, Default)]
pub struct TensorSet {
    tensors: crate::FastHashMap<String, Tensor>,
}

impl TensorSet {
    /// An empty set (`nrt_allocate_tensor_set`).
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds or replaces `name` (`nrt_add_tensor_to_tensor_set`).
    pub fn add(&mut self, name: &str, tensor: &Tensor) {
        self.tensors.insert(name.to_string(), tensor.clone());
    }

    /// Looks `name` up (`nrt_get_tensor_from_tensor_set`).
    ///
    /// # Errors
    /// NRT_FAILURE when absent, as libnrt does.
    pub fn get(&self, name: &str) -> Result<&Tensor, NrtError> {
        self.tensors.get(name).ok_or_else(|| {
            NrtError::new(
                NrtStatus::Failure,
                format!("no tensor named {name:?} in the set"),
            )
        })
    }

    /// Looks `name` up without building an error (the hot path's lookup).
    pub fn find(&self, name: &str) -> Option<&Tensor> {
        self.tensors.get(name)
    }

    /// Number of tensors.
    pub fn len(&self) -> usize {
        self.tensors.len()
    }

    /// Whether the set is empty.
    pub fn is_empty(&self) -> bool {
        self.tensors.is_empty()
    }

    /// (name, tensor) pairs.
    pub fn iter(&self) -> impl Iterator<Item = (&str, &Tensor)> {
        self.tensors.iter().map(|(k, v)| (k.as_str(), v))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn host_tensors_read_and_write_in_bounds_only() {
        let t = Tensor::host("t", 8).unwrap();
        t.write(&[1, 2, 3], 5).unwrap();
        let mut b = [0u8; 8];
        t.read(&mut b, 0).unwrap();
        assert_eq!(b, [0, 0, 0, 0, 0, 1, 2, 3]);
        let e = t.write(&[1, 2, 3, 4], 5).unwrap_err();
        assert_eq!(e.status, NrtStatus::Invalid);
        assert!(e.message.contains("beyond its 8 bytes"));
    }

    #[test]
    fn sets_replace_by_name_and_miss_with_failure() {
        let a = Tensor::host("a", 1).unwrap();
        let b = Tensor::host("b", 1).unwrap();
        let mut s = TensorSet::new();
        s.add("x", &a);
        s.add("x", &b);
        assert_eq!(s.len(), 1);
        assert!(s.get("x").unwrap().same_storage(&b));
        assert_eq!(s.get("y").unwrap_err().status, NrtStatus::Failure);
    }

    #[test]
    fn a_slice_aliases_its_source_and_keeps_the_storage_alive() {
        let t = Tensor::host("t", 16).unwrap();
        t.write(&(0..16).collect::<Vec<u8>>(), 0).unwrap();
        let s = t.slice(4, 8, "s").unwrap();
        assert_eq!((s.size(), s.offset(), s.name()), (8, 4, "s"));
        assert!(s.same_storage(&t));
        let mut b = [0u8; 8];
        s.read(&mut b, 0).unwrap();
        assert_eq!(b, [4, 5, 6, 7, 8, 9, 10, 11]);
        s.write(&[0xAA], 7).unwrap();
        let mut one = [0u8];
        t.read(&mut one, 11).unwrap();
        assert_eq!(one, [0xAA], "a write through the slice lands in the source");
        // A slice of a slice is relative to its parent and stays inside it.
        let ss = s.slice(2, 2, "ss").unwrap();
        assert_eq!(ss.offset(), 6);
        assert_eq!(s.slice(7, 2, "x").unwrap_err().status, NrtStatus::Invalid);
        assert_eq!(s.slice(0, 0, "x").unwrap_err().status, NrtStatus::Invalid);
        assert_eq!(
            s.read(&mut [0u8; 2], 7).unwrap_err().status,
            NrtStatus::Invalid
        );
        drop(t);
        ss.read(&mut b[..2], 0).unwrap();
        assert_eq!(&b[..2], &[6, 7], "the storage outlives the source's handle");
    }

    /// A read waits for the implicit-async executions that began using the tensor before it,
    /// not for later ones: a thread that keeps executing into a tensor no longer starves a
    /// reader (it waited seconds behind executions submitted after it).
    #[test]
    fn a_read_waits_for_earlier_uses_only() {
        let t = Tensor::host("t", 8).unwrap();
        t.begin_use();
        t.begin_use();
        let (tx, rx) = std::sync::mpsc::channel();
        let reader = {
            let t = t.clone();
            std::thread::spawn(move || {
                let mut b = [0u8; 8];
                tx.send(t.read(&mut b, 0).map_err(|e| e.status)).unwrap();
            })
        };
        // The reader has taken its turn (it waits), then a later use begins.
        while t.uses().waiters == 0 {
            std::thread::yield_now();
        }
        t.begin_use();
        t.end_use();
        assert!(
            rx.try_recv().is_err(),
            "the read waits for both earlier uses"
        );
        t.end_use();
        let read = rx.recv_timeout(std::time::Duration::from_secs(60));
        // Whatever the outcome, let the reader finish.
        t.end_use();
        reader.join().unwrap();
        assert_eq!(
            read,
            Ok(Ok(())),
            "the read returns once the uses begun before it ended"
        );
    }

    #[test]
    fn memset_sets_the_range_only_and_checks_bounds() {
        let t = Tensor::host("t", 200_000).unwrap();
        t.memset(3, 0x5A, 150_000).unwrap();
        let mut b = vec![0u8; 200_000];
        t.read(&mut b, 0).unwrap();
        assert_eq!(&b[..3], &[0, 0, 0]);
        assert!(b[3..150_003].iter().all(|&x| x == 0x5A));
        assert!(b[150_003..].iter().all(|&x| x == 0));
        assert_eq!(
            t.memset(199_999, 1, 2).unwrap_err().status,
            NrtStatus::Invalid
        );
    }

    #[derive(Debug)]
    struct VecBuffer(Mutex<Vec<u8>>);

    impl HostBuffer for VecBuffer {
        fn len(&self) -> u64 {
            self.0.lock().unwrap().len() as u64
        }
        fn read(&self, offset: u64, buf: &mut [u8]) {
            let o = usize::try_from(offset).unwrap();
            buf.copy_from_slice(&self.0.lock().unwrap()[o..o + buf.len()]);
        }
        fn write(&self, offset: u64, data: &[u8]) {
            let o = usize::try_from(offset).unwrap();
            self.0.lock().unwrap()[o..o + data.len()].copy_from_slice(data);
        }
        fn address(&self) -> *mut u8 {
            self.0.lock().unwrap().as_mut_ptr()
        }
    }

    #[test]
    fn an_empty_tensor_refuses_access_until_a_buffer_is_attached() {
        let e = Tensor::empty("e");
        assert_eq!((e.size(), e.has_storage()), (0, false));
        assert_eq!(e.host_address(), None);
        let err = e.read(&mut [], 0).unwrap_err();
        assert_eq!(err.status, NrtStatus::Invalid);
        assert!(err.message.contains("no storage"), "{err}");
        let buf = Arc::new(VecBuffer(Mutex::new(vec![0; 8])));
        let a = Tensor::attached("a", buf.clone());
        assert_eq!((a.size(), a.placement()), (8, Placement::Host));
        a.write(&[1, 2], 6).unwrap();
        assert_eq!(buf.0.lock().unwrap()[6..], [1, 2]);
        assert_eq!(a.write(&[1, 2], 7).unwrap_err().status, NrtStatus::Invalid);
        assert_eq!(a.host_address(), Some(buf.address()));
        assert_eq!(
            a.slice(2, 2, "s").unwrap().host_address(),
            Some(buf.address().wrapping_add(2))
        );
    }

    #[test]
    fn copy_range_copies_between_tensors_within_bounds() {
        let a = Tensor::host("a", 8).unwrap();
        let b = Tensor::host("b", 8).unwrap();
        a.write(&[1, 2, 3, 4, 5, 6, 7, 8], 0).unwrap();
        b.copy_range(5, &a, 1, 3).unwrap();
        let mut out = [0u8; 8];
        b.read(&mut out, 0).unwrap();
        assert_eq!(out, [0, 0, 0, 0, 0, 2, 3, 4]);
        assert_eq!(
            b.copy_range(6, &a, 0, 3).unwrap_err().status,
            NrtStatus::Invalid
        );
        assert_eq!(
            b.copy_range(0, &a, 6, 3).unwrap_err().status,
            NrtStatus::Invalid
        );
    }

    #[test]
    fn a_copy_in_pieces_between_overlapping_views_of_one_storage_is_a_memmove() {
        let initial: Vec<u8> = (1..=16).collect();
        for piece in [1, 3, 4, 16] {
            for (s, d, n) in (0..16u8).flat_map(|s| {
                (0..16u8).flat_map(move |d| (1..=16 - s.max(d)).map(move |n| (s, d, n)))
            }) {
                let t = Tensor::host("t", 16).unwrap();
                t.write(&initial, 0).unwrap();
                // Through two slices, as `nrt_tensor_allocate_slice` makes them.
                let (src, dst) = (
                    t.slice(u64::from(s), u64::from(n), "src").unwrap(),
                    t.slice(u64::from(d), u64::from(n), "dst").unwrap(),
                );
                dst.copy_in_pieces(0, &src, 0, u64::from(n), piece).unwrap();
                let mut want = initial.clone();
                let (s, d, n) = (usize::from(s), usize::from(d), usize::from(n));
                want.copy_within(s..s + n, d);
                let mut got = [0u8; 16];
                t.read(&mut got, 0).unwrap();
                assert_eq!(
                    got[..],
                    want[..],
                    "piece {piece}: {n} bytes from {s} to {d}"
                );
            }
        }
    }

    #[test]
    fn a_memory_charge_lasts_as_long_as_the_storage() {
        let used = Arc::new(AtomicU64::new(0));
        let t = Tensor::host("t", 4)
            .unwrap()
            .with_charge(MemCharge::new(&used, 4096));
        let s = t.slice(0, 2, "s").unwrap();
        assert_eq!(used.load(Ordering::Relaxed), 4096);
        drop(t);
        assert_eq!(used.load(Ordering::Relaxed), 4096, "the slice holds it");
        drop(s);
        assert_eq!(used.load(Ordering::Relaxed), 0);
    }

    /// Set in the child process of [`a_huge_host_tensor_is_nrt_resource_not_an_abort`].
    const HUGE_CHILD: &str = "NRT_TEST_HUGE_HOST_TENSOR_CHILD";

    /// Runs in a child (re-executed test binary): today's infallible allocation would abort
    /// the whole test process. The child caps its address space at 16 GiB so that the result
    /// does not depend on the machine's overcommit policy.
    #[test]
    fn huge_host_tensor_child() {
        if std::env::var_os(HUGE_CHILD).is_none() {
            return;
        }
        use nix::sys::resource::{Resource, setrlimit};
        setrlimit(Resource::RLIMIT_AS, 16 << 30, 16 << 30).unwrap();
        for size in [1u64 << 40, 1 << 48, u64::MAX] {
            let e = Tensor::host("huge", size).unwrap_err();
            assert_eq!(e.status, NrtStatus::Resource, "{size}: {e}");
            assert!(e.message.contains(&format!("{size} bytes")), "{e}");
            assert!(e.message.contains("\"huge\""), "{e}");
        }
        // The process is still usable afterwards.
        let t = Tensor::host("small", 4096).unwrap();
        let copy = Tensor::host("copy", 4096).unwrap();
        copy.copy_from(&t).unwrap();
        println!("HUGE_CHILD_OK");
    }

    #[test]
    fn a_huge_host_tensor_is_nrt_resource_not_an_abort() {
        let out = std::process::Command::new(std::env::current_exe().unwrap())
            .args([
                "tensor::tests::huge_host_tensor_child",
                "--exact",
                "--nocapture",
            ])
            .env(HUGE_CHILD, "1")
            .output()
            .unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success() && stdout.contains("HUGE_CHILD_OK"),
            "child: {:?}\n{stdout}\n{}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
    }
}
