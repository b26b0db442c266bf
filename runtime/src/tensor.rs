//! Tensors and tensor sets (`nrt_tensor_*`, `nrt_*_tensor_set`, `reference/nrt-api.md` §2.5–2.6).
//!
//! A device tensor is one chunk in the HBM of its vNC's first NC, mapped whole; reads and
//! writes go through the bounds-checked mapping. A host tensor is plain process memory: the sync
//! execute path clones it to device memory and copies results back (seed 000 §1 GOTCHA), the
//! implicit-async path refuses it.
//!
//! A device tensor's mapping is shared with the device (`MAP_SHARED`), so a process forked from
//! the one that allocated it would read and write the parent's tensor through it: reads and
//! writes from another process are refused (NRT_UNINITIALIZED naming the allocating process),
//! and a drop there frees nothing (the sim backend refuses the inherited connection).

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use shared::NrtStatus;
use shared::memory::SharedChunk;

use crate::backend::{Allocation, Device};
use crate::error::NrtError;

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

/// A tensor: a named byte buffer on the device or the host. Cloning shares the storage.
#[derive(Clone, Debug)]
pub struct Tensor {
    pub(crate) inner: Arc<TensorInner>,
}

#[derive(Debug)]
pub(crate) struct TensorInner {
    pub(crate) name: String,
    pub(crate) size: u64,
    pub(crate) placement: Placement,
    pub(crate) storage: Storage,
    /// Implicit-async executions bound to this tensor and not yet completed; reads and writes
    /// wait for them (libnrt: "tensor read/write implicitly wait for executions using the
    /// tensor").
    pending: Mutex<u32>,
    idle: std::sync::Condvar,
    /// The marks of scheduled requests that use the tensor ([`UseHold`]).
    holders: Mutex<Vec<Arc<AtomicU64>>>,
}

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
        Self {
            inner: Arc::new(TensorInner {
                name: name.into(),
                size,
                placement: Placement::Device { vnc },
                pending: Mutex::new(0),
                idle: std::sync::Condvar::new(),
                holders: Mutex::new(Vec::new()),
                storage: Storage::Device {
                    allocation,
                    memory,
                    device,
                    owner: std::process::id(),
                    runtime,
                },
            }),
        }
    }

    /// A host tensor of `size` zero bytes.
    ///
    /// # Errors
    /// NRT_RESOURCE naming the size when host memory cannot hold it (the process never aborts
    /// on a caller's size).
    pub fn host(name: &str, size: u64) -> Result<Self, NrtError> {
        let bytes = zeroed_host_bytes(&format!("host tensor {name:?}"), size)?;
        Ok(Self {
            inner: Arc::new(TensorInner {
                name: name.into(),
                size,
                placement: Placement::Host,
                pending: Mutex::new(0),
                idle: std::sync::Condvar::new(),
                holders: Mutex::new(Vec::new()),
                storage: Storage::Host(Mutex::new(bytes)),
            }),
        })
    }

    /// The tensor's own name (for logs).
    pub fn name(&self) -> &str {
        &self.inner.name
    }

    /// Size in bytes (`nrt_tensor_get_size`).
    pub fn size(&self) -> u64 {
        self.inner.size
    }

    /// Where it lives.
    pub fn placement(&self) -> Placement {
        self.inner.placement
    }

    /// The runtime that allocated it (device tensors only).
    pub fn runtime(&self) -> Option<RuntimeId> {
        match &self.inner.storage {
            Storage::Device { runtime, .. } => Some(*runtime),
            Storage::Host(_) => None,
        }
    }

    /// The device PA of byte 0 (device tensors only).
    pub fn device_pa(&self) -> Option<u64> {
        match &self.inner.storage {
            Storage::Device { allocation, .. } => Some(allocation.pa),
            Storage::Host(_) => None,
        }
    }

    fn check(&self, offset: u64, len: usize) -> Result<(), NrtError> {
        if let Storage::Device { owner, .. } = &self.inner.storage {
            let current = std::process::id();
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
        let end = offset.checked_add(len as u64);
        if end.is_none_or(|e| e > self.inner.size) {
            return Err(NrtError::new(
                NrtStatus::Invalid,
                format!(
                    "tensor {:?}: access {offset}+{len} beyond its {} bytes",
                    self.inner.name, self.inner.size
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
        self.wait_idle();
        match &self.inner.storage {
            Storage::Device {
                allocation, memory, ..
            } => memory.read(allocation.pa + offset, buf).map_err(|e| {
                NrtError::new(
                    NrtStatus::Failure,
                    format!("tensor {:?}: {e}", self.inner.name),
                )
            }),
            Storage::Host(v) => {
                let v = v.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
                let start = usize::try_from(offset).unwrap_or(usize::MAX);
                buf.copy_from_slice(&v[start..start + buf.len()]);
                Ok(())
            }
        }
    }

    /// Copies `data` to byte `offset` of the tensor (`nrt_tensor_write`).
    ///
    /// # Errors
    /// NRT_INVALID for a range outside the tensor; NRT_UNINITIALIZED for a device tensor in a
    /// process forked from the one that allocated it.
    pub fn write(&self, data: &[u8], offset: u64) -> Result<(), NrtError> {
        self.check(offset, data.len())?;
        self.wait_idle();
        match &self.inner.storage {
            Storage::Device {
                allocation, memory, ..
            } => memory.write(allocation.pa + offset, data).map_err(|e| {
                NrtError::new(
                    NrtStatus::Failure,
                    format!("tensor {:?}: {e}", self.inner.name),
                )
            }),
            Storage::Host(v) => {
                let mut v = v.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
                let start = usize::try_from(offset).unwrap_or(usize::MAX);
                v[start..start + data.len()].copy_from_slice(data);
                Ok(())
            }
        }
    }

    /// Copies all of `src` into this tensor (same size).
    pub(crate) fn copy_from(&self, src: &Tensor) -> Result<(), NrtError> {
        let mut buf = zeroed_host_bytes(&format!("a copy of tensor {:?}", src.name()), src.size())?;
        src.read(&mut buf, 0)?;
        self.write(&buf, 0)
    }

    /// Marks one implicit-async execution as using the tensor until [`Tensor::end_use`].
    pub(crate) fn begin_use(&self) {
        *self
            .inner
            .pending
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) += 1;
    }

    /// Ends one use begun by [`Tensor::begin_use`].
    pub(crate) fn end_use(&self) {
        let mut n = self
            .inner
            .pending
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        *n = n.saturating_sub(1);
        if *n == 0 {
            self.inner.idle.notify_all();
        }
    }

    /// Blocks while implicit-async executions use the tensor.
    fn wait_idle(&self) {
        let mut n = self
            .inner
            .pending
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        while *n > 0 {
            n = self
                .inner
                .idle
                .wait(n)
                .unwrap_or_else(std::sync::PoisonError::into_inner);
        }
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
}

/// A name → tensor map (`nrt_tensor_set_t`). Names are the model's I/O names and need not
/// equal the tensors' own names.
#[derive(Clone, Debug, Default)]
pub struct TensorSet {
    tensors: HashMap<String, Tensor>,
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
